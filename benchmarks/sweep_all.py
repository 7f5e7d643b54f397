"""Soundness sweep: every shared schema outside the compile benchmark's sample, ours only.

`benchmarks/compile.py` measures 192 sampled schemas against the peers. This runs ours alone over
all the others (JSONSchemaBench's 2,584 and the 878 tools, less the sample), in a shuffled order
(`--seed`), through the same worker (compile with a 10 s timeout and an address-space cap, then
the checks): random walks (half cut at the fewest tokens + 2) parsed and validated against the
original schema, the schemas' own valid instances (two plain spellings) accepted, invalid ones
rejected where the violated keyword is enforced. It looks for what a sample can miss: an unsound
walk, an invalid instance accepted, an untyped error, a relaxed bound. One JSON line per schema to
`<out>.jsonl` (appended: a stopped sweep resumes where it left off), a summary to `<out>.md`.
`--redo big,flagged,failed` runs again the schemas whose recorded line has a table over 16 MB, is
flagged, or did not compile (their lines are replaced), after a change that concerns them.

  SURECALL_DATA=../shared/data .venv/bin/python benchmarks/sweep_all.py --max-minutes 60
  SURECALL_DATA=../shared/data .venv/bin/python benchmarks/sweep_all.py --redo big,flagged
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None) -> int:
    import compile as bench
    from compile_engines import styles

    from surecall.grammars.vocab.shared import shared_data_dir
    from surecall.grammars.walk import schema_violations

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-minutes", type=float, default=60.0, help="stop starting schemas after this long")
    parser.add_argument("--seed", type=int, default=5, help="the order the schemas are taken in")
    parser.add_argument("--timeout-s", type=float, default=10.0)
    parser.add_argument("--walks", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/results/sweep_all")
    parser.add_argument("--redo", default="", help="comma-separated: big (table > 16 MB), flagged, failed")
    parser.add_argument("--redo-ids", default="",
                        help="comma-separated schema ids to run again, or @FILE: one id per line (grammar_diff.py --out)")
    args = parser.parse_args(argv)
    redo = {k for k in args.redo.split(",") if k}
    if args.redo_ids.startswith("@"):
        try:
            text = Path(args.redo_ids[1:]).read_text()
        except OSError as exc:
            print(f"--redo-ids: cannot read {args.redo_ids[1:]}: {exc.strerror}", file=sys.stderr)
            return 2
        ids = {i.strip() for i in text.replace(",", "\n").splitlines() if i.strip()}
    else:
        ids = {i for i in args.redo_ids.split(",") if i}
    if ids:
        redo.add("ids")
        _REDO["ids"] = lambda r: r["id"] in ids
    if redo - set(_REDO):
        print(f"--redo: unknown {sorted(redo - set(_REDO))}, expected some of {sorted(_REDO)}", file=sys.stderr)
        return 2
    data = shared_data_dir()
    if not (data / "jsonschemabench").exists():
        print(f"shared data not found at {data} (set SURECALL_DATA)", file=sys.stderr)
        return 2
    recorded = json.loads((Path(__file__).parent / "results" / "compile.json").read_text())
    sampled = {r["id"] for r in recorded["rows"]}
    subsets = bench.load_subsets(data, 100_000, 0, set())
    jobs = [(name, i, s, t) for name, rows in subsets.items() for i, s, t in rows if i not in sampled]
    random.Random(args.seed).shuffle(jobs)
    out_path = Path(args.out + ".jsonl")
    if redo and out_path.exists():  # drop the lines to run again (the file keeps one line per schema)
        lines = out_path.read_text().splitlines()
        keep = [line for line in lines if not any(_REDO[k](json.loads(line)) for k in redo)]
        print(f"--redo {args.redo} {args.redo_ids}: {len(lines) - len(keep)} schemas to run again", file=sys.stderr)
        out_path.write_text("".join(line + "\n" for line in keep))
    done = {json.loads(line)["id"] for line in out_path.read_text().splitlines()} if out_path.exists() else set()
    todo = [job for job in jobs if job[1] not in done]
    print(f"{len(jobs)} schemas outside the sample, {len(done)} done before, {len(todo)} to go", file=sys.stderr)
    bench.OPEN_ENGINES = set()  # the open-object recompile is compile.py's measure, not this sweep's
    worker = bench.Worker("ours", argparse.Namespace(rss_gib=4.0, walks=args.walks, data=data, timeout_s=args.timeout_s,
                                                     check_timeout_s=30.0), tempfile.mkdtemp(prefix="surecall-sweep-"))
    deadline = time.monotonic() + args.max_minutes * 60
    try:
        with out_path.open("a") as out:
            for k, (name, schema_id, schema, tests) in enumerate(todo):
                if time.monotonic() > deadline:
                    break
                result = worker.run(schema, _confirmed(schema, tests, schema_violations, styles))
                result.pop("rejected_valid", None)
                out.write(json.dumps({"subset": name, "id": schema_id, **result}, default=str) + "\n")
                out.flush()
                if k % 25 == 0:
                    print(f"[{k + 1}/{len(todo)}] {schema_id}: {'ok' if result['ok'] else result['reason']}",
                          file=sys.stderr, flush=True)
    finally:
        worker.close()
    rows = [json.loads(line) for line in out_path.read_text().splitlines()]
    summary = _summary(rows, len(jobs))
    md_path = Path(args.out + ".md")
    notes = _dated_notes(md_path)
    md_path.write_text(_markdown(summary, args, notes))
    print(json.dumps(summary["overall"]))
    return 0


def _is_flagged(r: dict) -> bool:
    return bool(r["ok"] and (r.get("walks_unsound") or r.get("invalid_rejected", 0) < r.get("invalid_n", 0)
                             or r.get("check_error") or r.get("bounds_relaxed")))


_REDO = {
    "big": lambda r: bool(r["ok"] and (r.get("table_bytes") or 0) > 16e6),
    "flagged": _is_flagged,
    "failed": lambda r: not r["ok"],
}


def _confirmed(schema, tests, schema_violations, styles) -> list:
    """(data, is_valid, spellings) of the instances whose label jsonschema confirms."""
    out = []
    for case in tests:
        try:
            bad, soft = schema_violations(schema, case["data"], [])
        except Exception:  # noqa: BLE001 - a schema jsonschema cannot load: its instances are not used
            return []
        is_valid = not bad and not soft
        if is_valid == bool(case.get("valid")):
            out.append((case["data"], is_valid, styles(case["data"], schema, with_grammar_order=False)))
    return out


def _summary(rows: list[dict], total: int) -> dict:
    ok = [r for r in rows if r["ok"]]
    keys = ("walks", "walks_valid", "walks_unsound", "walks_relaxed", "valid_n", "valid_accepted", "invalid_n",
            "invalid_rejected", "invalid_relaxed")
    overall = {"schemas": len(rows), "of": total, "compiled": len(ok), **{k: sum(r.get(k, 0) for r in ok) for k in keys},
               "relaxing_a_bound": sum(1 for r in ok if r.get("bounds_relaxed")),
               "check_errors": sum(1 for r in ok if r.get("check_error")),
               "median_ms": statistics.median(r["ms"] for r in ok) if ok else None,
               "table_max_mb": max((r["table_bytes"] for r in ok), default=0) / 1e6,
               "tables_over_32mb": sorted(((r["id"], round(r["table_bytes"] / 1e6, 1)) for r in ok
                                           if r["table_bytes"] > 32e6), key=lambda x: -x[1])}
    if ok:
        sizes = sorted(r["table_bytes"] / 1e6 for r in ok)
        overall["table_p50_p99_mb"] = [round(sizes[len(sizes) // 2], 2), round(sizes[min(len(sizes) - 1, int(0.99 * len(sizes)))], 2)]
    by_subset = collections.defaultdict(lambda: [0, 0])
    for r in rows:
        by_subset[r["subset"]][0] += 1
        by_subset[r["subset"]][1] += r["ok"]
    failures = collections.Counter(r["reason"] for r in rows if not r["ok"])
    flagged = [{"id": r["id"], "walk_errors": r.get("walk_errors"), "invalid": [r.get("invalid_rejected"), r.get("invalid_n")],
                "check_error": r.get("check_error"), "relaxed": r.get("relaxed")}
               for r in ok if _is_flagged(r)]
    return {"overall": overall, "by_subset": dict(by_subset), "failures": dict(failures), "flagged": flagged,
            "failed_ids": {r["id"]: r["reason"] for r in rows if not r["ok"]}}


def _dated_notes(md_path: Path) -> list[str]:
    """The notes written by hand under the summary of the last `<out>.md` (paragraphs opening with a
    dated "(20..."), kept across reruns: a partial rerun's summary needs them to say what was rerun."""
    if not md_path.exists():
        return []
    notes, inside = [], False
    for line in md_path.read_text().splitlines():
        if line.startswith("(20"):
            inside = True
        elif not line.strip() or line.startswith("|"):
            inside = False
        if inside:
            notes.append(line)
    return notes


def _markdown(summary: dict, args, notes: list[str] = ()) -> str:
    o = summary["overall"]
    lines = [
        "# Soundness sweep: the shared schemas outside the compile benchmark's sample (ours only)", "",
        f"Command: `.venv/bin/python benchmarks/sweep_all.py --max-minutes {args.max_minutes:g} --seed {args.seed}` "
        f"(resumes from `{args.out}.jsonl`; the last run: `{' '.join(sys.argv[1:]) or 'no arguments'}`). Machine: {platform.platform()}, Python {platform.python_version()}; "
        f"{args.timeout_s:g} s per compile, {args.walks} walks per schema.", "",
        f"Schemas run: {o['schemas']} of {o['of']}; compiled {o['compiled']}.",
        f"Walks: {o['walks_valid']}/{o['walks']} valid, {o['walks_unsound']} unsound (break an enforced keyword or "
        f"do not parse), {o['walks_relaxed']} break only a listed relaxed keyword.",
        f"Valid instances accepted (objects closed, declared order: the default): {o['valid_accepted']}/{o['valid_n']}. "
        f"Invalid instances rejected where the violated keyword is enforced: {o['invalid_rejected']}/{o['invalid_n']} "
        f"({o['invalid_relaxed']} violate only a relaxed one).",
        f"Compiled schemas relaxing a length or item bound: {o['relaxing_a_bound']}; check errors: {o['check_errors']}; "
        f"median compile {o['median_ms'] or 0:.0f} ms; table p50 / p99 / max "
        f"{' / '.join(f'{x:g}' for x in o.get('table_p50_p99_mb', []))} / {o['table_max_mb']:.1f} MB; "
        f"tables over 32 MB: {', '.join(f'{i} {mb:g} MB' for i, mb in o['tables_over_32mb']) or 'none'}.", *notes, "",
        "| subset | run | compiled |", "|---|---|---|",
        *[f"| {name} | {n} | {k} |" for name, (n, k) in sorted(summary["by_subset"].items())], "",
        "| not compiled | schemas |", "|---|---|",
        *[f"| {reason} | {n} |" for reason, n in sorted(summary["failures"].items(), key=lambda kv: -kv[1])], "",
        "Flagged (an unsound walk, an invalid instance accepted, a check error or a relaxed bound):", "",
        *([f"- {f['id']}: {json.dumps({k: v for k, v in f.items() if k != 'id' and v})}" for f in summary["flagged"]]
          or ["- none"]), "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
