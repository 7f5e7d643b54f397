"""Compile-speed shortcuts give exactly what the general path gives (issue 15, speed).

Each shortcut is checked against the slower path it replaces, on small synthetic vocabularies:
a regex that is one placeholder is its piece's DFA (splice.py); class walks skip only tokens
dead within two bytes (tokenwalk.py); the counted dist's body edges found from exceptions and
popcounts equal those found token by token (counted.py). `benchmarks/table_guard.py` checks whole tables
over the shared corpus; `benchmarks/compile.py` measures.
"""

from __future__ import annotations

import numpy as np

from surecall.grammars import counted, tokenwalk
from surecall.grammars.automaton import regex_to_dfa
from surecall.grammars.compile import compile_schema
from surecall.grammars.splice import build_spliced, placeholder
from surecall.grammars.vocab.core import Vocab

PIECE = r'\{ ?"a" ?: ?(?:"(?:[^"\\\x00-\x1f]|\\["\\nt])*"|-?(?:0|[1-9][0-9]{0,3})|true) ?\}'


def small_vocab() -> Vocab:
    pieces = [bytes([b]) for b in range(256)]
    pieces += [b'{"', b'{"a', b'":', b'": "', b'"}', b'",', b'"x', b'ab', b'abc', b'12', b'1234', b'\\n', b'\\"',
               b'\xc3\xa9', b'\xe2\x82', b'\xac"}', b'a"}', b'true', b' }']
    pieces += [b""]
    stop = len(pieces) - 1
    return Vocab(token_bytes=tuple(pieces), special_ids=frozenset({stop}), stop_ids=(stop,),
                 logits_width=len(pieces) + 3, format="test", name="shortcuts-synthetic")


def test_a_lone_placeholder_is_its_pieces_dfa():
    budget = 1 << 30
    whole = build_spliced(placeholder(0), [PIECE], regex_to_dfa, budget)
    spliced = build_spliced(f"(?:{placeholder(0)})", [PIECE], regex_to_dfa, budget)  # the general path
    assert np.array_equal(whole.trans, spliced.trans) and np.array_equal(whole.accept, spliced.accept)
    assert whole.matches(b'{"a": "x"}') and not whole.matches(b'{"a": }')


def test_class_candidates_leave_out_only_tokens_dead_at_the_second_byte():
    vi = tokenwalk.VocabIndex.build(small_vocab())
    dfa = regex_to_dfa(PIECE)
    succ, comp, cyclic = tokenwalk.lexical_regions(dfa)
    checked = 0
    for q in np.flatnonzero(cyclic).tolist():
        table, _, _ = tokenwalk._region_shape(dfa, succ, comp, q)
        every = np.sort(vi.tokens_with_first(table[0] >= 0))
        kept = tokenwalk._class_candidates(vi, table, 0)
        left_out = np.setdiff1d(every, kept)
        assert np.isin(kept, every).all() and np.all(np.diff(kept) > 0)
        end, _ = tokenwalk.walk(table, vi, left_out, np.zeros(left_out.size, np.int32), np.zeros(left_out.size, np.int64))
        assert (end == -1).all(), "a token left out of a class walk does not die"
        checked += left_out.size
    assert checked > 0  # the check saw tokens left out (the string body's `\` needs its second byte)


def test_region_walk_in_two_passes_equals_the_compacting_walk():
    """walk_region (whole walks through absorbing rows, then the leaving tokens again) gives the end
    states of `walk` and, for the tokens that leave a region, the byte they leave at."""
    vi = tokenwalk.VocabIndex.build(small_vocab())
    every = np.flatnonzero(vi.lens > 0).astype(np.int32)
    regexes = [PIECE, r'"(?:[a-zA-Z]+(?:(?:\s+|-)[a-zA-Z]+)*)"', r'\[(?:[0-9]+(?:\.[0-9]+)?,)*\]']
    kinds = set()
    for regex in regexes:
        dfa = regex_to_dfa(regex)
        succ, comp, _ = tokenwalk.lexical_regions(dfa)
        for q in range(dfa.num_states):
            table, _, _ = tokenwalk._region_shape(dfa, succ, comp, q)
            for start in range(table.shape[0]):
                end, pos = tokenwalk.walk_region(table, vi, every, start)
                want, want_pos = tokenwalk.walk(table, vi, every, np.full(every.size, start, np.int32),
                                                np.zeros(every.size, np.int64))
                assert np.array_equal(end, want)
                leave = want <= -2
                assert np.array_equal(pos[leave], want_pos[leave])
                kinds.update({"stay"} if (want >= 0).any() else set())
                kinds.update({"leave"} if leave.any() else set())
    assert kinds == {"stay", "leave"}


def test_counted_body_edges_equal_the_per_token_lookup():
    schema = {"type": "object", "properties": {"a": {"type": "string", "minLength": 2, "maxLength": 5}},
              "required": ["a"], "additionalProperties": False}
    table = compile_schema(schema, small_vocab(), use_cache=False)
    states = np.flatnonzero(table.count_row >= 0)
    assert states.size
    src, dst, closes = counted._counted_body_edges(table, states)
    got = set(zip(src.tolist(), dst.tolist(), closes.tolist(), strict=True))
    expected = set()
    for s in states.tolist():
        values = table.count_chars[table.count_row[s]]
        tok = np.flatnonzero((values == 0) | (values == 1))
        nxt = table.next_states_many(np.full(tok.size, s), tok)
        ok = nxt >= 0
        expected |= set(zip([s] * int(ok.sum()), nxt[ok].tolist(), (values[tok[ok]] == 1).tolist(), strict=True))
    assert got == expected
