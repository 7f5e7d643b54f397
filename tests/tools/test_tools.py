"""Tool definitions: every source gives one descriptor whose schema is the validating schema."""

from __future__ import annotations

import pydantic
import pytest

from surecall.dispatch.validate import validate_arguments
from surecall.errors import ArgumentValidationError, ToolDefinitionError
from surecall.tools import SideEffect, Tool


class Inner(pydantic.BaseModel):
    line: int = pydantic.Field(ge=1, le=10_000)


class EditArgs(pydantic.BaseModel):
    """Replace text in a file."""

    path: str = pydantic.Field(max_length=256)
    at: Inner


def test_from_pydantic_forbids_extra_everywhere():
    tool = Tool.from_pydantic(EditArgs, level="A2")
    assert tool.name == "edit_args" and tool.description == "Replace text in a file."
    assert tool.level is SideEffect.A2
    schema = tool.input_schema
    assert schema["additionalProperties"] is False
    assert schema["$defs"]["Inner"]["additionalProperties"] is False  # pydantic leaves nested models open
    validate_arguments(tool, {"path": "a.py", "at": {"line": 3}})
    with pytest.raises(ArgumentValidationError, match="Additional properties") as info:
        validate_arguments(tool, {"path": "a.py", "at": {"line": 3, "col": 1}})
    assert info.value.errors[0][0] == "/at"


def test_descriptor_is_the_validating_schema():
    schema = {"type": "object", "properties": {"q": {"type": "string", "maxLength": 5}}, "required": ["q"], "additionalProperties": False}
    tool = Tool.from_schema("search", schema, "Search.", level=SideEffect.A0)
    desc = tool.descriptor()
    assert desc == {"name": "search", "description": "Search.", "parameters": schema}
    assert desc["parameters"] is tool.input_schema and tool.input_schema is not schema  # copied once
    with pytest.raises(ArgumentValidationError, match="longer than 5"):
        validate_arguments(tool, {"q": "toolong"})
    assert Tool.from_openai(tool.to_openai(), level=0) == tool
    assert Tool.from_mcp(tool.to_mcp()).level is SideEffect.A0


@pytest.mark.parametrize("annotations,level", [
    (None, SideEffect.A3),
    ({}, SideEffect.A3),
    ({"readOnlyHint": True}, SideEffect.A0),
    ({"readOnlyHint": True, "destructiveHint": True}, SideEffect.A0),
    ({"destructiveHint": False, "idempotentHint": True}, SideEffect.A1),
    ({"destructiveHint": False}, SideEffect.A2),
    ({"destructiveHint": False, "idempotentHint": False}, SideEffect.A2),
    ({"destructiveHint": True, "idempotentHint": True}, SideEffect.A3),
    ({"idempotentHint": True}, SideEffect.A3),  # MCP: destructiveHint defaults to true
    ({"title": "x"}, SideEffect.A3),
])
def test_mcp_annotations_map_to_levels(annotations, level):
    tool = Tool.from_mcp({"name": "t", "inputSchema": {"type": "object"}, "annotations": annotations})
    assert tool.level is level


def test_mcp_shared_tools_load(data_dir):
    import json

    path = data_dir / "tools" / "github_mcp_tools.jsonl"
    if not path.exists():
        pytest.skip(f"{path} not found")
    tools = [Tool.from_mcp({**rec, "inputSchema": rec["parameters"]}) for rec in map(json.loads, path.read_text().splitlines())]
    levels = {t.level for t in tools}
    assert SideEffect.A0 in levels and len(tools) == 78
    assert all(t.level is SideEffect.A0 for t in tools if t.annotations.get("readOnlyHint"))


def test_openai_forms():
    inner = {"name": "f", "description": "d", "parameters": {"type": "object", "properties": {}}}
    assert Tool.from_openai({"type": "function", "function": inner}).name == "f"
    assert Tool.from_openai({"name": "g"}).input_schema["additionalProperties"] is False
    assert Tool.from_openai(inner).level is SideEffect.A3


def test_levels_policy():
    assert not SideEffect.A1.requires_idempotency_key
    assert SideEffect.A2.requires_idempotency_key and SideEffect.A3.requires_idempotency_key
    assert SideEffect.A3.requires_approval and not SideEffect.A2.requires_approval
    assert SideEffect.parse("a1") is SideEffect.A1 and SideEffect.parse(2) is SideEffect.A2


def test_bad_definitions():
    with pytest.raises(ToolDefinitionError, match="Invalid side-effect level"):
        Tool.from_schema("t", {"type": "object"}, level="A9")
    with pytest.raises(ToolDefinitionError, match="Invalid tool name"):
        Tool.from_schema("", {"type": "object"})
    with pytest.raises(ToolDefinitionError, match="expected type 'object' at /type"):
        Tool.from_schema("t", {"type": "string"})
    with pytest.raises(ToolDefinitionError, match="expected an 'inputSchema'"):
        Tool.from_mcp({"name": "t"})
    with pytest.raises(ToolDefinitionError, match=r"got a dict with keys \['parameters'\]"):
        Tool.from_openai({"parameters": {}})
    with pytest.raises(ToolDefinitionError, match="not JSON-serialisable"):
        Tool.from_schema("t", {"type": "object", "default": object()})
    with pytest.raises(ToolDefinitionError, match="expected a BaseModel subclass"):
        Tool.from_pydantic(int)
    with pytest.raises(ToolDefinitionError, match="expected a Tool, a pydantic model class, a JSON Schema object"):
        Tool.from_any(42)


def test_one_json_or_jsonl_reader_names_file_and_line(tmp_path):
    from surecall.commands.compile import load_target
    from surecall.commands.lint import load_tool_entries
    from surecall.errors import SchemaError
    from surecall.tools.loading import load_tool_dicts, read_json_records

    good = tmp_path / "tools.jsonl"
    good.write_text('{"name": "a", "parameters": {"type": "object"}}\n\n{"name": "b", "parameters": {"type": "object"}}\n')
    whole, records = read_json_records(good)
    assert not whole and [where for where, _ in records] == [f"{good}:1", f"{good}:3"]
    assert [t["name"] for t in load_tool_dicts(good)] == ["a", "b"]
    assert [where for where, _, _ in load_tool_entries(str(good))] == [f"{good}:1", f"{good}:3"]
    assert load_target(str(good))[0] == "tools"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"name": "a"}\n{"name": \n')
    with pytest.raises(ToolDefinitionError, match=r"bad.jsonl:2: invalid JSON line"):
        load_tool_dicts(bad)
    with pytest.raises(SchemaError, match=r"bad.jsonl:2: invalid JSON line"):
        load_target(str(bad))
    (tmp_path / "junk.json").write_text("not json at all")
    with pytest.raises(ToolDefinitionError, match=r"junk.json: not JSON or JSONL \(Expecting value at line 1\)"):
        load_tool_entries(str(tmp_path / "junk.json"))
