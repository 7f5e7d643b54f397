"""Item counters on a device: minItems/maxItems of counted arrays (grammars/table.py "Item counters").

`ItemTable.from_table` puts a TokenTable's item_* fields on a device, with the entries also as
per-state CSR slices. Each row carries a stack of MAX_ITEM_DEPTH int32 item counters (int32
[B, MAX_ITEM_DEPTH], outermost first; the state's item_depth says how many are open).
`apply_item_mask_inplace` runs before the sampler (after, or instead of, the plain mask: it
only ever writes -inf): on a row inside a counted array it walks the state's transitions and
refuses a token whose separators would pass maxItems, a closing `]` before minItems, and any
token after which dist + string need + the item need of every open array no longer fits the
row's budget; on a row outside it checks the tokens that open a counted array.
`sample_remaining` lifts the sampler's own budget on rows inside an array (this kernel did it
there, exactly). `advance_items` gives each row's next counters (torch: one sparse lookup per row).
Triton and torch paths compute the same thing; nothing here samples or advances grammar states.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from surecall.errors import KernelInputError
from surecall.grammars.schema.to_regex import MAX_ITEM_DEPTH
from surecall.grammars.table import TokenTable
from surecall.kernels._triton import (
    launch_options,
    lower_bound,
    mask_words_triton,
    resolve_backend,
    tl,
    triton,
)
from surecall.kernels.budget import count_keep_torch, count_keep_triton, next_state_torch
from surecall.kernels.table import DeviceTable, entries_on

FLAG_CLOSES, FLAG_OPENS = 1, 2  # grammars/items.py
UNBOUNDED = 1 << 30  # remaining handed to the sampler on rows whose budget this kernel applied


@dataclass(frozen=True)
class ItemTable:
    item_lo: torch.Tensor  # int32 [S]
    item_hi: torch.Tensor  # int32 [S]; -1 outside counted arrays
    item_cost: torch.Tensor  # int32 [S]
    item_ptr: torch.Tensor  # int32 [S + 1]; each state's slice of the entries
    item_tok: torch.Tensor  # int32 [max(E, 1)]
    item_key: torch.Tensor  # int64 [max(E, 1)] sorted (padding: -1, never matched)
    item_inc: torch.Tensor  # int32 [max(E, 1)]
    item_flag: torch.Tensor  # int32 [max(E, 1)]
    item_set: torch.Tensor  # int32 [max(E, 1)]
    item_next: torch.Tensor  # int32 [max(E, 1)]
    item_depth: torch.Tensor  # int32 [S]: arrays open in the state
    item_below_lo: torch.Tensor  # int32 [S, MAX_ITEM_DEPTH - 1]: minimum of each open array below the innermost
    item_below_cost: torch.Tensor  # int32 [S, MAX_ITEM_DEPTH - 1]: its cost (0 past the depth)
    num_entries: int
    num_item_steps: int  # binary-search iterations over the longest per-state slice
    logits_width: int

    @classmethod
    def from_table(cls, table: TokenTable, device: torch.device | str = "cpu") -> ItemTable:
        if not table.has_items:
            raise KernelInputError("Invalid table: expected item counters (TokenTable.has_items), got none")
        dev = torch.device(device)
        width = table.logits_width
        num = int(table.item_key.shape[0])
        src = (table.item_key // width).astype(np.int64)
        ptr = np.searchsorted(src, np.arange(table.num_states + 1)).astype(np.int32)
        longest = int(np.diff(ptr).max()) if num else 0

        def put(a, dtype, pad=0):
            return entries_on(a, dtype, dev, pad)

        return cls(
            item_lo=put(table.item_lo, torch.int32), item_hi=put(table.item_hi, torch.int32),
            item_cost=put(table.item_cost, torch.int32), item_ptr=put(ptr, torch.int32),
            item_tok=put(table.item_key % width, torch.int32), item_key=put(table.item_key, torch.int64, -1),
            item_inc=put(table.item_inc, torch.int32), item_flag=put(table.item_flag, torch.int32),
            item_set=put(table.item_set, torch.int32), item_next=put(table.item_next, torch.int32),
            item_depth=put(table.item_depth, torch.int32), item_below_lo=put(table.item_below_lo, torch.int32),
            item_below_cost=put(table.item_below_cost, torch.int32),
            num_entries=num, num_item_steps=max(1, longest.bit_length()), logits_width=width,
        )  # fmt: skip


@triton.jit
def _refuse(
    out_ptr, tok, nxt, live, hit, entry, state, k, below, rem, counter, inside, lo, hi, cost,
    dist_ptr, dist_entry_ptr, count_row_ptr, count_lo_ptr, count_hi_ptr, count_chars_ptr, count_cols, count_fill,
    item_lo_ptr, item_hi_ptr, item_cost_ptr, item_inc_ptr, item_flag_ptr, item_set_ptr,
    HAS_COUNTS: tl.constexpr,
):  # fmt: skip
    """-inf at the tokens (any shape) the item bounds or the budget with unmet minItems refuse
    (`below`: the item need of the row's open arrays below the innermost)."""
    inc = tl.load(item_inc_ptr + entry, mask=live & hit, other=0)
    flag = tl.load(item_flag_ptr + entry, mask=live & hit, other=0)
    after = tl.load(item_set_ptr + entry, mask=live & hit, other=-1)
    total = k + inc
    closes = (flag & 1) != 0
    opens = (flag & 2) != 0
    bound_ok = (inside == 0) | ((total <= hi) & ((closes == 0) | (total >= lo)))
    # the innermost array after the token: the one it opens, the row's own unless it closed it
    k_next = tl.where(opens, after, total)
    short = tl.maximum(tl.load(item_lo_ptr + nxt, mask=live, other=0) - k_next, 0)
    top = (tl.load(item_hi_ptr + nxt, mask=live, other=-1) >= 0) & ((closes == 0) | opens)
    need = tl.where(top, tl.load(item_cost_ptr + nxt, mask=live, other=0) * short, 0) + below
    pushed = opens & (closes == 0) & (inside != 0)  # the row's array goes below the new one
    need += tl.where(pushed, cost * tl.maximum(lo - total, 0), 0)
    stay_need = tl.full(tok.shape, -1, tl.int32)
    if HAS_COUNTS:
        _, stay_need = count_keep_triton(
            tok, state, counter, count_row_ptr, count_lo_ptr, count_hi_ptr, count_chars_ptr, count_cols,
            count_fill)  # fmt: skip
    d = tl.where(stay_need >= 0, tl.load(dist_ptr + nxt, mask=live, other=0) + stay_need,
                 tl.load(dist_entry_ptr + nxt, mask=live, other=0))
    drop = live & ((bound_ok == 0) | (d + need > rem - 1))
    tl.store(out_ptr + tok, float("-inf"), mask=drop)


@triton.jit
def _item_mask_kernel(
    logits_ptr,  # float [B, L], masked in place
    logits_stride,
    states_ptr,  # int32 [B]; < 0: untouched
    counters_ptr,  # int32 [B] string counters (HAS_COUNTS)
    items_ptr,  # int32 [B, DEPTH] item counters, outermost first
    remaining_ptr,  # int32 [B] tokens the row may still emit, this one included
    mask_blocks_ptr, row_blocks_ptr, mask_row_ptr, num_words, num_row_blocks,  # the mask blocks (grammars/table.py)
    is_stop_ptr,
    trans_default_ptr, exc_lo_ptr, exc_hi_ptr, exc_tok_ptr, exc_slot_ptr, exc_base_ptr, exc_targets_ptr,
    num_search_steps,
    dist_ptr, dist_entry_ptr,
    count_row_ptr, count_lo_ptr, count_hi_ptr, count_chars_ptr, count_cols, count_fill,
    item_lo_ptr, item_hi_ptr, item_cost_ptr, item_ptr_ptr, item_tok_ptr, item_inc_ptr, item_flag_ptr,
    item_set_ptr, item_next_ptr, item_depth_ptr, item_below_lo_ptr, item_below_cost_ptr,
    num_item_steps,
    HAS_COUNTS: tl.constexpr,
    DEPTH: tl.constexpr,  # counters per row (MAX_ITEM_DEPTH)
    BLOCK_WORDS: tl.constexpr,  # mask words per step inside an array (32 * BLOCK_WORDS tokens)
    BLOCK: tl.constexpr,  # entries per step outside
    MASK_BW: tl.constexpr,  # packed words per mask block
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    state = tl.load(states_ptr + row)
    if state >= 0:
        depth = tl.load(item_depth_ptr + state)
        k = tl.load(items_ptr + row * DEPTH + tl.maximum(depth - 1, 0))
        below = tl.full([], 0, tl.int32)  # the unmet minimums of the open arrays under the innermost
        for j in tl.static_range(DEPTH - 1):
            lo_j = tl.load(item_below_lo_ptr + state * (DEPTH - 1) + j)
            cost_j = tl.load(item_below_cost_ptr + state * (DEPTH - 1) + j)
            below += cost_j * tl.maximum(lo_j - tl.load(items_ptr + row * DEPTH + j), 0)
        rem = tl.load(remaining_ptr + row)
        counter = tl.full([], 0, tl.int32)
        if HAS_COUNTS:
            counter = tl.load(counters_ptr + row)
        hi = tl.load(item_hi_ptr + state)
        lo = tl.load(item_lo_ptr + state)
        cost = tl.load(item_cost_ptr + state)
        e0 = tl.load(item_ptr_ptr + state)
        e1 = tl.load(item_ptr_ptr + state + 1)
        out_ptr = logits_ptr + row * logits_stride
        if hi >= 0:  # inside an array: every allowed token (the budget is this kernel's there)
            mrow = tl.load(mask_row_ptr + state).to(tl.int64)
            x0 = tl.load(exc_lo_ptr + state)
            x1 = tl.load(exc_hi_ptr + state)
            xb = tl.load(exc_base_ptr + state)
            default = tl.load(trans_default_ptr + state)
            bits = tl.arange(0, 32)
            for wbase in range(0, num_words, BLOCK_WORDS):
                words = wbase + tl.arange(0, BLOCK_WORDS)
                packed = mask_words_triton(mask_blocks_ptr, row_blocks_ptr, mrow, words, num_words, num_row_blocks,
                                           words >= 0, MASK_BW)
                tok = words[:, None] * 32 + bits[None, :]
                live = ((packed[:, None] >> bits[None, :]) & 1) != 0
                live = live & (tl.load(is_stop_ptr + tok, mask=live, other=0) == 0)
                # the next state: the state's exceptions (fixed-step binary search), else its default
                a = lower_bound(exc_tok_ptr, tl.zeros_like(tok) + x0, tl.zeros_like(tok) + x1, tok, num_search_steps)
                found = live & (a < x1) & (tl.load(exc_tok_ptr + a, mask=live & (a < x1), other=-1) == tok)
                slot = tl.load(exc_slot_ptr + a, mask=found, other=0)
                nxt = tl.where(found, tl.load(exc_targets_ptr + xb + slot, mask=found, other=0), tl.maximum(default, 0))
                # the token's item entry, if any
                a = lower_bound(item_tok_ptr, tl.zeros_like(tok) + e0, tl.zeros_like(tok) + e1, tok, num_item_steps)
                hit = live & (a < e1) & (tl.load(item_tok_ptr + a, mask=live & (a < e1), other=-1) == tok)
                _refuse(out_ptr, tok, nxt, live, hit, a, state, k, below, rem, counter, hi >= 0, lo, hi, cost,
                        dist_ptr, dist_entry_ptr, count_row_ptr, count_lo_ptr, count_hi_ptr, count_chars_ptr,
                        count_cols, count_fill, item_lo_ptr, item_hi_ptr, item_cost_ptr, item_inc_ptr,
                        item_flag_ptr, item_set_ptr, HAS_COUNTS)  # fmt: skip
        else:  # outside: only the tokens that open an array (its entries)
            for base in range(e0, e1, BLOCK):
                slot = base + tl.arange(0, BLOCK)
                live = slot < e1
                tok = tl.load(item_tok_ptr + slot, mask=live, other=0)
                nxt = tl.load(item_next_ptr + slot, mask=live, other=0)
                _refuse(out_ptr, tok, nxt, live, live, slot, state, k, below, rem, counter, hi >= 0, lo, hi, cost,
                        dist_ptr, dist_entry_ptr, count_row_ptr, count_lo_ptr, count_hi_ptr, count_chars_ptr,
                        count_cols, count_fill, item_lo_ptr, item_hi_ptr, item_cost_ptr, item_inc_ptr,
                        item_flag_ptr, item_set_ptr, HAS_COUNTS)  # fmt: skip


def apply_item_mask_inplace(
    logits: torch.Tensor,  # [B, L] float
    table: DeviceTable,
    items: ItemTable,
    states: torch.Tensor,  # [B] int32; < 0: no grammar
    item_counters: torch.Tensor,  # [B, MAX_ITEM_DEPTH] int32, contiguous
    remaining: torch.Tensor,  # [B] int32 (>= 1)
    counters: torch.Tensor | None = None,  # [B] int32 string counters (tables with counted strings)
    backend: str = "auto",
) -> None:
    """Write -inf where the item counters or the budget with unmet minItems forbid a token."""
    _check(logits, states, item_counters, remaining, counters, table)
    if resolve_backend(backend, logits.device) == "torch":
        apply_item_mask_torch(logits, table, items, states, item_counters, remaining, counters)
        return
    if logits.shape[0] == 0:
        return
    has_counts = counters is not None and table.has_counts
    on_gpu = logits.device.type == "cuda"
    _item_mask_kernel[(logits.shape[0],)](
        logits, logits.stride(0), states, counters if has_counts else states, item_counters, remaining,
        table.mask_blocks, table.mask_row_blocks, table.mask_row, table.num_words, table.num_row_blocks, table.is_stop,
        table.trans_default, table.exc_lo, table.exc_hi, table.exc_tok, table.exc_slot, table.exc_base,
        table.exc_targets, table.num_search_steps,
        table.dist, table.dist_entry,
        table.count_row, table.count_lo, table.count_hi, table.count_chars, table.count_cols, table.count_fill,
        items.item_lo, items.item_hi, items.item_cost, items.item_ptr, items.item_tok, items.item_inc,
        items.item_flag, items.item_set, items.item_next, items.item_depth, items.item_below_lo,
        items.item_below_cost, items.num_item_steps,
        HAS_COUNTS=has_counts, DEPTH=MAX_ITEM_DEPTH, BLOCK_WORDS=32 if on_gpu else 16, BLOCK=1024 if on_gpu else 256,
        MASK_BW=table.block_words, num_warps=4,
        **launch_options(logits.device),
    )  # fmt: skip


def _candidates(table: DeviceTable, items: ItemTable, states: torch.Tensor):
    """(row, token, next state, entry index or -1) of every (row, token) the item rule looks at:
    every allowed token of a row inside an array, the entries (opening tokens) of one outside."""
    st_all = states.long()
    rows = torch.nonzero(st_all >= 0).flatten()
    st = st_all[rows]
    inside = items.item_hi[st] >= 0
    dev = st.device
    # inside: the mask row's bits
    r_in = rows[inside]
    words = table.mask_rows(st[inside]).long() & 0xFFFFFFFF  # [n, W]
    bits = ((words[:, :, None] >> torch.arange(32, device=dev)) & 1).bool().flatten(1)  # [n, 32 W]
    bits &= (table.is_stop[: bits.shape[1]] == 0)[None, :]
    at_row, tok_in = torch.nonzero(bits, as_tuple=True)
    row_in = r_in[at_row]
    _, nxt_in = next_state_torch(table, st_all[row_in], tok_in)
    key = st_all[row_in] * items.logits_width + tok_in
    ne = items.item_key.numel() - 1
    at = torch.searchsorted(items.item_key[: max(items.num_entries, 1)], key).clamp(max=ne)
    entry_in = torch.where(items.item_key[at] == key, at, torch.full_like(at, -1))
    # outside: the state's entries
    st_out, r_out = st[~inside], rows[~inside]
    starts, ends = items.item_ptr[st_out].long(), items.item_ptr[st_out + 1].long()
    lens = ends - starts
    row_out = torch.repeat_interleave(r_out, lens)
    entry_out = torch.repeat_interleave(starts, lens) + torch.arange(row_out.numel(), device=dev) - \
        torch.repeat_interleave(torch.cumsum(lens, 0) - lens, lens)
    tok_out = items.item_tok[entry_out.clamp(max=ne)].long()
    nxt_out = items.item_next[entry_out.clamp(max=ne)].long()
    return (torch.cat([row_in, row_out]), torch.cat([tok_in, tok_out]), torch.cat([nxt_in.long(), nxt_out]),
            torch.cat([entry_in, entry_out]))


def apply_item_mask_torch(logits, table, items, states, item_counters, remaining, counters=None) -> None:
    """The reference of apply_item_mask_inplace (it syncs with the host)."""
    row, tok, nxt, entry = _candidates(table, items, states)
    if row.numel() == 0:
        return
    st = states.long()[row]
    hit = entry >= 0
    e = entry.clamp(min=0)
    inc = torch.where(hit, items.item_inc[e].long(), 0)
    flag = torch.where(hit, items.item_flag[e].long(), 0)
    after = torch.where(hit, items.item_set[e].long(), -1)
    inside = items.item_hi[st] >= 0
    stack = item_counters.long()[row]  # [n, DEPTH]
    depth = items.item_depth[st].long()
    k = torch.where(depth > 0, stack.gather(1, (depth - 1).clamp(min=0)[:, None])[:, 0], 0)
    below = (items.item_below_cost[st].long() * (items.item_below_lo[st].long() - stack[:, :-1]).clamp(min=0)).sum(1)
    total = k + inc
    closes, opens = (flag & FLAG_CLOSES) != 0, (flag & FLAG_OPENS) != 0
    lo, hi = items.item_lo[st].long(), items.item_hi[st].long()
    bound_ok = ~inside | ((total <= hi) & (~closes | (total >= lo)))
    k_next = torch.where(opens, after, total)
    short = (items.item_lo[nxt].long() - k_next).clamp(min=0)
    top = (items.item_hi[nxt] >= 0) & (~closes | opens)
    need = torch.where(top, items.item_cost[nxt].long() * short, torch.zeros_like(short)) + below
    pushed = opens & ~closes & inside
    need = need + torch.where(pushed, items.item_cost[st].long() * (lo - total).clamp(min=0), 0)
    d = table.dist_entry[nxt].long()
    if counters is not None and table.has_counts:
        uniq, inv = torch.unique(row, return_inverse=True)
        _, stay = count_keep_torch(table, states[uniq], counters[uniq], logits.shape[1])
        sn = stay[inv, tok.clamp(max=logits.shape[1] - 1)]
        d = torch.where(sn >= 0, table.dist[nxt].long() + sn, d)
    drop = ~bound_ok | (d + need > remaining.long()[row] - 1)
    logits[row[drop], tok[drop]] = float("-inf")


def item_row(items: ItemTable, states: torch.Tensor, item_counters: torch.Tensor) -> torch.Tensor:
    """int32 [B, 4] per row: the tokens its unmet minItems still need (grammars/table.py:
    item_cost[s] * max(0, item_lo[s] - k) for the innermost array, item_below_* for those around
    it), its innermost counter k, and that array's item_lo and item_hi (-1 outside arrays); the
    bracket stack's kernels (kernels/stack.py) read them."""
    st = states.long().clamp(min=0)
    stack = item_counters.long()
    depth = items.item_depth[st].long()
    k = torch.where(depth > 0, stack.gather(1, (depth - 1).clamp(min=0)[:, None])[:, 0], 0)
    inside = items.item_hi[st] >= 0
    own = torch.where(inside, items.item_cost[st].long() * (items.item_lo[st].long() - k).clamp(min=0), 0)
    below = (items.item_below_cost[st].long() * (items.item_below_lo[st].long() - stack[:, :-1]).clamp(min=0)).sum(1)
    need = torch.where(states >= 0, own + below, 0)
    hi = torch.where(states >= 0, items.item_hi[st].long(), -1)
    return torch.stack([need, k, items.item_lo[st].long(), hi], dim=1).to(torch.int32).contiguous()


def sample_remaining(items: ItemTable, states: torch.Tensor, remaining: torch.Tensor) -> torch.Tensor:
    """The remaining to hand the sampler: unbounded on rows inside a counted array (the item mask
    applied their budget, with the unmet minItems the sampler's own rule does not know)."""
    inside = (states >= 0) & (items.item_hi[states.long().clamp(min=0)] >= 0)
    return torch.where(inside, torch.full_like(remaining, UNBOUNDED), remaining)


def constrain_items(logits: torch.Tensor, table: DeviceTable | None, items: ItemTable | None,
                    states: torch.Tensor, counters: torch.Tensor | None, item_counters: torch.Tensor | None,
                    remaining: torch.Tensor) -> torch.Tensor:
    """The decode loops' one call before sampling: the item mask (when the batch's table has counted
    arrays) applied in place; returns the remaining to hand the sampler."""
    if items is None or table is None:
        return remaining
    apply_item_mask_inplace(logits, table, items, states, item_counters, remaining, counters=counters)
    return sample_remaining(items, states, remaining)


def advance_items(items: ItemTable, states: torch.Tensor, tokens: torch.Tensor,
                  item_counters: torch.Tensor) -> torch.Tensor:
    """int32 [B, MAX_ITEM_DEPTH]: each row's item counters after `tokens`: the innermost gains the
    token's separators, or is popped when it closes; an array the token leaves open is pushed
    (rows with state < 0 keep theirs)."""
    st = states.long()
    safe = st.clamp(min=0)
    key = safe * items.logits_width + tokens.long().clamp(min=0)
    at = torch.searchsorted(items.item_key[: max(items.num_entries, 1)], key).clamp(max=items.item_key.numel() - 1)
    hit = items.item_key[at] == key
    flag = torch.where(hit, items.item_flag[at].long(), 0)
    inc = torch.where(hit, items.item_inc[at].long(), 0)
    closes, opens = (flag & FLAG_CLOSES) != 0, (flag & FLAG_OPENS) != 0
    stack = item_counters.long().clone()
    depth = items.item_depth[safe].long()
    top = (depth - 1).clamp(min=0)[:, None]
    k = stack.gather(1, top)[:, 0]
    stack.scatter_(1, top, torch.where(depth > 0, torch.where(closes, 0, k + inc), k)[:, None])
    push = (depth - closes.long()).clamp(0, MAX_ITEM_DEPTH - 1)[:, None]
    pushed = torch.where(opens, items.item_set[at].long(), stack.gather(1, push)[:, 0])
    stack.scatter_(1, push, pushed[:, None])
    return torch.where((st >= 0)[:, None], stack, item_counters.long()).to(torch.int32)


def _check(logits, states, item_counters, remaining, counters, table) -> None:
    batch = logits.shape[0]
    for name, t, shape in (("states", states, (batch,)), ("item_counters", item_counters, (batch, MAX_ITEM_DEPTH)),
                           ("remaining", remaining, (batch,))):
        if t.dtype != torch.int32 or t.shape != shape or t.device != logits.device or not t.is_contiguous():
            raise KernelInputError(f"Invalid {name}: expected contiguous int32 {list(shape)} on {logits.device}, "
                                   f"got {t.dtype} {tuple(t.shape)} on {t.device}")
    if table.has_counts and counters is None:
        raise KernelInputError("Invalid counters: expected the string counters of a table with counted strings, got None")
