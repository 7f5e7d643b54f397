"""`surecall vocab PATH`: summarise a tokenizer vocabulary as the grammar compiler sees it.

Prints the detected format, the tokenizer's size, the model's logits width, the special and
stop ids (runs of ids shown as ranges, long lists abbreviated) and the fingerprint that keys
compiled-grammar caches; `--json` prints the same as one JSON object with every id. PATH is a
local directory or file, or a shared vocabulary's manifest name (`shared:llama3`). It loads
nothing from the network and compiles nothing.
"""

from __future__ import annotations

import argparse
import json

from surecall.commands.args import positive_int
from surecall.commands.resolve import load_vocab
from surecall.grammars.vocab.core import Vocab

_MAX_RANGES = 8  # runs of ids shown in text output before "... (N more)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="PATH",
                        help="tokenizer directory or file (tokenizer.json, vocab.json, merges.txt, "
                             "tokenizer.model, *.tiktoken), or shared:NAME for a shared vocabulary")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--logits-width", type=positive_int, default=None, metavar="N",
                        help="the model's logits width when it exceeds the tokenizer's size")


def run(args: argparse.Namespace) -> int:
    vocab = load_vocab(args.path, args.logits_width)
    if args.json:
        print(json.dumps(_as_json(vocab, args.path)))
    else:
        print(_as_text(vocab, args.path))
    return 0


def _as_json(vocab: Vocab, path: str) -> dict:
    names = {idx: text for text, idx in vocab.special_tokens.items()}
    return {
        "path": path,
        **vocab.summary(),
        "special_id_ranges": [list(run) for run in id_ranges(vocab.special_ids)],
        "num_normal_ids": len(vocab.normal_ids()),
        "stop_tokens": {str(i): names.get(i) for i in vocab.stop_ids},
    }


def id_ranges(ids) -> list[tuple[int, int]]:
    """Sorted ids as inclusive runs: [0, 1, 2, 5] -> [(0, 2), (5, 5)]."""
    runs: list[tuple[int, int]] = []
    for i in sorted(ids):
        if runs and i == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


def _format_ids(ids) -> str:
    runs = id_ranges(ids)
    shown = [f"{a}" if a == b else f"{a}..{b}" for a, b in runs[:_MAX_RANGES]]
    more = f", ... ({len(runs) - _MAX_RANGES} more runs)" if len(runs) > _MAX_RANGES else ""
    return f"{len(ids)} [{', '.join(shown)}{more}]"


def _as_text(vocab: Vocab, path: str) -> str:
    names = {idx: text for text, idx in vocab.special_tokens.items()}
    stops = ", ".join(f"{i} {names[i]}" if i in names else str(i) for i in vocab.stop_ids) or "none"
    padded = vocab.logits_width - vocab.vocab_size
    rows = [
        ("path", path),
        ("name", vocab.name or "-"),
        ("format", vocab.format),
        ("tokenizer size", str(vocab.vocab_size)),
        ("logits width", f"{vocab.logits_width}" + (f" ({padded} padded ids, never allowed)" if padded else "")),
        ("normal ids", str(len(vocab.normal_ids()))),
        ("special ids", _format_ids(vocab.special_ids)),
        ("stop ids", stops),
        ("bos / eos", f"{vocab.bos_id} / {vocab.eos_id}"),
        ("fingerprint", vocab.fingerprint),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k + ':':<{width + 1}} {v}" for k, v in rows)
