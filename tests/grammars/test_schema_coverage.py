"""Coverage fixes of schema_to_regex: free-form values, open objects, patternProperties, literals, uri, long objects.

Each class is checked end to end on the byte DFA: the schema compiles, its valid instances are
accepted in every whitespace style the options allow, and random byte walks through the DFA
produce documents that validate against the original schema (the `jsonschema` package).
"""

from __future__ import annotations

import json
import random
import re
from collections import deque

import jsonschema
import numpy as np
import pytest

from surecall.errors import UnsupportedSchema
from surecall.grammars.automaton import ByteDFA, regex_to_dfa
from surecall.grammars.options import GrammarOptions
from surecall.grammars.schema.render import grammar_dumps
from surecall.grammars.schema.to_regex import (
    expand_counts,
    expand_marks,
    expand_stack,
    schema_to_regex,
)

STYLES = (GrammarOptions(), GrammarOptions(whitespace="none"))


def dfa_of(schema, options=None, unroll: bool = True) -> ByteDFA:
    """The schema's byte DFA; free-form values on the bracket stack unrolled 2 containers deep
    (expand_stack: these byte-level walks have no stack) unless `unroll` is False."""
    options = options or GrammarOptions()
    regex = schema_to_regex(schema, options).regex
    return regex_to_dfa(expand_stack(regex, options.whitespace_regex()) if unroll else regex)


def accepted_in_every_style(schema, value, dfa: ByteDFA) -> bool:
    """`value` rendered compact, with one space, and one space everywhere JSON allows it
    (test values hold no brackets inside strings and list keys in declared order)."""
    texts = [grammar_dumps(value, schema, o) for o in STYLES]
    spaced = json.dumps(value, ensure_ascii=False, separators=(" , ", " : "))
    for a, b in [("{", "{ "), ("[", "[ "), ("}", " }"), ("]", " ]"), ("{  }", "{ }"), ("[  ]", "[ ]")]:
        spaced = spaced.replace(a, b)
    return all(dfa.matches(t.encode()) for t in [*texts, spaced])


def random_walk(dfa: ByteDFA, rng: np.random.Generator, max_steps: int = 300) -> bytes:
    """Random bytes through the DFA, stopping at acceptance by chance, then by the shortest way."""
    state, out = 0, bytearray()
    for _ in range(max_steps):
        if dfa.accept[state] and rng.random() < 0.25:
            return bytes(out)
        choices = np.flatnonzero(dfa.trans[state] >= 0)
        if choices.size == 0:
            return bytes(out)
        byte = int(rng.choice(choices))
        out.append(byte)
        state = int(dfa.trans[state, byte])
    return bytes(out) + _shortest_to_accept(dfa, state)


def _shortest_to_accept(dfa: ByteDFA, state: int) -> bytes:
    back = {state: None}
    queue = deque([state])
    while queue:
        s = queue.popleft()
        if dfa.accept[s]:
            path = bytearray()
            while back[s] is not None:
                s, byte = back[s]
                path.append(byte)
            return bytes(reversed(path))
        for byte in np.flatnonzero(dfa.trans[s] >= 0):
            t = int(dfa.trans[s, byte])
            if t not in back:
                back[t] = (s, int(byte))
                queue.append(t)
    raise AssertionError("a pruned DFA state cannot reach acceptance")


def assert_walks_validate(schema, dfa: ByteDFA, num_walks: int = 40) -> None:
    rng = np.random.default_rng(0)
    validator = jsonschema.validators.validator_for(schema, jsonschema.Draft202012Validator)(schema)
    for _ in range(num_walks):
        text = random_walk(dfa, rng).decode("utf-8")
        errors = [e.message for e in validator.iter_errors(json.loads(text))]
        assert not errors, (text, errors)


# --- the byte DFA of nested regexes -----------------------------------------------------------
def test_free_form_object_compiles_and_nests_to_any_depth():
    schema = {"type": "object"}
    dfa = dfa_of(schema, unroll=False)
    for value in [{}, {"a": 1}, {"a": {"b": [1, "x", None]}, "c": [{}]}, {"é": "ü\n"}]:
        assert accepted_in_every_style(schema, value, dfa), value
    deep = json.dumps({"a": [[{"b": [[[{"c": {"d": [1]}}]]]}]]}).encode()
    assert dfa.matches(deep)  # 10 containers: on the bracket stack, any depth
    assert not dfa.matches(b'{"a": {"b": {"c": [1}}}}') and not dfa.matches(b'{"a": [}')
    assert not dfa.matches(b"[]")
    assert_walks_validate(schema, dfa_of(schema))
    unrolled = dfa_of(schema, GrammarOptions(free_form_stack=False))
    assert not unrolled.matches(b'{"a": {"b": {"c": [1]}}}')  # past max_any_depth=2


def test_deeper_free_form_values_when_asked():
    dfa = dfa_of(True, GrammarOptions(max_any_depth=4, free_form_stack=False))
    assert dfa.matches(b'{"a": {"b": {"c": [1]}}}')


@pytest.mark.parametrize("regex, texts", [
    ('x(?:ab)*y|"[^"]*"', ["xy", "xababy", '""', '"x\x0e"', "xa", "x", ""]),
    ("\\x0e?a", ["a", "\x0ea", "\x0e", "\x0e\x0ea"]),  # the builder's leading byte inside a regex
])
def test_byte_dfa_language_equals_the_regex(regex, texts):
    dfa = regex_to_dfa(regex)
    for text in texts:
        assert dfa.matches(text.encode()) == (re.fullmatch(regex, text) is not None), text


# --- open objects ------------------------------------------------------------------------------
def test_explicit_additional_properties_true_opens_the_object():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": True}
    dfa = dfa_of(schema)
    for value in [{"a": 1}, {"a": 1, "b": [1, {"c": None}]}, {"b": "x", "c": 2}, {}]:
        assert accepted_in_every_style(schema, value, dfa), value
    assert not dfa.matches(b'{"a": 1, "a": 2}')  # an extra key never repeats a declared one
    assert not dfa.matches(b'{"a": "x"}')
    closed = dfa_of({"type": "object", "properties": {"a": {"type": "integer"}}})
    assert not closed.matches(b'{"a": 1, "b": 2}')  # unwritten: closed by policy (options)
    assert_walks_validate(schema, dfa)


def test_additional_properties_schema_types_the_extra_values():
    schema = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"],
              "additionalProperties": {"type": "string", "enum": ["x", "y"]}}
    dfa = dfa_of(schema)
    assert accepted_in_every_style(schema, {"id": 1, "tag": "x", "other": "y"}, dfa)
    assert not dfa.matches(b'{"id": 1, "tag": 2}')
    assert not dfa.matches(b'{"tag": "x"}')
    assert_walks_validate(schema, dfa)


def test_pattern_properties_with_closed_additional_properties():
    schema = {"type": "object", "properties": {"name": {"type": "string"}},
              "patternProperties": {"^x-[a-z]+$": {"type": "integer"}}, "additionalProperties": False}
    result = schema_to_regex(schema)
    assert ("", "patternProperties") not in result.relaxed
    dfa = regex_to_dfa(result.regex)
    for value in [{}, {"name": "n"}, {"name": "n", "x-a": 1, "x-bc": 2}, {"x-q": 3}]:
        assert accepted_in_every_style(schema, value, dfa), value
    for bad in [b'{"y": 1}', b'{"x-a": "s"}', b'{"x-": 1}', b'{"x-A": 1}']:
        assert not dfa.matches(bad), bad
    assert_walks_validate(schema, dfa)


def test_pattern_properties_split_keys_by_the_patterns_they_match():
    two = {"type": "object", "patternProperties": {"^a": {"type": "integer"}, "b$": {"minimum": 0}},
           "additionalProperties": False}
    result = schema_to_regex(two)
    assert result.relaxed == []  # a key matching both takes both schemas
    dfa = regex_to_dfa(result.regex)
    for text, ok in [(b'{"a": -1}', True), (b'{"ab": 2}', True), (b'{"ab": -2}', False), (b'{"b": -1}', False),
                     (b'{"xb": 3, "a": 1}', True), (b'{"x": 1}', False), (b'{"ax": "s"}', False)]:
        assert dfa.matches(text) is ok, text
    assert_walks_validate(two, dfa)
    clash = {"type": "object", "properties": {"ab": {"type": "string"}}, "patternProperties": {"^a": {}}}
    dfa = dfa_of(clash)
    assert schema_to_regex(clash).relaxed == []
    assert dfa.matches(b'{"ab": "s", "ax": 2}') and not dfa.matches(b'{"ab": "s", "ab": 2}')
    assert_walks_validate(clash, dfa)


def test_pattern_properties_beside_explicit_additional_properties():
    rng = random.Random(0)  # 40 random names: their complement has no short state-eliminated regex
    names = sorted({"".join(rng.choice("abcdefghij") for _ in range(6)) for _ in range(40)})
    schema = {"type": "object", "properties": {n: {"type": "integer"} for n in names},
              "patternProperties": {"^x-": {"type": "boolean"}}, "additionalProperties": {"type": "string"}}
    result = schema_to_regex(schema)
    assert result.relaxed == []
    dfa = regex_to_dfa(result.regex)
    for text, ok in [(f'{{"{names[0]}": 1, "x-a": true, "y": "s"}}', True), ('{"x-a": "s"}', False),
                     ('{"y": true}', False), (f'{{"{names[0]}": 1, "{names[0]}": "s"}}', False),
                     (f'{{"{names[0]}x": "s"}}', True)]:
        assert dfa.matches(text.encode()) is ok, text


def test_pattern_properties_with_a_leading_negative_lookahead():
    schema = {"type": "object", "properties": {"name": {"type": "string"}},
              "patternProperties": {"^(?!name|style).+$": {"type": "integer"}}, "additionalProperties": False}
    result = schema_to_regex(schema)
    assert result.relaxed == []
    dfa = regex_to_dfa(result.regex)
    for text, ok in [(b'{"name": "n", "a": 1}', True), (b'{"styles": 1}', False), (b'{"nam": 1}', True),
                     (b'{"a": "s"}', False), (b'{"": 1}', False)]:
        assert dfa.matches(text) is ok, text
    assert_walks_validate(schema, dfa)


def test_pattern_properties_beside_property_names():
    schema = {"type": "object", "propertyNames": {"maxLength": 3}, "patternProperties": {"^a": {"type": "integer"}},
              "additionalProperties": {"type": "string"}}
    result = schema_to_regex(schema)
    assert result.relaxed == []
    dfa = regex_to_dfa(result.regex)
    for text, ok in [(b'{"ab": 1, "b": "s"}', True), (b'{"abcd": 1}', False), (b'{"bcde": "s"}', False),
                     (b'{"ab": "s"}', False)]:
        assert dfa.matches(text) is ok, text
    assert_walks_validate(schema, dfa)


# --- literals and formats ---------------------------------------------------------------------
def test_const_and_enum_containers_take_the_allowed_whitespace():
    value = {"a": [1, 2], "b": {"c": None}, "d": [], "e": {}}
    for schema in [{"const": value}, {"enum": [value, [1, {"x": "y"}]]}]:
        dfa = dfa_of(schema)
        assert accepted_in_every_style(schema, value, dfa)
        assert dfa.matches(b'{"a":[1,2],"b":{"c":null},"d":[],"e":{}}')
        assert dfa.matches(b'{ "a" : [ 1 , 2 ] , "b" : { "c" : null } , "d" : [ ] , "e" : { } }')
        assert not dfa.matches(b'{"a":  [1,2],"b":{"c":null},"d":[],"e":{}}')  # at most one space
        assert_walks_validate(schema, dfa, 10)


@pytest.mark.parametrize("text, ok", [
    ("file://x", True), ("file:///etc/hosts", True), ("urn:isbn:0451450523", True), ("mailto:a@b", True),
    ("https://user@example.com:8080/a/b?q=1#f", True), ("tag:example.com,2005:x", True),
    ("1http://x", False), ("not a uri", False), ("http://a b", False), ("", False),
])
def test_uri_admits_every_rfc3986_scheme(text, ok):
    dfa = dfa_of({"type": "string", "format": "uri"})
    assert dfa.matches(json.dumps(text).encode()) == ok


# --- large objects and references -------------------------------------------------------------
def test_object_with_many_optional_properties_builds_its_dfa():
    props = {f"p{i}": {"type": "integer"} for i in range(120)}
    schema = {"type": "object", "properties": props}
    dfa = dfa_of(schema)  # nested 120 deep, outlines-core failed with "error building NFA"
    for value in [{}, {"p0": 1}, {"p119": 2}, {f"p{i}": i for i in range(0, 120, 7)}]:
        assert accepted_in_every_style(schema, value, dfa), value
    assert not dfa.matches(b'{"p3": 1, "p2": 1}')  # declared order
    with_required = {**schema, "required": ["p60"]}
    dfa = dfa_of(with_required)
    assert accepted_in_every_style(with_required, {"p1": 1, "p60": 2, "p99": 3}, dfa)
    assert not dfa.matches(b'{"p1": 1}')
    assert_walks_validate(with_required, dfa, 10)


def test_size_error_names_the_reference_that_grows():
    leaf = {"type": "object", "properties": {f"k{i}": {"type": "string"} for i in range(8)}}
    schema = {"$defs": {"leaf": leaf},
              "type": "object", "properties": {f"p{i}": {"$ref": "#/$defs/leaf"} for i in range(40)}}
    with pytest.raises(UnsupportedSchema, match=r"\$ref '#/\$defs/leaf' grows it most: inlined \d+ times"):
        schema_to_regex(schema, GrammarOptions(max_regex_length=5000))
    assert schema_to_regex(schema).regex  # within the default limit


def test_pattern_keys_above_max_bounded_length_are_narrowed_not_dropped():
    """Without counters, a key pattern past max_bounded_length is written with the bound lowered (stricter)."""
    schema = {"type": "object", "patternProperties": {"^[a-z]{1,255}$": {"type": "integer"}},
              "additionalProperties": False}
    result = schema_to_regex(schema, GrammarOptions(counted_lengths=False))
    assert result.relaxed == []  # every key written matches: the grammar is only stricter
    dfa = regex_to_dfa(result.regex)
    assert dfa.matches(b'{"temperature": 25, "humidity": 60}')
    assert dfa.matches(('{"' + "a" * 48 + '": 1}').encode())
    assert not dfa.matches(('{"' + "a" * 49 + '": 1}').encode())  # valid, but past the narrowed bound
    assert_walks_validate(schema, dfa)


def test_a_pattern_key_of_one_quantified_set_is_counted_exactly():
    """With counters (the default) the same key is a counted string: every length up to 255, none past it."""
    schema = {"type": "object", "patternProperties": {"^[a-z]{1,255}$": {"type": "integer"}},
              "additionalProperties": False}
    result = schema_to_regex(schema)
    assert result.relaxed == [] and result.narrowed == {}
    regex = expand_counts(result.regex)
    for length, valid in ((0, False), (1, True), (49, True), (255, True), (256, False)):
        assert (re.fullmatch(regex, '{"' + "a" * length + '": 1}') is not None) == valid, length


def test_reference_to_the_documents_own_id_resolves():
    schema = {"$id": "https://example.com/s.json", "type": "object",
              "properties": {"n": {"$ref": "https://example.com/s.json#/$defs/n"}},
              "$defs": {"n": {"type": "integer"}}}
    dfa = dfa_of(schema)
    assert dfa.matches(b'{"n": 3}') and not dfa.matches(b'{"n": "x"}')
    with pytest.raises(UnsupportedSchema, match="only local references"):
        schema_to_regex({"$ref": "https://other.example/s.json#/x"})


# --- property order -----------------------------------------------------------------------------
def test_any_property_order_for_small_objects():
    schema = {"type": "object", "required": ["b"],
              "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "null"}}}
    options = GrammarOptions(any_property_order=True)
    dfa = dfa_of(schema, options)
    for text in [b'{"b": "x"}', b'{"c": null, "b": "x", "a": 1}', b'{"b":"x","a":1}', b'{"a": 1, "b": ""}']:
        assert dfa.matches(text), text
    for text in [b'{"a": 1}', b"{}", b'{"a": 1, "a": 2, "b": ""}', b'{"b": "", "b": ""}']:
        assert not dfa.matches(text), text
    assert not dfa_of(schema).matches(b'{"b": "x", "a": 1}')  # declared order by default
    assert_walks_validate(schema, dfa)


def test_any_property_order_keeps_declared_order_past_the_bound():
    props = {f"p{i}": {"type": "integer"} for i in range(5)}
    dfa = dfa_of({"type": "object", "properties": props}, GrammarOptions(any_property_order=True))
    assert dfa.matches(b'{"p0": 1, "p4": 2}') and not dfa.matches(b'{"p4": 2, "p0": 1}')


def test_any_property_order_must_be_a_bool():
    with pytest.raises(ValueError, match="Invalid any_property_order"):
        GrammarOptions(any_property_order="yes")


# --- combinators ------------------------------------------------------------------------------
def test_all_of_compares_numbers_by_value():
    schema = {"allOf": [{"const": 1}, {"const": 1.0}]}  # was reported unsatisfiable
    assert dfa_of(schema).matches(b"1")
    enum = {"allOf": [{"enum": [1, "a", {"k": 2}]}, {"enum": [1.0, {"k": 2.0}]}]}
    dfa = dfa_of(enum)
    assert dfa.matches(b"1") and dfa.matches(b'{"k": 2}') and not dfa.matches(b'"a"')
    with pytest.raises(UnsupportedSchema, match="unsatisfiable"):
        schema_to_regex({"allOf": [{"const": 1}, {"const": 2}]})


def test_small_one_of_with_contains_and_not_compiles():
    schema = {"oneOf": [{"type": "array", "contains": {"type": "integer"}, "items": {"type": ["integer", "string"]}},
                        {"type": "object", "not": {"required": ["x"]}, "properties": {"y": {"type": "string"}}}]}
    dfa = dfa_of(schema)  # each branch nests free-form-sized values: timed out before the leading byte
    assert dfa.matches(b'[1, "a"]') and dfa.matches(b'{"y": "s"}')


@pytest.mark.parametrize("schema, good, bad", [
    ({"type": "number"}, ["1", "1.5", "-2.25", "1e5", "0.125E-3"], ["1.", ".5", "01", "1e"]),
    ({"type": "integer"}, ["0", "-7", "15"], ["1.5", "-"]),
    ({"anyOf": [{"type": "integer"}, {"type": "string"}]}, ["12", '"x"'], ["12x"]),
])
def test_a_root_scalar_keeps_the_edges_out_of_an_accepting_state(schema, good, bad):
    """outlines-core drops the edges that leave a state where the text could already stop; the
    end byte (automaton._END_MARK) keeps them: a root-level number takes "1.5", not only "1"."""
    dfa = regex_to_dfa(schema_to_regex(schema).regex)
    assert [t for t in good if not dfa.matches(t.encode())] == []
    assert [t for t in bad if dfa.matches(t.encode())] == []


def test_a_root_number_table_continues_after_an_accepting_digit(data_dir):
    from surecall.grammars import compile_schema, load_vocab

    vocab = load_vocab("shared:gpt2")
    table = compile_schema({"type": "number"}, vocab, use_cache=False)
    one, dot = vocab.token_bytes.index(b"1"), vocab.token_bytes.index(b".")
    after_one = table.next_state(0, one)
    assert after_one is not None and table.accept[after_one]
    assert table.next_state(after_one, dot) is not None  # "1" may go on to "1.5"


def test_two_nots_under_allof_are_both_accounted_for():
    """not A and not B: simple type negations and not-required are both enforced; any other second
    `not` is listed as relaxed under its own branch (it was merged into `not (A and B)`, looser and mislabelled)."""
    types = schema_to_regex({"allOf": [{"not": {"type": "string"}}, {"not": {"type": "null"}}],
                             "type": ["string", "null", "integer"]})
    dfa = regex_to_dfa(types.regex)
    assert dfa.matches(b"12") and not dfa.matches(b'"x"') and not dfa.matches(b"null")
    assert types.relaxed == []
    other = schema_to_regex({"type": "object", "allOf": [{"not": {"minProperties": 2}}, {"not": {"maxProperties": 0}}]})
    assert other.relaxed == []  # object counts under `not`: exactly one member (schema/object_exists.py)
    counted = regex_to_dfa(expand_marks(other.regex))
    assert counted.matches(b'{"a": 1}') and not counted.matches(b"{}") and not counted.matches(b'{"a": 1, "b": 2}')
    absent = schema_to_regex({"type": "object", "properties": {"a": {}, "b": {}, "c": {}},
                              "allOf": [{"not": {"required": ["a"]}}, {"not": {"required": ["b"]}}]})
    dfa = regex_to_dfa(absent.regex)  # not-required: both rewritten as "absent" (schema/alternatives.py)
    assert absent.relaxed == [] and dfa.matches(b'{"c": 1}') and not dfa.matches(b'{"b": 1}')
