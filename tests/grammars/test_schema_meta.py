"""The shared metaschema check (grammars/schema/meta.py): Annex B patterns, deepest causes."""

from __future__ import annotations

import json
import re

import pytest

from surecall.dispatch.validate import make_validator
from surecall.errors import SchemaError
from surecall.grammars.options import GrammarOptions
from surecall.grammars.schema.meta import annex_b_escaped, checked_schema
from surecall.grammars.schema.to_regex import expand_marks, schema_to_regex
from surecall.tools.lint import lint_schema

DRAFTS = ["http://json-schema.org/draft-04/schema#", "http://json-schema.org/draft-07/schema#",
          "https://json-schema.org/draft/2020-12/schema"]


def grammar_accepts(schema, value) -> bool:
    options = GrammarOptions()
    regex = expand_marks(schema_to_regex(schema, options).regex, options.whitespace_regex())
    return re.fullmatch(regex, json.dumps(value, separators=(",", ":"))) is not None


@pytest.mark.parametrize("pattern, escaped", [
    ("a}", "a\\}"), ("x{", "x\\{"), ("x{2,", "x\\{2,"), ("]", "\\]"), ("^{{.+}}$", "^\\{\\{.+\\}\\}$"),
    ("x{,2}", "x\\{,2\\}"),  # Annex B: no digits before the comma, so text
    ("\\d{24}", "\\d{24}"), ("a{2}b{3,}c{4,5}", "a{2}b{3,}c{4,5}"),  # quantifiers stay
    ("[{}]]", "[{}]\\]"), ("\\}\\{", "\\}\\{"), ("[\\]}]", "[\\]}]"),  # escapes and classes stay
])
def test_annex_b_literals_are_escaped_and_nothing_else(pattern, escaped):
    assert annex_b_escaped(pattern) == escaped


@pytest.mark.parametrize("draft", DRAFTS)
def test_a_template_pattern_compiles_and_validates_alike(draft):
    """`{{name}}` templates (JavaScript-written schemas): jsonschema-rs alone refuses the pattern."""
    schema = {"$schema": draft, "type": "object", "required": ["t"],
              "properties": {"t": {"type": "string", "pattern": "^{{[a-z]+}}$"}}}
    assert schema_to_regex(schema, GrammarOptions()).relaxed == []
    validator = make_validator(schema)
    for value, ok in [({"t": "{{abc}}"}, True), ({"t": "{abc}"}, False), ({"t": "{{ABC}}"}, False)]:
        assert grammar_accepts(schema, value) is ok and validator.is_valid(value) is ok
    assert not [f for f in lint_schema(schema) if f.rule == "R0"]


def test_an_ambiguous_bound_is_relaxed_by_the_grammar_and_read_as_text_by_the_validator():
    """`{,2}`: text to ECMA-262 (jsonschema-rs, which needs it escaped to compile it), `{0,2}` to
    Python's re: no string satisfies both readings of `^x{,2}$`, so the grammar leaves it to the
    validator (listed), which reads it as ECMA-262 does."""
    schema = {"$schema": DRAFTS[1], "type": "string", "pattern": "^x{,2}$"}
    assert schema_to_regex(schema, GrammarOptions()).relaxed == [("", "pattern")]
    validator = make_validator(schema)
    assert validator.is_valid("x{,2}") and not validator.is_valid("xx") and not validator.is_valid("")


def test_pattern_property_keys_are_escaped_in_the_checked_schema_only():
    schema = {"type": "object", "patternProperties": {"^x}$": {"type": "integer"}},
              "properties": {"c": {"const": {"pattern": "a}"}}}}
    checked = checked_schema(schema)
    assert list(checked["patternProperties"]) == ["^x\\}$"]
    assert checked["properties"]["c"] == {"const": {"pattern": "a}"}}  # data, not a pattern
    assert list(schema["patternProperties"]) == ["^x}$"]  # the caller's schema is not changed
    validator = make_validator(schema)
    assert validator.is_valid({"x}": 1}) and not validator.is_valid({"x}": "s"})
    assert validator.is_valid({"c": {"pattern": "a}"}}) and not validator.is_valid({"c": {"pattern": "a\\}"}})


def test_a_schema_without_such_patterns_comes_back_as_it_is():
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^[a-z]{2}$"}}}
    assert checked_schema(schema) is schema


@pytest.mark.parametrize("draft", DRAFTS)
def test_an_unreadable_pattern_is_one_error_at_its_place_everywhere(draft):
    schema = {"$schema": draft, "type": "object", "properties": {"a~/b": {"type": "string", "pattern": "x(y"}}}
    for where in (lambda: schema_to_regex(schema), lambda: make_validator(schema)):
        with pytest.raises(SchemaError, match="unbalanced parenthesis") as info:
            where()
        assert info.value.pointer == "/properties/a~0~1b/pattern" and info.value.keyword == "pattern"
        assert "\n" not in str(info.value)
    [finding] = lint_schema(schema)
    assert (finding.rule, finding.pointer) == ("R0", "/properties/a~0~1b/pattern")


def test_a_tool_catalog_names_the_tool_and_the_place_once():
    from surecall.grammars.formats import get_format, tool_branches

    named = [("ok", {"type": "object"}), ("x", {"type": "object", "properties": {"a": {"type": "string", "pattern": "(u"}}})]
    with pytest.raises(SchemaError) as info:
        tool_branches(named, get_format("json"), GrammarOptions())
    message = str(info.value)
    assert message.startswith("tool 'x': ") and info.value.pointer == "x#/properties/a/pattern"
    assert message.count("/properties/a/pattern") == 1 and message.count("(keyword 'pattern')") == 1, message


def test_the_deepest_cause_under_any_of_is_named_and_short():
    """Draft 4's `items` is a schema or an array of schemas (anyOf): the cause is deep inside it."""
    big = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 40} for i in range(200)}}
    schema = {"$schema": DRAFTS[0], "type": "array", "items": {"oneOf": [big, {"type": "strin"}]}}
    for where in (lambda: schema_to_regex(schema), lambda: make_validator(schema)):
        with pytest.raises(SchemaError, match="strin") as info:
            where()
        assert info.value.pointer == "/items/oneOf/1/type" and info.value.keyword == "type"
        assert len(str(info.value)) < 400 and "\n" not in str(info.value)


def test_a_wrong_bound_deep_in_a_pattern_branch_is_named():
    schema = {"$schema": DRAFTS[0], "type": "array", "items": {"type": "string", "minLength": -1}}
    with pytest.raises(SchemaError) as info:
        checked_schema(schema)
    assert info.value.pointer == "/items/minLength" and "-1" in str(info.value)
