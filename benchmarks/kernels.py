"""Kernel benchmark: our grammar mask and fused constrained sample against xgrammar and free sampling.

For batch x vocabulary x dtype it times (1) our `apply_token_mask_inplace` and xgrammar's
`apply_token_bitmask_inplace` on the same logits and the same bitmask (theirs gets the rows'
bitmask already gathered; ours gathers it by state), and (2) our fused constrained `sample`
against the same `sample` without a table: t_mask = constrained - unconstrained. It checks
correctness first (ours == xgrammar on the timed inputs; Triton == torch on a small case on
GPU) and reports achieved GB/s against the H200's 4.8 TB/s. On GPU it uses Triton's
do_bench_cudagraph (CUDA graphs, so launch overhead is not counted; falls back to do_bench);
on CPU it is a smoke test of the torch path with perf_counter loops (`--quick`: a small subset).
With `--sweep` it also times the mask kernel's three store modes (each block size x warps, each
checked against the torch reference first) and names the fastest (`store_mode_choice`).
Usage: python benchmarks/kernels.py [--quick] [--sweep] [--out benchmarks/results] [--copy-to DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from functools import partial

import numpy as np
import torch

from surecall.grammars.table import TokenTable
from surecall.kernels import DeviceTable, SamplingTensors, apply_token_mask_inplace, sample

H200_BYTES_PER_S = 4.8e12
BATCHES = [1, 8, 64, 256, 1024]
VOCABS = [32_000, 128_256, 151_936, 200_064]
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def make_table(logits_width: int, rng: np.random.Generator) -> TokenTable:
    """Four states over the vocabulary: a JSON-string-body-like dense state (~90% of tokens), a
    medium one (~5%), a structural one (~0.1%) and an accepting one; CSR consistent with the masks."""
    vocab = logits_width - 64  # a padded tail, as real models have
    stop = np.array([vocab - 1], dtype=np.int32)
    densities = [0.9, 0.05, 0.001, 0.0005]
    rows, bits = [], np.zeros((4, ((logits_width + 31) // 32) * 32), dtype=bool)
    for s, density in enumerate(densities):
        toks = np.flatnonzero(rng.random(vocab - 1) < density).astype(np.int32)
        rows.append(toks)
        bits[s, toks] = True
    bits[3, stop] = True
    ptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int32)
    trans_tok = np.concatenate(rows).astype(np.int32)
    trans_next = rng.integers(0, 4, size=trans_tok.size).astype(np.int32)
    trans_next[ptr[2]] = 3  # the structural state reaches the accepting one in one token
    return TokenTable.from_dense(
        mask=np.ascontiguousarray(np.packbits(bits, axis=1, bitorder="little").view(np.int32)),
        accept=np.array([False, False, False, True]),
        trans_ptr=ptr,
        trans_tok=trans_tok,
        trans_next=trans_next,
        dist=np.array(
            [2, 2, 1, 0], dtype=np.int32
        ),  # bound from the CSR above (not used for timing)
        vocab_size=vocab,
        logits_width=logits_width,
        stop_ids=stop,
    )


def timer(device: torch.device, quick: bool):
    """fn -> microseconds per call (median)."""
    if device.type == "cuda":
        import triton.testing

        def gpu(fn) -> tuple[float, str]:
            try:
                return triton.testing.do_bench_cudagraph(fn, rep=20) * 1e3, "cudagraph"
            except Exception:  # a peer that cannot be captured
                return triton.testing.do_bench(fn, warmup=10, rep=20) * 1e3, "eager"

        return gpu

    def cpu(fn) -> tuple[float, str]:
        fn()
        reps = 5 if quick else 10
        samples = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
        return float(np.median(samples)) * 1e6, "perf_counter"

    return cpu


def xgrammar_apply():
    try:
        import xgrammar

        return xgrammar.apply_token_bitmask_inplace
    except Exception:
        return None


def check_correctness(logits, dt, states, bitmask, xgr_apply) -> None:
    ours = logits.clone()
    apply_token_mask_inplace(ours, dt, states)
    if xgr_apply is not None:
        theirs = logits.clone()
        xgr_apply(theirs, bitmask)
        if not torch.equal(ours, theirs):
            raise SystemExit(
                "correctness: our mask differs from xgrammar's on the benchmark inputs"
            )
    if logits.is_cuda:  # the Triton path against the torch reference on the same device
        ref = logits[:4].clone()
        apply_token_mask_inplace(ref, dt, states[:4], backend="torch")
        if not torch.equal(ours[:4], ref):
            raise SystemExit("correctness: Triton mask differs from the torch reference")


def bench_shape(batch, width, dtype_name, dt, device, time_fn, xgr_apply, rng) -> dict:
    dtype = DTYPES[dtype_name]
    states = torch.from_numpy(rng.integers(0, 4, size=batch).astype(np.int32)).to(device)
    logits = torch.randn(batch, width, device=device, dtype=torch.float32).to(dtype)
    bitmask = dt.mask_rows(states).contiguous()
    check_correctness(logits, dt, states, bitmask, xgr_apply)
    params = SamplingTensors.build(
        [1.0] * batch, [0] * batch, [1.0] * batch, list(range(batch)), [0] * batch, device
    )
    work = logits.clone()
    row = {"batch": batch, "vocab": width, "dtype": dtype_name}
    row["ours_mask_us"], row["timing"] = time_fn(
        lambda: apply_token_mask_inplace(work, dt, states, check=False)
    )
    if xgr_apply is not None:
        row["xgr_mask_us"], row["xgr_timing"] = time_fn(lambda: xgr_apply(work, bitmask))
    row["sample_masked_us"], _ = time_fn(lambda: sample(logits, dt, states, params, check=False))
    row["sample_free_us"], _ = time_fn(lambda: sample(logits, None, None, params, check=False))
    row["t_mask_us"] = row["sample_masked_us"] - row["sample_free_us"]
    elem = torch.finfo(dtype).bits // 8
    mask_bytes = batch * (
        width * elem + dt.num_words * 4
    )  # logits written (upper bound) + mask words read
    row["mask_gbps"] = mask_bytes / (row["ours_mask_us"] * 1e-6) / 1e9
    row["sample_gbps"] = mask_bytes / (row["sample_masked_us"] * 1e-6) / 1e9
    row["mask_hbm_frac"] = row["mask_gbps"] * 1e9 / H200_BYTES_PER_S
    if "xgr_mask_us" in row:
        row["speedup_vs_xgr"] = row["xgr_mask_us"] / row["ours_mask_us"]
        row["t_mask_over_xgr"] = row["t_mask_us"] / row["xgr_mask_us"]
    return row


# (block_words, num_warps) launches the sweep tries for every store mode of the mask kernel.
SWEEP_LAUNCHES = [(64, 4), (128, 4), (128, 8), (256, 8)]  # 12 mask timings per batch with the 3 modes
CPU_SWEEP = {"width": 4096, "batches": (1, 4), "launches": [(32, 4), (128, 4)]}  # interpreter smoke run


def sweep(device, time_fn, rng, width: int = 128_256, batches=(1, 64, 1024), launches=SWEEP_LAUNCHES) -> list[dict]:
    """Launch-parameter sweep: the mask kernel's three store modes x block size x warps (each checked
    equal to the torch reference before it is timed), and on GPU the sampler's columns per program,
    so a session with a GPU can pick the defaults from numbers instead of guesses."""
    from surecall.kernels import mask as mask_mod

    dt = DeviceTable.from_table(make_table(width, rng), device)
    out = []
    for batch in batches:
        states = torch.from_numpy(rng.integers(0, 4, size=batch).astype(np.int32)).to(device)
        logits = torch.randn(batch, width, device=device).to(torch.bfloat16)
        reference = logits.clone()
        mask_mod.apply_token_mask_torch(reference, dt, states)
        first = len(out)
        for store_mode in mask_mod.STORE_MODES:
            for block_words, num_warps in launches:
                launch = partial(mask_mod._launch, states=states, table=dt, rows=None, remaining=None,
                                 block_words=block_words, num_warps=num_warps, store_mode=store_mode)
                masked = logits.clone()
                launch(masked)
                if not torch.equal(masked, reference):
                    raise SystemExit(f"correctness: store mode {store_mode} (block_words {block_words}, "
                                     f"{num_warps} warps) differs from the torch reference at batch {batch}")
                work = logits.clone()
                us, _ = time_fn(lambda launch=launch, work=work: launch(work))
                out.append({"op": "mask", "batch": batch, "store_mode": store_mode, "block_words": block_words,
                            "num_warps": num_warps, "us": us})  # fmt: skip
        if device.type == "cuda":
            params = SamplingTensors.build(
                [1.0] * batch, [0] * batch, [1.0] * batch, list(range(batch)), [0] * batch, device
            )
            for split in (2048, 4096, 8192, 16384):
                us, _ = time_fn(
                    partial(sample, logits, dt, states, params, check=False, split_size=split)
                )
                out.append({"op": "sample", "batch": batch, "split_size": split, "us": us})
        for r in out[first:]:
            print(
                json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()}),
                flush=True,
            )
    return out


def choose_store_mode(sweep_rows: list[dict], device_type: str = "cuda") -> dict:
    """The store mode whose best launch per batch has the smallest geometric mean over the batches
    (a GPU figure; on CPU the interpreter's, which only shows the sweep runs)."""
    from surecall.kernels.mask import DEFAULT_STORE_MODE, STORE_MODES

    mask_rows = [r for r in sweep_rows if r["op"] == "mask"]
    if not mask_rows:
        return {}
    batches = sorted({r["batch"] for r in mask_rows})
    best = {m: {b: min((r for r in mask_rows if r["store_mode"] == m and r["batch"] == b), key=lambda r: r["us"])
                for b in batches} for m in STORE_MODES}  # fmt: skip
    geomean = {m: float(np.exp(np.mean([np.log(max(best[m][b]["us"], 1e-9)) for b in batches]))) for m in STORE_MODES}
    chosen = min(geomean, key=geomean.get)
    return {
        "measured_on": "gpu" if device_type == "cuda" else "cpu-interpreter (not a GPU measurement)",
        "recommended_store_mode": chosen,
        "default_store_mode": DEFAULT_STORE_MODE,
        "geomean_us": {str(m): round(v, 3) for m, v in geomean.items()},
        "best": {str(m): {str(b): {"us": round(r["us"], 3), "block_words": r["block_words"], "num_warps": r["num_warps"]}
                          for b, r in best[m].items()} for m in STORE_MODES},  # fmt: skip
    }


def render_choice(choice: dict) -> str:
    lines = ["| store mode | geomean us | " + " | ".join(f"batch {b} us (block, warps)" for b in choice["best"]["0"]) + " |"]
    lines.append("|" + "---|" * (2 + len(choice["best"]["0"])))
    for mode, by_batch in choice["best"].items():
        cells = " | ".join(f"{r['us']:.1f} ({r['block_words']}, {r['num_warps']})" for r in by_batch.values())
        lines.append(f"| {mode} | {choice['geomean_us'][mode]:.1f} | {cells} |")
    verdict = ("keeps" if choice["recommended_store_mode"] == choice["default_store_mode"] else "would change")
    where = "" if choice["measured_on"] == "gpu" else "; measured on the CPU interpreter: do not set the default from it"
    lines.append(f"\nFastest store mode: {choice['recommended_store_mode']} (this {verdict} "
                 f"kernels/mask.py's DEFAULT_STORE_MODE = {choice['default_store_mode']}{where}).")
    return "\n".join(lines)


def goals(rows: list[dict]) -> dict:
    """The issue's H200 goals, evaluated on the rows (meaningful on the GPU only)."""
    with_xgr = [r for r in rows if "xgr_mask_us" in r]
    return {
        "t_mask_le_2us_at_batch1": all(r["t_mask_us"] <= 2.0 for r in rows if r["batch"] == 1),
        "t_mask_le_tenth_xgr_from_batch64": all(
            r["t_mask_over_xgr"] <= 0.1 for r in with_xgr if r["batch"] >= 64
        ),
        "mask_1_5x_faster_than_xgr": bool(with_xgr)
        and all(r["speedup_vs_xgr"] >= 1.5 for r in with_xgr),
        "mask_ge_70pct_hbm_from_batch256": all(
            r["mask_hbm_frac"] >= 0.7 for r in rows if r["batch"] >= 256
        ),
    }


def render(rows: list[dict]) -> str:
    head = "| batch | vocab | dtype | ours mask us | xgr mask us | speedup | sample masked us | sample free us | t_mask us | t_mask/xgr | mask GB/s | % of 4.8 TB/s |"
    lines = [
        head,
        "|" + "---|" * head.count("|")[:-1] if False else "|" + "|".join(["---"] * 12) + "|",
    ]
    for r in rows:
        lines.append(
            f"| {r['batch']} | {r['vocab']} | {r['dtype']} | {r['ours_mask_us']:.1f} | {r.get('xgr_mask_us', float('nan')):.1f} | "
            f"{r.get('speedup_vs_xgr', float('nan')):.2f}x | {r['sample_masked_us']:.1f} | {r['sample_free_us']:.1f} | "
            f"{r['t_mask_us']:.1f} | {r.get('t_mask_over_xgr', float('nan')):.3f} | {r['mask_gbps']:.0f} | {100 * r['mask_hbm_frac']:.1f}% |"
        )
    return "\n".join(lines)


def machine(device: torch.device) -> dict:
    info = {"python": platform.python_version(), "torch": torch.__version__, "cpu": platform.processor() or platform.machine(),
            "cpus": os.cpu_count()}  # fmt: skip
    if device.type == "cuda":
        import triton

        info.update(gpu=torch.cuda.get_device_name(device), triton=triton.__version__)
    try:
        from importlib.metadata import version

        info["xgrammar"] = version("xgrammar")
    except Exception:
        info["xgrammar"] = None
    return info


CPU_NOTE = (
    "CPU smoke test, one thread, on a shared 2-core machine under other jobs' load, so timings are "
    "noisy: the mask is the torch reference, `sample` the CPU sampler (kernels/sample_cpu.py: cached "
    "allowed sets, rows with few allowed tokens drawn on those alone). xgrammar runs its C++ CPU kernel. "
    "t_mask is negative here because the sampler draws Gumbel noise only for allowed tokens that can "
    "still win, and the mask removes most of them (these random logits are flat: a free row needs noise "
    "for every token). GB/s is not meaningful on CPU. GPU figures come from benchmarks/gpu/gpu_check.sh."
)


SWEEP_CPU_NOTE = (
    "Interpreter smoke run (TRITON_INTERPRET=1, CPU, vocabulary 4096): it shows the sweep runs and checks "
    "every mode against the torch reference; its timings say nothing about a GPU."
)


def save(args, device, quick, rows, sweep_rows) -> dict:
    """Write kernels_<device>.json/.md (called after every vocabulary, so a cut-off run keeps its rows)."""
    choice = choose_store_mode(sweep_rows, device.type)
    summary = {
        "bench": "kernels",
        "device": device.type,
        "quick": quick,
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "machine": machine(device),
        "goals": goals(rows)
        if device.type == "cuda"
        else "not evaluated (no GPU: CPU smoke test of the torch path)",
        "rows": rows,
        "sweep": sweep_rows,
        "store_mode_choice": choice,
    }
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"kernels_{'gpu' if device.type == 'cuda' else 'cpu'}")
    with open(stem + ".json", "w") as f:
        json.dump(summary, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(f"# Kernel benchmark ({device.type})\n\nCommand: `{summary['command']}`\n\n")
        f.write(
            f"Machine: `{json.dumps(summary['machine'])}`\n\nGoals: `{json.dumps(summary['goals'])}`\n\n"
        )
        if device.type == "cpu":
            f.write(CPU_NOTE + "\n\n")
        f.write(render(rows) + "\n")
        if choice:
            note = SWEEP_CPU_NOTE + "\n\n" if device.type == "cpu" else ""
            f.write(f"\n## Store-mode sweep (mask kernel)\n\n{note}{render_choice(choice)}\n")
    if args.copy_to:
        os.makedirs(args.copy_to, exist_ok=True)
        for ext in (".json", ".md"):
            shutil.copy(stem + ext, args.copy_to)
    return summary


def run_sweep(args, device, time_fn, rng) -> list[dict]:
    """The sweep at full size on GPU, small and interpreted on CPU (skipped, saying why, without the interpreter)."""
    from surecall.kernels._triton import INTERPRET

    if not args.sweep:
        return []
    if device.type == "cuda":
        return sweep(device, time_fn, rng)
    if not INTERPRET:
        print("sweep skipped: on CPU the Triton kernel runs only under TRITON_INTERPRET=1", flush=True)
        return []
    return sweep(device, time_fn, rng, CPU_SWEEP["width"], CPU_SWEEP["batches"], CPU_SWEEP["launches"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small subset (the CPU smoke test)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--out", default="benchmarks/results", help="folder for kernels_<device>.json/.md"
    )
    parser.add_argument(
        "--copy-to", default=None, help="also copy the JSON/markdown here (e.g. $OUT)"
    )
    parser.add_argument(
        "--sweep", action="store_true",
        help="also sweep the mask's store modes and launch parameters (GPU; on CPU a small interpreter run, "
             "which needs TRITON_INTERPRET=1)",
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    quick = args.quick or device.type == "cpu"
    if device.type == "cpu":
        # One thread, like xgrammar's CPU kernel; on a shared 2-core machine torch's thread pool
        # otherwise waits for time slices (every op read ~20 ms there).
        torch.set_num_threads(1)
    batches, vocabs = (BATCHES, VOCABS) if not quick else ([1, 8], VOCABS[:2])
    if args.quick and device.type == "cuda":
        batches, vocabs = [1, 64, 1024], [128_256]
    rng = np.random.default_rng(0)
    time_fn = timer(device, quick)
    xgr_apply = xgrammar_apply()
    rows: list[dict] = []
    for width in vocabs:
        dt = DeviceTable.from_table(make_table(width, rng), device)
        for dtype_name in DTYPES:
            for batch in batches:
                rows.append(
                    bench_shape(batch, width, dtype_name, dt, device, time_fn, xgr_apply, rng)
                )
                print(
                    json.dumps(
                        {k: round(v, 3) if isinstance(v, float) else v for k, v in rows[-1].items()}
                    ),
                    flush=True,
                )
        save(args, device, quick, rows, [])
    print(render(rows))
    sweep_rows = run_sweep(args, device, time_fn, rng)
    summary = save(args, device, quick, rows, sweep_rows)
    if summary["store_mode_choice"]:
        print(render_choice(summary["store_mode_choice"]))
    print(
        json.dumps(
            {k: summary[k] for k in ("bench", "device", "quick", "goals")} | {"num_rows": len(rows)}
            | {"recommended_store_mode": summary["store_mode_choice"].get("recommended_store_mode")}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
