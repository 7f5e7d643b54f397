"""allOf of `if: {properties: {k: const|enum}}` parts on one key, as one union (schema/discriminators.py).

Every combination of a small pool of property values (the key absent, each value named, a value
named by no `if`, a non-object) is checked against `jsonschema`: the regex accepts exactly the
valid ones. Walks of the compiled table validate. A group whose thens hold a `$ref` stays on
the old path and, past the branch limit, relaxed with its reason.
"""

from __future__ import annotations

import itertools
import re

import jsonschema
import pytest
from helpers.grammar_checks import broken_walks, byte_vocab, disagreements

from surecall.grammars.compile import compile_schema
from surecall.grammars.schema.discriminators import discriminator_groups, same_value
from surecall.grammars.schema.to_regex import expand_marks, schema_to_regex

_ABSENT = object()
OBJECT_FORM = {
    "type": "object", "properties": {"kind": {"enum": ["a", "b", "c", 1, "zz"]}, "x": {}, "y": {}},
    "additionalProperties": False,
    "allOf": [
        {"if": {"properties": {"kind": {"const": "a"}}}, "then": {"properties": {"x": {"type": "integer"}}}},
        {"if": {"properties": {"kind": {"enum": ["b", 1]}}, "required": ["kind"]},
         "then": {"properties": {"y": {"type": "string"}}}, "else": {"properties": {"y": {"type": "boolean"}}}},
        {"if": {"properties": {"kind": {"type": "string", "const": "c"}}}, "then": {"required": ["x"]},
         "else": {"properties": {"x": {"type": "integer", "maximum": 5}}}},
    ],
}
POOLS = {"kind": [_ABSENT, "a", "b", "c", 1, 1.0, "zz"], "x": [_ABSENT, 3, 7, "s", True], "y": [_ABSENT, "s", True, 2]}
ANY_TYPE_FORM = {"properties": {"k": {}, "v": {}}, "additionalProperties": False, "allOf": [
    {"if": {"properties": {"k": {"const": 1}}}, "then": {"minimum": 3, "properties": {"v": {"type": "string"}}}},
    {"if": {"properties": {"k": {"const": 2}}}, "then": {"maxLength": 2},
     "else": {"type": ["object", "string", "integer"], "properties": {"v": {"type": "integer"}}}},
]}
ANY_TYPE_VALUES = [1, 5, 2.5, "abc", "a", None, True, [], {}, {"k": 1}, {"k": 2}, {"k": 3}, {"v": 1}, {"v": "s"},
                   {"k": 1, "v": "s"}, {"k": 1, "v": 1}, {"k": 2, "v": "s"}, {"k": 2, "v": 1}, {"k": 3, "v": 1}]


def objects(pools: dict) -> list[dict]:
    names = list(pools)
    return [{n: v for n, v in zip(names, combo) if v is not _ABSENT} for combo in itertools.product(*pools.values())]


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SURECALL_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("schema, values", [(OBJECT_FORM, objects(POOLS)), (ANY_TYPE_FORM, ANY_TYPE_VALUES)])
def test_the_union_accepts_exactly_what_jsonschema_accepts(schema, values):
    assert schema_to_regex(schema).relaxed == []
    validator = jsonschema.Draft202012Validator(schema)
    valid = [v for v in values if validator.is_valid(v)]
    assert 3 < len(valid) < len(values) - 3  # both sides are exercised
    assert {} in values and disagreements(schema, values) == []


def test_the_absent_key_takes_the_thens_of_ifs_without_required():
    regex = re.compile(expand_marks(schema_to_regex(OBJECT_FORM).regex))
    assert regex.fullmatch('{"x":3,"y":true}')  # the `a` then (x integer) and the else of the required `if`
    assert not regex.fullmatch('{"x":"s"}')  # x must be an integer: the `a` if holds vacuously
    assert not regex.fullmatch('{"y":"s"}')  # `required: [kind]` fails: its else (y boolean) holds


def test_walks_of_the_compiled_union_validate():
    vocab = byte_vocab("discriminator-bytes")
    table = compile_schema(OBJECT_FORM, vocab, use_cache=False)
    assert table.relaxed == []
    assert broken_walks(OBJECT_FORM, table, vocab, 20, short_budget=200) == []


def test_groups_need_two_parts_on_one_key_and_thens_without_refs():
    single = [{"if": {"properties": {"k": {"const": 1}}}, "then": {"required": ["a"]}}, {"required": ["b"]}]
    assert discriminator_groups(single, "", lambda s, p: s) == (single, {})
    mixed = [{"if": {"properties": {"k": {"const": 1}}, "required": ["j"]}, "then": {}},
             {"if": {"properties": {"k": {"const": 2}, "j": {"const": 1}}}, "then": {}}]
    assert discriminator_groups(mixed, "", lambda s, p: s)[0] == mixed
    refs = {"definitions": {"t": {"required": ["x"]}}, "type": "object",
            "allOf": [{"if": {"properties": {"k": {"const": i}}}, "then": {"$ref": "#/definitions/t"}} for i in range(7)]}
    result = schema_to_regex(refs)
    assert ("/allOf/0", "if") in result.relaxed
    assert "hold a $ref" in result.reasons[("/allOf/0", "if")]


def test_same_value_reads_json_equality():
    assert same_value(1, 1.0) and not same_value(True, 1) and not same_value("1", 1) and same_value(None, None)
