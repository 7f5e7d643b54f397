"""What a tool catalog costs in context: S tokens per tool, T_catalog = N * K * S over N turns.

Each tool is rendered as the model would see it: through the chat template's tool block when
the tokenizer has one (S_k is the growth of the rendered prompt; the block's fixed overhead is
measured separately), else as the OpenAI-style JSON definition. `render` prints the report.
Counting only; no model runs (the counting tokenizer is `surecall.models.tokenizers`'s).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from surecall.breakeven.formulas import catalog_tokens

_PROBE_MESSAGES = [{"role": "user", "content": "Hello."}]


@dataclass
class CatalogCost:
    tokenizer: str
    rendering: str  # "chat_template" or "json"
    tool_tokens: dict[str, int]  # S_k per tool
    block_overhead_tokens: int  # the tool block's fixed cost (headers, instructions), once per turn
    num_turns: int
    context_window: int
    seed_tokens_per_turn: int | None = None  # the four-tool seed catalog, same rendering
    extra: dict = field(default_factory=dict)

    @property
    def tokens_per_turn(self) -> int:
        return self.block_overhead_tokens + sum(self.tool_tokens.values())

    @property
    def t_catalog(self) -> int:
        return catalog_tokens(self.num_turns, list(self.tool_tokens.values())) + self.num_turns * self.block_overhead_tokens

    def to_dict(self) -> dict:
        k = len(self.tool_tokens)
        return {
            "tokenizer": self.tokenizer,
            "rendering": self.rendering,
            "num_tools": k,
            "mean_tool_tokens": (sum(self.tool_tokens.values()) / k) if k else 0.0,
            "block_overhead_tokens": self.block_overhead_tokens,
            "tokens_per_turn": self.tokens_per_turn,
            "num_turns": self.num_turns,
            "t_catalog": self.t_catalog,
            "context_window": self.context_window,
            "share_of_context": self.tokens_per_turn / self.context_window if self.context_window else None,
            "seed_tokens_per_turn": self.seed_tokens_per_turn,
            "ratio_to_seed": (self.tokens_per_turn / self.seed_tokens_per_turn) if self.seed_tokens_per_turn else None,
            "tool_tokens": self.tool_tokens,
            **self.extra,
        }


def openai_tool(tool: dict) -> dict:
    """The OpenAI function-tool shape chat templates expect: {type: function, function: {...}}."""
    if tool.get("type") == "function" and "function" in tool:
        return tool
    params = tool.get("parameters", tool.get("inputSchema", tool.get("input_schema", {})))
    return {
        "type": "function",
        "function": {"name": tool["name"], "description": tool.get("description", ""), "parameters": params},
    }


class TemplateRenderer:
    """Counts tokens of a chat prompt rendered with a tokenizer's chat template and some tools."""

    def __init__(self, hf_tokenizer):
        self.tok = hf_tokenizer

    def count(self, tools: list[dict]) -> int:
        ids = self.tok.apply_chat_template(
            _PROBE_MESSAGES, tools=tools or None, add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return len(ids)


def _has_tool_template(hf_tokenizer) -> bool:
    template = getattr(hf_tokenizer, "chat_template", None)
    return bool(template) and "tools" in str(template)


def measure(
    tools: list[dict],
    encode: Callable[[str], list[int]],
    hf_tokenizer=None,
    num_turns: int = 1,
    context_window: int = 32768,
    tokenizer_name: str = "",
    seed: list[dict] | None = None,
) -> CatalogCost:
    """Count S per tool for `tools` (and the seed catalog, when given) with one tokenizer."""
    tools = [openai_tool(t) for t in tools]
    seed_tools = [openai_tool(t) for t in seed] if seed else None
    if hf_tokenizer is not None and _has_tool_template(hf_tokenizer):
        renderer = TemplateRenderer(hf_tokenizer)
        per_tool, overhead = _template_costs(tools, renderer)
        seed_per_turn = sum(_template_costs(seed_tools, renderer)[0].values()) + overhead if seed_tools else None
        rendering = "chat_template"
    else:
        per_tool = {t["function"]["name"]: len(encode(json.dumps(t, ensure_ascii=False) + "\n")) for t in tools}
        overhead = 0
        seed_per_turn = (
            sum(len(encode(json.dumps(t, ensure_ascii=False) + "\n")) for t in seed_tools) if seed_tools else None
        )
        rendering = "json"
    return CatalogCost(
        tokenizer=tokenizer_name,
        rendering=rendering,
        tool_tokens=per_tool,
        block_overhead_tokens=overhead,
        num_turns=num_turns,
        context_window=context_window,
        seed_tokens_per_turn=seed_per_turn,
    )


def _template_costs(tools: list[dict], renderer: TemplateRenderer) -> tuple[dict[str, int], int]:
    """S_k = r([k]) - r([]) - O, where the block overhead O = r([a]) + r([b]) - r([a, b]) - r([])."""
    base = renderer.count([])
    singles = {t["function"]["name"]: renderer.count([t]) for t in tools}
    if len(tools) >= 2:
        a, b = tools[0], tools[1]
        pair = renderer.count([a, b])
        overhead = singles[a["function"]["name"]] + singles[b["function"]["name"]] - pair - base
    else:
        overhead = 0
    overhead = max(overhead, 0)
    return {name: n - base - overhead for name, n in singles.items()}, overhead


def render(report: dict, top: int) -> str:
    """The readable summary of a `CatalogCost.to_dict()` report, listing the `top` costliest tools."""
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
