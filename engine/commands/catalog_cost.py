"""`surecall catalog-cost`: S tokens per tool and T_catalog = N * K * S, against the seed catalog."""

from __future__ import annotations

import argparse
import json

from surecall.breakeven.catalog_cost import measure, render
from surecall.commands.args import non_negative_int, positive_int
from surecall.commands.resolve import load_counting_tokenizer, load_tools
from surecall.tools.catalog import seed_tools


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokenizer", required=True, help="tokenizer directory or file, or shared:NAME for a shared vocabulary")
    parser.add_argument("--tools", required=True, help="tools file (JSON list, JSONL, MCP list), module:attr, 'seed' or 'seed-hardened'")
    parser.add_argument("--turns", type=non_negative_int, default=1, help="N: turns that re-send the catalog (default 1)")
    parser.add_argument("--context-window", type=positive_int, default=None, help="context length (default: from the model config, else 32768)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--top", type=non_negative_int, default=10, help="list the N most expensive tools (default 10)")


def run(args: argparse.Namespace) -> int:
    tools = load_tools(args.tools)
    tok = load_counting_tokenizer(args.tokenizer, args.context_window)
    cost = measure(tools, tok.encode, tok.hf, args.turns, tok.context_window, tok.name, seed=seed_tools())
    report = cost.to_dict()
    if args.json:
        print(json.dumps(report))
        return 0
    print(render(report, args.top))
    return 0
