"""advance and DeviceTable: Triton (interpreter) == torch == a plain-Python walk of the TokenTable; errors."""

from __future__ import annotations

import os

os.environ.setdefault(
    "TRITON_INTERPRET", "1"
)  # before anything imports triton (make test sets it too)

import numpy as np
import pytest
import torch
from helpers.kernels_synth import random_states, random_table

from surecall.errors import KernelInputError
from surecall.grammars.table import TokenTable
from surecall.kernels import DEAD_STATE, DeviceTable, advance
from surecall.kernels._triton import HAS_TRITON, INTERPRET
from surecall.kernels.table import NO_NEXT

needs_interpreter = pytest.mark.skipif(
    not (HAS_TRITON and INTERPRET), reason="needs triton with TRITON_INTERPRET=1 set before import"
)
BACKENDS = ["torch", pytest.param("triton", marks=needs_interpreter)]


def _expected(table: TokenTable, state: int, token: int) -> tuple[int, bool]:
    stops = set(table.stop_ids.tolist())
    if state < 0:
        return state, token < 0 or token in stops
    nxt = table.next_state(state, token) if token >= 0 else None
    if nxt is not None:
        return nxt, False
    if token in set(table.allowed(state).tolist()) and table.accept[state]:
        return state, True
    return DEAD_STATE, True


def _tokens(rng, table, states, p_valid=0.85):
    out = []
    for s in states.tolist():
        if s >= 0 and rng.random() < p_valid:
            out.append(int(rng.choice(table.allowed(s))))
        else:
            out.append(int(rng.integers(-1, table.logits_width)))
    return torch.tensor(out, dtype=torch.int64)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("batch,vocab,width", [(1, 50, 64), (33, 1000, 1000), (300, 5000, 5024)])
def test_advance_matches_the_table(backend, batch, vocab, width):
    rng = np.random.default_rng(batch)
    table = random_table(rng, num_states=15, vocab_size=vocab, logits_width=width)
    dt = DeviceTable.from_table(table)
    states = torch.from_numpy(random_states(rng, batch, 15))
    tokens = _tokens(rng, table, states)
    nxt, finished = advance(states, tokens, dt, check=False, backend=backend)
    assert nxt.dtype == torch.int32 and finished.dtype == torch.bool
    got = list(zip(nxt.tolist(), finished.tolist()))
    assert got == [_expected(table, s, t) for s, t in zip(states.tolist(), tokens.tolist())]


@needs_interpreter
@pytest.mark.interpreter
def test_triton_equals_torch_on_concatenated_tables():
    rng = np.random.default_rng(3)
    tables = [random_table(rng, num_states=8, vocab_size=700, logits_width=704) for _ in range(3)]
    table, offsets = TokenTable.concat(tables)
    dt = DeviceTable.from_table(table)
    states = torch.from_numpy(random_states(rng, 120, table.num_states))
    tokens = _tokens(rng, table, states)
    a = advance(states, tokens, dt, check=False, backend="triton")
    b = advance(states, tokens, dt, check=False, backend="torch")
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert offsets.tolist() == [0, 8, 16]


def test_stop_in_accepting_state_finishes_and_keeps_state():
    rng = np.random.default_rng(5)
    table = random_table(rng, num_states=10, vocab_size=200)
    dt = DeviceTable.from_table(table)
    acc = int(np.flatnonzero(table.accept)[0])
    non_acc = np.flatnonzero(~table.accept)
    states = torch.tensor([acc, int(non_acc[0])], dtype=torch.int32)
    stop = int(table.stop_ids[0])
    nxt, finished = advance(states[:1], torch.tensor([stop]), dt)
    assert nxt.tolist() == [acc] and finished.tolist() == [True]
    with pytest.raises(
        KernelInputError, match=f"row 0: token {stop} is not allowed in state {int(non_acc[0])}"
    ):
        advance(states[1:], torch.tensor([stop]), dt)


def test_device_table_derived_facts():
    rng = np.random.default_rng(6)
    table = random_table(rng, num_states=9, vocab_size=300, logits_width=330)
    dt = DeviceTable.from_table(table)
    for s in range(table.num_states):
        toks, nexts = table.transitions(s)
        next_dist = table.dist[nexts]
        assert int(dt.max_next_dist[s]) == (int(next_dist.max()) if toks.size else -1)
        assert int(dt.min_next_dist[s]) == (int(next_dist.min()) if toks.size else NO_NEXT)
        assert bool(dt.has_stop[s]) == bool(table.accept[s])
        lo, hi = table.exc_span(s)
        assert (2**dt.num_search_steps) > hi - lo
    assert dt.is_stop.nonzero().flatten().tolist() == table.stop_ids.tolist()
    assert dt.num_words == 11 and dt.nbytes > 0


def test_errors():
    rng = np.random.default_rng(7)
    table = random_table(rng, num_states=5, vocab_size=100)
    dt = DeviceTable.from_table(table)
    states = torch.zeros(3, dtype=torch.int32)
    tokens = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(KernelInputError, match="tokens: expected dtype torch.int64"):
        advance(states, tokens.int(), dt)
    with pytest.raises(KernelInputError, match=r"tokens: expected shape \[3\]"):
        advance(states, tokens[:2], dt)
    with pytest.raises(KernelInputError, match="states: expected a 1-D int32 tensor"):
        advance(states[None], tokens, dt)
    with pytest.raises(KernelInputError, match="states: row 2 has state 5, out of range"):
        advance(torch.tensor([0, 0, 5], dtype=torch.int32), tokens, dt)
    with pytest.raises(KernelInputError, match="is not allowed in state"):
        bad = next(
            t for t in range(100) if table.next_state(0, t) is None and t not in table.allowed(0)
        )
        advance(states, torch.tensor([bad, bad, bad]), dt)
    broken = TokenTable(**{**table.__dict__, "dist": table.dist[:-1]})
    with pytest.raises(
        KernelInputError, match="Invalid TokenTable for DeviceTable.from_table: dist shape"
    ):
        DeviceTable.from_table(broken)
    beyond = TokenTable(**{**table.__dict__, "mask_row": np.full(table.num_states, table.num_mask_rows, np.int32)})
    with pytest.raises(KernelInputError, match="mask_row outside the .* mask rows"):
        DeviceTable.from_table(beyond)
    short = TokenTable(**{**table.__dict__, "exc_tok": table.exc_tok[:-1]})
    with pytest.raises(KernelInputError, match="exc_ptr\\[-1\\], exc_tok and exc_slot disagree"):
        DeviceTable.from_table(short)
    far = TokenTable(**{**table.__dict__, "exc_slot": table.exc_slot.astype(np.int32) + 1000})
    with pytest.raises(KernelInputError, match="an exception slot points past its state's targets"):
        DeviceTable.from_table(far)
