"""Large JSONSchemaBench schemas that compile once their slow spots are fixed: random walks validate.

Github_ultra o65418 is a root anyOf of three `required` variants of one object that holds a
26k-state value: its alternatives are joined as one spliced alternation (grammars/splice.py), not
a subset construction over the three spliced DFAs. Timing is benchmarks/compile.py's concern;
here the table must come out and every walk must satisfy the schema (relaxed keywords aside).
The fast tests check the stages these schemas spend their time in (byte classes, minimise's
congruence check, the memory estimate's two-byte pair count) against plain definitions.
"""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from surecall.grammars.compile import compile_schema
from surecall.grammars.walk import decode, random_walk, schema_violations


@pytest.fixture(scope="module")
def llama3(data_dir):
    from conftest import cached_vocab

    return cached_vocab("llama3")


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SURECALL_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.slow
@pytest.mark.parametrize("subset, name", [("Github_ultra", "o65418")])
def test_large_schema_compiles_and_walks_validate(data_dir, llama3, subset, name):
    from conftest import bench_schema

    schema = bench_schema(data_dir, subset, name)
    table = compile_schema(schema, llama3, use_cache=False)
    validator = jsonschema.Draft4Validator(schema)
    rng = np.random.default_rng(5)
    for _ in range(6):
        doc = json.loads(decode(llama3, random_walk(table, llama3, rng, max_tokens=600)))
        bad, _soft = schema_violations(schema, doc, table.relaxed)
        assert bad == [], (doc, bad)
        if not table.relaxed:
            assert validator.is_valid(doc), doc


# The large schemas' DFA stages, checked against plain definitions on small inputs (fast).

def _planted_columns(num_states: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    trans = rng.integers(-1, num_states, size=(num_states, 256)).astype(np.int32)
    trans[:, 100:200] = trans[:, [7]]  # bytes 100..199 copy byte 7's column
    trans[:, 30:40] = -1
    trans[:, 250] = trans[:, 3]
    return trans


@pytest.mark.parametrize("num_states", [1, 3, 200])
def test_byte_classes_name_the_smallest_byte_with_the_same_column(num_states):
    from surecall.grammars.automaton import byte_classes

    trans = _planted_columns(num_states, num_states)
    expected = [next(c for c in range(256) if np.array_equal(trans[:, c], trans[:, b])) for b in range(256)]
    assert byte_classes(trans).tolist() == expected
    rep = byte_classes(trans)
    assert rep[150] == rep[7] <= 7 and rep[250] == rep[3] <= 3 and rep[35] == rep[30] <= 30


def test_quotient_checks_one_byte_per_class_as_all_bytes():
    from surecall.grammars.automaton import _class_columns, _refine, quotient_by, regex_to_dfa

    dfa = regex_to_dfa(r'"(?:ab|cb|[x-z]{2})*"', minimal=False)
    classes = _class_columns(dfa.trans)
    assert classes.size < 256
    block = _refine(dfa.trans, dfa.accept, classes)
    with_classes, full = quotient_by(dfa, block, classes), quotient_by(dfa, block)
    assert full is not None and all(np.array_equal(a, b) for a, b in zip(with_classes, full, strict=True))
    wrong = np.zeros(dfa.num_states, dtype=np.int64)  # one block: not a congruence
    assert quotient_by(dfa, wrong, classes) is None


def test_two_byte_pair_estimate_counts_tokens_that_survive_two_bytes(llama3):
    from surecall.grammars.automaton import regex_to_dfa
    from surecall.grammars.compile import _pairs_two_bytes
    from surecall.grammars.tokenwalk import vocab_index

    dfa = regex_to_dfa(r'\{"id": (?:[0-9]{1,3}|"[a-f]*"), "ok": (?:true|false)\}')
    spelled = [t for t in llama3.token_bytes if t]
    first = np.asarray([t[0] for t in spelled])
    second = np.asarray([t[1] if len(t) > 1 else -1 for t in spelled])
    expected = []
    for s in range(dfa.num_states):
        nxt = dfa.trans[s, first]
        ok = nxt >= 0
        two = second >= 0
        ok[two & ok] = dfa.trans[nxt[two & ok], second[two & ok]] >= 0
        expected.append(int(ok.sum()))
    assert _pairs_two_bytes(dfa, vocab_index(llama3)).tolist() == expected
