"""apply_token_mask_inplace: Triton (interpreter) == torch reference == xgrammar, budget rule, errors."""

from __future__ import annotations

import os

os.environ.setdefault(
    "TRITON_INTERPRET", "1"
)  # before anything imports triton (make test sets it too)

import numpy as np
import pytest
import torch
from helpers.kernels_synth import deep_table, random_states, random_table

from surecall.errors import KernelInputError
from surecall.kernels import DeviceTable, apply_token_mask_inplace
from surecall.kernels._triton import HAS_TRITON, INTERPRET

needs_interpreter = pytest.mark.skipif(
    not (HAS_TRITON and INTERPRET), reason="needs triton with TRITON_INTERPRET=1 set before import"
)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _case(seed, batch, vocab, width, logits_width=None, num_states=12):
    rng = np.random.default_rng(seed)
    table = random_table(rng, num_states=num_states, vocab_size=vocab, logits_width=logits_width)
    states = torch.from_numpy(random_states(rng, batch, num_states))
    logits = torch.from_numpy(rng.normal(size=(batch, width)).astype(np.float32))
    return rng, table, DeviceTable.from_table(table), states, logits


def _both(logits, dt, states, **kw):
    a, b = logits.clone(), logits.clone()
    apply_token_mask_inplace(a, dt, states, backend="triton", **kw)
    apply_token_mask_inplace(b, dt, states, backend="torch", **kw)
    return a, b


@needs_interpreter
@pytest.mark.interpreter
@pytest.mark.parametrize(
    "batch,vocab,logits_width,width",
    [
        (1, 100, None, 100),
        (5, 1000, 1024, 1024),
        (37, 5000, 5008, 5100),
        (300, 64, 96, 96),
        (8, 333, 352, 333),
    ],
)
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_equals_torch(batch, vocab, logits_width, width, dtype):
    _, _, dt, states, logits = _case(batch * 7 + vocab, batch, vocab, width, logits_width)
    a, b = _both(logits.to(dtype), dt, states)
    assert torch.equal(a, b)
    assert torch.isinf(a).any() and torch.isfinite(a).any()


@needs_interpreter
@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", DTYPES)
def test_row_subset_and_free_rows_untouched(dtype):
    rng, _, dt, states, logits = _case(3, 40, 700, 704, 704)
    logits = logits.to(dtype)
    rows = torch.from_numpy(rng.choice(40, size=15, replace=False)).long()
    a, b = _both(logits, dt, states, rows=rows)
    assert torch.equal(a, b)
    untouched = torch.ones(40, dtype=torch.bool)
    untouched[rows[states[rows] >= 0]] = False
    assert torch.equal(a[untouched], logits[untouched])
    assert not torch.equal(a[~untouched], logits[~untouched])


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_interpreter)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_equals_xgrammar(backend, dtype):
    xgr = pytest.importorskip("xgrammar")
    rng, _, dt, states, logits = _case(11, 24, 900, 928, 928)
    states = states.clamp(min=0)
    logits = logits.to(dtype)
    rows = torch.from_numpy(np.sort(rng.choice(24, size=10, replace=False))).long()
    for subset in (None, rows):
        ours, theirs = logits.clone(), logits.clone()
        apply_token_mask_inplace(ours, dt, states, rows=subset, backend=backend)
        indices = None if subset is None else subset.tolist()
        xgr.apply_token_bitmask_inplace(
            theirs, dt.mask_rows(states).contiguous(), indices=indices
        )
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_interpreter)])
def test_columns_past_the_table_are_masked(backend):
    _, table, dt, states, logits = _case(
        5, 6, 100, 160, 100
    )  # table covers 128 bits, logits 160 columns
    states = states.clamp(min=0)
    apply_token_mask_inplace(logits, dt, states, backend=backend)
    assert torch.isneginf(logits[:, 128:]).all()
    for b, s in enumerate(states.tolist()):
        assert (
            torch.nonzero(torch.isfinite(logits[b])).flatten().tolist() == table.allowed(s).tolist()
        )


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_interpreter)])
def test_budget_keeps_only_tokens_that_can_finish(backend):
    rng = np.random.default_rng(21)
    table = deep_table(rng, vocab_size=300, logits_width=320)
    dt = DeviceTable.from_table(table)
    batch = 60
    states = torch.from_numpy(rng.integers(0, table.num_states, size=batch).astype(np.int32))
    remaining = (
        dt.dist[states.long()].clamp(min=1) + torch.from_numpy(rng.integers(0, 3, size=batch))
    ).to(torch.int32)
    logits = torch.zeros(batch, 320)
    apply_token_mask_inplace(logits, dt, states, remaining=remaining, backend=backend)
    stops = set(table.stop_ids.tolist())
    num_dropped = 0
    for b in range(batch):
        s, r = int(states[b]), int(remaining[b])
        for tok in table.allowed(s).tolist():
            nxt = table.next_state(s, tok)
            fits = (tok in stops and bool(table.accept[s]) and r >= 1) or (
                nxt is not None and table.dist[nxt] <= r - 1
            )
            assert bool(torch.isfinite(logits[b, tok])) == fits, (b, s, r, tok)
            num_dropped += not fits
        assert torch.isfinite(logits[b]).any()
    assert num_dropped > 0  # the case exercises the budget


@needs_interpreter
@pytest.mark.interpreter
def test_budget_triton_equals_torch():
    rng = np.random.default_rng(8)
    table = deep_table(rng, vocab_size=2000, logits_width=2048)
    dt = DeviceTable.from_table(table)
    states = torch.from_numpy(random_states(rng, 50, table.num_states))
    remaining = (
        dt.dist[states.clamp(min=0).long()].clamp(min=1)
        + torch.from_numpy(rng.integers(0, 4, size=50))
    ).to(torch.int32)
    logits = torch.from_numpy(rng.normal(size=(50, 2048)).astype(np.float32)).to(torch.bfloat16)
    a, b = _both(logits, dt, states, remaining=remaining)
    assert torch.equal(a, b)


def test_errors():
    _, _, dt, states, logits = _case(2, 4, 100, 100)
    good = states.clamp(min=0)
    with pytest.raises(KernelInputError, match="logits: expected a 2-D tensor"):
        apply_token_mask_inplace(logits[0], dt, good)
    with pytest.raises(KernelInputError, match="logits: expected dtype"):
        apply_token_mask_inplace(logits.double(), dt, good)
    with pytest.raises(KernelInputError, match=r"states: expected shape \[4\]"):
        apply_token_mask_inplace(logits, dt, good[:3])
    with pytest.raises(KernelInputError, match="states: expected dtype torch.int32"):
        apply_token_mask_inplace(logits, dt, good.long())
    with pytest.raises(KernelInputError, match="states: row 1 has state 99, out of range"):
        apply_token_mask_inplace(logits, dt, torch.tensor([0, 99, 0, 0], dtype=torch.int32))
    with pytest.raises(KernelInputError, match="width 50 is smaller than the table's vocabulary"):
        apply_token_mask_inplace(logits[:, :50].contiguous(), dt, good)
    with pytest.raises(KernelInputError, match=r"rows: expected batch row indices in \[0, 4\)"):
        apply_token_mask_inplace(logits, dt, good, rows=torch.tensor([0, 7]))
    with pytest.raises(KernelInputError, match="table: expected a DeviceTable"):
        apply_token_mask_inplace(logits, "table", good)
    with pytest.raises(KernelInputError, match="states: expected device cpu .*got meta"):
        apply_token_mask_inplace(logits, dt, good.to("meta"))
    with pytest.raises(KernelInputError, match="Invalid backend"):
        apply_token_mask_inplace(logits, dt, good, backend="cuda")


def test_empty_row_after_budget_raises():
    rng = np.random.default_rng(4)
    table = deep_table(rng)
    dt = DeviceTable.from_table(table)
    far = int(np.argmax(table.dist))
    states = torch.tensor([far], dtype=torch.int32)
    logits = torch.zeros(1, table.logits_width)
    too_tight = torch.tensor([int(table.dist[far]) - 1], dtype=torch.int32)
    with pytest.raises(
        KernelInputError, match=r"row 0: state \d+ with remaining=\d+ allows no token"
    ):
        apply_token_mask_inplace(logits, dt, states, remaining=too_tight)
    apply_token_mask_inplace(logits, dt, states, remaining=too_tight + 1)  # just enough: fine
    assert torch.isfinite(logits).any()


@needs_interpreter
@pytest.mark.interpreter
@pytest.mark.parametrize("store_mode", [0, 1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_store_mode_equals_torch(store_mode, dtype):
    from surecall.kernels.mask import _launch

    rng, _, dt, states, logits = _case(41, 12, 1500, 1600, 1536)
    logits = logits.to(dtype)
    rows = torch.from_numpy(rng.choice(12, size=6, replace=False)).long()
    remaining = (dt.dist[states.clamp(min=0).long()].clamp(min=1) + 1).to(torch.int32)
    for subset, budget in ((None, None), (rows, remaining)):
        a, b = logits.clone(), logits.clone()
        _launch(a, dt, states, subset, budget, block_words=16, store_mode=store_mode)
        apply_token_mask_inplace(b, dt, states, rows=subset, remaining=budget, backend="torch")
        assert torch.equal(a, b)
