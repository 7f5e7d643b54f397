"""`surecall serve` through the real openai client: every tool_choice mode, streamed or not, n > 1,
logprobs, multi-turn tool results, response_format, text completions, and a bounded load test."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import jsonschema
import pytest

pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from helpers.serve_util import (  # noqa: E402
    KEY,
    MODEL,
    TOOLS,
    check_streamed_calls,
    check_tool_calls,
    client,
    reassemble,
    running,
    user,
    wait_idle,
)

from surecall import AsyncLLM  # noqa: E402
from surecall.server import ServerSettings, build_app  # noqa: E402

ASK = "Show the first 20 lines of src/module_3.py"
NAMED = {"type": "function", "function": {"name": "grep_search"}}


@pytest.fixture(scope="module")
def engine():
    eng = AsyncLLM(num_blocks=1024, max_num_seqs=32)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def base(engine):
    with running(build_app(engine, ServerSettings(model_name=MODEL, api_key=KEY))) as url:
        yield url


@pytest.fixture(scope="module")
def oa(base):
    return client(base)


def _chat(oa, **kw):
    kw.setdefault("model", MODEL)
    kw.setdefault("messages", user(ASK))
    kw.setdefault("max_tokens", 96)
    kw.setdefault("seed", 7)
    return oa.chat.completions.create(**kw)


def test_models_health_and_metrics(base, oa):
    assert [m.id for m in oa.models.list().data] == [MODEL]
    with urllib.request.urlopen(f"{base}/health", timeout=10) as r:
        assert json.load(r) == {"status": "ok"}
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as r:
        text = r.read().decode()
    for name in ("surecall_queue_depth", "surecall_running_rows", "surecall_tokens_per_second",
                 "surecall_time_to_first_token_seconds_bucket", "surecall_inter_token_latency_seconds_count",
                 "surecall_prefix_cache_hit_rate", "surecall_grammar_compile_seconds_total",
                 "surecall_grammar_cache_hits_total"):
        assert name in text


@pytest.mark.parametrize("choice", ["required", NAMED])
def test_calls_are_made_parse_and_validate(oa, choice):
    resp = _chat(oa, tools=TOOLS, tool_choice=choice)
    [ch] = resp.choices
    calls = check_tool_calls(ch.message.tool_calls)
    assert calls and ch.finish_reason == "tool_calls"
    if choice is NAMED:
        assert [n for n, _ in calls] == ["grep_search"]
    assert resp.usage.prompt_tokens > 0 and resp.usage.completion_tokens > 0
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens


def test_auto_and_none(oa):
    auto = _chat(oa, tools=TOOLS, tool_choice="auto", temperature=0).choices[0]
    check_tool_calls(auto.message.tool_calls)  # whatever the model chose parses
    assert auto.finish_reason in ("tool_calls", "stop", "length")
    assert (auto.finish_reason == "tool_calls") == bool(auto.message.tool_calls)
    none = _chat(oa, tools=TOOLS, tool_choice="none", max_tokens=24).choices[0]
    assert none.message.tool_calls is None and isinstance(none.message.content, str)
    assert "<tool_call>" not in none.message.content and none.finish_reason in ("stop", "length")


def test_parallel_tool_calls_false_gives_one_call(oa):
    for seed in range(3):
        resp = _chat(oa, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, seed=seed)
        assert len(check_tool_calls(resp.choices[0].message.tool_calls)) == 1


@pytest.mark.parametrize("choice", ["auto", "required", NAMED, "none"])
def test_streamed_calls_reassemble_and_parse(oa, choice):
    stream = _chat(oa, tools=TOOLS, tool_choice=choice, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    merged = reassemble(chunks)
    [slot] = merged["choices"].values()
    calls = check_streamed_calls(slot)
    if choice in ("required", NAMED):
        assert calls and slot["finish_reason"] == "tool_calls"
    if choice == "none":
        assert not calls and slot["finish_reason"] in ("stop", "length")
    assert slot["after_finish"] == 0  # finish_reason is on the choice's last chunk
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0  # the usage chunk is last
    # the same request, not streamed, gives the same calls (same seed)
    plain = _chat(oa, tools=TOOLS, tool_choice=choice)
    assert [(n, a) for n, a in check_tool_calls(plain.choices[0].message.tool_calls)] == calls


def test_n_choices_have_unique_call_ids(oa):
    resp = _chat(oa, tools=TOOLS, tool_choice="required", n=3, temperature=1.0)
    assert [c.index for c in resp.choices] == [0, 1, 2]
    ids = [tc.id for c in resp.choices for tc in c.message.tool_calls]
    assert len(ids) == len(set(ids)) >= 3
    for c in resp.choices:
        check_tool_calls(c.message.tool_calls)
    assert resp.usage.prompt_tokens_details.cached_tokens > 0  # the choices share the prompt's blocks
    streamed = reassemble(_chat(oa, tools=TOOLS, tool_choice="required", n=2, stream=True))
    assert sorted(streamed["choices"]) == [0, 1]
    for slot in streamed["choices"].values():
        assert check_streamed_calls(slot) and slot["finish_reason"] == "tool_calls"


def test_logprobs(oa):
    resp = _chat(oa, tools=TOOLS, tool_choice="required", logprobs=True)
    entries = resp.choices[0].logprobs.content
    assert len(entries) == resp.usage.completion_tokens
    assert all(e.logprob <= 0 and e.top_logprobs == [] for e in entries)
    assert bytes(b for e in entries for b in e.bytes)  # the sampled tokens' bytes
    with pytest.raises(openai.BadRequestError, match="top_logprobs") as info:
        _chat(oa, tools=TOOLS, logprobs=True, top_logprobs=2)
    assert info.value.body["param"] == "top_logprobs"


def test_multi_turn_with_tool_results(oa):
    first = _chat(oa, tools=TOOLS, tool_choice="required")
    msg = first.choices[0].message
    messages = user(ASK) + [msg.model_dump(exclude_none=True)]  # the response message, echoed back as is
    messages += [{"role": "tool", "tool_call_id": tc.id, "content": "1: import os\n2: import sys"}
                 for tc in msg.tool_calls]
    messages += user("Now search for 'import' in src")
    second = _chat(oa, messages=messages, tools=TOOLS, tool_choice="required")
    assert check_tool_calls(second.choices[0].message.tool_calls)
    assert second.usage.prompt_tokens > first.usage.prompt_tokens


def test_response_format(oa):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                "n": {"type": "integer"}}, "required": ["city", "n"],
              "additionalProperties": False}
    resp = _chat(oa, response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": schema,
                                                                           "strict": True}}, max_tokens=64)
    jsonschema.validate(json.loads(resp.choices[0].message.content), schema)
    resp = _chat(oa, response_format={"type": "json_object"}, max_tokens=64, temperature=0)
    if resp.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(resp.choices[0].message.content), dict)


def test_text_completions_and_stop(oa):
    resp = oa.completions.create(model=MODEL, prompt="<|im_start|>user\nhello", max_tokens=12, temperature=0)
    text = resp.choices[0].text
    assert resp.usage.completion_tokens <= 12 and resp.choices[0].finish_reason in ("stop", "length")
    if len(text) > 3:  # stop at a piece of the greedy text: it is cut there, finish_reason "stop"
        cut = oa.completions.create(model=MODEL, prompt="<|im_start|>user\nhello", max_tokens=12, temperature=0,
                                    stop=[text[2:4]])
        assert cut.choices[0].text == text[: text.index(text[2:4])] and cut.choices[0].finish_reason == "stop"
    chunks = list(oa.completions.create(model=MODEL, prompt="<|im_start|>user\nhello", max_tokens=12,
                                        temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text


def test_load_many_clients_well_formed_nothing_leaks(base, engine):
    """32 concurrent clients, 128 requests (streamed and not, auto and required): all well-formed."""
    aoa = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0, timeout=120)

    async def one(i: int):
        kw = {"model": MODEL, "messages": user(f"Show the first {i % 40 + 1} lines of src/m{i}.py"),
              "tools": TOOLS, "tool_choice": "required" if i % 2 else "auto", "max_tokens": 80, "seed": i}
        if i % 3 == 0:
            stream = await aoa.chat.completions.create(stream=True, **kw)
            merged = reassemble([c async for c in stream])
            slot = merged["choices"][0]
            return check_streamed_calls(slot), slot["finish_reason"], kw["tool_choice"]
        resp = await aoa.chat.completions.create(**kw)
        return check_tool_calls(resp.choices[0].message.tool_calls), resp.choices[0].finish_reason, kw["tool_choice"]

    async def main():
        sem = asyncio.Semaphore(32)

        async def bounded(i):
            async with sem:
                return await one(i)

        try:
            return await asyncio.wait_for(asyncio.gather(*[bounded(i) for i in range(128)]), timeout=400)
        finally:
            await aoa.close()

    results = asyncio.run(main())
    assert len(results) == 128
    for calls, finish, choice in results:
        assert finish in ("tool_calls", "stop", "length")
        if choice == "required":
            assert calls and finish == "tool_calls"
    stats = wait_idle(engine)
    assert stats["num_running"] == 0 and stats["num_waiting"] == 0
    assert stats["free_blocks"] == stats["num_blocks"]
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as r:
        text = r.read().decode()
    assert 'surecall_requests_total{endpoint="chat",status="200"}' in text
    assert "surecall_running_rows 0" in text


def test_grammars_compile_once_per_tools_and_mode(oa, engine):
    _chat(oa, tools=TOOLS, tool_choice="required", seed=1)
    compiles, lookups = engine.num_compiles, engine.num_grammar_lookups
    _chat(oa, tools=TOOLS, tool_choice="required", seed=2, n=2)  # same (tools, mode, format, options)
    assert engine.num_compiles == compiles and engine.num_grammar_lookups == lookups + 2
    _chat(oa, tools=TOOLS[:2], tool_choice="required", seed=3)  # other tools: one more compile
    assert engine.num_compiles == compiles + 1
