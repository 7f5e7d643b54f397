"""Table size and compile time of the compact TokenTable layout (issue 15, item 2).

The seed catalog over Llama-3: our cold (fresh process, then repeats) and warm compile next to
xgrammar's in the same process (benchmarks/compile.py's `seed_catalog_figures`), its table bytes
and layout (states, distinct mask rows, exceptions vs full transitions); then table bytes
p50/p99/max over a fixed-seed sample of every JSONSchemaBench subset, each schema compiled in
an isolated worker with a timeout and an address-space limit. Writes `--out`.{md,json}.
Run with another checkout's interpreter for a before/after (it imports that `surecall`).

  .venv/bin/python benchmarks/table_bytes.py [--per-subset 4] [--out benchmarks/results/compile_seed]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compile import Worker, _pct, load_subsets, seed_catalog_figures  # noqa: E402


def seed_layout() -> dict:
    """States, mask rows, exceptions and transitions of the seed catalog's table (this process)."""
    from surecall.grammars.compile import compile_schema
    from surecall.grammars.vocab.loaders import load_shared
    from surecall.tools.catalog import seed_tools

    from compile import catalog_union_schema

    table = compile_schema(catalog_union_schema(seed_tools()), load_shared("llama3"), use_cache=False)
    out = {"states": table.num_states, "table_bytes": table.nbytes, "relaxed": len(table.relaxed)}
    if hasattr(table, "mask_row"):  # the compact layout
        out.update(mask_rows=int(table.mask.shape[0]), exceptions=table.num_exceptions,
                   transitions=table.num_transitions)
    else:
        out.update(mask_rows=int(table.mask.shape[0]), transitions=int(table.trans_tok.size))
    out["arrays"] = {k: int(v.nbytes) for k, v in vars(table).items() if hasattr(v, "nbytes")}
    return out


def schema_sizes(per_subset: int, seed: int, timeout_s: float, cache_dir: str) -> dict:
    from surecall.grammars.vocab.shared import shared_data_dir

    subsets = {k: v for k, v in load_subsets(shared_data_dir(), per_subset, seed).items() if ":" not in k}
    args = argparse.Namespace(timeout_s=timeout_s, rss_gib=4.0, walks=0)
    worker = Worker("ours", args, cache_dir)
    rows = []
    try:
        for name, items in subsets.items():
            for schema_id, schema in items:
                r = worker.run(schema)
                rows.append({"subset": name, "id": schema_id, "ok": r["ok"], "ms": r.get("ms"),
                             "table_bytes": r.get("table_bytes"), "states": r.get("states"),
                             "reason": r.get("reason")})
                print(f"{name} {schema_id}: {r.get('table_bytes')} B {r.get('ms') or 0:.0f} ms {r.get('reason') or ''}",
                      file=sys.stderr)
    finally:
        worker.stop()
    sizes = [r["table_bytes"] for r in rows if r["ok"]]
    return {"n": len(rows), "compiled": len(sizes), "p50_bytes": _pct(sizes, 0.5), "p99_bytes": _pct(sizes, 0.99),
            "max_bytes": max(sizes, default=None), "over_32mb": sum(s > 32 * 2**20 for s in sizes),
            "median_ms": _pct([r["ms"] for r in rows if r["ok"]], 0.5), "rows": rows}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-subset", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=30.0)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--skip-schemas", action="store_true")
    parser.add_argument("--out", default="benchmarks/results/compile_seed")
    args = parser.parse_args(argv)
    import surecall

    cache_dir = tempfile.mkdtemp(prefix="surecall-tables-cache-")
    started = time.perf_counter()
    report = {"surecall": str(Path(surecall.__file__).parent), "machine": _machine(),
              "seed_catalog": {**seed_catalog_figures(cache_dir, args.repeats), "layout": seed_layout()}}
    if not args.skip_schemas:
        report["schemas"] = schema_sizes(args.per_subset, args.seed, args.timeout_s, cache_dir)
    report["run_s"] = time.perf_counter() - started
    Path(args.out + ".json").write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps({k: v for k, v in report.items() if k != "schemas"} | {"schemas": {
        k: v for k, v in report.get("schemas", {}).items() if k != "rows"}}, default=str))
    return 0


def _machine() -> dict:
    return {"platform": platform.platform(), "cpus": os.cpu_count(), "load_average": os.getloadavg()}


if __name__ == "__main__":
    raise SystemExit(main())
