"""Schema lint: each rule and anti-pattern fires where it should (with its pointer) and nowhere else."""

from __future__ import annotations

import json

import pydantic
import pytest

from surecall.cli import main
from surecall.tools.lint import RULES, count_by_rule, lint_schema

CLEAN = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "minLength": 1, "maxLength": 4096},
        "timeout_ms": {"type": "integer", "minimum": 1, "maximum": 60000, "default": 1000},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "maxItems": 4, "default": []},
        "mode": {"enum": ["r", "w"], "default": "r"},
    },
    "required": ["path"],
    "additionalProperties": False,
}


def _rules(schema, **kw):
    return [(f.rule, f.pointer) for f in lint_schema(schema, **kw)]


def _obj(props, required=None, **extra):
    return {"type": "object", "properties": props, "required": list(props) if required is None else required,
            "additionalProperties": False, **extra}


def test_clean_schema_has_no_findings():
    assert lint_schema(CLEAN) == []


def test_r1_closed_properties_nested_and_defs():
    schema = _obj({"a": {"$ref": "#/$defs/A"}, "b": {"type": "object", "properties": {"x": {"type": "boolean"}}, "required": ["x"]}})
    schema["$defs"] = {"A": {"type": "object", "properties": {"y": {"type": "boolean"}}, "required": ["y"]}}
    assert sorted(_rules(schema)) == [("R1", "/$defs/A"), ("R1", "/properties/b")]
    schema.pop("additionalProperties")
    assert ("R1", "") in _rules(schema)


def test_r2_required_complete():
    schema = _obj({"a": {"type": "boolean"}, "b": {"type": "boolean", "default": True}}, required=["a", "ghost"])
    schema["properties"]["c"] = {"type": "boolean"}
    findings = lint_schema(schema, tool_name="t")
    assert [(f.rule, f.pointer) for f in findings] == [("R2", ""), ("R2", "/properties/c")]
    assert "ghost" in findings[0].message and findings[1].tool == "t"
    assert "required" in findings[1].fix


def test_r3_bounds_and_ap2_unbounded_strings():
    schema = _obj({
        "n": {"type": "integer", "minimum": 0},
        "x": {"type": ["number", "null"], "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        "xs": {"type": "array", "items": {"type": "string"}},
        "m": {"type": "object", "additionalProperties": {"type": "boolean"}},
        "when": {"type": "string", "format": "date-time"},
        "k": {"const": "fixed"},
    })
    assert sorted(_rules(schema)) == [("AP2", "/properties/xs/items"), ("R3", "/properties/m"), ("R3", "/properties/n"), ("R3", "/properties/xs")]


def test_r4_and_ap4_units():
    schema = _obj({
        "timeout": {"type": "integer", "minimum": 1, "maximum": 9},
        "maxDelay": {"type": "number", "minimum": 1, "maximum": 9},
        "request_timeout_value": {"type": "integer", "minimum": 1, "maximum": 9},
        "timeoutMs": {"type": "integer", "minimum": 1, "maximum": 9},
        "size_bytes": {"type": "integer", "minimum": 1, "maximum": 9},
        "size": {"type": "string", "enum": ["s", "m"]},
        "count": {"type": "integer", "minimum": 1, "maximum": 9},
    })
    assert sorted(_rules(schema)) == [("AP4", "/properties/maxDelay"), ("AP4", "/properties/timeout"),
                                      ("R4", "/properties/request_timeout_value")]


def test_r5_and_ap3_unions():
    a = _obj({"kind": {"const": "a"}, "x": {"type": "boolean"}})
    b = _obj({"kind": {"const": "b"}, "y": {"type": "boolean"}})
    assert lint_schema(_obj({"u": {"oneOf": [a, b]}})) == []
    untagged = _obj({"u": {"anyOf": [_obj({"x": {"type": "boolean"}}), _obj({"y": {"type": "boolean"}})]}})
    assert _rules(untagged) == [("AP3", "/properties/u/anyOf")]
    partial = _obj({"u": {"oneOf": [a, _obj({"y": {"type": "boolean"}})]}})
    assert _rules(partial) == [("R5", "/properties/u/oneOf")]
    same = _obj({"u": {"oneOf": [a, _obj({"kind": {"const": "a"}})]}})
    assert _rules(same) == [("R5", "/properties/u/oneOf")]
    not_required = _obj({"u": {"oneOf": [a, _obj({"kind": {"const": "b"}}, required=[])]}})
    assert ("R5", "/properties/u/oneOf") in _rules(not_required)
    refs = _obj({"u": {"oneOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/B"}]}}, **{"$defs": {"A": a, "B": b}})
    assert lint_schema(refs) == []
    assert lint_schema(_obj({"s": {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "null"}]}})) == []


def test_ap1_untyped_argument_bag():
    schema = _obj({"opts": {"type": "object"}, "anything": {"description": "whatever"}, "xs": {"type": "array", "maxItems": 3}})
    assert sorted(_rules(schema)) == [("AP1", "/properties/anything"), ("AP1", "/properties/opts"), ("AP1", "/properties/xs")]
    assert _rules({"type": "object"}) == [("AP1", "")]
    assert _rules("not a schema") == [("AP1", "")]


def test_ap5_whole_file_rewrite():
    schema = _obj({"file_path": {"type": "string", "maxLength": 9}, "content": {"type": "string", "maxLength": 9}})
    findings = lint_schema(schema)
    assert [(f.rule, f.pointer) for f in findings] == [("AP5", "/properties/content")]
    assert "old_str" in findings[0].fix
    assert lint_schema(_obj({"content": {"type": "string", "maxLength": 9}})) == []


def test_pydantic_nested_models_are_checked():
    class Inner(pydantic.BaseModel):
        n: int

    class Outer(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        inner: Inner

    rules = _rules(Outer.model_json_schema())
    assert ("R1", "/$defs/Inner") in rules and ("R3", "/$defs/Inner/properties/n") in rules
    assert ("R1", "") not in rules


def test_pointer_escaping():
    schema = _obj({"a/b": {"type": "integer"}})
    assert _rules(schema) == [("R3", "/properties/a~1b")]


def test_counts_cover_every_rule():
    counts = count_by_rule(lint_schema({"type": "object"}))
    assert list(counts) == list(RULES) and counts["AP1"] == 1 and sum(counts.values()) == 1


# --- CLI --------------------------------------------------------------------------------------
def test_cli_json_and_exit_codes(tmp_path, capsys):
    clean, dirty = tmp_path / "clean.json", tmp_path / "tools.jsonl"
    clean.write_text(json.dumps(CLEAN))
    dirty.write_text("\n".join(json.dumps(t) for t in [
        {"name": "a", "parameters": {"type": "object", "properties": {"timeout": {"type": "integer"}}}},
        {"type": "function", "function": {"name": "b", "parameters": CLEAN}},
    ]))
    assert main(["lint", str(clean)]) == 0
    capsys.readouterr()
    assert main(["lint", "--json", str(dirty)]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["tools"] == 2 and out["counts"]["AP4"] == 1 and out["counts"]["R1"] == 1
    assert {f["tool"] for f in out["findings"]} == {"a"}
    assert {"rule", "slug", "pointer", "message", "fix", "file"} <= set(out["findings"][0])
    assert main(["lint", "--rules", "R1", str(dirty)]) == 1
    assert "R1 closed-properties at /" in capsys.readouterr().out


def test_cli_mcp_list_and_module_attr(tmp_path, capsys, monkeypatch):
    mcp = tmp_path / "mcp.json"
    mcp.write_text(json.dumps({"tools": [{"name": "m", "inputSchema": CLEAN, "annotations": {"readOnlyHint": True}}]}))
    assert main(["lint", str(mcp)]) == 0
    (tmp_path / "lintme_mod.py").write_text(
        "import pydantic\nclass Args(pydantic.BaseModel):\n    delay: int\nTOOLS = [Args]\n")
    monkeypatch.chdir(tmp_path)
    assert main(["lint", "lintme_mod:TOOLS"]) == 1
    assert "AP4 implicit-unit at /properties/delay" in capsys.readouterr().out
    assert main(["lint", "surecall.tools.catalog:seed_tools", "--summary"]) in (0, 1)


def test_cli_bad_input(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["lint", str(bad)]) == 2
    assert "not JSON or JSONL" in capsys.readouterr().err
    assert main(["lint", str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["lint", "no_such_module_xyz:attr"]) == 2
    assert main(["lint", "--rules", "R9", str(bad)]) == 2
    assert "unknown rule id" in capsys.readouterr().err


def test_shared_tools_lint(data_dir, capsys):
    path = data_dir / "tools" / "github_mcp_tools.jsonl"
    if not path.exists():
        pytest.skip(f"{path} not found")
    assert main(["lint", "--json", str(path)]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["tools"] == 78 and sum(out["counts"].values()) == len(out["findings"]) > 0


def test_metaschema_violation_is_r0(tmp_path, capsys):
    findings = lint_schema({"type": "object", "properties": {"a": {"type": "strin"}}}, "t")
    assert [(f.rule, f.pointer) for f in findings] == [("R0", "/properties/a/type")]
    assert "strin" in findings[0].message
    assert not [f for f in lint_schema({"type": "object", "properties": {}, "additionalProperties": False}) if f.rule == "R0"]


def test_files_without_tool_definitions_are_refused(tmp_path, capsys):
    rows = tmp_path / "bench.jsonl"
    rows.write_text('{"id": "x", "schema": {"type": "object"}}\n{"id": "y", "schema": {"type": "string"}}\n')
    assert main(["lint", str(rows)]) == 2
    assert "not a tool definition or a JSON Schema" in capsys.readouterr().err
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    assert main(["lint", str(empty)]) == 2
    assert "holds no tool definitions" in capsys.readouterr().err
    blank = tmp_path / "blank.json"
    blank.write_text("")
    assert main(["lint", str(blank)]) == 2
    assert "is empty" in capsys.readouterr().err
