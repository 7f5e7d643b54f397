"""Advance each row's grammar state by its sampled token (CSR lookup on the device).

A token found in the state's CSR row moves the row to its target state. A stop id in an
accepting state (its mask bit is set there and it is not in the CSR) finishes the row and keeps
its state. Anything else is not allowed by the grammar: the row goes to DEAD_STATE and is
finished (check=True raises instead). Rows with state < 0 (no grammar) keep their state and
finish on a table stop id or a token < 0 (a row whose sampler found nothing). It does not mask
or sample; one lane per row, a fixed-step binary search, no host sync when check=False.
"""

from __future__ import annotations

import torch

from surecall.errors import KernelInputError
from surecall.kernels import checks
from surecall.kernels._triton import launch_options, resolve_backend, tl, triton
from surecall.kernels.budget import csr_find_torch
from surecall.kernels.table import DeviceTable

DEAD_STATE = -2  # a row that took a token its grammar does not allow (only when check=False)


@triton.jit
def _advance_kernel(
    states_ptr,  # int32 [B] current state per row (< 0: no grammar)
    tokens_ptr,  # int64 [B] sampled token per row
    next_ptr,  # int32 [B] out: next state
    finished_ptr,  # int8 [B] out: 1 when the row is done (stop id, invalid token)
    batch,  # B
    mask_ptr,  # int32 [S, W] packed allowed-token bits
    num_words,  # W
    accept_ptr,  # int8 [S] accepting states
    is_stop_ptr,  # int8 [32 * W] 1 for the table's stop ids
    trans_ptr_ptr,  # int32 [S + 1] CSR row pointers
    trans_tok_ptr,  # int32 [nnz] sorted transition tokens
    trans_next_ptr,  # int32 [nnz] transition targets
    num_search_steps,  # binary-search iterations over the longest CSR row
    BLOCK: tl.constexpr,  # rows per program, one lane each
):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = rows < batch
    state = tl.load(states_ptr + rows, mask=ok, other=-1)
    token = tl.load(tokens_ptr + rows, mask=ok, other=-1).to(tl.int32)
    has_grammar = ok & (state >= 0)
    st = tl.where(has_grammar, state, 0)
    lo = tl.load(trans_ptr_ptr + st, mask=has_grammar, other=0)
    end = tl.load(trans_ptr_ptr + st + 1, mask=has_grammar, other=0)
    hi = end
    for _ in range(num_search_steps):
        active = lo < hi
        mid = lo + (hi - lo) // 2
        go_right = tl.load(trans_tok_ptr + mid, mask=active, other=0) < token
        lo = tl.where(active & go_right, mid + 1, lo)
        hi = tl.where(active & (go_right == 0), mid, hi)
    in_row = lo < end
    found = in_row & (tl.load(trans_tok_ptr + lo, mask=in_row, other=-1) == token)
    target = tl.load(trans_next_ptr + lo, mask=found, other=0)
    tok_ok = (token >= 0) & (token < 32 * num_words)
    tok = tl.where(tok_ok, token, 0)
    word = tl.load(
        mask_ptr + st.to(tl.int64) * num_words + tok // 32, mask=has_grammar & tok_ok, other=0
    )
    is_accepting = tl.load(accept_ptr + st, mask=has_grammar, other=0) != 0
    stops_here = (((word >> (tok % 32)) & 1) != 0) & is_accepting
    is_stop = tl.load(is_stop_ptr + tok, mask=ok & tok_ok, other=0) != 0
    nxt = tl.where(found, target, tl.where(stops_here, state, -2))
    nxt = tl.where(has_grammar, nxt, state)
    fin = tl.where(has_grammar, found == 0, (token < 0) | is_stop)
    tl.store(next_ptr + rows, nxt, mask=ok)
    tl.store(finished_ptr + rows, fin.to(tl.int8), mask=ok)


def advance(
    states: torch.Tensor,  # [B] int32
    tokens: torch.Tensor,  # [B] int64
    table: DeviceTable,
    check: bool = True,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(next_states int32 [B], finished bool [B]); no host sync when check=False."""
    if check:
        _check_inputs(states, tokens, table)
    if resolve_backend(backend, states.device) == "torch":
        return advance_torch(states, tokens, table)
    batch = states.shape[0]
    nxt = torch.empty_like(states)
    finished = torch.empty(batch, dtype=torch.int8, device=states.device)
    if batch:
        block = 128
        _advance_kernel[(triton.cdiv(batch, block),)](
            states, tokens, nxt, finished, batch,
            table.mask, table.num_words, table.accept_i8, table.is_stop,
            table.trans_ptr, table.trans_tok, table.trans_next, table.num_search_steps,
            BLOCK=block, num_warps=4, **launch_options(states.device),
        )  # fmt: skip
    return nxt, finished.view(torch.bool)


def advance_torch(
    states: torch.Tensor, tokens: torch.Tensor, table: DeviceTable
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of `advance`."""
    has_grammar = states >= 0
    st = torch.where(has_grammar, states, torch.zeros_like(states)).long()
    tok = tokens.long()
    found, slot = csr_find_torch(table, st, tok)
    found &= has_grammar
    target = table.trans_next[slot.clamp(max=table.trans_next.numel() - 1)].long()
    tok_ok = (tok >= 0) & (tok < 32 * table.num_words)
    safe = torch.where(tok_ok, tok, torch.zeros_like(tok))
    word = table.mask[st, safe // 32].long() & 0xFFFFFFFF
    stops_here = tok_ok & (((word >> (safe % 32)) & 1) == 1) & table.accept[st]
    is_stop = tok_ok & (table.is_stop[safe] != 0)
    dead = torch.full_like(st, DEAD_STATE)
    nxt = torch.where(found, target, torch.where(stops_here, states.long(), dead))
    nxt = torch.where(has_grammar, nxt, states.long()).to(torch.int32)
    finished = torch.where(has_grammar, ~found, (tok < 0) | is_stop)
    return nxt, finished


def _check_inputs(states, tokens, table) -> None:
    if not isinstance(table, DeviceTable):
        raise KernelInputError(
            f"table: expected a DeviceTable (DeviceTable.from_table), got {type(table).__name__}"
        )
    if not isinstance(states, torch.Tensor) or states.dim() != 1:
        raise KernelInputError("states: expected a 1-D int32 tensor [batch]")
    checks.check_vector(states, "states", -1, (torch.int32,), table.device)
    checks.check_vector(tokens, "tokens", states.shape[0], (torch.int64,), table.device)
    checks.check_states(states, table)
    nxt, _ = advance_torch(states, tokens, table)
    bad = torch.nonzero(nxt == DEAD_STATE).flatten()
    if bad.numel():
        row = int(bad[0])
        raise KernelInputError(
            f"row {row}: token {int(tokens[row])} is not allowed in state {int(states[row])} "
            f"(neither a transition nor a stop id in an accepting state)"
        )
