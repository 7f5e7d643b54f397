"""The chat and text completion handlers: a validated request -> engine requests -> a response.

A chat request always runs on an output mode (`tool_choice` etc., plain text when there are no
tools), so content and tool calls are read from the tokens by the grammar's own reader. The
prompt is rendered once (in a worker thread) so its length is known: the default budget fills
the context up to `default_max_tokens`, and a prompt past the context is a 400. `n` choices run
as n engine requests that share the prompt's cached blocks. Admission is bounded: past
`max_num_seqs + max_queue` engine requests in flight the answer is 429. Typed engine errors
become `ApiError`s; the app turns those into OpenAI error bodies. It does not parse HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import time
from dataclasses import dataclass

from surecall.config import SamplingParams
from surecall.core.prompts import render_prompt
from surecall.errors import RequestError, SurecallError, ToolDefinitionError
from surecall.modes import merge_deltas
from surecall.server import protocol as wire
from surecall.server.streaming import ChoiceStream, run_choices, sse


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return wire.error_body(self.message, self.type, self.param, self.code)


@dataclass(frozen=True)
class ServerSettings:
    model_name: str = "surecall-tiny"
    api_key: str | None = None
    max_queue: int = 256  # engine requests allowed to wait beyond max_num_seqs before 429
    default_max_tokens: int = 512
    retry_after_s: int = 1
    max_in_flight: int | None = None  # engine requests admitted at once; None: max_num_seqs + max_queue

    def __post_init__(self):
        if not isinstance(self.max_queue, int) or self.max_queue < 0:
            raise ValueError(f"Invalid max_queue: expected an integer >= 0, got {self.max_queue!r}")
        if not isinstance(self.default_max_tokens, int) or self.default_max_tokens < 1:
            raise ValueError(f"Invalid default_max_tokens: expected an integer >= 1, got {self.default_max_tokens!r}")
        if self.max_in_flight is not None and (not isinstance(self.max_in_flight, int) or self.max_in_flight < 1):
            raise ValueError(f"Invalid max_in_flight: expected None or an integer >= 1, got {self.max_in_flight!r}")


_PARAM = re.compile(r"^Invalid ([a-z_][a-z_.]*)")


def engine_error(exc: Exception) -> ApiError:
    """A typed engine error as a 4xx (its message kept); anything else as a 500."""
    message = str(exc)
    if isinstance(exc, RequestError) and ("exceeds the model's" in message or "do not fit the KV cache" in message):
        return ApiError(400, message, param="messages", code="context_length_exceeded")
    if isinstance(exc, ToolDefinitionError):
        return ApiError(400, message, param="tools", code="invalid_tool")
    if isinstance(exc, SurecallError):
        found = _PARAM.match(message)
        param = found.group(1) if found else None
        return ApiError(400, message, param="tools" if param == "tool" else param)
    return ApiError(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")


class Handlers:
    def __init__(self, engine, settings: ServerSettings, metrics):
        self.engine, self.settings, self.metrics = engine, settings, metrics
        self.active = 0  # engine requests admitted and not finished
        self.limit = settings.max_in_flight or engine.core.scheduler.max_num_seqs + settings.max_queue

    # --- shared steps ------------------------------------------------------------------------
    def check_model(self, name: str) -> None:
        if name != self.settings.model_name:
            raise ApiError(404, f"The model {name!r} does not exist; this server serves {self.settings.model_name!r}",
                           param="model", code="model_not_found")

    def admit(self, n: int):
        """Take n slots (429 when full); returns the function that gives them back (once)."""
        if self.active + n > self.limit:
            raise ApiError(429, f"The server is at capacity ({self.active} requests in flight, limit {self.limit}); "
                                "retry later", "rate_limit_exceeded", code="queue_full",
                           headers={"Retry-After": str(self.settings.retry_after_s)})
        self.active += n
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.active -= n

        return release

    async def _run_all(self, streams, ids, params, kwargs) -> None:
        release = self.admit(len(streams))
        try:
            async with contextlib.aclosing(run_choices(self.engine, streams, ids, params, kwargs, release)) as events:
                async for _ in events:
                    pass
        finally:
            release()

    def budget(self, num_prompt: int, asked: int | None) -> int:
        ctx = self.engine.core.max_model_len
        budget = asked if asked is not None else min(self.settings.default_max_tokens, ctx - num_prompt)
        if num_prompt + max(budget, 1) > ctx:
            raise ApiError(400, f"This model's maximum context length is {ctx} tokens; the prompt has {num_prompt} "
                                f"tokens and the completion may take {budget}", param="messages",
                           code="context_length_exceeded")
        return budget

    def sampling(self, req, budget: int, n: int) -> list[SamplingParams]:
        temp = 1.0 if req.temperature is None else float(req.temperature)
        top_p = 1.0 if req.top_p is None else float(req.top_p)
        seeds = [None if req.seed is None else (req.seed + i) % (2**63) for i in range(n)]
        return [SamplingParams(temperature=temp, top_p=top_p, max_tokens=budget, seed=s) for s in seeds]

    # --- chat ----------------------------------------------------------------------------------
    async def chat(self, req: wire.ChatCompletionRequest):
        """A JSON body (dict) or an async iterator of SSE bytes (stream=True)."""
        self.check_model(req.model)
        bad = req.unsupported()
        if bad:
            raise ApiError(400, bad[1], param=bad[0], code="unsupported_parameter")
        messages = [m.as_template_message() for m in req.messages]
        tools = [t.as_tool() for t in req.tools] if req.tools else None
        llm = self.engine.llm
        try:
            ids = await asyncio.to_thread(render_prompt, messages, llm.tokenizer, tools, 0)
        except Exception as exc:  # noqa: BLE001 - a template or tool error is the request's fault or ours
            raise engine_error(exc) from exc
        params = self.sampling(req, self.budget(len(ids), req.budget()), req.n)
        kwargs = {"tools": tools, "tool_choice": req.tool_choice, "parallel_tool_calls": req.parallel_tool_calls,
                  "response_format": req.response_format or {"type": "text"}}
        streams = [ChoiceStream(llm, i, req.stop_list(), True, req.logprobs, self.metrics) for i in range(req.n)]
        meta = {"id": f"chatcmpl-{secrets.token_hex(12)}", "created": int(time.time()), "model": req.model}
        self.metrics.num_prompt_tokens += len(ids) * req.n
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return await self._start_stream(streams, ids, params, kwargs, meta, include_usage, req.logprobs)
        await self._run_all(streams, ids, params, kwargs)
        return self._chat_body(streams, ids, meta, req.logprobs)

    def _chat_body(self, streams: list[ChoiceStream], ids: list[int], meta: dict, want_logprobs: bool) -> dict:
        choices = []
        for s in streams:
            st = _checked(s)
            merged = merge_deltas(st.tool_deltas)
            content = "".join(st.content)
            message = {"role": "assistant", "content": content if content or not merged["tool_calls"] else None}
            if merged["tool_calls"]:
                message["tool_calls"] = merged["tool_calls"]
            choices.append({"index": st.index, "message": message,
                            "logprobs": {"content": st.logprobs, "refusal": None} if want_logprobs else None,
                            "finish_reason": st.finish_reason or st.final.finish_reason})
        return {**meta, "object": "chat.completion", "choices": choices, "usage": self._usage(streams, ids),
                "system_fingerprint": None}

    def _usage(self, streams: list[ChoiceStream], ids: list[int]) -> dict:
        done = [s.state.final for s in streams if s.state.final is not None]
        cached = min((o.num_cached_tokens for o in done), default=0)
        return wire.usage(len(ids), sum(len(o.token_ids) for o in done), cached)

    async def _start_stream(self, streams, ids, params, kwargs, meta, include_usage: bool, want_logprobs: bool,
                            chat: bool = True):
        """Admit, wait for the first event (so a bad request is still a plain 4xx), then stream."""
        release = self.admit(len(streams))
        # the slots are given back when the events end, are closed, or are collected unstarted-upon
        events = run_choices(self.engine, streams, ids, params, kwargs, release)
        try:
            first = await events.__anext__()
            if first.finished and streams[first.index].state.error is not None:
                raise engine_error(streams[first.index].state.error)
        except BaseException:
            await events.aclose()
            release()
            raise
        return self._stream_body(first, events, streams, ids, meta, include_usage, want_logprobs, chat)

    async def _stream_body(self, first, events, streams, ids, meta, include_usage: bool, want_logprobs: bool,
                           chat: bool):
        obj = "chat.completion.chunk" if chat else "text_completion"
        extra = {"usage": None} if include_usage else {}

        def chunk(index: int, delta: dict | None, logprobs=None, finish=None) -> bytes:
            choice = {"index": index, "logprobs": logprobs, "finish_reason": finish}
            if chat:
                choice["delta"] = delta or {}
                if logprobs is not None:
                    choice["logprobs"] = {"content": logprobs, "refusal": None}
            else:
                choice["text"] = (delta or {}).get("content", "")
                if logprobs is not None:
                    choice["logprobs"] = _completion_logprobs(logprobs)
            return sse({**meta, "object": obj, "choices": [choice], **extra})

        try:
            if chat:
                for s in streams:
                    yield chunk(s.state.index, {"role": "assistant", "content": ""})
            async for event in _chained(first, events):
                parts = event.deltas or ([{}] if event.logprobs else [])
                for k, delta in enumerate(parts):
                    last = k == len(parts) - 1
                    yield chunk(event.index, delta, event.logprobs if last and want_logprobs and event.logprobs else None)
                if event.finished:
                    try:
                        st = _checked(streams[event.index])
                    except ApiError as exc:
                        yield sse(exc.body())
                        return
                    yield chunk(event.index, {}, None, st.finish_reason or st.final.finish_reason)
            if include_usage:
                yield sse({**meta, "object": obj, "choices": [], "usage": self._usage(streams, ids)})
            yield sse("[DONE]")
        finally:
            await events.aclose()  # a client that left: the requests still running are aborted
            if any(s.state.final is not None and s.state.final.finish_reason == "abort" for s in streams) \
                    or not all(s.state.final or s.state.error for s in streams):
                self.metrics.num_aborted += 1

    # --- text completions ------------------------------------------------------------------------
    async def completion(self, req: wire.CompletionRequest):
        self.check_model(req.model)
        bad = req.unsupported()
        if bad:
            raise ApiError(400, bad[1], param=bad[0], code="unsupported_parameter")
        llm = self.engine.llm
        try:
            ids = await asyncio.to_thread(render_prompt, req.prompt, llm.tokenizer, None, 0)
        except Exception as exc:  # noqa: BLE001
            raise engine_error(exc) from exc
        asked = req.max_tokens if req.max_tokens is not None else 16  # OpenAI's default for completions
        params = self.sampling(req, self.budget(len(ids), asked), req.n)
        kwargs = {"constrained": False}
        want = req.logprobs is not None
        streams = [ChoiceStream(llm, i, req.stop_list(), False, want, self.metrics) for i in range(req.n)]
        meta = {"id": f"cmpl-{secrets.token_hex(12)}", "created": int(time.time()), "model": req.model}
        self.metrics.num_prompt_tokens += len(ids) * req.n
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return await self._start_stream(streams, ids, params, kwargs, meta, include_usage, want, chat=False)
        await self._run_all(streams, ids, params, kwargs)
        choices = []
        for s in streams:
            st = _checked(s)
            choices.append({"index": st.index, "text": "".join(st.content),
                            "logprobs": _completion_logprobs(st.logprobs) if want else None,
                            "finish_reason": st.finish_reason or st.final.finish_reason})
        return {**meta, "object": "text_completion", "choices": choices, "usage": self._usage(streams, ids),
                "system_fingerprint": None}


def _checked(stream: ChoiceStream):
    """The choice's state; ApiError when its request failed (or the server aborted it)."""
    st = stream.state
    if st.error is not None:
        raise engine_error(st.error)
    if st.final is None or (st.final.finish_reason == "abort" and st.finish_reason is None):
        raise ApiError(503, "The request was aborted (the server is shutting down)", "server_error", code="aborted")
    if st.final.finish_reason == "error":
        raise ApiError(500, f"Generation failed: {st.final.error}", "server_error", code="decode_error")
    return st


async def _chained(first, rest):
    yield first
    async for event in rest:
        yield event


def _completion_logprobs(entries: list[dict]) -> dict:
    return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": None, "text_offset": None}
