"""Free-form values on the bracket stack (grammars/stack.py): any depth, one small automaton.

Checked on the host side of the TokenTable contract (stack.outcome / stack_step / walk.accepts /
walk.random_walk, the rule kernels/stack.py implements): the marked regex's language is JSON's
(with a simulated stack), documents nested far past the old max_any_depth are accepted token by
token (tokens that close several containers at once included), mismatched or unclosed brackets
are refused, the depth cap holds exactly, random walks inside tight budgets parse and validate,
and the table survives the disk cache and concatenation.
"""

from __future__ import annotations

import dataclasses
import json
import random

import jsonschema
import numpy as np
import pytest
from test_counted_strings import _ids

from surecall.grammars import stack as S
from surecall.grammars.automaton import regex_to_dfa
from surecall.grammars.compile import compile_schema
from surecall.grammars.options import GrammarOptions
from surecall.grammars.table import TokenTable
from surecall.grammars.walk import accepts, decode, random_walk

OPEN = {"type": "object", "properties": {"meta": {"type": "object"}, "any": {},
                                          "xs": {"type": "array", "maxItems": 20},
                                          "s": {"type": "string", "maxLength": 60}},
        "required": ["meta", "any"], "additionalProperties": False}


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SURECALL_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def llama3(data_dir):
    from conftest import cached_vocab

    return cached_vocab("llama3")


@pytest.fixture(scope="module")
def table(llama3):
    t = compile_schema(OPEN, llama3, use_cache=False)
    assert t.has_stack and "stack_fallback" not in t.meta
    return t


def _random_value(rng: random.Random, depth: int):
    c = rng.random()
    if depth > 0 and c < 0.35:
        return {f"k{i}{'}'*(i % 2)}": _random_value(rng, depth - 1) for i in range(rng.randint(0, 3))}
    if depth > 0 and c < 0.7:
        return [_random_value(rng, depth - 1) for _ in range(rng.randint(0, 3))]
    return rng.choice([1, -2.5e3, "s{]", None, True, "", [], {}])


def _nested(depth: int, leaf=0):
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def test_the_marked_regex_is_json_under_a_stack():
    dfa = regex_to_dfa(S.stack_value_regex(" ?"))
    cut, marks = S.cut_stack_marks(dfa)

    def walk(text: str) -> bool:
        q, kinds = 0, []
        for b in text.encode():
            if marks.pop[q, b] >= 0:
                if not kinds:
                    return False
                kinds.pop()
                q = int(marks.targets[marks.pop[q, b], kinds[-1] if kinds else 2])
            else:
                if marks.push[q, b]:
                    kinds.append(int(marks.push[q, b]) - 1)
                q = int(cut.trans[q, b])
            if q < 0:
                return False
        return bool(cut.accept[q]) and not kinds

    rng = random.Random(0)
    for i in range(400):
        text = json.dumps(_random_value(rng, rng.randint(0, 9)), separators=(",", ":") if i % 2 else (", ", ": "))
        assert walk(text), text
    for bad in ["{]", "[}", "[1,]", '{"a":1]', "[[]", "{}}", "[1 2]", '{"a"}', "[{]}", "]", "[[[[]]]]]"]:
        assert not walk(bad), bad
    assert dfa.num_states < 250  # one automaton for every depth (the unrolled level 2 alone had ~500)


def test_deep_documents_are_accepted_token_by_token(table, llama3):
    rng = random.Random(1)
    for i in range(120):
        doc = {"meta": {"v": _random_value(rng, rng.randint(3, 12))}, "any": _random_value(rng, rng.randint(0, 12)),
               "xs": [_random_value(rng, 4) for _ in range(rng.randint(0, 3))]}
        text = json.dumps(doc, separators=(",", ":") if i % 2 else (", ", ": "))
        assert accepts(table, _ids(llama3, text)), text
    deep = json.dumps({"meta": _nested(41), "any": _nested(40, [])}, separators=(",", ":"))
    ids = _ids(llama3, deep)
    assert any(llama3.token_bytes[t].count(b"}") + llama3.token_bytes[t].count(b"]") >= 2 for t in ids)
    assert accepts(table, ids)


@pytest.mark.parametrize("text", ['{"meta":{"a":[1}},"any":0}', '{"meta":{"a":[[1]},"any":0}',
                                  '{"meta":{"a":{}}}},"any":0}', '{"meta":[],"any":0}', '{"meta":{},"any":[[0]}'])
def test_mismatched_brackets_are_refused(table, llama3, text):
    assert not accepts(table, _ids(llama3, text))


def test_the_depth_cap_holds_exactly(table, llama3):
    at_cap = json.dumps({"meta": {}, "any": _nested(S.MAX_STACK_DEPTH)}, separators=(",", ":"))
    past = json.dumps({"meta": {}, "any": _nested(S.MAX_STACK_DEPTH + 1)}, separators=(",", ":"))
    assert accepts(table, _ids(llama3, at_cap))
    assert not accepts(table, _ids(llama3, past))
    assert any(k == "max_any_depth" and "62" in why for _, k, why in table.meta["narrowed"])


def _depth(value) -> int:
    if isinstance(value, dict | list):
        inner = value.values() if isinstance(value, dict) else value
        return 1 + max((_depth(v) for v in inner), default=0)
    return 0


@pytest.mark.parametrize("schema", [OPEN, {}, {"type": "array", "items": {}, "minItems": 2, "maxItems": 12},
                                    {"type": "object", "additionalProperties": True}])
def test_random_walks_inside_tight_budgets_parse_and_validate(llama3, schema):
    t = compile_schema(schema, llama3, use_cache=False)
    assert t.has_stack
    rng = np.random.default_rng(0)
    for i in range(16):
        budget = int(t.dist[0]) + i % 5 if i % 2 else 160
        ids = random_walk(t, llama3, rng, max_tokens=budget)
        assert len(ids) <= budget and accepts(t, ids)
        jsonschema.validate(json.loads(decode(llama3, ids)), schema)


def _bracket_walk(t, vocab, rng, budget: int, bias: float) -> list[int]:
    """A walk by the host rule (walk.random_walk's) that picks a token opening a bracket with
    probability `bias` when one is allowed: it nests deep, then must close every level in time."""
    opening = np.asarray([b"[" in b or b"{" in b for b in vocab.token_bytes])
    from surecall.grammars import items
    from surecall.grammars.walk import _next_item

    state, depth, bits, item, out = 0, 0, 0, 0, []
    while True:
        remaining = budget - len(out)
        toks, nexts = t.transitions(state)
        ok, after, depths, kinds, items_after = S.stack_step(t, state, depth, bits, toks, nexts, remaining,
                                                             item if t.has_items else None)
        left = remaining - int(S.stack_need(depth))
        if t.has_items:
            ok &= items.kept(t, state, 0, item, toks, nexts, left)
        else:
            ok &= t.dist[nexts] <= left - 1
        if t.accept[state] and depth == 0 and (not ok.any() or rng.random() < 0.05):
            return out
        assert ok.any(), (state, depth, remaining)
        pool = np.flatnonzero(ok & opening[toks])
        if not pool.size or rng.random() > bias:
            pool = np.flatnonzero(ok)
        i = int(rng.choice(pool))
        out.append(int(toks[i]))
        plain = _next_item(t, state, item, int(toks[i]))
        item = items_after[i] if items_after[i] is not item else plain
        state, depth, bits = int(after[i]), int(depths[i]), int(kinds[i])


@pytest.mark.parametrize("schema", [{}, {"type": "object", "properties": {"x": {"type": "array", "maxItems": 30}},
                                         "required": ["x"]}])
def test_walks_that_nest_deep_still_close_inside_the_budget(llama3, schema):
    t = compile_schema(schema, llama3, use_cache=False)
    rng = np.random.default_rng(5)
    deepest = 0
    for budget in (40, 60, 90, 130):
        ids = _bracket_walk(t, llama3, rng, budget, bias=0.9)
        assert len(ids) <= budget
        doc = json.loads(decode(llama3, ids))
        jsonschema.validate(doc, schema)
        deepest = max(deepest, _depth(doc))
    assert deepest >= 5  # past the unrolled max_any_depth (2)


def test_every_open_level_can_close_inside_the_budget(table, llama3):
    """A row deep in a free-form value with exactly the tokens it needs still completes: the
    budget rule counts one closer per open level (stack.stack_need) on top of dist."""
    prefix = _ids(llama3, '{"meta":{"a":[[[{"b":[[[[')
    state, depth, bits = 0, 0, 0
    for t in prefix:
        nxt = table.next_state(state, t)
        got = S.outcome(table, state, t, depth, bits)
        state, depth, bits = (nxt if got[0] < 0 else got[0]), got[1], got[2]
    assert depth == 8
    need = int(table.dist[state]) + int(S.stack_need(depth))
    rng = np.random.default_rng(3)
    for _ in range(20):  # walk on from here with exactly `need` tokens left: always completes
        s, d, b, out = state, depth, bits, []
        while not (table.accept[s] and d == 0):
            toks, plain = table.transitions(s)
            ok, nexts, depths, kinds, _ = S.stack_step(table, s, d, b, toks, plain, need - len(out), np.zeros(4))
            ok &= table.dist[plain] <= need - len(out) - int(S.stack_need(d)) - 1  # the other rules
            assert ok.any(), (s, d, b, need - len(out))
            i = int(rng.choice(np.flatnonzero(ok)))
            out.append(int(toks[i]))
            s, d, b = int(nexts[i]), int(depths[i]), int(kinds[i])
        assert len(out) <= need
        json.loads(decode(llama3, prefix + out))


def test_unrolled_free_form_values_stay_available(llama3):
    t = compile_schema(OPEN, llama3, GrammarOptions(free_form_stack=False), use_cache=False)
    assert not t.has_stack
    assert not accepts(t, _ids(llama3, json.dumps({"meta": _nested(4), "any": 0}, separators=(",", ":"))))


def test_the_cache_and_concatenation_keep_the_stack(llama3, table):
    from surecall.grammars import cache

    assert cache.save("stack-test", table) is not None
    loaded = cache.load("stack-test", full_check=True)
    assert loaded is not None and loaded.has_stack
    for name in ("stack_key", "stack_ptr", "stack_cond_bits", "stack_next", "stack_weight"):
        assert np.array_equal(getattr(loaded, name), getattr(table, name))
    plain = compile_schema({"type": "object", "properties": {"n": {"type": "integer"}}}, llama3, use_cache=False)
    both, offsets = TokenTable.concat([plain, table])
    text = json.dumps({"meta": _nested(7), "any": [1, {"x": []}]}, separators=(",", ":"))
    ids = _ids(llama3, text)
    state, depth, bits = int(offsets[1]), 0, 0
    for t in ids:
        nxt = both.next_state(state, t)
        assert nxt is not None
        got = S.outcome(both, state, t, depth, bits, np.zeros(4, np.int64))
        assert got is not None
        state, depth, bits = (nxt if got[0] < 0 else got[0]), got[1], got[2]
    assert both.accept[state] and depth == 0
    assert dataclasses.replace(both).has_stack


SHARED_CASES = [  # (schema, options, copies of the free-form value in its DFA)
    (OPEN, None, 3),
    ({"type": "object", "properties": {f"p{i}": {} for i in range(5)}, "required": [f"p{i}" for i in range(5)]}, None, 5),
    ({"type": "array", "items": {}, "minItems": 2, "maxItems": 12}, None, 1),
    ({"type": "object", "properties": {"a": {}, "b": {"type": "array", "items": {"type": "object"}, "maxItems": 3}}},
     GrammarOptions(whitespace="free"), 4),
]


@pytest.mark.parametrize("schema,options,copies", SHARED_CASES)
def test_copies_take_the_shared_walk_and_get_the_same_entries(llama3, monkeypatch, schema, options, copies):
    """stack_entries with the per-process template (ws given) equals the walk of every pair from
    each copy (ws None), outcome for outcome, drops included; every copy was matched and covers
    every state inside a free-form value."""
    import surecall.grammars.compile as C

    seen = []
    real = C.stack_entries

    def spy(*args, **kwargs):
        seen.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(C, "stack_entries", spy)
    compile_schema(schema, llama3, options, use_cache=False)
    assert seen, "the grammar holds no free-form value on the stack"
    (dfa, marks, vi, counted, items), kwargs = seen[-1]
    template = S._template(vi, kwargs["ws"])
    maps = S._match_copies(dfa, marks, template)
    assert len(maps) == copies
    assert sum(int((g >= 0).sum()) for g in maps) == int((marks.ctx != S.CTX_NONE).sum())
    shared, shared_drop = real(dfa, marks, vi, counted, items, ws=kwargs["ws"])
    direct, direct_drop = real(dfa, marks, vi, counted, items, ws=None)
    for field in dataclasses.fields(direct):
        assert np.array_equal(getattr(shared, field.name), getattr(direct, field.name)), field.name
    assert shared.next.size > 0
    for a, b in zip(shared_drop, direct_drop, strict=True):
        assert np.array_equal(np.sort(a), np.sort(b))


def test_a_copy_that_differs_from_the_template_is_walked_as_it_is(llama3):
    """_match_copies drops a copy whose edges disagree with the template's (here one closer's
    object target moved): nothing is mapped onto states that are not a copy."""
    dfa, marks = S.cut_stack_marks(regex_to_dfa(f'"a":(?:{S.stack_value_regex("")})'))
    from surecall.grammars.tokenwalk import vocab_index

    vi = vocab_index(llama3)
    template = S._template(vi, "")
    assert len(S._match_copies(dfa, marks, template)) == 1
    broken = dataclasses.replace(marks, targets=marks.targets.copy())
    broken.targets[0, 0] = broken.targets[0, 1]
    assert S._match_copies(dfa, broken, template) == []
