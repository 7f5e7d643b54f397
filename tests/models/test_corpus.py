"""The synthetic tool-call corpus: determinism, schema validity, JSON-hard content, splits."""

from __future__ import annotations

import json

import jsonschema
import pytest

from surecall.models.training.corpus import CorpusConfig, generate, render_call
from surecall.models.training.evaluate import make_validators, parse_call, score_call
from surecall.models.training.tokenizer import train_bpe
from surecall.tools.catalog import hardened_seed_tools as seed_tools

SCHEMAS = {t["name"]: t["parameters"] for t in seed_tools()}


@pytest.fixture(scope="module")
def train_rows():
    return generate(CorpusConfig(2000, seed=0, split="train"))


@pytest.fixture(scope="module")
def heldout_rows():
    return generate(CorpusConfig(400, seed=0, split="heldout"))


def test_same_seed_same_rows_and_other_seed_other_rows():
    a = generate(CorpusConfig(300, seed=5))
    assert a == generate(CorpusConfig(300, seed=5))
    assert a != generate(CorpusConfig(300, seed=6))
    assert a[:50] != generate(CorpusConfig(50, seed=5, split="heldout"))


def test_every_call_validates_against_the_seed_schemas(train_rows, heldout_rows):
    for row in train_rows + heldout_rows:
        jsonschema.validate(row["arguments"], SCHEMAS[row["tool"]])
        assert row["messages"][0]["role"] == "user" and row["messages"][0]["content"]


def test_all_four_tools_and_bounds_occur(train_rows):
    assert {r["tool"] for r in train_rows} == set(SCHEMAS)
    timeouts = {r["arguments"].get("timeout_ms") for r in train_rows}
    limits = {r["arguments"].get("limit") for r in train_rows}
    offsets = {r["arguments"].get("offset") for r in train_rows}
    assert {1000, 300_000} <= timeouts
    assert {1, 500} <= limits
    assert {1, 10_000_000} <= offsets
    assert any(r["arguments"].get("allow_multiple") is True for r in train_rows)
    assert any(r["arguments"].get("new_str") == "" for r in train_rows)


def test_calls_carry_json_hard_characters(train_rows):
    calls = [render_call(r["tool"], r["arguments"]) for r in train_rows]
    for escaped in ('\\"', "\\\\", "\\n", "\\t"):
        assert sum(escaped in c for c in calls) > 20, escaped
    assert sum(any(ord(ch) > 127 for ch in c) for c in calls) > 20
    assert max(len(c) for c in calls) > 400


def test_render_call_is_compact_hermes_and_round_trips(train_rows):
    for row in train_rows[:200]:
        text = render_call(row["tool"], row["arguments"])
        assert text.startswith('<tool_call>\n{"name": "') and text.endswith("}\n</tool_call>")
        assert parse_call(text) == (row["tool"], row["arguments"])
        body = text.split("\n", 1)[1].rsplit("\n", 1)[0]
        assert json.loads(body)["arguments"] == row["arguments"]


def test_heldout_has_its_own_phrasings_and_names(train_rows, heldout_rows):
    train_text = " ".join(r["messages"][0]["content"] for r in train_rows)
    held_text = " ".join(r["messages"][0]["content"] for r in heldout_rows)
    for phrase in ("Could you pull up", "There's a bug in", "Can you kick off"):
        assert phrase in held_text and phrase not in train_text
    assert "ledger" not in train_text and "ledger" in held_text


def test_score_call_counts_parse_valid_and_exact():
    validators = make_validators(seed_tools())
    gold = {"path": "a.py", "limit": 5}
    good = render_call("file_view", gold)
    assert score_call(good, "file_view", gold, validators).is_exact
    wrong = score_call(render_call("file_view", {"path": "a.py", "limit": 6}), "file_view", gold,
                       validators)
    assert wrong.is_valid and not wrong.is_exact
    invalid = score_call(render_call("file_view", {"path": "a.py", "limit": 501}), "file_view",
                         gold, validators)
    assert invalid.is_parsed and not invalid.is_valid
    broken = score_call(good[:-3], "file_view", gold, validators)
    assert not broken.is_parsed and "envelope" in broken.error


@pytest.mark.parametrize("text,match", [
    ("hello", "envelope"),
    ("<tool_call>\n{\"name\": \"x\", \n</tool_call>", "not JSON"),
    ("<tool_call>\n[1, 2]\n</tool_call>", "string 'name'"),
    ("<tool_call>\n{\"name\": \"x\", \"arguments\": 3}\n</tool_call>", "object 'arguments'"),
])
def test_parse_call_says_why_text_is_malformed(text, match):
    with pytest.raises(ValueError, match=match):
        parse_call(text)


@pytest.mark.parametrize("kwargs,match", [
    ({"num_rows": 0}, "Invalid num_rows"),
    ({"num_rows": 5, "split": "test"}, "Invalid split"),
])
def test_corpus_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CorpusConfig(**kwargs)


def test_train_bpe_rejects_a_vocab_below_the_byte_alphabet():
    with pytest.raises(ValueError, match="Invalid vocab_size"):
        train_bpe(["abc"], vocab_size=100)


def test_bpe_keeps_escapes_apart_and_round_trips():
    rows = generate(CorpusConfig(300, seed=2))
    texts = [render_call(r["tool"], r["arguments"]) for r in rows]
    tokenizer = train_bpe(texts + [r["messages"][0]["content"] for r in rows], vocab_size=600)
    pieces = [p for p, _ in tokenizer.pre_tokenizer.pre_tokenize_str('a\\nconst user_id\\"')]
    assert pieces == ["a", "\\n", "const", "Ġuser_id", '\\"']
    for text in texts[:50]:
        assert tokenizer.decode(tokenizer.encode(text).ids) == text
