"""Compile every string `format` alone and beside a maxLength: ours vs xgrammar, cold, in one process.

For each format of grammars/schema/string_formats.py, `{"type": "string", "format": F}` and the same
with `maxLength` (100 by default) are compiled with the table cache off, each followed by xgrammar's
compile of the same schema (GrammarCompiler, cache off, 8 threads, as benchmarks/compile.py). Per
schema: the median of --repeats compiles (after one untimed compile that sets up per-process
tables), states, table MB, what is relaxed. Writes benchmarks/results/formats.{md,json}.

  .venv/bin/python benchmarks/formats.py
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    from surecall.grammars.compile import compile_schema
    from surecall.grammars.schema.string_formats import COUNTED_FORMATS, STRING_FORMATS
    from surecall.grammars.vocab.loaders import load_shared

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-length", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    try:
        import xgrammar as xgr
    except ImportError:
        print("formats.py: xgrammar is not installed (pip install xgrammar)", file=sys.stderr)
        return 2
    vocab = load_shared("llama3")
    info = xgr.TokenizerInfo(list(vocab.token_bytes), xgr.VocabType.RAW, vocab_size=vocab.logits_width,
                             stop_token_ids=list(vocab.stop_ids))
    compiler = xgr.GrammarCompiler(info, cache_enabled=False, max_threads=8)

    def timed(fn) -> tuple[object, float]:
        started = time.perf_counter()
        out = fn()
        return out, (time.perf_counter() - started) * 1e3

    rows = []
    for fmt in sorted(STRING_FORMATS):
        for extra in ({}, {"maxLength": args.max_length}):
            schema = {"type": "string", "format": fmt, **extra}
            table = compile_schema(schema, vocab, use_cache=False)  # per-process set-up, untimed
            ours, theirs = [], []
            text = json.dumps(schema)
            for _ in range(args.repeats):
                ours.append(timed(lambda s=schema: compile_schema(s, vocab, use_cache=False))[1])
                theirs.append(timed(lambda t=text: compiler.compile_json_schema(t, any_whitespace=False))[1])
            rows.append({"format": fmt, "maxLength": extra.get("maxLength"),
                         "counted_cap": COUNTED_FORMATS.get(fmt, (None, None))[1],
                         "ms": statistics.median(ours), "xgrammar_ms": statistics.median(theirs),
                         "states": table.num_states, "table_mb": table.nbytes / 1e6,
                         "relaxed": [k for _, k in table.relaxed]})
            print(json.dumps(rows[-1]), flush=True)
    machine = {"platform": platform.platform(), "python": platform.python_version()}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "formats.json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=1) + "\n")
    lines = ["# String formats, alone and beside a maxLength (ours vs xgrammar, Llama-3 vocabulary)", "",
             "Command: `.venv/bin/python benchmarks/formats.py`  ",
             f"Machine: {machine}; median of {args.repeats} cold compiles each, interleaved with xgrammar's.", "",
             "hostname and email are written as a free body under a counted cap (63 / 64 characters), which "
             "keeps every label and the local part within its bound; xgrammar ignores a maxLength beside a "
             "format (it warns so).", "",
             "| format | maxLength | ms ours / xgrammar | states | table MB | relaxed |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['format']} | {r['maxLength'] or '-'} | {r['ms']:.0f} / {r['xgrammar_ms']:.0f} | "
                     f"{r['states']} | {r['table_mb']:.2f} | {', '.join(r['relaxed']) or '-'} |")
    (args.out / "formats.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
