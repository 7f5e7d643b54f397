"""The synthetic corpus: determinism, schema validity, JSON-hard content, splits, episodes, scoring."""

from __future__ import annotations

import json

import jsonschema
import pytest

from surecall.models.training.corpus import CorpusConfig, generate, render_call
from surecall.models.training.episodes import KINDS, call_message, generate_episodes
from surecall.models.training.evaluate import (
    TURN_KINDS,
    episode_turns,
    make_validators,
    parse_call,
    parse_calls,
    score_call,
    score_turn,
    summarize_turns,
)
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


# --- multi-turn episodes ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def train_episodes():
    return generate_episodes(CorpusConfig(1500, seed=0), seed_tools())


def test_episodes_are_deterministic_and_cover_every_kind_and_turn_kind(train_episodes):
    assert generate_episodes(CorpusConfig(50, seed=0), seed_tools()) == train_episodes[:50]
    assert generate_episodes(CorpusConfig(50, seed=1), seed_tools()) != train_episodes[:50]
    assert {e["kind"] for e in train_episodes} == set(KINDS)
    assert {t["kind"] for t in episode_turns(train_episodes)} == set(TURN_KINDS)


def test_episode_calls_validate_and_every_call_is_answered_by_a_tool_message(train_episodes):
    for episode in train_episodes:
        messages = episode["messages"]
        assert messages[0]["role"] == "user" and messages[-1]["role"] == "assistant"
        assert not messages[-1].get("tool_calls")  # an episode ends with a text answer
        for i, m in enumerate(messages):
            calls = m.get("tool_calls") or []
            for call in calls:
                jsonschema.validate(call["function"]["arguments"], SCHEMAS[call["function"]["name"]])
            replies = messages[i + 1: i + 1 + len(calls)]
            assert [r["role"] for r in replies] == ["tool"] * len(calls)
            assert [r["name"] for r in replies] == [c["function"]["name"] for c in calls]


def test_a_chain_opens_the_first_file_its_search_found(train_episodes):
    chains = [e["messages"] for e in train_episodes
              if e["kind"] == "chain" and e["messages"][1]["tool_calls"][0]["function"]["name"] == "grep_search"
              and len(e["messages"]) > 4]
    assert len(chains) > 20
    for m in chains:
        first_match = m[2]["content"].split(": ", 1)[0].rsplit(":", 1)[0]
        assert m[3]["tool_calls"][0]["function"]["arguments"] == {"path": first_match}


def test_heldout_episodes_have_their_own_phrasings(train_episodes):
    held = generate_episodes(CorpusConfig(400, seed=0, split="heldout"), seed_tools())
    train_text = " ".join(m["content"] for e in train_episodes for m in e["messages"] if m["role"] == "user")
    held_text = " ".join(m["content"] for e in held for m in e["messages"] if m["role"] == "user")
    for phrase in ("In parallel, please", "Describe ", "Howdy"):
        assert phrase in held_text and phrase not in train_text


def test_parse_calls_reads_parallel_calls_and_rejects_text_around_them():
    two = render_call("file_view", {"path": "a"}) + "\n" + render_call("grep_search", {"pattern": "x"})
    assert parse_calls(two) == [("file_view", {"path": "a"}), ("grep_search", {"pattern": "x"})]
    with pytest.raises(ValueError, match="envelopes around the whole completion"):
        parse_calls("Sure. " + two)


def test_score_turn_counts_text_answers_right_tools_and_bad_calls():
    validators = make_validators(seed_tools())
    ask = [{"role": "user", "content": "q"}]
    call_turn = {"messages": ask, "kind": "first_call",
                 "gold": call_message([("file_view", {"path": "a.py"})])}
    text_turn = {"messages": ask, "kind": "text_only", "gold": {"role": "assistant", "content": "hi"}}
    good = score_turn(render_call("file_view", {"path": "a.py"}), call_turn, validators)
    wrong_tool = score_turn(render_call("grep_search", {"pattern": "a"}), call_turn, validators)
    broken = score_turn('<tool_call>\n{"name": "file_view"', call_turn, validators)
    text_ok = score_turn("Hello!", text_turn, validators)
    needless = score_turn(render_call("file_view", {"path": "a.py", "limit": 0}), text_turn, validators)
    assert good.is_exact and wrong_tool.is_valid and not wrong_tool.is_right_tool
    assert broken.is_call and not broken.is_parsed
    assert text_ok.is_right_tool and not needless.is_right_tool and not needless.is_valid
    rates = summarize_turns([good, wrong_tool, broken, text_ok, needless])
    assert rates["all"]["right_tool_rate"] == 1 / 3 and rates["all"]["text_answer_rate"] == 0.5
    assert rates["all"]["bad_call_rate"] == 2 / 4  # broken and needless (limit 0) of 4 tries
    assert rates["text_only"]["num_turns"] == 2 and "call_rate" not in rates["text_only"]
