"""AsyncLLM: the engine core behind an asyncio API in the shape vLLM users know.

`async for out in engine.generate(prompt, sampling_params, request_id=..., tools=...)` yields a
`RequestOutput` each time the request gets tokens: cumulative `token_ids` and `text`, `finished`,
`finish_reason`, logprobs, and at the end the parsed call. `abort(request_id)` cancels a request
and frees its KV blocks. One background thread steps the `EngineCore`; requests join the running
batch at the next step, so a short request submitted while long ones decode finishes first. Token
ids in and out (a prompt may be ids; `token_ids` are exactly what was sampled), for RL. Grammars
compile off the event loop. It does not serve HTTP (`surecall serve`) or run tools (`Runtime`).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from surecall.config import EngineConfig, SamplingParams
from surecall.core import EngineCore
from surecall.errors import RequestError, SurecallError
from surecall.llm import _modes_args


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # everything generated so far (a forced control token included)
    text: str
    finished: bool
    finish_reason: str | None = None  # "stop" | "length" | "error" | "abort" once finished
    logprobs: list[float] | None = None
    unmasked_logprobs: list[float] | None = None
    call: Any = None  # the parsed ToolCall when finished (tools given)
    ok: bool = False  # finished with a call that parsed and validated
    error: str | None = None
    error_kind: str | None = None
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache
    metrics: dict = field(default_factory=dict)  # ttft_s, finish_s (seconds from submission)
    # --- output modes (tool_choice / parallel_tool_calls / response_format given; surecall.modes) ---
    mode: Any = None  # the request's ModeGrammar: feed token_ids to modes.OutputReader to stream deltas
    content: str | None = None  # when finished: the text outside calls (a JSON answer's text)
    tool_calls: list = field(default_factory=list)  # when finished: modes.ModeCall (id, name, arguments, parsed, error)


_ids = itertools.count()


class AsyncLLM:
    """A model server's engine: many concurrent requests, one continuous batch."""

    def __init__(self, model=None, tokenizer=None, *, device=None, dtype=None, config: EngineConfig | None = None,
                 block_size: int = 16, num_blocks: int | None = None, kv_cache_bytes: int | None = None,
                 max_num_seqs: int = 256, max_num_batched_tokens: int = 4096, enable_prefix_caching: bool = True,
                 max_cached_grammars: int = 256, scheduling: str = "continuous"):
        from surecall.llm import LLM

        self.llm = model if isinstance(model, LLM) else LLM(model, tokenizer, device=device, dtype=dtype, config=config)
        self.core = EngineCore(self.llm.runner.model, block_size=block_size, num_blocks=num_blocks,
                               kv_cache_bytes=kv_cache_bytes, max_num_seqs=max_num_seqs,
                               max_num_batched_tokens=max_num_batched_tokens,
                               max_model_len=self.llm.config.max_seq_len or self.llm.runner.max_positions,
                               enable_prefix_caching=enable_prefix_caching, pad_id=self.llm._pad_id(),
                               check_kernel_inputs=self.llm.config.check_kernel_inputs, scheduling=scheduling,
                               graph_step=self.llm.config.graph_step)
        self._lock = threading.Lock()  # guards the core between the step thread and submitters
        self._wake = threading.Event()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue, Any]] = {}
        self._closed = False
        self._compile_lock = threading.Lock()
        # grammar lookups, compiles (cache misses) and their time; compiled tables kept (LRU)
        self.num_grammar_lookups, self.num_compiles, self.compile_s = 0, 0, 0.0
        self.max_cached_grammars = max_cached_grammars
        self._thread = threading.Thread(target=self._loop, name="surecall-engine", daemon=True)
        self._thread.start()

    # --- public ---------------------------------------------------------------------------
    async def generate(self, prompt, sampling_params: SamplingParams | None = None, *, request_id: str | None = None,
                       tools=None, tool_format: str | None = None, constrained: bool | None = None,
                       tool_choice=None, parallel_tool_calls=None, response_format=None
                       ) -> AsyncIterator[RequestOutput]:
        """Stream one request's outputs. `constrained` defaults to True when tools are given.

        tool_choice, parallel_tool_calls and response_format (OpenAI shapes, as in `LLM.generate`)
        put the request on an output mode: its final output then has `content`, `tool_calls` and a
        finish_reason of "tool_calls" | "stop" | "length" | "error" | "abort".
        """
        if self._closed:
            raise RequestError("Invalid request: the engine is shut down")
        request_id = request_id or f"req-{next(_ids)}"
        params = sampling_params or SamplingParams()
        modes = _modes_args(1, tool_choice, parallel_tool_calls, response_format)
        if modes and constrained is False:
            raise RequestError("Invalid request: tool_choice / parallel_tool_calls / response_format need constrained=True")
        constrained = (bool(tools) or bool(modes)) if constrained is None else constrained
        row, fmt, table = await asyncio.to_thread(self._prepare, prompt, tools, params, constrained, tool_format, modes)
        if row.error is not None:
            raise row.error
        queue: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        stop_ids = list(self.llm.vocab.stop_ids) if self.llm.vocab is not None else self.llm._config_stop_ids()
        with self._lock:
            if request_id in self._streams:
                raise RequestError(f"Invalid request_id {request_id!r}: a request with this id is still running")
            seq = self.core.add_request(request_id, row.ids, params, stop_ids=stop_ids, table=table,
                                        table_key=row.table_key, forced_ids=row.forced)
            self._streams[request_id] = (loop, queue, (row, fmt, seq, self.llm.text_stream()))
        self._wake.set()
        try:
            while True:
                out = await queue.get()
                yield out
                if out.finished:
                    return
        finally:
            if not seq.payload.finish_reason:  # the caller stopped listening: cancel it
                await self.abort(request_id)

    async def abort(self, request_id: str) -> bool:
        """Cancel a request (its stream ends with finish_reason "abort"); False if unknown or done."""
        with self._lock:
            entry = self._streams.pop(request_id, None)
            found = self.core.abort(request_id)
        if entry is not None:
            loop, queue, request = entry
            loop.call_soon_threadsafe(queue.put_nowait, self._output(*request, finished=True))
        return found

    @property
    def is_closed(self) -> bool:
        return self._closed

    def stats(self) -> dict:
        with self._lock:
            stats = self.core.stats()
            stats.update(num_running=len(self.core.scheduler.running), num_waiting=len(self.core.scheduler.waiting))
        return stats

    def shutdown(self) -> None:
        """Stop the step thread; running requests end with finish_reason "abort"."""
        self._closed = True
        with self._lock:
            pending = list(self._streams)
        for rid in pending:
            with self._lock:
                entry = self._streams.pop(rid, None)
                self.core.abort(rid)
            if entry is not None:
                loop, queue, request = entry
                if not loop.is_closed():
                    loop.call_soon_threadsafe(queue.put_nowait, self._output(*request, finished=True))
        self._wake.set()
        self._thread.join(timeout=10)

    async def __aenter__(self) -> AsyncLLM:
        return self

    async def __aexit__(self, *exc) -> None:
        await asyncio.to_thread(self.shutdown)

    # --- the step thread -------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._closed:
            with self._lock:
                busy = self.core.has_unfinished
                outputs = self.core.step() if busy else []
                delivered = [(self._streams.get(o.request_id), o) for o in outputs]
                for entry, o in delivered:
                    if entry is not None and o.finished:
                        self._streams.pop(o.request_id, None)
            for entry, o in delivered:
                if entry is None:
                    continue
                loop, queue, request = entry
                if not loop.is_closed():
                    loop.call_soon_threadsafe(queue.put_nowait, self._output(*request, finished=o.finished))
            if not busy:
                self._wake.wait(timeout=0.5)
                self._wake.clear()

    # --- requests and outputs --------------------------------------------------------------
    def _prepare(self, prompt, tools, params: SamplingParams, constrained: bool, tool_format: str | None, modes=None):
        """Render, normalise tools and compile the grammar (in a worker thread: compiles can take a while)."""
        llm = self.llm
        try:
            fmt = llm._format(tool_format) if tools or modes else None
        except SurecallError as exc:
            from surecall.llm import _Row

            return _Row(0, error=exc), None, None
        table = None
        with self._compile_lock:  # LLM's table cache and compile timer are not thread-safe
            [row] = llm._prepare([prompt], [tools] if tools is not None else [None], [params], constrained, fmt, modes)
            if row.error is None and row.table_key is not None:
                self.num_grammar_lookups += 1
                self.num_compiles += 1 if llm._compile_s > 0 else 0
                self.compile_s += llm._compile_s
                table = llm._tables.pop(row.table_key)  # re-inserted last: the cache is LRU
                llm._tables[row.table_key] = table
                while len(llm._tables) > self.max_cached_grammars:  # live requests keep their own reference
                    llm._tables.pop(next(iter(llm._tables)))
        return row, fmt, table

    def _output(self, row, fmt, seq, text, finished: bool) -> RequestOutput:
        """The request's output so far; `text` (a TextStream) decodes only the ids new since the last one."""
        st = seq.payload
        generated = list(st.generated)
        out = RequestOutput(
            request_id=seq.request_id, prompt_token_ids=list(row.ids), token_ids=generated,
            text=text.feed(generated, final=finished),
            finished=finished, finish_reason=st.finish_reason if finished else None,
            logprobs=list(st.logprobs) if st.sampling.logprobs else None,
            unmasked_logprobs=list(st.unmasked_logprobs) if st.sampling.unmasked_logprobs else None,
            num_cached_tokens=seq.num_cached, mode=row.mode,
        )
        if st.first_token_s is not None:
            out.metrics["ttft_s"] = st.first_token_s - st.added_s
        if not finished:
            return out
        if st.finished_s is not None:
            out.metrics["finish_s"] = st.finished_s - st.added_s
        if st.error:
            out.error, out.error_kind = st.error, "decode"
        if row.mode is not None:
            self._mode_outcome(out, row, st)
        elif row.tools and not st.error and st.finish_reason != "abort":
            from surecall.tools.calls import check_call

            check = check_call(out.text, fmt, row.tools)
            out.call, out.error, out.error_kind = check.call, check.error, check.error_kind
            out.ok = check.call is not None and check.error is None
            if out.ok:
                out.finish_reason = "stop"  # a complete, valid call
        return out

    def _mode_outcome(self, out: RequestOutput, row, st) -> None:
        """A finished mode request: content, tool_calls and finish_reason read from its tokens."""
        from surecall.modes import read_output
        from surecall.tools.calls import ToolCall

        outcome, _ = read_output(row.mode, self.llm.vocab, out.token_ids)
        out.content, out.tool_calls = outcome.content, outcome.tool_calls
        if st.finish_reason in ("abort", "error"):
            return
        # text that ran into the budget is cut short, even in a state where the grammar could end
        cut = row.mode.kind in ("text", "auto") and not (out.token_ids and out.token_ids[-1] in st.stop_ids)
        out.finish_reason = outcome.finish_reason(st.finish_reason == "stop" and not cut)
        out.error, out.error_kind = outcome.error, ("invalid" if outcome.error else None)
        out.ok = outcome.error is None
        first = outcome.tool_calls[0] if outcome.tool_calls else None
        out.call = ToolCall(first.name, first.parsed or {}) if first else None
