"""Which keywords the grammar leaves to the validator, over every JSONSchemaBench schema.

Runs schema -> regex (with $ref splicing, as `compile_schema` does) on all 2,584 schemas of
../shared/data/jsonschemabench, each with a time limit, and counts per keyword how many schemas
list it as relaxed (and with which reason) and as narrowed (written stricter), plus the schemas
that fail with a typed error or run out of time. It builds no DFA or token table
(benchmarks/compile.py does, on a sample). Writes `<out>.json` and `<out>.md`; `--compare
OLD.json` adds the counts of an earlier run beside them.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import platform
import signal
import time

from surecall.grammars.options import GrammarOptions
from surecall.grammars.schema.to_regex import schema_to_regex
from surecall.grammars.vocab.shared import require_shared


class _TimeUp(Exception):
    pass


def _alarm(*_):
    raise _TimeUp


def scan(limit_s: float) -> dict:
    """Per schema id: its relaxed keywords (sorted), or "timeout" / the error's type name."""
    signal.signal(signal.SIGALRM, _alarm)
    options, per, reasons, narrowed = GrammarOptions(), {}, collections.Counter(), collections.Counter()
    for path in sorted(glob.glob(os.path.join(require_shared("jsonschemabench"), "*.jsonl"))):
        for line in open(path):
            record = json.loads(line)
            signal.setitimer(signal.ITIMER_REAL, limit_s)
            try:
                result = schema_to_regex(record["schema"], options, splice=True)
            except _TimeUp:
                per[record["id"]] = "timeout"
                continue
            except Exception as exc:  # a typed SchemaError / UnsupportedSchema: counted by name
                per[record["id"]] = type(exc).__name__
                continue
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            per[record["id"]] = sorted({k for _, k in result.relaxed})
            narrowed.update({k for _, k in result.narrowed})
            for pair in set(result.relaxed):
                reasons[(pair[1], result.reasons.get(pair, "")[:100])] += 1
    return {"per_schema": per, "reasons": [[k, why, n] for (k, why), n in reasons.most_common(30)],
            "narrowed": dict(narrowed.most_common())}


def counts(per: dict) -> tuple[collections.Counter, collections.Counter, int]:
    keywords, failures = collections.Counter(), collections.Counter()
    for value in per.values():
        if isinstance(value, list):
            keywords.update(value)
        else:
            failures[value] += 1
    return keywords, failures, sum(1 for v in per.values() if isinstance(v, list) and v)


def render(report: dict, old: dict | None) -> str:
    keywords, failures, any_relaxed = counts(report["per_schema"])
    old_kw, old_fail, old_any = counts(old["per_schema"]) if old else (collections.Counter(), collections.Counter(), None)
    head = "| keyword | schemas listing it |" + (" before |" if old else "")
    lines = ["# Relaxed keywords over all JSONSchemaBench schemas (issue 15, item 4)", "",
             f"Command: `{report['command']}`. Machine: {report['machine']}; {report['limit_s']:g} s per schema "
             "(schema -> regex only, with splicing).", "",
             f"Schemas: {len(report['per_schema'])}; listing any relaxed keyword: {any_relaxed}"
             + (f" (before: {old_any})" if old else "") + ".", "", head,
             "|---|---|" + ("---|" if old else "")]
    for key in sorted(set(keywords) | set(old_kw), key=lambda k: (-keywords[k], k)):
        lines.append(f"| {key} | {keywords[key]} |" + (f" {old_kw[key]} |" if old else ""))
    lines += ["", "| not converted | schemas |" + (" before |" if old else ""), "|---|---|" + ("---|" if old else "")]
    for key in sorted(set(failures) | set(old_fail)):
        lines.append(f"| {key} | {failures[key]} |" + (f" {old_fail[key]} |" if old else ""))
    if "narrowed" in report:  # stricter than the schema (never looser), listed as narrowed, not relaxed
        lines += ["", "Schemas where the grammar is stricter than the schema (`narrowed`), per keyword: "
                  + ", ".join(f"{k} {n}" for k, n in report["narrowed"].items()) + "."]
    lines += ["", "Most common (keyword, reason) pairs:", ""]
    lines += [f"- {n} x `{k}`: {why}" for k, why, n in report["reasons"][:15]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit-s", type=float, default=5.0, help="schema -> regex time limit per schema")
    parser.add_argument("--out", default="benchmarks/results/relaxed_scan")
    parser.add_argument("--compare", default="", help="an earlier run's JSON, shown beside")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    report = {"command": "python benchmarks/relaxed_scan.py" + (f" --compare {args.compare}" if args.compare else ""),
              "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
              "limit_s": args.limit_s, **scan(args.limit_s)}
    report["run_s"] = time.perf_counter() - started
    old = json.load(open(args.compare)) if args.compare else None
    with open(args.out + ".json", "w") as f:
        json.dump(report, f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write(render(report, old))
    keywords, failures, any_relaxed = counts(report["per_schema"])
    print(json.dumps({"schemas": len(report["per_schema"]), "any_relaxed": any_relaxed,
                      "keywords": dict(keywords.most_common()), "failures": dict(failures)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
