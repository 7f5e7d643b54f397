"""benchmarks/kernels.py's sweep times the mask kernel's real store modes and names the fastest.

Run on the CPU interpreter at a tiny vocabulary: every store mode the kernel has is swept (each
checked against the torch reference inside the sweep), and the choice is the argmin of the
per-mode geometric means. The kernel itself refuses a store mode it does not have (a bool, as
the old sweep passed, included).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from surecall.kernels._triton import INTERPRET

KERNELS_BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "kernels.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("kernels_bench", KERNELS_BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.interpreter
@pytest.mark.skipif(not INTERPRET, reason="the Triton mask kernel runs on CPU only under TRITON_INTERPRET=1")
def test_sweep_covers_every_store_mode_and_picks_the_fastest(bench):
    from surecall.kernels.mask import STORE_MODES

    device = torch.device("cpu")
    rows = bench.sweep(device, bench.timer(device, quick=True), np.random.default_rng(0), width=512,
                       batches=(1, 3), launches=[(4, 4), (16, 4)])
    assert {r["store_mode"] for r in rows} == set(STORE_MODES) == {0, 1, 2}
    assert len(rows) == 2 * 3 * 2 and all(r["us"] > 0 for r in rows)
    choice = bench.choose_store_mode(rows, "cpu")
    geomean = {int(m): v for m, v in choice["geomean_us"].items()}
    assert choice["recommended_store_mode"] == min(geomean, key=geomean.get)
    assert choice["measured_on"].startswith("cpu-interpreter")
    for mode, by_batch in choice["best"].items():  # each batch's best launch is its fastest row
        for batch, best in by_batch.items():
            mine = [r["us"] for r in rows if r["store_mode"] == int(mode) and r["batch"] == int(batch)]
            assert best["us"] == pytest.approx(min(mine), abs=1e-3)


def test_choice_is_the_smallest_geometric_mean(bench):
    rows = [{"op": "mask", "batch": b, "store_mode": m, "block_words": 32, "num_warps": 4, "us": us}
            for b, m, us in [(1, 0, 1.0), (64, 0, 100.0), (1, 1, 4.0), (64, 1, 20.0), (1, 2, 3.0), (64, 2, 30.0)]]
    choice = bench.choose_store_mode(rows)  # geomeans 10, 8.94, 9.49: mode 1, though mode 0 wins batch 1
    assert choice["recommended_store_mode"] == 1 and choice["measured_on"] == "gpu"
    assert "Fastest store mode: 1 (this would change" in bench.render_choice(choice)


@pytest.mark.parametrize("store_mode", [True, 3, -1])
def test_the_kernel_refuses_a_store_mode_it_does_not_have(bench, store_mode):
    from surecall.kernels import DeviceTable
    from surecall.kernels.mask import _launch

    dt = DeviceTable.from_table(bench.make_table(512, np.random.default_rng(0)), torch.device("cpu"))
    logits = torch.zeros(1, 512)
    with pytest.raises(ValueError, match=r"Invalid store_mode: expected one of \(0, 1, 2\), got "):
        _launch(logits, dt, torch.zeros(1, dtype=torch.int32), None, None, store_mode=store_mode)
