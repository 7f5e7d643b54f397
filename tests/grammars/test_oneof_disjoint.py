"""oneOf written as a plain alternation only where its branches are proven disjoint
(`Converter.disjoint` in schema/to_regex.py, ranges in schema/disjoint.py).

Each proven case is checked three ways: nothing relaxed; every candidate value the regex
accepts validates against the schema (jsonschema); every valid candidate is accepted. The
unproven cases must stay listed (or be written exactly by negation): a false proof would let a
value through that matches two branches.
"""

from __future__ import annotations

import re

import jsonschema
import pytest

from surecall.grammars.schema.disjoint import ranges_meet
from surecall.grammars.schema.render import grammar_dumps
from surecall.grammars.schema.to_regex import expand_marks, schema_to_regex

NUMBERS = [-2, -1, 0, 0.5, 1, 1.2, 1.3, 1.5, 2, 3, 5, 7]
OBJECTS = [{"kind": "a"}, {"kind": "b"}, {"x": "s"}, {"y": 1}, {"x": "s", "y": 1}, {"meta": {"kind": "a"}},
           {"meta": {"kind": "b"}}, {}]
PROVEN = {
    "literals": ({"type": "number", "oneOf": [{"const": 0}, {"const": 1}]}, NUMBERS),
    "literal_vs_type": ({"oneOf": [{"type": "string", "pattern": "^[0-9]+$"}, {"enum": [None]}]},
                        ["12", "x", None, 0]),
    "literal_fails_other_branch": ({"oneOf": [{"enum": [1, 2, 3]}, {"type": "integer", "minimum": 5}]}, NUMBERS),
    "types_through_any_of": ({"oneOf": [{"anyOf": [{"type": "null"}, {"type": "string", "enum": ["L", "R"]}]},
                                        {"type": "array", "items": {"type": "string"}}]},
                             [None, "L", "Q", ["L"], [], 1]),
    "integer_ranges": ({"oneOf": [{"type": "integer", "maximum": 0}, {"type": "integer", "minimum": 1}]}, NUMBERS),
    "exclusive_bound": ({"oneOf": [{"type": "number", "exclusiveMaximum": 1}, {"type": "number", "minimum": 1}]},
                        NUMBERS),
    "draft4_exclusive_bound": ({"$schema": "http://json-schema.org/draft-04/schema#",
                                "oneOf": [{"type": "number", "maximum": 1, "exclusiveMaximum": True},
                                          {"type": "number", "minimum": 1}]}, NUMBERS),
    "integers_between_fractional_bounds": ({"oneOf": [{"type": "integer", "exclusiveMaximum": 1.5},
                                                      {"type": "integer", "minimum": 1.2}]}, NUMBERS),
    "required_name_the_other_forbids": (
        {"oneOf": [{"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
                   {"type": "object", "properties": {"y": {"type": "integer"}}, "additionalProperties": False}]},
        [o for o in OBJECTS if o != {"x": "s", "y": 1}]),  # valid, but objects are closed by default
    "non_empty_arrays_of_disjoint_items": (
        {"oneOf": [{"type": "array", "items": {"type": "number"}, "minItems": 1},
                   {"type": "array", "items": {"type": "string"}, "minItems": 1}]},
        [[], [1], ["a"], [1, "a"], ["a", "b"], "x"]),
    "nested_discriminator": (
        {"oneOf": [{"type": "object", "required": ["meta"], "properties": {"meta": {
            "type": "object", "required": ["kind"], "properties": {"kind": {"const": "a"}}}}},
                   {"type": "object", "required": ["meta"], "properties": {"meta": {
                       "type": "object", "required": ["kind"], "properties": {"kind": {"enum": ["b", "c"]}}}}}]},
        OBJECTS),
}


def _accepts(schema, value) -> bool:
    return re.fullmatch(expand_marks(schema_to_regex(schema).regex), grammar_dumps(value, schema)) is not None


@pytest.mark.parametrize("name", sorted(PROVEN))
def test_proven_disjoint_oneof_is_exact(name):
    schema, candidates = PROVEN[name]
    assert schema_to_regex(schema).relaxed == []
    validator = jsonschema.validators.validator_for(schema)(schema)
    for value in candidates:
        assert _accepts(schema, value) == validator.is_valid(value), value


@pytest.mark.parametrize("schema", [
    {"oneOf": [{"type": "integer", "maximum": 1}, {"type": "integer", "minimum": 1}]},  # both hold 1
    {"oneOf": [{"type": "number", "exclusiveMaximum": 1.5}, {"type": "number", "minimum": 1.2}]},  # 1.3
    {"oneOf": [{"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}, {"type": "object"}]},
    {"oneOf": [{"enum": [1, 2]}, {"type": "integer", "minimum": 2}]},  # 2 is in both
    {"oneOf": [{"type": "array", "items": {"type": "number"}}, {"type": "array", "items": {"type": "string"}}]},  # []
    {"oneOf": [{"type": "object", "required": ["meta"], "properties": {"meta": {"properties": {"kind": {"const": "a"}}}}},
               {"type": "object", "required": ["meta"], "properties": {"meta": {"properties": {"kind": {"const": "b"}}}}}]},
])
def test_overlapping_oneof_is_never_proven_disjoint(schema):
    """Listed as relaxed, or written exactly (by negation): no accepted candidate matches two branches."""
    result = schema_to_regex(schema)
    if ("", "oneOf") in result.relaxed:
        return
    validator = jsonschema.validators.validator_for(schema)(schema)
    for value in [*NUMBERS, *OBJECTS, {"meta": {}}, {"meta": {"kind": "a", "z": 1}}, [], [1], ["a"]]:
        if _accepts(schema, value):
            assert validator.is_valid(value), value


def test_a_literal_branch_is_judged_under_the_roots_draft():
    """Draft 4: `exclusiveMaximum: true` makes 5 fail the second branch, so the two are disjoint;
    the validator used for the proof must read the root's $schema (the newest draft rejects it)."""
    schema = {"$schema": "http://json-schema.org/draft-04/schema#",
              "oneOf": [{"enum": [5]}, {"type": "integer", "maximum": 5, "exclusiveMaximum": True}]}
    assert schema_to_regex(schema).relaxed == []
    assert _accepts(schema, 5) and _accepts(schema, 4) and not _accepts(schema, 6)


@pytest.mark.parametrize(("a", "b", "integral", "meet"), [
    ({"maximum": 0}, {"minimum": 1}, False, False),
    ({"maximum": 1}, {"minimum": 1}, False, True),
    ({"exclusiveMaximum": 1}, {"minimum": 1}, False, False),
    ({"maximum": 1, "exclusiveMaximum": True}, {"minimum": 1}, False, False),
    ({"exclusiveMaximum": 1.5}, {"minimum": 1.2}, False, True),
    ({"exclusiveMaximum": 1.5}, {"minimum": 1.2}, True, False),
    ({"maximum": 2.5}, {"exclusiveMinimum": 2}, True, False),
    ({"maximum": 3}, {"exclusiveMinimum": 2}, True, True),
    ({}, {"minimum": 1}, True, True),
    ({"minimum": 1, "exclusiveMinimum": 3}, {"maximum": 3}, False, False),  # the tighter low bound: > 3
])
def test_ranges_meet(a, b, integral, meet):
    assert ranges_meet(a, b, integral) is meet
    assert ranges_meet(b, a, integral) is meet


def test_array_branches_overlapping_only_on_the_empty_array_are_written_exactly():
    numbers = {"type": "array", "items": {"type": "number"}}
    nested = {"$defs": {"n": numbers}, "oneOf": [{"$ref": "#/$defs/n"}, {"type": "array", "items": {"$ref": "#/$defs/n"}}]}
    result = schema_to_regex(nested)
    assert result.relaxed == []  # [] is valid for both branches, so for neither under oneOf
    regex = re.compile(expand_marks(result.regex))
    validator = jsonschema.Draft202012Validator(nested)
    for value in [[], [1], [[1]], [[]], [1, [1]], [[1, 2], []], [1.5, 2]]:
        assert (regex.fullmatch(grammar_dumps(value, nested)) is not None) == validator.is_valid(value), value
    one_takes_empty = {"oneOf": [{"type": "array", "items": {"type": "integer"}},
                                 {"type": "array", "items": {"type": "string"}, "minItems": 1}]}
    assert schema_to_regex(one_takes_empty).relaxed == []
    regex = re.compile(expand_marks(schema_to_regex(one_takes_empty).regex))
    validator = jsonschema.Draft202012Validator(one_takes_empty)
    for value in [[], [1], ["a"], [1, "a"]]:
        assert (regex.fullmatch(grammar_dumps(value, one_takes_empty)) is not None) == validator.is_valid(value), value
    overlapping = {"oneOf": [{"type": "array", "items": {"type": "integer"}}, {"type": "array", "items": {"type": "number"}}]}
    assert schema_to_regex(overlapping).relaxed == [("", "oneOf")]  # [1] is in both: still listed
