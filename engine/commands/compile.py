"""`surecall compile SCHEMA_OR_TOOLS --tokenizer PATH`: compile a schema or tool catalog into a TokenTable.

SCHEMA_OR_TOOLS is a JSON Schema file, a JSON list or JSONL file of tools, or the word `seed`
for the built-in four-tool catalog. Prints the states, table bytes, the one-time set-up (per
process and vocabulary: `grammars.compile.warm_up`), cold and warm compile time (cold: the disk
cache bypassed, after the set-up; warm: loaded from it) and each keyword the grammar relaxed with
the reason (the compiler's own from `table.meta["relaxed_reasons"]`, else a generic one per
keyword); `--json` prints one JSON object. It samples nothing: `surecall sample` walks the table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from surecall.commands import resolve
from surecall.commands.args import positive_int, tool_format
from surecall.grammars import cache as table_cache

# Why a keyword may be left to the validator, when the compiler gives no reason of its own.
GENERIC_REASONS = {
    "uniqueItems": "needs memory of every earlier item; not a finite automaton",
    "minLength": "a length bound next to a pattern or format, or past the counted limit, is not counted",
    "maxLength": "a length bound next to a pattern or format, or past the counted limit, is not counted",
    "minItems": "an item bound past max_bounded_length is not materialised",
    "maxItems": "an item bound past max_bounded_length is not materialised",
    "pattern": "the pattern uses a feature a finite automaton cannot match exactly (lookaround, backreference)",
    "format": "no exact grammar for this format (or it comes with a pattern)",
    "multipleOf": "divisibility of decimal numbers is not spelled out in the grammar",
    "minimum": "a non-integral or out-of-range number bound is not spelled out in the grammar",
    "maximum": "a non-integral or out-of-range number bound is not spelled out in the grammar",
    "exclusiveMinimum": "a non-integral or out-of-range number bound is not spelled out in the grammar",
    "exclusiveMaximum": "a non-integral or out-of-range number bound is not spelled out in the grammar",
    "oneOf": "the branches overlap: 'exactly one' needs the complement of the others, which is not built",
    "not": "the negation of a general schema needs a complement automaton, which is not built",
    "if": "if/then/else is not compiled into branches",
    "dependentSchemas": "depends on which keys are present; not compiled",
    "dependencies": "depends on which keys are present; not compiled",
    "dependentRequired": "depends on which keys are present; not compiled",
    "patternProperties": "keys matched by a pattern are not enforced in the grammar",
    "propertyNames": "property names are not constrained in the grammar",
    "unevaluatedProperties": "needs annotations collected across subschemas",
    "unevaluatedItems": "needs annotations collected across subschemas",
    "contains": "which items match, at any position, is not counted",
    "minProperties": "a property count over optional or undeclared keys is not counted",
    "maxProperties": "a property count over optional or undeclared keys is not counted",
}
DEFAULT_REASON = "not enforced by the grammar; the validator checks it"


def relaxed_reasons(table) -> list[dict]:
    """[{pointer, keyword, reason}] for each relaxed keyword, the compiler's reason first.

    The compiler's reasons (`table.meta["relaxed_reasons"]`) are a list parallel to `table.relaxed`
    ("" where it gave none); a mapping "pointer keyword" -> reason is read too.
    """
    given = table.meta.get("relaxed_reasons") or {}
    if isinstance(given, (list, tuple)):
        given = {f"{p} {k}": why for (p, k), why in zip(table.relaxed, given, strict=False) if why}
    out = []
    for pointer, keyword in table.relaxed:
        reason = given.get(f"{pointer} {keyword}") or given.get(f"{pointer or '/'} {keyword}")
        out.append({"pointer": pointer or "/", "keyword": keyword,
                    "reason": reason or GENERIC_REASONS.get(keyword, DEFAULT_REASON)})
    return out


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
    parser.add_argument("--call-pieces", default="auto", choices=("auto", "always", "never"),
                        help="compile a large $ref'd object once and call it from each place (return states on the "
                             "row's stack): auto (default) where copying it passes 65,536 states")


def load_target(spec: str) -> tuple[str, object]:
    """("tools", [tool, ...]) or ("schema", dict) from a path or the word `seed`."""
    return resolve.load_schema_or_tools(spec)


def load_tokenizer(spec: str, logits_width: int | None):
    return resolve.load_vocab(spec, logits_width)


def compile_target(kind: str, target, vocab, tool_format: str, use_cache: bool | str = True,
                   call_pieces: str = "auto"):
    from surecall.grammars.compile import compile_catalog, compile_schema
    from surecall.grammars.options import GrammarOptions

    options = GrammarOptions(call_pieces=call_pieces)
    if kind == "tools":
        return compile_catalog(target, vocab, tool_format=tool_format, options=options, use_cache=use_cache)
    return compile_schema(target, vocab, options, use_cache=use_cache)


def run(args: argparse.Namespace) -> int:
    kind, target = load_target(args.target)
    vocab = load_tokenizer(args.tokenizer, args.logits_width)
    print(f"surecall compile: compiling {kind} over {vocab.name or args.tokenizer} ({vocab.vocab_size} tokens)...",
          file=sys.stderr)
    from surecall.grammars.compile import warm_up

    setup_ms = warm_up(vocab)  # what any first compile in a process pays, timed apart from this one
    started = time.perf_counter()
    table = compile_target(kind, target, vocab, args.format, use_cache="refresh",  # cold, then stored once
                           call_pieces=args.call_pieces)
    cold_ms = (time.perf_counter() - started) * 1e3
    started = time.perf_counter()
    compile_target(kind, target, vocab, args.format, call_pieces=args.call_pieces)
    warm_ms = (time.perf_counter() - started) * 1e3
    report = {
        "kind": kind, "format": args.format if kind == "tools" else None, "vocab": vocab.name,
        "states": table.num_states, "dfa_states": table.meta.get("dfa_states"), "transitions": table.num_transitions,
        "table_bytes": table.nbytes, "setup_ms": round(setup_ms, 1), "cold_ms": round(cold_ms, 2),
        "warm_ms": round(warm_ms, 3),
        "min_tokens": int(table.dist[0]), "relaxed": [list(r) for r in table.relaxed],
        "relaxed_reasons": relaxed_reasons(table),
        "narrowed": [{"pointer": p, "keyword": k, "reason": why} for p, k, why in table.meta.get("narrowed", [])],
        "ref_depth_fallback": table.meta.get("ref_depth_fallback"),
        "calls": table.meta.get("calls"), "calls_fallback": table.meta.get("calls_fallback"),
        "notes": table.meta.get("notes", []),
        "cache_dir": str(table_cache.cache_dir()), "cache_bytes": table_cache.cache_bytes(),
        "cache_max_bytes": table_cache.max_cache_bytes(),
    }
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"states {report['states']} (byte DFA {report['dfa_states']}), transitions {report['transitions']}, "
          f"table {report['table_bytes'] / 2**20:.1f} MiB")
    print(f"compile {cold_ms:.1f} ms cold, {warm_ms:.2f} ms warm (disk cache), after {setup_ms:.0f} ms of set-up "
          f"once per process and vocabulary; shortest document {report['min_tokens']} tokens")
    print(f"relaxed (enforced by the validator, not the grammar): {'none' if not table.relaxed else ''}".rstrip())
    for r in report["relaxed_reasons"]:
        print(f"  {r['keyword']} at {r['pointer']}: {r['reason']}")
    if report["narrowed"]:
        print("narrowed (stricter than the schema: every output validates, some valid values are never written):")
    for r in report["narrowed"]:
        print(f"  {r['keyword']} at {r['pointer']}: {r['reason']}")
    if report["calls"]:
        c = report["calls"]
        print(f"calls: {c['pieces']} large values compiled once and called from {c['places']} places "
              f"({c['sites']} return sites, frames up to {c['max_frame']} stack levels)"
              + (f"; {report['calls_fallback']}" if report["calls_fallback"] else ""))
    for note in report["notes"]:
        print(f"note: {note}")
    print(f"disk cache: {report['cache_dir']} holds {report['cache_bytes'] / 2**20:.1f} MiB "
          f"(limit {report['cache_max_bytes'] / 2**20:.0f} MiB, SURECALL_CACHE_MAX_BYTES; least recently used evicted)")
    return 0
