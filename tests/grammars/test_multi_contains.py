"""Several `contains` on one array (an allOf merges them): some item matches each (to_regex.contains_array).

Random arrays over a small item pool, checked against `jsonschema`: the regex accepts exactly
the valid ones, whether one item witnesses several `contains` or each its own. Walks of the
compiled table validate. Past MAX_CONTAINS, or with minContains, `contains` stays relaxed.
"""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest

from surecall.grammars.compile import compile_schema
from surecall.grammars.schema.render import grammar_dumps
from surecall.grammars.schema.to_regex import expand_marks, ordered_partitions, schema_to_regex
from surecall.grammars.vocab import Vocab
from surecall.grammars.walk import decode, random_walk, schema_violations

TWO = {"type": "array", "items": {"type": ["integer", "string"]},
       "allOf": [{"contains": {"type": "integer", "minimum": 5}}, {"contains": {"type": "integer", "maximum": 6}}]}
THREE = {"type": "array", "allOf": [
    {"items": {"type": "array", "contains": {"const": 1}}},
    {"items": {"contains": {"type": "integer", "minimum": 3}}},
    {"items": {"contains": {"type": "string"}}},
]}
POOL = [0, 1, 2, 3, 5, 6, 7, 9, "a", "b"]


def byte_vocab() -> Vocab:
    pieces = [bytes([b]) for b in range(256)] + [b""]
    return Vocab(token_bytes=tuple(pieces), special_ids=frozenset({256}), stop_ids=(256,),
                 logits_width=len(pieces), format="test", name="contains-bytes")


def random_lists(rng: np.random.Generator, count: int, max_len: int = 5) -> list[list]:
    return [[POOL[int(i)] for i in rng.integers(0, len(POOL), int(rng.integers(0, max_len + 1)))] for _ in range(count)]


def disagreements(schema: dict, values: list) -> list:
    regex = re.compile(expand_marks(schema_to_regex(schema).regex))
    validator = jsonschema.Draft202012Validator(schema)
    return [v for v in values if (regex.fullmatch(grammar_dumps(v, schema)) is not None) != validator.is_valid(v)]


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SURECALL_CACHE_DIR", str(tmp_path / "cache"))


def test_two_contains_need_a_witness_each_possibly_the_same_item():
    assert schema_to_regex(TWO).relaxed == []
    values = random_lists(np.random.default_rng(1), 400) + [[5], [6], [7, 2], [2, 7], ["a", 9, "b", 0], [7, 9], []]
    validator = jsonschema.Draft202012Validator(TWO)
    assert 20 < sum(validator.is_valid(v) for v in values) < len(values) - 20
    assert disagreements(TWO, values) == []


def test_three_contains_on_the_inner_arrays():
    assert schema_to_regex(THREE).relaxed == []
    rng = np.random.default_rng(2)
    inner = random_lists(rng, 300, max_len=4) + [[1, "a", 3], [3, "a", 1], ["a", 7, 1], [1, 3]]
    values = [[v] for v in inner] + [[inner[i], inner[i + 1]] for i in range(0, 60, 2)] + [[], [1]]
    validator = jsonschema.Draft202012Validator(THREE)
    assert 5 < sum(validator.is_valid(v) for v in values) < len(values) - 20
    assert disagreements(THREE, values) == []


def test_walks_of_two_contains_validate():
    vocab, rng = byte_vocab(), np.random.default_rng(0)
    table = compile_schema(TWO, vocab, use_cache=False)
    assert table.relaxed == []
    for i in range(20):
        text = decode(vocab, random_walk(table, vocab, rng, max_tokens=None if i % 2 else 120)).decode()
        assert schema_violations(TWO, json.loads(text), table.relaxed) == ([], []), text


def test_more_contains_or_contains_counts_stay_relaxed():
    four = {"type": "array", "allOf": [{"contains": {"const": i}} for i in range(4)]}
    assert {k for _, k in schema_to_regex(four).relaxed} == {"contains"}
    counted = {"type": "array", "allOf": [{"contains": {"const": 1}}, {"contains": {"const": 2}}], "minContains": 2}
    assert {k for _, k in schema_to_regex(counted).relaxed} == {"contains"}
    assert schema_to_regex({"type": "array", "items": {"type": "string"},
                            "allOf": [{"contains": {"const": "a"}}, {"contains": {"const": "b"}}]}).relaxed == []


def test_ordered_partitions_count_the_orders_of_first_witnesses():
    assert [len(ordered_partitions(list(range(n)))) for n in range(4)] == [1, 1, 3, 13]
    assert ordered_partitions([0, 1]) == [[[0], [1]], [[1], [0]], [[0, 1]]]
