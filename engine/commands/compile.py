"""`surecall compile SCHEMA_OR_TOOLS --tokenizer PATH`: compile a schema or tool catalog into a TokenTable.

SCHEMA_OR_TOOLS is a JSON Schema file, a JSON list or JSONL file of tools, or the word `seed`
for the built-in four-tool catalog. Prints the states, table bytes, cold and warm compile time
(cold: the disk cache bypassed; warm: loaded from it) and the keywords the grammar relaxed;
`--json` prints one JSON object. It samples nothing: `surecall sample` walks the table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from surecall.commands import resolve
from surecall.commands.args import positive_int, tool_format
from surecall.grammars import cache as table_cache


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="SCHEMA_OR_TOOLS", help=resolve.TARGET_EXPECTED)
    parser.add_argument("--tokenizer", required=True, metavar="PATH",
                        help="tokenizer directory or file, or shared:NAME for a shared vocabulary")
    parser.add_argument("--format", default="json", metavar="F", type=tool_format,
                        help="tool-call format for a catalog: json, hermes (qwen2), llama3, mistral (default json)")
    parser.add_argument("--logits-width", type=positive_int, default=None, metavar="N",
                        help="the model's logits width when it exceeds the tokenizer's size")


def load_target(spec: str) -> tuple[str, object]:
    """("tools", [tool, ...]) or ("schema", dict) from a path or the word `seed`."""
    return resolve.load_schema_or_tools(spec)


def load_tokenizer(spec: str, logits_width: int | None):
    return resolve.load_vocab(spec, logits_width)


def compile_target(kind: str, target, vocab, tool_format: str, use_cache: bool | str = True):
    from surecall.grammars.compile import compile_catalog, compile_schema

    if kind == "tools":
        return compile_catalog(target, vocab, tool_format=tool_format, use_cache=use_cache)
    return compile_schema(target, vocab, use_cache=use_cache)


def run(args: argparse.Namespace) -> int:
    kind, target = load_target(args.target)
    vocab = load_tokenizer(args.tokenizer, args.logits_width)
    print(f"surecall compile: compiling {kind} over {vocab.name or args.tokenizer} ({vocab.vocab_size} tokens)...",
          file=sys.stderr)
    started = time.perf_counter()
    table = compile_target(kind, target, vocab, args.format, use_cache="refresh")  # cold, then stored once
    cold_ms = (time.perf_counter() - started) * 1e3
    started = time.perf_counter()
    compile_target(kind, target, vocab, args.format)
    warm_ms = (time.perf_counter() - started) * 1e3
    report = {
        "kind": kind, "format": args.format if kind == "tools" else None, "vocab": vocab.name,
        "states": table.num_states, "dfa_states": table.meta.get("dfa_states"), "transitions": table.num_transitions,
        "table_bytes": table.nbytes, "cold_ms": round(cold_ms, 2), "warm_ms": round(warm_ms, 3),
        "min_tokens": int(table.dist[0]), "relaxed": [list(r) for r in table.relaxed],
        "cache_dir": str(table_cache.cache_dir()), "cache_bytes": table_cache.cache_bytes(),
        "cache_max_bytes": table_cache.max_cache_bytes(),
    }
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"states {report['states']} (byte DFA {report['dfa_states']}), transitions {report['transitions']}, "
          f"table {report['table_bytes'] / 2**20:.1f} MiB")
    print(f"compile {cold_ms:.1f} ms cold, {warm_ms:.2f} ms warm (disk cache); shortest document {report['min_tokens']} tokens")
    relaxed = ", ".join(f"{k} at {p or '/'}" for p, k in table.relaxed) or "none"
    print(f"relaxed (enforced by the validator, not the grammar): {relaxed}")
    print(f"disk cache: {report['cache_dir']} holds {report['cache_bytes'] / 2**20:.1f} MiB "
          f"(limit {report['cache_max_bytes'] / 2**20:.0f} MiB, SURECALL_CACHE_MAX_BYTES; least recently used evicted)")
    return 0
