"""`surecall compile` gives a reason for every relaxed keyword, in text and in --json.

The compiler's own reason (`table.meta["relaxed_reasons"]`, keyed "pointer keyword") wins;
otherwise the command's generic reason for the keyword, otherwise a default line.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from surecall.cli import main
from surecall.commands.compile import DEFAULT_REASON, GENERIC_REASONS, relaxed_reasons

UNIQUE_TAGS = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"},
                                                         "uniqueItems": True, "maxItems": 3}},
               "required": ["tags"], "additionalProperties": False}


def test_compiler_reason_wins_then_generic_then_default():
    table = SimpleNamespace(relaxed=[("/a", "uniqueItems"), ("", "oneOf"), ("/b", "x-unknown")],
                            meta={"relaxed_reasons": {"/a uniqueItems": "the compiler's own words"}})
    got = relaxed_reasons(table)
    assert got == [{"pointer": "/a", "keyword": "uniqueItems", "reason": "the compiler's own words"},
                   {"pointer": "/", "keyword": "oneOf", "reason": GENERIC_REASONS["oneOf"]},
                   {"pointer": "/b", "keyword": "x-unknown", "reason": DEFAULT_REASON}]
    assert relaxed_reasons(SimpleNamespace(relaxed=[], meta={})) == []


def test_compiler_reasons_as_a_list_parallel_to_relaxed():
    """The compiler's own form: one reason per relaxed pair, "" where it gave none."""
    table = SimpleNamespace(relaxed=[("/a", "maxItems"), ("/b", "uniqueItems")],
                            meta={"relaxed_reasons": ["its items hold a counted array", ""]})
    assert [r["reason"] for r in relaxed_reasons(table)] == ["its items hold a counted array",
                                                           GENERIC_REASONS["uniqueItems"]]


@pytest.fixture
def unique_schema(tmp_path, monkeypatch, data_dir):
    monkeypatch.setenv("SURECALL_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(UNIQUE_TAGS))
    return path


def test_compile_prints_the_reason_for_each_relaxed_keyword(unique_schema, capsys):
    assert main(["compile", str(unique_schema), "--tokenizer", "shared:gpt2"]) == 0
    out = capsys.readouterr().out
    assert "uniqueItems at /properties/tags: a finite automaton cannot remember which items were already written" in out


def test_compile_json_lists_reasons(unique_schema, capsys):
    assert main(["compile", str(unique_schema), "--tokenizer", "shared:gpt2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["relaxed"] == [["/properties/tags", "uniqueItems"]]
    [entry] = report["relaxed_reasons"]
    assert entry["pointer"] == "/properties/tags" and entry["keyword"] == "uniqueItems"
    assert entry["reason"]  # the compiler's own reason, else the generic one


NOT_SEVENS = {"type": "object", "properties": {"n": {"type": "integer", "not": {"multipleOf": 7}},
                                               "m": {"type": "integer", "multipleOf": 5}}, "required": ["n", "m"]}


def test_compile_lists_where_the_grammar_is_stricter_than_the_schema(tmp_path, monkeypatch, data_dir, capsys):
    """An integer `not: {multipleOf: 7}` has no short regex: only listed integers are written, and
    `surecall compile` says so (text and --json); the exact multipleOf 5 beside it is not listed."""
    monkeypatch.setenv("SURECALL_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(NOT_SEVENS))
    assert main(["compile", str(path), "--tokenizer", "shared:gpt2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    [entry] = report["narrowed"]
    assert (entry["pointer"], entry["keyword"]) == ("/properties/n", "not")
    assert "integers nearest zero" in entry["reason"]
    assert main(["compile", str(path), "--tokenizer", "shared:gpt2"]) == 0
    out = capsys.readouterr().out
    assert "narrowed (stricter than the schema" in out and "not at /properties/n: " in out


def test_compile_lists_nothing_narrowed_for_an_exact_grammar(unique_schema, capsys):
    assert main(["compile", str(unique_schema), "--tokenizer", "shared:gpt2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["narrowed"] == []


def test_a_catalog_lists_each_tools_narrowing(tmp_path, monkeypatch, data_dir, capsys):
    """In a tool catalog the narrowed pointer names the tool, as relaxed ones do."""
    monkeypatch.setenv("SURECALL_CACHE_DIR", str(tmp_path / "cache"))
    tools = [{"name": "pick", "description": "pick a number", "parameters": NOT_SEVENS},
             {"name": "echo", "description": "echo", "parameters": {"type": "object", "properties": {
                 "text": {"type": "string", "maxLength": 20}}, "required": ["text"]}}]
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(tools))
    assert main(["compile", str(path), "--tokenizer", "shared:gpt2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [(e["pointer"], e["keyword"]) for e in report["narrowed"]] == [("pick#/properties/n", "not")]


def test_compile_lists_each_free_form_value_with_its_depth_cap(tmp_path, monkeypatch, data_dir, capsys):
    """A free-form value (`{}`, `true`, the members of a bare `{"type": "object"}`) nests at most
    62 containers in the grammar (the bracket stack's depth), though the schema allows any depth:
    listed as narrowed at its pointer, with the depth; a schema without one lists nothing (test above)."""
    monkeypatch.setenv("SURECALL_CACHE_DIR", str(tmp_path / "cache"))
    schema = {"type": "object", "properties": {"a": {"type": "string"}, "b": {}, "c": {"type": "object"}},
              "required": ["a"], "additionalProperties": False}
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    assert main(["compile", str(path), "--tokenizer", "shared:gpt2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [(e["pointer"], e["keyword"]) for e in report["narrowed"]] == [
        ("/properties/b", "max_any_depth"), ("/properties/c/additionalProperties", "max_any_depth")]
    assert all("at most 62 containers deep" in e["reason"] for e in report["narrowed"])  # the bracket stack
