"""Keys no JSON Schema draft defines are annotations everywhere the grammar reads a schema
(grammars/schema/keywords.py): beside `not`, inside an `if`, beside `not: {required}` and in
`propertyNames`, a vendor key such as `x-ui` no longer leaves the keyword relaxed."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from surecall.grammars.schema.keywords import is_undefined
from surecall.grammars.schema.to_regex import expand_marks, schema_to_regex

CASES = [  # (schema, valid instances, invalid instances)
    ({"type": "string", "not": {"const": "a", "x-note": "no"}}, ["b", ""], ["a"]),
    ({"type": "object", "properties": {"k": {"enum": ["a", "b"]}, "v": {}}, "required": ["k"],
      "allOf": [{"if": {"properties": {"k": {"const": "a", "x-ui": 1}}, "x-ui": 2},
                 "then": {"properties": {"v": {"type": "integer"}}}, "x-ui": 3}]},
     [{"k": "a", "v": 1}, {"k": "b", "v": "s"}, {"k": "a"}], [{"k": "a", "v": "s"}]),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
      "not": {"required": ["a", "b"], "x-why": "exclusive"}},
     [{"a": 1}, {"b": 2}, {}], [{"a": 1, "b": 2}]),
    ({"type": "object", "additionalProperties": {"type": "integer"},
      "propertyNames": {"pattern": "^[a-z]+$", "x-doc": 1}},
     [{"ab": 1}, {}], [{"Ab": 1}, {"a1": 2}]),
]


@pytest.mark.parametrize("schema, valid, invalid", CASES)
def test_undefined_keys_leave_nothing_relaxed(schema, valid, invalid):
    result = schema_to_regex(schema)
    assert result.relaxed == []
    grammar = re.compile(expand_marks(result.regex), re.DOTALL)
    validator = jsonschema.Draft202012Validator(schema)
    for instance in valid:
        assert validator.is_valid(instance)
        assert grammar.fullmatch(json.dumps(instance)), instance
    for instance in invalid:
        assert not validator.is_valid(instance)
        assert not grammar.fullmatch(json.dumps(instance)), instance


def test_only_keys_no_draft_defines_are_undefined():
    assert is_undefined("x-ui") and is_undefined("ddd") and is_undefined("markdownEnumDescriptions")
    for key in ("title", "dependentRequired", "unevaluatedProperties", "contentSchema", "nullable"):
        assert not is_undefined(key)
    assert not is_undefined("$surecall:not_in")  # the converter's own keys assert


def test_a_users_keys_under_the_converters_prefix_are_annotations():
    # `$surecall:not_in` is the converter's own mark (values excluded); written by a user it asserts nothing
    for schema in ({"type": "string", "$surecall:not_in": ["a"]},
                   {"allOf": [{"$ref": "#/ddd/s"}], "ddd": {"s": {"type": "string", "$surecall:not_in": ["a"]}}}):
        grammar = re.compile(expand_marks(schema_to_regex(schema).regex))
        assert grammar.fullmatch('"a"') and grammar.fullmatch('"b"')
    # as a property name and inside JSON data it is kept as written
    named = {"type": "object", "properties": {"$surecall:not_in": {"type": "integer"}},
             "required": ["$surecall:not_in"], "additionalProperties": False}
    grammar = re.compile(expand_marks(schema_to_regex(named).regex))
    assert grammar.fullmatch('{"$surecall:not_in": 1}') and not grammar.fullmatch("{}")
    literal = {"enum": [{"$surecall:not_in": [1]}]}
    assert re.compile(expand_marks(schema_to_regex(literal).regex)).fullmatch('{"$surecall:not_in": [1]}')
