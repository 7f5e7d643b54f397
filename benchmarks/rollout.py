"""Rollout throughput and what prefix reuse buys: N concurrent scripted episodes, cache on vs off.

Each episode is the scripted five-turn coding episode of the tests (bash, edit, view, grep, bash
on a copied workspace, sampled by the shipped model under per-turn const grammars). For N in
--concurrency it runs the batch on an AsyncLLM with the prefix cache and on one without, checks
the two produced the same token ids (correctness before timing), then reports trajectories/s,
sampled tokens/s, the later turns' prefill (tokens computed and time to first token) with and
without reuse, and where the episode time went: tools (dispatch) vs decode (engine forward) vs
mask (grammar mask + sample + advance kernels, timed inside the engine step).
Usage: python benchmarks/rollout.py [--concurrency 1 8] [--turns 5] [--out benchmarks/results/rollout_cpu.md]
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # helpers.rollout: the scripted turns

from helpers.rollout import SCRIPT, make_seed  # noqa: E402

from surecall import AsyncLLM  # noqa: E402
from surecall.core import engine as core_engine  # noqa: E402
from surecall.dispatch.stores import SQLiteStore  # noqa: E402
from surecall.rollout import RolloutConfig, RolloutRunner, Task  # noqa: E402

KEY = b"rollout-benchmark-key-0123456789"


class KernelClock:
    """Wall time spent in the engine's mask/sample/advance kernels (patched into the core)."""

    def __init__(self):
        self.seconds = 0.0
        self._orig = (core_engine.sample, core_engine.advance)

    def _timed(self, fn):
        def run(*args, **kw):
            started = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                self.seconds += time.perf_counter() - started
        return run

    def __enter__(self):
        core_engine.sample, core_engine.advance = (self._timed(f) for f in self._orig)
        return self

    def __exit__(self, *exc):
        core_engine.sample, core_engine.advance = self._orig


def run_batch(engine, n: int, turns: int, tmp: Path, tag: str) -> dict:
    seed = make_seed(tmp / f"seed-{tag}")
    out = tmp / f"out-{tag}"
    tasks = [Task(id=f"b{i}", messages=[{"role": "user", "content": f"Fix log.txt in project {i}"}],
                  workspace=str(seed), max_turns=turns, turn_tools=SCRIPT[:turns], seed=i) for i in range(n)]
    runner = RolloutRunner(engine, SQLiteStore(tmp / f"idem-{tag}.db"), KEY, RolloutConfig(out_dir=str(out)))
    with KernelClock() as clock:
        started = time.perf_counter()
        result = runner.run(tasks)
        wall = time.perf_counter() - started
    shutil.rmtree(out, ignore_errors=True)
    all_turns = [t for traj in result.trajectories for t in traj.turns]
    later = [t for t in all_turns if t.index > 0]
    generate_s = sum(t.timings["generate_s"] for t in all_turns)
    dispatch_s = sum(t.timings["dispatch_s"] for t in all_turns)
    render_s = sum(t.timings.get("render_s", 0.0) for t in all_turns)
    busy = generate_s + dispatch_s + render_s
    return {
        "ids": [traj.token_ids for traj in result.trajectories], "wall_s": wall,
        "trajectories_per_s": n / wall, "sampled_tokens_per_s": result.summary["sampled_tokens"] / wall,
        "later_prefill_tokens": statistics.mean(t.prompt_len - t.num_cached_tokens for t in later),
        "later_prompt_tokens": statistics.mean(t.prompt_len for t in later),
        "later_ttft_ms": 1e3 * statistics.median(t.timings["ttft_s"] for t in later),
        "first_ttft_ms": 1e3 * statistics.median(t.timings["ttft_s"] for t in all_turns if t.index == 0),
        "share_tools": dispatch_s / busy, "share_render": render_s / busy,
        "share_mask_of_wall": clock.seconds / wall,  # inside generation: the engine thread's kernel time
        "share_decode": generate_s / busy, "kernel_s": clock.seconds, "errors": result.summary["tool_errors"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--out", default=None, help="write a markdown table here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    engines = {"reuse": AsyncLLM(num_blocks=2048), "cold": AsyncLLM(num_blocks=2048, enable_prefix_caching=False)}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        run_batch(engines["reuse"], 1, 2, Path(tmp), "warmup")  # grammar compiles, first-touch costs
        run_batch(engines["cold"], 1, 2, Path(tmp), "warmup-cold")
        for n in args.concurrency:
            got = {mode: run_batch(eng, n, args.turns, Path(tmp), f"{mode}{n}") for mode, eng in engines.items()}
            same = got["reuse"]["ids"] == got["cold"]["ids"]
            for mode, r in got.items():
                rows.append({"concurrency": n, "mode": mode, "same_ids": same,
                             **{k: round(v, 4) if isinstance(v, float) else v for k, v in r.items() if k != "ids"}})
    for eng in engines.values():
        eng.shutdown()
    report(rows, args)
    return 0


def report(rows: list[dict], args) -> None:
    head = ("| N | prefix | traj/s | sampled tok/s | later-turn prompt | computed prefill | later TTFT ms | "
            "turn-0 TTFT ms | tools | generate | mask kernels (of wall) | ids match |")
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        lines.append(f"| {r['concurrency']} | {r['mode']} | {r['trajectories_per_s']:.2f} | {r['sampled_tokens_per_s']:.0f} | "
                     f"{r['later_prompt_tokens']:.0f} | {r['later_prefill_tokens']:.1f} | {r['later_ttft_ms']:.1f} | "
                     f"{r['first_ttft_ms']:.1f} | {r['share_tools']:.0%} | {r['share_decode']:.0%} | "
                     f"{r['kernel_s']:.2f} s ({r['share_mask_of_wall']:.0%}) | {r['same_ids']} |")
    ratios = {}
    for n in sorted({r["concurrency"] for r in rows}):
        reuse = next(r for r in rows if r["concurrency"] == n and r["mode"] == "reuse")
        cold = next(r for r in rows if r["concurrency"] == n and r["mode"] == "cold")
        ratios[n] = {"prefill_tokens_x": round(cold["later_prefill_tokens"] / max(reuse["later_prefill_tokens"], 1e-9), 1),
                     "later_ttft_x": round(cold["later_ttft_ms"] / max(reuse["later_ttft_ms"], 1e-9), 2),
                     "traj_per_s_x": round(reuse["trajectories_per_s"] / cold["trajectories_per_s"], 2)}
        lines.append(f"\nN={n}: later turns compute {ratios[n]['prefill_tokens_x']}x fewer prefill tokens with reuse; "
                     f"their TTFT is {ratios[n]['later_ttft_x']}x lower; trajectories/s {ratios[n]['traj_per_s_x']}x.")
    worst = min(min(r["prefill_tokens_x"], r["later_ttft_x"]) for r in ratios.values())
    lines.append(f"\nGoal (issue 19): later turns' prefill at least 5x cheaper with prefix reuse (fewer computed "
                 f"tokens and lower TTFT, every N): {'met' if worst >= 5 else 'NOT met'} (worst ratio {worst}x).")
    table = "\n".join(lines)
    print(table)
    if args.out:
        machine = f"{platform.machine()} {platform.processor() or ''}, torch {torch.__version__}, {torch.get_num_threads()} thread"
        Path(args.out).write_text(
            "# Rollout benchmark (CPU, shipped tiny model)\n\n"
            f"Command: `python benchmarks/rollout.py --concurrency {' '.join(map(str, args.concurrency))} "
            f"--turns {args.turns} --out {args.out}`\n\nMachine: {machine} (a shared 2-core VM; other jobs ran "
            "at the same time, so absolute rates are noisy; the ratios are the point).\n\n"
            "Columns: later-turn prompt = mean prompt tokens of turns >= 1; computed prefill = of those, tokens "
            "the engine had to compute (not found in the prefix cache); TTFT = time to first token (median); "
            "tools / generate = share of the summed per-episode time in dispatch vs generation (prefill + decode); "
            "mask kernels = time inside the grammar mask + sample + advance kernels (a part of generation), and "
            "its share of the batch's wall time.\n\n" + table + "\n")
    print(json.dumps({"rows": rows, "ratios": ratios}))


if __name__ == "__main__":
    sys.exit(main())
