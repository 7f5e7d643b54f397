"""Transition lookups shared by the mask, sample and advance kernels (Triton and torch).

A state's exceptions are a sorted slice `exc_tok[exc_lo[s]:exc_hi[s]]` (its shared row), exception i
leading to `exc_targets[exc_base[s] + exc_slot[i]]`; finding a token
there is a binary search with a fixed number of steps (the table's `num_search_steps`),
vectorised over lanes, so it needs no data-dependent loop bound and no host sync. Any other
allowed non-stop token leads to `trans_default[s]` (grammars/table.py). `budget_keep_*` applies
the `dist` rule: with `rem` tokens left (this one included) a transition is kept iff
dist[next] <= rem - 1 (with default-next: the mask row AND dist[default] fits, the exceptions
overriding), and a stop id (never a transition) iff rem >= 1.
With counters (grammars/table.py) `count_keep_*` gives the counter bounds per column and, for
tokens that stay in a counted body, the need after them (`stay_need`, -1 elsewhere); the budget
then charges dist[next] + stay_need to those and dist_entry[next] to the rest.
"""

from __future__ import annotations

import numpy as np
import torch

from surecall.kernels._triton import lower_bound, tl, triton
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
    exc_lo_ptr,  # int32 [S] start of the state's exception row
    exc_hi_ptr,  # int32 [S] its end
    exc_tok_ptr,  # int32 [E] sorted exception tokens per row
    exc_slot_ptr,  # int32 [E] each exception's slot among the state's targets
    exc_base_ptr,  # int32 [S] the state's first target
    exc_targets_ptr,  # int32 [T] next states
    trans_default_ptr,  # int32 [S] next state of the other allowed non-stop tokens (-1: none)
    is_stop_ptr,  # int8 [32 * num_words] 1 for the table's stop ids
    num_words,  # W: is_stop covers 32 * W ids
    dist_ptr,  # int32 [S] fewest tokens to acceptance
    dist_entry_ptr,  # int32 [S] dist + need(0): charged to tokens that do not stay in a body
    stay_need,  # int32 tensor like tokens: need after a token that stays in a body, else -1
    num_search_steps,  # binary-search iterations
):
    # each token in the state's exception row
    end = tl.zeros_like(tokens) + tl.load(exc_hi_ptr + state)
    lo = lower_bound(exc_tok_ptr, tl.zeros_like(tokens) + tl.load(exc_lo_ptr + state), end, tokens, num_search_steps)
    in_row = lo < end
    found = in_row & (tl.load(exc_tok_ptr + lo, mask=in_row, other=-1) == tokens)
    default = tl.zeros_like(tokens) + tl.load(trans_default_ptr + state)
    target_at = tl.load(exc_base_ptr + state) + tl.load(exc_slot_ptr + lo, mask=found, other=0)
    nxt = tl.where(found, tl.load(exc_targets_ptr + target_at, mask=found, other=0), tl.maximum(default, 0))
    stop = tl.load(is_stop_ptr + tokens, mask=(tokens >= 0) & (tokens < 32 * num_words), other=0) != 0
    is_trans = found | ((stop == 0) & (default >= 0))
    d = tl.where(stay_need >= 0, tl.load(dist_ptr + nxt) + stay_need, tl.load(dist_entry_ptr + nxt))
    return (
        tl.where(is_trans, d <= rem - 1, rem >= 1) != 0
    )  # `!= 0`: a plain bool tensor in the interpreter too


def exc_find_torch(
    table: DeviceTable, states: torch.Tensor, tokens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(found bool, slot int64): each token among its state's exceptions (1-D, states >= 0)."""
    if states.device.type == "cpu" and states.numel() <= HOST_SEARCH_MAX_ROWS:
        return _exc_find_host(table, states, tokens)
    # Index the int32 arrays first and widen only what was read: widening whole arrays every
    # step cost milliseconds on CPU.
    lo, end = table.exc_lo[states.long()].long(), table.exc_hi[states.long()].long()
    hi = end.clone()
    tokens = tokens.long()
    tok = table.exc_tok
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


def _exc_find_host(table: DeviceTable, states: torch.Tensor, tokens: torch.Tensor):
    """exc_find_torch for a few CPU rows: numpy's searchsorted on each row's slice (perf, same result)."""
    starts, ends, tok = table.exc_lo.numpy(), table.exc_hi.numpy(), table.exc_tok.numpy()
    num = states.numel()
    slot = np.zeros(num, dtype=np.int64)
    found = np.zeros(num, dtype=bool)
    for i, (s, t) in enumerate(zip(states.tolist(), tokens.tolist(), strict=True)):
        lo, end = int(starts[s]), int(ends[s])
        j = lo + int(np.searchsorted(tok[lo:end], t)) if -(2**31) <= t < 2**31 else (lo if t < 0 else end)
        slot[i], found[i] = j, j < end and int(tok[j]) == t
    return torch.from_numpy(found), torch.from_numpy(slot)


def next_state_torch(
    table: DeviceTable, states: torch.Tensor, tokens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(is a transition bool, next state int64) for 1-D `states` (all >= 0) and `tokens`."""
    st, tok = states.long(), tokens.long()
    found, slot = exc_find_torch(table, st, tok)
    tok_ok = (tok >= 0) & (tok < 32 * table.num_words)
    safe = torch.where(tok_ok, tok, torch.zeros_like(tok))
    word = table.mask_word(st, safe // 32)
    bit = tok_ok & (((word >> (safe % 32)) & 1) == 1)
    default = table.trans_default[st].long()
    plain = bit & (table.is_stop[safe] == 0) & (default >= 0)
    exc = exc_target_torch(table, st, slot, found)
    return found | plain, torch.where(found, exc, default)


def exc_target_torch(table: DeviceTable, states: torch.Tensor, at: torch.Tensor, found: torch.Tensor) -> torch.Tensor:
    """int64 next state of exception `at` (an index into exc_tok) of each state (0 where not `found`)."""
    slot = table.exc_slot[at.clamp(max=table.exc_slot.numel() - 1)].long()
    where = (table.exc_base[states.long()].long() + slot).clamp(max=table.exc_targets.numel() - 1)
    return torch.where(found, table.exc_targets[where].long(), torch.zeros_like(where))


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

    Every column of a binding row reads its default next state, the exceptions overriding (the
    reference path; it syncs with the host). Columns the mask forbids may be marked or not.
    """
    drop = torch.zeros(states.shape[0], num_cols, dtype=torch.bool, device=states.device)
    states = states.long()
    rem = remaining.long()
    binding = torch.nonzero(rem - 1 < table.max_next_dist[states].long()).flatten()
    if binding.numel() == 0:
        return drop
    drop[binding[rem[binding] < 1]] = True  # nothing fits, stop ids included
    st = states[binding]
    default = table.trans_default[st].long()
    nxt = default.clamp(min=0)[:, None].expand(-1, num_cols).clone()
    starts, ends = table.exc_lo[st].long(), table.exc_hi[st].long()
    lens = ends - starts
    owner = torch.repeat_interleave(torch.arange(st.numel(), device=st.device), lens)
    first = torch.repeat_interleave(starts - torch.cumsum(lens, 0) + lens, lens)
    slots = first + torch.arange(owner.numel(), device=states.device)
    toks = table.exc_tok[slots].long()
    in_cols = toks < num_cols
    targets = table.exc_targets[table.exc_base[st[owner]].long() + table.exc_slot[slots].long()].long()
    nxt[owner[in_cols], toks[in_cols]] = targets[in_cols]
    d = table.dist_entry[nxt].long()
    if stay_need is not None:
        sn = stay_need[binding]
        d = torch.where(sn >= 0, table.dist[nxt].long() + sn, d)
    cols = torch.arange(num_cols, device=states.device)
    stop = (cols < table.is_stop.numel()) & (table.is_stop[cols.clamp(max=table.is_stop.numel() - 1)] != 0)
    drop[binding] |= (d > rem[binding, None] - 1) & ~stop[None, :]
    return drop
