"""Shared by the server tests: an in-process uvicorn server on a free loopback port, and checks."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time

import jsonschema

from surecall.tools import hardened_seed_tools

SEED = hardened_seed_tools()
TOOLS = [{"type": "function", "function": {**t, "strict": True}} for t in SEED]
SCHEMAS = {t["name"]: t["parameters"] for t in SEED}
MODEL = "surecall-tiny"
KEY = "test-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(app, timeout_s: float = 30.0):
    """Serve `app` on 127.0.0.1:<free port> in a thread; yields the base URL; always stopped."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error",
                                           timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, daemon=True)  # not the main thread: no signal handlers
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            server.should_exit = True
            raise RuntimeError(f"the test server did not start within {timeout_s}s")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def client(base: str, key: str | None = KEY, **kw):
    import openai

    return openai.OpenAI(base_url=f"{base}/v1", api_key=key or "none", max_retries=0, timeout=60, **kw)


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def check_tool_calls(calls) -> list[tuple[str, dict]]:
    """Every call parses as JSON and validates against its tool's schema; (name, args) each."""
    out = []
    for call in calls or []:
        assert call.type == "function" and call.id.startswith("call_")
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, SCHEMAS[call.function.name])
        out.append((call.function.name, args))
    return out


def reassemble(chunks) -> dict:
    """A streamed chat completion merged as a client does: per choice content and calls by index."""
    choices: dict[int, dict] = {}
    usage = None
    for chunk in chunks:
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            slot = choices.setdefault(ch.index, {"content": "", "calls": {}, "finish_reason": None, "after_finish": 0})
            if slot["finish_reason"] is not None:
                slot["after_finish"] += 1
            delta = ch.delta
            slot["content"] += delta.content or ""
            for tc in delta.tool_calls or []:
                call = slot["calls"].setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = tc.id or call["id"]
                if tc.function is not None:
                    call["name"] += tc.function.name or ""
                    call["arguments"] += tc.function.arguments or ""
            if ch.finish_reason is not None:
                slot["finish_reason"] = ch.finish_reason
    return {"choices": choices, "usage": usage}


def check_streamed_calls(slot: dict) -> list[tuple[str, dict]]:
    out = []
    for index in sorted(slot["calls"]):
        call = slot["calls"][index]
        assert call["id"] and call["id"].startswith("call_")
        args = json.loads(call["arguments"])
        jsonschema.validate(args, SCHEMAS[call["name"]])
        out.append((call["name"], args))
    assert sorted(slot["calls"]) == list(range(len(slot["calls"])))  # indices 0..k-1
    return out


def wait_released(handlers, timeout_s: float = 5.0) -> int:
    """The handlers' admitted-request count once it is back to 0, or when the bounded wait ends
    (the engine can finish an aborted request a moment before the handler's `finally` runs)."""
    deadline = time.monotonic() + timeout_s
    while handlers.active and time.monotonic() < deadline:
        time.sleep(0.02)
    return handlers.active


def wait_idle(engine, timeout_s: float = 20.0) -> dict:
    """Engine stats once nothing runs (bounded wait)."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = engine.stats()
        if stats["num_running"] == 0 and stats["num_waiting"] == 0 and stats["free_blocks"] == stats["num_blocks"]:
            return stats
        if time.monotonic() > deadline:
            return stats
        time.sleep(0.05)
