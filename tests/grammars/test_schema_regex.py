"""schema_to_regex: each keyword enforced or listed, every error typed, JSONSchemaBench instances."""

from __future__ import annotations

import json
import math
import random
import re
from decimal import Decimal

import pytest

from surecall.errors import CompileBudgetExceeded, SchemaError, UnsupportedSchema
from surecall.grammars.options import GrammarOptions
from surecall.grammars.schema.pattern import PatternUnsupported, translate_pattern
from surecall.grammars.schema.ranges import integer_range_regex, number_range_regex
from surecall.grammars.schema.render import grammar_dumps
from surecall.grammars.schema.string_formats import STRING_FORMATS
from surecall.grammars.schema.to_regex import expand_counts, expand_marks, schema_to_regex
from surecall.tools.catalog import hardened_seed_tools as seed_tools

PLAIN = GrammarOptions(counted_lengths=False, free_form_stack=False)  # outlines-core over 95 characters: no marks


def accepts(schema, value_or_text, options=None) -> bool:
    options = options or GrammarOptions()
    regex = expand_marks(schema_to_regex(schema, options).regex, options.whitespace_regex())
    text = value_or_text if isinstance(value_or_text, str) else grammar_dumps(value_or_text, schema, options)
    return re.fullmatch(regex, text) is not None


def relaxed(schema, options=None) -> list[tuple[str, str]]:
    return schema_to_regex(schema, options or GrammarOptions()).relaxed


# --- options ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"whitespace": "lots"}, "Invalid whitespace"),
        ({"max_whitespace": -1}, "Invalid max_whitespace"),
        ({"whitespace_chars": "x"}, "Invalid whitespace_chars"),
        ({"max_bounded_length": 0}, "Invalid max_bounded_length"),
        ({"max_ref_depth": True}, "Invalid max_ref_depth"),
        ({"allow_additional_properties": "yes"}, "Invalid allow_additional_properties"),
        ({"time_budget_s": 0}, "Invalid time_budget_s"),
        ({"memory_budget_bytes": 10}, "Invalid memory_budget_bytes"),
        ({"max_regex_length": 5}, "Invalid max_regex_length"),
    ],
)
def test_options_reject_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GrammarOptions(**kwargs)


def test_cache_key_is_stable_and_distinguishes_options():
    assert GrammarOptions().cache_key() == GrammarOptions().cache_key()
    assert GrammarOptions().cache_key() != GrammarOptions(max_bounded_length=16).cache_key()
    json.loads(GrammarOptions().cache_key())


def test_whitespace_policies():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert accepts(schema, '{"a": 1}') and accepts(schema, '{"a":1}')
    assert not accepts(schema, '{"a":  1}')  # at most one space by default
    assert not accepts(schema, '{"a":\n1}')
    none = GrammarOptions(whitespace="none")
    assert accepts(schema, '{"a":1}', none) and not accepts(schema, '{"a": 1}', none)
    free = GrammarOptions(whitespace="free", whitespace_chars=" \n")
    assert accepts(schema, '{\n  "a":   1\n}', free)
    bounded = GrammarOptions(max_whitespace=2)
    assert accepts(schema, '{"a":  1}', bounded) and not accepts(schema, '{"a":   1}', bounded)


# --- scalar types ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "schema, good, bad",
    [
        ({"type": "boolean"}, ["true", "false"], ["1", '"true"']),
        ({"type": "null"}, ["null"], ["0", '""']),
        ({"type": "integer"}, ["0", "-7", "123"], ["01", "1.5", "-0", "1e3"]),
        ({"type": "number"}, ["0", "-1.25", "3e-7", "2E+10"], ["01", ".5", "1.", "+1", "1e999"]),
        ({"type": "string"}, ['""', '"a\\"b"', '"\\u00e9"', '"\\ud83d\\ude00"'], ['"\\ud83d"', '"a\nb"', '"\\x"']),
        ({"type": ["string", "null"]}, ['"x"', "null"], ["1"]),
        ({"type": "string", "nullable": True}, ['"x"', "null"], ["1"]),
        ({"enum": ["a", 1, None, {"k": [1]}]}, ['"a"', "1", "null", '{"k": [1]}'], ['"b"', "2"]),
        ({"const": "fixed"}, ['"fixed"'], ['"other"']),
        ({"type": "string", "enum": ["a", 2]}, ['"a"'], ["2"]),
    ],
)
def test_scalar_keywords(schema, good, bad):
    for text in good:
        assert accepts(schema, text), text
    for text in bad:
        assert not accepts(schema, text), text


def test_integer_bounds_are_enforced_not_relaxed():
    schema = {"type": "integer", "minimum": -5, "exclusiveMaximum": 12}
    assert relaxed(schema) == []
    assert [n for n in range(-20, 30) if accepts(schema, str(n))] == list(range(-5, 12))
    draft4 = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer",
              "minimum": 3, "exclusiveMinimum": True, "maximum": 5}
    assert [n for n in range(0, 9) if accepts(draft4, str(n))] == [4, 5]


def test_integer_range_regex_against_brute_force():
    rng = random.Random(1234)
    values = range(-1200, 1200)
    for _ in range(300):
        low = rng.choice([None, rng.randint(-1100, 1100), rng.randint(-12, 12)])
        high = rng.choice([None, rng.randint(-1100, 1100), rng.randint(-12, 12)])
        regex = integer_range_regex(low, high)
        if low is not None and high is not None and low > high:
            assert regex is None
            continue
        compiled = re.compile(regex)
        for n in values:
            expected = (low is None or n >= low) and (high is None or n <= high)
            assert bool(compiled.fullmatch(str(n))) == expected, (low, high, n, regex)
        assert not compiled.fullmatch("-0") and not compiled.fullmatch("007")


def test_long_bounds_are_relaxed_and_a_long_multiple_of_narrowed():
    schema = {"type": "object", "properties": {"x": {"type": "number", "minimum": 1.5, "maximum": 2.0000000000001},
                                               "y": {"type": "integer", "multipleOf": 11}}, "required": ["x"]}
    assert set(relaxed(schema)) == {("/properties/x", "minimum"), ("/properties/x", "maximum")}
    assert ("/properties/y", "multipleOf") in schema_to_regex(schema).narrowed


def test_integral_number_bounds_are_enforced():
    schema = {"type": "number", "minimum": -1, "exclusiveMaximum": 2}
    assert relaxed(schema) == []
    good = ["-1", "-1.0", "-0.5", "0", "1.999", "1"]
    bad = ["-1.01", "2", "2.0", "-0", "1e0", "3"]
    assert all(accepts(schema, t) for t in good) and not any(accepts(schema, t) for t in bad)
    draft4 = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "number",
              "minimum": 0, "exclusiveMinimum": True}
    assert accepts(draft4, "0.1") and not accepts(draft4, "0") and not accepts(draft4, "0.0")


def test_number_range_regex_against_decimal_comparison():
    rng = random.Random(99)
    texts = sorted({f"{i}{f}" for i in range(-12, 13) for f in ("", ".0", ".5", ".05", ".999")})
    for _ in range(200):
        low, high = rng.choice([None, rng.randint(-10, 10)]), rng.choice([None, rng.randint(-10, 10)])
        low_excl, high_excl = rng.random() < 0.5, rng.random() < 0.5
        regex = number_range_regex(low, high, low_excl, high_excl)
        for text in texts:
            value = Decimal(text)
            expected = (low is None or (value > low if low_excl else value >= low)) and (
                high is None or (value < high if high_excl else value <= high))
            expected = expected and not (text.startswith("-0") and value == 0)
            assert bool(regex and re.fullmatch(regex, text)) == expected, (low, high, text, regex)


def test_number_range_regex_with_decimal_bounds():
    rng = random.Random(11)

    def decimal_text() -> str:
        frac = "".join(rng.choice("0123456789") for _ in range(rng.randint(0, 4)))
        return f"{rng.randint(-30, 30)}" + (f".{frac}" if frac else "")

    for _ in range(600):
        low, high = [None if rng.random() < 0.2 else Decimal(decimal_text()) for _ in range(2)]
        low_excl, high_excl = rng.random() < 0.5, rng.random() < 0.5
        places = rng.choice([None, 0, 1, 2, 3])  # at most this many fraction digits: multipleOf 10^-places
        regex = number_range_regex(low, high, low_excl, high_excl, places)
        texts = [decimal_text() for _ in range(20)] + [str(b) for b in (low, high) if b is not None]
        for text in texts:
            value = Decimal(text)
            if text.startswith("-0") and value == 0:
                continue
            expected = (low is None or (value > low if low_excl else value >= low)) and (
                high is None or (value < high if high_excl else value <= high))
            expected = expected and (places is None or (value * 10**places) % 1 == 0)
            assert bool(regex and re.fullmatch(regex, text)) == expected, (low, high, low_excl, high_excl, places, text)


def test_fractional_number_bounds_are_enforced():
    cpus = {"type": "number", "minimum": 0.1}
    assert relaxed(cpus) == []
    assert accepts(cpus, "0.1") and accepts(cpus, "0.10") and accepts(cpus, "12") and accepts(cpus, "0.15")
    assert not accepts(cpus, "0.05") and not accepts(cpus, "0") and not accepts(cpus, "-1")
    latitude = {"type": "number", "minimum": 78.55, "maximum": 79.3333}
    assert relaxed(latitude) == []
    assert accepts(latitude, "78.55") and accepts(latitude, "79") and accepts(latitude, "79.3333")
    assert not accepts(latitude, "78.549") and not accepts(latitude, "79.33331") and not accepts(latitude, "80")
    draft4 = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "number", "maximum": 0.5,
              "exclusiveMaximum": True}
    assert accepts(draft4, "0.4999") and not accepts(draft4, "0.5") and relaxed(draft4) == []
    tiny = {"type": "number", "minimum": 1e-20}  # past MAX_BOUND_FRACTION_DIGITS: left to the validator
    assert relaxed(tiny) == [("", "minimum")]


# --- strings ---------------------------------------------------------------------------------
def test_small_length_bounds_are_exact_large_ones_relaxed():
    small = {"type": "string", "minLength": 2, "maxLength": 3}
    assert relaxed(small) == []
    assert [accepts(small, json.dumps("x" * n)) for n in range(5)] == [False, False, True, True, False]
    assert accepts(small, '"\\n\\u00e9"')  # escapes count as one character
    big = {"type": "string", "minLength": 1, "maxLength": 8192}
    assert relaxed(big) == []  # counted (grammars/counted.py)
    assert accepts(big, json.dumps("x" * 8192)) and not accepts(big, json.dumps("x" * 8193))
    assert not accepts(big, '""') and accepts(big, json.dumps("\u00e9\n" * 4096))
    assert relaxed(big, PLAIN) == [("", "maxLength")]
    assert not accepts(big, '""', PLAIN) and accepts(big, json.dumps("y" * 9000), PLAIN)


def test_min_length_above_the_patterns_own_is_enforced():
    slug = {"type": "string", "pattern": "^[a-z]+(?:-[a-z0-9]+)*$", "minLength": 3}
    assert relaxed(slug) == []
    assert [accepts(slug, t) for t in ('"ab"', '"abc"', '"a-b"', '"a-"', '"abcdefghijk"')] == [
        False, True, True, False, True]
    tel = {"type": "string", "minLength": 10, "maxLength": 13, "pattern": "^[0-9]{2,5}-?[0-9]{1,4}-?[0-9]{4}$"}
    assert relaxed(tel) == []
    assert [accepts(tel, t) for t in ('"03-1234-5678"', '"031234567"', '"0312345678"', '"03-1234-56789"')] == [
        True, False, True, False]
    long = {"type": "string", "pattern": "^a", "minLength": 65}  # past MAX_FOLDED_LENGTH: left to the validator
    assert relaxed(long) == [("", "minLength")]


def test_pattern_is_enforced_with_search_semantics():
    schema = {"type": "string", "pattern": "[0-9]{3}"}
    assert accepts(schema, '"ab123cd"') and not accepts(schema, '"ab12cd"')
    anchored = {"type": "string", "pattern": "^[a-z]+(-[a-z]+)*$"}
    assert accepts(anchored, '"foo-bar"') and not accepts(anchored, '"foo-"') and relaxed(anchored) == []
    grouped = {"type": "string", "pattern": "^$|(^[a-z]+$)"}  # anchors inside a whole-branch group
    assert accepts(grouped, '""') and accepts(grouped, '"ab"') and not accepts(grouped, '"a1"')
    assert relaxed(grouped) == []
    quote = {"type": "string", "pattern": '^a"b\\\\$'}
    assert accepts(quote, json.dumps('a"b\\'))


def test_pattern_with_length_keeps_pattern_and_counts_max_length():
    schema = {"type": "string", "pattern": "^[a-z]+-x$", "maxLength": 4}
    assert relaxed(schema) == []
    assert not accepts(schema, '"ABC-x"') and accepts(schema, '"ab-x"') and not accepts(schema, '"abc-x"')


def test_one_quantified_set_pattern_enforces_the_length_too():
    schema = {"type": "string", "pattern": "^[a-z]+$", "maxLength": 4}
    assert relaxed(schema) == []
    assert accepts(schema, '"abcd"') and not accepts(schema, '"abcde"') and not accepts(schema, '"ABC"')


@pytest.mark.parametrize("pattern", ["(?=a)b", "\\bword", "(a)\\1", "a(?!b)c", "\\p{L}+", "^x{,2}$", "^[]a]$",
                                     "^[^]$", "\\cJ"])
def test_untranslatable_pattern_is_relaxed_never_dropped(pattern):
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}}
    assert ("/properties/s", "pattern") in relaxed(schema)
    with pytest.raises(PatternUnsupported, match="pattern"):
        translate_pattern(pattern, 48)


def test_long_repetition_in_pattern_is_widened_and_listed():
    schema = {"type": "string", "pattern": "^[a-z]{1,500}-$"}  # one quantified set alone is counted instead
    assert relaxed(schema) == [("", "pattern")]
    assert accepts(schema, json.dumps("a" * 600 + "-")) and not accepts(schema, '"A-"')
    whole = {"type": "string", "pattern": "^[a-z]{1,500}$"}
    assert relaxed(whole) == [] and accepts(whole, json.dumps("a" * 500)) and not accepts(whole, json.dumps("a" * 501))


@pytest.mark.parametrize(
    "fmt, good, bad",
    [
        ("date", ["2024-02-29", "1999-12-31"], ["2023-02-29", "2024-13-01", "0000-01-01"]),
        ("date-time", ["2024-01-01T12:30:00Z", "2024-01-01T00:00:00.5+05:30"], ["2024-01-01 12:30:00"]),
        ("time", ["23:59:59Z"], ["24:00:00Z"]),
        ("uuid", ["123e4567-e89b-12d3-a456-426614174000"], ["123e4567e89b12d3a456426614174000"]),
        ("ipv4", ["192.168.0.1"], ["256.1.1.1", "01.1.1.1"]),
        ("ipv6", ["::1", "2001:db8::ff00:42:8329"], ["1:2:3"]),
        ("email", ["a.b@example.com"], ["no-at-sign"]),
        ("hostname", ["api.example.com", "a-b-c.example.com"], ["-bad.com", "ab--cd.com"]),
        ("uri", ["https://example.com/a?b=c#d"], ["not a uri"]),
    ],
)
def test_known_formats_are_enforced(fmt, good, bad):
    schema = {"type": "string", "format": fmt}
    assert relaxed(schema) == []
    for text in good:
        assert accepts(schema, json.dumps(text)), text
    for text in bad:
        assert not accepts(schema, json.dumps(text)), text


@pytest.mark.parametrize("fmt", sorted(STRING_FORMATS))
def test_format_regexes_only_produce_valid_strings(fmt):
    """Random walks through each format regex satisfy jsonschema-rs's format check."""
    import jsonschema_rs
    from outlines_core import Index, Vocabulary

    eos = 200
    index = Index(STRING_FORMATS[fmt], Vocabulary(eos, {chr(b): [b] for b in range(32, 127)}))
    validator = jsonschema_rs.validator_for({"format": fmt}, validate_formats=True)
    rng = random.Random(fmt)
    finished = 0
    for _ in range(300):
        state, text = index.get_initial_state(), []
        while len(text) < 200 and not (index.is_final_state(state) and rng.random() < 0.1):
            allowed = [t for t in index.get_allowed_tokens(state) if t != eos]
            if not allowed:
                break
            text.append(chr(rng.choice(allowed)))
            state = index.get_next_state(state, ord(text[-1]))
        if index.is_final_state(state):
            finished += 1
            assert validator.is_valid("".join(text)), "".join(text)
    assert finished >= 100


def test_a_defined_format_without_a_regex_is_relaxed_and_listed():
    assert relaxed({"type": "string", "format": "regex"}) == [("", "format")]


def test_a_format_no_draft_defines_is_an_annotation():
    """JSON Schema validators ignore an unknown format (jsonschema-rs with formats checked too),
    so leaving the string free enforces everything: nothing is listed."""
    import jsonschema_rs

    schema = {"type": "string", "format": "non-blank"}
    assert relaxed(schema) == []
    assert jsonschema_rs.validator_for(schema, validate_formats=True).is_valid("")
    assert accepts(schema, '""') and accepts(schema, '" x"')
    beside = {"allOf": [{"type": "string", "format": "non-blank"}, {"format": "ipv4"}]}  # merged: ipv4 holds
    assert relaxed(beside) == [] and accepts(beside, '"10.0.0.1"') and not accepts(beside, '"x"')
    two = {"allOf": [{"type": "string", "format": "ipv4"}, {"format": "email"}]}  # two defined formats: listed
    assert relaxed(two) == [("/allOf/1", "format")]


# --- objects and arrays ----------------------------------------------------------------------
def test_object_declared_order_required_optional_closed():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
                                               "c": {"type": "boolean"}}, "required": ["b"]}
    assert accepts(schema, '{"b": "x"}') and accepts(schema, '{"a": 1, "b": "x", "c": true}')
    assert not accepts(schema, '{"a": 1}')  # b required
    assert not accepts(schema, '{"b": "x", "a": 1}')  # declared order
    assert not accepts(schema, '{"b": "x", "z": 1}')  # closed by default
    opened = GrammarOptions(allow_additional_properties=True)
    assert accepts(schema, '{"b": "x", "z": 1}', opened)
    assert not accepts(schema, '{"b": "x", "a": 1}', opened)  # declared names are not "extra"
    assert accepts({"type": "object"}, '{"free": [1, {"x": null}]}')  # free-form object


def test_required_property_matched_by_pattern_properties():
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "additionalProperties": False,
              "patternProperties": {"^line[1-3]$": {"type": "string"}}, "required": ["city", "line1"]}
    assert accepts(schema, '{"city": "a", "line1": "b"}') and not accepts(schema, '{"city": "a", "line1": 3}')
    # the pattern's other keys follow the declared ones; line1 (declared by required) never repeats
    assert accepts(schema, '{"city": "a", "line1": "b", "line2": "c"}')
    assert not accepts(schema, '{"city": "a", "line1": "b", "line1": "c"}')
    assert not accepts(schema, '{"city": "a", "line1": "b", "line4": "c"}')
    assert relaxed(schema) == []


def test_object_relaxed_keywords_carry_pointers():
    schema = {"type": "object", "properties": {"o": {
        "type": "object", "patternProperties": {"^x": {}}, "propertyNames": {"maxLength": 3},
        "minProperties": 2, "unevaluatedProperties": False}}}
    assert set(relaxed(schema)) == {("/properties/o", k) for k in  # pattern keys meet propertyNames too
                                    ("minProperties", "unevaluatedProperties")}
    exact = {"type": "object", "properties": {"a": {}, "b": {}}, "required": ["a"],
             "minProperties": 1, "maxProperties": 2}
    assert relaxed(exact) == []


def test_arrays_items_prefix_items_and_bounds():
    schema = {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3}
    assert [accepts(schema, json.dumps(list(range(n)))) for n in range(5)] == [False, True, True, True, False]
    tup = {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False}
    assert accepts(tup, '["a", 1]') and accepts(tup, '["a"]') and not accepts(tup, '["a", 1, 2]')
    assert not accepts(tup, "[1]")
    big = {"type": "array", "maxItems": 1000, "uniqueItems": True, "contains": {"type": "integer"}}
    assert set(relaxed(big)) == {("", "uniqueItems"), ("", "contains")}  # maxItems: an item counter
    counted = {"type": "array", "items": {"type": "integer"}, "minItems": 10, "maxItems": 1000}
    assert [accepts(counted, json.dumps(list(range(n)))) for n in (9, 10, 1000, 1001)] == [False, True, True, False]
    assert set(relaxed(big, PLAIN)) == {("", "maxItems"), ("", "uniqueItems"), ("", "contains")}


def test_not_of_a_type_and_enum_filters_are_enforced():
    not_null = {"type": ["string", "null"], "not": {"type": "null"}}
    assert relaxed(not_null) == [] and accepts(not_null, '"a"') and not accepts(not_null, "null")
    filtered = {"allOf": [{"enum": [{"a": 1}, {"a": "x"}]}, {"not": {"properties": {"a": {"type": "string"}}}}]}
    assert relaxed(filtered) == [] and accepts(filtered, '{"a": 1}') and not accepts(filtered, '{"a": "x"}')
    not_integer = {"type": "number", "not": {"type": "integer"}}  # fractions (schema/conditionals.py)
    assert relaxed(not_integer) == [] and accepts(not_integer, "1.5")
    assert not accepts(not_integer, "1") and not accepts(not_integer, "1.0")
    bounded = {"type": "number", "minimum": 0, "not": {"type": "integer"}}
    assert relaxed(bounded) == [("", "not")]


def test_generic_relaxed_keywords_are_listed():
    schema = {"type": "object", "properties": {
        "n": {"not": {"format": "email"}}, "i": {"if": {"uniqueItems": True}, "then": {"minItems": 3}}}}
    assert set(relaxed(schema)) == {("/properties/n", "not"), ("/properties/i", "if")}
    reasons = schema_to_regex(schema).reasons
    assert "'format'" in reasons[("/properties/n", "not")] and "'uniqueItems'" in reasons[("/properties/i", "if")]


def test_an_if_on_multiple_of_is_enforced_by_the_number_algebra():
    schema = {"type": "integer", "if": {"multipleOf": 3}, "then": {"minimum": 1}}
    assert relaxed(schema) == []
    assert all(accepts(schema, str(n)) for n in (3, 6, 1, 2, -1, -2))
    assert not any(accepts(schema, str(n)) for n in (0, -3, -6))


# --- combinators and references --------------------------------------------------------------
def test_any_of_one_of_all_of():
    any_of = {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 2}]}
    assert accepts(any_of, "5") and accepts(any_of, '"ab"') and not accepts(any_of, '"abc"')
    assert relaxed({"oneOf": [{"type": "integer"}, {"type": "string"}]}) == []
    odd = {"oneOf": [{"type": "integer"}, {"type": "number", "multipleOf": 2}]}  # by remainders (schema/regular.py)
    assert relaxed(odd) == [] and accepts(odd, "3") and not accepts(odd, "4") and not accepts(odd, "1.5")
    tagged = {"oneOf": [
        {"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}}, "required": ["kind"]},
        {"type": "object", "properties": {"kind": {"const": "b"}}, "required": ["kind"]}]}
    assert relaxed(tagged) == []
    by_required = {"oneOf": [
        {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
        {"type": "object", "properties": {"b": {"type": "string"}}, "required": ["b"]}]}
    assert relaxed(by_required) == []
    open_objects = GrammarOptions(allow_additional_properties=True)  # overlap: made exclusive (schema/conditionals.py)
    assert relaxed(by_required, open_objects) == []
    assert accepts(by_required, '{"a": "x", "c": 1}', open_objects) and accepts(by_required, '{"b": "y"}', open_objects)
    assert not accepts(by_required, '{"a": "x", "b": "y"}', open_objects)
    undeclared = {"oneOf": [{"type": "object", "properties": {"a": {}}, "required": ["a", "b"]},
                            {"type": "object", "properties": {"b": {}}, "required": ["b"]}]}
    assert relaxed(undeclared) == [] and accepts(undeclared, '{"b": 2}') and not accepts(undeclared, '{"a": 1, "b": 2}')
    overlapping = {"oneOf": [{"type": "object", "properties": {"a": {"type": "string"}}},
                             {"type": "object", "properties": {"b": {"type": "string"}}}]}
    assert relaxed(overlapping) == [] and not accepts(overlapping, "{}") and not accepts(overlapping, '{"a": "x"}')
    assert accepts(overlapping, '{"a": "x", "b": 1}')  # b breaks only the second branch
    all_of = {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                        {"properties": {"b": {"type": "string"}}, "required": ["b"]}]}
    assert accepts(all_of, '{"a": 1, "b": "x"}') and not accepts(all_of, '{"a": 1}')
    bounds = {"allOf": [{"type": "integer", "minimum": 0}, {"maximum": 9}]}
    assert accepts(bounds, "9") and not accepts(bounds, "10")


def test_all_of_additional_properties_cover_names_other_branches_declare():
    # Handwritten---pp2: "ab" is additional for the first branch (it only matches the second's pattern).
    by_pattern = {"type": "object", "required": ["ab"], "allOf": [
        {"additionalProperties": {"type": "array", "minItems": 2}},
        {"patternProperties": {"a": {"type": "array"}}}]}
    assert accepts(by_pattern, '{"ab": [1, 2]}') and not accepts(by_pattern, '{"ab": [1]}')
    closed = {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False},
                        {"properties": {"b": {"type": "integer"}}}]}
    assert accepts(closed, '{"a": 1}') and not accepts(closed, '{"b": 1}')
    # Handwritten---mod301: the second branch's additionalProperties reach "a", declared by the first.
    nested = {"allOf": [{"type": "object", "properties": {"a": {"type": "object"}}, "additionalProperties": False},
                        {"additionalProperties": {"minProperties": 1}}]}
    assert accepts(nested, '{"a": {"x": 1}}') and not accepts(nested, '{"a": {}}')


def test_all_of_merges_pattern_properties_and_points_at_the_branch():
    both = {"type": "object", "required": ["ab"], "allOf": [
        {"patternProperties": {"a": {"type": "integer", "minimum": 0}}},
        {"patternProperties": {"b": {"type": "integer", "maximum": 5}}}]}
    assert accepts(both, '{"ab": 3}') and not accepts(both, '{"ab": 6}') and not accepts(both, '{"ab": -1}')
    step = {"$ref": "#/$defs/x", "$defs": {"x": {"type": "object", "required": ["ab"], "allOf": [
        {"patternProperties": {"a": {"type": "number", "multipleOf": 1e-13}}}]}}}  # 13 fraction digits: relaxed
    assert ("/$defs/x/allOf/0/patternProperties/a", "multipleOf") in relaxed(step)


def test_declared_property_also_takes_matching_pattern_properties():
    schema = {"type": "object", "properties": {"ab": {"type": "integer"}},
              "patternProperties": {"^a": {"minimum": 0}}, "required": ["ab"]}
    assert accepts(schema, '{"ab": 0}') and not accepts(schema, '{"ab": -1}')


def test_refs_defs_definitions_and_recursion():
    schema = {"$defs": {"pos": {"type": "integer", "minimum": 1}},
              "definitions": {"name": {"type": "string"}},
              "type": "object", "properties": {"n": {"$ref": "#/$defs/pos"}, "s": {"$ref": "#/definitions/name"}},
              "required": ["n"]}
    assert accepts(schema, '{"n": 3, "s": "x"}') and not accepts(schema, '{"n": 0}')
    tree = {"$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["v"]}}, "$ref": "#/$defs/node"}
    options = GrammarOptions(max_ref_depth=2)
    assert accepts(tree, '{"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}]}', options)
    assert not accepts(tree, '{"v": 1, "kids": [{"v": 2, "kids": [{"v": 3, "kids": [{"v": 4}]}]}]}', options)


def test_relaxed_pointer_of_a_referenced_keyword_names_its_definition():
    schema = {"$defs": {"s": {"type": "string", "maxLength": 5000}}, "type": "object",
              "properties": {"a": {"$ref": "#/$defs/s"}}}
    assert relaxed(schema, PLAIN) == [("/$defs/s", "maxLength")]


# --- errors ----------------------------------------------------------------------------------
def test_invalid_schema_raises_schema_error_with_pointer_and_keyword():
    with pytest.raises(SchemaError, match=r"at /properties/a/type") as info:
        schema_to_regex({"type": "object", "properties": {"a": {"type": "strin"}}})
    assert info.value.pointer == "/properties/a/type" and info.value.keyword == "type"
    with pytest.raises(SchemaError, match="minLength"):
        schema_to_regex({"type": "string", "minLength": -1})
    with pytest.raises(SchemaError, match="must be an object or a boolean"):
        schema_to_regex([1, 2])
    with pytest.raises(SchemaError, match="does not resolve"):
        schema_to_regex({"$ref": "#/$defs/missing"})


@pytest.mark.parametrize(
    "schema, match",
    [
        (False, "unsatisfiable"),
        ({"enum": []}, "unsatisfiable"),
        ({"type": "string", "enum": [1, 2]}, "unsatisfiable"),
        ({"type": "integer", "minimum": 5, "maximum": 4}, "unsatisfiable"),
        ({"$ref": "https://example.com/s.json"}, "only local references"),
        ({"$dynamicRef": "#meta"}, "dynamic references"),
        ({"$schema": "http://json-schema.org/draft-07/schema#",  # tuple `items` of two lengths
          "allOf": [{"items": [{}]}, {"items": [{}, {}]}]}, "cannot be merged"),
    ],
)
def test_unsupported_schemas_raise_with_keyword(schema, match):
    with pytest.raises(UnsupportedSchema, match=match):
        schema_to_regex(schema)


def test_a_keyword_that_restricts_nothing_implies_no_type():
    """`items: {properties: {}}` (Github_hard o60168, its items strings): every type, as a validator reads it."""
    import jsonschema_rs

    schema = {"type": "array", "items": {"properties": {}, "required": []}}
    regex = expand_marks(schema_to_regex(schema).regex)
    validator = jsonschema_rs.validator_for(schema)
    for value in [["nature", "landscape"], [1, None, True], [{}], [{"a": [1]}], [[]]]:
        assert re.fullmatch(regex, json.dumps(value, separators=(",", ":"))) and validator.is_valid(value)
    assert not re.fullmatch(regex, '{"a":1}')
    # a keyword that does restrict still implies its type (the stricter reading, as before)
    assert schema_to_regex({"properties": {"a": {"type": "string"}}}).regex.startswith("\\{")


@pytest.mark.parametrize("schema", [
    {"oneOf": [{"not": {"required": ["error"]}}, {"properties": {"error": False}}]},  # JSONSchemaBench oneof12
    # a required object property that no object satisfies (Github_hard o4851: `required` names an undeclared key)
    {"properties": {"a": {"type": "object", "required": ["id"], "additionalProperties": False}}, "required": ["a"]},
])
def test_an_untyped_schema_only_other_types_satisfy_is_read_as_json_schema_reads_it(schema):
    """With types implied by keywords (an object) nothing matches: every type is read instead, noted."""
    import jsonschema_rs

    result = schema_to_regex(schema)
    assert result.notes and "every type" in result.notes[0]
    validator = jsonschema_rs.validator_for(schema)
    for value in [1, "x", None, [], True, {}, {"error": 1}, {"a": {"id": 1}}]:
        text = json.dumps(value, separators=(",", ":"))
        assert (re.fullmatch(result.regex, text) is not None) == validator.is_valid(value), value
    with pytest.raises(UnsupportedSchema, match="unsatisfiable"):  # typed: nothing to fall back to
        schema_to_regex({**schema, "type": "object"})


@pytest.mark.parametrize("schema, pointer", [
    ({"type": "object", "properties": {"a": {"type": "string", "minLength": 5, "maxLength": 2},
                                       "b": {"type": "integer", "minimum": 3, "maximum": 1}}, "required": ["b"]},
     "/properties/b"),  # the optional `a` matches nothing too, and is left out
    ({"type": "object", "properties": {"o": {"type": "object", "required": ["z"], "additionalProperties": False}},
      "required": ["o"]}, "/properties/o/required"),
    # Glaiveai2K calculate_area: both oneOf branches hold whenever all three are required
    ({"type": "object", "required": ["m"], "properties": {"m": {
        "type": "object", "oneOf": [{"required": ["l", "w"]}, {"required": ["r"]}], "required": ["l", "w", "r"],
        "properties": {k: {"type": "number"} for k in "lwr"}}}}, "/properties/m"),
    ({"type": "integer", "minimum": 3, "maximum": 1}, ""),
])
def test_an_unsatisfiable_schema_names_where_it_fails(schema, pointer):
    with pytest.raises(UnsupportedSchema, match="unsatisfiable") as info:
        schema_to_regex(schema)
    assert info.value.pointer == pointer


@pytest.mark.parametrize("schema", [
    {"allOf": [{"prefixItems": [{"type": "integer"}]}, {"prefixItems": [{"minimum": 1}, {"maximum": 0}]}]},
    {"allOf": [{"prefixItems": [{"type": "integer"}], "items": {"maximum": 3}}, {"prefixItems": [{}, {}, {"minimum": 2}]}]},
    {"allOf": [{"prefixItems": [{"minimum": 3}]}], "items": {"minimum": 5}},  # items covers index 0 too
    {"allOf": [{"prefixItems": [{}], "items": False}, {"prefixItems": [{}, {"type": "integer"}]}]},
])
def test_prefix_items_of_allof_branches_merge_position_by_position(schema):
    """Each branch's `items` starts after its own prefixItems: merged, it is written out at the other's positions."""
    import jsonschema

    regex = re.compile(expand_counts(schema_to_regex(schema).regex))
    validator = jsonschema.Draft202012Validator(schema)
    values = [[], [1], [5], [6], [0, 0], [2, -1], [2, 1], [3, 5], [5, 5], [1, 0, 2], [1, 0, 1], [1, 2, 3, 4], [1.5]]
    assert any(validator.is_valid(v) for v in values) and not all(validator.is_valid(v) for v in values)
    for value in values:
        assert (regex.fullmatch(json.dumps(value)) is not None) == validator.is_valid(value), value


def test_required_recursion_past_the_depth_limit_is_unsupported():
    loop = {"$defs": {"a": {"type": "object", "properties": {"next": {"$ref": "#/$defs/a"}},
                            "required": ["next"]}}, "$ref": "#/$defs/a"}
    with pytest.raises(UnsupportedSchema, match=r"max_ref_depth.*keyword '\$ref'"):
        schema_to_regex(loop)


def test_very_deep_reference_chains_are_unsupported_not_a_crash():
    defs = {f"d{i}": {"type": "object", "properties": {"x": {"$ref": f"#/$defs/d{i + 1}"}}} for i in range(600)}
    defs["d600"] = {"type": "integer"}
    with pytest.raises(UnsupportedSchema, match="nest too deeply"):
        schema_to_regex({"$defs": defs, "$ref": "#/$defs/d0"})


def test_values_nested_past_the_recursion_limit_are_unsupported_without_blaming_a_ref():
    deep = {"type": "integer"}
    for _ in range(400):
        deep = {"type": "array", "items": deep}
    with pytest.raises(UnsupportedSchema, match="nests values too deeply") as err:
        schema_to_regex(deep, splice=True)
    assert err.value.keyword is None  # no $ref in it (the message named one before)


def test_regex_size_limit_is_a_clear_error():
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string", "format": "email"} for i in range(60)}}
    with pytest.raises(UnsupportedSchema, match="max_regex_length"):
        schema_to_regex(wide, GrammarOptions(max_regex_length=10_000))


def test_time_budget_stops_the_walk():
    deep = {"$defs": {"n": {"type": "object", "properties": {
        "a": {"$ref": "#/$defs/n"}, "b": {"$ref": "#/$defs/n"}, "c": {"$ref": "#/$defs/n"}}}}, "$ref": "#/$defs/n"}
    with pytest.raises(CompileBudgetExceeded, match="time_budget_s=1e-06"):
        schema_to_regex(deep, GrammarOptions(time_budget_s=1e-6, max_ref_depth=8))


# --- the seed catalog and the dialect --------------------------------------------------------
def test_seed_catalog_bounds():
    tools = {t["name"]: t["parameters"] for t in seed_tools()}
    bash = schema_to_regex(tools["bash_execute"])
    assert bash.relaxed == []  # maxLength 8192 is counted
    assert ("/properties/command", "maxLength") in schema_to_regex(tools["bash_execute"], PLAIN).relaxed
    assert schema_to_regex(tools["grep_search"]).relaxed == []
    bash_regex = expand_counts(bash.regex)
    for n, ok in [(999, False), (1000, True), (300000, True), (300001, False)]:
        assert bool(re.fullmatch(bash_regex, f'{{"command": "ls", "timeout_ms": {n}}}')) == ok
    for n, ok in [(0, False), (1, True), (8192, True), (8193, False)]:
        assert bool(re.fullmatch(bash_regex, f'{{"command": "{"x" * n}"}}')) == ok
    view = expand_counts(schema_to_regex(tools["file_view"]).regex)
    for n, ok in [(0, False), (1, True), (500, True), (501, False)]:
        assert bool(re.fullmatch(view, f'{{"path": "a", "limit": {n}}}')) == ok
    edit = expand_counts(schema_to_regex(tools["file_edit"]).regex)
    assert not re.fullmatch(edit, '{"path": "a", "old_str": "", "new_str": ""}')  # old_str minLength 1


def test_regexes_build_in_outlines_core():
    from outlines_core import Index, Vocabulary

    vocab = Vocabulary(200, {chr(b): [b] for b in range(32, 127)})
    for tool in seed_tools():
        index = Index(schema_to_regex(tool["parameters"], PLAIN).regex, vocab)
        assert index.get_final_states()


# --- JSONSchemaBench --------------------------------------------------------------------------
def _bench_records(data_dir, subset: str, num: int, seed: int = 0) -> list[dict]:
    path = data_dir / "jsonschemabench" / f"{subset}.jsonl"
    if not path.exists():
        pytest.skip(f"{path} not found")
    records = [json.loads(line) for line in path.read_text().splitlines()]
    random.Random(seed).shuffle(records)
    return [r for r in records if r.get("tests")][:num]


def _compile_or_none(schema, options, max_length=40_000):
    try:
        result = schema_to_regex(schema, options)
    except SchemaError:
        return None
    if len(result.regex) > max_length:  # Python's backtracking re is the bottleneck, not the grammar
        return None
    return result


# Subsets whose valid instances use no undeclared keys, deep free-form values or lax formats:
# the grammar must accept every one of them.
@pytest.mark.parametrize("subset", ["Glaiveai2K", "MCPspec", "Synthesized"])
def test_bench_valid_instances_are_accepted(data_dir, subset):
    options = GrammarOptions()
    checked = 0
    for record in _bench_records(data_dir, subset, 30):
        result = _compile_or_none(record["schema"], options)
        if result is None:
            continue
        compiled = re.compile(expand_counts(result.regex))
        for test in record["tests"]:
            if test["valid"]:
                text = grammar_dumps(test["data"], record["schema"], options)
                assert compiled.fullmatch(text), (record["id"], text)
                checked += 1
    assert checked >= 15


@pytest.mark.slow
@pytest.mark.parametrize("subset", ["Github_easy", "Github_medium", "Kubernetes", "Snowplow", "JsonSchemaStore", "JME"])
def test_bench_valid_instances_mostly_accepted(data_dir, subset):
    """Closed objects and bounded free-form depth reject some valid instances: by design, stricter."""
    options = GrammarOptions(allow_additional_properties=True)
    accepted = total = 0
    for record in _bench_records(data_dir, subset, 40):
        result = _compile_or_none(record["schema"], options, max_length=60_000)
        if result is None:
            continue
        compiled = re.compile(expand_counts(result.regex))
        for test in record["tests"]:
            if test["valid"]:
                total += 1
                accepted += bool(compiled.fullmatch(grammar_dumps(test["data"], record["schema"], options)))
    assert total >= 10 and accepted / total >= 0.7, (accepted, total)


@pytest.mark.parametrize("subset", ["Glaiveai2K", "Github_trivial", "Github_easy", "Kubernetes", "Snowplow"])
def test_bench_invalid_instances_rejected_when_nothing_is_relaxed(data_dir, subset):
    """With nothing relaxed the grammar enforces every keyword: no invalid instance may pass."""
    options = GrammarOptions(allow_additional_properties=True)
    checked = 0
    for record in _bench_records(data_dir, subset, 40, seed=1):
        result = _compile_or_none(record["schema"], options)
        if result is None or result.relaxed:
            continue
        compiled = re.compile(expand_counts(result.regex))
        for test in record["tests"]:
            if not test["valid"]:
                text = grammar_dumps(test["data"], record["schema"], options)
                assert not compiled.fullmatch(text), (record["id"], text)
                checked += 1
    if checked == 0:
        pytest.skip(f"no invalid instances under fully enforced schemas in the {subset} sample")


@pytest.mark.slow
def test_random_walks_through_fully_enforced_regexes_validate(data_dir):
    """Soundness: every text the regex accepts (random walks over ASCII) satisfies the schema."""
    jsonschema = pytest.importorskip("jsonschema")
    from outlines_core import Index, Vocabulary

    eos = 200
    vocab = Vocabulary(eos, {chr(b): [b] for b in range(32, 127)})
    rng = random.Random(7)
    walked = 0
    for subset in ("Glaiveai2K", "Github_easy", "Github_medium", "Snowplow", "Kubernetes"):
        for record in _bench_records(data_dir, subset, 25, seed=3):
            result = _compile_or_none(record["schema"], PLAIN)
            if result is None or result.relaxed:
                continue
            index = Index(result.regex, vocab)
            cls = jsonschema.validators.validator_for(record["schema"])
            validator = cls(record["schema"], format_checker=cls.FORMAT_CHECKER)
            for _ in range(5):
                state, text = index.get_initial_state(), []
                for _step in range(400):
                    if index.is_final_state(state) and rng.random() < 0.2:
                        break
                    allowed = [t for t in index.get_allowed_tokens(state) if t != eos]
                    if not allowed:  # accepting with nothing more to write, or a non-ASCII path
                        break
                    token = rng.choice(allowed)
                    text.append(chr(token))
                    state = index.get_next_state(state, token)
                if index.is_final_state(state):
                    value = json.loads("".join(text))
                    assert validator.is_valid(value), (record["id"], "".join(text))
                    walked += 1
    assert walked >= 50


# --- class escapes: the grammar allows only what every validator's regex engine accepts --------
_ESCAPE_PATTERNS = ["^\\s$", "^\\S$", "^[^\\s]$", "^[^\\S]$", "^\\d$", "^\\D$", "^[^\\d]$", "^\\w$", "^\\W$",
                    "^[^\\W]$", "^[\\s\\d]$", "^[^\\s\\w]$", "^.$", "^[\\S\\s]$"]
_ESCAPE_CHARS = [chr(c) for c in range(0x800)] + [chr(c) for c in (
    0x0966, 0x1680, 0x180E, 0x2000, 0x200A, 0x200B, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000, 0xFEFF, 0xFF10, 0x1D7CE)]


@pytest.mark.parametrize("pattern", _ESCAPE_PATTERNS)
def test_class_escapes_allow_only_what_python_re_and_jsonschema_rs_accept(pattern):
    # ECMA \s has \ufeff, Python's has \x1c-\x1f and \x85; Python's \d and \w are Unicode-wide.
    jsonschema_rs = pytest.importorskip("jsonschema_rs")
    schema = {"type": "string", "pattern": pattern}
    regex = re.compile(schema_to_regex(schema, GrammarOptions()).regex)
    rs = jsonschema_rs.validator_for(schema)
    allowed = [c for c in _ESCAPE_CHARS if regex.fullmatch(json.dumps(c, ensure_ascii=False))]
    assert allowed, "the grammar allows nothing: the check is vacuous"
    wrong = [hex(ord(c)) for c in allowed if not (re.search(pattern, c) and rs.is_valid(c))]
    assert not wrong, f"{pattern} allows {wrong[:10]} that a validator rejects"


def test_base64_pattern_with_whitespace_rejects_a_byte_order_mark():
    # The JsonSchemaStore build-cache-node-config pattern: \s between base64 characters.
    pattern = "^(?:\\s*[A-Za-z0-9+/]){43}(?:\\s*=):(?:(?:\\s*[A-Za-z0-9+/]){4})*\\s*$"
    schema = {"type": "string", "pattern": pattern}
    key = "A" * 43 + "=:"
    assert accepts(schema, json.dumps(key)) and accepts(schema, json.dumps(" \n" + key))
    assert not accepts(schema, json.dumps("\ufeff" + key, ensure_ascii=False))
    assert relaxed(schema) == []


# --- numbers: every one the grammar admits is a finite double or an I-JSON-safe integer --------
_NUMBER_SCHEMAS = [{"type": "number"}, {"type": "integer"}, {"type": "number", "minimum": 0},
                   {"type": "number", "exclusiveMaximum": -3}, {"type": "integer", "minimum": -7}, {}]


def _random_number_text(rng: random.Random) -> str:
    digits = rng.choice([1, 2, 15, 16, 17, 20, 309, 400])
    text = rng.choice(["", "-"]) + str(rng.randint(1, 9)) + "".join(rng.choice("0123456789") for _ in range(digits - 1))
    if rng.random() < 0.5:
        text += "." + str(rng.randint(0, 99999))
    if rng.random() < 0.5:
        text += rng.choice("eE") + rng.choice(["", "+", "-"]) + str(rng.choice([0, 7, 99, 100, 292, 300, 308, 999]))
    return text


def _is_safe_number(value) -> bool:
    return math.isfinite(value) if isinstance(value, float) else abs(value) <= 2**53 - 1


@pytest.mark.parametrize("schema", _NUMBER_SCHEMAS)
def test_numbers_parse_finite_and_integers_stay_within_2_53(schema):
    regex = re.compile(schema_to_regex(schema, GrammarOptions()).regex)
    rng = random.Random(7)
    texts = [_random_number_text(rng) for _ in range(3000)] + [
        "1e999", "9.9e308", "1e308", "1" * 400 + ".5", "1" * 17 + ".5", str(2**53), str(-(2**53)), "9" * 400]
    admitted = [t for t in texts if regex.fullmatch(t)]
    assert admitted, "nothing admitted: the check is vacuous"
    unsafe = [t[:40] for t in admitted if not _is_safe_number(json.loads(t))]
    assert not unsafe, f"{schema} admits numbers that overflow or lose precision: {unsafe[:5]}"


def test_reasonable_numbers_are_still_admitted():
    number, integer = {"type": "number"}, {"type": "integer"}
    for text in ["0", "-0.5", "6.02e23", "6.02E+23", "1.5e-10", "1e99", "-1E-99", "8999999999999999",
                 "-8999999999999999", "1234567890123456.75", "0.000001", "12e-7"]:
        assert accepts(number, text), text
    for text in ["0", "-17", "1700000000000000", "8999999999999999", "-8999999999999999"]:
        assert accepts(integer, text), text
    assert not accepts(integer, "9000000000000000") and not accepts(integer, "-0")
    assert not any(accepts(number, t) for t in ["1e100", "1e-100", "1e999", "9000000000000000", "1" * 17 + ".5"])


@pytest.mark.parametrize("schema", [{"type": "number", "minimum": 0}, {"type": "number", "exclusiveMinimum": -2.5},
                                    {"type": "number", "maximum": 7}, {"type": "number", "minimum": 0, "maximum": 1e20}])
def test_a_bounded_number_takes_the_free_numbers_cap_past_its_own_bounds(schema):
    """Past the schema's bounds, a bounded number stops where a free one does (integer part at most
    LARGEST_INTEGER, any fraction): an inclusive cap at LARGEST_INTEGER wrote a 16-digit chain that
    forbade fractions there (439 regex characters for `minimum: 0`)."""
    result = schema_to_regex(schema)
    assert len(result.regex) < 200 and not result.relaxed
    low, high = schema.get("minimum", schema.get("exclusiveMinimum")), schema.get("maximum")
    for text in ["8999999999999999.5", "-8999999999999999.25", "1234567890123456.75", "3.5", "-2"]:
        value = float(text)
        ok = (low is None or value > low or (value == low and "minimum" in schema)) and (high is None or value <= high)
        assert accepts(schema, text) == ok, (schema, text)
    for text in ["9000000000000000", "-9000000000000000", "9000000000000000.5", "1e5"]:
        assert not accepts(schema, text), (schema, text)


def test_integral_number_bounds_beyond_2_53_are_relaxed_not_unsatisfiable():
    huge = {"type": "number", "minimum": 1e20}
    assert relaxed(huge) == [("", "minimum")] and accepts(huge, "1.5e21")
    wide = {"type": "number", "minimum": -1e30, "maximum": 1e30}
    assert relaxed(wide) == [] and accepts(wide, "-12.5") and not accepts(wide, "1e5")
    assert not accepts({"type": "integer", "maximum": 2**60}, str(2**59))


def test_python_whitespace_table_matches_re():
    from surecall.grammars.schema.pattern import _PY_SPACE

    table = {cp for lo, hi in _PY_SPACE for cp in range(lo, hi + 1)}
    assert table == {cp for cp in range(0x110000) if re.fullmatch(r"\s", chr(cp))}


def test_min_items_from_all_of_additional_properties_is_enforced():
    # JSONSchemaBench Handwritten---pp2: the wide fuzz once found minItems there neither enforced nor listed.
    schema = {"$ref": "#/definitions/x", "definitions": {"x": {"type": "object", "required": ["abcd"], "allOf": [
        {"additionalProperties": {"type": "array", "minItems": 2}},
        {"patternProperties": {"a": {"type": "array", "items": {"type": "number", "minimum": 2}}},
         "additionalProperties": False}]}}}
    assert accepts(schema, '{"abcd":[2.5,5]}') and not accepts(schema, '{"abcd":[2.5]}')
    assert not accepts(schema, '{"abcd":[1,5]}')
    assert not any(k == "minItems" for _, k in relaxed(schema))


# --- patterns whose automaton could blow up ---------------------------------------------------
CORNERS = "(top-left|top-center|top-right|middle-left|middle-center|middle-right|bottom-left|bottom-center|bottom-right)"


def test_unanchored_alternatives_share_one_search_and_keep_their_language():
    """`.*(?:a|b).*`, not `(?:.*a.*)|(?:.*b.*)`: the same strings, but outlines-core's subset
    construction of the second tracked each word's search apart (JSONSchemaBench's nine corner
    words: past 30 s and 12 GB; now 68 states)."""
    from surecall.grammars.automaton import regex_to_dfa

    body = translate_pattern(CORNERS, 48).regex
    assert body.count("top-left") == 1 and regex_to_dfa(f'"{body}"').num_states < 100
    schema = {"type": "string", "pattern": CORNERS}
    for text in ("top-left", "at the middle-center now", "bottom-right!"):
        assert accepts(schema, json.dumps(text)), text
    for text in ("top", "middle left", ""):
        assert not accepts(schema, json.dumps(text)), text
    mixed = {"type": "string", "pattern": "^ab|cd|ef$|^gh$"}  # each branch keeps its own anchors
    for text, ok in (("abz", True), ("zab", False), ("zcdz", True), ("zef", True), ("efz", False),
                     ("gh", True), ("ghz", False)):
        assert accepts(mixed, json.dumps(text)) is ok, text


@pytest.mark.parametrize("pattern, weight", [
    ("^[a-z]+(-[a-z]+)*$", 2), ("^\\d{4}-\\d{2}-\\d{2}$", 8), ("a[ab]{16}$", 16), ("a.{20}$", 20),
    ("(a|b)*a" + "(a|b)" * 14 + "$", 15), (CORNERS, 1), ("(?:ab){3}", 0), ("x{2,}", 0), ("[\\]a]{3}", 3),
])
def test_ambiguity_weight_counts_class_positions(pattern, weight):
    from surecall.grammars.schema.pattern import ambiguity_weight

    assert ambiguity_weight(pattern) == weight


def test_a_pattern_with_an_exponential_automaton_fails_within_the_budgets_naming_it():
    """`a[ab]{16}$` has 2^16 subset states: built in process it took 20 s and 2.5 GB past budgets of
    10 s and 2 GiB. Such a pattern is built first in the child that enforces both."""
    import resource
    import time

    from surecall.grammars.automaton import regex_to_dfa_isolated
    from surecall.grammars.schema import to_regex as to_regex_module

    schema = {"type": "object", "properties": {"x": {"type": "string", "pattern": "a[ab]{18}$"}}}
    to_regex_module._TOO_LARGE.clear()
    regex_to_dfa_isolated('"a"', 30.0, 256 << 20)  # the child for this memory budget, started (not timed)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    with pytest.raises(CompileBudgetExceeded, match=r"the pattern 'a\[ab\]\{18\}\$' at /properties/x/pattern"):
        schema_to_regex(schema, GrammarOptions(time_budget_s=2.0, memory_budget_bytes=256 << 20))
    assert time.perf_counter() - started < 2.0 + 3.0  # the budget, and a killed child's clean-up
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 << 10  # KiB: not built here
    started = time.perf_counter()  # the same again: refused at once
    with pytest.raises(CompileBudgetExceeded, match="too large to build"):
        schema_to_regex(schema, GrammarOptions(time_budget_s=2.0, memory_budget_bytes=256 << 20))
    assert time.perf_counter() - started < 1.0
    fine = {"type": "string", "pattern": "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}$"}  # weight 16, a small automaton
    assert accepts(fine, '"0123abcd-0123-abcd"') and not accepts(fine, '"0123abcd-0123-abc"')


def test_an_integer_enum_under_draft_4_is_not_spelled_with_a_fraction():
    """`1.0` equals the member 1, but under draft 3/4 it is not of `type: integer` (Github_easy
    o31279's walks wrote it); drafts 6+ count it as an integer, and a bare enum takes it anywhere."""
    import jsonschema

    d4, d7 = "http://json-schema.org/draft-04/schema#", "http://json-schema.org/draft-07/schema#"
    cases = [({"$schema": d4, "type": "integer", "enum": [1, 2]}, False),
             ({"$schema": d4, "type": "array", "items": {"type": "integer"}, "const": [1, 2]}, False),
             ({"$schema": d7, "type": "integer", "enum": [1, 2]}, True),
             ({"$schema": d4, "enum": [1, 2]}, True),
             ({"$schema": d4, "type": "number", "enum": [1, 2]}, True)]
    for schema, fraction_ok in cases:
        regex = re.compile(expand_counts(schema_to_regex(schema).regex))
        value = schema.get("const", 1)
        spelled = json.dumps(value).replace("1", "1.0")
        assert (regex.fullmatch(spelled) is not None) is fraction_ok, schema
        assert jsonschema.validators.validator_for(schema)(schema).is_valid(json.loads(spelled)) is fraction_ok
        assert regex.fullmatch(json.dumps(value)) is not None


def test_additional_properties_of_an_allof_part_beside_other_patterns_is_listed():
    """`allOf: [{patternProperties: {^b}, additionalProperties: false}]` beside patternProperties `a`:
    a key like `xa` (found by `a`, not by `^b`) breaks the part's additionalProperties; one merged
    dict cannot say so, so it is listed (Handwritten allOfPProp10's walks broke it unlisted)."""
    schema = {"type": "object", "allOf": [{"patternProperties": {"^b": True}, "additionalProperties": False}],
              "patternProperties": {"a": {"type": "integer"}}}
    result = schema_to_regex(schema)
    assert ("/allOf/0", "additionalProperties") in result.relaxed
    declared = {"type": "object", "allOf": [{"properties": {"b": True}, "additionalProperties": False}],
                "properties": {"b": {"type": "integer"}}}
    assert not schema_to_regex(declared).relaxed  # names are localized exactly: nothing listed
