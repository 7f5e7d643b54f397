"""From engine outputs to OpenAI deltas: one choice's stream, stop strings, SSE framing.

`ChoiceStream` turns one request's cumulative `RequestOutput`s into chat deltas (through the
output mode's `OutputReader`, so tool-call deltas come by index as the grammar emits them) or
completion text deltas, cuts content at the first stop string (holding back a tail that may
still become one), and builds the per-token logprob entries. `run_choices` drives n engine
requests at once and merges their events into one queue; closing it aborts every request still
running (a client that went away frees its KV blocks). It does not shape responses (`handlers`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from surecall.modes import OutputReader


class StopMatcher:
    """Emits text up to the first stop string; holds back a tail that could start one."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.pending = ""
        self.hit = False

    def push(self, text: str, final: bool = False) -> str:
        if self.hit:
            return ""
        buf = self.pending + text
        cuts = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if cuts:
            self.hit, self.pending = True, ""
            return buf[: min(cuts)]
        hold = 0 if final else max((n for s in self.stops for n in range(min(len(s) - 1, len(buf)), 0, -1)
                                    if buf.endswith(s[:n])), default=0)
        self.pending = buf[len(buf) - hold:] if hold else ""
        return buf[: len(buf) - hold]


@dataclass
class ChoiceState:
    index: int
    content: list[str] = field(default_factory=list)
    tool_deltas: list[dict] = field(default_factory=list)
    logprobs: list[dict] = field(default_factory=list)
    final: object = None  # the last RequestOutput
    finish_reason: str | None = None
    error: Exception | None = None
    reader: OutputReader | None = None


class ChoiceStream:
    """One engine request -> deltas. `chat`: through the mode reader; else plain text."""

    def __init__(self, llm, index: int, stops: list[str], chat: bool, want_logprobs: bool, metrics=None):
        self.llm, self.vocab = llm, llm.vocab
        self.metrics = metrics
        self.start_s, self.last_s = time.perf_counter(), None
        self.state = ChoiceState(index)
        self.stop = StopMatcher(stops) if stops else None
        self.chat, self.want_logprobs = chat, want_logprobs
        self.seen = 0
        self.text_sent = ""  # completions: decoded text already sent

    def step(self, out) -> tuple[list[dict], list[dict]]:
        """(deltas, logprob entries) for what `out` adds; records the final output."""
        new = out.token_ids[self.seen:]
        entries = self._logprob_entries(new, out.logprobs[self.seen:] if out.logprobs else []) \
            if self.want_logprobs else []
        self.seen = len(out.token_ids)
        self._observe(len(new))
        deltas = self._chat_deltas(out, new) if self.chat else self._text_deltas(out)
        deltas = self._apply_stops(deltas, out.finished)
        st = self.state
        st.logprobs += entries
        for d in deltas:
            if "content" in d:
                st.content.append(d["content"])
            if "tool_calls" in d:
                st.tool_deltas.append(d)
        if out.finished:
            st.final = out
        return deltas, entries

    def _observe(self, num_new: int) -> None:
        if not num_new or self.metrics is None:
            return
        now = time.perf_counter()
        if self.last_s is None:
            self.metrics.ttft.observe(now - self.start_s)
        else:
            self.metrics.itl.observe((now - self.last_s) / num_new, num_new)
        self.last_s = now
        self.metrics.count_tokens(num_new)

    @property
    def stopped(self) -> bool:
        return self.stop is not None and self.stop.hit

    def _chat_deltas(self, out, new: list[int]) -> list[dict]:
        if self.state.reader is None:
            self.state.reader = OutputReader(out.mode, self.vocab)
        deltas = self.state.reader.feed(new)
        return deltas + self.state.reader.finish() if out.finished else deltas

    def _text_deltas(self, out) -> list[dict]:
        text = out.text
        if not out.finished:  # hold back a character still being decoded
            text = text.rstrip("\ufffd")
        fresh, self.text_sent = text[len(self.text_sent):], text if len(text) > len(self.text_sent) else self.text_sent
        return [{"content": fresh}] if fresh else []

    def _apply_stops(self, deltas: list[dict], final: bool) -> list[dict]:
        if self.stop is None:
            return deltas
        out = []
        for d in deltas:
            if self.stop.hit:
                break
            if "content" in d:
                text = self.stop.push(d["content"])
                if text:
                    out.append({**d, "content": text})
            else:
                out.append(d)
        if final and not self.stop.hit:
            tail = self.stop.push("", final=True)
            if tail:
                out.append({"content": tail})
        return out

    def _logprob_entries(self, ids: list[int], logprobs: list[float]) -> list[dict]:
        entries = []
        for tid, lp in zip(ids, logprobs, strict=False):
            data = self._token_bytes(tid)
            lp = float(lp) if math.isfinite(lp) else -9999.0  # JSON has no -inf; OpenAI's floor
            entries.append({"token": data.decode("utf-8", errors="replace"), "logprob": lp,
                            "bytes": list(data), "top_logprobs": []})
        return entries

    def _token_bytes(self, tid: int) -> bytes:
        vocab = self.vocab
        if tid < vocab.vocab_size and vocab.token_bytes[tid]:
            return vocab.token_bytes[tid]
        names = {v: k for k, v in vocab.special_tokens.items()}
        return names.get(tid, "").encode()


@dataclass
class Event:
    index: int
    deltas: list[dict]
    logprobs: list[dict]
    finished: bool
    new_tokens: int = 0


async def _drive(engine, stream: ChoiceStream, prompt, params, kwargs: dict, emit: Callable[[Event], None]) -> None:
    """Run one engine request to the end (or to a stop string, which aborts it)."""
    st = stream.state
    finished = False
    try:
        async with contextlib.aclosing(engine.generate(prompt, params, **kwargs)) as outputs:
            async for out in outputs:
                before = stream.seen
                deltas, entries = stream.step(out)
                finished = out.finished or stream.stopped
                if stream.stopped:
                    st.final, st.finish_reason = out, "stop"
                emit(Event(st.index, deltas, entries, finished, stream.seen - before))
                if finished:
                    break  # a stop string: leaving the loop closes the generator, which aborts the request
    except Exception as exc:  # noqa: BLE001 - reported in the response, never raised into the server
        st.error = exc
    if not finished:
        emit(Event(st.index, [], [], True))


async def run_choices(engine, streams: list[ChoiceStream], prompt, params_list, kwargs: dict,
                      on_close: Callable[[], None] | None = None) -> AsyncIterator[Event]:
    """Events of n choices as they come; closing the iterator (or losing it: asyncio closes a
    started generator when it is collected) aborts the requests still running, then calls `on_close`."""
    queue: asyncio.Queue[Event] = asyncio.Queue()
    tasks = [asyncio.create_task(_drive(engine, s, prompt, p, kwargs, queue.put_nowait))
             for s, p in zip(streams, params_list, strict=True)]
    remaining = len(tasks)
    try:
        while remaining:
            event = await queue.get()
            remaining -= event.finished
            yield event
    finally:
        for t in tasks:
            t.cancel()  # each task aborts its engine request as it unwinds
        try:
            # under a cancelled anyio scope (Starlette, client gone) this await is cancelled again
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            if on_close is not None:
                on_close()


def sse(payload: dict | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()
