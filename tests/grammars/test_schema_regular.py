"""Scalar schemas as one automaton (grammars/schema/regular.py, string_automaton.py): not/allOf/
anyOf/oneOf of patterns, lengths and literals, checked against jsonschema (Python `re`) and
jsonschema-rs (ECMA-262) on random strings with escapes and non-ASCII characters; integral
multipleOf by remainders against jsonschema; the Handwritten schemas it fixes by random walks.
"""

from __future__ import annotations

import itertools
import json
import random
import re

import jsonschema
import jsonschema_rs
import pytest
from conftest import bench_schema, cached_vocab
from helpers.grammar_checks import invalid_tight_walks

from surecall.errors import UnsupportedSchema
from surecall.grammars.compile import compile_schema
from surecall.grammars.options import GrammarOptions
from surecall.grammars.schema.regular import RegularUnsupported, string_body
from surecall.grammars.schema.to_regex import expand_marks, schema_to_regex

# Characters where the two engines or JSON escaping differ: \n (`$` in re), \u2028 (`.` in ECMA),
# an Arabic-Indic digit (\d in re only), quote, backslash, a control character, non-ASCII letters.
_ALPHABET = ["a", "b", "c", "1", "2", "_", " ", "\n", "\u2028", "\u0663", '"', "\\", "\x01", "é", "😀"]


def _strings(num: int, seed: int = 0, max_len: int = 7) -> list[str]:
    rng = random.Random(seed)
    out = ["", "ab", "ab1", "a\n", "\u0663\u0663"]
    out += ["".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, max_len))) for _ in range(num)]
    return out


def _language(schema: dict):
    """(does the grammar accept s, does jsonschema, does jsonschema-rs) for a string s."""
    result = schema_to_regex(schema)
    assert result.relaxed == [], result.relaxed
    grammar = re.compile(expand_marks(result.regex), re.DOTALL)
    python, ecma = jsonschema.Draft202012Validator(schema), jsonschema_rs.validator_for(schema)
    return lambda s: (grammar.fullmatch(json.dumps(s, ensure_ascii=False)) is not None,
                      python.is_valid(s), ecma.is_valid(s))


@pytest.mark.parametrize("schema, is_agreed", [
    ({"type": "string", "not": {"pattern": "ab"}}, True),
    ({"type": "string", "not": {"pattern": "^a.$"}}, False),  # `.`, `$` read differently
    ({"type": "string", "not": {"pattern": "\\d\\d"}}, False),  # \d Unicode-wide in re
    ({"type": "string", "allOf": [{"pattern": "^a"}, {"pattern": "b"}, {"not": {"pattern": "c"}}]}, True),
    ({"type": "string", "oneOf": [{"pattern": "a"}, {"pattern": "b"}]}, True),
    ({"type": "string", "oneOf": [{"pattern": "^[\\w]+$"}, {"pattern": "1"}]}, False),
    ({"type": "string", "anyOf": [{"not": {"pattern": "a"}}, {"not": {"maxLength": 2}}], "pattern": "[\"\\\\]"}, True),
    ({"type": "string", "not": {"anyOf": [{"enum": ["ab", "a\"", 3]}, {"minLength": 5}]}}, True),
    ({"type": "string", "minLength": 2, "maxLength": 4, "not": {"pattern": "^\\x01"}}, True),
    ({"type": "string", "if": {"pattern": "^a"}, "then": {"pattern": "b$"}, "else": {"not": {"pattern": "b"}}}, True),
])
def test_boolean_combinations_of_patterns_match_both_validators(schema, is_agreed):
    language = _language(schema)
    num_accepted = 0
    for s in _strings(600):
        ours, python, ecma = language(s)
        assert not ours or (python and ecma), (s, schema)  # never looser than either validator
        if is_agreed:
            assert ours == python, (s, schema)  # exact where both engines read the pattern alike
        num_accepted += ours
    assert num_accepted > 0


def test_complement_is_relative_to_json_string_bodies():
    schema = {"type": "string", "not": {"pattern": "^[a-z]*$"}}
    regex = re.compile(expand_marks(schema_to_regex(schema).regex), re.DOTALL)
    assert regex.fullmatch('"a\\"b"') and regex.fullmatch('"\\\\"') and regex.fullmatch('"\\u0001"')
    assert regex.fullmatch('"\\t"') and regex.fullmatch('"😀"') and regex.fullmatch('"\\na"')
    assert not regex.fullmatch('"\\n"')  # re's `$` also matches before a final newline: "\n" is found
    assert not regex.fullmatch('"a"') and not regex.fullmatch('""')
    assert not regex.fullmatch('"a"b"') and not regex.fullmatch('"\\"')  # no broken JSON string
    assert not regex.fullmatch('"\\ud800"')  # no lone surrogate escape


def test_large_top_level_max_length_stays_counted():
    schema = {"type": "string", "maxLength": 8192, "not": {"pattern": "^a"}, "allOf": [{"pattern": "b"}]}
    result = schema_to_regex(schema)
    assert result.relaxed == []
    assert "\\x01" in result.regex  # the counter's mark, not 8192 states
    found = string_body(schema, lambda ref: None)
    assert (found.min_length, found.max_length) == (0, 8192)


def test_unsatisfiable_combination_has_no_string():
    schema = {"type": "string", "allOf": [{"pattern": "^a"}, {"not": {"pattern": "a"}}]}
    assert string_body(schema, lambda ref: None).body is None
    with pytest.raises(UnsupportedSchema, match="unsatisfiable"):
        schema_to_regex(schema)


def test_not_of_a_pattern_alone_admits_only_strings():
    language = _language({"not": {"pattern": "a"}})  # a number passes `pattern`, so fails its `not`
    assert language("b") == (True, True, True) and language("a")[0] is False
    assert jsonschema.Draft202012Validator({"not": {"pattern": "a"}}).is_valid(3) is False


@pytest.mark.parametrize("schema, match", [
    ({"anyOf": [{"type": "number"}, {"not": {"pattern": "a"}}]}, "other than strings"),
    ({"type": "string", "not": {"format": "email", "pattern": "a"}}, "format"),
    ({"type": "string", "not": {"pattern": "(?=a)b"}}, "lookaround"),
    ({"type": "string", "not": {"pattern": "a", "maxLength": 100}}, "past 64"),
    ({"type": "string", "not": {"pattern": "a(a|b){16}$"}}, "passes"),  # 2^16 states: the 17th last is an a
])
def test_what_it_cannot_read_exactly_raises_with_the_reason(schema, match):
    with pytest.raises(RegularUnsupported, match=match):
        string_body(schema, lambda ref: None)


def test_given_up_schema_keeps_its_keyword_relaxed_and_listed():
    schema = {"type": "string", "not": {"pattern": "a", "format": "email"}}
    assert ("", "not") in schema_to_regex(schema).relaxed


def test_too_long_a_body_regex_is_cut_to_shortest_paths_never_looser():
    schema = {"type": "string", "allOf": [{"pattern": "a.*b.*c"}, {"pattern": "c.*b.*a"}, {"not": {"pattern": "abc"}},
                                          {"pattern": "^[abcx]*$"}]}
    import surecall.grammars.schema.string_automaton as automaton

    found = string_body(schema, lambda ref: None)
    exact = found.body
    assert found.narrowed is None
    original = automaton.MAX_BODY_CHARS
    automaton.MAX_BODY_CHARS = len(exact) - 1  # the exact regex no longer fits
    try:
        found = string_body(schema, lambda ref: None)
    finally:
        automaton.MAX_BODY_CHARS = original
    cut = found.body
    assert len(cut) < len(exact) and "shortest paths" in found.narrowed  # the cut is reported
    validator = jsonschema.Draft202012Validator(schema)
    matcher = re.compile(cut)
    every = ["".join(p) for n in range(8) for p in itertools.product("abcx", repeat=n)]
    accepted = [s for s in every if matcher.fullmatch(s)]
    assert accepted and all(validator.is_valid(s) for s in accepted)
    assert len(accepted) < sum(map(validator.is_valid, every))  # stricter: some valid strings are left out


def test_string_leaves_beside_ref_follow_drafts():
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "string",
              "anyOf": [{"$ref": "#/definitions/n"}], "definitions": {"n": {"not": {"pattern": "a"}}}}
    language = _language({k: v for k, v in schema.items() if k != "$schema"})
    assert language("b")[0] and not language("ba")[0]


# --- Handwritten schemas fixed by it (skipped without the shared data) ---------------------------
FIXED = ["allany21", "allany23", "string5", "allone1", "allone4"]


@pytest.mark.parametrize("name", FIXED)
def test_handwritten_walks_all_validate(name, data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SURECALL_CACHE_DIR", str(tmp_path / "cache"))
    schema = bench_schema(data_dir, "Handwritten", name)
    vocab = cached_vocab("llama3")
    table = compile_schema(schema, vocab, GrammarOptions(time_budget_s=10.0), use_cache=False)
    assert table.relaxed == []
    assert invalid_tight_walks(schema, table, vocab, 12) == []


def test_string_algebra_cap_counts_steps_not_seconds(data_dir, monkeypatch):
    """string5's algebra fits the default step cap; under a small cap it gives up the same way
    every time, whatever the host's speed, and the conversion falls back (pattern relaxed, listed)."""
    import surecall.grammars.schema.to_regex as to_regex
    from surecall.grammars.schema.string_automaton import WorkMeter

    schema = bench_schema(data_dir, "Handwritten", "string5")
    meters = []

    class Recorded(WorkMeter):
        def __init__(self, steps):
            super().__init__(steps)
            meters.append(self)

    monkeypatch.setattr(to_regex, "WorkMeter", Recorded)
    exact = schema_to_regex(schema, GrammarOptions(time_budget_s=60.0))
    assert exact.relaxed == [] and 0 < meters[-1].spent <= to_regex.MAX_REGULAR_STEPS
    needed = meters[-1].spent
    monkeypatch.setattr(to_regex, "MAX_REGULAR_STEPS", needed // 2)
    cut = [schema_to_regex(schema, GrammarOptions(time_budget_s=60.0)) for _ in range(2)]
    assert cut[0].relaxed and cut[0].relaxed == cut[1].relaxed and cut[0].regex == cut[1].regex
    assert ("/allOf/5/anyOf/0", "not") in [tuple(r[:2]) for r in cut[0].relaxed]
    assert f"cap of {needed // 2:,} steps" in cut[0].reasons[("/allOf/5/anyOf/0", "not")]  # says why it is relaxed


def test_step_cap_raises_with_the_cap_named():
    from surecall.grammars.schema.string_automaton import StringAutomaton, WorkMeter

    meter = WorkMeter(50)
    with pytest.raises(RegularUnsupported, match="cap of 50 steps"):
        StringAutomaton(("pat", "^(a|b)*c(a|b){8}$"), None, meter).body()
    assert meter.left < 0


def test_minimise_matches_moore_on_random_dfas(monkeypatch):
    """The hashed worklist refinement (automaton._refine) gives a quotient as small as Moore's exact
    one, of the same language; a partition that is not a congruence (as a hash collision would
    give) falls back to Moore's rounds."""
    import numpy as np

    import surecall.grammars.schema.string_automaton as sa

    automaton = sa.StringAutomaton(("pat", "^a$"), None)
    rng = np.random.default_rng(3)
    dfas = []
    for _ in range(40):
        n, k = int(rng.integers(2, 60)), int(rng.integers(1, 4))
        dfas.append(sa._DFA(rng.integers(0, n, size=(n, k)).tolist(), (rng.random(n) < 0.3).tolist()))
    fast = [automaton.minimise(d) for d in dfas]
    monkeypatch.setattr(sa, "_refine", lambda trans, accept, check=None: np.zeros(len(accept), np.int64))
    exact = [automaton.minimise(d) for d in dfas]  # one block: a congruence only where acceptance is uniform
    assert [len(f.accept) for f in fast] == [len(e.accept) for e in exact]  # as few states (minimal)
    assert any(len(f.accept) > 1 for f in fast)
    for dfa, small, moore in zip(dfas, fast, exact):  # the same language: every word up to length 5
        k = len(dfa.trans[0])
        for length in range(6):
            for word in itertools.product(range(k), repeat=length):
                a = b = c = 0
                for x in word:
                    a, b, c = dfa.trans[a][x], small.trans[b][x], moore.trans[c][x]
                assert dfa.accept[a] == small.accept[b] == moore.accept[c]


def test_allany21_language_matches_its_definition(data_dir):
    schema = bench_schema(data_dir, "Handwritten", "allany21")
    language = _language(schema)
    for s in ["ab1x", "xbc1", "a12", "12", "ab12", "\u0663\u0663"] + _strings(300, seed=1):
        ours, python, ecma = language(s)
        assert not ours or (python and ecma), s
    assert language("ab1x")[0] and language("12")[0] and not language("ab1xy")[0]


# --- numbers: integral multipleOf under not/anyOf/oneOf -------------------------------------------
@pytest.mark.parametrize("schema", [
    {"type": "integer", "not": {"multipleOf": 3}},
    {"type": "number", "not": {"multipleOf": 2}},
    {"type": "number", "oneOf": [{"multipleOf": 2}, {"multipleOf": 5}]},
    {"type": "integer", "minimum": 1, "oneOf": [{"multipleOf": 2}, {"not": {"multipleOf": 4}}]},
    {"type": "number", "minimum": 0, "anyOf": [{"multipleOf": 4}, {"not": {"multipleOf": 10}}],
     "if": {"multipleOf": 2}, "then": {"not": {"multipleOf": 4}}},
    {"type": "integer", "allOf": [{"multipleOf": 2}, {"not": {"multipleOf": 2}}, {"minimum": 1}]},
])
def test_multiple_of_algebra_is_exact_on_integers_and_stricter_on_fractions(schema):
    try:
        result = schema_to_regex(schema)
    except UnsupportedSchema as exc:  # the last schema: nothing passes
        assert "unsatisfiable" in str(exc) and not any(jsonschema.Draft202012Validator(schema).is_valid(n)
                                                       for n in range(-50, 50))
        return
    assert result.relaxed == []
    regex = re.compile(expand_marks(result.regex))
    validator = jsonschema.Draft202012Validator(schema)
    for n in range(-400, 400):
        assert bool(regex.fullmatch(str(n))) == validator.is_valid(n), n
    for text in ("1.5", "-2.25", "0.5", "3.0", "1e2"):
        assert not regex.fullmatch(text) or validator.is_valid(json.loads(text)), text
    assert not regex.fullmatch("-0") and not regex.fullmatch("01")


def test_remainder_sets_without_a_short_regex_are_listed_near_zero():
    from surecall.grammars.schema.regular import MAX_LISTED_INTEGERS, number_regex

    schema = {"type": "integer", "minimum": 1, "not": {"multipleOf": 7}}  # mod 7: ~31k characters
    found, narrowed = number_regex(schema, lambda ref: None)
    listed = [n for n in range(-100, 1000) if re.fullmatch(found, str(n))]
    assert listed == [n for n in range(1, 1000) if n % 7][:MAX_LISTED_INTEGERS]  # stricter, never looser
    assert f"only the {MAX_LISTED_INTEGERS} integers nearest 1" in narrowed
    result = schema_to_regex(schema)
    assert result.relaxed == [] and list(result.narrowed) == [("", "not")]
    assert schema_to_regex({"type": "integer", "not": {"multipleOf": 2}}).narrowed == {}  # exact: odd integers


def test_fractions_pass_where_no_integral_multiple_is_required():
    schema = {"type": "number", "not": {"multipleOf": 2}}
    regex = re.compile(expand_marks(schema_to_regex(schema).regex))
    assert regex.fullmatch("1.5") and regex.fullmatch("3") and not regex.fullmatch("4")


@pytest.mark.parametrize("schema, match", [
    ({"type": "number", "not": {"multipleOf": 0.5}}, "positive integer"),
    ({"type": "number", "minimum": 5, "not": {"multipleOf": 2}}, "lower bound"),
    ({"anyOf": [{"type": "string"}, {"not": {"multipleOf": 2}}]}, "other than numbers"),
])
def test_multiple_of_algebra_gives_up_with_the_reason(schema, match):
    from surecall.grammars.schema.regular import number_regex

    with pytest.raises(RegularUnsupported, match=match):
        number_regex(schema, lambda ref: None)
    if "anyOf" in schema:  # each branch on its own admits one type only: both enforced
        assert schema_to_regex(schema).relaxed == []
    else:
        assert schema_to_regex(schema).relaxed != []  # left to the validator, and listed


def test_group_nesting_skips_escapes_and_classes():
    from surecall.grammars.schema.string_automaton import group_nesting

    assert group_nesting("(?:a(?:b)[(]\\()") == 2 and group_nesting("[\\]()]") == 0 and group_nesting("((a))(b)") == 2


def test_a_body_nested_past_the_parsers_limit_falls_back(monkeypatch):
    # Github_medium o9805: a length-bounded body written as a chain of ~250 nested groups, which
    # outlines-core's parser refuses ("error building NFA"); now the algebra gives it up instead
    from surecall.grammars.schema import string_automaton

    schema = {"type": "string", "maxLength": 6, "not": {"pattern": "^ab"}}
    exact = schema_to_regex(schema)
    assert exact.relaxed == []
    monkeypatch.setattr(string_automaton, "MAX_BODY_NESTING", 1)
    result = schema_to_regex(schema)  # no SchemaError: the not is listed, with the algebra's reason
    assert result.relaxed == [("", "not")] and "string algebra" in result.reasons[("", "not")]
    assert re.compile(expand_marks(result.regex)).fullmatch('"abc"')


# --- a format beside a pattern: both, through the format's regex (a subset of the format) --------
def _matches(schema, text: str, options=None) -> bool:
    options = options or GrammarOptions()
    return re.fullmatch(expand_marks(schema_to_regex(schema, options).regex, options.whitespace_regex()),
                        json.dumps(text)) is not None


@pytest.mark.parametrize("schema", [
    # Github_hard o1051: a date whose pattern also admits "2019" and "2019-02-30"
    {"type": "string", "format": "date", "pattern": "^([0-9]{4})(-([0-9]{2}))?(-([0-9]{2}))?$"},
    {"type": "string", "allOf": [{"format": "date"}, {"pattern": "^([0-9]{4})(-([0-9]{2}))?(-([0-9]{2}))?$"}]},
    {"type": "string", "format": "date", "pattern": "^[0-9-]+$", "minLength": 10, "maxLength": 12},
])
def test_a_format_beside_a_pattern_is_enforced_with_it(schema):
    assert schema_to_regex(schema, GrammarOptions()).relaxed == []
    checker = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    for text in ("2019-02-28", "2000-02-29", "2019", "2019-02", "2019-02-30", "2019-13-01", "20190228", "x2019-02-28"):
        assert _matches(schema, text) == checker.is_valid(text), text


def test_a_format_under_a_complement_or_cut_or_empty_beside_a_pattern_stays_relaxed():
    # under oneOf the branches are negated too: our date regex is a subset, its complement looser
    one_of = {"type": "string", "oneOf": [{"format": "date"}, {"pattern": "^\\$[A-Z]+"}]}
    assert ("", "oneOf") in schema_to_regex(one_of, GrammarOptions()).relaxed
    # a uri's automaton is cut past the body caps: the pattern is enforced, the format relaxed as before
    uri = {"type": "string", "allOf": [{"format": "uri"}, {"pattern": "^https?://"}]}
    assert schema_to_regex(uri, GrammarOptions()).relaxed == [("/allOf/0", "format")]
    assert _matches(uri, "https://a.b/c") and not _matches(uri, "ftp://a.b")
    # no string of the date regex starts with "x", but the schema is not called unsatisfiable for it
    empty = {"type": "string", "format": "date", "pattern": "^x"}
    assert schema_to_regex(empty, GrammarOptions()).relaxed == [("", "format")]
    assert _matches(empty, "xyz")
    # a format and a negated pattern: exact
    negated = {"type": "string", "format": "date", "not": {"pattern": "^2000"}}
    assert schema_to_regex(negated, GrammarOptions()).relaxed == []
    assert _matches(negated, "2019-02-28") and not _matches(negated, "2000-01-01") and not _matches(negated, "2019")


def test_an_exact_format_is_complemented_too():
    # Snowplow sp_209: a uuid or a `$NAME` (untyped: a non-string meets both branches, so none is valid)
    schema = {"oneOf": [{"format": "uuid"}, {"pattern": "^\\$[A-Z0-9-_]+"}]}
    assert schema_to_regex(schema, GrammarOptions()).relaxed == []
    uuid = "123e4567-e89b-12d3-a456-426614174000"
    checker = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    options = GrammarOptions()
    grammar = re.compile(expand_marks(schema_to_regex(schema, options).regex, options.whitespace_regex()))
    for value in (uuid, uuid.upper(), "$ABC", "$" + uuid, "abc", uuid[:-1], 1, None):
        assert (grammar.fullmatch(json.dumps(value)) is not None) == checker.is_valid(value), value
    not_ipv4 = {"type": "string", "not": {"format": "ipv4"}}
    assert schema_to_regex(not_ipv4, GrammarOptions()).relaxed == []
    assert _matches(not_ipv4, "1.2.3") and _matches(not_ipv4, "01.2.3.4") and not _matches(not_ipv4, "10.0.0.255")


# --- anchors inside a pattern: zero-width edges of its automaton -------------------------------
@pytest.mark.parametrize("pattern, is_agreed", [
    ("^(\\/?((\\.{2})|([a-z0-9\\-]*))($|\\/))*$", False),  # Github_hard o69430: `$` in a group (re: before \n too)
    ("^([^,]+(,|$)){3,}$", False),  # JsonSchemaStore catalogue-entry-schema
    ("(^|,)a(,|$)", False),
    ("(a|^)b", True),
    ("(^a|b)c", True),
    ("x(^|-)y", True),  # `^` after a character never holds: only "x-y"
    ("^(?=a)(b|^)a", True),  # a leading lookahead beside an inner anchor
    # a positive lookahead that ends an unanchored branch: a match of X then Y's is one of XY
    ("^a(?=b)", True),
    ("x|a(?=b|c)", True),
    ("((?:[^/]*/)*)(?=\\.(yaml|yml|json))", True),  # JsonSchemaStore catalogue-entry-schema's oas_path
])
def test_anchors_inside_a_pattern_are_written_exactly(pattern, is_agreed):
    assert schema_to_regex({"type": "string", "pattern": pattern}).relaxed == []
    _assert_pattern_exact(pattern, is_agreed, ["a,b,c", "a,b,c,", "x-y", "1/ab/../", "ab\n", "a/b.yaml", "c.json",
                                               ".yml", "a/b.jso", "a/b.yam1"])


def _assert_pattern_exact(pattern: str, is_agreed: bool, extra: list[str] = ()) -> None:
    """Never looser than either validator on random strings (and `extra`), equal to both where they
    read the pattern alike; some string accepted."""
    language = _language({"type": "string", "pattern": pattern})
    num_accepted = 0
    for s in _strings(800, seed=len(pattern)) + list(extra):
        ours, python, ecma = language(s)
        assert not ours or (python and ecma), (s, pattern)
        if is_agreed:
            assert ours == python == ecma, (s, pattern)
        num_accepted += ours
    assert num_accepted > 0


def test_a_pattern_no_string_matches_makes_the_string_invalid():
    # Github_easy o21833: slashes around the pattern, so `^` never holds (no validator matches any string)
    schema = {"type": "object", "properties": {"year": {"type": "string", "pattern": "/^[0-9]{4}$/"},
                                               "n": {"type": "integer"}}}
    result = schema_to_regex(schema)
    assert result.relaxed == []
    grammar = re.compile(expand_marks(result.regex))
    assert grammar.fullmatch('{"n": 1}') and not grammar.fullmatch('{"year": "2019", "n": 1}')
    with pytest.raises(UnsupportedSchema, match="unsatisfiable"):
        schema_to_regex({"type": "string", "pattern": "a^b"})
    # re's `$` also holds before a final newline: the upper reading drops an inner `$`, so a pattern
    # whose lower reading is empty is not called empty where the upper one is not (listed instead)
    for pattern in ("a$b", "a$\\n"):
        assert schema_to_regex({"type": "string", "pattern": pattern}).relaxed == [("", "pattern")]
    # a lookahead with more of the pattern after it (or the end anchored) is not read: listed
    for pattern in ("a(?=b)c", "a(?=b)$", "(?:a(?=b))+"):
        assert schema_to_regex({"type": "string", "pattern": pattern}).relaxed == [("", "pattern")]


# --- lookaheads at a pattern's start: the conjunction of their parts ---------------------------
@pytest.mark.parametrize("pattern, is_agreed", [
    ("^(?=[^=]+$)(?!\\s+$)(.|\\n)+$", False),  # JsonSchemaStore gradle-enterprise: `$` before a final \n in re
    ("^(?!(?:ab|ba)$)[a-c]+$", False),
    ("^(?=.*1)(?!.*2)", False),  # `.` and \u2028
    ("^(?=[^2]*1)(?!a)", True),
    ("^(?=a|b)(?!ab)..?", True),
])
def test_leading_lookaheads_are_written_exactly(pattern, is_agreed):
    _assert_pattern_exact(pattern, is_agreed)


def test_lookaheads_past_the_body_caps_are_narrowed_never_looser():
    schema = {"type": "string", "pattern": "^(?=.*[A-Z])(?=.*[0-9]).{8,}$"}  # a password rule
    result = schema_to_regex(schema)
    assert result.relaxed == [] and ("", "pattern") in result.narrowed
    grammar = re.compile(expand_marks(result.regex), re.DOTALL)
    rng = random.Random(7)
    texts = ["".join(rng.choice("aZ9 x") for _ in range(rng.randint(6, 12))) for _ in range(2000)]
    accepted = [t for t in texts if grammar.fullmatch(json.dumps(t))]
    assert accepted and all(re.search(schema["pattern"], t) for t in accepted)
    # one inside a group, or with more of the pattern after it, is not read: the pattern stays listed
    for pattern in ("^a(?=bc)d", "^(x(?=y))"):
        assert schema_to_regex({"type": "string", "pattern": pattern}).relaxed == [("", "pattern")]
