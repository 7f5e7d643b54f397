"""Idempotency keys: RFC 8785 canonicalisation against the published vectors, derive_key properties."""

from __future__ import annotations

import struct

import pytest

from surecall.dispatch.idempotency import (
    ProbeOutcome,
    RecordState,
    as_outcome,
    canonical_json,
    derive_key,
    fingerprint,
    split_key,
)
from surecall.errors import ArgumentValidationError, IdempotencyConflict

VECTORS = ["arrays", "french", "structures", "unicode", "values", "weird"]


@pytest.fixture(scope="module")
def jcs_dir(data_dir):
    path = data_dir / "rfc8785"
    if not path.exists():
        pytest.skip(f"{path} not found")
    return path


@pytest.mark.parametrize("name", VECTORS)
def test_canonical_json_matches_rfc8785_vectors(jcs_dir, name):
    import json

    value = json.loads((jcs_dir / "input" / f"{name}.json").read_text(encoding="utf-8"))
    expected = (jcs_dir / "output" / f"{name}.json").read_bytes()
    assert canonical_json(value) == expected
    hex_expected = bytes.fromhex("".join((jcs_dir / "outhex" / f"{name}.txt").read_text().split()))
    assert canonical_json(value) == hex_expected


def test_es6_number_serialisation_10k(jcs_dir):
    lines = (jcs_dir / "numbers" / "es6testfile_10k.txt").read_text().splitlines()
    assert len(lines) == 10_000
    wrong = []
    for line in lines:
        hex_bits, expected = line.split(",")
        value = struct.unpack(">d", bytes.fromhex(hex_bits.zfill(16)))[0]
        if canonical_json(value).decode() != expected:
            wrong.append(line)
    assert wrong == []


def test_derive_key_is_stable_and_separates_every_field():
    base = derive_key("traj-1", 3, "call-7", "file_edit", {"path": "a.py", "n": 1.0})
    assert base == derive_key("traj-1", 3, "call-7", "file_edit", {"n": 1, "path": "a.py"})  # key order, 1.0 == 1
    others = {
        derive_key("traj-2", 3, "call-7", "file_edit", {"path": "a.py", "n": 1}),
        derive_key("traj-1", 4, "call-7", "file_edit", {"path": "a.py", "n": 1}),
        derive_key("traj-1", 3, "call-8", "file_edit", {"path": "a.py", "n": 1}),
        derive_key("traj-1", 3, "call-7", "file_view", {"path": "a.py", "n": 1}),
    }
    assert base not in others and len(others) == 4
    # fields are JSON-array items: no separator can be forged by moving text between fields
    assert derive_key("a|b", 1, "c", "t", {}) != derive_key("a", 1, "b|c", "t", {})
    slot, fp = split_key(base)
    assert len(slot) == 64 and fp == fingerprint({"path": "a.py", "n": 1})
    changed = derive_key("traj-1", 3, "call-7", "file_edit", {"path": "b.py", "n": 1})
    assert split_key(changed)[0] == slot and split_key(changed)[1] != fp  # same slot, other arguments


def test_canonicalisation_errors_are_typed():
    with pytest.raises(ArgumentValidationError, match="within 2\\^53"):
        derive_key("t", 1, "c", "tool", {"n": 2**60})
    with pytest.raises(ArgumentValidationError, match="cannot canonicalise"):
        derive_key("t", 1, "c", "tool", {"s": "\ud800"})
    with pytest.raises(ArgumentValidationError, match="cannot canonicalise"):
        canonical_json({"f": float("nan")})
    with pytest.raises(IdempotencyConflict, match="Invalid idempotency key"):
        split_key("")


def test_probe_outcomes():
    assert as_outcome(True) == ProbeOutcome(True)
    assert as_outcome(None).executed is None
    assert as_outcome(ProbeOutcome(False)).executed is False
    with pytest.raises(TypeError, match="a probe must return"):
        as_outcome("yes")
    assert RecordState("IN_DOUBT") is RecordState.IN_DOUBT
