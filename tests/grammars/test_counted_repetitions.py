"""A group repeated more than max_bounded_length times inside a pattern rides the string counter.

`^(?:\\S+\\s+){0,49}\\S+$` (a word count: the Digital Marketplace schemas, Github_hard o21073 and
o21076) was widened to `*` and listed as relaxed. pattern.counted_repetition reads it rotated,
`A (?:B A){n,m}`, and to_regex writes a counted string whose counter counts the iterations: a
TICK mark after each iteration's first character (B's first: the whitespace after a word), which
the counted cut turns into edges that add one (grammars/counted.py). The kernels are unchanged:
count_chars then holds iterations instead of characters (tests/kernels/test_kernels_counted.py
runs such a body through every kernel). Checked here against jsonschema: both ends of the bound,
escapes and multi-byte whitespace, tokens that cross several iterations, random walks under
tight budgets, and the shapes that stay as before.
"""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest
from test_counted_strings import _ids, replay

from surecall.grammars.compile import compile_schema
from surecall.grammars.counted import ticks_countable
from surecall.grammars.schema.pattern import counted_repetition
from surecall.grammars.schema.to_regex import expand_counts, schema_to_regex, ticked_string_regex
from surecall.grammars.vocab.core import Vocab
from surecall.grammars.walk import accepts, decode, kept, random_walk

WORDS = "^(?:\\S+\\s+){{0,{n}}}\\S+$"


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SURECALL_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def llama3(data_dir):
    from conftest import cached_vocab

    return cached_vocab("llama3")


def words_vocab() -> Vocab:
    """Every byte, plus tokens that hold several words, escaped and multi-byte whitespace, and
    tokens that open or close the string around words."""
    pieces = [bytes([b]) for b in range(256)]
    pieces += [b'{"a": "', b'"}', b" w", b" w w", b"w w w ", b"ww", b"\\n", b"\\nw", b"\\r\\n", b"\\t \\t",
               b"\xe3\x80\x80", b"w\xe3\x80\x80w", b'w"}', b'"w w', b" ", b"  "]
    pieces += [b""]
    stop = len(pieces) - 1
    return Vocab(token_bytes=tuple(pieces), special_ids=frozenset({stop}), stop_ids=(stop,),
                 logits_width=len(pieces) + 3, format="test", name="repetition-synthetic")


def schema_of(pattern: str, **more) -> dict:
    return {"type": "object", "properties": {"a": {"type": "string", "pattern": pattern, **more}},
            "required": ["a"], "additionalProperties": False}


@pytest.mark.parametrize("pattern, expected", [
    (WORDS.format(n=49), ("(?:\\S)+", "\\s", 0, 49, False)),
    ("^$|(^(?:\\S+\\s+){0,99}\\S+$)", ("(?:\\S)+", "\\s", 0, 99, True)),
    ("^([a-z]+, ){2,60}[a-z]+$", ("(?:[a-z])+", ",", 2, 60, False)),
    ("^(?:ab){0,60}a$", ("a", "b", 0, 60, False)),
    (WORDS.format(n=48), None),  # within max_bounded_length: spelled out as before
    ("^(?:\\S+\\s+){0,49}\\S+", None),  # unanchored end
    ("^(?:\\S+\\s*){0,49}\\S+$", None),  # B may be empty: no first character to count
    ("^(?:\\S+\\s+){60,70}\\S+$", None),  # more iterations required than can be spelled
    ("^(?:a|b){0,60}a$", None),
    ("^(?:ab){0,60}c$", None),  # the text after the group is not its start
    ("^(?:a\\s+b{300}){0,60}a$", None),  # a part past max_bounded_length (4x for one byte) itself
])
def test_counted_repetition_recognises_a_rotatable_group(pattern, expected):
    found = counted_repetition(pattern, 48)
    if expected is None:
        assert found is None
        return
    lead, first, low, high, empty = expected
    assert (found.low, found.high, found.empty) == (low, high, empty)
    # the parts as Python `re` reads them (the bodies are JSON-escaped string-body regexes)
    assert re.fullmatch(found.lead, "ab" if "a-z" in lead or "S" in lead else "a")
    assert re.fullmatch(found.first, " " if first == "\\s" else first)


@pytest.mark.parametrize("n", [49, 60, 512, 8192])
def test_word_counts_hit_both_ends_exactly_and_validate(n):
    vocab = words_vocab()
    schema = schema_of(WORDS.format(n=n))
    table = compile_schema(schema, vocab)
    assert table.relaxed == [] and table.has_counts
    for words, sep in ((n + 1, " "), (n + 1, "\\n"), (n + 1, " \\r\\n"), (n + 1, "\u3000"), (n + 2, " "), (1, ""),
                       (n + 2, "\\t \\t")):
        text = '{"a": "' + sep.join(["w"] * words) + '"}'
        valid = jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
        assert valid == (words <= n + 1)
        assert accepts(table, _ids(vocab, text)) == valid, (words, sep)
    longest = _walk_most(table, vocab)
    assert len(longest.split()) == n + 1  # the counter let exactly the last word in, no more
    jsonschema.validate({"a": longest}, schema)


def _walk_most(table, vocab) -> str:
    """The string a walk writes taking a token that adds the most iterations while one may, then
    closing it (a word character where neither is allowed)."""
    ids = _ids(vocab, '{"a": "')
    state, counter = replay(table, ids)
    word = vocab.token_bytes.index(b"w")
    while table.count_row[state] >= 0:
        toks, nexts = table.transitions(state)
        choice = np.flatnonzero(kept(table, state, counter, toks, nexts, 10**6))
        v = table.count_chars[table.count_row[state], toks[choice]].astype(np.int64)
        adds, closes = np.where((v & 1) == 0, v // 2, -1), (v & 1) == 1
        if adds.max() > 0:
            i = int(choice[np.argmax(adds)])
        elif closes.any():
            i = int(choice[np.argmax(closes)])
        else:
            i = int(np.flatnonzero(toks == word)[0])
        ids.append(int(toks[i]))
        state, counter = int(nexts[i]), table.next_counter(state, counter, int(toks[i]))
    text = decode(vocab, ids).decode()
    return json.JSONDecoder().raw_decode(text, len('{"a": "') - 1)[0]


def test_a_token_that_crosses_several_words_counts_each(llama3):
    vocab = words_vocab()
    table = compile_schema(schema_of(WORDS.format(n=49)), vocab)
    state, counter = replay(table, _ids(vocab, '{"a": "w'))
    multi = vocab.token_bytes.index(b" w w")
    assert table.next_counter(state, counter, multi) == counter + 2
    # two words short of the bound, a three-word token does not fit, a two-word one does
    state, counter = replay(table, _ids(vocab, '{"a": "' + " ".join(["w"] * 48)))
    assert counter == 47
    assert table.count_allows(state, counter, np.asarray([multi]))[0]
    state, counter = replay(table, _ids(vocab, '{"a": "' + " ".join(["w"] * 49)))
    assert not table.count_allows(state, counter, np.asarray([multi]))[0]
    assert table.count_allows(state, counter, np.asarray([vocab.token_bytes.index(b" w")]))[0]


@pytest.mark.parametrize("pattern", [WORDS.format(n=49), "^$|(^(?:\\S+\\s+){0,99}\\S+$)"])
def test_random_walks_validate_on_a_real_vocabulary_even_when_cut_short(llama3, pattern):
    schema = schema_of(pattern)
    table = compile_schema(schema, llama3)
    assert table.relaxed == [] and table.has_counts
    rng = np.random.default_rng(7)
    for max_tokens in (None, 8, 12, 30):
        for _ in range(4):
            ids = random_walk(table, llama3, rng, max_tokens=max_tokens)
            assert max_tokens is None or len(ids) <= max_tokens
            jsonschema.validate(json.loads(decode(llama3, ids)), schema)


def test_the_empty_branch_follows_min_length():
    pattern = "^$|(^(?:\\S+\\s+){0,99}\\S+$)"
    free = re.compile(expand_counts(schema_to_regex({"type": "string", "pattern": pattern}).regex))
    assert free.fullmatch('""') and free.fullmatch('"a b"')
    result = schema_to_regex({"type": "string", "pattern": pattern, "minLength": 1})
    assert result.relaxed == []
    at_least_one = re.compile(expand_counts(result.regex))
    assert not at_least_one.fullmatch('""') and at_least_one.fullmatch('"a"')


def test_expand_counts_spells_the_iterations_for_python_re():
    regex = re.compile(expand_counts(schema_to_regex({"type": "string", "pattern": WORDS.format(n=60)}).regex))
    assert regex.fullmatch('"' + " ".join(["w"] * 61) + '"')
    assert not regex.fullmatch('"' + " ".join(["w"] * 62) + '"')
    lower = re.compile(expand_counts(schema_to_regex({"type": "string", "pattern": "^([a-z]+, ){2,60}[a-z]+$"}).regex))
    assert lower.fullmatch('"a, b, c"') and not lower.fullmatch('"a, b"')
    assert lower.fullmatch('"' + ", ".join(["x"] * 61) + '"') and not lower.fullmatch('"' + ", ".join(["x"] * 62) + '"')


@pytest.mark.parametrize("schema, keyword", [
    ({"type": "string", "pattern": WORDS.format(n=49), "maxLength": 500}, "pattern"),  # the counter counts characters
    ({"type": "string", "pattern": WORDS.format(n=49), "minLength": 30}, "pattern"),  # ... to fold the minimum in
    ({"type": "string", "pattern": WORDS.format(n=49), "format": "email"}, "pattern"),
    ({"type": "string", "pattern": "^(?:[a-z]+[a-z0-9]){0,60}[a-z]+$"}, "pattern"),  # iterations not told apart
])
def test_where_the_counter_is_taken_or_iterations_blur_the_pattern_stays_listed(schema, keyword):
    result = schema_to_regex(schema)
    assert (("", keyword) in result.relaxed) and "a repeated group's bound above max_bounded_length=48" in \
        result.reasons[("", keyword)]


def test_iterations_the_counter_cannot_tell_apart_are_refused_by_the_cut():
    blurred = counted_repetition("^(?:[a-z]+[a-z0-9]){0,60}[a-z]+$", 48)
    assert blurred is not None and not ticks_countable(ticked_string_regex(blurred))
    assert ticks_countable(ticked_string_regex(counted_repetition(WORDS.format(n=49), 48)))


def test_beside_other_strings_in_a_union_it_merges_or_widens_without_costing_other_counters(llama3):
    """A union puts every string behind one `"`: the other strings join the repetition's body
    (they start no iteration) where each string still has one count, else the repetition is
    widened and listed with that reason; either way the other strings keep their counters."""
    words = {"type": "string", "pattern": WORDS.format(n=49)}
    beside_int = schema_to_regex({"anyOf": [words, {"type": "integer"}]})
    assert beside_int.relaxed == []
    beside_array = schema_to_regex({"anyOf": [words, {"type": "array", "items": words}]})  # not a string leaf
    assert beside_array.relaxed == []
    merged = schema_to_regex({"anyOf": [words, {"const": ""}]})  # no iteration starts in `""`
    assert merged.relaxed == []
    spelled = re.compile(expand_counts(merged.regex))
    assert spelled.fullmatch('""') and spelled.fullmatch('"' + " ".join(["w"] * 50) + '"')
    assert not spelled.fullmatch('"' + " ".join(["w"] * 51) + '"')
    schema = {"type": "object", "properties": {"a": {"anyOf": [words, {"enum": ["x y"]}]},
                                               "b": {"type": "string", "maxLength": 100}}, "required": ["a", "b"]}
    overlapping = schema_to_regex(schema)  # "x y" would start an iteration one branch counts and one does not
    assert overlapping.relaxed == [("/properties/a/anyOf/0", "pattern")]
    assert "union" in overlapping.reasons[("/properties/a/anyOf/0", "pattern")]
    table = compile_schema(schema, llama3)
    assert table.relaxed == [("/properties/a/anyOf/0", "pattern")] and table.has_counts  # b is still counted
    assert "counted_fallback" not in table.meta
