"""The bracket stack in the kernels (kernels/stack.py): Triton (interpreter) == torch == the host rule.

Rows are (state, stack depth, kind bits, item counters, remaining) met on walks that prefer
opening brackets, inside tight budgets, through a table with free-form values beside and inside a
counted array (so `}, {` closes a value, crosses a separator and opens the next one, and `}]]`
closes three containers at once). The host rule is grammars/stack.stack_step with walk.kept /
items.kept under stack_remaining; a decode loop on random logits (mask, stack mask, sample,
advance) must end every row with a complete, valid document inside its budget.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

import json

import jsonschema
import numpy as np
import pytest
import torch

from surecall.errors import KernelInputError
from surecall.grammars import items as host_items
from surecall.grammars import stack as host
from surecall.grammars.compile import compile_schema
from surecall.grammars.vocab.core import Vocab
from surecall.grammars.walk import _next_item, decode
from surecall.kernels import DeviceTable, SamplingTensors, advance, apply_token_mask_inplace, sample
from surecall.kernels._triton import HAS_TRITON, INTERPRET
from surecall.kernels.items import (
    MAX_ITEM_DEPTH,
    ItemTable,
    advance_items,
    apply_item_mask_inplace,
    item_row,
)
from surecall.kernels.stack import (
    StackTable,
    advance_stack,
    apply_stack_mask_inplace,
    stack_remaining,
)

needs_interpreter = pytest.mark.skipif(
    not (HAS_TRITON and INTERPRET), reason="needs triton with TRITON_INTERPRET=1 set before import"
)
BACKENDS = ["torch", pytest.param("triton", marks=needs_interpreter)]
SCHEMA = {"type": "object", "properties": {
    "m": {"type": "object"},
    "xs": {"type": "array", "minItems": 2, "maxItems": 60},
    "n": {"type": "integer"}}, "required": ["m", "xs", "n"], "additionalProperties": False}


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SURECALL_CACHE_DIR", str(tmp_path / "cache"))


def _vocab() -> Vocab:
    pieces = [bytes([b]) for b in range(256)]
    pieces += [b'{"m":{', b'"xs":[', b"}]", b"}}", b"]]", b"}]]", b"]}", b"[[", b"[{", b'{"', b'":[', b"}, {",
               b"},", b"],", b"[]", b"{}", b'"}', b"1]", b", [", b'"n":']
    pieces += [b""]
    stop = len(pieces) - 1
    return Vocab(token_bytes=tuple(pieces), special_ids=frozenset({stop}), stop_ids=(stop,),
                 logits_width=len(pieces) + 5, format="test", name="stack-kernels")


@pytest.fixture(scope="module")
def compiled():
    vocab = _vocab()
    table = compile_schema(SCHEMA, vocab, use_cache=False)
    assert table.has_stack and table.has_items and "stack_fallback" not in table.meta
    return vocab, table


def _host_step(table, s, d, b, k, rem):
    """(allowed tokens [W], per token: next state, depth, bits, item counters) by the host rule."""
    toks, nexts = table.transitions(s)
    ok, after, depths, kinds, items_after = host.stack_step(table, s, d, b, toks, nexts, rem, k)
    ok &= host_items.kept(table, s, 0, k, toks, nexts, rem - int(host.stack_need(d)))
    return toks, nexts, ok, after, depths, kinds, items_after


def _rows(table, rng, num: int, bias: float = 0.7):
    """(state, depth, bits, item counters, remaining) met on walks that prefer opening brackets."""
    vocab = _vocab()
    opening = np.asarray([bool(set(p) & set(b"[{")) for p in vocab.token_bytes])
    out = []
    while len(out) < num:
        budget = int(table.dist[0]) + int(rng.integers(0, 30))
        s, d, b, k, used = 0, 0, 0, np.zeros(MAX_ITEM_DEPTH, dtype=np.int64), 0
        while not (table.accept[s] and d == 0) and len(out) < num:
            rem = budget - used
            out.append((s, d, b, tuple(int(x) for x in k), rem))
            toks, nexts, ok, after, depths, kinds, items_after = _host_step(table, s, d, b, k, rem)
            assert ok.any(), (s, d, b, k, rem)  # the budget always leaves a way to finish
            pool = np.flatnonzero(ok & opening[toks])
            if not pool.size or rng.random() > bias:
                pool = np.flatnonzero(ok)
            i = int(rng.choice(pool))
            t = int(toks[i])
            plain = host_items.as_stack(_next_item(table, s, k, t))
            k = host_items.as_stack(items_after[i]) if items_after[i] is not k else plain
            s, d, b = int(after[i]), int(depths[i]), int(kinds[i])
            used += 1
    return out


def _tensors(rows):
    states = torch.tensor([r[0] for r in rows], dtype=torch.int32)
    depth = torch.tensor([r[1] for r in rows], dtype=torch.int32)
    bits = torch.tensor([r[2] for r in rows], dtype=torch.int64)
    items = torch.tensor([list(r[3]) for r in rows], dtype=torch.int32)
    remaining = torch.tensor([r[4] for r in rows], dtype=torch.int32)
    return states, depth, bits, items, remaining


def _masked(table, vocab, rows, backend, base=None):
    states, depth, bits, items, remaining = _tensors(rows)
    dt, it, st = DeviceTable.from_table(table), ItemTable.from_table(table), StackTable.from_table(table)
    logits = torch.randn(len(rows), vocab.logits_width) if base is None else base.clone()
    apply_stack_mask_inplace(logits, dt, st, states, depth, bits, remaining, item_row(it, states, items),
                             backend=backend)
    left = stack_remaining(depth, remaining)
    apply_item_mask_inplace(logits, dt, it, states, items, left, backend=backend)
    from surecall.kernels.items import sample_remaining

    apply_token_mask_inplace(logits, dt, states, remaining=sample_remaining(it, states, left), backend=backend)
    return logits


@pytest.mark.parametrize("backend", BACKENDS)
def test_masks_equal_the_host_rule(compiled, backend):
    vocab, table = compiled
    rows = _rows(table, np.random.default_rng(0), 150)
    assert max(r[1] for r in rows) >= 4  # the rows nest: the stack is deep on some of them
    logits = _masked(table, vocab, rows, backend)
    for row, (s, d, b, k, rem) in enumerate(rows):
        toks, _, ok, *_ = _host_step(table, s, d, b, np.asarray(k), rem)
        expected = np.zeros(vocab.logits_width, dtype=bool)
        expected[toks[ok]] = True
        if table.accept[s] and d == 0:
            expected[table.stop_ids] = True
        assert np.array_equal(torch.isfinite(logits[row]).numpy(), expected), (s, d, b, k, rem)


@needs_interpreter
@pytest.mark.interpreter
def test_stack_mask_triton_equals_torch(compiled):
    vocab, table = compiled
    rows = _rows(table, np.random.default_rng(1), 150)
    states, depth, bits, items, remaining = _tensors(rows)
    states[::9] = -1  # rows without a grammar are left alone
    dt, it, st = DeviceTable.from_table(table), ItemTable.from_table(table), StackTable.from_table(table)
    base = torch.randn(len(rows), vocab.logits_width)
    out = {}
    for backend in ("torch", "triton"):
        logits = base.clone()
        apply_stack_mask_inplace(logits, dt, st, states, depth, bits, remaining, item_row(it, states, items),
                                 backend=backend)
        out[backend] = logits
    assert torch.equal(out["torch"], out["triton"])
    assert torch.equal(out["torch"][::9], base[::9])
    assert not torch.isfinite(out["torch"]).all()


def test_advance_stack_equals_the_host_outcome(compiled):
    vocab, table = compiled
    rng = np.random.default_rng(2)
    rows = _rows(table, rng, 200)
    states, depth, bits, items, remaining = _tensors(rows)
    tokens = []
    for s, d, b, k, rem in rows:
        toks, _, ok, *_ = _host_step(table, s, d, b, np.asarray(k), rem)
        tokens.append(int(rng.choice(toks[ok])))
    tok = torch.tensor(tokens, dtype=torch.int32)
    it, st = ItemTable.from_table(table), StackTable.from_table(table)
    plain = advance_items(it, states, tok, items)
    over, d_after, b_after, k_after = advance_stack(st, states, tok, depth, bits, it, plain)
    moved = 0
    for i, ((s, d, b, k, _), t) in enumerate(zip(rows, tokens, strict=True)):
        kk = np.asarray(k)
        got = host.outcome(table, s, t, d, b, kk)
        nxt = table.next_state(s, t) if got[0] < 0 else got[0]
        k_want = host_items.as_stack(got[3] if got[3] is not kk else _next_item(table, s, kk, t))
        assert (int(over[i]) if int(over[i]) != -1 else table.next_state(s, t)) == nxt
        assert (int(d_after[i]), int(b_after[i])) == (got[1], got[2])
        assert k_after[i].tolist() == k_want.tolist(), (s, d, t)
        moved += got[1] != d
    assert moved > 20


def test_decoding_random_logits_always_completes_inside_the_budget(compiled):
    """Mask, stack mask, item mask, sample and advance on logits biased towards opening brackets:
    every row nests, then closes all it opened by max_tokens with a document the schema accepts."""
    vocab, table = compiled
    dt, it, st = DeviceTable.from_table(table), ItemTable.from_table(table), StackTable.from_table(table)
    opening = torch.tensor([bool(set(p) & set(b"[{")) for p in vocab.token_bytes] + [False] * 5)
    n = 12
    budgets = [int(table.dist[0]) + 3 * i for i in range(n)]
    states = torch.zeros(n, dtype=torch.int32)
    depth = torch.zeros(n, dtype=torch.int32)
    bits = torch.zeros(n, dtype=torch.int64)
    items = torch.zeros(n, MAX_ITEM_DEPTH, dtype=torch.int32)
    out = [[] for _ in range(n)]
    done = [False] * n
    deepest = 0
    gen = torch.Generator().manual_seed(0)
    for step in range(max(budgets)):
        live = torch.tensor([not x for x in done])
        if not live.any():
            break
        rows = torch.where(live, states, -1)
        remaining = torch.tensor([max(b - step, 1) for b in budgets], dtype=torch.int32)
        logits = torch.randn(n, vocab.logits_width, generator=gen) + 3.0 * opening
        apply_stack_mask_inplace(logits, dt, st, rows, depth, bits, remaining, item_row(it, rows, items))
        left = stack_remaining(depth, remaining)
        apply_item_mask_inplace(logits, dt, it, rows, items, left)
        from surecall.kernels.items import sample_remaining

        params = SamplingTensors(torch.ones(n), torch.zeros(n, dtype=torch.int32), torch.ones(n),
                                 torch.arange(n, dtype=torch.int64), torch.full((n,), step, dtype=torch.int64))
        drawn = sample(logits, dt, rows, params, remaining=sample_remaining(it, rows, left))
        tok = drawn.tokens
        moved = advance(rows, tok.clamp_min(0), dt, check=False)
        plain_items = advance_items(it, rows, tok, items)
        over, depth, bits, items = advance_stack(st, rows, tok, depth, bits, it, plain_items)
        nxt = torch.where(over != -1, over, moved[0])
        deepest = max(deepest, int(depth.max()))
        for i in range(n):
            if done[i]:
                continue
            t = int(tok[i])
            assert t >= 0 and int(nxt[i]) >= 0, (i, step)
            if t in table.stop_ids:
                done[i] = True
                continue
            out[i].append(t)
            states[i] = nxt[i]
            if step + 1 >= budgets[i]:
                assert table.accept[int(states[i])] and int(depth[i]) == 0, (i, budgets[i])
                done[i] = True
    assert all(done)
    for i in range(n):
        assert len(out[i]) <= budgets[i]
        jsonschema.validate(json.loads(decode(vocab, out[i])), SCHEMA)
    assert deepest >= 4


def test_bad_inputs_are_refused(compiled):
    vocab, table = compiled
    dt, st = DeviceTable.from_table(table), StackTable.from_table(table)
    logits = torch.zeros(2, vocab.logits_width)
    ok = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(KernelInputError, match="Invalid bits"):
        apply_stack_mask_inplace(logits, dt, st, ok, ok, ok, ok + 5)
    with pytest.raises(KernelInputError, match="Invalid item_row"):
        apply_stack_mask_inplace(logits, dt, st, ok, ok, ok.long(), ok + 5, ok)
    plain = compile_schema({"type": "object", "properties": {"b": {"type": "boolean"}}}, vocab, use_cache=False)
    with pytest.raises(KernelInputError, match="bracket stack"):
        StackTable.from_table(plain)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_stack_mask_on_cuda_equals_torch(compiled):
    vocab, table = compiled
    rows = _rows(table, np.random.default_rng(3), 300)
    cpu = _tensors(rows)
    dev = torch.device("cuda")
    it_cpu = ItemTable.from_table(table)
    base = torch.randn(len(rows), vocab.logits_width)
    want = base.clone()
    apply_stack_mask_inplace(want, DeviceTable.from_table(table), StackTable.from_table(table), *cpu[:3], cpu[4],
                             item_row(it_cpu, cpu[0], cpu[3]), backend="torch")
    got = base.to(dev)
    g = [t.to(dev) for t in cpu]
    it = ItemTable.from_table(table, dev)
    apply_stack_mask_inplace(got, DeviceTable.from_table(table, dev), StackTable.from_table(table, dev), *g[:3], g[4],
                             item_row(it, g[0], g[3]), backend="triton")
    assert torch.equal(got.cpu(), want)
