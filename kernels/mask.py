"""Grammar mask: set every token a row's grammar state forbids to -inf, in place.

Semantics of xgrammar's `apply_token_bitmask_inplace` (bit j of word w of a state's mask row
allows token 32*w + j; a 0 bit writes -inf; allowed logits are left bit-for-bit alone), with
the mask row gathered from the DeviceTable by each row's state (through `mask_row` and the
deduplicated blocks: kernels/table.py), plus: columns past the table's
bits are -inf on grammar rows, rows with state < 0 or outside `rows` are untouched, and an
optional per-row budget keeps only tokens that can still reach acceptance in time, and on a
table with counted strings per-row `counters` keep lengths in bounds (grammars/table.py). The kernel
has three store forms (STORE_MODE; xgrammar's predicated -inf stores is mode 0), all giving the
same result; `benchmarks/kernels.py --sweep` times them on a GPU and names the fastest, from which
DEFAULT_STORE_MODE is set (until a GPU run does, it is a guess). It does not sample (sample.py does).
"""

from __future__ import annotations

import torch

from surecall.kernels import checks
from surecall.kernels._triton import launch_options, mask_words_triton, resolve_backend, tl, triton
from surecall.kernels.budget import (
    budget_drop_torch,
    budget_keep_triton,
    count_keep_torch,
    count_keep_triton,
)
from surecall.kernels.table import DeviceTable


@triton.jit
def _apply_mask_kernel(
    logits_ptr,  # float [B, L] logits, masked in place
    logits_stride,  # elements between consecutive rows of logits
    width,  # L: columns of logits (may exceed the table's 32 * W bits: the excess is -inf)
    rows_ptr,  # int64 [R] batch rows to mask (read only when HAS_ROWS)
    states_ptr,  # int32 [B] grammar state per row; < 0 leaves the row untouched
    mask_blocks_ptr,  # int32 [K, MASK_BW] distinct blocks of packed allowed-token words, LSB first
    row_blocks_ptr,  # int32 [U, NB] the blocks of each distinct mask row
    mask_row_ptr,  # int32 [S] each state's distinct mask row
    num_words,  # W: packed words per row
    num_row_blocks,  # NB: blocks per row
    remaining_ptr,  # int32 [B] tokens the row may still emit, this one included (HAS_BUDGET)
    max_next_dist_ptr,  # int32 [S] largest dist one step ahead: the budget binds below it
    exc_lo_ptr,  # int32 [S] start of each state's exception row
    exc_hi_ptr,  # int32 [S] its end
    exc_tok_ptr,  # int32 [E] sorted exception tokens per row
    exc_slot_ptr,  # int32 [E] each exception's slot among its state's targets
    exc_base_ptr,  # int32 [S] each state's first target
    exc_targets_ptr,  # int32 [T] exception targets
    trans_default_ptr,  # int32 [S] next state of the other allowed non-stop tokens
    is_stop_ptr,  # int8 [32 * W] 1 for the table's stop ids
    dist_ptr,  # int32 [S] fewest tokens to acceptance
    num_search_steps,  # binary-search iterations over the longest exception row
    counters_ptr,  # int32 [B] characters started in the row's counted body (HAS_COUNTS)
    count_row_ptr,  # int32 [S] row of count_chars, -1 outside counted bodies
    count_lo_ptr,  # int32 [S] minimum characters of the state's body
    count_hi_ptr,  # int32 [S] maximum characters of the state's body
    count_chars_ptr,  # int8 [R, count_cols] 2 * chars + closes per token, -1 never
    count_cols,  # columns of count_chars
    count_fill,  # characters per token towards a minimum
    dist_entry_ptr,  # int32 [S] dist + need(0): charged to tokens that do not stay in a body
    HAS_ROWS: tl.constexpr,  # mask only the rows listed in rows_ptr
    HAS_BUDGET: tl.constexpr,  # apply the remaining-token budget
    HAS_COUNTS: tl.constexpr,  # apply the counters
    BLOCK_WORDS: tl.constexpr,  # packed words per program (32 * BLOCK_WORDS columns)
    STORE_MODE: tl.constexpr,  # 0: -inf where forbidden; 1: read all, write all; 2: read allowed, write all
    MASK_BW: tl.constexpr,  # packed words per mask block (the table's block_words)
):
    if HAS_ROWS:
        row = tl.load(rows_ptr + tl.program_id(0)).to(tl.int64)
    else:
        row = tl.program_id(0).to(tl.int64)
    state = tl.load(states_ptr + row)
    if state >= 0:
        words = tl.program_id(1) * BLOCK_WORDS + tl.arange(0, BLOCK_WORDS)
        mrow = tl.load(mask_row_ptr + state).to(tl.int64)
        packed = mask_words_triton(mask_blocks_ptr, row_blocks_ptr, mrow, words, num_words, num_row_blocks,
                                   words >= 0, MASK_BW)
        bits = tl.arange(0, 32)
        cols = words[:, None] * 32 + bits[None, :]
        keep = ((packed[:, None] >> bits[None, :]) & 1) != 0
        stay_need = tl.full(cols.shape, -1, tl.int32)
        if HAS_COUNTS:
            count_ok, stay_need = count_keep_triton(
                cols, state, tl.load(counters_ptr + row), count_row_ptr, count_lo_ptr,
                count_hi_ptr, count_chars_ptr, count_cols, count_fill,
            )  # fmt: skip
            keep = keep & count_ok
        if HAS_BUDGET:
            rem = tl.load(remaining_ptr + row)
            if rem - 1 < tl.load(max_next_dist_ptr + state):
                keep = keep & budget_keep_triton(
                    cols,
                    state,
                    rem,
                    exc_lo_ptr,
                    exc_hi_ptr,
                    exc_tok_ptr,
                    exc_slot_ptr,
                    exc_base_ptr,
                    exc_targets_ptr,
                    trans_default_ptr,
                    is_stop_ptr,
                    num_words,
                    dist_ptr,
                    dist_entry_ptr,
                    stay_need,
                    num_search_steps,
                )
        ptrs = logits_ptr + row * logits_stride + cols
        in_range = cols < width
        if (
            STORE_MODE == 0
        ):  # xgrammar's form: per-element predicated stores, allowed logits untouched
            tl.store(ptrs, float("-inf"), mask=in_range & (keep == 0))
        else:
            # Write every column back (allowed ones as read, bit for bit): unpredicated stores
            # vectorise to 16 bytes and fill whole sectors, where predicated 2-byte stores touch
            # each sector 8 times and leave partial sectors for HBM to read-modify-write. Mode 2
            # reads only the allowed columns, so a structural row costs little more than its writes.
            if STORE_MODE == 1:
                x = tl.load(ptrs, mask=in_range)
            else:
                x = tl.load(ptrs, mask=in_range & keep)
            tl.store(ptrs, tl.where(keep, x, float("-inf")), mask=in_range)


STORE_MODES = (0, 1, 2)  # the STORE_MODE forms the kernel has (benchmarks/kernels.py --sweep times each)
# The GPU default until a GPU run says otherwise (not measured yet: no GPU run of the sweep so far).
DEFAULT_STORE_MODE = 2


def apply_token_mask_inplace(
    logits: torch.Tensor,  # [B, L] float32 | float16 | bfloat16
    table: DeviceTable,
    states: torch.Tensor,  # [B] int32; < 0 = no grammar on this row
    rows: torch.Tensor | None = None,  # [R] int64: only these rows (default: all)
    remaining: torch.Tensor
    | None = None,  # [B] int32 tokens the row may still emit, this one included
    check: bool = True,
    backend: str = "auto",
    counters: torch.Tensor | None = None,  # [B] int32 characters started in a counted body
) -> None:
    """Set the logits of forbidden tokens to -inf on grammar rows; no host sync when check=False."""
    if check:
        _check_inputs(logits, table, states, rows, remaining, counters)
    if resolve_backend(backend, logits.device) == "torch":
        apply_token_mask_torch(logits, table, states, rows, remaining, counters)
        return
    _launch(logits, table, states, rows, remaining, counters=counters)


def _launch(
    logits,
    table,
    states,
    rows,
    remaining,
    block_words: int | None = None,
    num_warps: int = 4,
    store_mode: int | None = None,
    counters=None,
) -> None:
    """Launch the Triton kernel; the keywords are tuning knobs (benchmarks/kernels.py --sweep)."""
    store_mode = DEFAULT_STORE_MODE if store_mode is None else store_mode
    if isinstance(store_mode, bool) or store_mode not in STORE_MODES:
        raise ValueError(f"Invalid store_mode: expected one of {STORE_MODES}, got {store_mode!r}")
    batch, width = logits.shape
    num_rows = batch if rows is None else rows.shape[0]
    num_cols_words = (width + 31) // 32
    block_words = block_words or _block_words(num_cols_words, logits.device)
    if num_rows == 0 or batch == 0:
        return
    grid = (num_rows, triton.cdiv(num_cols_words, block_words))
    _apply_mask_kernel[grid](
        logits, logits.stride(0), width,
        rows if rows is not None else states, states,
        table.mask_blocks, table.mask_row_blocks, table.mask_row, table.num_words, table.num_row_blocks,
        remaining if remaining is not None else states,
        table.max_next_dist, table.exc_lo, table.exc_hi, table.exc_tok, table.exc_slot, table.exc_base,
        table.exc_targets, table.trans_default,
        table.is_stop, table.dist,
        table.num_search_steps,
        counters if counters is not None else states, table.count_row, table.count_lo, table.count_hi,
        table.count_chars, table.count_cols, table.count_fill, table.dist_entry,
        HAS_ROWS=rows is not None, HAS_BUDGET=remaining is not None,
        HAS_COUNTS=counters is not None and table.has_counts, BLOCK_WORDS=block_words,
        STORE_MODE=store_mode, MASK_BW=table.block_words, num_warps=num_warps, **launch_options(logits.device),
    )  # fmt: skip


def _block_words(num_cols_words: int, device: torch.device) -> int:
    """128 words (4096 columns) per program on GPU, as xgrammar; bigger in the interpreter."""
    cap = 128 if device.type == "cuda" else 512
    return min(cap, triton.next_power_of_2(max(num_cols_words, 1)))


def apply_token_mask_torch(
    logits: torch.Tensor,
    table: DeviceTable,
    states: torch.Tensor,
    rows: torch.Tensor | None = None,
    remaining: torch.Tensor | None = None,
    counters: torch.Tensor | None = None,
) -> None:
    """Torch reference of `apply_token_mask_inplace` (syncs with the host; fine on CPU)."""
    idx = torch.arange(logits.shape[0], device=logits.device) if rows is None else rows.long()
    idx = idx[states[idx] >= 0]
    if idx.numel() == 0:
        return
    st = states[idx].long()
    drop = ~allowed_columns(table, st, logits.shape[1])
    stay_need = None
    if counters is not None and table.has_counts:
        count_ok, stay_need = count_keep_torch(table, st, counters[idx], logits.shape[1])
        drop |= ~count_ok
    if remaining is not None:
        drop |= budget_drop_torch(table, st, remaining[idx], logits.shape[1], stay_need)
    if (
        idx.numel() == logits.shape[0] and rows is None
    ):  # every row: mask in place, no gather/scatter
        logits.masked_fill_(drop, float("-inf"))
    else:
        logits[idx] = logits[idx].masked_fill(drop, float("-inf"))


def allowed_columns(table: DeviceTable, states: torch.Tensor, num_cols: int) -> torch.Tensor:
    """bool [R, num_cols]: the mask bits of each state (>= 0), False past the table's bits."""
    words = table.mask_rows(states)
    bits = torch.arange(32, device=words.device, dtype=torch.int32)
    keep = ((words[:, :, None] >> bits) & 1).bool().reshape(words.shape[0], -1)
    if keep.shape[1] >= num_cols:
        return keep[:, :num_cols]
    pad = torch.zeros(keep.shape[0], num_cols - keep.shape[1], dtype=torch.bool, device=keep.device)
    return torch.cat([keep, pad], dim=1)


def _check_inputs(logits, table, states, rows, remaining, counters=None) -> None:
    checks.check_logits(logits)
    checks.check_table(table, logits)
    batch = logits.shape[0]
    checks.check_vector(states, "states", batch, (torch.int32,), logits.device)
    checks.check_vector(remaining, "remaining", batch, (torch.int32,), logits.device)
    checks.check_counters(counters, table, batch, logits.device)
    checks.check_rows(rows, batch, logits.device)
    checks.check_states(states, table)
    checks.check_nonempty(table, states, remaining, rows)
