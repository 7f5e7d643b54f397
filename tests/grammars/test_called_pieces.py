"""Return states (grammars/calls.py): a large `$ref`'d object compiled once and called from each
place, its return site on the row's stack. The called table and the copied one accept the same
documents (the text of walks of each, byte by byte, accepted by the other; the called table's
token paths by the copied one), every walk validates, walks cut by max_tokens end inside it, and
what cannot be called is copied as before."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
from helpers.calls_grammar import call_schema, small_vocab

from surecall.grammars.calls import CALL_LEAD, CallsUnusable, body_shape, marker_dfa
from surecall.grammars.compile import compile_schema
from surecall.grammars.options import GrammarOptions
from surecall.grammars.walk import accepts, decode, random_walk


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SURECALL_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def tables():
    vocab, schema = small_vocab(), call_schema()
    called = compile_schema(schema, vocab, GrammarOptions(call_pieces="always"), use_cache=False)
    copied = compile_schema(schema, vocab, GrammarOptions(call_pieces="never"), use_cache=False)
    return vocab, schema, called, copied


def test_pieces_are_called_once(tables):
    _, _, called, copied = tables
    calls = called.meta["calls"]
    assert calls["pieces"] >= 1 and calls["places"] >= 3 and 1 <= calls["sites"] <= calls["places"]
    assert called.has_stack and not copied.has_stack and "calls" not in copied.meta
    assert called.meta["dfa_states"] < copied.meta["dfa_states"] * 0.6
    assert called.relaxed == copied.relaxed == []


@pytest.mark.parametrize("budget", [None, 30, 60, 120])
def test_walks_validate_and_both_tables_accept_them(tables, budget):
    vocab, schema, called, copied = tables
    validator = jsonschema.Draft7Validator(schema)
    rng = np.random.default_rng(budget or 0)
    nested = 0
    for i in range(24):
        src, other = (called, copied) if i % 2 == 0 else (copied, called)
        ids = random_walk(src, vocab, rng, max_tokens=budget)
        doc = json.loads(decode(vocab, ids))
        assert not list(validator.iter_errors(doc)), decode(vocab, ids)
        text = decode(vocab, ids)
        # the same text byte by byte (tokens that cross a call event and a counted string's or
        # array's event are refused in the called table, as beside free-form values)
        assert accepts(other, list(text)), text
        if src is called:
            assert accepts(copied, ids), text
        assert budget is None or len(ids) <= budget
        nested += "q" in json.dumps(doc)
    assert budget is not None or nested > 0


def test_tokens_that_end_a_body_and_go_on(tables):
    """`},"` ends a called body and writes the next key: one entry, one outcome per site."""
    vocab, _, called, _ = tables
    t = vocab.token_bytes.index(b'},"')
    keys = called.stack_key[called.stack_key % called.logits_width == t]
    assert keys.size
    per = np.diff(called.stack_ptr.astype(np.int64))[np.isin(called.stack_key, keys)]
    assert per.max() >= 2  # a frame of the row's: an outcome per return site (and dist's own)


def test_budget_too_tight_for_the_document_is_refused_not_broken(tables):
    vocab, _, called, _ = tables
    assert int(called.dist[0]) > 3
    rng = np.random.default_rng(5)
    ids = random_walk(called, vocab, rng, max_tokens=int(called.dist[0]))
    assert accepts(called, ids) and len(ids) <= int(called.dist[0])


def test_free_form_values_beside_calls():
    """A free-form value outside the bodies: its brackets and the calls share the row's stack."""
    vocab, schema = small_vocab(), call_schema()
    schema["properties"]["free"] = {"type": "object"}
    schema["required"] = ["a", "free", "d"]
    called = compile_schema(schema, vocab, GrammarOptions(call_pieces="always"), use_cache=False)
    copied = compile_schema(schema, vocab, GrammarOptions(call_pieces="never"), use_cache=False)
    assert called.meta["calls"]["places"] >= 3
    validator = jsonschema.Draft7Validator(schema)
    rng = np.random.default_rng(7)
    for budget in (None, 50, 90, None, 200):
        for _ in range(6):
            ids = random_walk(called, vocab, rng, max_tokens=budget)
            text = decode(vocab, ids)
            assert not list(validator.iter_errors(json.loads(text))), text
            assert accepts(copied, ids) and (budget is None or len(ids) <= budget)
            back = random_walk(copied, vocab, rng, max_tokens=budget)
            assert accepts(called, list(decode(vocab, back)))


def test_what_cannot_be_called_is_copied():
    """A large piece that is not an object or array value (a long enum) is copied as before."""
    vocab = small_vocab()
    names = {"enum": [f"a-rather-long-option-name-number-{i:03d}" for i in range(80)]}
    schema = {"type": "object", "properties": {k: {"$ref": "#/definitions/N"} for k in "xyz"},
              "definitions": {"N": names}}
    always = compile_schema(schema, vocab, GrammarOptions(call_pieces="always"), use_cache=False)
    never = compile_schema(schema, vocab, GrammarOptions(call_pieces="never"), use_cache=False)
    assert always.meta.get("pieces") and "calls" not in always.meta and not always.has_stack
    assert always.num_states == never.num_states and np.array_equal(always.dist, never.dist)


def test_body_shape_and_marker():
    marker = marker_dfa(0x1A2B)
    assert marker.trans[0, CALL_LEAD] == 1 and marker.accept[-1] and body_shape(marker) is None
    with pytest.raises(ValueError, match="call_pieces"):
        GrammarOptions(call_pieces="sometimes")
    assert issubclass(CallsUnusable, ValueError)


def test_auto_calls_once_the_copies_pass_the_threshold(monkeypatch):
    """"auto" copies (tables as before) until the splice's copies pass compile._CALLS_FROM states
    (65,536; lowered here), then calls."""
    import surecall.grammars.compile as compile_module

    vocab, schema = small_vocab(), call_schema()
    before = compile_schema(schema, vocab, use_cache=False)
    assert "calls" not in before.meta
    monkeypatch.setattr(compile_module, "_CALLS_FROM", 400)
    after = compile_schema(schema, vocab, use_cache=False)
    assert after.meta["calls"]["places"] >= 3 and after.num_states < before.num_states


def test_auto_unrolls_free_form_values_inside_bodies_to_call_them(monkeypatch):
    """A free-form value inside the called object keeps it from being called on the bracket stack;
    past the threshold "auto" converts again with free-form values unrolled (listed as narrowed)
    and calls: every walk still validates."""
    import surecall.grammars.compile as compile_module

    vocab, schema = small_vocab(), call_schema()
    schema["definitions"]["P"]["properties"]["extra"] = {"type": "object"}  # free-form, inside the body
    monkeypatch.setattr(compile_module, "_CALLS_FROM", 400)
    table = compile_schema(schema, vocab, use_cache=False)
    assert table.meta["calls"]["places"] >= 3 and "free-form values unrolled" in table.meta["calls_fallback"]
    assert any(k == "max_any_depth" for _, k, _ in table.meta["narrowed"])
    validator = jsonschema.Draft7Validator(schema)
    rng = np.random.default_rng(11)
    for budget in (None, 60, 120):
        for _ in range(5):
            ids = random_walk(table, vocab, rng, max_tokens=budget)
            assert not list(validator.iter_errors(json.loads(decode(vocab, ids))))


def test_flat_estimate_is_near_the_copies_it_stands_for():
    """flat_states_estimate: None within `over` (nothing minimised); past it, low and high come
    within a few states of the copied DFA's states where no alternatives share a place."""
    import surecall.grammars.compile as compile_module
    from surecall.grammars.automaton import regex_to_dfa
    from surecall.grammars.splice import build_spliced, flat_states_estimate
    from surecall.grammars.string_bodies import build_with_shared_bodies

    seen = {}
    real = compile_module._compile_uncached

    def spy(regex, vocab, options, relaxed, meta, pieces=()):
        seen.setdefault("regex", (regex, pieces))
        return real(regex, vocab, options, relaxed, meta, pieces)

    vocab = small_vocab()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(compile_module, "_compile_uncached", spy)
        compile_schema(call_schema(), vocab, use_cache=False)
    regex, pieces = seen["regex"]
    assert pieces

    def build(text):
        return build_with_shared_bodies(text, regex_to_dfa, lambda t: regex_to_dfa(t, pruned=False))

    copied = build_spliced(regex, pieces, build, 1 << 40).num_states
    assert flat_states_estimate(regex, pieces, build, 10 * copied) is None
    low, high = flat_states_estimate(regex, pieces, build, 0)
    assert low <= high and abs(low - copied) <= copied // 20


def test_auto_skips_copies_estimated_far_past_the_threshold(monkeypatch):
    """Copies estimated past the threshold (low) and past twice it (high) are not made first:
    "auto" calls at once, and the table is the one the copy-then-fail path gives."""
    import surecall.grammars.compile as compile_module

    vocab, schema = small_vocab(), call_schema()
    monkeypatch.setattr(compile_module, "_CALLS_FROM", 400)
    flags = []
    real = compile_module.build_spliced

    def spy(*args, **kwargs):
        flags.append(kwargs.get("calls", False))
        return real(*args, **kwargs)

    monkeypatch.setattr(compile_module, "build_spliced", spy)
    skipped = compile_schema(schema, vocab, use_cache=False)
    assert flags == [True] and skipped.meta["calls"]["places"] >= 3
    monkeypatch.setattr(compile_module, "_refuse_flat_past", lambda *args: None)
    flags.clear()
    tried = compile_schema(schema, vocab, use_cache=False)
    assert flags == [False, True]
    assert np.array_equal(skipped.mask_dense(), tried.mask_dense()) and np.array_equal(skipped.dist, tried.dist)
    for a, b in zip(skipped.dense_transitions(), tried.dense_transitions(), strict=True):
        assert np.array_equal(a, b)


def test_every_fallback_after_counters_cut_keeps_its_own_fallbacks(monkeypatch):
    """A grammar whose counted strings cannot be cut (compiled again without counters) whose plain
    form then needs its large values called with free-form values unrolled: UnrollForCalls is the
    compile's own signal and never reaches the caller (Github_hard o9917 raised it)."""
    import surecall.grammars.compile as compile_module
    from surecall.grammars.counted import CountedCutError

    real = compile_module._compile_uncached
    tried = []

    def staged(regex, vocab, options, relaxed, meta, pieces=()):
        tried.append((options.counted_lengths, options.call_pieces, options.free_form_stack))
        if options.counted_lengths:
            raise CountedCutError("a counted string's marks could not be cut")
        if options.call_pieces == "auto":
            raise compile_module.UnrollForCalls("splicing sub-automata needs more than 400 states")
        return real(regex, vocab, options, relaxed, meta, pieces)

    monkeypatch.setattr(compile_module, "_compile_uncached", staged)
    vocab, schema = small_vocab(), call_schema()
    table = compile_schema(schema, vocab, use_cache=False)
    assert tried[:3] == [(True, "auto", True), (False, "auto", True), (False, "always", False)]
    assert "counted_fallback" in table.meta
    rng = np.random.default_rng(5)
    validator = jsonschema.Draft7Validator(schema)
    for _ in range(4):  # relaxed bounds are listed, not written past: walks still validate
        errors = list(validator.iter_errors(json.loads(decode(vocab, random_walk(table, vocab, rng)))))
        assert all(e.validator in ("maxLength", "minLength") for e in errors)
