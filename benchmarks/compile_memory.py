"""Memory of a compile against its estimates (issue 15; `compile_history.md`, fifteenth pass).

For each schema id (JSONSchemaBench `Subset---id`), in a fresh process: the estimate before the
token walk (`compile._check_memory`), then the peak RSS growth after that check (VmHWM, reset by
/proc/self/clear_refs at the check) of the walk alone and of the whole compile, under a large
memory budget so every compile finishes; then, in another fresh process, the outcome under the
default budgets (2 GiB, 30 s). Linux only (/proc). Writes <out>.json and <out>.md.

    .venv/bin/python benchmarks/compile_memory.py --ids JsonSchemaStore---bitbucket-pipelines.schema,Github_medium---o9913
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

_CHILD = r"""
import json, os, sys, time
import surecall.grammars.compile as C
from surecall.grammars.options import GrammarOptions
from surecall.grammars.vocab.loaders import load_shared

ident, data, budget_gib, time_s = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
subset = ident.split("---")[0]
with open(os.path.join(data, "jsonschemabench", f"{subset}.jsonl")) as f:
    row = next((r for r in map(json.loads, f) if r["id"] == ident), None)
if row is None:
    print(json.dumps({"id": ident, "error": "no such schema"}))
    sys.exit(0)
schema = row["schema"] if isinstance(row["schema"], dict) else json.loads(row["schema"])
vocab = load_shared("llama3")
C.warm_up(vocab)

def mib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field)) / 1024

out = {"id": ident}
check, build = C._check_memory, C.build_table

def checked(dfa, vi, cyclic, width, budget, comp=None):  # the last attempt's figures (fallbacks check again)
    estimate, walked = C.walk_estimate(dfa, vi, cyclic, width, 2 << 30, comp)  # as under the default budget
    out.update(states=dfa.num_states, pairs_to_walk=walked, estimate_mib=estimate / 2**20, rss_at_check_mib=mib("VmRSS:"))
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return check(dfa, vi, cyclic, width, budget, comp)

def built(*args, **kwargs):
    out["walk_peak_mib"] = mib("VmHWM:") - out["rss_at_check_mib"]
    return build(*args, **kwargs)

if budget_gib > 2:  # the measuring run
    C._check_memory, C.build_table = checked, built
options = GrammarOptions(time_budget_s=time_s, memory_budget_bytes=int(budget_gib * 2**30))
started = time.perf_counter()
try:
    table = C.compile_schema(schema, vocab, options=options, use_cache=False)
    out.update(ok=True, dfa_states=table.meta.get("dfa_states"), table_mib=table.nbytes / 2**20,
               ref_depth_fallback=table.meta.get("ref_depth_fallback", {}).get("max_ref_depth"))
except Exception as exc:  # a refusal is the figure
    out.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:160]}")
out["seconds"] = time.perf_counter() - started
if "rss_at_check_mib" in out:
    out["peak_mib"] = mib("VmHWM:") - out["rss_at_check_mib"]
print(json.dumps(out))
"""


def run_one(ident: str, data: str, budget_gib: float, time_s: float) -> dict:
    proc = subprocess.run([sys.executable, "-c", _CHILD, ident, data, str(budget_gib), str(time_s)],
                          capture_output=True, text=True, timeout=time_s * 4 + 120)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {"id": ident, "error": proc.stderr[-300:]}


def _outcome(default: dict) -> str:
    if default.get("ok"):
        depth = default.get("ref_depth_fallback")
        return f"compiles ({default['seconds']:.0f} s{'' if depth is None else f', max_ref_depth {depth}'})"
    return "refused (memory)" if "memory" in default.get("error", "") else default.get("error", "?")[:40]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ids", required=True, help="comma-separated JSONSchemaBench ids (Subset---id)")
    parser.add_argument("--data", default=os.environ.get("SURECALL_DATA", "../shared/data"))
    parser.add_argument("--budget-gib", type=float, default=16.0, help="memory budget of the measuring run")
    parser.add_argument("--time-s", type=float, default=60.0, help="time budget of the measuring run")
    parser.add_argument("--out", default="benchmarks/results/compile_memory")
    args = parser.parse_args(argv)
    if not (Path(args.data) / "jsonschemabench").is_dir():
        print(f"compile_memory: no jsonschemabench under {args.data} (set SURECALL_DATA)", file=sys.stderr)
        return 2
    rows = []
    for ident in [i for i in args.ids.split(",") if i]:
        measured = run_one(ident, args.data, args.budget_gib, args.time_s)
        default = run_one(ident, args.data, 2.0, 30.0)
        rows.append({"measured": measured, "default": default})
        print(json.dumps(rows[-1]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(f"{args.out}.json").write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows}, indent=1))
    lines = ["# Compile memory against its estimates (Llama-3 vocabulary)", "",
             f"Command: `{' '.join(sys.argv)}`. Measuring run: memory budget {args.budget_gib:g} GiB, time budget "
             f"{args.time_s:g} s; growth after the check before the walk (VmHWM). Outcome: defaults (2 GiB, 30 s).", "",
             "| schema | DFA states | pairs to walk | estimate MiB (the walk) | walk peak MiB | peak MiB | seconds | at the defaults |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        m = row["measured"]

        def fig(key: str, form: str = "{:,.0f}", m: dict = m) -> str:
            return form.format(m[key]) if isinstance(m.get(key), (int, float)) else "-"

        lines.append(f"| {m['id']} | {fig('states')} | {fig('pairs_to_walk')} | {fig('estimate_mib')} | "
                     f"{fig('walk_peak_mib')} | {fig('peak_mib')}{'' if m.get('ok') else ' (not finished)'} | "
                     f"{fig('seconds', '{:.1f}')} | {_outcome(row['default'])} |")
    Path(f"{args.out}.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
