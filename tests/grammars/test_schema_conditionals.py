"""if/then/else, `not`, overlapping oneOf (schema/conditionals.py), min/maxProperties and
propertyNames (schema/property_counts.py) enforced in the grammar.

Per form: nothing is listed as relaxed, every random walk of the compiled table (a byte
vocabulary, free and under a tight budget) validates against the original schema with
`jsonschema`, valid instances are accepted and invalid ones rejected by the regex. Forms
without a negation here stay relaxed with their reason. The real schemas (github-issue-forms,
an overlapping oneOf of types) come from ../shared/data when it is there.
"""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest

from surecall.errors import CompileBudgetExceeded, UnsupportedSchema
from surecall.grammars import compile as compile_module
from surecall.grammars.compile import compile_schema
from surecall.grammars.options import GrammarOptions
from surecall.grammars.schema.conditionals import NotNegatable, integer_gaps, negation
from surecall.grammars.schema.render import grammar_dumps
from surecall.grammars.schema.to_regex import expand_marks, schema_to_regex
from surecall.grammars.vocab import Vocab
from surecall.grammars.walk import decode, random_walk, schema_violations

KIND = {"type": "string", "enum": ["text", "number", "flag"]}
FORMS = {
    "if_const_then_else": (
        {"type": "object", "properties": {"kind": KIND, "value": {}}, "required": ["kind", "value"],
         "additionalProperties": False,
         "allOf": [{"if": {"properties": {"kind": {"const": "number"}}}, "then": {"properties": {"value": {"type": "integer"}}}},
                   {"if": {"properties": {"kind": {"const": "flag"}}}, "then": {"properties": {"value": {"type": "boolean"}}},
                    "else": {"properties": {"value": {"type": ["string", "integer"]}}}}]},
        [{"kind": "number", "value": 1}, {"kind": "flag", "value": True}, {"kind": "text", "value": "x"}],
        [{"kind": "number", "value": "1"}, {"kind": "flag", "value": 1}, {"kind": "text", "value": None}],
    ),
    "if_enum_required_type": (
        {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
         "if": {"required": ["a"], "properties": {"a": {"enum": ["x", "y"]}}},
         "then": {"required": ["b"]}, "else": {"not": {"required": ["b"]}}},
        [{"a": "x", "b": 1}, {"a": "z"}, {}],
        [{"a": "x"}, {"a": "z", "b": 1}, {"b": 2}],
    ),
    "not_string_enum": (
        {"type": "object", "properties": {"s": {"type": "string", "not": {"enum": ["", "none", "no"]}}},
         "required": ["s"]},
        [{"s": "n"}, {"s": "nonexistent"}, {"s": "yes"}],
        [{"s": ""}, {"s": "none"}, {"s": "no"}],
    ),
    "not_const_any_type": (
        {"type": "array", "items": {"not": {"enum": [0, True, None, "0"]}}, "maxItems": 5},
        [[1, False, "00", 0.5, {}]],
        [[0], [0.0], [True], [None], ["0"]],
    ),
    "number_not_integer": (
        {"oneOf": [{"type": "integer"}, {"type": "string"}, {"type": "number"}, {"type": "boolean"}, {"type": "null"}]},
        [1.5, "s", True, None],
        [1, 2.0, -3],
    ),
    "not_any_of_and_bounds": (
        {"type": "object", "properties": {"n": {"type": "integer", "not": {"anyOf": [{"minimum": 10}, {"const": 3}]}},
                                          "s": {"type": "string", "not": {"maxLength": 2}}},
         "required": ["n", "s"]},
        [{"n": 9, "s": "abc"}, {"n": -4, "s": "abcd"}],
        [{"n": 10, "s": "abc"}, {"n": 3, "s": "abc"}, {"n": 1, "s": "ab"}],
    ),
    "not_properties_and_required": (
        {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
         "not": {"properties": {"a": {"const": 1}}, "required": ["b"]}},
        [{"a": 2, "b": 1}, {"a": 1}, {}],
        [{"a": 1, "b": 1}, {"b": 1}],
    ),
    "one_of_overlapping_objects": (
        {"oneOf": [{"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
                   {"type": "object", "properties": {"a": {"const": "both"}, "b": {"type": "integer"}}}]},
        [{"a": "x"}, {"b": 1}, {"a": "both", "b": "x"}],
        [{"a": "both"}, {"a": "both", "b": 1}],
    ),
    "max_properties_declared": (
        {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {}},
         "minProperties": 1, "maxProperties": 1},
        [{"a": 1}, {"b": "x"}, {"c": None}],
        [{}, {"a": 1, "b": "x"}, {"a": 1, "c": 2}],
    ),
    "min_properties_beside_required": (
        {"type": "object", "properties": {"a": {}, "b": {}, "c": {}, "d": {}}, "required": ["b"],
         "minProperties": 3, "maxProperties": 3},
        [{"a": 1, "b": 2, "c": 3}, {"b": 2, "c": 3, "d": 4}],
        [{"b": 2}, {"a": 1, "b": 2}, {"a": 1, "b": 2, "c": 3, "d": 4}],
    ),
    "free_form_max_properties": (
        {"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 2},
        [{}, {"x": 1}, {"x": 1, "y": 2}],
        [{"x": 1, "y": 2, "z": 3}],
    ),
    "property_names_pattern": (
        {"type": "object", "propertyNames": {"pattern": "^[a-z]{1,3}$"}, "additionalProperties": {"type": "boolean"}},
        [{}, {"ab": True}, {"a": True, "xyz": False}],
        [{"abcd": True}, {"A": True}, {"": True}],
    ),
    "property_names_enum_and_declared": (
        {"type": "object", "properties": {"id": {"type": "integer"}, "other": {}}, "additionalProperties": True,
         "propertyNames": {"enum": ["id", "tag", "note"]}},
        [{"id": 1}, {"id": 1, "tag": 2}, {"note": "n"}],
        [{"other": 1}, {"id": 1, "misc": 2}],
    ),
    "not_items_is_contains": (
        {"type": "array", "not": {"items": {"type": "integer"}}},
        [["a"], [1, "x"], [None]],
        [[], [1, 2]],
    ),
    "not_contains_is_items": (
        {"type": "array", "items": {"type": ["integer", "string"]}, "not": {"contains": {"type": "string"}}},
        [[], [1, 2]],
        [["a"], [1, "b"]],
    ),
    "one_of_dependencies": (  # Handwritten oneof6's form: exactly one dependency holds
        {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}},
         "additionalProperties": False, "oneOf": [{"dependentRequired": {"a": ["b"]}}, {"dependentRequired": {"a": ["c"]}}]},
        [{"a": 1, "b": 1}, {"a": 1, "c": 1}],
        [{"a": 1, "b": 1, "c": 1}, {}, {"a": 1}, {"b": 2}],
    ),
    "not_dependent_schema": (
        {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a"],
         "additionalProperties": False, "not": {"dependentSchemas": {"a": {"properties": {"b": {"minimum": 5}}}}}},
        [{"a": 1, "b": 4}],
        [{"a": 1}, {"a": 1, "b": 5}],
    ),
    "one_of_pattern_properties": (  # a branch's negation is an existence (object_exists.py writes it)
        {"type": "object", "maxProperties": 2, "additionalProperties": {"type": ["integer", "string"]},
         "oneOf": [{"patternProperties": {"^a": {"type": "integer"}}}, {"patternProperties": {"^b": {"type": "integer"}}}]},
        [{"a1": "s", "b1": 1}, {"a": 1, "b": "s"}, {"a": 1, "ab": "x"}],
        [{}, {"a": 1, "b": 2}, {"a": "s", "b": "t"}, {"c": 1}],
    ),
    "if_pattern_properties": (
        {"type": "object", "maxProperties": 2, "additionalProperties": {"type": ["integer", "string"]},
         "if": {"patternProperties": {"^a": {"type": "integer"}}}, "then": {"required": ["z"]}},
        [{"z": 1}, {"a": "s"}, {"a": 1, "z": 2}],
        [{}, {"a": 1}, {"b": "s"}],
    ),
    "if_no_undeclared_key": (  # additionalProperties beside no name: the object is empty
        {"type": "object", "if": {"additionalProperties": False}, "then": {"required": ["a"]}},
        [{"b": 1}, {"a": 1}],
        [{}],
    ),
    "one_of_item_multiples": (  # a branch's negation holds `not: {multipleOf}` for the number algebra
        {"type": "array", "items": {"type": "integer"},
         "oneOf": [{"items": {"type": "integer", "multipleOf": 2}}, {"items": {"type": "integer", "multipleOf": 3}}]},
        [[2, 4], [3], [2, 6]],
        [[], [6], [2, 3], [6, 12]],
    ),
    "one_of_property_patterns": (  # a branch's negation holds `not: {pattern}` for the string algebra
        {"type": "object", "properties": {"k": {"type": "string"}}, "required": ["k"], "additionalProperties": False,
         "oneOf": [{"properties": {"k": {"pattern": "^a"}}}, {"properties": {"k": {"pattern": "b$"}}}]},
        [{"k": "a"}, {"k": "b"}, {"k": "cb"}, {"k": "ax"}],
        [{"k": "ab"}, {"k": "c"}, {"k": "axb"}, {"k": ""}],
    ),
    "not_required_leaves_the_object_open": (  # its `properties: {a: false}` declares no shape: other keys stay
        {"type": "object", "not": {"required": ["a"]}},
        [{}, {"b": 1}, {"b": {"c": [1]}, "d": "x"}],
        [{"a": 1}, {"b": 1, "a": 2}],
    ),
    "not_one_of": (  # none of the branches holds, or two of them do
        {"type": "object", "properties": {"n": {"type": "integer", "minimum": -50, "maximum": 50}}, "required": ["n"],
         "additionalProperties": False,
         "not": {"properties": {"n": {"oneOf": [{"minimum": 10}, {"maximum": 0}, {"enum": [5, 20]}]}}}},
        [{"n": 20}, {"n": 3}, {"n": 7}],
        [{"n": 5}, {"n": 10}, {"n": 0}, {"n": -3}],
    ),
    "not_if_then_else": (  # the condition and not then, or not the condition and not else
        {"type": "object", "properties": {"kind": KIND, "v": {"type": ["integer", "string"]}},
         "required": ["kind", "v"], "additionalProperties": False,
         "not": {"if": {"properties": {"kind": {"const": "number"}}}, "then": {"properties": {"v": {"type": "integer"}}},
                 "else": {"properties": {"v": {"type": "string"}}}}},
        [{"kind": "number", "v": "1"}, {"kind": "text", "v": 1}],
        [{"kind": "number", "v": 1}, {"kind": "flag", "v": "x"}],
    ),
    "one_of_beside_a_conditional_branch": (  # Handwritten oneof11's shape: a branch's negation holds an if
        {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}, "b": {"type": "boolean"}},
         "required": ["a", "b"], "additionalProperties": False,
         "oneOf": [{"if": {"properties": {"b": {"const": True}}}, "then": {"properties": {"a": {"maximum": 4}}}},
                   {"properties": {"a": {"minimum": 3}}}]},
        [{"a": 1, "b": True}, {"a": 2, "b": False}, {"a": 7, "b": True}],
        [{"a": 5, "b": False}, {"a": 7, "b": False}, {"a": 3, "b": True}, {"a": 3, "b": False}],
    ),
    "not_max_properties": (
        {"type": "object", "properties": {k: {"type": "integer"} for k in "abc"}, "additionalProperties": False,
         "not": {"maxProperties": 1}},
        [{"a": 1, "b": 2}, {"a": 1, "b": 2, "c": 3}],
        [{}, {"a": 1}],
    ),
}


def byte_vocab() -> Vocab:
    pieces = [bytes([b]) for b in range(256)] + [b""]
    return Vocab(token_bytes=tuple(pieces), special_ids=frozenset({256}), stop_ids=(256,),
                 logits_width=len(pieces), format="test", name="conditional-bytes")


def regex_accepts(schema, value) -> bool:
    """By Python's re (free-form values unrolled: it has no bracket stack)."""
    regex = schema_to_regex(schema, GrammarOptions(free_form_stack=False)).regex
    return re.fullmatch(expand_marks(regex), grammar_dumps(value, schema)) is not None


def walk_errors(schema, vocab, table, num_walks: int = 8) -> list[str]:
    rng, errors = np.random.default_rng(0), []
    for i in range(num_walks):
        # uniform walks stay in a string until the budget closes it: 1,500 tokens is long enough
        text = decode(vocab, random_walk(table, vocab, rng, max_tokens=1500 if i % 2 else 400)).decode()
        bad, soft = schema_violations(schema, json.loads(text), table.relaxed)
        errors += [f"{text[:80]}: {e}" for e in bad + soft]
    return errors


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SURECALL_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("name", sorted(FORMS))
def test_form_is_enforced_walks_validate_and_invalid_instances_are_rejected(name):
    schema, good, bad = FORMS[name]
    validator = jsonschema.Draft202012Validator(schema)
    assert all(validator.is_valid(v) for v in good) and not any(validator.is_valid(v) for v in bad)
    assert schema_to_regex(schema, splice=True).relaxed == []  # compile_schema's conversion
    assert [v for v in good if not regex_accepts(schema, v)] == []
    assert [v for v in bad if regex_accepts(schema, v)] == []
    vocab = byte_vocab()
    assert walk_errors(schema, vocab, compile_schema(schema, vocab, use_cache=False)) == []


def test_not_of_everything_is_unsatisfiable_and_double_negation_is_the_schema():
    with pytest.raises(UnsupportedSchema, match="unsatisfiable"):
        schema_to_regex({"type": "string", "not": {}})
    twice = {"type": "integer", "not": {"not": {"minimum": 5}}}
    assert schema_to_regex(twice).relaxed == [] and regex_accepts(twice, 5) and not regex_accepts(twice, 4)


@pytest.mark.parametrize("schema, keyword, reason", [
    ({"type": "string", "not": {"format": "email"}}, "not", "'format' is not written"),  # `pattern`: regular.py
    ({"type": "number", "not": {"multipleOf": 2.5}}, "not", "a not of multipleOf is written only by the number algebra"),  # 3, 7: regular.py
    ({"type": "array", "if": {"uniqueItems": True}, "then": {"minItems": 2}}, "if", "'uniqueItems' is not written"),
    ({"type": "number", "not": {"minimum": 0.5}}, "not", "non-integral 'minimum'"),
    ({"type": "array", "not": {"const": [1]}}, "not", "object or array literal"),
    ({"type": "string", "format": "email", "not": {"const": "abc"}}, "not", "excluding a string literal"),
    ({"type": "object", "properties": {"k": {"type": "string", "pattern": "^[a-z]+$"}, "v": {}},
      "if": {"properties": {"k": {"const": "ab"}}}, "then": {"properties": {"v": {"type": "integer"}}}},
     "if", "excluding a string literal"),  # listed as the `if` it came from
])
def test_forms_without_a_negation_stay_relaxed_with_a_reason(schema, keyword, reason):
    result = schema_to_regex(schema)
    assert result.relaxed == [("", keyword)]
    assert reason in result.reasons[("", keyword)]


def test_a_kept_not_the_grammar_cannot_write_is_listed_as_the_keyword_it_was_written_for():
    # Handwritten oneof3_2: each branch's negation is "some a-key holds a value it rejects", whose value
    # (a multipleOf beside a maximum) object_exists.py cannot write exactly: the oneOf is listed, at its place
    schema = {"type": "object", "oneOf": [{"patternProperties": {"a": {"multipleOf": 10, "maximum": 20}}},
                                          {"patternProperties": {"a": {"multipleOf": 5, "maximum": 100}}}]}
    result = schema_to_regex(schema)
    assert result.relaxed == [("", "oneOf")]
    assert "object-level not" in result.reasons[("", "oneOf")]


def test_one_of_without_a_negation_stays_relaxed():
    schema = {"oneOf": [{"type": "integer", "multipleOf": 2, "maximum": 100}, {"type": "integer", "multipleOf": 3}]}
    assert schema_to_regex(schema).relaxed == [("", "oneOf")]  # without the maximum: regular.py's remainders


def test_negation_of_items_does_not_nest_contains():
    assert negation({"items": {"type": "integer"}}, lambda ref: {}) == {
        "type": "array", "contains": {"type": ["object", "array", "string", "number", "boolean", "null"],
                                      "not": {"type": "integer"}}}
    with pytest.raises(NotNegatable, match="nest a contains inside a contains"):
        negation({"items": {"type": "array", "items": {"type": "integer"}}}, lambda ref: {})


def test_negation_rejects_unknown_keywords_and_gaps_skip_excluded_integers():
    with pytest.raises(NotNegatable, match="'uniqueItems'"):
        negation({"uniqueItems": True}, lambda ref: {})
    assert negation({"type": ["string", "integer"]}, lambda ref: {}) == {
        "type": ["object", "array", "number", "boolean", "null"], "not": {"type": "integer"}}
    gaps = re.compile(integer_gaps(-3, 12, [0, 5, 12, 40]))
    assert [n for n in range(-5, 15) if gaps.fullmatch(str(n))] == [-3, -2, -1, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11]
    assert integer_gaps(2, 2, [2]) is None


def _bench_schema(data_dir, subset: str, name: str) -> dict:
    from conftest import bench_schema

    return bench_schema(data_dir, subset, name)


@pytest.mark.parametrize("subset, suffix, kept", [
    ("JsonSchemaStore", "github-issue-forms", {"uniqueItems"}),  # if/then/else on the item type
    ("Github_trivial", "o41599", set()),  # oneOf of integer and number: fractions only
])
def test_benchmark_schemas_walk_valid(data_dir, subset, suffix, kept):
    from conftest import cached_vocab

    schema = _bench_schema(data_dir, subset, suffix)
    result = schema_to_regex(schema)
    assert {k for _, k in result.relaxed} == kept
    vocab = cached_vocab("llama3")
    table = compile_schema(schema, vocab)
    assert walk_errors(schema, vocab, table, num_walks=6) == []


def test_a_table_past_the_memory_budget_is_compiled_again_with_conditionals_relaxed(monkeypatch, capsys):
    monkeypatch.setattr(compile_module, "_PROGRESS_AFTER_S", -1.0)  # as if it had run long: the note is printed
    schema = FORMS["if_const_then_else"][0]
    inner = compile_module._with_counted_fallback

    def over_budget(to_regex, vocab, options, meta):
        if options.rewrite_conditionals:
            raise CompileBudgetExceeded("compile needs about 9 MiB, over the memory budget of 1 MiB")
        return inner(to_regex, vocab, options, meta)

    monkeypatch.setattr(compile_module, "_with_counted_fallback", over_budget)
    table = compile_schema(schema, byte_vocab(), use_cache=False)
    assert "memory budget" in table.meta["conditionals_fallback"]
    assert {k for _, k in table.relaxed} == {"if"}
    assert "compiling again with them relaxed" in capsys.readouterr().err
    with pytest.raises(CompileBudgetExceeded, match="memory budget"):  # nothing to relax: raised as it is
        compile_schema({"type": "integer"}, byte_vocab(), use_cache=False)
    with pytest.raises(ValueError, match="Invalid rewrite_conditionals"):
        GrammarOptions(rewrite_conditionals="yes")


def test_a_format_no_draft_defines_negates_to_nothing():
    # Github_hard o58282: a oneOf branch whose format ("path") is an annotation matches every string
    schema = {"type": "string", "oneOf": [{"enum": ["home", "temp"], "type": "string"}, {"format": "path", "type": "string"}]}
    result = schema_to_regex(schema)
    assert result.relaxed == []
    grammar = re.compile(expand_marks(result.regex))
    assert grammar.fullmatch('"desk"') and not grammar.fullmatch('"home"') and not grammar.fullmatch('"temp"')


def test_negated_one_of_and_if_are_written_as_disjuncts():
    branches = [{"minimum": 10}, {"maximum": 0}]
    assert negation({"oneOf": branches}, lambda ref: {}) == {"anyOf": [
        {"allOf": [negation(branches[0], lambda ref: {}), negation(branches[1], lambda ref: {})]},
        {"allOf": branches}]}
    # an if without else: only "the condition holds and then fails"
    assert negation({"if": {"minimum": 1}, "then": {"maximum": 5}}, lambda ref: {}) == {
        "allOf": [{"minimum": 1}, negation({"maximum": 5}, lambda ref: {})]}
    with pytest.raises(NotNegatable, match="oneOf of 7 branches"):
        negation({"oneOf": [{"const": i} for i in range(7)]}, lambda ref: {})
