"""Prompt rendering: text, token ids or chat messages -> token ids for one row.

Chat messages go through the tokenizer's chat template with the row's tools (OpenAI function
shape) when the tokenizer has one; otherwise a plain fallback lists the tools as JSON in a system
turn. Text is encoded with the tokenizer's own special-token policy (BOS where it adds one).
It does not decide the tool format or compile grammars; that is `llm.py`.
"""

from __future__ import annotations

import json
from typing import Any

from surecall.errors import RequestError


def is_single_prompt(prompts: Any) -> bool:
    """True when `prompts` is one prompt (text, token ids, messages) rather than a batch of them."""
    if isinstance(prompts, str):
        return True
    if isinstance(prompts, (list, tuple)) and prompts:
        first = prompts[0]
        return isinstance(first, dict) or (isinstance(first, int) and not isinstance(first, bool))
    return False


def openai_tools(tools: list) -> list[dict]:
    """Tools in the OpenAI function shape chat templates expect."""
    from surecall.tools.normalise import normalise_tool

    return [normalise_tool(tool, index=i).to_openai() for i, tool in enumerate(tools)]


def _encode(tokenizer, text: str, add_special_tokens: bool) -> list[int]:
    if tokenizer is None or not hasattr(tokenizer, "encode"):
        raise RequestError("Invalid prompt: text needs a tokenizer; pass token ids or give LLM a tokenizer")
    if hasattr(tokenizer, "apply_chat_template") or hasattr(tokenizer, "convert_ids_to_tokens"):
        return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))
    return list(tokenizer.encode(text, allowed_special="all"))  # a tiktoken.Encoding


def _fallback_chat(messages: list[dict], tools: list) -> str:
    lines = []
    if tools:
        lines.append("system: You may call one of these tools:\n" + json.dumps(openai_tools(tools)))
    for m in messages:
        lines.append(f"{m.get('role', 'user')}: {m.get('content', '')}")
    lines.append("assistant:")
    return "\n".join(lines)


def render_prompt(prompt: Any, tokenizer, tools: list | None, row: int) -> list[int]:
    """Token ids for one row's prompt; RequestError naming the row when it is empty or malformed."""
    where = f"Invalid prompt at row {row}"
    if isinstance(prompt, str):
        if not prompt:
            raise RequestError(f"{where}: expected non-empty text, got ''")
        ids = _encode(tokenizer, prompt, add_special_tokens=True)
    elif isinstance(prompt, (list, tuple)) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = [int(t) for t in prompt]
    elif isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, dict) for m in prompt):
        ids = _render_chat(list(prompt), tokenizer, tools or [])
    elif isinstance(prompt, (list, tuple)) and not prompt:
        raise RequestError(f"{where}: expected at least one token id or message, got an empty list")
    else:
        raise RequestError(f"{where}: expected text, token ids or chat messages, got {type(prompt).__name__}")
    if not ids:
        raise RequestError(f"{where}: the prompt encodes to no tokens")
    return ids


def _render_chat(messages: list[dict], tokenizer, tools: list) -> list[int]:
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            messages, tools=openai_tools(tools) or None, add_generation_prompt=True, tokenize=False
        )
        return _encode(tokenizer, text, add_special_tokens=False)
    ids = _encode(tokenizer, _fallback_chat(messages, tools), add_special_tokens=True)
    return ids
