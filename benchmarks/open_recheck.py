"""Recheck, with objects open, the valid instances the sweep's default grammars refused.

`sweep_all.py` counts valid instances under the default policy (objects closed to their declared
properties, in declared order). For every schema with a refused valid instance in
`benchmarks/results/sweep_all.jsonl`, this compiles the open-object grammar (`compile_engines.Ours.
compile_open`: undeclared keys after the declared ones, any order for small closed objects) in a
child process with a time limit, and checks each valid instance in its spellings. An instance
refused here too is refused for a reason other than the policy: the report says where its text
stops being a prefix of the grammar, and the schema's narrowed and relaxed lists.

  SURECALL_DATA=../shared/data .venv/bin/python benchmarks/open_recheck.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent

_CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from compile import confirmed_tests, load_subsets
from compile_engines import Ours
from surecall.grammars.options import GrammarOptions
from surecall.grammars.schema.to_regex import schema_to_regex
from surecall.grammars.vocab.shared import shared_data_dir
rows = load_subsets(shared_data_dir(), 10**6, 0, {sys.argv[3]})
schema, tests = next((s, t) for rows_ in rows.values() for i, s, t in rows_ if i == sys.argv[2])
tests, _ = confirmed_tests(schema, tests)
engine = Ours(None, 0)
grammar = engine.compile_open(schema)
out = {"n": 0, "refused": []}
for data, is_valid, texts in tests:
    if not is_valid:
        continue
    out["n"] += 1
    if any(engine.accepts(grammar, t) for t in texts):
        continue
    text, state, at = texts[0].encode(), 0, None
    for i, byte in enumerate(text):
        state = int(grammar.dfa.trans[state, byte])
        if state < 0:
            at = i
            break
    out["refused"].append({"text": texts[0][:200], "stops_at": at})
if out["refused"]:
    opts = GrammarOptions(allow_additional_properties=True, any_property_order=True, counted_lengths=False)
    result = schema_to_regex(schema, opts, splice=True)
    out["narrowed"] = sorted({f"{p} {k}" for p, k in result.narrowed})
    out["relaxed"] = sorted({f"{p} {k}" for p, k in result.relaxed})
print(json.dumps(out))
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", type=Path, default=_HERE / "results" / "sweep_all.jsonl")
    parser.add_argument("--out", type=Path, default=_HERE / "results" / "open_recheck.md")
    parser.add_argument("--timeout-s", type=float, default=60.0)
    args = parser.parse_args(argv)
    rows = [json.loads(line) for line in args.sweep.read_text().splitlines() if line.strip()]
    todo = [r for r in rows if r.get("ok") and r.get("valid_n", 0) > r.get("valid_accepted", 0)]
    results, started = [], time.perf_counter()
    for k, row in enumerate(todo, 1):
        try:
            done = subprocess.run([sys.executable, "-c", _CHILD, str(_HERE), row["id"], row["subset"]], capture_output=True,
                                  text=True, timeout=args.timeout_s, env={**os.environ, "PYTHONHASHSEED": "0"})
            found = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 and done.stdout.strip() \
                else {"error": (done.stderr.strip().splitlines() or ["no output"])[-1][:200]}
        except subprocess.TimeoutExpired:
            found = {"error": f"open compile past {args.timeout_s:.0f} s"}
        found.update(id=row["id"], refused_closed=row["valid_n"] - row["valid_accepted"])
        results.append(found)
        print(f"[{k}/{len(todo)}] {row['id']}: " + (found.get("error") or f"{len(found['refused'])} refused open"),
              file=sys.stderr)
    write(args.out, results, time.perf_counter() - started, args)
    return 0


def write(path: Path, results: list[dict], seconds: float, args) -> None:
    checked = [r for r in results if "error" not in r]
    refused_closed = sum(r["refused_closed"] for r in results)
    still = [r for r in checked if r["refused"]]
    lines = [
        "# Valid instances the default grammars refuse, rechecked with objects open",
        "",
        "Command: `.venv/bin/python benchmarks/open_recheck.py` (over "
        f"`{_shown(args.sweep)}`; {args.timeout_s:.0f} s per open compile). Run: {seconds / 60:.1f} min.",
        "",
        f"Schemas with a refused valid instance: {len(results)} ({refused_closed} instances refused under the default "
        f"policy); rechecked: {len(checked)}; not rechecked: {len(results) - len(checked)}.",
        f"Of the rechecked schemas' refused instances, accepted with objects open: "
        f"{sum(r['refused_closed'] for r in checked) - sum(len(r['refused']) for r in checked)}; "
        f"refused open too: {sum(len(r['refused']) for r in still)} (in {len(still)} schemas, below).",
        "",
    ]
    for r in still:
        lines.append(f"- {r['id']}: narrowed {r.get('narrowed', [])[:4]}, relaxed {r.get('relaxed', [])[:4]}")
        for refused in r["refused"]:
            lines.append(f"  - stops at byte {refused['stops_at']}: `{refused['text'][:120]}`")
    for r in results:
        if "error" in r:
            lines.append(f"- {r['id']} not rechecked: {r['error']}")
    path.write_text("\n".join(lines) + "\n")


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(_HERE.parent))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    sys.exit(main())
