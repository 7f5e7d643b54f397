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
    assert expr == ("all", [("not", ("any", [("pat", "^(?:name)"), ("pat", "^(?:style)")])), ("pat", "^.+$")])
    # a branch that ends in `$` excludes the whole key (ansible-lint's vars: names other than keywords)
    assert pattern_class("^(?!(and|or)$|x-)[a-z-]+$") == (
        "all", [("not", ("any", [("pat", "^(?:(and|or))$"), ("pat", "^(?:x-)")])), ("pat", "^[a-z-]+$")])
    [atom] = key_atoms(("^(?!(and|or)$|x-)[a-z-]+$",), (), with_rest=False).atoms
    match = _keys(atom.key)
    assert [match(k) for k in ("and", "or", "x-a", "andy", "ora", "x", "b-c", "B")] == [
        False, False, False, True, True, True, True, False]
    assert pattern_class("^(?!a)b|c") == ("pat", "^(?!a)b|c")  # a top-level alternation: not rewritten
    assert pattern_class("a(?!b)") == ("pat", "a(?!b)")


def test_trie_complement_with_blocked_prefixes():
    body = string_not_in(("ab", "x"), ("x-", "q"))
    match = _keys('"' + body + '"')
    for key, ok in [("a", True), ("abc", True), ("ab", False), ("x", False), ("x-1", False), ("x-", False),
                    ("xa", True), ("q", False), ("qq", False), ("", True), ("b", True)]:
        assert match(key) is ok, key
        assert ok == (key not in ("ab", "x") and not re.match("x-|q", key))


def test_trie_complement_is_exact_for_long_names_and_many_of_them():
    """The complement stays exact where the trie branches, runs long (past _FLAT_RUN links: flat
    runs, then a nested group) and holds non-ASCII names; 12 names with one of 69 characters
    (Github_medium o6290's properties) used to pass the regex parser's nesting limit."""
    import random

    rng = random.Random(7)
    long_name = "runIntrospectionScriptBeforeAccessTokenAsJwtCreationAndIncludeClaims"
    cases = [((long_name, "spontaneousScopes", "spontaneousScopeScriptDns", "a", ""), ("tls",)),
             (("é" * 30, "éa", "x" * 80), ()),
             *[(tuple({"".join(rng.choice("abé") for _ in range(rng.randint(0, 50))) for _ in range(4)}),
                tuple({"".join(rng.choice("ab") for _ in range(rng.randint(1, 30))) for _ in range(2)}))
               for _ in range(6)]]
    for names, prefixes in cases:
        match = _keys('"' + string_not_in(names, prefixes) + '"')
        probes = {"", "z", "é", "日本"}
        for word in (*names, *prefixes):
            for cut in range(len(word) + 1):  # every prefix, each extended by a character and by a tail
                probes |= {word[:cut], word[:cut] + "a", word[:cut] + "é", word[:cut] + "日", word[:cut] + "zz"}
        for key in probes:
            expected = key not in names and not any(key.startswith(p) for p in prefixes)
            assert match(key) is expected, (names, prefixes, key)


def test_escaped_keys_are_written_but_never_spell_a_name():
    """Keys with JSON escapes (`Behat\\\\MinkExtension`, `\\u00e9t\\u00e9`): accepted once their
    text has left every name; no spelling of a name or of a blocked prefix is ever accepted."""
    import json
    import random

    rng = random.Random(3)
    alphabet = 'ab/\\"é\n'

    def spellings(text: str) -> set[str]:  # raw where JSON allows it, short escapes, \\u escapes
        out = set()
        for _ in range(6):
            parts = []
            for ch in text:
                options = [json.dumps(ch, ensure_ascii=False)[1:-1], f"\\u{ord(ch):04x}", f"\\u{ord(ch):04X}"]
                options += ["\\/"] if ch == "/" else []
                parts.append(rng.choice(options))
            out.add("".join(parts))
        return out

    for trial in range(12):
        names = tuple({"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 4))) for _ in range(3)})
        prefixes = tuple({"".join(rng.choice("ab") for _ in range(rng.randint(1, 3)))} if trial % 2 else ())
        match = _keys('"' + string_not_in(names, prefixes) + '"')
        words = {"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 5))) for _ in range(40)} | set(names)
        for word in words:
            excluded = word in names or any(word.startswith(p) for p in prefixes)
            for spelled in spellings(word):
                assert not (excluded and match(spelled)), (names, prefixes, spelled)
    free = _keys('"' + string_not_in(("name", "style"), ()) + '"')
    for key in ["Behat\\\\MinkExtension", "Vendor\\\\Namespace\\\\", "\\u00e9t\\u00e9", "x\\/y", "q\\\"q", "nam\\u00e9"]:
        assert free(key), key
    assert not free("n\\u0061me") and not free("\\u006eame")  # a name spelled with escapes: refused
    assert _keys('"' + string_not_in((), ()) + '"')("\\\\\\u00e9\\n")


def test_past_the_caps_the_keys_are_not_split():
    with pytest.raises(KeysNotWritten):
        key_atoms(tuple(f"^p{i}" for i in range(9)), (), with_rest=False)


def _object_language(schema: dict):
    """(the grammar accepts obj, jsonschema accepts it, the relaxed list) for the schema's objects."""
    import json

    import jsonschema

    from surecall.grammars.schema.to_regex import expand_marks, schema_to_regex

    result = schema_to_regex(schema)
    grammar = re.compile(expand_marks(result.regex), re.DOTALL)
    validator = jsonschema.Draft202012Validator(schema)
    return (lambda obj: (grammar.fullmatch(json.dumps(obj)) is not None, validator.is_valid(obj))), result


def test_disjoint_patterns_past_the_split_caps_are_written_exactly():
    # JsonSchemaStore pyrseas-0.8: nine prefixes, past MAX_PATTERNS; strmprivacy's `^name$` literals
    prefixes = {f"^{word} ": {"type": "integer"} for word in
                ("table", "aggregate", "domain", "function", "sequence", "type", "view", "operator", "collation")}
    literals = {"^client_secret$": {"type": "string"}, "^container$": {"type": "integer"}, "^uri$": {"type": "boolean"}}
    for patterns, keys in ((prefixes, ["table t", "view v", "tablet", "type x", "aggregate a", "x"]),
                           (literals, ["client_secret", "container", "uri", "uri2", "container_name"])):
        schema = {"type": "object", "patternProperties": patterns, "additionalProperties": False}
        language, result = _object_language(schema)
        assert result.relaxed == [], result.relaxed
        accepted = 0
        for key in keys:
            for value in (1, "s", True):
                ours, valid = language({key: value})
                assert ours == valid, (key, value)  # one key: the grammar writes exactly the valid ones
                accepted += ours
        assert accepted >= 3
    # two of them overlap (`^ta` finds "table t" too): still listed
    overlapping = {**prefixes, "^ta": {"type": "string"}}
    assert ("", "patternProperties") in _object_language(
        {"type": "object", "patternProperties": overlapping, "additionalProperties": False})[1].relaxed
    # with additionalProperties written out, the keys no pattern matches are not written: listed as narrowed
    language, result = _object_language({"type": "object", "patternProperties": prefixes,
                                         "additionalProperties": {"type": "string"}})
    assert result.relaxed == [] and ("", "additionalProperties") in result.narrowed
    assert language({"x": "s"}) == (False, True) and language({"view v": 2}) == (True, True)
