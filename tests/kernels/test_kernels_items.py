"""Item counters in the kernels (kernels/items.py): Triton (interpreter) == torch == the host rule.

Rows are (state, string counter, item counter, remaining) met on random walks, inside tight
budgets, through a table with a counted array of bounded strings (so `","` closes a string,
crosses a separator and opens the next one, and `"]` closes both) and a counted array of
integers with tokens that cross two separators at once; and a counted array of counted arrays of
bounded strings (a stack of two item counters per row). The host rule is grammars/items.kept.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

import numpy as np
import pytest
import torch

from surecall.errors import KernelInputError
from surecall.grammars import items as host
from surecall.grammars.compile import compile_schema
from surecall.grammars.table import TokenTable
from surecall.grammars.vocab.core import Vocab
from surecall.kernels import DeviceTable, apply_token_mask_inplace
from surecall.kernels._triton import HAS_TRITON, INTERPRET
from surecall.kernels.items import (
    MAX_ITEM_DEPTH,
    UNBOUNDED,
    ItemTable,
    advance_items,
    apply_item_mask_inplace,
    sample_remaining,
)

needs_interpreter = pytest.mark.skipif(
    not (HAS_TRITON and INTERPRET), reason="needs triton with TRITON_INTERPRET=1 set before import"
)
BACKENDS = ["torch", pytest.param("triton", marks=needs_interpreter)]
SCHEMA = {"type": "object", "properties": {
    "a": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 3}, "minItems": 9,
          "maxItems": 12},
    "b": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 10,
          "maxItems": 10}}, "required": ["a", "b"], "additionalProperties": False}
NESTED = {"type": "object", "properties": {
    "a": {"type": "array", "items": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 3},
                                     "minItems": 9, "maxItems": 10}, "minItems": 9, "maxItems": 11}},
    "required": ["a"], "additionalProperties": False}


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SURECALL_CACHE_DIR", str(tmp_path / "cache"))


def _vocab() -> Vocab:
    pieces = [bytes([b]) for b in range(256)]
    pieces += [b'{"a": ["', b'", "', b'","', b'"]', b'"], "b": [', b"ab", b"abc", b",1,2", b"1]", b"]}", b", 3"]
    pieces += [b""]
    stop = len(pieces) - 1
    return Vocab(token_bytes=tuple(pieces), special_ids=frozenset({stop}), stop_ids=(stop,),
                 logits_width=len(pieces) + 7, format="test", name="items-kernels")


@pytest.fixture(scope="module", params=["flat", "nested"])
def compiled(request):
    vocab = _vocab()
    table = compile_schema(SCHEMA if request.param == "flat" else NESTED, vocab, use_cache=False)
    assert table.has_items and table.has_counts and table.relaxed == []
    assert int(table.item_depth.max()) == (1 if request.param == "flat" else 2)
    return vocab, table


def _rows(table: TokenTable, rng, num: int):
    """(state, counter, item counters (a stack), remaining) met on random walks inside tight budgets."""
    out = []
    while len(out) < num:
        budget = int(table.dist[0]) + int(rng.integers(0, 8))
        state, c, k, used = 0, 0, (0,) * MAX_ITEM_DEPTH, 0
        while not table.accept[state] and len(out) < num:
            remaining = budget - used
            out.append((state, c, k, remaining))
            toks, nexts = table.transitions(state)
            ok = np.flatnonzero(host.kept(table, state, c, k, toks, nexts, remaining))
            assert ok.size, (state, c, k, remaining)  # the budget always leaves a way to finish
            t = int(toks[int(rng.choice(ok))])
            k = tuple(int(x) for x in host.next_item_counters(table, state, k, np.asarray([t]))[0])
            state, c = table.next_state(state, t), table.next_counter(state, c, t)
            used += 1
    return out


def _host_allowed(table: TokenTable, s: int, c: int, k: int, rem: int, width: int) -> np.ndarray:
    allowed = np.zeros(width, dtype=bool)
    toks, nexts = table.transitions(s)
    allowed[toks[host.kept(table, s, c, k, toks, nexts, rem)]] = True
    if table.accept[s] and rem >= 1:
        allowed[table.stop_ids] = True
    return allowed


def _tensors(rows):
    """(states, string counters, item counters [B, MAX_ITEM_DEPTH], remaining)."""
    return tuple(torch.tensor([r[i] for r in rows], dtype=torch.int32) for i in range(4))


@pytest.mark.parametrize("backend", BACKENDS)
def test_mask_then_item_mask_equals_the_host_rule(compiled, backend):
    vocab, table = compiled
    rows = _rows(table, np.random.default_rng(0), 120)
    states, counters, items, remaining = _tensors(rows)
    dt, it = DeviceTable.from_table(table), ItemTable.from_table(table)
    logits = torch.randn(len(rows), vocab.logits_width)
    apply_token_mask_inplace(logits, dt, states, remaining=sample_remaining(it, states, remaining),
                             counters=counters, backend=backend)
    apply_item_mask_inplace(logits, dt, it, states, items, remaining, counters=counters, backend=backend)
    refused = 0
    for b, (s, c, k, rem) in enumerate(rows):
        expected = _host_allowed(table, s, c, k, rem, logits.shape[1])
        assert np.array_equal(torch.isfinite(logits[b]).numpy(), expected), (s, c, k, rem)
        refused += int(table.item_hi[s] >= 0 and not host.item_allows(
            table, s, k, table.transitions(s)[0]).all())
    assert refused > 0  # the item bounds bind on some rows: the check is not vacuous


@needs_interpreter
@pytest.mark.interpreter
def test_item_mask_triton_equals_torch(compiled):
    vocab, table = compiled
    rows = _rows(table, np.random.default_rng(1), 120)
    states, counters, items, remaining = _tensors(rows)
    states[::7] = -1  # rows without a grammar are left alone
    dt, it = DeviceTable.from_table(table), ItemTable.from_table(table)
    base = torch.randn(len(rows), vocab.logits_width)
    out = {}
    for backend in ("torch", "triton"):
        logits = base.clone()
        apply_item_mask_inplace(logits, dt, it, states, items, remaining, counters=counters, backend=backend)
        out[backend] = logits
    assert torch.equal(out["torch"], out["triton"])
    assert torch.equal(out["torch"][::7], base[::7])
    assert not torch.isfinite(out["torch"]).all()


def test_advance_items_equals_the_host_counter(compiled):
    vocab, table = compiled
    rng = np.random.default_rng(2)
    rows = _rows(table, rng, 150)
    states, _, items, _ = _tensors(rows)
    tokens = []
    for s, _, _, _ in rows:
        tokens.append(int(rng.choice(table.transitions(s)[0])))
    got = advance_items(ItemTable.from_table(table), states, torch.tensor(tokens, dtype=torch.int32), items)
    want = [host.next_item_counters(table, s, k, np.asarray([t]))[0].tolist() for (s, _, k, _), t in zip(rows, tokens)]
    assert got.tolist() == want
    assert any(w != list(k) for (_, _, k, _), w in zip(rows, want))
    kept = torch.tensor([[5, 1, 0, 0], [7, 2, 3, 0]], dtype=torch.int32)
    free = advance_items(ItemTable.from_table(table), torch.full((2,), -1, dtype=torch.int32),
                         torch.zeros(2, dtype=torch.int32), kept)
    assert free.tolist() == kept.tolist()


def test_sample_remaining_lifts_the_budget_only_inside_arrays(compiled):
    _, table = compiled
    it = ItemTable.from_table(table)
    inside = int(np.flatnonzero(table.item_hi >= 0)[0])
    states = torch.tensor([0, inside, -1], dtype=torch.int32)
    out = sample_remaining(it, states, torch.tensor([5, 5, 5], dtype=torch.int32))
    assert out.tolist() == [5, UNBOUNDED, 5]


def test_bad_inputs_are_refused(compiled):
    vocab, table = compiled
    dt, it = DeviceTable.from_table(table), ItemTable.from_table(table)
    logits = torch.zeros(2, vocab.logits_width)
    ok = torch.zeros(2, dtype=torch.int32)
    stacks = torch.zeros(2, MAX_ITEM_DEPTH, dtype=torch.int32)
    with pytest.raises(KernelInputError, match="Invalid item_counters"):
        apply_item_mask_inplace(logits, dt, it, ok, stacks.long(), ok + 5, counters=ok)
    with pytest.raises(KernelInputError, match="Invalid item_counters"):  # one counter per row: a stack is needed
        apply_item_mask_inplace(logits, dt, it, ok, ok, ok + 5, counters=ok)
    with pytest.raises(KernelInputError, match="Invalid counters"):
        apply_item_mask_inplace(logits, dt, it, ok, stacks, ok + 5)
    plain = compile_schema({"type": "object", "properties": {"b": {"type": "boolean"}}}, vocab, use_cache=False)
    with pytest.raises(KernelInputError, match="item counters"):
        ItemTable.from_table(plain)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_item_mask_on_cuda_equals_torch(compiled, dtype):
    vocab, table = compiled
    rows = _rows(table, np.random.default_rng(3), 200)
    cpu = _tensors(rows)
    dev = torch.device("cuda")
    dt, it = DeviceTable.from_table(table, dev), ItemTable.from_table(table, dev)
    base = torch.randn(len(rows), vocab.logits_width).to(dtype)
    want = base.clone()
    apply_item_mask_inplace(want, DeviceTable.from_table(table), ItemTable.from_table(table), cpu[0], cpu[2], cpu[3],
                            counters=cpu[1], backend="torch")
    got = base.to(dev)
    states, counters, items, remaining = (t.to(dev) for t in cpu)
    apply_item_mask_inplace(got, dt, it, states, items, remaining, counters=counters, backend="triton")
    assert torch.equal(got.cpu(), want)
