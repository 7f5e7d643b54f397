"""Large JSONSchemaBench schemas that compile once their slow spots are fixed: random walks validate.

Github_ultra o65418 is a root anyOf of three `required` variants of one object that holds a
26k-state value: its alternatives are joined as one spliced alternation (grammars/splice.py), not
a subset construction over the three spliced DFAs. Timing is benchmarks/compile.py's concern;
here the table must come out and every walk must satisfy the schema (relaxed keywords aside).
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
