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
    "union_inside_a_branch": (  # JsonSchemaStore vega's groupby items: every branch of the inner oneOf excluded
        {"$defs": {"signal": {"type": "object", "properties": {"signal": {"type": "string"}}, "required": ["signal"]}},
         "oneOf": [{"oneOf": [{"type": "string"}, {"$ref": "#/$defs/signal"}]},
                   {"type": "object", "properties": {"field": {"type": "string"}}, "required": ["field"],
                    "additionalProperties": False},
                   {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]}]},
        ["s", {"signal": "x"}, {"field": "f"}, {"expr": "e"}, {"signal": 1}, 3, None]),
    "more_required_names_than_the_other_allows": (  # composer.json's repositories items (Github_ultra o42127)
        {"oneOf": [{"type": "object", "required": ["type", "url"],
                    "oneOf": [{"properties": {"type": {"enum": ["vcs", "git"]}, "url": {"type": "string"}}},
                              {"properties": {"type": {"const": "path"}, "url": {"type": "string"}}}]},
                   {"type": "object", "additionalProperties": {"enum": [False]}, "minProperties": 1,
                    "maxProperties": 1}]},
        [{"type": "git", "url": "u"}, {"type": "path", "url": "u"}, {"type": False}, {"x": False}, {"type": "git"},
         {"x": False, "y": False}, {}, {"type": "svn", "url": "u"}]),
    "a_required_name_written_only_with_values_the_other_rejects": (
        {"oneOf": [{"type": "object", "additionalProperties": {"type": "integer"}},
                   {"type": "object", "properties": {"kind": {"type": "string"}}, "required": ["kind"]}]},
        [{"kind": "a"}, {"kind": 1}, {"n": 1}, {}, {"kind": None}]),
    "a_required_name_never_written": (  # the first branch is closed by policy: it never writes "kind"
        {"oneOf": [{"type": "object", "properties": {"a": {"type": "integer"}}},
                   {"type": "object", "properties": {"kind": {"type": "string"}}, "required": ["kind"]}]},
        [{"kind": "a"}, {"a": 1}, {}, {"kind": 1}]),
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
    {"oneOf": [{"anyOf": [{"type": "string"}, {"type": "integer"}]}, {"type": "integer", "minimum": 2}]},  # 2
    {"oneOf": [{"type": "integer"}, {"oneOf": [{"type": "string"}, {"type": "number", "minimum": 5}]}]},  # 5
    {"oneOf": [{"type": "array", "items": {"type": "number"}}, {"type": "array", "items": {"type": "string"}}]},  # []
    {"oneOf": [{"type": "object", "required": ["meta"], "properties": {"meta": {"properties": {"kind": {"const": "a"}}}}},
               {"type": "object", "required": ["meta"], "properties": {"meta": {"properties": {"kind": {"const": "b"}}}}}]},
    # the first branch may write "kind" with any value (explicitly open; pattern keys):
    {"oneOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": True},
               {"type": "object", "properties": {"kind": {"type": "string"}}, "required": ["kind"]}]},
    {"oneOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "patternProperties": {"^k": {"type": "string"}}},
               {"type": "object", "properties": {"kind": {"type": "string"}}, "required": ["kind"]}]},
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
    result = schema_to_regex(overlapping)  # [1] is in both: each branch beside the other's negation (a `contains`)
    assert result.relaxed == []
    regex, validator = re.compile(expand_marks(result.regex)), jsonschema.Draft202012Validator(overlapping)
    for value in [[], [1], [1.5], [1, 2.5], ["a"], [1, "a"]]:
        assert (regex.fullmatch(grammar_dumps(value, overlapping)) is not None) == validator.is_valid(value), value


FINITE = {
    "overlapping_enums": ({"oneOf": [{"enum": [1, 2, 3]}, {"enum": [3, 4]}, {"const": 4.0}]}, [*NUMBERS, 4, "1"]),
    "enums_under_a_conditional": (  # JSONSchemaBench Handwritten key8: only [1, 2] passes
        {"type": "array", "oneOf": [{"$ref": "#/definitions/x"}, {"$ref": "#/definitions/y"}, {"$ref": "#/definitions/x"}],
         "if": {"minItems": 1}, "then": {"minItems": 2, "items": {"exclusiveMaximum": 5}}, "else": {"minItems": 1},
         "definitions": {"x": {"enum": [[1], [3, 4], [5]]}, "y": {"enum": [[1], [1, 2]]}}},
        [[1], [3, 4], [5], [1, 2], [], [2, 1]]),
    "any_of_beside_one_of": ({"allOf": [{"anyOf": [{"type": "integer"}, {"type": "string"}]},
                                        {"oneOf": [{"enum": [1, "a", None]}, {"enum": [1, "b"]}]}]},
                             [1, "a", "b", None, 2]),
    "one_of_beside_one_of": ({"allOf": [{"oneOf": [{"enum": [1, 2]}, {"enum": [2, 3]}]},
                                        {"oneOf": [{"enum": [1, 3]}, {"enum": [3]}]}]}, [1, 2, 3]),
}


@pytest.mark.parametrize("name", sorted(FINITE))
def test_one_of_over_listed_values_is_written_exactly(name):
    """Branches that list their values: exactly those valid under one branch (the validator decides),
    also where an allOf merges the oneOf with an anyOf or another oneOf."""
    schema, candidates = FINITE[name]
    assert schema_to_regex(schema).relaxed == []
    validator = jsonschema.validators.validator_for(schema)(schema)
    assert any(validator.is_valid(v) for v in candidates) and not all(validator.is_valid(v) for v in candidates)
    for value in candidates:
        assert _accepts(schema, value) == validator.is_valid(value), value


def test_random_unions_of_listed_values_are_sound_and_exact_where_nothing_is_relaxed():
    import random

    from surecall.grammars.walk import schema_violations

    rng = random.Random(15)

    def node(depth):
        if depth == 0 or rng.random() < 0.3:
            return {"enum": rng.sample(range(6), rng.randint(1, 4))}
        return {rng.choice(["anyOf", "oneOf", "allOf"]): [node(depth - 1) for _ in range(rng.randint(1, 3))]}

    exact = 0
    for _ in range(150):
        schema = node(3)
        valid = [v for v in range(7) if jsonschema.Draft202012Validator(schema).is_valid(v)]
        if not valid:
            continue
        result = schema_to_regex(schema)
        accepted = [v for v in range(7)
                    if re.fullmatch(expand_marks(result.regex), grammar_dumps(v, schema)) is not None]
        for v in accepted:  # never a value that breaks a keyword the grammar enforces
            assert not schema_violations(schema, v, result.relaxed)[0], (schema, v)
        if not result.relaxed:
            assert accepted == valid, schema
            exact += 1
    assert exact >= 110  # 114 of 150; 107 when a merged oneOf was relaxed instead of kept whole


SEPARATED = {  # overlapping object branches, each written without what lets it meet another (narrowed, exact)
    "one_of_several_keys": (  # JsonSchemaStore helm-testsuite's asserts: exactly one assertion key per item
        {"type": "object", "properties": {"equal": True, "exists": True, "isKind": True},
         "oneOf": [{"properties": {"equal": {"type": "object", "required": ["path"]}}, "required": ["equal"]},
                   {"properties": {"exists": {"type": "object"}}, "required": ["exists"]},
                   {"properties": {"isKind": {"type": "object"}}, "required": ["isKind"]}]},
        [{"equal": {"path": "a"}}, {"exists": {}}, {"isKind": {}}],
        [{}, {"equal": {"path": "a"}, "exists": {}}, {"exists": {}, "isKind": {}}, {"equal": {}}]),
    "closed_objects_of_one_optional_key": (  # JsonSchemaStore pyrseas' privileges: `{}` would meet every branch
        {"oneOf": [{"type": "string", "enum": ["all", "insert"]},
                   {"type": "object", "additionalProperties": False, "properties": {"all": {"type": "boolean"}}},
                   {"type": "object", "additionalProperties": False, "properties": {"insert": {"type": "boolean"}}}]},
        ["all", {"all": True}, {"insert": False}],
        [{}, {"all": True, "insert": False}, "x", {"other": 1}]),
    "required_lists_that_differ_in_one_name": (  # Github_hard o52856's domain: zoneId or zoneName (its
        # negations cross into 169 branches: separated instead)
        {"type": "object", "properties": {"name": {"type": "string"}, "zoneId": {"type": "string"},
                                          "zoneName": {"type": "string"}, "proxied": {"type": "boolean"},
                                          "create": {"type": "boolean"}, "type": {"enum": ["A", "AAAA"]}},
         "oneOf": [{"required": ["name", "type", "proxied", "create", "zoneId"]},
                   {"required": ["name", "type", "proxied", "create", "zoneName"]}]},
        [{"name": "a", "zoneId": "z", "proxied": True, "create": False, "type": "A"},
         {"name": "a", "zoneName": "z", "proxied": True, "create": False, "type": "A"}],
        [{"name": "a", "proxied": True, "create": False, "type": "A"}, {"zoneId": "z"},
         {"name": "a", "zoneId": "z", "zoneName": "y", "proxied": True, "create": False, "type": "A"}]),
}


@pytest.mark.parametrize("name", sorted(SEPARATED))
def test_overlapping_object_branches_are_written_exactly(name):
    """Nothing relaxed (written by negation where that stays small, else separated and listed as narrowed); every
    accepted value validates (exactly one branch), the branches' own values are written, and what meets two
    branches (or none) is not."""
    schema, written, refused = SEPARATED[name]
    result = schema_to_regex(schema)
    assert result.relaxed == []
    validator = jsonschema.validators.validator_for(schema)(schema)
    for value in written:
        assert validator.is_valid(value) and _accepts(schema, value), value
    for value in refused:
        assert not _accepts(schema, value), value
    for value in [*written, *refused, *OBJECTS, *NUMBERS, "all", [], {"name": 1}]:
        if _accepts(schema, value):
            assert validator.is_valid(value), value



def test_separated_branches_are_listed_as_narrowed():
    """Past the negation's caps (each branch's negation has 5 disjuncts: a required name absent, so the two cross into
    more than 16), the branches are separated by names and the oneOf is listed in `narrowed`: a value of one branch
    that also holds the other's required names is not written."""
    schema, _, _ = SEPARATED["required_lists_that_differ_in_one_name"]
    result = schema_to_regex(schema)
    assert result.relaxed == [] and ("", "oneOf") in result.narrowed
    assert not _accepts(schema, {"name": "a", "zoneId": "z", "zoneName": "y", "proxied": True, "create": False,
                                 "type": "A"})
