"""Mask blocks in the kernels: a row of several distinct, shared blocks reads the same in every kernel.

Each table is also re-split into smaller blocks (the kernels read the block width from the
table): mask, sample, advance and the item mask must give the same results as with the
default block width, Triton (interpreter) and torch reference alike.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

import numpy as np
import pytest
import torch
from helpers.kernels_synth import blocky_table, random_states, reblock

from surecall.grammars.table import MASK_BLOCK_WORDS
from surecall.kernels import DeviceTable, apply_token_mask_inplace
from surecall.kernels._triton import HAS_TRITON, INTERPRET
from surecall.kernels.advance import advance
from surecall.kernels.sample import SamplingTensors, sample

needs_interpreter = pytest.mark.skipif(
    not (HAS_TRITON and INTERPRET), reason="needs triton with TRITON_INTERPRET=1 set before import"
)
WIDTHS = [1, 2, 4, MASK_BLOCK_WORDS]


@pytest.fixture(scope="module")
def table():
    t = blocky_table(np.random.default_rng(0))
    small = reblock(t, 2)
    used = small.mask_row_blocks[small.mask_row]
    per_row = [np.unique(r[r > 0]).size for r in used]
    shared = np.bincount(small.mask_row_blocks.reshape(-1), minlength=small.mask_blocks.shape[0])[1:]
    assert min(per_row) >= 2 and shared.max() >= 2, "rows of several blocks, some shared: not vacuous"
    return t


def _inputs(table, seed, batch=48):
    rng = np.random.default_rng(seed)
    states = torch.from_numpy(random_states(rng, batch, table.num_states))
    remaining = torch.from_numpy(rng.integers(1, 4, size=batch).astype(np.int32))
    logits = torch.from_numpy(rng.normal(size=(batch, table.logits_width + 5)).astype(np.float32))
    return rng, states, remaining, logits


def _mask(table, backend, states, remaining, logits):
    out = logits.clone()
    apply_token_mask_inplace(out, DeviceTable.from_table(table), states, remaining=remaining, backend=backend)
    return out


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=[needs_interpreter, pytest.mark.interpreter])])
@pytest.mark.parametrize("block_words", WIDTHS)
def test_mask_is_the_same_at_every_block_width(table, backend, block_words):
    _, states, remaining, logits = _inputs(table, 1)
    expected = _mask(table, "torch", states, remaining, logits)
    got = _mask(reblock(table, block_words), backend, states, remaining, logits)
    assert torch.equal(got, expected)
    assert torch.isinf(got).any() and torch.isfinite(got[states >= 0]).any()


@pytest.mark.parametrize("block_words", WIDTHS)
def test_mask_rows_gathers_the_dense_rows(table, block_words):
    dt = DeviceTable.from_table(reblock(table, block_words))
    states = torch.arange(table.num_states, dtype=torch.int32)
    dense = table.mask_dense(table.mask_row)
    assert torch.equal(dt.mask_rows(states), torch.from_numpy(dense))
    assert dt.mask_rows(states[:0]).shape == (0, table.num_words)  # a step with no grammar rows
    assert table.mask_dense(np.zeros(0, np.int64)).shape == (0, table.num_words)
    words = torch.arange(table.num_words).repeat(table.num_states)
    st = states.repeat_interleave(table.num_words)
    assert torch.equal(dt.mask_word(st, words), torch.from_numpy(dense.reshape(-1).view(np.uint32).astype(np.int64)))


@needs_interpreter
@pytest.mark.interpreter
@pytest.mark.parametrize("block_words", [2, MASK_BLOCK_WORDS])
@pytest.mark.parametrize("temperature", [0.0, 1.1])
def test_sample_is_the_same_at_every_block_width(table, block_words, temperature):
    _, states, remaining, logits = _inputs(table, 2, batch=24)
    n = states.shape[0]
    params = SamplingTensors.build([temperature] * n, [0] * n, [1.0] * n, list(range(n)), [3] * n)
    expected = sample(logits, DeviceTable.from_table(table), states, params, remaining=remaining, backend="torch")
    dt = DeviceTable.from_table(reblock(table, block_words))
    for backend in ("torch", "triton"):
        got = sample(logits, dt, states, params, remaining=remaining, backend=backend)
        assert torch.equal(got.tokens, expected.tokens)
        assert torch.allclose(got.logprobs, expected.logprobs, atol=1e-5)


@pytest.mark.parametrize("block_words", [1, 2, MASK_BLOCK_WORDS])
def test_advance_is_the_same_at_every_block_width(table, block_words):
    rng, states, _, _ = _inputs(table, 3, batch=200)
    tokens = torch.from_numpy(rng.integers(-1, table.logits_width + 2, size=states.shape[0]))
    allowed = [int(rng.choice(table.allowed(s))) if s >= 0 else -1 for s in states.tolist()]
    tokens[::2] = torch.tensor(allowed[::2])  # half of them allowed: real moves, not only dead rows
    moves = {i: table.next_state(s, t) for i, (s, t) in enumerate(zip(states.tolist(), tokens.tolist(), strict=True))
             if s >= 0 and table.next_state(s, t) is not None}
    assert len(moves) > 20
    dt = DeviceTable.from_table(reblock(table, block_words))
    backends = ["torch"] + (["triton"] if HAS_TRITON and INTERPRET else [])
    for backend in backends:
        nxt, finished = advance(states, tokens, dt, check=False, backend=backend)
        assert all(int(nxt[i]) == e for i, e in moves.items()), backend
        ref = advance(states, tokens, DeviceTable.from_table(table), check=False, backend=backend)
        assert torch.equal(nxt, ref[0]) and torch.equal(finished, ref[1]), backend
    few = states[:8]  # the host path of a few CPU rows
    assert torch.equal(advance(few, tokens[:8], dt, check=False, backend="torch")[0],
                       advance(few, tokens[:8], DeviceTable.from_table(table), check=False, backend="torch")[0])


@pytest.mark.parametrize("block_words", [2])
def test_item_mask_is_the_same_at_every_block_width(block_words):
    from test_kernels_items import SCHEMA, _rows, _tensors, _vocab

    from surecall.grammars.compile import compile_schema
    from surecall.kernels.items import ItemTable, apply_item_mask_inplace

    vocab = _vocab()
    table = compile_schema(SCHEMA, vocab, use_cache=False)
    small = reblock(table, block_words)
    assert small.mask_row_blocks.shape[1] >= 4
    rows = _rows(table, np.random.default_rng(5), 80)
    states, counters, items, remaining = _tensors(rows)
    base = torch.randn(len(rows), vocab.logits_width)
    out = []
    backends = ["torch"] + (["triton"] if HAS_TRITON and INTERPRET else [])
    for t, backend in [(table, "torch")] + [(small, b) for b in backends]:
        logits = base.clone()
        apply_item_mask_inplace(logits, DeviceTable.from_table(t), ItemTable.from_table(t), states, items,
                                remaining, counters=counters, backend=backend)
        out.append(logits)
    assert all(torch.equal(o, out[0]) for o in out[1:])
    assert not torch.isfinite(out[0]).all()
