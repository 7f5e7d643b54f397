"""Advance each row's grammar state by its sampled token (default-next lookup on the device).

A non-stop token the state's mask row allows moves the row to its exception's target, or to
the state's default next state when it is no exception (grammars/table.py). A stop id in an
accepting state (its mask bit is set there; never a transition) finishes the row and keeps
its state. Anything else is not allowed by the grammar: the row goes to DEAD_STATE and is
finished (check=True raises instead). Rows with state < 0 (no grammar) keep their state and
finish on a table stop id or a token < 0 (a row whose sampler found nothing). It does not mask
or sample; one lane per row, a fixed-step binary search, no host sync when check=False.
With `counters` (a table with counted strings, grammars/table.py) it also returns each row's
next counter: counter + characters for a token that stays in a counted body, the entry value
(a second binary search, over count_entry_key) for one that moves, unchanged when it ends.
"""

from __future__ import annotations

import numpy as np
import torch

from surecall.errors import KernelInputError
from surecall.kernels import checks
from surecall.kernels._triton import (
    launch_options,
    lower_bound,
    mask_words_triton,
    resolve_backend,
    tl,
    triton,
)
from surecall.kernels.budget import next_state_torch
from surecall.kernels.table import DeviceTable

DEAD_STATE = -2  # a row that took a token its grammar does not allow (only when check=False)


@triton.jit
def _advance_kernel(
    states_ptr,  # int32 [B] current state per row (< 0: no grammar)
    tokens_ptr,  # int64 [B] sampled token per row
    next_ptr,  # int32 [B] out: next state
    finished_ptr,  # int8 [B] out: 1 when the row is done (stop id, invalid token)
    batch,  # B
    mask_blocks_ptr,  # int32 [K, MASK_BW] distinct blocks of packed allowed-token words
    row_blocks_ptr,  # int32 [U, NB] the blocks of each distinct mask row
    mask_row_ptr,  # int32 [S] each state's distinct mask row
    num_words,  # W
    num_row_blocks,  # NB
    accept_ptr,  # int8 [S] accepting states
    is_stop_ptr,  # int8 [32 * W] 1 for the table's stop ids
    exc_lo_ptr,  # int32 [S] start of each state's exception row
    exc_hi_ptr,  # int32 [S] its end
    exc_tok_ptr,  # int32 [E] sorted exception tokens per row
    exc_slot_ptr,  # int32 [E] each exception's slot among its state's targets
    exc_base_ptr,  # int32 [S] each state's first target
    exc_targets_ptr,  # int32 [T] exception targets
    trans_default_ptr,  # int32 [S] next state of the other allowed non-stop tokens (-1: none)
    num_search_steps,  # binary-search iterations over the longest exception row
    counters_ptr,  # int32 [B] characters started in the row's counted body (HAS_COUNTS)
    next_counters_ptr,  # int32 [B] out: the counter after the token (HAS_COUNTS)
    count_row_ptr,  # int32 [S] row of count_chars, -1 outside counted bodies
    count_chars_ptr,  # int8 [R, count_cols] 2 * chars + closes per token, -1 never
    count_cols,  # columns of count_chars
    entry_key_ptr,  # int64 [E] sorted state * logits_width + token of body-opening tokens
    entry_val_ptr,  # int32 [E] the counter such a token sets
    num_entries,  # E
    num_entry_steps,  # binary-search iterations over entry_key
    logits_width,  # the key's state stride
    HAS_COUNTS: tl.constexpr,  # update the counters
    BLOCK: tl.constexpr,  # rows per program, one lane each
    MASK_BW: tl.constexpr,  # packed words per mask block
):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = rows < batch
    state = tl.load(states_ptr + rows, mask=ok, other=-1)
    token = tl.load(tokens_ptr + rows, mask=ok, other=-1).to(tl.int32)
    has_grammar = ok & (state >= 0)
    st = tl.where(has_grammar, state, 0)
    end = tl.load(exc_hi_ptr + st, mask=has_grammar, other=0)
    lo = lower_bound(exc_tok_ptr, tl.load(exc_lo_ptr + st, mask=has_grammar, other=0), end, token, num_search_steps)
    in_row = lo < end
    is_exc = in_row & (tl.load(exc_tok_ptr + lo, mask=in_row, other=-1) == token)
    tok_ok = (token >= 0) & (token < 32 * num_words)
    tok = tl.where(tok_ok, token, 0)
    mrow = tl.load(mask_row_ptr + st, mask=has_grammar, other=0).to(tl.int64)
    word = mask_words_triton(mask_blocks_ptr, row_blocks_ptr, mrow, tok // 32, num_words, num_row_blocks,
                             has_grammar & tok_ok, MASK_BW)
    bit = tok_ok & (((word >> (tok % 32)) & 1) != 0)
    is_accepting = tl.load(accept_ptr + st, mask=has_grammar, other=0) != 0
    is_stop = tl.load(is_stop_ptr + tok, mask=ok & tok_ok, other=0) != 0
    default = tl.load(trans_default_ptr + st, mask=has_grammar, other=-1)
    found = is_exc | (bit & (is_stop == 0) & (default >= 0))
    target_at = tl.load(exc_base_ptr + st, mask=is_exc, other=0) + tl.load(exc_slot_ptr + lo, mask=is_exc, other=0)
    target = tl.where(is_exc, tl.load(exc_targets_ptr + target_at, mask=is_exc, other=0), default)
    stops_here = bit & is_stop & is_accepting
    nxt = tl.where(found, target, tl.where(stops_here, state, -2))
    nxt = tl.where(has_grammar, nxt, state)
    fin = tl.where(has_grammar, found == 0, (token < 0) | is_stop)
    tl.store(next_ptr + rows, nxt, mask=ok)
    tl.store(finished_ptr + rows, fin.to(tl.int8), mask=ok)
    if HAS_COUNTS:
        counter = tl.load(counters_ptr + rows, mask=ok, other=0)
        r = tl.load(count_row_ptr + st, mask=has_grammar, other=-1)
        v = tl.load(
            count_chars_ptr + tl.maximum(r, 0).to(tl.int64) * count_cols + tok,
            mask=found & (r >= 0) & (tok < count_cols),
            other=-1,
        ).to(tl.int32)
        stays = (v >= 0) & ((v & 1) == 0)
        key = st.to(tl.int64) * logits_width + tok
        elo = lower_bound(entry_key_ptr, tl.zeros_like(rows), tl.zeros_like(rows) + num_entries, key, num_entry_steps)
        hit = elo < num_entries
        hit = hit & (tl.load(entry_key_ptr + elo, mask=hit, other=-1) == key)
        entry = tl.load(entry_val_ptr + elo, mask=hit, other=0)
        moved = tl.where(stays, counter + (v >> 1), entry)
        tl.store(next_counters_ptr + rows, tl.where(found, moved, counter), mask=ok)


def advance(
    states: torch.Tensor,  # [B] int32
    tokens: torch.Tensor,  # [B] int64
    table: DeviceTable,
    check: bool = True,
    backend: str = "auto",
    counters: torch.Tensor | None = None,  # [B] int32 characters started in a counted body
):
    """(next_states int32 [B], finished bool [B]), plus next counters int32 [B] when `counters`
    is given; no host sync when check=False."""
    if check:
        _check_inputs(states, tokens, table, counters)
    if resolve_backend(backend, states.device) == "torch":
        few = states.device.type == "cpu" and states.numel() <= HOST_MAX_ROWS
        return (_advance_host if few else advance_torch)(states, tokens, table, counters)
    batch = states.shape[0]
    nxt = torch.empty_like(states)
    finished = torch.empty(batch, dtype=torch.int8, device=states.device)
    next_counters = torch.empty_like(states) if counters is not None else None
    if batch:
        block = 128
        _advance_kernel[(triton.cdiv(batch, block),)](
            states, tokens, nxt, finished, batch,
            table.mask_blocks, table.mask_row_blocks, table.mask_row, table.num_words, table.num_row_blocks,
            table.accept_i8, table.is_stop,
            table.exc_lo, table.exc_hi, table.exc_tok, table.exc_slot, table.exc_base, table.exc_targets,
            table.trans_default, table.num_search_steps,
            counters if counters is not None else states, next_counters if counters is not None else nxt,
            table.count_row, table.count_chars, table.count_cols, table.count_entry_key,
            table.count_entry_val, table.num_entries, table.num_entry_steps, table.logits_width,
            HAS_COUNTS=counters is not None, BLOCK=block, MASK_BW=table.block_words, num_warps=4,
            **launch_options(states.device),
        )  # fmt: skip
    if counters is None:
        return nxt, finished.view(torch.bool)
    return nxt, finished.view(torch.bool), next_counters


def advance_torch(
    states: torch.Tensor, tokens: torch.Tensor, table: DeviceTable, counters: torch.Tensor | None = None
):
    """Torch reference of `advance`."""
    has_grammar = states >= 0
    st = torch.where(has_grammar, states, torch.zeros_like(states)).long()
    tok = tokens.long()
    found, target = next_state_torch(table, st, tok)
    found &= has_grammar
    tok_ok = (tok >= 0) & (tok < 32 * table.num_words)
    safe = torch.where(tok_ok, tok, torch.zeros_like(tok))
    word = table.mask_word(st, safe // 32)
    is_stop = tok_ok & (table.is_stop[safe] != 0)
    stops_here = tok_ok & (((word >> (safe % 32)) & 1) == 1) & table.accept[st] & is_stop
    dead = torch.full_like(st, DEAD_STATE)
    nxt = torch.where(found, target, torch.where(stops_here, states.long(), dead))
    nxt = torch.where(has_grammar, nxt, states.long()).to(torch.int32)
    finished = torch.where(has_grammar, ~found, (tok < 0) | is_stop)
    if counters is None:
        return nxt, finished
    return nxt, finished, _next_counters_torch(table, st, safe, found, counters)


HOST_MAX_ROWS = 64  # up to this many CPU rows, a Python step per row beats ~60 tensor ops


def _advance_host(states: torch.Tensor, tokens: torch.Tensor, table: DeviceTable, counters=None):
    """advance_torch for a few CPU rows, row by row on the host (perf: same results, no op overheads)."""
    starts, ends, etok = table.exc_lo.numpy(), table.exc_hi.numpy(), table.exc_tok.numpy()
    slots, bases, targets = table.exc_slot.numpy(), table.exc_base.numpy(), table.exc_targets.numpy()
    blocks, row_blocks = table.mask_blocks.numpy().view(np.uint32), table.mask_row_blocks.numpy()
    mask_row, default, bw = table.mask_row.numpy(), table.trans_default.numpy(), table.block_words
    accept, is_stop = table.accept.numpy(), table.is_stop.numpy()
    num_bits = 32 * table.num_words
    cnt = counters.tolist() if counters is not None else None
    nxt, fin, moved = [], [], []
    for i, (s, t) in enumerate(zip(states.tolist(), tokens.tolist(), strict=True)):
        tok_ok = 0 <= t < num_bits
        found = False
        if s < 0:
            nxt.append(s)
            fin.append(t < 0 or (tok_ok and bool(is_stop[t])))
        else:
            lo, end = int(starts[s]), int(ends[s])
            j = lo + int(np.searchsorted(etok[lo:end], t)) if tok_ok else lo
            in_exc = tok_ok and j < end and int(etok[j]) == t
            word = int(blocks[row_blocks[mask_row[s], t // 32 // bw], t // 32 % bw]) if tok_ok else 0
            bit = tok_ok and (word >> (t % 32)) & 1 == 1
            stop = tok_ok and bool(is_stop[t])
            plain = bit and not stop and int(default[s]) >= 0
            found = in_exc or plain
            stops_here = bit and bool(accept[s]) and stop
            exc_next = int(targets[int(bases[s]) + int(slots[j])]) if in_exc else 0
            nxt.append(exc_next if in_exc else int(default[s]) if plain else (s if stops_here else DEAD_STATE))
            fin.append(not found)
        if cnt is not None:
            moved.append(_next_counter_host(table, s, t, cnt[i]) if found else cnt[i])
    out = (torch.tensor(nxt, dtype=torch.int32), torch.tensor(fin, dtype=torch.bool))
    return out if cnt is None else (*out, torch.tensor(moved, dtype=torch.int32))


def _next_counter_host(table: DeviceTable, state: int, token: int, counter: int) -> int:
    """_next_counters_torch for one row whose token is a transition of its state."""
    r = int(table.count_row.numpy()[state])
    v = int(table.count_chars.numpy()[r, token]) if r >= 0 and token < table.count_cols else -1
    if v >= 0 and v % 2 == 0:
        return counter + v // 2
    if table.num_entries == 0:
        return 0
    keys = table.count_entry_key.numpy()[: table.num_entries]
    key = state * table.logits_width + token
    at = int(np.searchsorted(keys, key))
    return int(table.count_entry_val.numpy()[at]) if at < keys.shape[0] and int(keys[at]) == key else 0


def _next_counters_torch(table, st, tok, found, counters) -> torch.Tensor:
    r = table.count_row[st].long()
    in_cols = tok < table.count_cols
    v = table.count_chars[r.clamp(min=0), tok.clamp(max=table.count_cols - 1)].long()
    v = torch.where(found & (r >= 0) & in_cols, v, torch.full_like(v, -1))
    stays = (v >= 0) & (v % 2 == 0)
    key = st * table.logits_width + tok
    keys = table.count_entry_key[: max(table.num_entries, 1)]
    at = torch.searchsorted(keys, key).clamp(max=keys.numel() - 1)
    hit = (table.num_entries > 0) & (keys[at] == key)
    entry = torch.where(hit, table.count_entry_val[at].long(), torch.zeros_like(key))
    moved = torch.where(stays, counters.long() + torch.div(v, 2, rounding_mode="floor"), entry)
    return torch.where(found, moved, counters.long()).to(torch.int32)


def _check_inputs(states, tokens, table, counters=None) -> None:
    if not isinstance(table, DeviceTable):
        raise KernelInputError(
            f"table: expected a DeviceTable (DeviceTable.from_table), got {type(table).__name__}"
        )
    if not isinstance(states, torch.Tensor) or states.dim() != 1:
        raise KernelInputError("states: expected a 1-D int32 tensor [batch]")
    checks.check_vector(states, "states", -1, (torch.int32,), table.device)
    checks.check_vector(tokens, "tokens", states.shape[0], (torch.int64,), table.device)
    checks.check_states(states, table)
    if counters is not None or table.has_counts:
        checks.check_counters(counters, table, states.shape[0], table.device)
    nxt = advance_torch(states, tokens, table)[0]
    bad = torch.nonzero(nxt == DEAD_STATE).flatten()
    if bad.numel():
        row = int(bad[0])
        raise KernelInputError(
            f"row {row}: token {int(tokens[row])} is not allowed in state {int(states[row])} "
            f"(neither a transition nor a stop id in an accepting state)"
        )
