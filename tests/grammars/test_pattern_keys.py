"""Undeclared keys split by the patternProperties they match (grammars/schema/pattern_keys.py)."""

from __future__ import annotations

import re

import pytest

from surecall.grammars.automaton import regex_to_dfa
from surecall.grammars.schema.pattern_keys import (
    KeysNotWritten,
    key_atoms,
    pattern_class,
    string_not_in,
)


def _keys(atom_regex: str):
    dfa = regex_to_dfa(atom_regex)
    return lambda key: dfa.matches(('"' + key + '"').encode())


def test_two_patterns_make_three_atoms_and_the_rest_only_when_asked():
    split = key_atoms(("^a", "b$"), (), with_rest=False)
    by_patterns = {atom.patterns: _keys(atom.key) for atom in split.atoms}
    assert set(by_patterns) == {frozenset({0}), frozenset({1}), frozenset({0, 1})}
    assert by_patterns[frozenset({0, 1})]("ab") and not by_patterns[frozenset({0})]("ab")
    assert by_patterns[frozenset({0})]("ax") and by_patterns[frozenset({1})]("xb")
    assert not any(match("x") for match in by_patterns.values())
    rest = {atom.patterns: _keys(atom.key) for atom in key_atoms(("^a", "b$"), (), with_rest=True).atoms}
    assert rest[frozenset()]("x") and not rest[frozenset()]("ab")


def test_declared_names_are_in_no_atom():
    for atom in key_atoms(("^a",), ("ab", "c"), with_rest=True).atoms:
        match = _keys(atom.key)
        assert not match("ab") and not match("c")
        assert match("ax") if atom.patterns else match("x")


def test_leading_negative_lookahead_reads_as_a_complement():
    expr = pattern_class("^(?!name|style).+$")
    assert expr == ("all", [("not", ("pat", "^(?:name|style)")), ("pat", "^.+$")])
    assert pattern_class("^(?!a)b|c") == ("pat", "^(?!a)b|c")  # a top-level alternation: not rewritten
    assert pattern_class("a(?!b)") == ("pat", "a(?!b)")


def test_trie_complement_with_blocked_prefixes():
    body = string_not_in(("ab", "x"), ("x-", "q"))
    match = _keys('"' + body + '"')
    for key, ok in [("a", True), ("abc", True), ("ab", False), ("x", False), ("x-1", False), ("x-", False),
                    ("xa", True), ("q", False), ("qq", False), ("", True), ("b", True)]:
        assert match(key) is ok, key
        assert ok == (key not in ("ab", "x") and not re.match("x-|q", key))


def test_past_the_caps_the_keys_are_not_split():
    with pytest.raises(KeysNotWritten):
        key_atoms(tuple(f"^p{i}" for i in range(9)), (), with_rest=False)
