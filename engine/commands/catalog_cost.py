"""`surecall catalog-cost`: S tokens per tool and T_catalog = N * K * S, against the seed catalog."""

from __future__ import annotations

import argparse
import json

from surecall.catalog_cost import measure
from surecall.commands.args import non_negative_int, positive_int
from surecall.commands.resolve import load_counting_tokenizer, load_tools
from surecall.tools.catalog import seed_tools


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokenizer", required=True, help="tokenizer directory or file, or shared:NAME for a shared vocabulary")
    parser.add_argument("--tools", required=True, help="tools file (JSON list, JSONL, MCP list), module:attr or 'seed'")
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


def render(report: dict, top: int) -> str:
    lines = [
        f"tokenizer {report['tokenizer']} ({report['rendering']} rendering), {report['num_tools']} tools",
        f"  S per tool: mean {report['mean_tool_tokens']:.1f} tokens; tool-block overhead {report['block_overhead_tokens']} tokens",
        f"  per turn: {report['tokens_per_turn']} tokens = {report['share_of_context']:.2%} of a {report['context_window']}-token context",
        f"  T_catalog over N={report['num_turns']} turns: {report['t_catalog']} tokens",
    ]
    if report["seed_tokens_per_turn"]:
        lines.append(
            f"  seed four-tool catalog: {report['seed_tokens_per_turn']} tokens per turn; this catalog costs {report['ratio_to_seed']:.1f}x"
        )
    ranked = sorted(report["tool_tokens"].items(), key=lambda kv: -kv[1])[:top]
    if ranked:
        lines.append("  most expensive tools: " + ", ".join(f"{n} ({s})" for n, s in ranked))
    return "\n".join(lines)
