"""CSR transition lookups shared by the mask, sample and advance kernels (Triton and torch).

A state's allowed non-stop tokens are a sorted slice `trans_tok[trans_ptr[s]:trans_ptr[s+1]]`;
finding a token's slot is a binary search with a fixed number of steps (the table's
`num_search_steps`), vectorised over lanes, so it needs no data-dependent loop bound and no
host sync. `budget_keep_*` applies the `dist` rule: with `rem` tokens left (this one included)
a transition is kept iff dist[next] <= rem - 1, and a stop id (never in the CSR) iff rem >= 1.
"""

from __future__ import annotations

import torch

from surecall.kernels._triton import tl, triton
from surecall.kernels.table import DeviceTable


@triton.jit
def budget_keep_triton(
    tokens,  # int32 tensor of token ids
    state,  # int32 scalar: the row's grammar state
    rem,  # int32 scalar: tokens the row may still emit, this one included
    trans_ptr_ptr,  # int32 [S + 1] CSR row pointers
    trans_tok_ptr,  # int32 [nnz] sorted allowed tokens per state
    trans_next_ptr,  # int32 [nnz] next state per CSR slot
    dist_ptr,  # int32 [S] fewest tokens to acceptance
    num_search_steps,  # binary-search iterations
):
    # Fixed-step binary search for each token in the state's CSR row (advance.py has the same
    # loop written out: nested jit calls are slow in the interpreter).
    end = tl.zeros_like(tokens) + tl.load(trans_ptr_ptr + state + 1)
    lo = tl.zeros_like(tokens) + tl.load(trans_ptr_ptr + state)
    hi = end
    for _ in range(num_search_steps):
        active = lo < hi
        mid = lo + (hi - lo) // 2
        go_right = tl.load(trans_tok_ptr + mid, mask=active, other=0) < tokens
        lo = tl.where(active & go_right, mid + 1, lo)
        hi = tl.where(active & (go_right == 0), mid, hi)
    in_row = lo < end
    found = in_row & (tl.load(trans_tok_ptr + lo, mask=in_row, other=-1) == tokens)
    slot = lo
    nxt = tl.load(trans_next_ptr + slot, mask=found, other=0)
    d = tl.load(dist_ptr + nxt, mask=found, other=0)
    return (
        tl.where(found, d <= rem - 1, rem >= 1) != 0
    )  # `!= 0`: a plain bool tensor in the interpreter too


def csr_find_torch(
    table: DeviceTable, states: torch.Tensor, tokens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(found bool, slot int64) for 1-D `states` (all >= 0) and `tokens` of the same length."""
    # Index the int32 arrays first and widen only what was read: widening the whole CSR
    # (millions of entries) every step cost milliseconds on CPU.
    ptr = table.trans_ptr
    lo, end = ptr[states.long()].long(), ptr[states.long() + 1].long()
    hi = end.clone()
    tokens = tokens.long()
    tok = table.trans_tok
    last = tok.numel() - 1
    for _ in range(table.num_search_steps):
        active = lo < hi
        mid = lo + (hi - lo) // 2
        go_right = tok[mid.clamp(max=last)].long() < tokens
        lo = torch.where(active & go_right, mid + 1, lo)
        hi = torch.where(active & ~go_right, mid, hi)
    in_row = lo < end
    found = in_row & (tok[lo.clamp(max=last)].long() == tokens)
    return found, lo


def budget_drop_torch(
    table: DeviceTable, states: torch.Tensor, remaining: torch.Tensor, num_cols: int
) -> torch.Tensor:
    """bool [R, num_cols]: tokens the budget forbids for rows in `states` (>= 0) with `remaining`.

    Walks the CSR rows of binding states only (the reference path; it syncs with the host).
    """
    drop = torch.zeros(states.shape[0], num_cols, dtype=torch.bool, device=states.device)
    states = states.long()
    rem = remaining.long()
    binding = torch.nonzero(rem - 1 < table.max_next_dist[states].long()).flatten()
    if binding.numel() == 0:
        return drop
    drop[binding[rem[binding] < 1]] = True  # nothing fits, stop ids included
    ptr = table.trans_ptr
    starts, ends = ptr[states[binding]].long(), ptr[states[binding] + 1].long()
    lens = ends - starts
    owner = torch.repeat_interleave(binding, lens)
    first = torch.repeat_interleave(starts - torch.cumsum(lens, 0) + lens, lens)
    slots = first + torch.arange(owner.numel(), device=states.device)
    too_far = table.dist[table.trans_next[slots].long()].long() > rem[owner] - 1
    toks = table.trans_tok[slots].long()
    keep_cols = toks < num_cols
    drop[owner[too_far & keep_cols], toks[too_far & keep_cols]] = True
    return drop
