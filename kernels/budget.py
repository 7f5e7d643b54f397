"""CSR transition lookups shared by the mask, sample and advance kernels (Triton and torch).

A state's allowed non-stop tokens are a sorted slice `trans_tok[trans_ptr[s]:trans_ptr[s+1]]`;
finding a token's slot is a binary search with a fixed number of steps (the table's
`num_search_steps`), vectorised over lanes, so it needs no data-dependent loop bound and no
host sync. `budget_keep_*` applies the `dist` rule: with `rem` tokens left (this one included)
a transition is kept iff dist[next] <= rem - 1, and a stop id (never in the CSR) iff rem >= 1.
With counters (grammars/table.py) `count_keep_*` gives the counter bounds per column and, for
tokens that stay in a counted body, the need after them (`stay_need`, -1 elsewhere); the budget
then charges dist[next] + stay_need to those and dist_entry[next] to the rest.
"""

from __future__ import annotations

import numpy as np
import torch

from surecall.kernels._triton import tl, triton
from surecall.kernels.table import DeviceTable


@triton.jit
def count_keep_triton(
    cols,  # int32 tensor of token ids
    state,  # int32 scalar: the row's grammar state (>= 0)
    counter,  # int32 scalar: the row's counter
    count_row_ptr,  # int32 [S] row of count_chars, -1 outside counted bodies
    count_lo_ptr,  # int32 [S] minimum characters of the state's body
    count_hi_ptr,  # int32 [S] maximum characters of the state's body
    count_chars_ptr,  # int8 [R, count_cols] 2 * chars + closes, -1 never
    count_cols,  # columns of count_chars
    fill,  # characters per token towards a minimum
):
    r = tl.load(count_row_ptr + state)
    lo = tl.load(count_lo_ptr + state)
    hi = tl.load(count_hi_ptr + state)
    inside = r >= 0
    rows = tl.zeros_like(cols) + r  # the row as a tensor: a scalar-and-tensor mask is refused interpreted
    v = tl.load(
        count_chars_ptr + tl.maximum(rows, 0).to(tl.int64) * count_cols + cols,
        mask=(rows >= 0) & (cols < count_cols),
        other=-1,
    ).to(tl.int32)
    total = counter + (v >> 1)
    closes = (v & 1) != 0
    ok = (v >= 0) & (total <= hi) & ((closes == 0) | (total >= lo))
    keep = (inside == 0) | ok
    stays = inside & (v >= 0) & (closes == 0)
    need = (tl.maximum(lo - total, 0) + fill - 1) // fill
    return keep != 0, tl.where(stays, need, -1)


@triton.jit
def budget_keep_triton(
    tokens,  # int32 tensor of token ids
    state,  # int32 scalar: the row's grammar state
    rem,  # int32 scalar: tokens the row may still emit, this one included
    trans_ptr_ptr,  # int32 [S + 1] CSR row pointers
    trans_tok_ptr,  # int32 [nnz] sorted allowed tokens per state
    trans_next_ptr,  # int32 [nnz] next state per CSR slot
    dist_ptr,  # int32 [S] fewest tokens to acceptance
    dist_entry_ptr,  # int32 [S] dist + need(0): charged to tokens that do not stay in a body
    stay_need,  # int32 tensor like tokens: need after a token that stays in a body, else -1
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
    d = tl.where(
        stay_need >= 0,
        tl.load(dist_ptr + nxt, mask=found, other=0) + stay_need,
        tl.load(dist_entry_ptr + nxt, mask=found, other=0),
    )
    return (
        tl.where(found, d <= rem - 1, rem >= 1) != 0
    )  # `!= 0`: a plain bool tensor in the interpreter too


def csr_find_torch(
    table: DeviceTable, states: torch.Tensor, tokens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(found bool, slot int64) for 1-D `states` (all >= 0) and `tokens` of the same length."""
    if states.device.type == "cpu" and states.numel() <= HOST_SEARCH_MAX_ROWS:
        return _csr_find_host(table, states, tokens)
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


HOST_SEARCH_MAX_ROWS = 64  # up to this many CPU lookups, one numpy searchsorted each beats the loop


def _csr_find_host(table: DeviceTable, states: torch.Tensor, tokens: torch.Tensor):
    """csr_find_torch for a few CPU rows: numpy's searchsorted on each row's slice (perf, same result)."""
    ptr, tok = table.trans_ptr.numpy(), table.trans_tok.numpy()
    num = states.numel()
    slot = np.zeros(num, dtype=np.int64)
    found = np.zeros(num, dtype=bool)
    for i, (s, t) in enumerate(zip(states.tolist(), tokens.tolist(), strict=True)):
        lo, end = int(ptr[s]), int(ptr[s + 1])
        j = lo + int(np.searchsorted(tok[lo:end], t)) if -(2**31) <= t < 2**31 else (lo if t < 0 else end)
        slot[i], found[i] = j, j < end and int(tok[j]) == t
    return torch.from_numpy(found), torch.from_numpy(slot)


def count_keep_torch(
    table: DeviceTable, states: torch.Tensor, counters: torch.Tensor, num_cols: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(keep bool [R, num_cols], stay_need int64 [R, num_cols]) for rows in `states` (>= 0)."""
    st = states.long()
    r = table.count_row[st].long()
    inside = (r >= 0)[:, None]
    cols = torch.arange(num_cols, device=st.device)
    in_cols = cols < table.count_cols
    v = table.count_chars[r.clamp(min=0)][:, cols.clamp(max=table.count_cols - 1)].long()
    v = torch.where(inside & in_cols[None, :], v, torch.full_like(v, -1))
    total = counters.long()[:, None] + torch.div(v, 2, rounding_mode="floor")
    closes = (v >= 0) & (v % 2 == 1)
    lo, hi = table.count_lo[st].long()[:, None], table.count_hi[st].long()[:, None]
    ok = (v >= 0) & (total <= hi) & (~closes | (total >= lo))
    stays = inside & (v >= 0) & ~closes
    need = torch.div((lo - total).clamp(min=0) + table.count_fill - 1, table.count_fill, rounding_mode="floor")
    return ~inside | ok, torch.where(stays, need, torch.full_like(need, -1))


def budget_drop_torch(
    table: DeviceTable, states: torch.Tensor, remaining: torch.Tensor, num_cols: int,
    stay_need: torch.Tensor | None = None,  # [R, num_cols] from count_keep_torch
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
    toks = table.trans_tok[slots].long()
    keep_cols = toks < num_cols
    nxt = table.trans_next[slots].long()
    d = table.dist_entry[nxt].long()
    if stay_need is not None:
        sn = stay_need[owner, toks.clamp(max=num_cols - 1)]
        d = torch.where(sn >= 0, table.dist[nxt].long() + sn, d)
    too_far = d > rem[owner] - 1
    drop[owner[too_far & keep_cols], toks[too_far & keep_cols]] = True
    return drop
