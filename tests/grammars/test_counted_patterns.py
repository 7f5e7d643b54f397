"""`pattern`s that are one anchored character set under one quantifier ride the string counter.

`^[A-Za-z0-9_-]{1,64}$`, `^\\d{1,255}$`, `^.{0,1000}$` say exactly "low..high characters of a set":
grammars/schema/pattern.counted_run recognises them and to_regex writes a counted body with that
set, so any bound (8192 included) is exact, and min/maxLength beside the pattern intersect with
it instead of being relaxed. A large quantifier inside a larger pattern is relaxed with a reason.
"""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest
from test_counted_strings import _ids, counted_vocab, extreme_walk, replay

from surecall.errors import UnsupportedSchema
from surecall.grammars.compile import compile_schema
from surecall.grammars.options import GrammarOptions
from surecall.grammars.schema.pattern import counted_run, loose_run
from surecall.grammars.schema.string_formats import COUNTED_FORMATS, STRING_FORMATS
from surecall.grammars.schema.to_regex import (
    COUNT_ENTER,
    count_mark,
    expand_counts,
    schema_to_regex,
)
from surecall.grammars.walk import accepts, decode, kept, random_walk

SIZES = [1, 48, 49, 60, 512, 8192]


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SURECALL_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def llama3(data_dir):
    from conftest import cached_vocab

    return cached_vocab("llama3")


def pattern_schema(pattern: str, **lengths) -> dict:
    return {"type": "object", "properties": {"a": {"type": "string", "pattern": pattern, **lengths}},
            "required": ["a"], "additionalProperties": False}


@pytest.mark.parametrize("pattern, expected", [
    ("^[a-z]{1,64}$", ("[a-z]", 1, 64)),
    ("^\\d{3,}$", ("[0-9]", 3, None)),
    ("^x$", ("x", 1, 1)),
    ("^[a-z]+?$", ("[a-z]", 1, None)),
    ("[a-z]{3}", None),  # unanchored: a search, any text around it
    ("^[a-z]{3}", None),
    ("^(?:ab){3}$", None),
    ("^[a-z]{2,300}-\\d+$", None),
    ("^a$|^b$", None),
    ("^\\d{3}\\d{2,4}$", ("[0-9]", 5, 7)),  # the same set again: the bounds add up
    ("^aaa$", ("a", 3, 3)),
    ("^a{2}a*$", ("a", 2, None)),
    ("^ab$", None),
])
def test_counted_run_recognises_one_quantified_set(pattern, expected):
    assert counted_run(pattern) == expected


@pytest.mark.parametrize("size", SIZES)
def test_pattern_bounds_hit_both_ends_exactly_and_validate(llama3, size):
    lo = max(1, size // 2)
    schema = pattern_schema(f"^[A-Za-z0-9_-]{{{lo},{size}}}$")
    table = compile_schema(schema, llama3)
    assert table.relaxed == [] and table.has_counts == (size > 8)  # tiny runs are spelled out
    rng = np.random.default_rng(size)
    for early, expected in ((True, lo), (False, size)) if table.has_counts else ():
        doc = json.loads(decode(llama3, extreme_walk(table, rng, early)))
        jsonschema.validate(doc, schema)
        assert len(doc["a"]) == expected
    for i in range(3):  # walks cut by a tight max_tokens still validate
        budget = int(table.dist[0]) + i
        ids = random_walk(table, llama3, rng, max_tokens=budget)
        assert len(ids) <= budget and accepts(table, ids)
        doc = json.loads(decode(llama3, ids))
        jsonschema.validate(doc, schema)
        assert lo <= len(doc["a"]) <= size


def test_min_and_max_length_intersect_with_the_quantifier(llama3):
    schema = pattern_schema("^\\d{1,255}$", minLength=60, maxLength=100)
    table = compile_schema(schema, llama3)
    assert table.relaxed == []
    rng = np.random.default_rng(3)
    lengths = {len(json.loads(decode(llama3, extreme_walk(table, rng, early)))["a"]) for early in (True, False)}
    assert lengths == {60, 100}
    with pytest.raises(UnsupportedSchema, match="unsatisfiable"):
        schema_to_regex({"type": "string", "pattern": "^[a-z]{5,9}$", "maxLength": 4})


def test_the_closing_quote_follows_the_counter_with_the_set():
    vocab = counted_vocab()
    table = compile_schema(pattern_schema("^[a-c]{9,10}$"), vocab)
    assert table.has_counts
    ids = {piece: i for i, piece in enumerate(vocab.token_bytes)}
    start, abc = [ids[b'{"a": "']], [ids[b"abc"]] * 3
    assert accepts(table, start + abc + [ids[b'"}']])
    assert accepts(table, start + abc + [ids[b'a"}']])
    assert not accepts(table, start + abc[:2] + [ids[b"ab"], ids[b'"}']])  # eight characters: below
    assert not accepts(table, start + abc + [ids[b"ab"], ids[b'"}']])  # eleven: above
    assert not accepts(table, start + [ids[b"x"]] + abc + [ids[b'"}']])  # outside the set
    state, counter = replay(table, start + abc)
    assert counter == 9 and table.count_allows(state, counter, np.asarray([ids[b'"}']]))[0]
    assert not table.count_allows(state, 8, np.asarray([ids[b'"}']]))[0]


def test_dot_counts_escapes_once_and_never_allows_a_line_terminator():
    vocab = counted_vocab()
    schema = pattern_schema("^.{9}$")
    table = compile_schema(schema, vocab)
    assert table.has_counts
    ids = {piece: i for i, piece in enumerate(vocab.token_bytes)}
    seven = [ids[b"abc"], ids[b"abc"], ids[b"a"]]
    ok = [ids[b'{"a": "'], *seven, ids[b'\\"'], ids[b"\xc3\xa9"], ids[b'"}']]
    assert accepts(table, ok)
    jsonschema.validate(json.loads(decode(vocab, ok)), schema)
    assert not accepts(table, [ids[b'{"a": "'], *seven, ids[b"\\n"], ids[b"a"], ids[b'"}']])


def test_expand_counts_spells_the_set_for_python_re():
    regex = expand_counts(schema_to_regex({"type": "string", "pattern": "^[a-c]{2,30}$", "maxLength": 12}).regex)
    assert re.fullmatch(regex, '"' + "a" * 12 + '"') and re.fullmatch(regex, '"ab"')
    assert not re.fullmatch(regex, '"a"') and not re.fullmatch(regex, '"' + "a" * 13 + '"')
    assert not re.fullmatch(regex, '"ad"')


def test_without_counters_small_bounds_materialise_and_large_ones_are_relaxed_with_a_reason():
    plain = GrammarOptions(counted_lengths=False)
    small = schema_to_regex({"type": "string", "pattern": "^[a-c]{2,3}$", "maxLength": 2}, plain)
    assert small.relaxed == [] and re.fullmatch(small.regex, '"ab"') and not re.fullmatch(small.regex, '"abc"')
    large = schema_to_regex({"type": "string", "pattern": "^[a-c]{2,300}$"}, plain)
    assert large.relaxed == [("", "pattern")] and "max_bounded_length" in large.reasons[("", "pattern")]


def test_a_large_quantifier_inside_a_larger_pattern_is_relaxed_with_its_reason(llama3):
    schema = {"type": "string", "pattern": "^[a-z]{2,300}-\\d+$"}
    result = schema_to_regex(schema)
    assert result.relaxed == [("", "pattern")]
    assert "inside a larger pattern" in result.reasons[("", "pattern")]
    table = compile_schema(pattern_schema("^[a-z]{2,300}-\\d+$"), llama3)
    assert table.meta["relaxed_reasons"] == ["a repetition bound above max_bounded_length=48 (192 for a set of "
                                             "one-byte characters) inside a larger pattern (widened; only a "
                                             "whole-pattern `^[set]{n,m}$` and a repeated group `^(?:A B){n,m}A$` "
                                             "are counted)"]


@pytest.mark.parametrize("pattern, expected", [
    ("[a-zA-Z0-9_-]{162}", 162), ("^\\w{100,}", 100), ("\\d{64}$", 64), ("(?:[a-z]{70})", 70),
    ("^[a-z]{3}$", None), ("ab{100}", None), ("x\\$", None), ("a|b", None),
])
def test_loose_run_recognises_a_run_with_an_anchor_missing(pattern, expected):
    found = loose_run(pattern)
    assert (found and found[1]) == expected


@pytest.mark.parametrize("pattern", ["[a-zA-Z0-9_-]{162}", "^[0-9a-f]{64,}", "[A-Z]{49,60}$"])
def test_a_long_unanchored_run_is_narrowed_to_a_counted_string_not_relaxed(llama3, pattern):
    """Github_easy o40228 (`[a-zA-Z0-9_-]{162}`): was widened and relaxed, 184 states and 40 MB;
    now the run alone, counted: every sample matches the pattern, nothing relaxed."""
    schema = pattern_schema(pattern)
    table = compile_schema(schema, llama3)
    assert table.relaxed == [] and table.has_counts
    assert [n[:2] for n in table.meta["narrowed"]] == [["/properties/a", "pattern"]]
    low = loose_run(pattern)[1]
    rng = np.random.default_rng(3)
    for early in (True, False, True):  # a late walk of an unbounded run ends when the token budget says so
        ids = extreme_walk(table, rng, early, max_tokens=600)
        doc = json.loads(decode(llama3, ids))
        jsonschema.validate(doc, schema)
        assert len(ids) <= 600 and len(doc["a"]) >= low and (not early or len(doc["a"]) == low)
    small = schema_to_regex(pattern_schema("[a-z]{3}"))  # within max_bounded_length: exact, not narrowed
    assert small.relaxed == [] and not small.narrowed


@pytest.mark.parametrize("pattern, exact", [
    ("^(?:[a-fA-F0-9]{64}|(?:sha1|sha512):(?:[a-fA-F0-9]{40}|[a-fA-F0-9]{128}))$", True),  # Github_hard o57762's shape
    ("^x[a-z]{192}$", True), ("^x[a-z]{193}$", False),  # past 4 x max_bounded_length
    ("^(?:[a-z]+-){0,99}x$", False),  # a repeated group keeps max_bounded_length (one the counter cannot
    # count: a word count is, test_counted_repetitions.py)
    ("^a.{100}b$", False),  # `.` is several bytes (escapes, UTF-8): keeps it too
])
def test_a_run_of_one_byte_characters_inside_a_pattern_is_spelled_out_to_four_times_the_bound(pattern, exact):
    result = schema_to_regex({"type": "string", "pattern": pattern})
    assert (result.relaxed == []) == exact


def test_a_hash_inside_a_pattern_is_written_exactly(llama3):
    pattern = "^(?:[a-f0-9]{64}|md5:[a-f0-9]{32})$"
    schema = pattern_schema(pattern)
    table = compile_schema(schema, llama3)
    assert table.relaxed == []
    rng = np.random.default_rng(5)
    for _ in range(6):
        doc = json.loads(decode(llama3, random_walk(table, llama3, rng)))
        assert re.search(pattern, doc["a"]), doc


BODY_PATTERN = "^[a-z]+(-[a-z]+)*$"  # several character boundaries: a `-` must be followed by a letter


@pytest.mark.parametrize("size", [1, 48, 49, 60, 512])
def test_max_length_beside_a_larger_pattern_is_counted_and_hit_exactly(llama3, size):
    schema = pattern_schema(BODY_PATTERN, maxLength=size)
    table = compile_schema(schema, llama3)
    assert table.relaxed == [] and table.has_counts
    rng = np.random.default_rng(size)
    longest = json.loads(decode(llama3, extreme_walk(table, rng, early=False)))
    jsonschema.validate(longest, schema)
    assert len(longest["a"]) == size
    shortest = json.loads(decode(llama3, extreme_walk(table, rng, early=True)))
    jsonschema.validate(shortest, schema)
    for i in range(4):  # walks cut by a tight budget still finish and validate
        budget = int(table.dist[0]) + i
        ids = random_walk(table, llama3, rng, max_tokens=budget)
        assert len(ids) <= budget and accepts(table, ids)
        jsonschema.validate(json.loads(decode(llama3, ids)), schema)


def test_the_counter_keeps_room_for_what_the_pattern_still_needs():
    vocab = counted_vocab()
    table = compile_schema(pattern_schema(BODY_PATTERN, maxLength=4), vocab)
    ids = {piece: i for i, piece in enumerate(vocab.token_bytes)}
    state, counter = replay(table, [ids[b'{"a": "'], ids[b"a"], ids[b"b"]])
    assert counter == 2  # two letters, and the body may close here
    dash, letter, quote = ids[b"-"], ids[b"c"], ids[b'"']
    assert table.count_allows(state, counter, np.asarray([dash, letter, quote])).all()
    after_dash = table.next_state(state, dash)
    counter = table.next_counter(state, counter, dash)
    assert counter == 4  # "ab-": three started, and the letter a `-` needs
    assert not table.count_allows(after_dash, counter, np.asarray([ids[b"ab"]]))[0]  # "ab-ab" is 5
    assert table.count_allows(after_dash, counter, np.asarray([letter]))[0]
    state, counter = table.next_state(after_dash, letter), table.next_counter(after_dash, counter, letter)
    assert counter == 4 and not table.count_allows(state, counter, np.asarray([dash, letter])).any()
    assert table.count_allows(state, counter, np.asarray([quote]))[0]
    state, counter = replay(table, [ids[b'{"a": "'], ids[b"a"], ids[b"b"], ids[b"c"]])
    assert not table.count_allows(state, counter, np.asarray([dash]))[0]  # "abc-" needs 5


def test_escapes_inside_a_pattern_body_count_once():
    vocab = counted_vocab()
    schema = pattern_schema("^a.+$", maxLength=3)
    table = compile_schema(schema, vocab)
    assert table.relaxed == []
    ids = {piece: i for i, piece in enumerate(vocab.token_bytes)}
    state, counter = replay(table, [ids[b'{"a": "'], ids[b"a"], ids[b'\\"'], ids[b"\xe2\x82"]])
    assert counter == 3  # an escape and a split 3-byte character, one character each
    state, counter = replay(table, [ids[b'{"a": "'], ids[b"a"], ids[b'\\"'], ids[b"\xc3\xa9"]])
    assert counter == 3 and table.count_allows(state, counter, np.asarray([ids[b'"']]))[0]
    assert not table.count_allows(state, counter, np.asarray([ids[b'\\"'], ids[b"b"]])).any()


def test_min_length_beside_a_pattern_is_kept_where_the_pattern_implies_it_else_folded_or_relaxed_with_a_reason():
    implied = schema_to_regex({"type": "string", "pattern": "^\\d+\\.\\d+$", "minLength": 3, "maxLength": 90})
    assert implied.relaxed == []
    above = {"type": "string", "pattern": "^\\d+\\.\\d+$", "minLength": 10, "maxLength": 90}
    assert schema_to_regex(above).relaxed == []  # folded into the pattern's automaton, maxLength counted
    vocab = counted_vocab()
    table = compile_schema(above, vocab, use_cache=False)
    assert not accepts(table, _ids(vocab, '"1234.5678"')) and accepts(table, _ids(vocab, '"1234.56789"'))
    assert not accepts(table, _ids(vocab, '"1.' + "1" * 89 + '"'))  # 91 characters: past maxLength
    far = schema_to_regex({"type": "string", "pattern": "^\\d+\\.\\d+$", "minLength": 100, "maxLength": 190})
    assert far.relaxed == [("", "minLength")]
    assert "above the 3 characters" in far.reasons[("", "minLength")]
    with pytest.raises(UnsupportedSchema, match="unsatisfiable"):  # the pattern needs 3 characters
        schema_to_regex({"type": "string", "pattern": "^\\d+\\.\\d+$", "maxLength": 2})


def test_a_body_with_too_many_states_keeps_its_length_relaxed_with_a_reason():
    bounded_labels = f"^(?:{STRING_FORMATS['email']})$"  # 264 states: labels of 1-20 characters, 1-3 of them
    result = schema_to_regex({"type": "string", "pattern": bounded_labels, "maxLength": 1024})
    assert result.relaxed == [("", "maxLength")]
    assert "states, above the 128 a counter rides" in result.reasons[("", "maxLength")]
    counted = schema_to_regex({"type": "string", "format": "date-time", "maxLength": 30})
    assert counted.relaxed == []


WORDS_PATTERN = "^(?:\\S+\\s+){0,9}\\S+$"  # Github_ultra o62059: 360 body states (UTF-8 phases), 20 character states


def test_a_body_counts_its_character_states_against_the_cap():
    from surecall.grammars.counted import body_fewest_chars

    assert body_fewest_chars(schema_to_regex({"type": "string", "pattern": WORDS_PATTERN}).regex[1:-1]) == 1
    result = schema_to_regex({"type": "string", "pattern": WORDS_PATTERN, "maxLength": 120})
    assert result.relaxed == []


def _body_walk(table, vocab, prefix: str, pick) -> str:
    """The string a walk writes after `prefix` (which opens it), `pick(choice, v)` choosing each
    step among the kept tokens `choice` by their count_chars values `v`."""
    ids = _ids(vocab, prefix)
    state, counter = replay(table, ids)
    while table.count_row[state] >= 0:
        toks, nexts = table.transitions(state)
        choice = np.flatnonzero(kept(table, state, counter, toks, nexts, 10**6))
        i = int(pick(choice, table.count_chars[table.count_row[state], toks[choice]].astype(np.int64)))
        ids.append(int(toks[i]))
        state, counter = int(nexts[i]), table.next_counter(state, counter, int(toks[i]))
    text = decode(vocab, ids).decode()
    return json.JSONDecoder().raw_decode(text, len(prefix) - 1)[0]


def _longest_body(table, vocab, prefix: str) -> str:
    """The string a walk writes after `prefix` taking the most characters it may at each step."""
    def most(choice, v):
        opened = choice[(v & 1) == 0]
        return opened[np.argmax(v[(v & 1) == 0])] if opened.size else choice[np.argmin(v)]

    return _body_walk(table, vocab, prefix, most)


@pytest.mark.parametrize("size", [1, 120])
def test_max_length_beside_a_word_count_pattern_is_hit_exactly(llama3, size):
    schema = pattern_schema(WORDS_PATTERN, maxLength=size)
    table = compile_schema(schema, llama3)
    assert table.relaxed == [] and table.has_counts
    longest = _longest_body(table, llama3, '{"a": "')
    assert len(longest) == size
    jsonschema.validate({"a": longest}, schema)
    rng = np.random.default_rng(size)
    for _ in range(4):
        ids = random_walk(table, llama3, rng)
        jsonschema.validate(json.loads(decode(llama3, ids)), schema)


def test_expand_counts_spells_a_counted_pattern_body_for_python_re():
    regex = expand_counts(schema_to_regex({"type": "string", "pattern": BODY_PATTERN, "maxLength": 5}).regex)
    assert re.fullmatch(regex, '"ab-cd"') and re.fullmatch(regex, '"a"')
    assert not re.fullmatch(regex, '"ab-cde"') and not re.fullmatch(regex, '"ab-"')


# --- formats whose parts are bounded: a free body under a counted total -----------------------


def _validators(schema: dict):
    import jsonschema_rs

    return jsonschema_rs.validator_for(schema, validate_formats=True), jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


def _shortest_body(table, vocab, prefix: str, rng) -> str:
    """The string a walk writes after `prefix`: closing as soon as it may, else one character at a time."""
    def fewest(choice, v):
        closes = (v & 1) == 1
        return rng.choice(choice[closes & (v // 2 == (v // 2)[closes].min())] if closes.any()
                          else choice[v // 2 == (v // 2).min()])

    return _body_walk(table, vocab, prefix, fewest)


@pytest.mark.parametrize("fmt", ["email", "hostname"])
@pytest.mark.parametrize("lengths", [{}, {"maxLength": 8}, {"maxLength": 49}, {"maxLength": 60}, {"maxLength": 512},
                                     {"maxLength": 8192}, {"minLength": 12, "maxLength": 30}])
def test_a_counted_format_is_written_free_under_its_cap_and_validates(llama3, fmt, lengths):
    """hostname and email carry part bounds (labels of at most 63 characters, a local part of at
    most 64): a free body under a total of at most the cap keeps all of them, in a few states."""
    body, cap = COUNTED_FORMATS[fmt]
    schema = {"type": "object", "properties": {"a": {"type": "string", "format": fmt, **lengths}},
              "required": ["a"], "additionalProperties": False}
    table = compile_schema(schema, llama3)
    assert table.relaxed == [] and table.has_counts and table.num_states < 64
    high = min(lengths.get("maxLength", cap), cap)
    rs, py = _validators(schema)
    longest = _longest_body(table, llama3, '{"a": "')
    assert len(longest) == high
    assert rs.is_valid({"a": longest}) and py.is_valid({"a": longest}), longest
    rng = np.random.default_rng(high)
    shortest = _shortest_body(table, llama3, '{"a": "', rng)
    low = lengths.get("minLength", 1)
    assert low <= len(shortest) <= high
    if fmt == "hostname":  # any label character may close it: the minimum is hit exactly
        assert len(shortest) == low
    assert rs.is_valid({"a": shortest}) and py.is_valid({"a": shortest}), shortest
    for i in range(6):  # free walks, half of them cut by a tight budget, finish and validate
        budget = int(table.dist[0]) + i if i % 2 else None
        ids = random_walk(table, llama3, rng, max_tokens=budget)
        doc = json.loads(decode(llama3, ids))
        assert len(doc["a"]) <= high and rs.is_valid(doc) and py.is_valid(doc), doc


def test_a_counted_format_refuses_what_the_format_refuses():
    vocab = counted_vocab()
    table = compile_schema({"type": "string", "format": "hostname"}, vocab, use_cache=False)
    for good in ("a", "api.example.com", "a-b.c-d", "x" * 63):
        assert accepts(table, _ids(vocab, json.dumps(good))), good
    for bad in ("x" * 64, "-a.com", "a-.com", "ab--cd.com", "a..b", ".a", "a."):
        assert not accepts(table, _ids(vocab, json.dumps(bad))), bad
    mail = compile_schema({"type": "string", "format": "email", "maxLength": 300}, vocab, use_cache=False)
    for good in ("a@b.cd", "first.last+tag@mail.example.org"):
        assert accepts(mail, _ids(vocab, json.dumps(good))), good
    for bad in ("a@b", "@b.cd", "a@b.c", "a@-b.cd", "a" * 60 + "@b.cd"):  # the last: 65 characters, past the cap
        assert not accepts(mail, _ids(vocab, json.dumps(bad))), bad


def test_a_counted_format_falls_back_to_its_bounded_form_where_the_cap_cannot_hold():
    """Without counters, or under a minLength above the cap, the bounded regex is written (the
    minLength, above what that regex needs, is then relaxed with its reason)."""
    free = schema_to_regex({"type": "string", "format": "hostname"})
    assert COUNTED_FORMATS["hostname"][0] in free.regex
    plain = schema_to_regex({"type": "string", "format": "hostname"}, GrammarOptions(counted_lengths=False))
    assert STRING_FORMATS["hostname"] in plain.regex and plain.relaxed == []
    wide = schema_to_regex({"type": "string", "format": "hostname", "minLength": 64})
    assert STRING_FORMATS["hostname"] in wide.regex and wide.relaxed == [("", "minLength")]
    assert COUNTED_FORMATS["idn-email"] == COUNTED_FORMATS["email"]


def test_a_pattern_of_one_set_spelled_out_is_counted_not_unrolled(llama3):
    """`^` + 60 dots + `$` (JSONSchemaBench Handwritten) was 963 states and a 53 MB table."""
    schema = {"type": "string", "pattern": "^" + "." * 60 + "$"}
    table = compile_schema(schema, llama3)
    assert table.relaxed == [] and table.has_counts and table.num_states < 32 and table.nbytes < 4 << 20
    assert len(_longest_body(table, llama3, '"')) == 60
    rng = np.random.default_rng(60)
    for _ in range(3):
        text = json.loads(decode(llama3, random_walk(table, llama3, rng)))
        assert len(text) == 60 and re.fullmatch("." * 60, text, re.DOTALL)


def key_schema(pattern: str, declared: dict | None = None) -> dict:
    schema = {"type": "object", "additionalProperties": False, "minProperties": 1, "maxProperties": 3,
              "patternProperties": {pattern: {"type": "integer"}}}
    return {**schema, "properties": declared} if declared else schema


@pytest.mark.parametrize("size", [49, 256, 8192])
def test_a_key_pattern_of_one_quantified_set_is_counted_and_hit_exactly(llama3, size):
    """patternProperties `^[a-z0-9-]{2,N}$` (JsonSchemaStore vercel's `^.{1,256}$`): the key is a counted string,
    exact at any N, instead of one state per character with the bound lowered (vercel's table: 49.9 -> 2.9 MB)."""
    schema = key_schema(f"^[a-z0-9-]{{2,{size}}}$")
    result = schema_to_regex(schema)
    assert result.relaxed == [] and result.narrowed == {}
    regex = expand_counts(result.regex)
    for length, valid in ((1, False), (2, True), (size, True), (size + 1, False)):
        text = json.dumps({"k" * length: 1}, separators=(",", ":"))
        assert (re.fullmatch(regex, text) is not None) == valid, length
    table = compile_schema(schema, llama3)
    assert table.relaxed == [] and table.has_counts
    rng = np.random.default_rng(size)
    for early, expected in ((True, 2), (False, size)):
        doc = json.loads(decode(llama3, extreme_walk(table, rng, early)))
        jsonschema.validate(doc, schema)
        assert {len(k) for k in doc} == {expected}


def test_a_key_pattern_that_finds_a_declared_name_is_not_counted():
    """A declared name the pattern also finds would be written twice: such keys go to pattern_key_body and key_atoms
    (the complement of the declared names, or listed past their caps), not to a counted run; a name the pattern
    does not find changes nothing."""
    mark = "".join(f"\\x{b:02x}" for b in count_mark(COUNT_ENTER, 1, 256))
    assert mark in schema_to_regex(key_schema("^[a-z]{1,256}$", {"Name": {"type": "integer"}})).regex
    found = schema_to_regex(key_schema("^[a-z]{1,256}$", {"name": {"type": "integer"}}))
    assert mark not in found.regex
    assert ("", "patternProperties") in found.relaxed  # past key_atoms' caps: listed, with its reason
