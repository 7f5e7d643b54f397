"""Table size and compile time of the compact TokenTable layout (issue 15, item 2).

The seed catalog over Llama-3: our cold (fresh process, then repeats) and warm compile next to
xgrammar's in the same process (benchmarks/compile.py's `seed_catalog_figures`), its table bytes
and layout (states, distinct mask rows and blocks, exceptions vs full transitions); then table bytes
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

from compile import Worker, load_subsets, seed_catalog_figures  # noqa: E402
from compile_report import _pct  # noqa: E402


def seed_layout() -> dict:
    """States, mask rows, exceptions and transitions of the seed catalog's table (this process)."""
    from compile import catalog_union_schema

    from surecall.grammars.compile import compile_schema
    from surecall.grammars.vocab.loaders import load_shared
    from surecall.tools.catalog import seed_tools

    table = compile_schema(catalog_union_schema(seed_tools()), load_shared("llama3"), use_cache=False)
    out = {"states": table.num_states, "table_bytes": table.nbytes, "relaxed": len(table.relaxed)}
    if hasattr(table, "mask_row_blocks"):  # the compact layout, mask rows as deduplicated blocks
        out.update(mask_rows=table.num_mask_rows, mask_blocks=int(table.mask_blocks.shape[0]),
                   exceptions=table.num_exceptions, transitions=table.num_transitions)
    elif hasattr(table, "mask_row"):  # the compact layout, dense distinct mask rows
        out.update(mask_rows=int(table.mask.shape[0]), exceptions=table.num_exceptions,
                   transitions=table.num_transitions)
    else:
        out.update(mask_rows=int(table.mask.shape[0]), transitions=int(table.trans_tok.size))
    out["arrays"] = {k: int(v.nbytes) for k, v in vars(table).items() if hasattr(v, "nbytes")}
    return out


def schema_sizes(per_subset: int, seed: int, timeout_s: float, cache_dir: str) -> dict:
    from surecall.grammars.vocab.shared import shared_data_dir

    data_dir = shared_data_dir()
    subsets = {k: v for k, v in load_subsets(data_dir, per_subset, seed, set()).items() if ":" not in k}
    args = argparse.Namespace(timeout_s=timeout_s, check_timeout_s=timeout_s, rss_gib=4.0, walks=0, data=data_dir)
    worker = Worker("ours", args, cache_dir)
    rows = []
    try:
        for name, items in subsets.items():
            for schema_id, schema, _tests in items:
                r = worker.run(schema, [])
                rows.append({"subset": name, "id": schema_id, "ok": r["ok"], "ms": r.get("ms"),
                             "table_bytes": r.get("table_bytes"), "states": r.get("states"),
                             "reason": r.get("reason")})
                print(f"{name} {schema_id}: {r.get('table_bytes')} B {r.get('ms') or 0:.0f} ms {r.get('reason') or ''}",
                      file=sys.stderr)
    finally:
        worker.close()
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
    parser.add_argument("--render", nargs=2, metavar=("BEFORE_JSON", "AFTER_JSON"),
                        help="only write --out.md (and --out.json: both runs) from two earlier runs")
    args = parser.parse_args(argv)
    if args.render:
        before, after = (json.loads(Path(p).read_text()) for p in args.render)
        Path(args.out + ".json").write_text(json.dumps({"before": before, "after": after}, indent=1, default=str))
        Path(args.out + ".md").write_text(render(before, after))
        return 0
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


def render(before: dict, after: dict) -> str:
    """A markdown before/after table of two runs."""
    def seed(run, key, digits=1):
        value = run["seed_catalog"].get(key, run["seed_catalog"]["layout"].get(key))
        return "-" if value is None else f"{value:,.{digits}f}" if isinstance(value, float) else f"{value:,}"

    def mb(x):
        return "-" if x is None else f"{x / 1e6:.2f} MB"

    lines = ["# Seed catalog compile and table size: compact TokenTable layout (issue 15, item 2)", "",
             "Command: `.venv/bin/python benchmarks/table_bytes.py --out /tmp/after` (before: the same script "
             "run by main's interpreter), then `--render before.json after.json`. Llama-3 vocabulary.",
             f"Machine: {after['machine']} (2 cores shared with other jobs: the ms are loaded; compare "
             "ours with xgrammar inside one run).", "",
             "| seed catalog | before | after |", "|---|---|---|"]
    for label, key, digits in (("cold ms (median of repeats)", "cold_ms", 1), ("first cold ms (fresh process)", "first_cold_ms", 1),
                               ("warm ms (disk cache)", "warm_ms", 2), ("xgrammar ms, same run", "xgrammar_ms", 1),
                               ("states", "states", 0), ("distinct mask rows", "mask_rows", 0),
                               ("distinct mask blocks", "mask_blocks", 0),
                               ("transitions (full CSR entries)", "transitions", 0), ("exceptions stored", "exceptions", 0)):
        lines.append(f"| {label} | {seed(before, key, digits)} | {seed(after, key, digits)} |")
    lines.append(f"| table bytes | {mb(before['seed_catalog']['table_bytes'])} | {mb(after['seed_catalog']['table_bytes'])} |")
    for run_name, run in (("before", before), ("after", after)):
        catalog = run["seed_catalog"]
        ratio = catalog.get("cold_over_xgrammar", catalog["cold_ms"] / catalog["xgrammar_ms"])
        lines.append(f"\n{run_name}: cold / xgrammar = {ratio:.2f}x"
                     + (" (median of the interleaved pairs)" if "cold_over_xgrammar" in catalog else ""))
    lines += ["", "Arrays after (bytes): " + json.dumps(after["seed_catalog"]["layout"]["arrays"]), "",
              "## Table bytes over JSONSchemaBench (4 schemas per subset, seed 0, 30 s per schema)", "",
              "| | before | after |", "|---|---|---|"]
    for label, key in (("compiled / sampled", None), ("p50", "p50_bytes"), ("p99", "p99_bytes"), ("max", "max_bytes"),
                       ("tables over 32 MB", "over_32mb")):
        cells = []
        for run in (before, after):
            s = run.get("schemas", {})
            cells.append(f"{s.get('compiled')}/{s.get('n')}" if key is None else
                         str(s.get(key)) if key == "over_32mb" else mb(s.get(key)))
        lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
    rows = sorted((r for r in after.get("schemas", {}).get("rows", []) if r["ok"]), key=lambda r: -r["table_bytes"])
    lines += ["", "Largest after: " + "; ".join(f"{r['id']} {mb(r['table_bytes'])} ({r['states']} states)" for r in rows[:3]), ""]
    return "\n".join(lines)


def _machine() -> dict:
    return {"platform": platform.platform(), "cpus": os.cpu_count(), "load_average": os.getloadavg()}


if __name__ == "__main__":
    raise SystemExit(main())
