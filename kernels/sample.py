"""Fused grammar-masked sampling: mask, temperature, optional top-k/top-p, draw, logprobs.

Policy. The token is drawn from softmax(mask(logits) / T) (top-k then top-p applied to that,
renormalised), by Gumbel-max with counter-based noise keyed by (seed, step, token id) (rng.py),
so a row's token depends only on its logits, seed and step. T = 0 is greedy (argmax, lowest
id on ties). `logprobs` is the sampled token's log-probability under the distribution it was
drawn from (mask, budget, temperature, top-k/top-p); for greedy rows under mask(logits) at
T = 1. `unmasked_logprobs` (optional) is under softmax(logits / T) with no mask and no
top-k/top-p (T = 1 for greedy rows): the model's own policy, which RL needs next to it.
A row whose mask allows nothing gets token -1 and logprob -inf (check=True raises instead).
On a table with counted strings the per-row `counters` join the mask (kernels/mask.py).

Paths. Without top-k/top-p, two Triton kernels and no host sync: a split pass (each program
reduces a fixed-size slice of a row: online logsumexp, Gumbel argmax; it derives the row's RNG
keys from its seed and step itself) and a combine pass. The
slice size depends on the vocabulary width only, never on the batch, so results are batch
invariant. With top-k/top-p, a torch sort path (no host sync either). CPU tensors take
`sample_cpu` (sample_cpu.py): `sample_torch`'s tokens without its full-vocabulary temporaries;
`sample_torch` stays the reference. The file passes 400 lines to keep kernel, launcher and refs together.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from surecall.errors import KernelInputError
from surecall.kernels import checks
from surecall.kernels._triton import launch_options, mask_words_triton, resolve_backend, tl, triton
from surecall.kernels.budget import budget_keep_triton, count_keep_triton
from surecall.kernels.mask import apply_token_mask_inplace, apply_token_mask_torch
from surecall.kernels.rng import (
    GUMBEL_MAX,
    PRUNE_MARGIN,
    gumbel_int64,
    gumbel_torch,
    gumbel_triton,
    row_keys,
    row_keys_host,
    row_keys_int64,
    row_keys_triton,
)
from surecall.kernels.sample_cpu import draw_dense, draw_sparse, masked_scaled, row_sets
from surecall.kernels.table import DeviceTable


@dataclass
class SamplingTensors:
    temperature: torch.Tensor  # float32 [B]; 0 = greedy
    top_k: torch.Tensor  # int32 [B]; 0 = off
    top_p: torch.Tensor  # float32 [B]; 1.0 = off
    seed: torch.Tensor  # int64 [B]
    step: torch.Tensor  # int64 [B]; the row's decode step (part of the RNG counter)
    # Whether any row uses top-k/top-p (takes the sort path). None: found out with one host sync.
    use_top_k_top_p: bool | None = None

    @classmethod
    def build(cls, temperature, top_k, top_p, seed, step, device="cpu") -> SamplingTensors:
        """From Python lists (one entry per row); decides the path on the host, with no sync later."""
        use_sort = any(k > 0 for k in top_k) or any(p < 1.0 for p in top_p)
        return cls(
            temperature=torch.tensor(temperature, dtype=torch.float32, device=device),
            top_k=torch.tensor(top_k, dtype=torch.int32, device=device),
            top_p=torch.tensor(top_p, dtype=torch.float32, device=device),
            seed=torch.tensor(seed, dtype=torch.int64, device=device),
            step=torch.tensor(step, dtype=torch.int64, device=device),
            use_top_k_top_p=use_sort,
        )

    def needs_sort(self) -> bool:
        if self.use_top_k_top_p is None:
            return bool(((self.top_k > 0) | (self.top_p < 1.0)).any())
        return self.use_top_k_top_p


@dataclass
class SampleOutput:
    tokens: torch.Tensor  # int64 [B]; -1 where the row allowed nothing
    logprobs: torch.Tensor  # float32 [B]
    unmasked_logprobs: torch.Tensor | None  # float32 [B] when asked for


@triton.jit
def _sample_split_kernel(
    logits_ptr,  # float [B, L] logits (read only)
    logits_stride,  # elements between consecutive rows
    width,  # L: columns of logits
    states_ptr,  # int32 [B] grammar state per row; < 0 = unconstrained (HAS_TABLE)
    mask_blocks_ptr,  # int32 [K, MASK_BW] distinct blocks of packed allowed-token words
    row_blocks_ptr,  # int32 [U, NB] the blocks of each distinct mask row
    mask_row_ptr,  # int32 [S] each state's distinct mask row
    num_words,  # W
    num_row_blocks,  # NB
    remaining_ptr,  # int32 [B] tokens the row may still emit (HAS_BUDGET)
    max_next_dist_ptr,  # int32 [S] the budget binds when remaining - 1 is below this
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
    inv_temp_ptr,  # float32 [B] 1 / temperature (1 for greedy rows)
    temp_ptr,  # float32 [B] temperature; 0 = greedy (no noise)
    seed_ptr,  # int64 [B] the row's seed (its RNG keys are derived here: rng.row_keys_triton)
    step_ptr,  # int64 [B] the row's decode step
    part_max_ptr,  # float32 [B, P] out: max of masked scaled logits in the slice
    part_sum_ptr,  # float32 [B, P] out: sum of exp(x - max) over the slice
    part_key_ptr,  # float32 [B, P] out: best Gumbel key in the slice
    part_idx_ptr,  # int32 [B, P] out: its token id (-1 if the slice allows nothing)
    part_umax_ptr,  # float32 [B, P] out: as part_max without the mask (HAS_UNMASKED)
    part_usum_ptr,  # float32 [B, P] out: as part_sum without the mask (HAS_UNMASKED)
    split_size,  # columns per slice (a multiple of 32 * BLOCK_WORDS)
    num_splits,  # P
    counters_ptr,  # int32 [B] characters started in the row's counted body (HAS_COUNTS)
    count_row_ptr,  # int32 [S] row of count_chars, -1 outside counted bodies
    count_lo_ptr,  # int32 [S] minimum characters of the state's body
    count_hi_ptr,  # int32 [S] maximum characters of the state's body
    count_chars_ptr,  # int8 [R, count_cols] 2 * chars + closes per token, -1 never
    count_cols,  # columns of count_chars
    count_fill,  # characters per token towards a minimum
    dist_entry_ptr,  # int32 [S] dist + need(0): charged to tokens that do not stay in a body
    HAS_TABLE: tl.constexpr,  # apply the grammar mask
    HAS_BUDGET: tl.constexpr,  # apply the remaining-token budget
    HAS_COUNTS: tl.constexpr,  # apply the counters
    HAS_UNMASKED: tl.constexpr,  # also reduce the unmasked distribution
    BLOCK_WORDS: tl.constexpr,  # packed words per block (32 * BLOCK_WORDS columns)
    MASK_BW: tl.constexpr,  # packed words per mask block (the table's block_words)
):
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    inv_t = tl.load(inv_temp_ptr + row)
    is_random = tl.load(temp_ptr + row) != 0.0
    key_a, key_b = row_keys_triton(tl.load(seed_ptr + row), tl.load(step_ptr + row))
    # Scalars start as typed tensors: compiled Triton needs one type per variable across branches.
    state = tl.full([], -1, tl.int32)
    rem = tl.full([], 0, tl.int32)
    binding = tl.full([], 0, tl.int1)
    counter = tl.full([], 0, tl.int32)
    if HAS_TABLE:
        state = tl.load(states_ptr + row)
        if HAS_COUNTS:
            counter = tl.load(counters_ptr + row)
        if HAS_BUDGET:
            rem = tl.load(remaining_ptr + row)
            binding = (state >= 0) & (rem - 1 < tl.load(max_next_dist_ptr + tl.maximum(state, 0)))
    bits = tl.arange(0, 32)
    offs = tl.arange(0, 32 * BLOCK_WORDS)
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.full([], 0.0, tl.float32)
    um = tl.full([], float("-inf"), tl.float32)
    us = tl.full([], 0.0, tl.float32)
    best = tl.full([], float("-inf"), tl.float32)
    best_idx = tl.full([], -1, tl.int32)
    for start in range(split * split_size, (split + 1) * split_size, 32 * BLOCK_WORDS):
        cols = start + offs
        in_range = cols < width
        xs = (
            tl.load(logits_ptr + row * logits_stride + cols, mask=in_range, other=float("-inf")).to(
                tl.float32
            )
            * inv_t
        )
        if HAS_UNMASKED:  # online logsumexp (written out: nested jit calls are slow interpreted)
            um_new = tl.maximum(um, tl.max(xs, 0))
            safe = tl.where(um_new == float("-inf"), 0.0, um_new)
            us = us * tl.exp(um - safe) + tl.sum(tl.exp(xs - safe), 0)
            um = um_new
        allowed = in_range
        if HAS_TABLE:
            if state >= 0:
                # One load per 32 columns, expanded to bits, as xgrammar's kernel does.
                words = start // 32 + tl.arange(0, BLOCK_WORDS)
                packed = mask_words_triton(mask_blocks_ptr, row_blocks_ptr, tl.load(mask_row_ptr + state).to(tl.int64),
                                           words, num_words, num_row_blocks, words >= 0, MASK_BW)
                bit_set = ((packed[:, None] >> bits[None, :]) & 1) != 0
                allowed = allowed & tl.reshape(bit_set, [32 * BLOCK_WORDS])
                stay_need = tl.full([32 * BLOCK_WORDS], -1, tl.int32)
                if HAS_COUNTS:
                    count_ok, stay_need = count_keep_triton(
                        cols, state, counter, count_row_ptr, count_lo_ptr, count_hi_ptr,
                        count_chars_ptr, count_cols, count_fill,
                    )  # fmt: skip
                    allowed = allowed & count_ok
                if binding:
                    allowed = allowed & budget_keep_triton(
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
        xm = tl.where(allowed, xs, float("-inf"))
        blk_max = tl.max(xm, 0)
        m_new = tl.maximum(m, blk_max)
        safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - safe) + tl.sum(tl.exp(xm - safe), 0)
        m = m_new
        # Gumbel noise is bounded by GUMBEL_MAX: a block that cannot beat the best so far is skipped.
        if (blk_max > float("-inf")) & (blk_max + GUMBEL_MAX >= best):
            key = xm
            if is_random:
                key = xm + gumbel_triton(cols, key_a, key_b)
            blk_best, pos = tl.max(key, 0, return_indices=True, return_indices_tie_break_left=True)
            if blk_best > best:
                best = blk_best
                best_idx = start + pos
    out = row * num_splits + split
    tl.store(part_max_ptr + out, m)
    tl.store(part_sum_ptr + out, s)
    tl.store(part_key_ptr + out, best)
    tl.store(part_idx_ptr + out, best_idx)
    if HAS_UNMASKED:
        tl.store(part_umax_ptr + out, um)
        tl.store(part_usum_ptr + out, us)


@triton.jit
def _sample_combine_kernel(
    logits_ptr,  # float [B, L] logits (read only: one element per row)
    logits_stride,  # elements between consecutive rows
    batch,  # B
    inv_temp_ptr,  # float32 [B] 1 / temperature (1 for greedy rows)
    part_max_ptr,  # float32 [B, P] per-slice max of masked scaled logits (_sample_split_kernel)
    part_sum_ptr,  # float32 [B, P] per-slice sum of exp(x - max)
    part_key_ptr,  # float32 [B, P] per-slice best Gumbel key
    part_idx_ptr,  # int32 [B, P] per-slice token of that key (-1: none allowed)
    part_umax_ptr,  # float32 [B, P] as part_max, unmasked (HAS_UNMASKED)
    part_usum_ptr,  # float32 [B, P] as part_sum, unmasked (HAS_UNMASKED)
    num_splits,  # P
    tokens_ptr,  # int64 [B] out: sampled token, -1 if the row allows nothing
    logprobs_ptr,  # float32 [B] out: logprob under the sampled (masked) distribution
    unmasked_ptr,  # float32 [B] out: logprob under the unmasked distribution (HAS_UNMASKED)
    HAS_UNMASKED: tl.constexpr,
    ROWS: tl.constexpr,  # batch rows per program (the work per row is tiny)
    SPLITS: tl.constexpr,  # next power of two >= P
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < batch
    valid = row_ok[:, None] & (tl.arange(0, SPLITS)[None, :] < num_splits)
    base = rows.to(tl.int64)[:, None] * num_splits + tl.arange(0, SPLITS)[None, :]
    keys = tl.load(part_key_ptr + base, mask=valid, other=float("-inf"))
    idx = tl.load(part_idx_ptr + base, mask=valid, other=2147483647)
    best = tl.max(keys, 1)
    # Lowest id on ties; -1 when every slice allowed nothing.
    token = tl.min(tl.where(valid & (keys == best[:, None]), idx, 2147483647), 1)
    has_token = row_ok & (token >= 0)
    x_tok = tl.load(
        logits_ptr + rows.to(tl.int64) * logits_stride + token, mask=has_token, other=0.0
    )
    x_tok = x_tok.to(tl.float32) * tl.load(inv_temp_ptr + rows, mask=row_ok, other=1.0)
    pm = tl.load(part_max_ptr + base, mask=valid, other=float("-inf"))
    ps = tl.load(part_sum_ptr + base, mask=valid, other=0.0)
    top = tl.max(pm, 1)
    safe = tl.where(top == float("-inf"), 0.0, top)
    total = tl.sum(ps * tl.exp(pm - safe[:, None]), 1)
    lse = safe + tl.log(tl.where(total > 0, total, 1.0))  # empty rows are -inf below anyway
    tl.store(tokens_ptr + rows, token.to(tl.int64), mask=row_ok)
    tl.store(logprobs_ptr + rows, tl.where(has_token, x_tok - lse, float("-inf")), mask=row_ok)
    if HAS_UNMASKED:
        pm = tl.load(part_umax_ptr + base, mask=valid, other=float("-inf"))
        ps = tl.load(part_usum_ptr + base, mask=valid, other=0.0)
        top = tl.max(pm, 1)
        safe = tl.where(top == float("-inf"), 0.0, top)
        total = tl.sum(ps * tl.exp(pm - safe[:, None]), 1)
        ulse = safe + tl.log(tl.where(total > 0, total, 1.0))
        tl.store(unmasked_ptr + rows, tl.where(has_token, x_tok - ulse, float("-inf")), mask=row_ok)


def sample(
    logits: torch.Tensor,  # [B, L] float32 | float16 | bfloat16 (not modified)
    table: DeviceTable | None,
    states: torch.Tensor | None,  # [B] int32; < 0 = no grammar on this row
    params: SamplingTensors,
    remaining: torch.Tensor
    | None = None,  # [B] int32 tokens the row may still emit, this one included
    return_unmasked_logprobs: bool = False,
    check: bool = True,
    backend: str = "auto",
    split_size: int | None = None,  # columns per program on the fused path (tests vary it)
    counters: torch.Tensor | None = None,  # [B] int32 characters started in a counted body
    sync_free: bool = False,  # never touch the host, on CPU too (the captured decode step and its CPU tests)
) -> SampleOutput:
    """Draw one token per row from the masked, tempered distribution; no host sync when check=False
    and `params.use_top_k_top_p` is set (on CPU tensors only with `sync_free`: same tokens)."""
    if check:
        _check_inputs(logits, table, states, params, remaining, counters)
    if table is None:
        states = remaining = counters = None
    path = resolve_backend(backend, logits.device)
    if params.needs_sort():
        return _sample_sorted(
            logits, table, states, params, remaining, return_unmasked_logprobs, path, counters, sync_free
        )
    if path == "torch":
        if logits.device.type == "cpu" and not sync_free:
            return sample_cpu(logits, table, states, params, remaining, return_unmasked_logprobs, counters)
        return sample_torch(logits, table, states, params, remaining, return_unmasked_logprobs, counters, sync_free)
    return _launch(logits, table, states, params, remaining, return_unmasked_logprobs, split_size,
                   counters=counters)


def _inverse_temperature(temperature: torch.Tensor) -> torch.Tensor:
    """1 / T, and 1 for greedy rows (their logprobs are reported at T = 1)."""
    return torch.where(
        temperature > 0, 1.0 / temperature.clamp(min=1e-30), torch.ones_like(temperature)
    )


def _launch(
    logits,
    table,
    states,
    params,
    remaining,
    want_unmasked,
    split_size,
    block_words: int | None = None,
    counters=None,
) -> SampleOutput:
    batch, width = logits.shape
    dev = logits.device
    block_words = block_words or (32 if dev.type == "cuda" else 128)  # bigger blocks interpreted
    block_cols = 32 * block_words
    if split_size is None:
        # 4096 columns per program on GPU: ~32-50 programs per row at real vocabularies, so batch 1
        # still spreads over the SMs; a function of the width only, so draws stay batch invariant.
        split_size = 4096 if dev.type == "cuda" else triton.cdiv(width, block_cols) * block_cols
    split_size = triton.cdiv(split_size, block_cols) * block_cols
    num_splits = triton.cdiv(width, split_size)
    inv_t = _inverse_temperature(params.temperature)
    parts = [torch.empty(batch, num_splits, dtype=torch.float32, device=dev) for _ in range(5)]
    part_idx = torch.empty(batch, num_splits, dtype=torch.int32, device=dev)
    tokens = torch.empty(batch, dtype=torch.int64, device=dev)
    logprobs = torch.empty(batch, dtype=torch.float32, device=dev)
    unmasked = torch.empty(batch, dtype=torch.float32, device=dev) if want_unmasked else None
    if batch == 0:
        return SampleOutput(tokens, logprobs, unmasked)
    has_table = table is not None
    t = table if has_table else _Dummy(dev)
    opts = launch_options(dev)
    _sample_split_kernel[(batch, num_splits)](
        logits, logits.stride(0), width,
        states if has_table else inv_t, t.mask_blocks, t.mask_row_blocks, t.mask_row, t.num_words, t.num_row_blocks,
        remaining if remaining is not None else inv_t,
        t.max_next_dist, t.exc_lo, t.exc_hi, t.exc_tok, t.exc_slot, t.exc_base, t.exc_targets, t.trans_default,
        t.is_stop, t.dist,
        t.num_search_steps,
        inv_t, params.temperature, params.seed, params.step,
        parts[0], parts[1], parts[2], part_idx, parts[3], parts[4],
        split_size, num_splits,
        counters if counters is not None else inv_t, t.count_row, t.count_lo, t.count_hi, t.count_chars,
        t.count_cols, t.count_fill, t.dist_entry,
        HAS_TABLE=has_table, HAS_BUDGET=remaining is not None,
        HAS_COUNTS=has_table and counters is not None and t.has_counts, HAS_UNMASKED=want_unmasked,
        BLOCK_WORDS=block_words, MASK_BW=t.block_words, num_warps=4, **opts,
    )  # fmt: skip
    splits_p2 = max(2, triton.next_power_of_2(num_splits))
    rows_per_program = max(1, min(64, 1024 // splits_p2))
    _sample_combine_kernel[(triton.cdiv(batch, rows_per_program),)](
        logits, logits.stride(0), batch, inv_t,
        parts[0], parts[1], parts[2], part_idx, parts[3], parts[4], num_splits,
        tokens, logprobs, unmasked if want_unmasked else logprobs,
        HAS_UNMASKED=want_unmasked, ROWS=rows_per_program, SPLITS=splits_p2, num_warps=4, **opts,
    )  # fmt: skip
    return SampleOutput(tokens, logprobs, unmasked)


class _Dummy:
    """Stands in for a DeviceTable on unconstrained launches (its tensors are never read)."""

    def __init__(self, dev: torch.device):
        z = torch.zeros(2, dtype=torch.int32, device=dev)
        self.mask_blocks = self.mask_row_blocks = self.mask_row = self.max_next_dist = z
        self.exc_lo = self.exc_hi = self.exc_tok = self.exc_slot = self.exc_base = self.exc_targets = z
        self.dist = self.trans_default = z
        self.is_stop = torch.zeros(2, dtype=torch.int8, device=dev)
        self.count_row = self.count_lo = self.count_hi = self.dist_entry = z
        self.count_chars = torch.zeros(2, dtype=torch.int8, device=dev)
        self.num_words = self.num_row_blocks = self.block_words = 1
        self.num_search_steps = 1
        self.count_cols = self.count_fill = 1
        self.has_counts = False


# ---- torch paths ---------------------------------------------------------------------------
def _masked_scaled(logits, table, states, remaining, inv_t, backend: str, counters=None) -> torch.Tensor:
    """float32 [B, L]: mask(logits) * (1 / T), -inf where forbidden."""
    work = logits.float().clone()
    if table is not None:
        if backend == "torch":
            apply_token_mask_torch(work, table, states, None, remaining, counters)
        else:
            apply_token_mask_inplace(
                work, table, states, remaining=remaining, check=False, backend=backend, counters=counters
            )
    return work * inv_t[:, None]


def _draw(xf: torch.Tensor, temperature: torch.Tensor, params: SamplingTensors, sync_free: bool = False
          ) -> torch.Tensor:
    """Gumbel-max over the rows of `xf` (argmax for greedy rows); -1 where everything is -inf."""
    key_a, key_b = (row_keys_int64 if sync_free else row_keys)(params.seed, params.step)
    is_random = (temperature != 0)[:, None]
    sparse = False
    if xf.device.type == "cpu" and not sync_free:
        # Noise only where a token can still win (rng.PRUNE_MARGIN); same result, far less work,
        # unless most columns are near the top (flat rows): then dense noise beats gathering them.
        top = xf.max(dim=1, keepdim=True).values
        near = (xf > float("-inf")) & (xf >= top - PRUNE_MARGIN) & is_random
        sparse = int(near.sum()) * 4 <= near.numel()
    if sparse:
        rows, cols = torch.nonzero(near, as_tuple=True)
        key = xf.clone()
        key[rows, cols] += gumbel_torch(cols, key_a[rows], key_b[rows])
        key[(xf < top - PRUNE_MARGIN) & is_random] = float("-inf")
    else:  # noise for every column (no host sync on GPU)
        cols = torch.arange(xf.shape[1], device=xf.device)[None, :]
        noise = (gumbel_int64 if sync_free else gumbel_torch)(cols, key_a[:, None], key_b[:, None])
        key = torch.where(is_random, xf + noise, xf)
    best, tok = key.max(dim=1)
    return torch.where(best == float("-inf"), torch.full_like(tok, -1), tok)


def _logprob_of(x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    lp = torch.log_softmax(x, dim=1).gather(1, tokens.clamp(min=0)[:, None])[:, 0]
    return torch.where(tokens >= 0, lp, torch.full_like(lp, float("-inf")))


def sample_torch(
    logits, table, states, params, remaining=None, return_unmasked_logprobs=False, counters=None, sync_free=False
) -> SampleOutput:
    """Torch reference of the fused path (no top-k/top-p)."""
    inv_t = _inverse_temperature(params.temperature)
    xm = _masked_scaled(logits, table, states, remaining, inv_t, "torch", counters)
    tokens = _draw(xm, params.temperature, params, sync_free)
    unmasked = (
        _logprob_of(logits.float() * inv_t[:, None], tokens) if return_unmasked_logprobs else None
    )
    return SampleOutput(tokens, _logprob_of(xm, tokens), unmasked)


# A grammar row allowing at most width / SPARSE_FRACTION tokens is drawn on its allowed ids alone.
SPARSE_FRACTION = 8


def sample_cpu(
    logits, table, states, params, remaining=None, return_unmasked_logprobs=False, counters=None,
    sparse_max: int | None = None,  # allowed ids up to which a row takes the sparse draw (tests vary it)
) -> SampleOutput:
    """sample_torch's tokens on CPU tensors without its full-vocabulary temporaries (sample_cpu.py)."""
    batch, width = logits.shape
    temperature, inv_t, key_a, key_b = host_row_params(params)
    tokens = np.empty(batch, dtype=np.int64)
    logprobs = np.empty(batch, dtype=np.float32)
    # 1. each row's allowed set: none (free), a few ids (sparse) or a cached mask (dense)
    if table is None:
        sets = [("free", None)] * batch
    else:
        sparse_max = width // SPARSE_FRACTION if sparse_max is None else sparse_max
        sets = row_sets(logits, table, states, remaining, counters, sparse_max)
    sparse = [b for b, (kind, _) in enumerate(sets) if kind == "sparse"]
    dense = [b for b, (kind, _) in enumerate(sets) if kind != "sparse"]
    # 2. sparse rows: noise, max and logsumexp over the allowed ids only
    if sparse:
        at = np.array(sparse, dtype=np.int64)
        tokens[at], logprobs[at] = draw_sparse(logits, at, [sets[b][1].numpy() for b in sparse], inv_t, temperature,
                                               key_a, key_b)
    # 3. dense rows: the masked, tempered logits (as _masked_scaled), noise near each row's top
    if dense:
        at = np.array(dense, dtype=np.int64)
        x = (logits if len(dense) == batch else logits[torch.from_numpy(at)]).float()
        masked = any(sets[b][0] == "dense" for b in dense)
        # x * 1 == x: skip the pass, unless the masking below would write into `logits` itself
        if (masked and x is logits) or not bool((inv_t[at] == 1).all()):
            x = x * torch.from_numpy(inv_t[at])[:, None]
        for i, b in enumerate(dense):
            if sets[b][0] == "dense":
                x[i].index_fill_(0, sets[b][1], float("-inf"))
        tokens[at], logprobs[at] = draw_dense(x, temperature[at], key_a[at], key_b[at])
    tokens_t = torch.from_numpy(tokens)
    unmasked = (
        _logprob_of(logits.float() * torch.from_numpy(inv_t)[:, None], tokens_t) if return_unmasked_logprobs else None
    )
    return SampleOutput(tokens_t, torch.from_numpy(logprobs), unmasked)


def host_row_params(params: SamplingTensors):
    """numpy (temperature float32, 1 / T float32 (1 on greedy rows), key_a, key_b uint32) of CPU params:
    _inverse_temperature's and row_keys's values, without a dozen torch ops on a few rows."""
    temperature = params.temperature.numpy()
    inv_t = np.where(temperature > 0, np.float32(1.0) / np.maximum(temperature, np.float32(1e-30)), np.float32(1.0))
    key_a, key_b = row_keys_host(params.seed.numpy(), params.step.numpy())
    return temperature, inv_t.astype(np.float32), key_a, key_b


def _sample_sorted(
    logits, table, states, params, remaining, want_unmasked, backend, counters=None, sync_free=False
) -> SampleOutput:
    """Top-k then top-p on the masked, tempered logits (sort path); greedy rows skip both."""
    inv_t = _inverse_temperature(params.temperature)
    if backend == "torch" and logits.device.type == "cpu" and table is not None and not sync_free:  # cached sets
        xm = masked_scaled(logits, table, states, remaining, counters, inv_t)
    else:
        xm = _masked_scaled(logits, table, states, remaining, inv_t, backend, counters)
    greedy = params.temperature == 0
    top_k = torch.where(greedy, torch.zeros_like(params.top_k), params.top_k).long()
    top_p = torch.where(greedy, torch.ones_like(params.top_p), params.top_p)
    sorted_x, order = xm.sort(dim=1, descending=True, stable=True)
    ranks = torch.arange(xm.shape[1], device=xm.device)[None, :]
    keep = (top_k[:, None] == 0) | (ranks < top_k[:, None])
    probs = torch.softmax(torch.where(keep, sorted_x, float("-inf")), dim=1)
    before = probs.cumsum(dim=1) - probs
    keep &= (top_p[:, None] >= 1.0) | (before < top_p[:, None])
    xf = torch.empty_like(xm).scatter_(1, order, torch.where(keep, sorted_x, float("-inf")))
    tokens = _draw(xf, params.temperature, params, sync_free)
    unmasked = _logprob_of(logits.float() * inv_t[:, None], tokens) if want_unmasked else None
    return SampleOutput(tokens, _logprob_of(xf, tokens), unmasked)


def _check_inputs(logits, table, states, params, remaining, counters=None) -> None:
    checks.check_logits(logits)
    batch, dev = logits.shape[0], logits.device
    if not isinstance(params, SamplingTensors):
        raise KernelInputError(f"params: expected SamplingTensors, got {type(params).__name__}")
    checks.check_vector(params.temperature, "params.temperature", batch, (torch.float32,), dev)
    checks.check_vector(params.top_k, "params.top_k", batch, (torch.int32,), dev)
    checks.check_vector(params.top_p, "params.top_p", batch, (torch.float32,), dev)
    checks.check_vector(params.seed, "params.seed", batch, (torch.int64,), dev)
    checks.check_vector(params.step, "params.step", batch, (torch.int64,), dev)
    if batch and not bool(((params.temperature >= 0) & torch.isfinite(params.temperature)).all()):
        raise KernelInputError("params.temperature: expected finite values >= 0 (0 = greedy)")
    if batch and not bool((params.top_k >= 0).all()):
        raise KernelInputError("params.top_k: expected values >= 0 (0 = off)")
    if batch and not bool(((params.top_p > 0) & (params.top_p <= 1)).all()):
        raise KernelInputError("params.top_p: expected values in (0, 1] (1 = off)")
    if table is None:
        return
    checks.check_table(table, logits)
    checks.check_vector(states, "states", batch, (torch.int32,), dev)
    if states is None:
        raise KernelInputError(
            "states: expected an int32 tensor [batch] when a table is given, got None"
        )
    checks.check_vector(remaining, "remaining", batch, (torch.int32,), dev)
    checks.check_counters(counters, table, batch, dev)
    checks.check_states(states, table)
    checks.check_nonempty(table, states, remaining, None)
