"""The official JSON-Schema-Test-Suite (draft 2020-12) against the grammar: sound everywhere.

Every schema of ../shared/data/json-schema-test-suite/draft2020-12 is compiled over a byte
vocabulary (token id = byte, so a text is its own token sequence). Every instance the table
accepts, in the three spellings the grammar may write (compact, one space, its own key order),
must validate, except where it breaks only a keyword the compiler listed as relaxed: a table
never lets through what the validator would refuse for an enforced keyword. Schemas the
compiler refuses with a typed error (remote refs, custom vocabularies) are counted, not failed.
"""

from __future__ import annotations

import json

import pytest

from surecall.errors import SurecallError
from surecall.grammars.compile import compile_schema
from surecall.grammars.schema.render import grammar_dumps
from surecall.grammars.vocab.core import Vocab
from surecall.grammars.walk import accepts, schema_violations

BYTES = Vocab(token_bytes=tuple(bytes([b]) for b in range(256)) + (b"",), special_ids=frozenset({256}),
              stop_ids=(256,), logits_width=257, format="test", name="bytes")


def _spellings(data, schema) -> set[str]:
    texts = {json.dumps(data), json.dumps(data, separators=(",", ":"))}
    try:
        texts.add(grammar_dumps(data, schema))
    except Exception:  # noqa: BLE001 - a schema the renderer cannot follow keeps the plain spellings
        pass
    return texts


def test_every_accepted_suite_instance_validates_on_the_enforced_keywords(data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SURECALL_CACHE_DIR", str(tmp_path))
    folder = data_dir / "json-schema-test-suite" / "draft2020-12"
    if not folder.is_dir():
        pytest.skip(f"JSON-Schema-Test-Suite not found under {folder}")
    compiled = refused = checked = accepted_invalid_relaxed = 0
    unsound = []
    for path in sorted(folder.glob("*.json")):
        for group in json.loads(path.read_text()):
            schema = group["schema"]
            try:
                table = compile_schema(schema, BYTES, use_cache=False)
            except SurecallError:
                refused += 1
                continue
            compiled += 1
            for case in group["tests"]:
                if not any(accepts(table, list(t.encode())) for t in _spellings(case["data"], schema)):
                    continue
                checked += 1
                if case["valid"]:
                    continue
                hard, _ = schema_violations(schema, case["data"], table.relaxed)
                if hard:
                    unsound.append(f"{path.name}: {group['description']} / {case['description']}: {hard[0]}")
                else:
                    accepted_invalid_relaxed += 1
    assert not unsound, unsound
    # 383 schemas: 311 compile; refused are remote or $id-relative refs, dynamic refs and unsatisfiable ones
    assert compiled >= 300 and refused <= 80 and checked >= 500, (compiled, refused, checked)
