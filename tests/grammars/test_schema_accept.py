"""Valid-instance acceptance and relaxed-keyword regressions found on JSONSchemaBench (issue 15).

Each test names the benchmark schema it was reduced from; each checks that the valid instance is
accepted and that a nearby invalid one is still rejected (or, for pointers, where a relaxed
keyword is listed).
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from fractions import Fraction

import jsonschema
import numpy as np
import pytest
from test_schema_regex import accepts, relaxed  # the one copy of these two helpers

from surecall.errors import UnsupportedSchema
from surecall.grammars.compile import compile_schema
from surecall.grammars.options import GrammarOptions
from surecall.grammars.schema.render import grammar_dumps
from surecall.grammars.schema.to_regex import expand_marks, schema_to_regex
from surecall.grammars.vocab.core import Vocab
from surecall.grammars.walk import decode, random_walk


# --- key order under a union whose branch holds a counted string (Snowplow---sp_336) -----------
def test_union_branch_with_counted_string_is_rendered_in_its_declared_order():
    schema = {"oneOf": [
        {"type": "object", "properties": {"type": {"enum": ["A"]}}, "required": ["type"]},
        {"type": "object", "properties": {"errors": {"type": "array", "items": {"type": "string", "maxLength": 32}},
                                          "type": {"enum": ["B"]}}, "required": ["type", "errors"]}]}
    value = {"type": "B", "errors": ["x"]}  # written in the other order than declared
    assert grammar_dumps(value, schema) == '{"errors": ["x"], "type": "B"}'
    assert accepts(schema, value)
    assert not accepts(schema, {"type": "B", "errors": ["x" * 33]})  # maxLength still enforced


# --- origins of merged keywords survive an anyOf beside them (Handwritten---string5) -----------
def test_keyword_merged_from_all_of_is_listed_at_its_branch_inside_a_union():
    schema = {"allOf": [{"type": "string"}, {"format": "regex"},
                        {"anyOf": [{"minLength": 1}, {"maxLength": 0}]}]}
    assert relaxed(schema) == [("/allOf/1", "format")]
    ref_branch = {"allOf": [{"$ref": "#/$defs/s"}, {"format": "regex"}, {"anyOf": [{"maxLength": 3}]}],
                  "$defs": {"s": {"type": "string"}}}
    assert relaxed(ref_branch) == [("/allOf/1", "format")]
    assert accepts(ref_branch, '"abc"') and not accepts(ref_branch, '"abcd"')


# --- multipleOf: enforced by a remainder automaton (Handwritten---string5, Snowplow, JSONSchemaStore)
def _is_multiple(text: str, m: str) -> bool:
    return Fraction(text) % Fraction(m) == 0


@pytest.mark.parametrize("m", [2, 3, 6, 8, 10, 25])
def test_integer_multiple_of_is_enforced_exactly(m):
    schema = {"type": "integer", "multipleOf": m}
    assert relaxed(schema) == []
    regex = re.compile(expand_marks(schema_to_regex(schema).regex))
    for n in range(-300, 3000):
        assert bool(regex.fullmatch(str(n))) == (n % m == 0), n
    assert regex.fullmatch(str(m * 10**20))  # no digit cap (exact in both validators)
    assert not regex.fullmatch(f"{m}.0") and not regex.fullmatch("-0") and not regex.fullmatch(f"0{m}")


def test_decimal_multiple_of_bounds_the_fraction_and_keeps_minimum():
    price = {"type": "number", "multipleOf": 0.01, "minimum": 0}  # Snowplow: 88 such prices
    assert relaxed(price) == []
    good = ["0", "0.07", "12.34", "12.340", "1", "100.5", "0.00"]
    bad = ["12.345", "-0.01", "0.001", "1e2", "-1"]
    assert all(accepts(price, t) for t in good) and not any(accepts(price, t) for t in bad)
    assert not accepts(price, "1234567890123456.5") and accepts(price, "123456789012345.5")  # below 2^53
    step = {"type": "number", "multipleOf": 0.25, "minimum": 3}  # a minimum that cuts the multiples partway
    regex = re.compile(expand_marks(schema_to_regex(step).regex))
    for hundredths in range(-200, 3000):
        text = str(Decimal(hundredths) / 100)
        text = text[:-3] if text.endswith(".00") else text
        want = _is_multiple(text, "0.25") and Decimal(text) >= 3
        assert bool(regex.fullmatch(text)) == want, text
    assert regex.fullmatch("3.50") and regex.fullmatch("5.0")  # listed multiples keep trailing zeros


def test_multiple_of_of_an_integer_and_merged_multiples():
    assert accepts({"type": "integer", "multipleOf": 2.5}, "15") and not accepts({"type": "integer", "multipleOf": 2.5}, "7")
    both = {"type": "integer", "allOf": [{"multipleOf": 2}, {"multipleOf": 3}]}  # least common multiple 6
    assert relaxed(both) == [] and accepts(both, "12") and not accepts(both, "4") and not accepts(both, "9")
    capped = {"type": "integer", "multipleOf": 10, "maximum": 35, "minimum": -20}
    regex = re.compile(expand_marks(schema_to_regex(capped).regex))
    assert [n for n in range(-100, 100) if regex.fullmatch(str(n))] == [-20, -10, 0, 10, 20, 30]
    with pytest.raises(UnsupportedSchema, match="unsatisfiable"):
        schema_to_regex({"type": "integer", "multipleOf": 7, "minimum": 1, "maximum": 6})


def test_multiple_of_without_a_short_regex_writes_the_multiples_nearest_zero():
    seven = {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 7}}}
    result = schema_to_regex(seven)
    assert result.relaxed == []
    assert "regex longer than" in result.narrowed[("/properties/n", "multipleOf")]
    assert accepts(seven, '{"n": 14}') and accepts(seven, '{"n": -889}') and not accepts(seven, '{"n": 15}')
    assert accepts(seven, '{"n": 896}') and not accepts(seven, '{"n": 903}')  # the 256 nearest zero: stricter
    coarse = {"type": "number", "multipleOf": 2.5, "minimum": 1}  # floats past 2^53 lose its remainder
    assert "does not divide 1" in schema_to_regex(coarse).narrowed[("", "multipleOf")]
    assert accepts(coarse, "2.5") and accepts(coarse, "5") and not accepts(coarse, "0") and not accepts(coarse, "3")
    wide = {"type": "number", "multipleOf": 0.01, "minimum": -1e9, "maximum": 1e9}  # places: exact
    assert schema_to_regex(wide).relaxed == [] and schema_to_regex(wide).narrowed == {}
    assert accepts(wide, "123456.78") and accepts(wide, "-1000000000") and not accepts(wide, "0.001")
    assert not accepts(wide, "1000000000.01")
    tiny = {"type": "number", "multipleOf": 1e-13}  # 13 fraction digits: not even listed
    assert schema_to_regex(tiny).relaxed == [("", "multipleOf")]


def test_walks_under_multiple_of_validate():
    vocab = _digit_vocab()
    rng = np.random.default_rng(0)
    for schema in ({"type": "integer", "multipleOf": 3}, {"multipleOf": 6, "pattern": "^a"},
                   {"type": "number", "multipleOf": 0.25, "minimum": 3}):
        table = compile_schema(schema, vocab, use_cache=False)
        assert table.relaxed == []
        validator = jsonschema.Draft202012Validator(schema)  # 0.25: binary, so float division is exact
        for _ in range(40):
            text = decode(vocab, random_walk(table, vocab, rng, max_tokens=40)).decode()
            assert validator.is_valid(json.loads(text)), text
            if not text.startswith('"'):
                assert _is_multiple(text, str(schema["multipleOf"])), text


def _digit_vocab() -> Vocab:
    pieces = [bytes([b]) for b in range(256)] + [b"00", b"14", b"7.", b".25", b'"a'] + [b""]
    stop = len(pieces) - 1
    return Vocab(token_bytes=tuple(pieces), special_ids=frozenset({stop}), stop_ids=(stop,),
                 logits_width=len(pieces), format="test", name="digits-synthetic")


# --- dependencies and not-required as alternatives (JSONSchemaStore---nodemon, WashingtonPost---wp_100)
def test_dependent_required_and_array_dependencies_are_enforced():
    props = {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {}}
    for key in ("dependentRequired", "dependencies"):
        schema = {"type": "object", "properties": props, key: {"a": ["b"]}}
        assert relaxed(schema) == []
        assert all(accepts(schema, t) for t in ['{}', '{"a": 1, "b": "x"}', '{"b": "x", "c": 1}'])
        assert not accepts(schema, '{"a": 1}') and not accepts(schema, '{"a": 1, "c": 2}')


def test_schema_dependencies_are_enforced_and_keep_inner_pointers():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
              "dependencies": {"a": {"properties": {"b": {"maxLength": 2, "format": "regex"}},
                                     "required": ["b"]}}}
    assert relaxed(schema) == [("/dependencies/a/properties/b", "format")]
    assert accepts(schema, '{"a": 1, "b": "xy"}') and accepts(schema, '{"b": "xyz"}')
    assert not accepts(schema, '{"a": 1, "b": "xyz"}') and not accepts(schema, '{"a": 1}')


def test_not_required_means_some_name_absent_and_an_object():
    schema = {"type": ["object", "null"], "properties": {"a": {}, "b": {}}, "not": {"required": ["a", "b"]}}
    assert relaxed(schema) == []
    assert accepts(schema, '{"a": 1}') and accepts(schema, '{"b": 2}') and accepts(schema, "{}")
    assert not accepts(schema, '{"a": 1, "b": 2}') and not accepts(schema, "null")


def test_too_many_dependency_triggers_stay_relaxed():
    needs = {"a": ["e"], "b": ["f"], "c": ["g"], "d": ["h"]}  # four triggers, each asking for other names
    schema = {"type": "object", "properties": {n: {} for n in "abcdefgh"}, "dependentRequired": needs}
    assert relaxed(schema) == [("", "dependentRequired")]


def test_required_triggers_need_no_branch_and_vacuous_dependencies_add_nothing():
    # Glaiveai2K calculate_area: six triggers (past MAX_TRIGGERS), all but one required by the node
    props = {n: {"type": "integer"} for n in ("base", "height", "width", "radius")}
    schema = {"type": "object", "properties": {**props, "shape": {"type": "string"}},
              "required": ["base", "height", "width", "radius"],
              "dependencies": {"base": ["tri"], "height": ["tri", "rect"], "width": ["rect"], "radius": ["circ"],
                               "shape": ["base"], "tri": {"required": ["shape"]}}}
    assert relaxed(schema) == []
    full = {"base": 1, "height": 2, "width": 3, "radius": 4, "shape": "s", "tri": 0, "rect": 0, "circ": 0}
    assert accepts(schema, full)
    for name in ("circ", "rect", "tri"):  # each required through a trigger the node requires
        assert not accepts(schema, {k: v for k, v in full.items() if k != name})
    assert not accepts(schema, {k: v for k, v in full.items() if k != "shape"})  # tri's schema requires it
    vacuous = {"type": "object", "properties": {"a": {}, "b": {}}, "required": ["b"],
               "dependentRequired": {"a": ["b"]}, "dependentSchemas": {"a": True}}
    assert relaxed(vacuous) == [] and accepts(vacuous, '{"a": 1, "b": 2}') and accepts(vacuous, '{"b": 2}')


# --- uniqueItems over a small literal item set -------------------------------------------------
def test_unique_items_over_small_enums_and_booleans_are_enforced():
    days = {"type": "array", "items": {"enum": ["mon", "tue", "wed"]}, "uniqueItems": True, "minItems": 1}
    assert relaxed(days) == []
    assert accepts(days, '["tue", "mon"]') and accepts(days, '["wed", "mon", "tue"]')
    assert not accepts(days, '["mon", "mon"]') and not accepts(days, "[]") and not accepts(days, '["thu"]')
    flags = {"type": "array", "items": {"type": "boolean"}, "uniqueItems": True, "maxItems": 1}
    assert accepts(flags, "[true]") and not accepts(flags, "[true, false]")
    numbers = {"type": "array", "items": {"enum": [1, 1.0, 2]}, "uniqueItems": True}  # 1 == 1.0
    assert accepts(numbers, "[2, 1]") and not accepts(numbers, "[1, 1.0]")


def test_unique_items_over_open_or_large_item_sets_stay_relaxed():
    assert relaxed({"type": "array", "items": {"type": "string"}, "uniqueItems": True}) == [("", "uniqueItems")]
    either = {"type": "array", "items": {"type": ["boolean", "null"]}, "uniqueItems": True}
    assert relaxed(either) == [("", "uniqueItems")]
    five = {"type": "array", "items": {"enum": list("abcde")}, "uniqueItems": True}
    assert relaxed(five) == [("", "uniqueItems")]
    with pytest.raises(UnsupportedSchema, match="unsatisfiable"):
        schema_to_regex({"type": "array", "items": {"enum": ["a", "b"]}, "uniqueItems": True, "minItems": 3})


# --- extra members repeat as one group (Handwritten---test.NoType) -----------------------------
def test_several_pattern_members_repeat_after_one_another():
    schema = {"type": "object", "minProperties": 1, "allOf": [
        {"type": "object", "patternProperties": {"a": {"type": "number", "minimum": 10}}},
        {"type": "object", "patternProperties": {"b": {"type": "number", "minimum": 3}}}]}
    assert accepts(schema, '{"a": 15, "b": 5}') and accepts(schema, '{"b": 5, "a": 15}')
    assert not accepts(schema, '{"a": 15, "b": 1}') and not accepts(schema, "{}")


# --- a pattern that finds every key, beside declared properties (WashingtonPost---wp_65) ------
def test_catch_all_pattern_properties_write_keys_other_than_the_declared_ones():
    schema = {"type": "object", "properties": {"basic": {"type": "string"}}, "required": ["basic"],
              "patternProperties": {".*": {"type": "string"}}}
    assert accepts(schema, '{"basic": "a", "additional": "b", "more": "c"}')
    assert not accepts(schema, '{"basic": "a", "basic": "b"}')  # no duplicate of the declared key
    assert not accepts(schema, '{"basic": "a", "additional": 1}')  # the pattern's schema holds
    narrow = {"type": "object", "properties": {"ab": {}}, "patternProperties": {"^a": {}}}
    assert accepts(narrow, '{"ab": 1, "ax": 2}')  # the pattern's keys other than "ab"
    assert not accepts(narrow, '{"ab": 1, "ab": 2}')


# --- contains on a plain item list (Handwritten---itemscontains2) -------------------------------
def test_contains_needs_one_matching_item_anywhere():
    schema = {"type": "array", "items": {"type": ["string", "integer"]}, "contains": {"type": "integer", "minimum": 5}}
    assert relaxed(schema) == []
    assert accepts(schema, '["a", 7, "b"]') and accepts(schema, "[9]") and accepts(schema, '[1, "x", 5]')
    assert not accepts(schema, '["a", 1]') and not accepts(schema, "[]") and not accepts(schema, '[true, 7]')
    any_items = {"type": "array", "contains": {"const": "x"}}
    assert accepts(any_items, '[{"a": 1}, "x"]') and not accepts(any_items, '[{"a": 1}]')
    with pytest.raises(UnsupportedSchema, match="unsatisfiable"):
        schema_to_regex({"type": "array", "items": {"type": "string"}, "contains": {"type": "integer"}})
    counted = {"type": "array", "contains": {"type": "integer"}, "maxItems": 3}
    assert relaxed(counted) == [("", "contains")]  # with an item bound: left to the validator


# --- allOf with an anyOf of two branches and a oneOf beside it (Github_ultra---o62897) --------
def test_all_of_merging_an_any_of_and_a_one_of_crosses_every_branch():
    schema = {"allOf": [{"anyOf": [{"type": "integer"}, {"type": "string"}]},
                        {"oneOf": [{"type": "integer", "minimum": 3}, {"type": "string", "maxLength": 2},
                                   {"type": "boolean"}]}]}
    # the oneOf is kept whole inside each anyOf branch, where one of its branches has that branch's type: exact
    assert relaxed(schema) == []
    overlapping = {"allOf": [schema["allOf"][0], {"oneOf": [{"type": "integer", "minimum": 3}, {"maximum": 5}]}]}
    assert relaxed(overlapping) == []  # 3..5 are in both: written exactly by negation, per anyOf branch
    for text in ("1", "2", "3", "5", "6", "9", '"a"', "true"):
        assert accepts(overlapping, text) == jsonschema.Draft202012Validator(overlapping).is_valid(json.loads(text)), text
    for good, bad in (('5', '1'), ('"ab"', '"abc"'), ('3', 'true')):
        assert jsonschema.Draft202012Validator(schema).is_valid(json.loads(good))
        assert not jsonschema.Draft202012Validator(schema).is_valid(json.loads(bad))
        assert accepts(schema, good) and not accepts(schema, bad), (good, bad)


# --- keywords beside a $ref do not apply in drafts 3-7 (JsonSchemaStore---briefcase-schema) -----
_PROPERTY = {"anyOf": [{"type": "string"}, {"type": "object", "properties": {"key": {"type": "string"}}}]}


@pytest.mark.parametrize("draft", ["http://json-schema.org/draft-04/schema#", "http://json-schema.org/draft-06/schema#",
                                   "http://json-schema.org/draft-07/schema#", "http://json-schema.org/draft-07/schema"])
def test_ref_siblings_are_ignored_in_drafts_before_2019_09(draft):
    schema = {"$schema": draft, "definitions": {"property": _PROPERTY}, "type": "object",
              "properties": {"secrettype": {"$ref": "#/definitions/property", "enum": ["key", "sas"],
                                            "uniqueItems": True}}}
    value = {"secrettype": {"key": "key"}}  # breaks the sibling enum, which the draft ignores
    assert jsonschema.validators.validator_for(schema)(schema).is_valid(value)
    assert accepts(schema, value) and accepts(schema, {"secrettype": "other"})
    assert not accepts(schema, {"secrettype": 3})  # the target still holds
    assert relaxed(schema) == []  # an ignored sibling is not listed as relaxed either


@pytest.mark.parametrize("draft", [None, "https://json-schema.org/draft/2019-09/schema",
                                   "https://json-schema.org/draft/2020-12/schema"])
def test_ref_siblings_apply_from_2019_09_and_by_default(draft):
    schema = {"$defs": {"property": _PROPERTY}, "type": "object",
              "properties": {"secrettype": {"$ref": "#/$defs/property", "enum": ["key", "sas"]}}}
    if draft:
        schema["$schema"] = draft
    assert not jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)(
        schema).is_valid({"secrettype": {"key": "key"}})
    assert not accepts(schema, {"secrettype": {"key": "key"}}) and not accepts(schema, {"secrettype": "other"})
    assert accepts(schema, {"secrettype": "sas"})


def test_ignored_ref_siblings_under_all_of_and_in_the_renderer():
    """allOf merging follows a $ref through `flatten`, the renderer through `effective`: both drop
    draft-7 siblings (here a sibling `properties` that would reorder and close the object)."""
    schema = {"$schema": "http://json-schema.org/draft-07/schema#",
              "definitions": {"pair": {"type": "object", "properties": {"a": {"type": "integer"},
                                                                        "b": {"type": "integer"}}}},
              "allOf": [{"$ref": "#/definitions/pair", "properties": {"b": {"type": "string"}}}]}
    value = {"b": 2, "a": 1}
    assert grammar_dumps(value, schema) == '{"a": 1, "b": 2}'
    assert accepts(schema, value) and not accepts(schema, {"a": 1, "b": "x"})


# --- an integral enum/const number in either spelling (JSON Schema compares numbers by value) ---
def test_integral_enum_and_const_numbers_match_with_or_without_a_fraction():
    schema = {"enum": [1.0, -3, True, 0.5, {"a": 2.0}]}
    validator = jsonschema.Draft202012Validator(schema)
    for text in ("1", "1.0", "-3", "-3.0", "true", "0.5", '{"a": 2}', '{"a": 2.0}'):
        assert validator.is_valid(json.loads(text)) and accepts(schema, text), text
    for text in ("1.5", "2", "1.00", "01", "0.50", '{"a": 3}'):
        assert not accepts(schema, text), text
    assert accepts({"const": 7}, "7.0") and not accepts({"const": 7}, "70")
    assert accepts({"type": "integer", "enum": [2, 4]}, 4.0)  # the renderer writes 4; the grammar takes it


# --- the renderer picks union branches without re's backtracking on long branch regexes ---------
def test_render_long_branch_uses_the_byte_dfa():
    from surecall.grammars.schema import render

    words = [f"w{i:05d}" for i in range(1500)]  # an enum branch regex well past 10k characters
    schema = {"anyOf": [{"type": "object", "properties": {"a": {"enum": words}}, "required": ["a"]},
                        {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]}]}
    long_regex = render._Renderer(schema, GrammarOptions()).conv.convert(schema["anyOf"][0], "")
    assert len(long_regex) > render._RE_MAX_CHARS
    matches = render._matcher(long_regex)
    assert matches('{"a": "w01499"}') and not matches('{"a": "w01500"}')
    assert render.grammar_dumps({"b": 3}, schema) == '{"b": 3}'
    assert render.grammar_dumps({"a": "w00007"}, schema) == '{"a": "w00007"}'
    assert render._matcher("(?=x{20000})" + "x" * 20000) is None  # a long lookahead: neither is safe


def test_triggers_asking_for_the_same_names_share_one_branch_pair():
    # Glaiveai2K calculate_area_518cb15d: four triggers (past MAX_TRIGGERS), two of them asking for "triangle"
    props = {n: {"type": "number"} for n in ("base", "height", "length", "radius", "width")}
    schema = {"type": "object", "properties": props, "required": ["length", "width"],
              "dependencies": {"base": ["triangle"], "height": ["triangle"], "radius": ["circle"], "shape": ["rectangle"]}}
    assert relaxed(schema) == []
    assert accepts(schema, {"length": 1, "width": 2})
    assert accepts(schema, {"base": 1, "height": 2, "length": 1, "width": 2, "triangle": 0})
    for bad in ({"base": 1, "length": 1, "width": 2}, {"height": 1, "length": 1, "width": 2},
                {"length": 1, "radius": 2, "width": 2, "triangle": 0}):
        assert not accepts(schema, bad)
    vocab, rng = _digit_vocab(), np.random.default_rng(3)
    table = compile_schema(schema, vocab, use_cache=False)
    validator = jsonschema.Draft7Validator(schema)
    texts = [decode(vocab, random_walk(table, vocab, rng, max_tokens=300)).decode() for _ in range(40)]
    assert all(validator.is_valid(json.loads(text)) for text in texts), texts
