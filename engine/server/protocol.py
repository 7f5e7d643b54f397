"""The OpenAI wire format as pydantic models: requests in (strict), responses and chunks out.

Request models forbid unknown fields, so a typo is a 400 that names the field rather than a
silently ignored parameter. Fields OpenAI defines that the engine cannot honour (penalties,
logit_bias, echo, suffix, top_logprobs > 0) are accepted only at their neutral value, and
rejected by name otherwise (`unsupported`). Response models are plain data for the handlers.
It does not render prompts or call the engine (`chat.py`, `completions.py`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- requests -------------------------------------------------------------------------------
class FunctionCall(_Strict):
    name: str
    arguments: str


class ToolCallIn(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    # echoed back by clients that append a response message as is; ignored
    refusal: str | None = None
    annotations: list[Any] | None = None
    audio: Any = None
    function_call: Any = None

    def as_template_message(self) -> dict:
        """The message as a chat template reads it (content always a string)."""
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content or [])
        out: dict = {"role": "system" if self.role == "developer" else self.role, "content": text}
        if self.tool_calls:
            out["tool_calls"] = [tc.model_dump() for tc in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


class FunctionDef(_Strict):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # every call is constrained either way


class ToolDef(_Strict):
    type: Literal["function"]
    function: FunctionDef

    def as_tool(self) -> dict:
        fn = self.function
        return {"type": "function", "function": {"name": fn.name, "description": fn.description or "",
                                                 "parameters": fn.parameters or {"type": "object", "properties": {}}}}


class StreamOptions(_Strict):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None  # accepted; no obfuscation padding is sent


class _Sampling(_Strict):
    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    n: int = Field(default=1, ge=1, le=16)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    def stop_list(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stops if s]

    def unsupported(self) -> tuple[str, str] | None:
        """(param, message) for a field set to a value the engine cannot honour."""
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                return name, f"{name} is not supported (only 0)"
        if self.logit_bias:
            return "logit_bias", "logit_bias is not supported"
        if len(self.stop_list()) > 4:
            return "stop", f"stop takes at most 4 sequences, got {len(self.stop_list())}"
        return None


class ChatCompletionRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    metadata: dict[str, str] | None = None
    store: bool | None = None

    def unsupported(self) -> tuple[str, str] | None:
        if self.top_logprobs:
            return "top_logprobs", ("top_logprobs > 0 is not supported: the engine returns only the sampled "
                                    "token's logprob (use logprobs=true with top_logprobs 0 or unset)")
        if self.max_tokens is not None and self.max_completion_tokens is not None \
                and self.max_tokens != self.max_completion_tokens:
            return "max_completion_tokens", "max_tokens and max_completion_tokens disagree; pass one"
        return super().unsupported()

    def budget(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Sampling):
    prompt: str | list[int] = Field(min_length=1)
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def unsupported(self) -> tuple[str, str] | None:
        if self.logprobs:
            return "logprobs", ("logprobs > 0 (top alternatives) is not supported: use logprobs=0 for the "
                                "sampled token's logprob")
        if self.echo:
            return "echo", "echo is not supported"
        if self.suffix:
            return "suffix", "suffix is not supported"
        if self.best_of not in (None, 1):
            return "best_of", "best_of is not supported (only 1)"
        return super().unsupported()


# --- responses ------------------------------------------------------------------------------
def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def tool_call_out(call, index: int | None = None) -> dict:
    """A modes.ModeCall in OpenAI's message shape."""
    out = {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
    if index is not None:
        out["index"] = index
    return out
