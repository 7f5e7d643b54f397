"""AsyncLLM on the engine core: streaming, concurrency, abort, token ids in and out."""

from __future__ import annotations

import asyncio

import pytest

from surecall import AsyncLLM, SamplingParams
from surecall.errors import RequestError, ToolDefinitionError
from surecall.tools import hardened_seed_tools

TOOLS = hardened_seed_tools()


@pytest.fixture(scope="module")
def engine():
    eng = AsyncLLM(num_blocks=512)
    yield eng
    eng.shutdown()


def _ask(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Show the first 20 lines of src/module_{i}.py"}]


async def _collect(engine, prompt, params, **kw):
    outs = []
    async for out in engine.generate(prompt, params, **kw):
        outs.append(out)
    return outs


def test_stream_is_cumulative_and_equals_llm_generate(engine):
    params = SamplingParams(temperature=1.0, max_tokens=96, seed=11, unmasked_logprobs=True)
    outs = asyncio.run(_collect(engine, _ask(0), params, tools=TOOLS, request_id="stream-1"))
    assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
    for a, b in zip(outs, outs[1:]):
        assert b.token_ids[: len(a.token_ids)] == a.token_ids and len(b.token_ids) == len(a.token_ids) + 1
    last = outs[-1]
    [ref] = engine.llm.generate(_ask(0), tools=TOOLS, sampling=params)
    assert last.token_ids == ref.token_ids and last.text == ref.text
    assert last.ok and last.finish_reason == "stop" and last.call.name == ref.call.name
    assert last.prompt_token_ids == ref.prompt_token_ids and len(last.logprobs) == len(last.token_ids)
    assert last.metrics["ttft_s"] <= last.metrics["finish_s"]


def test_many_concurrent_requests_complete_and_free_their_blocks(engine):
    async def main():
        params = [SamplingParams(temperature=1.0, max_tokens=64, seed=i) for i in range(8)]
        return await asyncio.gather(*[_collect(engine, _ask(i), p, tools=TOOLS) for i, p in enumerate(params)])

    results = asyncio.run(main())
    assert all(r[-1].finished and r[-1].ok for r in results)
    stats = engine.stats()
    assert stats["free_blocks"] == stats["num_blocks"] and stats["num_running"] == 0
    assert stats["prefix_hit_tokens"] > 0  # the system prompt with the tools is shared


def test_abort_ends_the_stream_and_frees_the_cache(engine):
    async def main():
        params = SamplingParams(temperature=1.0, max_tokens=200, seed=3)
        stream = engine.generate(_ask(1), params, request_id="to-abort", constrained=False)
        first = await stream.__anext__()
        assert await engine.abort("to-abort")
        rest = [o async for o in stream]
        return first, rest

    first, rest = asyncio.run(main())
    assert not first.finished and rest[-1].finished and rest[-1].finish_reason == "abort"
    assert not asyncio.run(engine.abort("to-abort"))
    stats = engine.stats()
    assert stats["free_blocks"] == stats["num_blocks"]


def test_a_consumer_that_stops_listening_cancels_its_request(engine):
    async def main():
        async for _ in engine.generate(_ask(2), SamplingParams(max_tokens=200, seed=4), constrained=False):
            break  # the generator is closed: the request is aborted

    asyncio.run(main())
    stats = engine.stats()
    assert stats["num_running"] == 0 and stats["free_blocks"] == stats["num_blocks"]


def test_token_ids_in_and_out(engine):
    ids = engine.llm.count_tokens("user: hello there\nassistant:")
    greedy = SamplingParams(temperature=0, max_tokens=12)
    [out] = asyncio.run(_collect(engine, ids, greedy))[-1:]
    [ref] = engine.llm.generate([ids], sampling=greedy, constrained=False)
    assert out.prompt_token_ids == ids and out.token_ids == ref.token_ids


def test_a_short_request_overtakes_a_long_one(engine):
    async def main():
        order, started = [], asyncio.Event()

        async def run(name, prompt, params):
            async for _ in engine.generate(prompt, params, constrained=False):
                started.set()  # the long one is decoding: the short one joins it mid-stream
            order.append(name)

        long_task = asyncio.create_task(run("long", _ask(3), SamplingParams(temperature=0, max_tokens=150)))
        await asyncio.wait_for(started.wait(), timeout=60)
        await run("short", _ask(4), SamplingParams(temperature=0, max_tokens=4))
        await long_task
        return order

    assert asyncio.run(main()) == ["short", "long"]


def test_bad_requests_fail_alone(engine):
    async def main():
        with pytest.raises(RequestError, match="exceeds the model's"):
            await _collect(engine, [1] * 10, SamplingParams(max_tokens=engine.core.max_model_len))
        with pytest.raises(ToolDefinitionError, match="Invalid tool 0"):
            await _collect(engine, _ask(5), SamplingParams(max_tokens=32), tools=[42])
        with pytest.raises(RequestError, match="shortest call"):
            await _collect(engine, _ask(5), SamplingParams(max_tokens=2), tools=TOOLS)
        good = await _collect(engine, _ask(5), SamplingParams(max_tokens=64, seed=1), tools=TOOLS)
        return good[-1]

    assert asyncio.run(main()).ok


def test_output_modes_through_generate(engine):
    async def main():
        ask = _ask(6)
        required = await _collect(engine, ask, SamplingParams(max_tokens=96, seed=5), tools=TOOLS, tool_choice="required")
        named = await _collect(engine, ask, SamplingParams(max_tokens=96, seed=5), tools=TOOLS,
                               tool_choice={"type": "function", "function": {"name": "grep_search"}})
        none = await _collect(engine, ask, SamplingParams(max_tokens=16, seed=5), tools=TOOLS, tool_choice="none")
        answer = await _collect(engine, ask, SamplingParams(max_tokens=48, seed=5), response_format={
            "type": "json_schema", "json_schema": {"name": "n", "schema": {
                "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}})
        return required[-1], named[-1], none[-1], answer[-1]

    required, named, none, answer = asyncio.run(main())
    assert required.finish_reason == "tool_calls" and required.ok and required.tool_calls
    assert all(c.parsed is not None and c.error is None for c in required.tool_calls)
    assert [c.name for c in named.tool_calls] == ["grep_search"] and named.call.name == "grep_search"
    assert none.tool_calls == [] and none.finish_reason in ("stop", "length") and none.content == none.text
    assert answer.ok and isinstance(answer.content, str) and "n" in __import__("json").loads(answer.content)
    stats = engine.stats()
    assert stats["free_blocks"] == stats["num_blocks"]
    assert engine.num_grammar_lookups >= 4 and engine.num_compiles <= engine.num_grammar_lookups


def test_mode_parameter_errors(engine):
    async def main():
        with pytest.raises(RequestError, match="Invalid tool_choice at row 0: tool 'nope' is not in tools"):
            await _collect(engine, _ask(7), SamplingParams(max_tokens=64), tools=TOOLS,
                           tool_choice={"type": "function", "function": {"name": "nope"}})
        with pytest.raises(RequestError, match="need constrained=True"):
            await _collect(engine, _ask(7), SamplingParams(max_tokens=64), tools=TOOLS, tool_choice="auto",
                           constrained=False)

    asyncio.run(main())
