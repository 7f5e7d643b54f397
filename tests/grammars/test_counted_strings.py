"""Counted string lengths (grammars/counted.py): bounds of any size enforced exactly by a counter.

Checked on the host side of the TokenTable contract (table.count_allows / next_counter and
walk.kept, the rule the kernels implement): the mask at a body's boundary for counters around
both bounds, walks that stop as early and as late as the counter allows, random walks inside
tight budgets, escapes and multi-byte characters counted as one, tokens that open or close a
string, the fallback when a body cannot be cut out, the disk cache and concatenation.
"""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from surecall.grammars import cache as table_cache
from surecall.grammars.compile import compile_catalog, compile_schema
from surecall.grammars.options import GrammarOptions
from surecall.grammars.schema.to_regex import COUNT_ENTER, NO_MAX_LENGTH
from surecall.grammars.table import TokenTable
from surecall.grammars.vocab.core import Vocab
from surecall.grammars.walk import accepts, decode, kept, random_walk
from surecall.tools.catalog import seed_tools

SIZES = [1, 48, 49, 60, 512, 8192]


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SURECALL_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def llama3(data_dir):
    from conftest import cached_vocab

    return cached_vocab("llama3")


def counted_vocab() -> Vocab:
    """Every byte, plus tokens that cross a string's edges, escapes and split UTF-8 characters."""
    pieces = [bytes([b]) for b in range(256)]
    pieces += [b'{"a": "', b'": "', b'"}', b'","', b'"xy"', b'ab', b'abc', b'\\n', b'\\"', b'\\u00e9',
               b'\xc3\xa9', b'\xe2\x82', b'\xac"}', b'\xac', b'"x', b'a"}', b'\\ud83d\\ude00']
    pieces += [b""]
    stop = len(pieces) - 1
    return Vocab(token_bytes=tuple(pieces), special_ids=frozenset({stop}), stop_ids=(stop,),
                 logits_width=len(pieces) + 5, format="test", name="counted-synthetic")


def string_schema(lo: int | None, hi: int | None) -> dict:
    s = {"type": "string"}
    if lo is not None:
        s["minLength"] = lo
    if hi is not None:
        s["maxLength"] = hi
    return {"type": "object", "properties": {"a": s}, "required": ["a"], "additionalProperties": False}


def replay(table: TokenTable, ids: list[int]) -> tuple[int, int]:
    """(state, counter) after `ids` from the start, checking each token is allowed."""
    state, counter = 0, 0
    for t in ids:
        nxt = table.next_state(state, t)
        assert nxt is not None and table.count_allows(state, counter, np.asarray([t]))[0], t
        state, counter = nxt, table.next_counter(state, counter, t)
    return state, counter


def extreme_walk(table: TokenTable, rng, early: bool, max_tokens: int = 20000) -> list[int]:
    """A walk that closes each counted string as soon as (early) or as late as (not early) it may."""
    state, counter, out = 0, 0, []
    while True:
        remaining = max_tokens - len(out)
        toks, nexts = table.transitions(state)
        ok = kept(table, state, counter, toks, nexts, remaining)
        if table.accept[state]:
            return out
        choice = np.flatnonzero(ok)
        if table.count_row[state] >= 0:
            v = table.count_chars[table.count_row[state], toks[choice]].astype(np.int64)
            closes = (v & 1) == 1
            if early:
                room = int(table.count_lo[state]) - counter
                fits = v // 2 <= room
                if closes.any():  # the closing token that adds the fewest characters
                    pick = choice[closes & (v // 2 == (v // 2)[closes].min())]
                else:  # the longest step that does not pass the minimum
                    pick = choice[fits & (v // 2 == (v // 2)[fits].max())]
            else:
                pick = choice[~closes] if (~closes).any() else choice[closes]
                if (~closes).any():
                    most = (v // 2)[~closes].max()
                    pick = choice[~closes & (v // 2 == most)]
        else:  # open strings empty, so the body's own steps decide its length
            empty = [i for i in choice.tolist() if table.next_counter(state, counter, int(toks[i])) == 0]
            pick = np.asarray(empty) if empty else choice
        i = int(rng.choice(pick))
        out.append(int(toks[i]))
        state, counter = int(nexts[i]), table.next_counter(state, counter, int(toks[i]))


@pytest.mark.parametrize("size", SIZES)
def test_mask_at_the_body_boundary_follows_the_counter(llama3, size):
    table = compile_schema(string_schema(size, size), llama3)
    assert table.relaxed == [] and table.has_counts
    head, c0 = replay(table, _ids(llama3, '{"a": "'))
    assert table.count_row[head] >= 0 and c0 == 0
    quote, x = _ids(llama3, '"')[0], _ids(llama3, "x")[0]
    for counter in sorted({0, size - 1, size, size + 1}):
        allows = table.count_allows(head, counter, np.asarray([quote, x]))
        assert bool(allows[0]) == (counter == size), counter  # closing only at exactly `size`
        assert bool(allows[1]) == (counter + 1 <= size), counter
        assert table.need(head, counter) == -(-max(size - counter, 0) // table.count_fill)


def _ids(vocab, text: str) -> list[int]:
    """Greedy longest-match ids of `text` (enough for a prefix of plain ASCII)."""
    index = {b: i for i, b in enumerate(vocab.token_bytes) if b and i not in vocab.special_ids}
    longest = max(map(len, index))
    data, out, at = text.encode(), [], 0
    while at < len(data):
        n = max(k for k in range(1, min(longest, len(data) - at) + 1) if data[at : at + k] in index)
        out.append(index[data[at : at + n]])
        at += n
    return out


@pytest.mark.parametrize("size", SIZES)
def test_walks_hit_both_ends_exactly_and_validate(llama3, size):
    lo, hi = max(1, size // 2), size
    schema = string_schema(lo, hi)
    table = compile_schema(schema, llama3)
    rng = np.random.default_rng(size)
    for early, expected in ((True, lo), (False, hi)):
        doc = json.loads(decode(llama3, extreme_walk(table, rng, early)))
        jsonschema.validate(doc, schema)
        assert len(doc["a"]) == expected
    exact = compile_schema(string_schema(size, size), llama3)
    for i in range(3):
        budget = int(exact.dist[0]) + i
        ids = random_walk(exact, llama3, rng, max_tokens=budget)
        assert len(ids) <= budget and accepts(exact, ids)
        assert len(json.loads(decode(llama3, ids))["a"]) == size


def test_dist_counts_the_unmet_minimum(llama3):
    table = compile_schema(string_schema(8192, 8192), llama3)
    assert int(table.dist[0]) >= 8192 // table.count_fill
    with pytest.raises(Exception, match="below"):
        random_walk(table, llama3, np.random.default_rng(0), max_tokens=int(table.dist[0]) - 1)


def test_escapes_and_multibyte_characters_count_once():
    vocab = counted_vocab()
    table = compile_schema(string_schema(2, 2), vocab)
    ids = {piece: i for i, piece in enumerate(vocab.token_bytes)}

    def run(*pieces: bytes) -> tuple[int, int]:
        return replay(table, [ids[p] for p in pieces])

    assert run(b'{"a": "', b"\\n")[1] == 1
    assert run(b'{"a": "', b"\\u00e9", b"\xc3\xa9")[1] == 2
    assert run(b'{"a": "', b"\\ud83d\\ude00")[1] == 1  # a surrogate pair is one code point
    state, counter = run(b'{"a": "', b"a", b"\xe2\x82")  # a character started mid-token counts
    assert counter == 2 and table.count_row[state] >= 0
    assert table.count_allows(state, counter, np.asarray([ids[b'\xac"}']]))[0]  # finishes it, closes
    assert accepts(table, [ids[p] for p in (b'{"a": "', b"a", b"\xe2\x82", b'\xac"}')])
    assert not accepts(table, [ids[p] for p in (b'{"a": "', b"\xe2\x82", b'\xac"}')])  # one character
    assert not accepts(table, [ids[p] for p in (b'{"a": "', b"abc", b'"}')])
    assert accepts(table, [ids[p] for p in (b'{"a": "', b"ab", b'"}')])
    assert accepts(table, [ids[p] for p in (b'{"a": "', b"a", b'a"}')])
    assert not accepts(table, [ids[p] for p in (b'{"a": "', b'a"}')])


def test_tokens_that_open_or_pass_through_a_string_are_checked():
    vocab = counted_vocab()
    ids = {piece: i for i, piece in enumerate(vocab.token_bytes)}
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {
        "type": "string", "minLength": 2, "maxLength": 3}}}, "required": ["a"]}
    table = compile_schema(schema, vocab)
    start = _ids(vocab, '{"a": [')
    state, _ = replay(table, start)
    assert table.next_state(state, ids[b'"xy"']) is not None  # a whole two-character string: allowed
    state_x, counter = replay(table, start + [ids[b'"x']])
    assert counter == 1 and table.count_row[state_x] >= 0  # opened with one character already
    one = start + [ids[b'"'], ids[b"a"], ids[b'","']]  # closes at 1 character: below minLength
    assert not accepts(table, one + [ids[b"ab"], ids[b'"'], ids[b"]"], ids[b"}"]])
    two = start + [ids[b'"'], ids[b"ab"], ids[b'","'], ids[b"abc"], ids[b'"'], ids[b"]"], ids[b"}"]]
    assert accepts(table, two)
    rng = np.random.default_rng(1)
    for _ in range(40):
        doc = json.loads(decode(vocab, random_walk(table, vocab, rng, max_tokens=40)))
        jsonschema.validate(doc, schema)


def test_uncuttable_body_falls_back_to_the_plain_grammar():
    vocab = counted_vocab()
    schema = {"anyOf": [{"type": "string", "maxLength": 3}, {"const": "abcdef"}]}
    table = compile_schema(schema, vocab)
    assert "counted_fallback" in table.meta and not table.has_counts
    assert table.relaxed == []  # 3 <= max_bounded_length: spelled out instead
    rng = np.random.default_rng(2)
    for _ in range(20):
        jsonschema.validate(json.loads(decode(vocab, random_walk(table, vocab, rng, max_tokens=30))), schema)


HOSTS = {"type": "object", "properties": {
    "host": {"type": "string", "anyOf": [{"format": "hostname"}, {"format": "ipv4"}, {"format": "ipv6"}]},
    "name": {"type": "string", "maxLength": 255}}, "required": ["host", "name"], "additionalProperties": False}
CHOICE = {"type": "object", "properties": {"v": {"anyOf": [
    {"type": "string", "minLength": 1, "maxLength": 64}, {"enum": ["auto", "none", 3]}]}},
    "required": ["v"], "additionalProperties": False}


@pytest.mark.parametrize("schema", [HOSTS, CHOICE], ids=["hostname-ipv4-ipv6", "bounded-or-enum"])
def test_a_union_of_a_counted_string_and_other_strings_is_one_counted_string(llama3, schema):
    """A counted string beside other strings under one anyOf (they share the opening quote) is one
    counted body of the union, not a fallback to uncounted strings (Snowplow sp_367: 100 MB, 7
    maxLength relaxed)."""
    table = compile_schema(schema, llama3)
    assert "counted_fallback" not in table.meta and table.has_counts and table.relaxed == []
    checker = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    rng = np.random.default_rng(7)
    for i in range(24):
        budget = None if i % 2 else int(table.dist[0]) + 2
        doc = json.loads(decode(llama3, random_walk(table, llama3, rng, max_tokens=budget)))
        assert not list(checker.iter_errors(doc)), doc
    for early in (True, False):
        doc = json.loads(decode(llama3, extreme_walk(table, rng, early)))
        assert not list(checker.iter_errors(doc)), doc


def test_the_merged_union_accepts_each_branch_and_keeps_the_bound(llama3):
    hosts = compile_schema(HOSTS, llama3)
    for host in ("example.com", "10.0.0.255", "::1", "fe80::1:2", "a" * 63):
        assert accepts(hosts, _ids(llama3, json.dumps({"host": host, "name": "n"}))), host
    for host in ("a" * 64, "a..b", "a_b", "-a.com", ":::1:", ""):
        assert not accepts(hosts, _ids(llama3, json.dumps({"host": host, "name": "n"}))), host
    choice = compile_schema(CHOICE, llama3)
    for value in ("auto", 3, "x", "y" * 64):
        assert accepts(choice, _ids(llama3, json.dumps({"v": value}))), value
    for value in ("", "y" * 65, 4):
        assert not accepts(choice, _ids(llama3, json.dumps({"v": value}))), value


def test_strings_outside_the_counted_bound_keep_the_union_apart():
    from surecall.grammars.counted import body_char_range
    from surecall.grammars.schema.to_regex import schema_to_regex

    assert body_char_range("(?:[0-9]{1,3})(?:\\.[0-9]{1,3}){3}") == (7, 15)
    assert body_char_range("a(?:b|\\\\n)*") == (1, None)
    assert body_char_range('a"b') is None  # a quote inside: not one string's body
    # "abcdef" is longer than maxLength 3; two counted strings with different bounds: not merged
    for schema in ({"anyOf": [{"type": "string", "maxLength": 3}, {"const": "abcdef"}]},
                   {"anyOf": [{"type": "string", "maxLength": 70}, {"type": "string", "minLength": 80}]}):
        regex = schema_to_regex(schema, GrammarOptions()).regex
        assert regex.count(f"\\x{COUNT_ENTER:02x}") == sum("Length" in str(b) for b in schema["anyOf"])


def test_cache_round_trip_keeps_the_counters():
    vocab = counted_vocab()
    schema = string_schema(2, 70)
    first = compile_schema(schema, vocab)
    again = compile_schema(schema, vocab)  # from the disk cache
    assert again.has_counts and again.count_fill == first.count_fill
    for name in ("count_row", "count_lo", "count_hi", "count_chars", "count_entry_key", "count_entry_val"):
        assert np.array_equal(getattr(first, name), getattr(again, name)), name
    assert table_cache.load("no-such-key") is None


def test_concat_offsets_the_counters():
    vocab = counted_vocab()
    counted = compile_schema(string_schema(2, 70), vocab)
    plain = compile_schema({"type": "integer"}, vocab)
    both, offsets = TokenTable.concat([plain, counted])
    assert both.has_counts and np.all(both.count_row[: plain.num_states] == -1)
    assert np.array_equal(both.count_row[offsets[1]:], counted.count_row)
    expected = counted.count_entry_key + int(offsets[1]) * vocab.logits_width
    assert np.array_equal(both.count_entry_key, expected)


def test_seed_catalog_enforces_every_length_bound(llama3):
    tools = seed_tools()
    table = compile_catalog(tools, llama3)
    plain = compile_catalog(tools, llama3, options=GrammarOptions(counted_lengths=False))
    assert table.relaxed == [] and ("bash_execute#/properties/command", "maxLength") in plain.relaxed
    assert table.num_states < plain.num_states  # bytes: both store their repeated mask rows once
    schemas = {t["name"]: t["parameters"] for t in tools}
    rng = np.random.default_rng(3)
    for i in range(12):
        budget = int(table.dist[0]) + (i % 4) * 3 if i % 2 else 3000
        call = json.loads(decode(llama3, random_walk(table, llama3, rng, max_tokens=budget)))
        jsonschema.validate(call["arguments"], schemas[call["name"]])


@pytest.mark.parametrize("low, high", [(0, 0), (1, 48), (49, 8192), (0, NO_MAX_LENGTH), (15, 16), (NO_MAX_LENGTH - 1, NO_MAX_LENGTH)])
def test_count_marks_are_short_and_read_back(low, high):
    from surecall.grammars.schema.to_regex import count_mark, read_mark_bounds

    mark = count_mark(COUNT_ENTER, low, high)
    assert mark[0] == COUNT_ENTER and all(0x10 <= b <= 0x1F for b in mark[1:])
    digits = sum(len(f"{v:x}") for v in (low, high) if v != NO_MAX_LENGTH)
    assert len(mark) == 3 + digits  # kind, two digit counts, the digits: 8 bytes for (1, 8192), 17 before
    nibbles = iter(b - 0x10 for b in mark[1:])
    assert read_mark_bounds(lambda: next(nibbles)) == (low, high) and next(nibbles, None) is None


def test_a_malformed_count_mark_is_refused():
    from surecall.grammars.schema.to_regex import read_mark_bounds

    nibbles = iter([11, 1, 2])  # 9 and 10 open a counted repetition's marks (to_regex.read_mark)
    with pytest.raises(ValueError, match="Invalid count mark: a bound of 11 hex digits"):
        read_mark_bounds(lambda: next(nibbles))
    nibbles = iter([1, 2, 12, 3])
    with pytest.raises(ValueError, match="Invalid count mark: a bound of 12 hex digits"):
        read_mark_bounds(lambda: next(nibbles))
    nibbles = iter([9, 1, 0, 2, 3, 1])  # a length's reader given a counted repetition's bounds
    with pytest.raises(ValueError, match="a counted repetition's"):
        read_mark_bounds(lambda: next(nibbles))
