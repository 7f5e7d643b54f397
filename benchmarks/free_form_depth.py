"""Free-form depth sweep: what max_any_depth costs a compiled schema (spliced, Llama-3 vocabulary).

For `{"type": "object"}`, the JSONSchemaBench rows named with --ids, and with --sampled the
schemas that compile.py samples whose regex depends on the depth, prints one JSON line per
(schema, depth): regex characters (parent + pieces), pieces, table states, table bytes, compile
ms (cold, in process, time_budget_s as compile.py's timeout), or the error. It only measures:
the chosen default and its reasons are in grammars/options.py and benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def depth_dependent(schema) -> bool:
    """Whether the schema's spliced regex changes between depths 2 and 3 (it has free-form values)."""
    from surecall.grammars.options import GrammarOptions
    from surecall.grammars.schema.to_regex import schema_to_regex

    two, three = (schema_to_regex(schema, GrammarOptions(max_any_depth=d), splice=True) for d in (2, 3))
    return (two.regex, two.pieces) != (three.regex, three.pieces)


def measure(name: str, schema, depth: int, vocab, budget_s: float) -> dict:
    from surecall.grammars.compile import compile_schema
    from surecall.grammars.options import GrammarOptions
    from surecall.grammars.schema.to_regex import schema_to_regex

    options = GrammarOptions(max_any_depth=depth, time_budget_s=budget_s)
    row = {"schema": name, "depth": depth}
    started = time.perf_counter()
    try:
        result = schema_to_regex(schema, options, splice=True)
        row.update(regex_chars=len(result.regex) + sum(map(len, result.pieces)), pieces=len(result.pieces))
        table = compile_schema(schema, vocab, options, use_cache=False)
        row.update(states=table.num_states, table_bytes=table.nbytes)
    except Exception as exc:  # noqa: BLE001 - a failed compile is data here
        row["error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
    row["ms"] = round((time.perf_counter() - started) * 1e3)
    return row


def main(argv=None) -> int:
    from compile import load_subsets

    from surecall.grammars.vocab.loaders import load_shared
    from surecall.grammars.vocab.shared import shared_data_dir

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--depths", default="2,3,4,5,6,7,8")
    parser.add_argument("--ids", default="", help="comma-separated row ids (substrings), e.g. kb_176_,o66151")
    parser.add_argument("--sampled", default="", help="subsets whose compile.py sample to sweep, e.g. Kubernetes")
    parser.add_argument("--budget-s", type=float, default=10.0)
    args = parser.parse_args(argv)
    data = shared_data_dir()
    schemas = {"free-form object": {"type": "object"}}
    wanted = [i for i in args.ids.split(",") if i]
    for path in sorted((data / "jsonschemabench").glob("*.jsonl")) if wanted else []:
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if any(i in row["id"] for i in wanted):
                schemas[row["id"]] = row["schema"]
    if args.sampled:
        for items in load_subsets(data, 12, 0, set(args.sampled.split(","))).values():
            schemas.update({sid: schema for sid, schema, _ in items if depth_dependent(schema)})
    vocab = load_shared("llama3")
    for name, schema in schemas.items():
        for depth in (int(d) for d in args.depths.split(",")):
            print(json.dumps(measure(name, schema, depth, vocab, args.budget_s)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
