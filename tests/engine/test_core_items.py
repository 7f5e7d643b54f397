"""Counted arrays in the engine core: minItems/maxItems hold in sampled calls (kernels/items.py wired
into EngineCore's sample/advance step)."""

from __future__ import annotations

import pytest

from surecall.config import SamplingParams
from surecall.core import EngineCore


@pytest.fixture(scope="module")
def tiny():
    from surecall.llm import LLM

    return LLM()


@pytest.mark.parametrize("low, high", [(49, 60), (12, 12)])
def test_item_bounds_hold_in_sampled_calls_of_the_core(tiny, low, high):
    from surecall.core.prompts import render_prompt
    from surecall.tools.calls import check_call

    tool = {"name": "pick", "description": "Pick numbers.", "parameters": {
        "type": "object", "properties": {"n": {"type": "array", "items": {"type": "integer", "minimum": 0,
                                                                          "maximum": 9},
                                               "minItems": low, "maxItems": high}},
        "required": ["n"], "additionalProperties": False}}
    table = tiny.compile([tool])
    assert table.has_items and not table.relaxed and table.meta.get("counted_fallback") is None
    fmt = tiny._format(None)
    key = tiny._table_key(tiny._row_tools([tool], 0, {}), fmt)
    core = EngineCore(tiny.runner.model, pad_id=0, block_size=16, num_blocks=256)
    prompt = render_prompt([{"role": "user", "content": "pick numbers"}], tiny.tokenizer, [tool], 0)
    tight = int(table.dist[0])
    params = [SamplingParams(temperature=1.0, max_tokens=tight + (i % 3) * 20, seed=i) for i in range(6)]
    seqs = [core.add_request(f"p{i}", prompt, p, table=table, table_key=key) for i, p in enumerate(params)]
    core.run_to_completion()
    for seq in seqs:
        text = tiny._text(seq.payload.generated)
        check = check_call(text, fmt, [tool])
        assert check.error is None, (check.error, text, seq.payload.error)
        assert low <= len(check.call.arguments["n"]) <= high
        assert seq.payload.finish_reason == "stop", seq.payload.error


def test_item_bounds_hold_in_llm_generate(tiny):
    from surecall.tools.calls import check_call

    tool = {"name": "pick", "description": "Pick numbers.", "parameters": {
        "type": "object", "properties": {"n": {"type": "array", "items": {"type": "boolean"}, "minItems": 20,
                                               "maxItems": 25}},
        "required": ["n"], "additionalProperties": False}}
    table = tiny.compile([tool])
    params = [SamplingParams(temperature=1.0, max_tokens=int(table.dist[0]) + 10 * i, seed=i) for i in range(4)]
    out = tiny.generate([[{"role": "user", "content": "pick"}]] * 4, tools=[tool], sampling=params)
    for r in out:
        check = check_call(r.text, tiny._format(None), [tool])
        assert check.error is None, (check.error, r.text)
        assert 20 <= len(check.call.arguments["n"]) <= 25


def test_nested_item_bounds_hold_in_llm_generate(tiny):
    """An array of counted arrays: every level's bounds hold (a stack of item counters per row),
    also when max_tokens is the fewest tokens a call needs."""
    from surecall.tools.calls import check_call

    rows = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 10,
            "maxItems": 12}
    tool = {"name": "grid", "description": "A grid.", "parameters": {
        "type": "object", "properties": {"g": {"type": "array", "items": rows, "minItems": 9, "maxItems": 60}},
        "required": ["g"], "additionalProperties": False}}
    table = tiny.compile([tool])
    assert table.has_items and not table.relaxed and int(table.item_depth.max()) == 2
    params = [SamplingParams(temperature=1.0, max_tokens=int(table.dist[0]) + 10 * i, seed=i) for i in range(3)]
    out = tiny.generate([[{"role": "user", "content": "grid"}]] * 3, tools=[tool], sampling=params)
    for r in out:
        check = check_call(r.text, tiny._format(None), [tool])
        assert check.error is None, (check.error, r.text)
        grid = check.call.arguments["g"]
        assert 9 <= len(grid) <= 60 and all(10 <= len(row) <= 12 for row in grid)
