"""What `LLM.generate` hands back, and the tool shapes it takes, on the shipped surecall-tiny model.

Results: `ok`, `prompt_token_ids`, per-row `timings` next to the shared `batch_timings`, and
`finish_reason="stop"` for a complete valid call even when the budget left no room for a stop
token. Tools: a pydantic class, a raw JSON Schema, a bare `Tool`, an MCP tool and an OpenAI
function, for the batch or per row, and a clear error for anything else. No shared data needed.
"""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

from surecall.config import SamplingParams
from surecall.core.prompts import render_prompt
from surecall.errors import ToolDefinitionError
from surecall.tools import Tool
from surecall.tools.catalog import hardened_seed_tools as seed_tools

ASK = [{"role": "user", "content": "Show me the file src/main.py"}]
PATH_SCHEMA = {"type": "object", "properties": {"path": {"type": "string", "maxLength": 40}},
               "required": ["path"], "additionalProperties": False}
GREEDY = SamplingParams(temperature=0, max_tokens=80)


@pytest.fixture(scope="module")
def llm():
    from surecall.llm import LLM

    return LLM()


class FileView(BaseModel):
    """Show a file."""

    path: str = Field(max_length=40)


# --- results ---------------------------------------------------------------------------------
def test_complete_call_at_a_tight_budget_is_a_stop(llm):
    tools = seed_tools()[:1]
    need = llm.min_tokens(tools)  # the shortest call, no room for a stop token after it
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=need + 2) for s in range(3)]
    for r in llm.generate([ASK] * 3, tools=tools, sampling=params):
        assert r.ok and r.error is None and r.call.name == tools[0]["name"]
        assert r.finish_reason == "stop", r.text


def test_rows_carry_their_own_prompt_and_timings(llm):
    params = [SamplingParams(temperature=0, max_tokens=4), SamplingParams(temperature=0, max_tokens=200)]
    short, full = llm.generate([ASK, ASK + [{"role": "user", "content": "Please."}]], tools=seed_tools(),
                               sampling=params, constrained=False)
    assert short.prompt_token_ids == render_prompt(ASK, llm.tokenizer, seed_tools(), 0)
    assert len(full.prompt_token_ids) > len(short.prompt_token_ids)
    # the cut-off row: 4 steps, "length", not ok; the full one wrote a valid call and stopped
    assert (short.timings["num_steps"], short.timings["num_tokens"], short.finish_reason, short.ok) == (4, 4, "length", False)
    assert full.ok and full.finish_reason == "stop" and full.timings["num_steps"] == full.num_tokens > 4
    assert 0 < short.timings["finish_s"] < full.timings["finish_s"]
    # one batch: the same batch dict, whose steps cover the longest row
    assert short.batch_timings is full.batch_timings
    batch = full.batch_timings
    assert batch["num_rows"] == 2 and batch["num_steps"] >= full.timings["num_steps"]
    assert 0 < batch["num_decode_steps"] < batch["num_steps"] and batch["step_mode"] == "paged"
    assert {"prefill_s", "decode_s", "sample_s", "advance_s", "compile_s", "step_mode"} <= set(batch)
    assert "mask_s" not in batch and batch["advance_s"] == 0.0  # free rows advance no grammar


def test_a_rows_request_error_has_no_timings_but_its_prompt(llm):
    tools = seed_tools()
    good, bad = llm.generate([ASK, ASK], tools=tools,
                             sampling=[SamplingParams(max_tokens=80, seed=1), SamplingParams(max_tokens=3)])
    assert good.ok and not bad.ok and bad.finish_reason == "error" and bad.error_kind == "request"
    assert bad.prompt_token_ids == good.prompt_token_ids and bad.timings == {}


# --- tool shapes -----------------------------------------------------------------------------
MCP_TOOL = {"name": "file_view", "description": "Show a file.", "inputSchema": PATH_SCHEMA,
            "annotations": {"readOnlyHint": True}}
OPENAI_TOOL = {"type": "function", "function": {"name": "file_view", "description": "Show a file.",
                                                "parameters": PATH_SCHEMA}}


@pytest.mark.parametrize("tools, name", [
    (FileView, "file_view"),  # a pydantic class, alone
    ([FileView], "file_view"),
    ({"title": "Open File", **PATH_SCHEMA}, "Open_File"),  # a raw JSON Schema, named by its title
    ([PATH_SCHEMA], "tool"),  # untitled: "tool"
    (Tool.from_schema("file_view", PATH_SCHEMA), "file_view"),  # a bare Tool
    ([MCP_TOOL], "file_view"),
    (OPENAI_TOOL, "file_view"),
    ([{"name": "file_view", "parameters": PATH_SCHEMA}], "file_view"),
])
def test_every_tool_shape_constrains_the_call(llm, tools, name):
    [r] = llm.generate(ASK, tools=tools, sampling=GREEDY)
    assert r.ok and r.call.name == name and isinstance(r.call.arguments["path"], str), r.text
    assert len(r.call.arguments["path"]) <= 40


def test_per_row_tools_mix_shapes(llm):
    per_row = [[FileView], [MCP_TOOL], [OPENAI_TOOL, {"title": "other", **PATH_SCHEMA}]]
    results = llm.generate([ASK] * 3, tools=per_row, sampling=GREEDY)
    assert [r.ok for r in results] == [True] * 3
    assert results[2].call.name in {"file_view", "other"}


def test_shapes_are_the_same_tool(llm):
    """Equivalent shapes compile to one grammar (one cache entry)."""
    before = len(llm._tables)
    llm.compile([MCP_TOOL])
    llm.compile(OPENAI_TOOL)
    llm.compile(Tool.from_schema("file_view", PATH_SCHEMA, description="Show a file."))
    assert len(llm._tables) - before <= 1


@pytest.mark.parametrize("tools, message", [
    ([42], r"Invalid tool 0 in tools of row 0: expected a Tool, a pydantic model class, a JSON Schema .* got int"),
    ([FileView(path="a")], r"got an instance of FileView \(pass the class\)"),
    ([{"description": "no schema here"}], r"got a dict with keys \['description'\]"),
    ([PATH_SCHEMA, PATH_SCHEMA], r"tool name 'tool' appears more than once .*'title'"),
    ([{"type": "string"}], r"Invalid input schema of tool 'tool': expected type 'object'"),
])
def test_bad_tool_shapes_are_refused_clearly(llm, tools, message):
    with pytest.raises(ToolDefinitionError, match=message):
        llm.generate(ASK, tools=tools, sampling=GREEDY)


def test_per_row_tools_need_a_list_per_row(llm):
    with pytest.raises(ToolDefinitionError, match=r"per-row tools: give every row a list of tools, or None"):
        llm.generate([ASK] * 3, tools=[[FileView], [MCP_TOOL], OPENAI_TOOL], sampling=GREEDY)


def test_one_rows_bad_tools_leave_the_others(llm):
    good, bad = llm.generate([ASK, ASK], tools=[[FileView], [42]], sampling=GREEDY)
    assert good.ok
    assert bad.finish_reason == "error" and bad.error_kind == "request"
    assert bad.error.startswith("Invalid tool 0 in tools of row 1: expected a Tool")


def test_text_stream_decodes_only_new_ids_and_ends_as_the_whole_text(llm):
    ids = llm.count_tokens("café € ok") + [0xFFFF % llm.vocab.vocab_size]
    stream = llm.text_stream()
    texts = [stream.feed(ids[: n + 1]) for n in range(len(ids))]
    for a, b in zip(texts, texts[1:]):
        assert b.startswith(a)  # the text only grows: a split character waits for its last byte
    assert "\ufffd" not in texts[-2]
    assert stream.feed(ids, final=True) == llm._text(ids)
    lone = llm.text_stream()  # a character cut off by the end is flushed as a replacement, as _text does
    assert lone.feed(ids[:3]) == llm._text(ids[:2]) and lone.feed(ids[:3], final=True) == llm._text(ids[:3])
