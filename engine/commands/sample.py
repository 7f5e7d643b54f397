"""`surecall sample SCHEMA_OR_TOOLS --tokenizer PATH --n N --seed S`: fuzz a grammar without a model.

Compiles (or loads from the cache) the table, then prints N random walks through it, one decoded
instance per line: tokens drawn uniformly from what the mask allows, honouring `dist` under
`--max-tokens` so every walk ends in an accepting state. It does not validate what it prints.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from surecall.commands.args import non_negative_int, positive_int
from surecall.commands.compile import (
    add_common_arguments,
    compile_target,
    load_target,
    load_tokenizer,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    parser.add_argument("--n", type=non_negative_int, default=5, metavar="N", help="number of walks (default 5)")
    parser.add_argument("--seed", type=non_negative_int, default=0, metavar="S", help="random seed (default 0)")
    parser.add_argument("--max-tokens", type=positive_int, default=None, metavar="M",
                        help="token budget per walk (default: 4096)")


def run(args: argparse.Namespace) -> int:
    from surecall.grammars.walk import decode, random_walk

    kind, target = load_target(args.target)
    vocab = load_tokenizer(args.tokenizer, args.logits_width)
    table = compile_target(kind, target, vocab, args.format, call_pieces=args.call_pieces)
    rng = np.random.default_rng(args.seed)
    for _ in range(args.n):
        ids = random_walk(table, vocab, rng, max_tokens=args.max_tokens)
        text = decode(vocab, ids).decode("utf-8", errors="replace")
        print(text if "\n" not in text else json.dumps(text))
    return 0
