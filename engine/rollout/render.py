"""Token ids of one new segment of an episode, never of the whole conversation again.

`SegmentRenderer.prompt_ids(messages, tools)` renders the first prompt; `observation_ids(history,
call_message, results, ended_with_stop)` renders only what follows the model's turn: the text the
chat template puts after the assistant's stop token, the tool-result messages in the model
family's own format, and the next generation prompt. It finds that text as the difference of two
renderings of the template (history + call, and history + call + results), so the family's
tool-result format is whatever its template says, and tokenises only that difference. The
sampled ids themselves are never decoded and re-encoded. Tokenizers without a chat template use
the plain `role: content` fallback of `surecall.core.prompts`. It does not generate or dispatch.
"""

from __future__ import annotations

import json

from surecall.core.prompts import openai_tools, render_prompt
from surecall.errors import SurecallError


class RenderError(SurecallError):
    """The chat template does not render a conversation as an extension of its prefix."""


def call_message(calls: list[dict], text: str = "") -> dict:
    """The assistant message of a turn that made `calls` (dicts with name, arguments, id)."""
    return {"role": "assistant", "content": text if not calls else "",
            "tool_calls": [{"id": c["id"], "type": "function",
                            "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]}


def result_message(call: dict, content: str) -> dict:
    return {"role": "tool", "tool_call_id": call["id"], "name": call["name"], "content": content}


class SegmentRenderer:
    """Renders prompts and observation segments with one tokenizer's chat template."""

    def __init__(self, tokenizer, tools: list):
        self.tokenizer = tokenizer
        self.tools = tools
        self.has_template = bool(getattr(tokenizer, "chat_template", None))
        eos = getattr(tokenizer, "eos_token", None)
        self.eos_text = eos if isinstance(eos, str) else ""

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        return render_prompt(messages, self.tokenizer, self.tools, 0)

    def observation_ids(self, history: list[dict], assistant: dict, results: list[dict], ended_with_stop: bool) -> list[int]:
        """Ids of everything between the model's last sampled token and its next one."""
        text = self.observation_text(history, assistant, results, ended_with_stop)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def observation_text(self, history: list[dict], assistant: dict, results: list[dict], ended_with_stop: bool) -> str:
        before = self._render(history + [assistant], generation_prompt=False)
        after = self._render(history + [assistant] + results, generation_prompt=True)
        if not after.startswith(before):
            raise RenderError("the chat template renders the conversation with tool results differently from its "
                              "prefix; a segment cannot be rendered on its own")
        closing = self._closing(before)
        head = closing if ended_with_stop else self.eos_text + closing
        return head + after[len(before):]

    def _closing(self, rendered: str) -> str:
        """What the template writes after the assistant turn's stop token (e.g. a newline)."""
        if not self.has_template or not self.eos_text or self.eos_text not in rendered:
            return ""
        return rendered[rendered.rfind(self.eos_text) + len(self.eos_text):]

    def _render(self, messages: list[dict], generation_prompt: bool) -> str:
        if self.has_template:
            return self.tokenizer.apply_chat_template(messages, tools=openai_tools(self.tools) or None,
                                                      add_generation_prompt=generation_prompt, tokenize=False)
        lines = []
        for m in messages:
            content = m.get("content", "")
            if m.get("tool_calls"):
                content = "\n".join(json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]})
                                    for c in m["tool_calls"])
            lines.append(f"{m.get('role', 'user')}: {content}")
        if generation_prompt:
            lines.append("assistant:")
        return "\n".join(lines)
