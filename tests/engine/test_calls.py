"""check_call on hostile model output: deep nesting, duplicate names (I-JSON), NaN, and the happy path."""

from __future__ import annotations

import pytest

from surecall.errors import MalformedCall
from surecall.grammars.strict_json import MAX_JSON_DEPTH, loads_strict
from surecall.tools.calls import check_call

TOOLS = [{"name": "get", "parameters": {"type": "object", "properties": {"q": {}}, "additionalProperties": False}},
         {"name": "rm", "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}]


def test_a_valid_call_passes():
    check = check_call('{"name": "get", "arguments": {"q": [1, {"a": "[{"}]}}', "json", TOOLS)
    assert check.error is None and check.call.name == "get" and check.call.arguments == {"q": [1, {"a": "[{"}]}


@pytest.mark.parametrize("text", [
    "[" * 100_000,
    '{"name": "get", "arguments": {"q": ' + "[" * 100_000 + "]" * 100_000 + "}}",
    '{"name": "get", "arguments": {"q": ' + '{"a":' * 50_000 + "1" + "}" * 50_000 + "}}",
])
def test_deep_nesting_is_malformed_not_a_recursion_error(text):
    check = check_call(text, "json", TOOLS)
    assert check.error_kind == "malformed" and f"nested deeper than {MAX_JSON_DEPTH} levels" in check.error


@pytest.mark.parametrize("text,name", [
    ('{"name": "get", "name": "rm", "arguments": {}}', "name"),
    ('{"name": "get", "arguments": {"q": 1, "q": 2}}', "q"),
    ('{"name": "get", "arguments": {"q": [{"k": 1, "k": 1}]}}', "k"),
])
def test_duplicate_names_at_any_level_are_malformed(text, name):
    check = check_call(text, "json", TOOLS)
    assert check.error_kind == "malformed" and check.call is None
    assert f"duplicate object name {name!r}" in check.error and "I-JSON" in check.error


def test_hermes_and_mistral_envelopes_are_strict_too():
    hermes = check_call('<tool_call>\n{"name": "rm", "name": "get", "arguments": {}}\n</tool_call>', "hermes", TOOLS)
    assert hermes.error_kind == "malformed" and "duplicate object name 'name'" in hermes.error
    mistral = check_call('[TOOL_CALLS][{"name": "get", "arguments": {"q": NaN}}]', "mistral", TOOLS)
    assert mistral.error_kind == "malformed" and "NaN is not JSON" in mistral.error


def test_loads_strict_errors_are_typed():
    with pytest.raises(MalformedCall, match=r"duplicate object name 'a'"):
        loads_strict('{"a": 1, "a": 1}')
    with pytest.raises(MalformedCall, match="nested deeper than 2 levels"):
        loads_strict("[[[]]]", max_depth=2)
    with pytest.raises(MalformedCall, match=r"Infinity is not JSON"):
        loads_strict("[-Infinity]")
    with pytest.raises(MalformedCall, match=r"not valid JSON: Expecting value at char 1"):
        loads_strict("[")
    assert loads_strict('["]]]]", "\\"[[["]', max_depth=1) == ["]]]]", '"[[[']  # brackets in strings do not count
