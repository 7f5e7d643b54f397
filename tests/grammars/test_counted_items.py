"""Counted arrays (grammars/items.py): minItems/maxItems of any size enforced by an item counter.

Checked on the host side of the TokenTable contract (items.item_allows / next_item_counter /
kept, the rule kernels/items.py implements): the separator refused at maxItems and the closing
`]` refused before minItems, walks driven to both ends, random walks inside tight budgets, tokens
that open and close an array at once, nested counted arrays falling back with a reason, the
disk cache and concatenation.
"""

from __future__ import annotations

import dataclasses
import json
import re

import jsonschema
import numpy as np
import pytest
from test_counted_strings import _ids

from surecall.grammars import items as I
from surecall.grammars.compile import compile_schema
from surecall.grammars.schema.to_regex import expand_marks, schema_to_regex
from surecall.grammars.table import TokenTable
from surecall.grammars.vocab.core import Vocab
from surecall.grammars.walk import decode

SIZES = [1, 48, 49, 60, 512]


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SURECALL_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def llama3(data_dir):
    from conftest import cached_vocab

    return cached_vocab("llama3")


def items_vocab() -> Vocab:
    """Every byte, plus tokens that open, close or cross an array's edges (and whole arrays)."""
    pieces = [bytes([b]) for b in range(256)]
    pieces += [b'["', b'","', b'"]', b"ab", b"abc", b'{"a": []}', b'{"a": [', b",1,2", b"1]"]
    pieces += [b""]
    stop = len(pieces) - 1
    return Vocab(token_bytes=tuple(pieces), special_ids=frozenset({stop}), stop_ids=(stop,),
                 logits_width=len(pieces) + 3, format="test", name="items-synthetic")


def array_schema(lo: int | None, hi: int | None, items: dict | None = None) -> dict:
    a = {"type": "array", "items": items or {"type": "integer", "minimum": 0, "maximum": 99}}
    if lo is not None:
        a["minItems"] = lo
    if hi is not None:
        a["maxItems"] = hi
    return {"type": "object", "properties": {"a": a}, "required": ["a"], "additionalProperties": False}


def step(table: TokenTable, state: int, c: int, k, t: int) -> tuple[int, int, np.ndarray]:
    """One token: (state, string counter, item counters (a stack)) after it, checking it is allowed."""
    nxt = table.next_state(state, t)
    toks = np.asarray([t])
    assert nxt is not None and table.count_allows(state, c, toks)[0] and I.item_allows(table, state, k, toks)[0], t
    return nxt, table.next_counter(state, c, t), I.next_item_counters(table, state, k, toks)[0]


def top(table: TokenTable, state: int, k) -> int:
    """The innermost open array's counter."""
    return I._top(table, state, I.as_stack(k))


def walk(table: TokenTable, rng, max_tokens: int, prefer: str | None = None) -> list[int]:
    """A walk by the kernels' rule; prefer="max" crosses separators whenever it may, "min" closes
    each array as soon as it may (and never jumps past its minimum); None: uniform."""
    if max_tokens < int(table.dist[0]):
        raise ValueError("max_tokens below dist[0]")
    state, c, k, out = 0, 0, 0, []
    while True:
        remaining = max_tokens - len(out)
        toks, nexts = table.transitions(state)
        ok = I.kept(table, state, c, k, toks, nexts, remaining)
        if table.accept[state] and (not ok.any() or rng.random() < 0.5 or prefer is not None):
            return out
        choice = np.flatnonzero(ok)
        assert choice.size, f"nothing kept in state {state} with {remaining} tokens left"
        if prefer is not None and table.has_items and table.item_hi[state] >= 0:
            _, inc, flag, _ = I._lookup(table, state, toks[choice])
            closes = (flag & I.FLAG_CLOSES) != 0
            if prefer == "max":
                pick = choice[(inc > 0) & ~closes] if ((inc > 0) & ~closes).any() else choice[~closes]
                pick = pick if pick.size else choice
            else:
                under = top(table, state, k) + inc <= table.item_lo[state]
                pick = choice[closes] if closes.any() else choice[under & ~closes]
                pick = pick if pick.size else choice
            choice = pick
        i = int(rng.choice(choice))
        t = int(toks[i])
        out.append(t)
        state, c, k = step(table, state, c, k, t)


def accepts(table: TokenTable, ids: list[int]) -> bool:
    state, c, k = 0, 0, 0
    for t in ids:
        nxt = table.next_state(state, t)
        toks = np.asarray([t])
        if nxt is None or not (table.count_allows(state, c, toks)[0] and I.item_allows(table, state, k, toks)[0]):
            return False
        state, c, k = nxt, table.next_counter(state, c, t), I.next_item_counters(table, state, k, toks)[0]
    return bool(table.accept[state])


@pytest.mark.parametrize("size", SIZES)
def test_walks_hit_both_ends_exactly_and_validate(llama3, size):
    lo, hi = max(1, size // 2), size
    schema = array_schema(lo, hi)
    table = compile_schema(schema, llama3)
    assert table.relaxed == [] and table.has_items == (hi > 8)
    rng = np.random.default_rng(size)
    for prefer, expected in (("min", lo), ("max", hi)):
        doc = json.loads(decode(llama3, walk(table, rng, 50 * size + 100, prefer)))
        jsonschema.validate(doc, schema)
        assert len(doc["a"]) == expected
    for i in range(3):  # walks cut by a tight max_tokens still validate
        budget = int(table.dist[0]) + i
        ids = walk(table, rng, budget)
        assert len(ids) <= budget and accepts(table, ids)
        jsonschema.validate(json.loads(decode(llama3, ids)), schema)


@pytest.mark.parametrize("size", [49, 512])
def test_separator_refused_at_the_max_and_closing_refused_before_the_min(llama3, size):
    table = compile_schema(array_schema(size, size), llama3)
    state = 0
    for t in _ids(llama3, '{"a": [1'):
        state = table.next_state(state, t)
    assert table.item_hi[state] == size - 1 and table.item_lo[state] == size - 1
    comma, close = _ids(llama3, ",")[0], _ids(llama3, "]")[0]
    for k in sorted({0, size - 2, size - 1}):
        allows = I.item_allows(table, state, k, np.asarray([comma, close]))
        assert bool(allows[0]) == (k < size - 1), k  # one more item only below the max
        assert bool(allows[1]) == (k == size - 1), k  # closing only at exactly `size` items
    assert I.item_need(table, np.asarray([state]), np.asarray([0]))[0] == table.item_cost[state] * (size - 1)
    assert int(table.dist[0]) >= size  # dist counts the unmet minimum


def test_tokens_that_cross_several_separators_or_open_and_close_are_counted():
    vocab = items_vocab()
    ids = {piece: i for i, piece in enumerate(vocab.token_bytes)}
    schema = array_schema(10, 11, {"type": "string", "maxLength": 3})
    table = compile_schema(schema, vocab)
    assert table.has_items and table.has_counts and table.relaxed == []
    start = _ids(vocab, '{"a": ') + [ids[b'["']]  # opens the array and its first string in one token
    state, c, k = 0, 0, 0
    for t in start:
        state, c, k = step(table, state, c, k, t)
    assert table.item_hi[state] == 10 and top(table, state, k) == 0 and table.count_row[state] >= 0
    body = [ids[b"x"], ids[b'","']] * 9  # `","` closes a string, crosses a separator, opens the next
    for t in body:
        state, c, k = step(table, state, c, k, t)
    assert top(table, state, k) == 9
    end = [ids[b"ab"], ids[b'"'], ids[b"]"], ids[b"}"]]
    assert accepts(table, start + body + end)  # ten items
    assert not accepts(table, start + body[:-2] + end)  # nine
    assert accepts(table, start + body + [ids[b'","']] + end)  # eleven
    assert not accepts(table, start + body + [ids[b'","'], ids[b'","']] + end)  # twelve
    assert not accepts(table, start + body + [ids[b"abc"], ids[b"a"]] + end[1:])  # a string too long
    assert accepts(table, start + body + [ids[b'"]']] + [ids[b"}"]])  # closes the string and the array


def test_a_whole_array_in_one_token_is_checked_statically():
    vocab = items_vocab()
    ids = {piece: i for i, piece in enumerate(vocab.token_bytes)}
    empty_ok, empty_bad = compile_schema(array_schema(0, 20), vocab), compile_schema(array_schema(10, 20), vocab)
    assert accepts(empty_ok, [ids[b'{"a": []}']])
    assert empty_bad.next_state(0, ids[b'{"a": []}']) is None  # ten items at least: never allowed
    ten = [ids[b'{"a": ['], ids[b"0"]] + [ids[b",1,2"]] * 4 + [ids[b","], ids[b"1]"], ids[b"}"]]
    assert accepts(empty_bad, ten)  # 1 + 8 + 1 items, two separators per `,1,2`
    assert not accepts(empty_bad, ten[:2] + ten[3:])  # eight


def nested_schema(outer: tuple[int, int], inner: tuple[int, int]) -> dict:
    ints = {"type": "integer", "minimum": 0, "maximum": 9}
    arr = {"type": "array", "items": ints, "minItems": inner[0], "maxItems": inner[1]}
    return {"type": "object", "properties": {"a": {"type": "array", "items": arr, "minItems": outer[0],
            "maxItems": outer[1]}}, "required": ["a"], "additionalProperties": False}


@pytest.mark.parametrize("level", ["outer", "inner"])
@pytest.mark.parametrize("size", [*SIZES[:-1], pytest.param(SIZES[-1], marks=pytest.mark.slow)])  # 512: ~1 min
def test_nested_arrays_hit_both_ends_exactly_at_every_level(llama3, size, level):
    lo, hi = max(1, size // 2), size
    other = (9, 10)  # counted too (above the 8 spelled out)
    schema = nested_schema((lo, hi), other) if level == "outer" else nested_schema(other, (lo, hi))
    table = compile_schema(schema, llama3)
    assert table.relaxed == [] and table.has_items and int(table.item_depth.max()) == (2 if hi > 8 else 1)
    rng = np.random.default_rng(size)
    for prefer, expected in (("min", (lo, other[0])), ("max", (hi, other[1]))):
        doc = json.loads(decode(llama3, walk(table, rng, 60 * size * 11 + 400, prefer)))
        jsonschema.validate(doc, schema)
        sizes = {len(doc["a"])} | {len(x) for x in doc["a"]}
        want = {expected[0]} | {expected[1]} if level == "outer" else {expected[1]} | {expected[0]}
        assert sizes == want, (prefer, sizes)
    for i in range(3):  # walks cut by a tight max_tokens still validate
        budget = int(table.dist[0]) + i
        ids = walk(table, rng, budget)
        assert len(ids) <= budget and accepts(table, ids)
        jsonschema.validate(json.loads(decode(llama3, ids)), schema)


def nested_vocab() -> Vocab:
    """Every byte, plus tokens that cross one separator, and that close or open two arrays at once."""
    pieces = [bytes([b]) for b in range(256)] + [b"1,", b"1]", b"[[", b"]]", b"],", b"],[", b'{"a": [[']
    pieces += [b""]
    stop = len(pieces) - 1
    return Vocab(token_bytes=tuple(pieces), special_ids=frozenset({stop}), stop_ids=(stop,),
                 logits_width=len(pieces) + 3, format="test", name="nested-synthetic")


def test_nested_counters_push_and_pop_and_dist_counts_every_level():
    vocab = nested_vocab()
    ids = {piece: i for i, piece in enumerate(vocab.token_bytes)}
    schema = nested_schema((10, 11), (9, 12))
    table = compile_schema(schema, vocab)
    assert table.relaxed == [] and int(table.item_depth.max()) == 2
    state, c, k = 0, 0, I.as_stack(0)
    for t in [ids[bytes([b])] for b in b'{"a": [[1']:
        state, c, k = step(table, state, c, k, t)
    assert table.item_depth[state] == 2 and list(k[:2]) == [0, 0]
    assert table.item_lo[state] == 8 and table.item_below_lo[state, 0] == 9
    need = int(I.item_need(table, np.asarray([state]), k[None, :])[0])
    assert need == table.item_cost[state] * 8 + table.item_below_cost[state, 0] * 9  # both levels' minimums
    for t in [ids[b","], ids[b"1"]] * 8:
        state, c, k = step(table, state, c, k, t)
    comma, close = ids[b","], ids[b"]"]
    assert list(k[:2]) == [0, 8] and I.item_allows(table, state, k, np.asarray([close]))[0]
    state, c, k = step(table, state, c, k, close)  # pops the inner array
    assert table.item_depth[state] == 1 and k[0] == 0
    state, c, k = step(table, state, c, k, comma)
    state, c, k = step(table, state, c, k, ids[b"["])  # pushes the next one
    assert table.item_depth[state] == 2 and list(k[:2]) == [1, 0]
    assert table.next_state(state, ids[b"1]"]) is not None  # `1]` closes it: one item, below the minimum
    assert not I.item_allows(table, state, k, np.asarray([ids[b"1]"]]))[0]
    inner_end = table.next_state(table.next_state(state, ids[b"1"]), ids[b"]"])
    assert inner_end is not None and table.item_depth[inner_end] == 1
    after_one = table.next_state(state, ids[b"1"])
    for two_levels in (b"]]", b"],", b"],["):  # closing the row's array and then the outer: single steps
        assert table.next_state(after_one, ids[two_levels]) is None, two_levels
    assert table.next_state(0, ids[b'{"a": [[']) is None  # opens two arrays at once: `[` then `[`


def test_nested_counted_arrays_deeper_than_the_stack_fall_back_with_a_reason(llama3):
    deep: dict = {"type": "integer"}
    for _ in range(4):
        deep = {"type": "array", "items": deep, "maxItems": 20}
    counted = schema_to_regex(deep)
    assert counted.relaxed == []  # four levels: all counted
    five = schema_to_regex({"type": "array", "items": deep, "maxItems": 100})
    assert five.relaxed == [("", "maxItems")] and "4 counted arrays" in five.reasons[("", "maxItems")]
    small = schema_to_regex({"type": "array", "items": deep, "maxItems": 12})
    assert small.relaxed == []  # the fifth level spelled out
    table = compile_schema({"type": "array", "items": deep, "maxItems": 2}, llama3)
    assert table.has_items and table.relaxed == [] and int(table.item_depth.max()) == 4
    rng = np.random.default_rng(5)
    for _ in range(3):
        doc = json.loads(decode(llama3, walk(table, rng, 4000, "max")))
        jsonschema.validate(doc, {"type": "array", "items": deep, "maxItems": 2})


def prefix_schema(lo: int, hi: int) -> dict:
    arr = {"type": "array", "prefixItems": [{"type": "string", "maxLength": 3}, {"type": "boolean"}],
           "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": lo, "maxItems": hi}
    return {"type": "object", "properties": {"a": arr}, "required": ["a"], "additionalProperties": False}


@pytest.mark.parametrize("size", SIZES)
def test_prefix_items_with_bounds_are_counted_and_hit_both_ends(llama3, size):
    lo, hi = max(1, size // 2), size
    schema = prefix_schema(lo, hi)
    table = compile_schema(schema, llama3)
    assert table.relaxed == [] and table.has_items == (hi > 8)
    rng = np.random.default_rng(size)
    for prefer, expected in (("min", lo), ("max", hi)):
        doc = json.loads(decode(llama3, walk(table, rng, 50 * size + 100, prefer)))
        jsonschema.validate(doc, schema)
        assert len(doc["a"]) == expected
    for i in range(3):  # walks cut by a tight max_tokens still validate
        budget = int(table.dist[0]) + i
        ids = walk(table, rng, budget)
        assert len(ids) <= budget and accepts(table, ids)
        jsonschema.validate(json.loads(decode(llama3, ids)), schema)


def test_prefix_items_without_more_items_are_spelled_to_the_prefix():
    arr = {"type": "array", "prefixItems": [{"type": "integer"}] * 3, "items": False, "minItems": 2, "maxItems": 100}
    result = schema_to_regex(arr)
    assert result.relaxed == []
    regex = expand_marks(result.regex)
    assert [bool(re.fullmatch(regex, json.dumps(list(range(n))))) for n in range(5)] == [False, False, True, True, False]


def test_expand_marks_spells_the_bounds_for_python_re():
    regex = expand_marks(schema_to_regex({"type": "array", "items": {"type": "integer"}, "minItems": 9,
                                          "maxItems": 10}).regex)
    for n in range(7, 13):
        assert bool(re.fullmatch(regex, json.dumps(list(range(n))))) == (9 <= n <= 10), n
    tuple_ = expand_marks(schema_to_regex({"type": "array", "prefixItems": [{"type": "boolean"}, {"type": "null"}],
                                           "items": {"type": "integer"}, "minItems": 0, "maxItems": 10}).regex)
    assert re.fullmatch(tuple_, "[]") and re.fullmatch(tuple_, "[true]") and re.fullmatch(tuple_, "[true, null, 3]")
    assert re.fullmatch(tuple_, json.dumps([True, None] + [1] * 8)) and not re.fullmatch(tuple_, "[null]")
    assert not re.fullmatch(tuple_, json.dumps([True, None] + [1] * 9))
    nested = expand_marks(schema_to_regex({"type": "array", "items": {"type": "array", "items": {"type": "integer"},
                                                                        "minItems": 9, "maxItems": 9},
                                           "minItems": 9, "maxItems": 10}).regex)
    row = list(range(9))
    assert re.fullmatch(nested, json.dumps([row] * 9)) and re.fullmatch(nested, json.dumps([row] * 10))
    assert not re.fullmatch(nested, json.dumps([row] * 11)) and not re.fullmatch(nested, json.dumps([row[:8]] * 9))
    optional = expand_marks(schema_to_regex({"type": "array", "items": {"type": "integer"}, "maxItems": 10}).regex)
    assert re.fullmatch(optional, "[]") and re.fullmatch(optional, "[1]") and not re.fullmatch(optional, "[" + "1," * 10 + "1]")


def test_cache_round_trip_and_concat_keep_the_item_counters(llama3):
    schema = array_schema(20, 30)
    built = compile_schema(schema, llama3)
    loaded = compile_schema(schema, llama3)
    for name in ("item_lo", "item_hi", "item_cost", "item_key", "item_inc", "item_flag", "item_set", "item_next"):
        assert np.array_equal(getattr(built, name), getattr(loaded, name)), name
    plain = compile_schema({"type": "object", "properties": {"b": {"type": "boolean"}}, "required": ["b"]}, llama3)
    both, offsets = TokenTable.concat([plain, built])
    state = int(offsets[1])
    for t in _ids(llama3, '{"a": [1'):
        state = both.next_state(state, t)
    assert both.item_hi[state] == 29 and both.item_lo[state] == 19
    assert (both.item_hi[: plain.num_states] == -1).all()
    key = int(both.item_key[-1])
    assert both.item_next[-1] == both.next_state(key // both.logits_width, key % both.logits_width)


@pytest.mark.parametrize("kind", ["calls", "auto"])
def test_a_call_with_control_tokens_keeps_its_item_bounds(kind):
    """Hermes with `<tool_call>` as a control id: the call regex holds placeholders 0x03.. that
    tool_modes relabels; the item mark is another byte, so the array keeps its counter."""
    from test_modes_grammar import _toy_vocab

    from surecall.grammars.tool_modes import SYNTAX, ModeGrammar, compile_mode, find_controls

    vocab = _toy_vocab()
    schema = array_schema(10, 60)
    grammar = ModeGrammar(kind, "hermes", (("f", schema),), True, controls=find_controls(vocab, SYNTAX["hermes"]))
    assert grammar.controls
    table = compile_mode(grammar, vocab, use_cache=False)
    assert table.has_items and table.relaxed == [] and "counted_fallback" not in table.meta
    tool_call = dict(grammar.controls)["<tool_call>"]
    state = table.next_state(0, tool_call)
    for piece in [b"\n", *[bytes([b]) for b in b'{"name": "f", "arguments": {"a": [1']]:
        state = table.next_state(state, vocab.token_bytes.index(piece))
        assert state is not None, piece
    assert table.item_lo[state] == 9 and table.item_hi[state] == 59


# --- maxProperties over undeclared keys: the members counted as items ------------------------
def map_schema(hi: int, declared: bool = True, value: dict | None = None) -> dict:
    """A map of short keys (patternProperties) to digits, maxProperties `hi`; with `declared`, a
    required and an optional declared property come first."""
    schema = {"type": "object", "patternProperties": {"^k[0-9]{1,5}$": value or {"type": "integer", "minimum": 0,
                                                                                 "maximum": 9}},
              "additionalProperties": False, "maxProperties": hi}
    if declared:
        schema.update(properties={"id": {"type": "integer", "minimum": 0, "maximum": 9}, "on": {"type": "boolean"}},
                      required=["id"])
    return schema


def members(text: str) -> int:
    """Members written in the top-level object (a repeated key counted each time)."""
    return len(json.loads(text, object_pairs_hook=lambda pairs: pairs))


@pytest.mark.parametrize("size", [2, 9, 49, 60, pytest.param(512, marks=pytest.mark.slow)])
def test_max_properties_over_undeclared_keys_is_counted_and_hit_exactly(llama3, size):
    schema = map_schema(size)
    table = compile_schema(schema, llama3)
    assert table.relaxed == [] and table.has_items
    rng = np.random.default_rng(size)
    text = decode(llama3, walk(table, rng, 40 * size + 200, "max")).decode()
    jsonschema.validate(json.loads(text), schema)
    assert members(text) == size
    for i in range(4):  # uniform walks and walks cut by a tight max_tokens validate
        budget = int(table.dist[0]) + i if i % 2 else 40 * size + 200
        ids = walk(table, rng, budget)
        assert len(ids) <= budget and accepts(table, ids)
        jsonschema.validate(json.loads(decode(llama3, ids)), schema)
        assert members(decode(llama3, ids).decode()) <= size


def test_a_separator_is_refused_at_max_properties_and_closing_is_free(llama3):
    table = compile_schema(map_schema(12, declared=False), llama3)
    state = 0
    for t in _ids(llama3, '{"k7": 1'):
        state = table.next_state(state, t)
    assert table.item_hi[state] == 11 and table.item_lo[state] == 0
    comma, close = _ids(llama3, ",")[0], _ids(llama3, "}")[0]
    for k in (0, 10, 11):
        allows = I.item_allows(table, state, k, np.asarray([comma, close]))
        assert bool(allows[0]) == (k < 11) and bool(allows[1]), k


def test_counted_maps_and_arrays_nest(llama3):
    inner = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 9, "maxItems": 10}
    schema = {"type": "array", "items": map_schema(10, declared=False, value=inner), "minItems": 1, "maxItems": 9}
    table = compile_schema(schema, llama3)
    assert table.relaxed == [] and int(table.item_depth.max()) == 3
    rng = np.random.default_rng(3)
    text = decode(llama3, walk(table, rng, 20000, "max")).decode()
    doc = json.loads(text)
    jsonschema.validate(doc, schema)
    pairs = json.loads(text, object_pairs_hook=lambda p: p)
    counts = [len(m) for m in pairs]  # "max" may still pick a token that opens and closes a map at once
    assert len(doc) == 9 and max(counts) == 10 and {len(v) for m in pairs for _, v in m} == {10}, counts
    for i in range(3):
        budget = int(table.dist[0]) + i
        ids = walk(table, rng, budget)
        assert len(ids) <= budget and accepts(table, ids)
        jsonschema.validate(json.loads(decode(llama3, ids)), schema)


def test_property_counts_left_to_the_validator_say_why():
    over = schema_to_regex({**map_schema(20), "minProperties": 5})
    assert over.relaxed == [("", "minProperties")]
    assert "repeated key" in over.reasons[("", "minProperties")]
    crowded = schema_to_regex({**map_schema(1), "properties": {k: {"type": "integer"} for k in ("id", "a", "b")}})
    assert crowded.relaxed == [("", "maxProperties")] and "past maxProperties 1" in crowded.reasons[("", "maxProperties")]
    plain = expand_marks(schema_to_regex(map_schema(20, declared=False)).regex)
    assert re.fullmatch(plain, '{"k1": 1, "k22": 2}') and not re.fullmatch(plain, '{"k1": 1, "ab": 2}')


@pytest.mark.parametrize("low", [3, 49])
def test_min_properties_over_undeclared_keys_writes_that_many_members(llama3, low):
    """Listed all the same (a repeated key counts once), but a row writes at least `low` members:
    the grammar no longer ends an object of undeclared keys early."""
    schema = {**map_schema(10 * low, declared=False), "minProperties": low}
    table = compile_schema(schema, llama3)
    assert table.relaxed == [("", "minProperties")] and "at least" in table.meta["relaxed_reasons"][0]
    rng = np.random.default_rng(low)
    text = decode(llama3, walk(table, rng, 40 * low + 200, "min")).decode()
    assert members(text) == low
    for i in range(4):
        budget = int(table.dist[0]) + i
        ids = walk(table, rng, budget)
        assert len(ids) <= budget and accepts(table, ids) and members(decode(llama3, ids).decode()) >= low
    unbounded = compile_schema({k: v for k, v in schema.items() if k != "maxProperties"}, llama3)
    assert unbounded.has_items and members(decode(llama3, walk(unbounded, rng, 40 * low + 200, "min")).decode()) == low


def token_by_token_dist(table: TokenTable) -> np.ndarray:
    """The item dist over every transition, one edge per token (what add_items_inplace computes from
    each state's distinct targets): each token weighs 1, an opening token its unmet minimum more,
    a token opening a counted string its need; inside a counted string only tokens that start no
    character are edges."""
    from surecall.grammars.counted import dist_to_accept

    ptr, tok, nxt = table.dense_transitions()
    owner = np.repeat(np.arange(table.num_states, dtype=np.int64), np.diff(ptr))
    tok, nxt = tok.astype(np.int64), nxt.astype(np.int64)
    _, _, flag, item_set = I._lookup_many(table, owner, tok)
    charge = table.item_cost[nxt].astype(np.int64) * np.maximum(table.item_lo[nxt] - np.maximum(item_set, 0), 0)
    weight = 1 + np.where((flag & I.FLAG_OPENS) != 0, charge, 0) + I._body_entry(table, owner, tok, nxt)
    usable = I._usable(table, owner, tok)
    return dist_to_accept(table.num_states, table.accept, owner[usable], nxt[usable], weight[usable])


def test_item_dist_from_distinct_targets_equals_the_token_by_token_dist(llama3):
    ints = {"type": "integer", "minimum": 0, "maximum": 99}
    inner = {"type": "array", "items": ints, "minItems": 9, "maxItems": 12}
    schemas = [
        # an uncounted outer array: `],[` closes one counted array and opens the next, and its pair
        # of states can also be reached by tokens that open nothing (`,5`)
        {"type": "object", "properties": {"a": {"type": "array", "items": inner, "minItems": 3}}, "required": ["a"]},
        array_schema(9, 60, {"type": "string", "minLength": 2, "maxLength": 50}),  # counted strings inside
        nested_schema((9, 10), (9, 12)),
        {**map_schema(40, declared=False, value=inner), "minProperties": 5},
        prefix_schema(10, 40),
    ]
    closes_and_opens = 0
    for schema in schemas:
        table = compile_schema(schema, llama3)
        assert table.has_items and table.relaxed in ([], [("", "minProperties")])
        assert np.array_equal(table.dist, token_by_token_dist(table)), json.dumps(schema)[:80]
        closes_and_opens += int(np.count_nonzero(table.item_flag == (I.FLAG_CLOSES | I.FLAG_OPENS)))
    assert closes_and_opens > 0


def test_next_states_of_many_pairs_equal_one_state_at_a_time(llama3):
    table = compile_schema(array_schema(9, 60, {"type": "string", "maxLength": 5}), llama3)
    rng = np.random.default_rng(0)
    moving = np.flatnonzero(table.trans_default >= 0)  # states with a token to take
    states = rng.choice(moving, 4000)
    toks = rng.integers(0, table.logits_width, 4000)
    toks[:2000] = [int(rng.choice(table.transitions(int(s))[0])) for s in states[:2000]]  # half real transitions
    got = I._next_states_many(table, states.astype(np.int64), toks.astype(np.int64))
    want = [int(table.next_states(int(s), np.asarray([t]))[0]) for s, t in zip(states, toks, strict=True)]
    assert np.array_equal(got, want) and (got[:2000] >= 0).all()
    bare = dataclasses.replace(table, exc_ptr=np.zeros(table.exc_ptr.size, dtype=np.int32), exc_tok=table.exc_tok[:0],
                               exc_slot=table.exc_slot[:0], exc_base=np.zeros(table.exc_base.size, dtype=np.int32),
                               exc_targets=table.exc_targets[:0])  # no exceptions: every token to its default
    assert np.array_equal(I._next_states_many(bare, states[:10].astype(np.int64), toks[:10].astype(np.int64)),
                          np.where(got[:10] >= 0, table.trans_default[states[:10]], -1))
