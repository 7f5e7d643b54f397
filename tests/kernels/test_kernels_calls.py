"""Called pieces in the kernels: their frames are the bracket stack's levels, so the stack kernels
(kernels/stack.py) run them unchanged. Triton (interpreter) == torch on rows met along host walks, and the device's advance equals the host outcome (grammars/stack.outcome) that the host walks, cut by
max_tokens, complete with (tests/grammars/test_called_pieces.py)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton


import numpy as np
import pytest
import torch
from helpers.calls_grammar import call_schema, small_vocab

from surecall.grammars.compile import compile_schema
from surecall.grammars.options import GrammarOptions
from surecall.grammars.walk import random_walk
from surecall.kernels import DeviceTable
from surecall.kernels._triton import HAS_TRITON, INTERPRET
from surecall.kernels.items import (
    MAX_ITEM_DEPTH,
    ItemTable,
    advance_items,
    item_row,
)
from surecall.kernels.stack import (
    StackTable,
    advance_stack,
    apply_stack_mask_inplace,
)


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SURECALL_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module", params=["calls", "calls beside a free-form value"])
def compiled(request):
    vocab, schema = small_vocab(), call_schema()
    if request.param != "calls":  # its brackets on the same stack, outside the bodies
        schema["properties"]["free"] = {"type": "object"}
        schema["required"] = ["free", "a", "d"]
    table = compile_schema(schema, vocab, GrammarOptions(call_pieces="always"), use_cache=False)
    assert table.meta["calls"]["places"] >= 3 and table.has_items
    return vocab, table


def _rows(vocab, table, seed=3):
    """(state, depth, bits, remaining, token) along host walks, replayed with the host outcome."""
    from surecall.grammars import stack as host

    rng = np.random.default_rng(seed)
    rows = []
    for budget in (None, 40, 80, 160):
        ids = random_walk(table, vocab, rng, max_tokens=budget)
        s, d, b = 0, 0, 0
        for i, t in enumerate(ids):
            rows.append((s, d, b, (budget or 10_000) - i, t))
            got = host.outcome(table, s, t, d, b, np.zeros(MAX_ITEM_DEPTH, dtype=np.int64))
            s, d, b = (table.next_state(s, t), d, b) if got[0] < 0 else got[:3]
    assert any(r[1] > 0 for r in rows)
    return rows


def test_advance_stack_equals_the_host_outcome(compiled):
    from surecall.grammars import stack as host

    vocab, table = compiled
    rows = _rows(vocab, table)
    it, st = ItemTable.from_table(table), StackTable.from_table(table)
    states = torch.tensor([r[0] for r in rows], dtype=torch.int32)
    depth = torch.tensor([r[1] for r in rows], dtype=torch.int32)
    bits = torch.tensor([r[2] for r in rows], dtype=torch.int64)
    tok = torch.tensor([r[4] for r in rows], dtype=torch.int32)
    items = torch.zeros(len(rows), MAX_ITEM_DEPTH, dtype=torch.int32)
    plain = advance_items(it, states, tok, items)
    over, d_after, b_after, _ = advance_stack(st, states, tok, depth, bits, it, plain)
    popped = 0
    for i, (s, d, b, _, t) in enumerate(rows):
        got = host.outcome(table, s, t, d, b, np.zeros(MAX_ITEM_DEPTH, dtype=np.int64))
        want = table.next_state(s, t) if got[0] < 0 else got[0]
        assert (int(over[i]) if int(over[i]) != -1 else table.next_state(s, t)) == want
        assert (int(d_after[i]), int(b_after[i])) == (got[1], got[2])
        popped += got[1] < d
    assert popped >= 4  # bodies ended on the device as on the host


@pytest.mark.interpreter
@pytest.mark.skipif(not (HAS_TRITON and INTERPRET), reason="needs triton with TRITON_INTERPRET=1 set before import")
def test_stack_mask_triton_equals_torch_on_call_frames(compiled):
    vocab, table = compiled
    dt, it, st = DeviceTable.from_table(table), ItemTable.from_table(table), StackTable.from_table(table)
    rows = _rows(vocab, table)
    states = torch.tensor([r[0] for r in rows], dtype=torch.int32)
    depth = torch.tensor([r[1] for r in rows], dtype=torch.int32)
    bits = torch.tensor([r[2] for r in rows], dtype=torch.int64)
    remaining = torch.tensor([r[3] for r in rows], dtype=torch.int32)
    items = torch.zeros(len(rows), MAX_ITEM_DEPTH, dtype=torch.int32)
    base = torch.randn(len(rows), vocab.logits_width)
    got = {}
    for backend in ("torch", "triton"):
        logits = base.clone()
        apply_stack_mask_inplace(logits, dt, st, states, depth, bits, remaining, item_row(it, states, items),
                                 backend=backend)
        got[backend] = logits
    assert torch.equal(got["torch"], got["triton"])
    assert not torch.isfinite(got["torch"]).all()
