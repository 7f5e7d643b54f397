"""Tool formats: lookup, catalog regex (tagged union), render/parse round trips, typed errors."""

from __future__ import annotations

import json
import random
import re
from types import SimpleNamespace

import pytest

from surecall.errors import MalformedCall, SchemaError, ToolDefinitionError
from surecall.grammars.formats import FORMATS, catalog_regex, get_format, tool_schemas
from surecall.grammars.options import GrammarOptions
from surecall.grammars.schema.to_regex import expand_counts
from surecall.tools.catalog import hardened_seed_tools as seed_tools

ALL_FORMATS = ["json", "hermes", "qwen2", "llama3", "mistral"]


def test_get_format_names_and_aliases():
    assert get_format("qwen2") is FORMATS["hermes"]
    assert get_format("llama3").args_key == "parameters"
    assert get_format("mistral").control_prefix == "[TOOL_CALLS]"
    with pytest.raises(ValueError, match=r"Invalid tool format: expected one of .*'hermes'.*got 'gpt'"):
        get_format("gpt")


def test_tool_schemas_accepts_every_tool_shape():
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    tools = [
        {"name": "a", "parameters": schema},
        {"name": "b", "inputSchema": schema},
        {"type": "function", "function": {"name": "c", "parameters": schema}},
        SimpleNamespace(name="d", input_schema=schema),
        {"name": "e"},
    ]
    names = [name for name, _ in tool_schemas(tools)]
    assert names == ["a", "b", "c", "d", "e"]
    assert tool_schemas(tools)[4][1] == {"type": "object", "properties": {}, "additionalProperties": False}


@pytest.mark.parametrize(
    "tools, match",
    [
        ([], "at least one tool"),
        ([{"name": "a"}, {"name": "a"}], "duplicate tool name 'a'"),
        ([{"parameters": {}}], "'name' must be a non-empty string"),
        ([42], "expected a tool definition \\(object\\), got int"),
    ],
)
def test_tool_schemas_errors(tools, match):
    with pytest.raises(ToolDefinitionError, match=match):
        tool_schemas(tools)


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_render_is_accepted_and_parses_back(fmt):
    tools = seed_tools()
    result = catalog_regex(tools, fmt)
    tool_format = get_format(fmt)
    calls = [
        ("bash_execute", {"timeout_ms": 2000, "command": 'echo "hi"\nls'}),
        ("file_view", {"path": "src/a.py", "limit": 500}),
        ("file_edit", {"path": "a", "old_str": "x", "new_str": "", "allow_multiple": True}),
        ("grep_search", {"pattern": "def \\w+", "glob": "*.py"}),
    ]
    schemas = {t["name"]: t["parameters"] for t in tools}
    for name, args in calls:
        text = tool_format.render(name, args, schemas[name])
        assert re.fullmatch(expand_counts(result.regex), text), text
        assert tool_format.parse(text) == (name, args)


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_catalog_regex_is_a_tagged_union(fmt):
    regex = expand_counts(catalog_regex(seed_tools(), fmt).regex)
    tool_format = get_format(fmt)
    # the arguments of one tool under the name of another are rejected
    assert not re.fullmatch(regex, tool_format.render("file_view", {"command": "ls"}))
    assert not re.fullmatch(regex, tool_format.render("rm_rf", {"command": "ls"}))
    assert not re.fullmatch(regex, tool_format.render("bash_execute", {"command": "ls", "timeout_ms": 1}))


def test_catalog_relaxed_pointers_are_prefixed_with_the_tool_name():
    assert catalog_regex(seed_tools(), "json").relaxed == []  # every length bound counted
    relaxed = catalog_regex(seed_tools(), "json", GrammarOptions(counted_lengths=False)).relaxed
    assert ("bash_execute#/properties/command", "maxLength") in relaxed
    assert ("grep_search#/properties/pattern", "maxLength") in relaxed
    assert not any(key in ("minimum", "maximum", "minLength") for _, key in relaxed)


def test_catalog_schema_errors_name_the_tool():
    tools = [{"name": "ok", "parameters": {"type": "object"}},
             {"name": "broken", "parameters": {"type": "object", "properties": {"a": {"type": "strng"}}}}]
    with pytest.raises(SchemaError, match="tool 'broken'") as info:
        catalog_regex(tools)
    assert info.value.pointer == "broken#/properties/a/type"


def test_mistral_control_token_is_outside_the_grammar():
    mistral = get_format("mistral")
    text = mistral.render("file_view", {"path": "a"})
    assert not text.startswith("[TOOL_CALLS]")
    assert mistral.parse("[TOOL_CALLS]" + text) == ("file_view", {"path": "a"})


def test_hermes_envelope_is_exact():
    regex = expand_counts(catalog_regex(seed_tools(), "hermes").regex)
    call = '{"name": "file_view", "arguments": {"path": "a"}}'
    assert re.fullmatch(regex, f"<tool_call>\n{call}\n</tool_call>")
    assert not re.fullmatch(regex, call)
    assert not re.fullmatch(regex, f"<tool_call>{call}</tool_call>")


def test_render_follows_whitespace_options():
    compact = GrammarOptions(whitespace="none")
    text = get_format("json").render("file_view", {"path": "a"}, options=compact)
    assert text == '{"name":"file_view","arguments":{"path":"a"}}'
    assert re.fullmatch(expand_counts(catalog_regex(seed_tools(), "json", compact).regex), text)


@pytest.mark.parametrize(
    "fmt, text, match",
    [
        ("json", '{"name": "a", "arguments": {', "not valid JSON"),
        ("json", '["a"]', "must be a JSON object"),
        ("json", '{"name": "a"}', "exactly the keys"),
        ("json", '{"name": 3, "arguments": {}}', "'name' must be a string"),
        ("json", '{"name": "a", "arguments": []}', "'arguments' must be an object"),
        ("llama3", '{"name": "a", "arguments": {}}', r"exactly the keys \['name', 'parameters'\]"),
        ("hermes", '{"name": "a", "arguments": {}}', "must start with '<tool_call>'"),
        ("hermes", '<tool_call>\n{"name": "a", "arguments": {}}', "must end with '</tool_call>'"),
        ("mistral", '{"name": "a", "arguments": {}}', "JSON list holding one call"),
    ],
)
def test_parse_errors_say_why(fmt, text, match):
    with pytest.raises(MalformedCall, match=match):
        get_format(fmt).parse(text)


def test_shared_tool_catalogs_compile(data_dir):
    """Most real tool definitions compile; the ones that do not fail with a typed error."""
    from outlines_core import Index, Vocabulary

    vocab = Vocabulary(300, {chr(b): [b] for b in range(32, 127)} | {"\n": [10]})
    for name in ("bfcl_tools.jsonl", "github_mcp_tools.jsonl"):
        path = data_dir / "tools" / name
        records = [json.loads(line) for line in path.read_text().splitlines()]
        random.Random(0).shuffle(records)
        sample = records[:40]
        compiled = 0
        for record in sample:
            tool = {"name": record["name"], "parameters": record["parameters_json_schema"]}
            try:
                result = catalog_regex([tool], "hermes")
            except SchemaError:
                continue
            compiled += 1
        assert compiled >= 0.95 * len(sample), (name, compiled)
    catalog = [{"name": r["name"], "parameters": r["parameters_json_schema"]} for r in records[:8]]
    assert Index(catalog_regex(catalog, "hermes").regex, vocab).get_final_states()
    assert result.regex
