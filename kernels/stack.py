"""The bracket stack of free-form values on a device (grammars/table.py "Bracket stack").

Each batch row carries its stack of open free-form containers: a depth (int32 [B]) and their kinds
(int64 [B], bit 0 the innermost, 1 an array). `StackTable.from_table` puts a TokenTable's stack_*
fields on a device with the entries as per-state slices. Before the sampler:

- `stack_remaining` gives the remaining every other budget rule (the sampler's, the item mask's)
  must use: the row's budget less one closer per open level beyond the innermost (the plain dist
  counts the innermost only), so their rules stay exact for the tokens without a stack event;
- `apply_stack_mask_inplace` visits the row's state's entries (tokens with a stack event) and
  writes -inf where no outcome holds for the row's stack, where a push would pass
  MAX_STACK_DEPTH, where its item events break the row's innermost counted array's bounds, or
  where the outcome leaves too few tokens: dist_entry[next] + max(depth after - 1, 0) + the row's
  unmet minItems before the token + the item charge of an array it opens > remaining - 1. A token
  that only pushes one level from outside a free-form value adds nothing there and keeps the
  other rules' verdict.

`advance_stack` gives each row's stack and, where its token has an entry, the outcome's next state
(the plain table sends a token that pops to a sentinel state). Triton and torch compute the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from surecall.errors import KernelInputError
from surecall.grammars.stack import MAX_STACK_DEPTH
from surecall.grammars.table import TokenTable
from surecall.kernels._triton import launch_options, resolve_backend, tl, triton
from surecall.kernels.advance import DEAD_STATE
from surecall.kernels.table import DeviceTable, entries_on


@dataclass(frozen=True)
class StackTable:
    state_ptr: torch.Tensor  # int32 [S + 1]: each state's entries
    key: torch.Tensor  # int64 [max(E, 1)] sorted s * logits_width + t (padding -1)
    tok: torch.Tensor  # int32 [max(E, 1)]
    edge: torch.Tensor  # int32 [max(E, 1)]
    out_ptr: torch.Tensor  # int32 [E + 2] (the last repeated: padding entry E has none)
    cond_len: torch.Tensor  # int32 [max(O, 1)]
    cond_bits: torch.Tensor  # int64 [max(O, 1)]
    cond_depth: torch.Tensor  # int32 [max(O, 1)]
    pops: torch.Tensor  # int32 [max(O, 1)]
    push_len: torch.Tensor  # int32 [max(O, 1)]
    push_bits: torch.Tensor  # int64 [max(O, 1)]
    next: torch.Tensor  # int32 [max(O, 1)]
    item_inc: torch.Tensor  # int32 [max(O, 1)]: separators crossed in the row's innermost counted array
    item_flag: torch.Tensor  # int32 [max(O, 1)]: 1 closes it, 2 leaves one open (item_set its counter)
    item_set: torch.Tensor  # int32 [max(O, 1)]
    item_charge: torch.Tensor  # int32 [max(O, 1)]: unmet minimum of the array it leaves open, in tokens
    num_entries: int
    max_outcomes: int  # the most outcomes of one entry
    logits_width: int

    @classmethod
    def from_table(cls, table: TokenTable, device: torch.device | str = "cpu") -> StackTable:
        if not table.has_stack:
            raise KernelInputError("Invalid table: expected a bracket stack (TokenTable.has_stack), got none")
        dev = torch.device(device)
        width = table.logits_width
        num = int(table.stack_key.shape[0])
        src = (np.asarray(table.stack_key) // width).astype(np.int64)
        state_ptr = np.searchsorted(src, np.arange(table.num_states + 1)).astype(np.int32)
        per = np.diff(np.asarray(table.stack_ptr, dtype=np.int64))

        def put(a, dtype, pad=0):
            return entries_on(a, dtype, dev, pad)

        return cls(
            state_ptr=put(state_ptr, torch.int32), key=put(table.stack_key, torch.int64, -1),
            tok=put(np.asarray(table.stack_key) % width, torch.int32), edge=put(table.stack_edge, torch.int32),
            out_ptr=put(np.append(table.stack_ptr, table.stack_ptr[-1]), torch.int32), cond_len=put(table.stack_cond_len, torch.int32),
            cond_bits=put(table.stack_cond_bits, torch.int64), cond_depth=put(table.stack_cond_depth, torch.int32),
            pops=put(table.stack_pops, torch.int32), push_len=put(table.stack_push_len, torch.int32),
            push_bits=put(table.stack_push_bits, torch.int64), next=put(table.stack_next, torch.int32),
            item_inc=put(table.stack_item_inc, torch.int32), item_flag=put(table.stack_item_flag, torch.int32),
            item_set=put(table.stack_item_set, torch.int32, -1), item_charge=put(table.stack_item_charge, torch.int32),
            num_entries=num, max_outcomes=max(1, int(per.max()) if per.size else 1), logits_width=width,
        )  # fmt: skip


def stack_remaining(depth: torch.Tensor, remaining: torch.Tensor) -> torch.Tensor:
    """The remaining the other budget rules use: one closer per open level past the innermost is
    kept back (at least 1, as the sampler expects)."""
    return (remaining - (depth - 1).clamp(min=0)).clamp(min=1).to(remaining.dtype)


# -- torch (the reference, and the CPU path) -----------------------------------------------------


def _outcomes(stack: StackTable, entry: torch.Tensor, depth: torch.Tensor, bits: torch.Tensor):
    """Per (entry, row stack) pair: (matched, next state, depth after, bits after) of the one
    outcome that holds (matched False where none does or a push passes MAX_STACK_DEPTH)."""
    lo = stack.out_ptr[entry].long()
    count = stack.out_ptr[entry + 1].long() - lo
    j = torch.arange(stack.max_outcomes, device=entry.device)
    o = lo[:, None] + j[None, :]
    real = j[None, :] < count[:, None]
    o = torch.where(real, o, 0)
    m = stack.cond_len[o].long()
    mask = (torch.ones_like(m) << m) - 1
    want = stack.cond_depth[o].long()
    d, b = depth.long()[:, None], bits.long()[:, None]
    holds = real & ((b & mask) == stack.cond_bits[o]) & torch.where(want >= 0, d == want, d >= m)
    matched = holds.any(dim=1)
    pick = torch.gather(o, 1, holds.long().argmax(dim=1, keepdim=True))[:, 0]
    pops, pl = stack.pops[pick].long(), stack.push_len[pick].long()
    d_after = depth.long() - pops + pl
    b_after = ((bits.long() >> pops) << pl) | stack.push_bits[pick]
    matched = matched & (d_after <= MAX_STACK_DEPTH)
    return matched, stack.next[pick].long(), d_after, b_after, pick


def _item_bounds_ok(stack: StackTable, pick: torch.Tensor, item_row: torch.Tensor | None) -> torch.Tensor:
    """Whether outcome `pick`'s item events fit the row's innermost counted array (item_row: [n, 4]
    need, counter, item_lo, item_hi of the row's state; item_hi < 0 outside arrays)."""
    inc, flag = stack.item_inc[pick].long(), stack.item_flag[pick].long()
    if item_row is None:
        return (inc == 0) & (flag == 0)
    k, lo, hi = item_row[:, 1].long(), item_row[:, 2].long(), item_row[:, 3].long()
    closes = (flag & 1) != 0
    total = k + inc
    inside = (total <= hi) & (~closes | (total >= lo))
    return torch.where(hi >= 0, inside, (inc == 0) & ~closes)


def _row_entries(stack: StackTable, states: torch.Tensor):
    """(row, entry) of every entry of every row's state (rows with state < 0: none)."""
    st = states.long()
    rows = torch.nonzero(st >= 0).flatten()
    starts = stack.state_ptr[st[rows]].long()
    lens = stack.state_ptr[st[rows] + 1].long() - starts
    row = torch.repeat_interleave(rows, lens)
    first = torch.repeat_interleave(torch.cumsum(lens, 0) - lens, lens)
    entry = torch.repeat_interleave(starts, lens) + torch.arange(row.numel(), device=st.device) - first
    return row, entry


def apply_stack_mask_torch(logits, table: DeviceTable, stack: StackTable, states, depth, bits, remaining,
                           item_row=None) -> None:
    """The reference of apply_stack_mask_inplace (it syncs with the host)."""
    row, entry = _row_entries(stack, states)
    if row.numel() == 0:
        return
    d, b = depth[row], bits[row]
    matched, nxt, d_after, _, pick = _outcomes(stack, entry, d, b)
    rows_items = item_row[row] if item_row is not None else None
    matched = matched & _item_bounds_ok(stack, pick, rows_items)
    need = table.dist_entry[nxt.clamp(min=0)].long() + (d_after - 1).clamp(min=0) + stack.item_charge[pick].long()
    if rows_items is not None:
        need = need + rows_items[:, 0].long()
    before = (d.long() - 1).clamp(min=0)
    checked = (stack.edge[entry] == 0) | ((d_after - 1).clamp(min=0) > before)
    drop = ~matched | (checked & (need > remaining.long()[row] - 1))
    logits[row[drop], stack.tok[entry[drop]].long()] = float("-inf")


def advance_stack(stack: StackTable, states: torch.Tensor, tokens: torch.Tensor, depth: torch.Tensor,
                  bits: torch.Tensor, items=None, item_counters: torch.Tensor | None = None):
    """(next state, depth, bits, item counters) of each row after `tokens`: the next state is the
    outcome's where the token has an entry, DEAD_STATE where none of its outcomes holds (the mask
    refused it), -1 where it has no entry (the plain table's next state stands); rows with state
    < 0 keep theirs. An outcome's item events move `item_counters` (after advance_items: a token
    that pops has no item entry) as kernels.items.advance_items would (`items`: the ItemTable)."""
    st = states.long()
    safe = st.clamp(min=0)
    key = safe * stack.logits_width + tokens.long().clamp(min=0)
    at = torch.searchsorted(stack.key[: max(stack.num_entries, 1)], key).clamp(max=stack.key.numel() - 1)
    hit = (stack.key[at] == key) & (st >= 0) & (tokens >= 0)
    matched, nxt, d_after, b_after, pick = _outcomes(stack, at, depth, bits)
    ok = hit & matched
    nxt = torch.where(ok, nxt, torch.where(hit, DEAD_STATE, -1))
    if items is not None and item_counters is not None:
        item_counters = _advance_item_counters(stack, items, safe, ok, pick, item_counters)
    return (nxt.to(torch.int32), torch.where(ok, d_after, depth.long()).to(torch.int32),
            torch.where(ok, b_after, bits.long()), item_counters)


def _advance_item_counters(stack: StackTable, items, st: torch.Tensor, ok: torch.Tensor, pick: torch.Tensor,
                           item_counters: torch.Tensor) -> torch.Tensor:
    """The item counters after outcomes `pick` (rows where `ok`), as advance_items applies an entry."""
    from surecall.kernels.items import MAX_ITEM_DEPTH

    inc = torch.where(ok, stack.item_inc[pick].long(), 0)
    flag = torch.where(ok, stack.item_flag[pick].long(), 0)
    closes, opens = (flag & 1) != 0, (flag & 2) != 0
    out = item_counters.long().clone()
    depth = items.item_depth[st].long()
    top = (depth - 1).clamp(min=0)[:, None]
    k = out.gather(1, top)[:, 0]
    out.scatter_(1, top, torch.where(depth > 0, torch.where(closes, 0, k + inc), k)[:, None])
    at = (depth - closes.long()).clamp(0, MAX_ITEM_DEPTH - 1)[:, None]
    out.scatter_(1, at, torch.where(opens, stack.item_set[pick].long(), out.gather(1, at)[:, 0])[:, None])
    return out.to(torch.int32)


# -- Triton --------------------------------------------------------------------------------------


@triton.jit
def _stack_mask_kernel(
    logits_ptr, logits_stride,
    states_ptr, depth_ptr, bits_ptr, remaining_ptr, item_row_ptr,
    state_ptr_ptr, tok_ptr, edge_ptr, out_ptr_ptr, cond_len_ptr, cond_bits_ptr, cond_depth_ptr, pops_ptr,
    push_len_ptr, push_bits_ptr, next_ptr, item_inc_ptr, item_flag_ptr, item_charge_ptr, dist_entry_ptr,
    HAS_ITEMS: tl.constexpr,
    MAX_OUT: tl.constexpr,
    MAX_DEPTH: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    state = tl.load(states_ptr + row)
    if state >= 0:
        d = tl.load(depth_ptr + row)
        b = tl.load(bits_ptr + row)
        rem = tl.load(remaining_ptr + row)
        extra = tl.full([], 0, tl.int32)
        k = tl.full([], 0, tl.int32)
        lo_items = tl.full([], 0, tl.int32)
        hi_items = tl.full([], -1, tl.int32)
        if HAS_ITEMS:  # the row's unmet minItems, innermost counter and that array's bounds
            extra = tl.load(item_row_ptr + row * 4)
            k = tl.load(item_row_ptr + row * 4 + 1)
            lo_items = tl.load(item_row_ptr + row * 4 + 2)
            hi_items = tl.load(item_row_ptr + row * 4 + 3)
        e0 = tl.load(state_ptr_ptr + state)
        e1 = tl.load(state_ptr_ptr + state + 1)
        before = tl.maximum(d - 1, 0)
        for base in range(e0, e1, BLOCK):
            entry = base + tl.arange(0, BLOCK)
            live = entry < e1
            tok = tl.load(tok_ptr + entry, mask=live, other=0)
            lo = tl.load(out_ptr_ptr + entry, mask=live, other=0)
            hi = tl.load(out_ptr_ptr + entry + 1, mask=live, other=0)
            found = tl.zeros([BLOCK], dtype=tl.int1)
            nxt = tl.zeros([BLOCK], dtype=tl.int32)
            d_after = tl.zeros([BLOCK], dtype=tl.int32)
            pick = tl.zeros([BLOCK], dtype=tl.int32)
            for j in tl.static_range(MAX_OUT):
                o = lo + j
                real = live & (o < hi)
                m = tl.load(cond_len_ptr + o, mask=real, other=0)
                cb = tl.load(cond_bits_ptr + o, mask=real, other=0)
                want = tl.load(cond_depth_ptr + o, mask=real, other=0)
                mask_bits = (tl.full([BLOCK], 1, tl.int64) << m.to(tl.int64)) - 1
                depth_ok = tl.where(want >= 0, d == want, d >= m)
                holds = real & ((b & mask_bits) == cb) & depth_ok & (found == 0)
                after = d - tl.load(pops_ptr + o, mask=real, other=0) + tl.load(push_len_ptr + o, mask=real, other=0)
                nxt = tl.where(holds, tl.load(next_ptr + o, mask=holds, other=0), nxt)
                d_after = tl.where(holds, after, d_after)
                pick = tl.where(holds, o, pick)
                found = found | holds
            ok = found & (d_after <= MAX_DEPTH)
            inc = tl.load(item_inc_ptr + pick, mask=ok, other=0)
            flag = tl.load(item_flag_ptr + pick, mask=ok, other=0)
            closes = (flag & 1) != 0
            total = k + inc
            inside = (total <= hi_items) & ((closes == 0) | (total >= lo_items))
            ok = ok & tl.where(hi_items >= 0, inside, (inc == 0) & (closes == 0))
            need = (tl.load(dist_entry_ptr + nxt, mask=ok, other=0) + tl.maximum(d_after - 1, 0) + extra
                    + tl.load(item_charge_ptr + pick, mask=ok, other=0))
            checked = (tl.load(edge_ptr + entry, mask=live, other=0) == 0) | (tl.maximum(d_after - 1, 0) > before)
            drop = live & ((ok == 0) | (checked & (need > rem - 1)))
            tl.store(logits_ptr + row * logits_stride + tok, float("-inf"), mask=drop)


def apply_stack_mask_inplace(
    logits: torch.Tensor,  # [B, L] float
    table: DeviceTable,
    stack: StackTable,
    states: torch.Tensor,  # [B] int32; < 0: no grammar
    depth: torch.Tensor,  # [B] int32
    bits: torch.Tensor,  # [B] int64
    remaining: torch.Tensor,  # [B] int32 (>= 1): the row's own budget (not stack_remaining's)
    item_row: torch.Tensor | None = None,  # [B, 4] int32 (kernels.items.item_row) of a table with counted arrays
    backend: str = "auto",
) -> None:
    """Write -inf where the row's bracket stack refuses a token (see the module docstring)."""
    _check(logits, states, depth, bits, remaining, item_row)
    if resolve_backend(backend, logits.device) == "torch":
        apply_stack_mask_torch(logits, table, stack, states, depth, bits, remaining, item_row)
        return
    if logits.shape[0] == 0:
        return
    on_gpu = logits.device.type == "cuda"
    _stack_mask_kernel[(logits.shape[0],)](
        logits, logits.stride(0), states, depth, bits, remaining, item_row if item_row is not None else depth,
        stack.state_ptr, stack.tok, stack.edge, stack.out_ptr, stack.cond_len, stack.cond_bits, stack.cond_depth,
        stack.pops, stack.push_len, stack.push_bits, stack.next, stack.item_inc, stack.item_flag, stack.item_charge,
        table.dist_entry,
        HAS_ITEMS=item_row is not None, MAX_OUT=stack.max_outcomes, MAX_DEPTH=MAX_STACK_DEPTH,
        BLOCK=256 if on_gpu else 64, num_warps=4, **launch_options(logits.device),
    )  # fmt: skip


def _check(logits, states, depth, bits, remaining, item_row) -> None:
    batch = logits.shape[0]
    specs = [("states", states, torch.int32, (batch,)), ("depth", depth, torch.int32, (batch,)),
             ("bits", bits, torch.int64, (batch,)), ("remaining", remaining, torch.int32, (batch,))]
    if item_row is not None:
        specs.append(("item_row", item_row, torch.int32, (batch, 4)))
    for name, t, dtype, shape in specs:
        if t.dtype != dtype or t.shape != shape or t.device != logits.device or not t.is_contiguous():
            raise KernelInputError(f"Invalid {name}: expected contiguous {dtype} {list(shape)} on {logits.device}, "
                                   f"got {t.dtype} {tuple(t.shape)} on {t.device}")
