"""Several `contains` on one array (an allOf merges them): some item matches each (to_regex.contains_array).

Random arrays over a small item pool, checked against `jsonschema`: the regex accepts exactly
the valid ones, whether one item witnesses several `contains` or each its own. Walks of the
compiled table validate. Past MAX_CONTAINS, or with minContains, `contains` stays relaxed.
"""

from __future__ import annotations

import jsonschema
import numpy as np
import pytest
from helpers.grammar_checks import broken_walks, byte_vocab, disagreements

from surecall.grammars.compile import compile_schema
from surecall.grammars.schema.to_regex import ordered_partitions, schema_to_regex

TWO = {"type": "array", "items": {"type": ["integer", "string"]},
       "allOf": [{"contains": {"type": "integer", "minimum": 5}}, {"contains": {"type": "integer", "maximum": 6}}]}
THREE = {"type": "array", "allOf": [
    {"items": {"type": "array", "contains": {"const": 1}}},
    {"items": {"contains": {"type": "integer", "minimum": 3}}},
    {"items": {"contains": {"type": "string"}}},
]}
POOL = [0, 1, 2, 3, 5, 6, 7, 9, "a", "b"]


def random_lists(rng: np.random.Generator, count: int, max_len: int = 5) -> list[list]:
    return [[POOL[int(i)] for i in rng.integers(0, len(POOL), int(rng.integers(0, max_len + 1)))] for _ in range(count)]


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
    vocab = byte_vocab("contains-bytes")
    table = compile_schema(TWO, vocab, use_cache=False)
    assert table.relaxed == []
    assert broken_walks(TWO, table, vocab, 20, short_budget=120) == []


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
