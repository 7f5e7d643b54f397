"""Schema -> regex -> byte DFA coverage on a fixed JSONSchemaBench sample (8 schemas a subset, seed 0).

For each sampled schema: does schema_to_regex succeed, does the byte DFA build within the
budget (in the reused child, `regex_to_dfa_isolated`), and how many of the schema's own valid
instances does the regex accept, rendered compact and with one space (the styles the default
options allow); the instances of a schema that does not compile count as not accepted. Acceptance uses Python `re` on the regex with counted strings spelled out. It
does not build token tables (benchmarks/compile.py does). Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import platform
import random
import re
import time

from surecall.errors import CompileBudgetExceeded, SchemaError, UnsupportedSchema
from surecall.grammars.automaton import regex_to_dfa_isolated
from surecall.grammars.options import GrammarOptions
from surecall.grammars.schema.render import grammar_dumps
from surecall.grammars.schema.to_regex import expand_marks, schema_to_regex
from surecall.grammars.vocab.shared import require_shared


def sample(per_subset: int, seed: int) -> list[tuple[str, dict]]:
    rows = []
    for path in sorted(glob.glob(os.path.join(require_shared("jsonschemabench"), "*.jsonl"))):
        records = [json.loads(line) for line in open(path)]
        rows += [(r["subset"], r) for r in random.Random(seed).sample(records, min(per_subset, len(records)))]
    return rows


def styles(value, schema, options) -> list[str]:
    texts = [grammar_dumps(value, schema, options)]
    compact = GrammarOptions(whitespace="none")
    texts.append(grammar_dumps(value, schema, compact))
    return list(dict.fromkeys(texts))


def measure(record: dict, options: GrammarOptions, dfa_budget_s: float) -> dict:
    num_valid = sum(1 for t in record.get("tests", []) if t.get("valid"))
    out = {"id": record["id"], "stage": "ok", "valid": num_valid, "accepted": 0}
    started = time.perf_counter()
    try:
        result = schema_to_regex(record["schema"], options)
    except (SchemaError, UnsupportedSchema, CompileBudgetExceeded) as exc:
        return {**out, "stage": type(exc).__name__, "why": str(exc)[:160]}
    out["regex_chars"] = len(result.regex)
    try:
        regex_to_dfa_isolated(result.regex, dfa_budget_s, options.memory_budget_bytes)
    except (SchemaError, CompileBudgetExceeded) as exc:
        return {**out, "stage": "dfa:" + type(exc).__name__, "why": str(exc)[:160]}
    out["ms"] = (time.perf_counter() - started) * 1e3
    pattern = re.compile(expand_marks(result.regex, options.whitespace_regex()))
    for test in record.get("tests", []):
        if test.get("valid"):
            texts = styles(test["data"], record["schema"], options)
            out["accepted"] += all(pattern.fullmatch(t) is not None for t in texts)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--per-subset", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dfa-budget-s", type=float, default=20.0)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    options = GrammarOptions()
    by_subset: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for subset, record in sample(args.per_subset, args.seed):
        row = measure(record, options, args.dfa_budget_s)
        c = by_subset[subset]
        c["schemas"] += 1
        c["compiled"] += row["stage"] == "ok"
        c["valid"] += row["valid"]
        c["accepted"] += row["accepted"]
        if args.verbose and (row["stage"] != "ok" or row["accepted"] < row["valid"]):
            print(json.dumps(row), flush=True)
    print("| subset | schemas | compiled | valid instances | accepted |")
    print("|---|---|---|---|---|")
    total = collections.Counter()
    for subset, c in sorted(by_subset.items()):
        total.update(c)
        print(f"| {subset} | {c['schemas']} | {c['compiled']} | {c['valid']} | {c['accepted']} |")
    print(f"| all | {total['schemas']} | {total['compiled']} | {total['valid']} | {total['accepted']} |")
    print(json.dumps({"schemas": total["schemas"], "compiled": total["compiled"], "valid": total["valid"],
                      "accepted": total["accepted"], "machine": platform.machine()}))


if __name__ == "__main__":
    main()
