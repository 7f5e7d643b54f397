"""A/B timing for compile-speed work: first compiles of compile.py's sample, in one process, as its workers time them.

compile.py times each schema's first compile in a worker that compiled the schemas before it (round-robin over
the subsets), after `warm_up` and its warm-up schema; one run there cannot tell a 5% change from the host's load.
This runs the same kind of compile for every schema of the sample (same subsets, seed and order) in one process
and writes {subset|id: [ms, states]}; run it on each checkout, two or more times each, alternating, then
`--compare` medians each schema over the runs of each side and prints the median per-schema ratio and the sum
ratio, per band of the first side's time. It checks nothing about tables: `table_guard.py` does.

  .venv/bin/python benchmarks/compile_ab.py --out /tmp/ab/old1.json     # on the old checkout (git stash)
  .venv/bin/python benchmarks/compile_ab.py --out /tmp/ab/new1.json     # on the new one; repeat both, alternating
  .venv/bin/python benchmarks/compile_ab.py --compare /tmp/ab/old1.json,/tmp/ab/old2.json /tmp/ab/new1.json,/tmp/ab/new2.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

BANDS = ((0.0, 12.0), (12.0, 40.0), (40.0, 200.0), (200.0, float("inf")))


def timed_sample(data: Path, per_subset: int, seed: int, max_ms: float) -> dict[str, list]:
    from compile import WARMUP_SCHEMA, load_subsets

    from surecall.grammars.compile import compile_schema, warm_up
    from surecall.grammars.options import GrammarOptions
    from surecall.grammars.vocab.loaders import load_shared

    vocab = load_shared("llama3")
    warm_up(vocab)
    compile_schema(WARMUP_SCHEMA, vocab, use_cache=False)
    subsets = load_subsets(data, per_subset, seed, set())
    options = GrammarOptions(time_budget_s=max_ms / 1e3)
    out: dict[str, list] = {}
    for k in range(per_subset):  # round-robin over the subsets, as compile.py's sweep
        for name, rows in subsets.items():
            if k >= len(rows):
                continue
            sid, schema, _ = rows[k]
            started = time.perf_counter()
            try:
                table = compile_schema(schema, vocab, options, use_cache=False)
            except Exception:  # noqa: BLE001 -- a schema that fails (or passes max_ms) is left out of the timing
                continue
            out[f"{name}|{sid}"] = [(time.perf_counter() - started) * 1e3, int(table.num_states)]
    return out


def _medians(paths: str) -> dict[str, tuple[float, int]]:
    runs = [json.loads(Path(p).read_text()) for p in paths.split(",")]
    keys = set(runs[0]).intersection(*runs[1:])
    return {k: (statistics.median(r[k][0] for r in runs), runs[0][k][1]) for k in keys}


def compare(old: str, new: str) -> list[str]:
    a, b = _medians(old), _medians(new)
    keys = sorted(set(a) & set(b))
    if not keys:
        raise SystemExit("compile_ab: no schema in common between the two sides")
    lines = []
    for lo, hi in (*BANDS, (0.0, float("inf"))):
        band = [k for k in keys if lo <= a[k][0] < hi]
        if band:
            ratio = statistics.median(b[k][0] / a[k][0] for k in band)
            total = sum(b[k][0] for k in band) / sum(a[k][0] for k in band)
            label = "all" if hi == float("inf") and lo == 0 else f"{lo:g}-{hi:g} ms"
            lines.append(f"{label:>12}: {len(band):3d} schemas, median ratio new/old {ratio:.3f}, sum ratio {total:.3f}")
    moved = sum(a[k][1] != b[k][1] for k in keys)
    lines.append(f"median ms old {statistics.median(a[k][0] for k in keys):.1f}, new {statistics.median(b[k][0] for k in keys):.1f}; "
                 f"{moved} schemas changed their state count")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write this run's timings here (JSON)")
    parser.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"), help="comma-separated run files of each side")
    parser.add_argument("--data", default="", help="the shared data folder (default: surecall's shared_data_dir)")
    parser.add_argument("--per-subset", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-ms", type=float, default=3000.0, help="a compile's time budget (longer ones are left out)")
    args = parser.parse_args(argv)
    if args.compare:
        print("\n".join(compare(*args.compare)))
        return 0
    if not args.out:
        parser.error("give --out FILE (a run) or --compare OLD NEW")
    from surecall.grammars.vocab.shared import shared_data_dir

    data = Path(args.data).resolve() if args.data else shared_data_dir()
    if not (data / "jsonschemabench").is_dir():
        parser.error(f"no JSONSchemaBench data under {data} (pass --data or set SURECALL_DATA)")
    out = timed_sample(data, args.per_subset, args.seed, args.max_ms)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out))
    times = [v[0] for v in out.values()]
    print(f"{len(times)} schemas, median {statistics.median(times):.1f} ms, sum {sum(times):.0f} ms -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
