"""Object-level `not` and key existence written exactly (grammars/schema/object_exists.py): the
grammar against jsonschema on random objects for not/propertyNames/patternProperties/required/
count combinations, the cases it leaves relaxed, and the Handwritten schemas it fixes by walks.
"""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest
from conftest import bench_records, cached_vocab
from helpers.grammar_checks import invalid_tight_walks

from surecall.grammars.compile import compile_schema
from surecall.grammars.options import GrammarOptions
from surecall.grammars.schema.object_exists import (
    MAX_COUNT,
    NotExact,
    ObjectReader,
    _is_annotation,
    listed_integers,
)
from surecall.grammars.schema.to_regex import expand_marks, schema_to_regex

_KEYS = ["a", "b", "ab", "ba", "x", "xa", "cde", "1", "3", "", '"q', "é\\"]
_VALUES = [1, 30, -2, "s", "A", 2.5, [1, 2], [], {"a": 1}, None, True]


def _objects(num: int, seed: int = 0, most: int = 3) -> list[dict]:
    rng = random.Random(seed)
    out = [{}, {"a": 1, "b": -2}, {"o": {"b": 1}}, {"x": 1, "ab": "s"}, {"xa": "A", "cde": 1}]
    for _ in range(num):
        keys = rng.sample(_KEYS, rng.randint(1, most))
        out.append({k: rng.choice(_VALUES) for k in keys})
    return out


def _grammar(schema: dict):
    result = schema_to_regex(schema)
    assert result.relaxed == [], result.relaxed
    return re.compile(expand_marks(result.regex), re.DOTALL)


EXACT = [
    {"type": "object", "not": {"propertyNames": {"pattern": "^a"}}},  # some key not starting with a
    {"type": "object", "propertyNames": {"maxLength": 2}, "maxProperties": 2,
     "not": {"propertyNames": {"not": {"pattern": "b"}}}},  # some key holds b
    {"type": "object", "not": {"patternProperties": {"^x": {"type": "integer"}}}},  # x-key with a non-integer
    {"type": "object", "patternProperties": {"^[ab]$": {"type": "integer"}}, "additionalProperties": False,
     "not": {"anyOf": [{"propertyNames": {"not": {"const": "a"}}}, {"maxProperties": 1}]}},
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
     "not": {"propertyNames": {"enum": ["a", "b"]}}},  # declared, required, and another key
    {"type": "object", "minProperties": 2, "not": {"patternProperties": {"a": False}}},
    {"type": "object", "patternProperties": {"^a": True}, "not": {"additionalProperties": {"type": "string"}}},
    {"type": "object", "maxProperties": 1, "allOf": [
        {"anyOf": [{"patternProperties": {"^.{1,2}$": True}, "additionalProperties": False},
                   {"patternProperties": {"a$": {"type": "integer", "minimum": 15}}, "additionalProperties": False}]},
        {"anyOf": [{"not": {"patternProperties": {"^cde": False}}}, {"not": {"patternProperties": {"^x": False}}}]}]},
    {"not": {"anyOf": [{"propertyNames": {"not": {"enum": ["1", "3"]}}}, {"required": ["b"]}]}},
    {"type": "object", "not": {"anyOf": [{"propertyNames": {"maxLength": 1}}, {"required": ["x"]}]}},
    {"type": "object", "properties": {"o": {"not": {"propertyNames": {"pattern": "^a"}}}}, "required": ["o"],
     "additionalProperties": False},
    {"type": "object", "not": {"patternProperties": {"a": {"not": {"type": "string", "pattern": "A"}}}}},
    # propertyNames through a $ref (Github_medium o90904's directions), and as a `not` of an enum
    {"type": "object", "$defs": {"k": {"enum": ["a", "ab", "x", 3]}}, "propertyNames": {"$ref": "#/$defs/k"},
     "additionalProperties": True},
    {"type": "object", "propertyNames": {"not": {"enum": ["b", "ab", "é\\"]}}, "additionalProperties": True},
    {"type": "object", "propertyNames": {"type": "string", "not": {"const": "x"}}, "additionalProperties": True},
    # propertyNames as one string automaton (JsonSchemaStore ansible-lint: a oneOf of an enum and a pattern)
    {"type": "object", "propertyNames": {"oneOf": [{"enum": ["a", "ab", "1"], "type": "string"},
                                                   {"pattern": "^[ab]+$", "type": "string"}]},
     "additionalProperties": True},
    {"type": "object", "properties": {"x": {"type": "integer"}},
     "propertyNames": {"anyOf": [{"pattern": "^a"}, {"const": "cde"}]}, "additionalProperties": True},
]


@pytest.mark.parametrize("schema", EXACT)
def test_grammar_equals_jsonschema_on_random_objects(schema):
    grammar = _grammar(schema)
    validator = jsonschema.Draft202012Validator(schema)
    num_valid = 0
    for obj in _objects(500, seed=len(json.dumps(schema))):
        expected = validator.is_valid(obj)
        for text in (json.dumps(obj, ensure_ascii=False), json.dumps(obj, ensure_ascii=False, separators=(",", ":"))):
            assert (grammar.fullmatch(text) is not None) == expected, (text, schema)
        num_valid += expected
    assert num_valid > 0


def test_keys_any_order_and_json_escapes():
    grammar = _grammar({"type": "object", "not": {"propertyNames": {"not": {"pattern": '"'}}}})
    assert grammar.fullmatch('{"x": 1, "a\\"b": 2}') and grammar.fullmatch('{"\\"": 2, "x": 1}')
    assert not grammar.fullmatch('{"x": 1}') and not grammar.fullmatch('{}')
    assert not grammar.fullmatch('{"a"b": 2}')  # no broken JSON string as a key


def test_a_not_of_another_type_leaves_the_objects_free():
    grammar = _grammar({"type": ["object", "string"], "not": {"type": "string", "propertyNames": {"pattern": "^a"}}})
    assert grammar.fullmatch('{"a": 1}') and grammar.fullmatch("{}") and not grammar.fullmatch('"a"')


def test_a_not_of_an_object_type_and_its_keys_is_split_by_type():
    # not (object and every key starts with a) = not an object, or an object with a key that does not
    schema = {"type": ["object", "string"], "not": {"type": "object", "propertyNames": {"pattern": "^a"}}}
    grammar = _grammar(schema)
    assert grammar.fullmatch('"s"') and grammar.fullmatch('{"a": 1, "b": 2}')
    assert not grammar.fullmatch("{}") and not grammar.fullmatch('{"a": 1}') and not grammar.fullmatch("1")


def test_only_objects_when_the_not_rejects_every_other_value():
    grammar = _grammar({"not": {"propertyNames": {"pattern": "^a"}}})
    assert grammar.fullmatch('{"b": 1}') and not grammar.fullmatch('"b"') and not grammar.fullmatch("1")


def test_unsatisfiable_existence_has_no_document():
    with pytest.raises(Exception, match="unsatisfiable|no value|admits nothing"):
        schema_to_regex({"type": "object", "maxProperties": 1,
                         "not": {"anyOf": [{"propertyNames": {"not": {"const": "a"}}},
                                           {"propertyNames": {"not": {"const": "b"}}}]}})


@pytest.mark.parametrize("schema, keyword", [
    ({"type": "object", "maxProperties": MAX_COUNT + 1, "not": {"propertyNames": {"pattern": "^a"}}}, "not"),
    ({"type": "object", "not": {"propertyNames": {"format": "email"}}}, "not"),  # format: no key class
    ({"type": "object", "unevaluatedProperties": False, "not": {"propertyNames": {"pattern": "^a"}}}, "not"),
])
def test_cases_not_taken_over_stay_relaxed(schema, keyword):
    assert ("", keyword) in schema_to_regex(schema).relaxed


def test_the_relaxed_reason_says_why_the_object_was_not_written():
    result = schema_to_regex({"type": "object", "maxProperties": MAX_COUNT + 1,
                              "allOf": [{"not": {"propertyNames": {"pattern": "^a"}}}]})
    assert result.relaxed == [("/allOf/0", "not")]
    assert result.reasons[("/allOf/0", "not")].endswith(
        f"the object at / is not written with its keys' existence: maxProperties {MAX_COUNT + 1} beside an "
        f"object-level not is past {MAX_COUNT}")


def test_a_relaxed_existential_value_is_not_taken_over():
    schema = {"type": "object", "not": {"patternProperties": {"^a": {"not": {"type": "string", "format": "regex"}}}}}
    result = schema_to_regex(schema)
    assert ("", "not") in result.relaxed


def test_keys_no_draft_defines_are_annotations():
    # Handwritten notnames4 keeps its definitions under "ddd"; an `x-` extension sits beside the not
    schema = {"type": "object", "allOf": [{"$ref": "#/ddd/npn"}], "x-note": {"not": 1},
              "ddd": {"npn": {"not": {"propertyNames": {"not": {"const": "a4"}}}}}}
    grammar = _grammar(schema)
    assert grammar.fullmatch('{"b": 1, "a4": 2}') and not grammar.fullmatch('{"b": 1}')
    assert _is_annotation("ddd") and _is_annotation("x-note") and _is_annotation("title")
    assert not _is_annotation("dependentRequired") and not _is_annotation("$surecall:not_in")
    with pytest.raises(NotExact, match="'dependentRequired' is not read"):
        _reader().positive({"dependentRequired": {"a": ["b"]}, "not": {"propertyNames": {"pattern": "a"}}})


def _reader() -> ObjectReader:
    return ObjectReader(lambda ref: {}, lambda schema: {}, False)


@pytest.mark.parametrize("schema, match", [
    ({"dependentRequired": {"a": ["b"]}}, "'dependentRequired' is not read beside an object-level not"),
    ({"maxProperties": 1.5}, "maxProperties 1.5 is not a natural number"),
    ({"propertyNames": {"format": "email"}}, "propertyNames is not read as a key class"),
    ({"anyOf": [{"anyOf": [{"minProperties": i} for i in range(7)]} for _ in range(6)]}, "more than 32 branches"),
])
def test_reader_errors_name_what_is_not_read(schema, match):
    with pytest.raises(NotExact, match=match):
        _reader().positive({"type": "object", **schema, "not": {"propertyNames": {"pattern": "a"}}})


def test_negated_keyword_errors_name_the_keyword():
    with pytest.raises(NotExact, match="the negation of 'dependentSchemas' is not read at object level"):
        _reader().negative({"dependentSchemas": {"a": {"required": ["b"]}}})


def test_listed_integers_only_for_bounded_integers():
    def is_valid(n):
        return n % 10 == 0 and n % 20 != 0

    assert listed_integers([{"type": "integer", "minimum": 15}, {"maximum": 35}], is_valid) == "30"
    assert listed_integers([{"type": "number", "minimum": 15, "maximum": 35}], is_valid) is False
    assert listed_integers([{"type": "integer", "minimum": 0}], is_valid) is False
    assert listed_integers([{"type": "integer", "minimum": 21, "maximum": 29}], is_valid) is None


# --- Handwritten schemas fixed by it (skipped without the shared data) ---------------------------
FIXED = ["allOfPProp7", "notnames4", "object3", "object6", "pnmp2", "pnmp4"]


@pytest.mark.parametrize("name", FIXED)
def test_handwritten_walks_all_validate(name, data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SURECALL_CACHE_DIR", str(tmp_path / "cache"))
    record = next(r for r in bench_records(data_dir, "Handwritten") if r["id"] == f"Handwritten---{name}")
    schema = record["schema"]
    vocab = cached_vocab("llama3")
    table = compile_schema(schema, vocab, GrammarOptions(time_budget_s=20.0), use_cache=False)
    assert table.relaxed == []
    assert invalid_tight_walks(schema, table, vocab, 20) == []
    grammar = re.compile(expand_marks(schema_to_regex(schema).regex), re.DOTALL)
    for test in record["tests"]:  # pnmp2's: one valid, four invalid
        assert (grammar.fullmatch(json.dumps(test["data"], ensure_ascii=False)) is not None) == test["valid"], test


def test_property_names_not_enum_beside_declared_names():
    # JsonSchemaStore lintstagedrc: any key but the listed ones, beside a declared one
    schema = {"type": "object", "properties": {"$schema": {"type": "string"}},
              "propertyNames": {"not": {"enum": ["concurrent", "chunkSize"]}}, "additionalProperties": {"type": "integer"}}
    grammar = _grammar(schema)
    assert grammar.fullmatch('{"$schema": "s", "a": 1}') and grammar.fullmatch('{"concurrently": 1}')
    assert not grammar.fullmatch('{"concurrent": 1}') and not grammar.fullmatch('{"$schema": "s", "chunkSize": 2}')
    assert not grammar.fullmatch('{"$schema": 1}')  # the declared name keeps its own schema
