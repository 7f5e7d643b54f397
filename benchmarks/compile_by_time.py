"""Time our compile and xgrammar's, in this process, on the benchmark's schemas in a band of recorded times.

For A/B work on compile speed: the schemas `benchmarks/compile.py` sampled whose recorded compile time
(ours, benchmarks/results/compile.json) lies in [LO_MS, HI_MS], compiled cold one after another, each
followed by xgrammar's compile of the same schema. Prints the count, the sums, the medians and the median
of the per-schema ratios; run it at two commits back to back to compare them.

  SURECALL_DATA=../shared/data .venv/bin/python benchmarks/compile_by_time.py 20 400
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None) -> int:
    from compile import load_subsets

    from surecall.grammars.compile import compile_schema
    from surecall.grammars.vocab.loaders import load_shared
    from surecall.grammars.vocab.shared import shared_data_dir

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lo_ms", type=float)
    parser.add_argument("hi_ms", type=float)
    parser.add_argument("--results", type=Path, default=Path(__file__).parent / "results" / "compile.json")
    args = parser.parse_args(argv)
    recorded = json.loads(args.results.read_text())
    times = {r["id"]: r["ms"] for r in recorded["rows"] if r["engine"] == "ours" and r["ok"]}
    wanted = {i for i, ms in times.items() if args.lo_ms <= ms <= args.hi_ms}
    settings = recorded.get("settings", {})
    subsets = load_subsets(shared_data_dir(), int(settings.get("per_subset", 12)), int(settings.get("seed", 0)), set())
    items = [(i, s) for rows in subsets.values() for i, s, _ in rows if i in wanted]
    if not items:
        print(f"no schema recorded between {args.lo_ms} and {args.hi_ms} ms", file=sys.stderr)
        return 2
    import xgrammar as xgr

    vocab = load_shared("llama3")
    info = xgr.TokenizerInfo(list(vocab.token_bytes), xgr.VocabType.RAW, vocab_size=vocab.logits_width,
                             stop_token_ids=list(vocab.stop_ids))
    compiler = xgr.GrammarCompiler(info, cache_enabled=False, max_threads=8)
    compile_schema(items[0][1], vocab, use_cache=False)  # imports and per-process tables, once
    ours, theirs = [], []
    for _, schema in items:
        started = time.perf_counter()
        try:
            compile_schema(schema, vocab, use_cache=False)
        except Exception:  # a schema that fails here costs its time all the same
            pass
        ours.append((time.perf_counter() - started) * 1e3)
        started = time.perf_counter()
        try:
            compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
        except Exception:
            pass
        theirs.append((time.perf_counter() - started) * 1e3)
    print(json.dumps({"schemas": len(items), "ours_sum_ms": round(sum(ours)), "xgrammar_sum_ms": round(sum(theirs)),
                      "ours_median_ms": round(statistics.median(ours), 1),
                      "xgrammar_median_ms": round(statistics.median(theirs), 1),
                      "median_ratio": round(statistics.median(a / b for a, b in zip(ours, theirs, strict=True)), 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
