"""The CPU sampler: `sample_torch`'s draws, token for token, without full-vocabulary work per grammar row.

A grammar row's allowed set is a function of its state, its counter bounds and its budget. Per
(state, counter bounds) it is computed once (the mask bits through mask.py's accessor, the
state's CSR slice searched once) and kept in a bounded LRU: the allowed ids, sorted (when first needed) by
the budget distance each is charged, so a binding budget keeps a prefix (a bisect, not a pass over
the vocabulary). Host work is numpy (torch's per-op cost dominates at a few rows). Rows that
allow few tokens are drawn on those ids alone (noise, max and logsumexp over them only, batched
as ragged segments); rows that allow many take the dense path (the cached ids of the columns
they forbid are filled with -inf, noise only near each row's top). Tokens are
identical to the reference (same keys, same exact noise pruning, lowest id on ties); logprobs
agree up to float summation order. No top-k/top-p draw here (sample.py's sort path) and no GPU.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from surecall.kernels.mask import allowed_columns
from surecall.kernels.rng import PRUNE_MARGIN, gumbel_numpy, gumbel_torch
from surecall.kernels.table import DeviceTable

NEG_INF = float("-inf")
NO_TOKEN = 1 << 62  # larger than any token id (amin identity)
MAX_HALF = 63  # largest character count an int8 count_chars entry (2 * chars + closes) holds
CACHE_BYTES = 64 << 20  # per table: allowed-set entries beyond this are evicted, least recent first
MAX_STATE_ROWS = 16  # states whose allowed ids and CSR targets are kept for their counter keys
MAX_TABLES = 4  # tables whose caches are kept (the engine uses one concatenated table at a time)


@dataclass
class AllowedSet:
    """One (state, counter bounds) key's allowed tokens; ordered by budget distance then id once
    a binding budget or the sparse draw needs the order (a dense row without a binding budget only
    needs the set: a 128k-id sort per counter value would cost more than the draw)."""

    ids: np.ndarray  # int64 [n] allowed token ids: ascending, or by (dist, id) once is_sorted
    dist: np.ndarray  # int64 [n] tokens to acceptance the budget charges each id (0: not in the CSR)
    is_sorted: bool = False
    outside: torch.Tensor | None = None  # int64 ids of the columns not allowed (made on first dense use)

    @property
    def nbytes(self) -> int:
        return int(self.ids.nbytes + self.dist.nbytes + (0 if self.outside is None else 8 * self.outside.numel()))

    def sort(self) -> None:
        """Order by (dist, id): a stable sort of the ascending ids by dist (radix on small dists)."""
        if self.is_sorted:
            return
        small = self.dist.size and 0 <= int(self.dist.min()) and int(self.dist.max()) < (1 << 15)
        order = np.argsort(self.dist.astype(np.int16) if small else self.dist, kind="stable")
        self.ids, self.dist, self.is_sorted = self.ids[order], self.dist[order], True

    def kept(self, remaining: int | None, binding: bool) -> int:
        """How many ids (a prefix, once sorted) the budget keeps: dist <= remaining - 1 on binding rows."""
        if remaining is None or not binding:
            return int(self.ids.size)
        self.sort()
        return int(np.searchsorted(self.dist, remaining - 1, side="right"))


class TableCache:
    """Allowed sets of one DeviceTable at one logits width, LRU-bounded by bytes (it keeps no
    reference to the table: the module's cache list must not keep dropped tables alive)."""

    def __init__(self, table: DeviceTable, width: int, max_bytes: int = CACHE_BYTES):
        self.width, self.max_bytes = width, max_bytes
        self.entries: OrderedDict = OrderedDict()
        self.rows: OrderedDict = OrderedDict()  # state -> _state_row's tensors
        self.nbytes = 0
        # Host copies of the per-state scalars the per-row keys need (small: [S] each).
        self.count_row = table.count_row.tolist()
        self.count_lo = table.count_lo.tolist()
        self.count_hi = table.count_hi.tolist()
        self.max_next_dist = table.max_next_dist.tolist()

    def key(self, state: int, counter: int | None) -> tuple:
        """(state, p, q): p = hi - counter clamped to [-1, MAX_HALF], q = max(lo - counter, 0).

        count_keep's rule depends on the counter only through these: a token of `half` characters
        stays within the maximum iff half <= p, a closing one reaches the minimum iff half >= q, and
        the need after a staying one is ceil(max(q - half, 0) / fill).
        """
        if counter is None or self.count_row[state] < 0:
            return (state, None, None)
        p = min(max(self.count_hi[state] - counter, -1), MAX_HALF)
        return (state, p, max(self.count_lo[state] - counter, 0))

    def binding(self, state: int, remaining: int | None) -> bool:
        return remaining is not None and remaining - 1 < self.max_next_dist[state]

    def get(self, table: DeviceTable, key: tuple) -> AllowedSet:
        entry = self.entries.get(key)
        if entry is None:
            entry = self._build(table, *key)
            self.entries[key] = entry
            self.nbytes += entry.nbytes
            self._evict()
        else:
            self.entries.move_to_end(key)
        return entry

    def forbidden(self, entry: AllowedSet, kept: int) -> torch.Tensor:
        """int64 ids of the columns the row's first `kept` ids leave out (the dense path fills them):
        those outside the allowed set (made once per entry) and the budget's cut-off tail."""
        if entry.outside is None:
            mask = np.ones(self.width, dtype=bool)
            mask[entry.ids] = False
            entry.outside = torch.from_numpy(np.flatnonzero(mask))
            self.nbytes += 8 * entry.outside.numel()
            self._evict()
        if kept == entry.ids.size:
            return entry.outside
        entry.sort()  # kept < n only under a binding budget, which sorted it already
        return torch.cat([entry.outside, torch.from_numpy(entry.ids[kept:])])

    def _evict(self) -> None:
        while self.nbytes > self.max_bytes and len(self.entries) > 1:
            _, old = self.entries.popitem(last=False)
            self.nbytes -= old.nbytes

    def _build(self, t: DeviceTable, state: int, p: int | None, q: int | None) -> AllowedSet:
        """The reference rule (allowed_columns, count_keep_torch, budget_drop_torch) for one key.

        A counted state gets a key per counter value, so what does not depend on the counter (the
        ids' character counts, next-state distances) is computed once per state (_state_row) and a
        key costs a few numpy passes over the state's ids.
        """
        row = self._state_row(t, state)
        if p is None:  # outside a counted body: every allowed id, charged its next state's entry distance
            return AllowedSet(row.ids, np.where(row.found, row.dist_entry, 0))
        # count_keep_torch with the counter folded into p, q: a token of `half` characters stays
        # within the maximum iff half <= p, a closing one reaches the minimum iff half >= q
        ok = row.counted & (row.half <= p) & (~row.closes | (row.half >= q))
        sel = np.flatnonzero(ok)
        half, closes = row.half[sel], row.closes[sel]
        need = np.maximum(q - half, 0)  # characters still owed after a staying token, in tokens:
        if t.count_fill > 1:
            need = (need + (t.count_fill - 1)) // t.count_fill
        charged = np.where(closes, row.dist_entry[sel], row.dist[sel] + need)
        return AllowedSet(row.ids[sel], np.where(row.found[sel], charged, 0))  # a stop id: kept iff remaining >= 1

    def _state_row(self, t: DeviceTable, state: int) -> _StateRow:
        """One state's allowed ids and what its keys need of them, shared by its counter keys; a
        few states are kept."""
        hit = self.rows.get(state)
        if hit is not None:
            self.rows.move_to_end(state)
            return hit
        ids = torch.nonzero(allowed_columns(t, torch.tensor([state]), self.width)[0]).flatten()
        # The state's exception slice is sorted: one searchsorted, where exc_find_torch loops ~20 steps
        # over every id; the other allowed non-stop ids go to trans_default (next_state_torch's rule).
        lo, end = int(t.exc_lo[state]), int(t.exc_hi[state])
        zeros = torch.zeros_like(ids)
        if end > lo:
            exc = t.exc_tok[lo:end].long()
            pos = torch.searchsorted(exc, ids).clamp(max=end - lo - 1)
            in_exc = exc[pos] == ids
            exc_next = t.exc_targets[int(t.exc_base[state]) + t.exc_slot[lo + pos].long()].long()
        else:
            in_exc, exc_next = torch.zeros(ids.shape, dtype=torch.bool), zeros
        default = int(t.trans_default[state])
        plain = (t.is_stop[ids] == 0) & (default >= 0)
        found = in_exc | plain
        nxt = torch.where(in_exc, exc_next, torch.where(plain, torch.full_like(ids, max(default, 0)), zeros)).numpy()
        row = _StateRow(ids.numpy(), found.numpy(), t.dist.numpy()[nxt].astype(np.int64),
                        t.dist_entry.numpy()[nxt].astype(np.int64))
        r = self.count_row[state]
        if r >= 0:  # a counted body: each id's characters (count_chars: 2 * chars + closes, -1: not a body token)
            v = np.where(row.ids < t.count_cols, t.count_chars.numpy()[r][np.minimum(row.ids, t.count_cols - 1)], -1)
            v = v.astype(np.int32)
            row.counted, row.half, row.closes = v >= 0, v >> 1, (v >= 0) & ((v & 1) == 1)
        self.rows[state] = row
        while len(self.rows) > MAX_STATE_ROWS:
            self.rows.popitem(last=False)
        return row


@dataclass
class _StateRow:
    """A state's allowed ids (ascending) with, per id: in the CSR (else a stop id), the next
    state's distance and entry distance, and on a counted state its character count (half) and
    whether it closes the body."""

    ids: np.ndarray  # int64
    found: np.ndarray  # bool
    dist: np.ndarray  # int64 dist[next state]
    dist_entry: np.ndarray  # int64 dist_entry[next state]
    counted: np.ndarray | None = None  # bool: a body token (count_chars >= 0)
    half: np.ndarray | None = None  # int32 characters the token adds
    closes: np.ndarray | None = None  # bool


_CACHES: OrderedDict = OrderedDict()  # id(table) -> (weakref to the table, width, TableCache)


def table_cache(table: DeviceTable, width: int) -> TableCache:
    """The TableCache of (table, width), made on first use; a few tables are kept, newest last."""
    key = (id(table), width)
    hit = _CACHES.get(key)
    if hit is not None and hit[0]() is table:
        _CACHES.move_to_end(key)
        return hit[1]
    cache = TableCache(table, width)
    _CACHES[key] = (weakref.ref(table, lambda _ref, key=key: _CACHES.pop(key, None)), cache)  # dropped with it
    while len(_CACHES) > MAX_TABLES:
        _CACHES.popitem(last=False)
    return cache


def row_sets(logits, table, states, remaining, counters, sparse_max: int):
    """Per row: ("free", None) | ("sparse", allowed ids int64) | ("dense", forbidden ids int64)."""
    cache = table_cache(table, logits.shape[1])
    st = states.tolist()
    rem = remaining.tolist() if remaining is not None else [None] * len(st)
    cnt = counters.tolist() if counters is not None and table.has_counts else [None] * len(st)
    out = []
    for s, r, c in zip(st, rem, cnt, strict=True):
        if s < 0:
            out.append(("free", None))
            continue
        key = cache.key(s, c)
        entry = cache.get(table, key)
        kept = entry.kept(r, cache.binding(s, r))
        if kept <= sparse_max:
            entry.sort()  # the draw sums in this order: the same order gives the same logprob bits
            out.append(("sparse", torch.from_numpy(entry.ids[:kept])))
        else:
            out.append(("dense", cache.forbidden(entry, kept)))
    return out


def draw_sparse(logits, rows: np.ndarray, ids: list[np.ndarray], inv_t: np.ndarray, temperature: np.ndarray,
                key_a: np.ndarray, key_b: np.ndarray):
    """(tokens int64 [R], logprobs float32 [R]) numpy, for `rows` drawn over their allowed `ids` only.

    The ids of all rows are one flat ragged array (segment = row); max, Gumbel argmax and
    logsumexp are segment reductions, so the cost is the number of allowed ids, not the vocabulary.
    numpy on the host (a few dozen small torch ops cost more than the draw); exp, log and the
    segment sum stay torch ops on the same arrays, so logprobs keep their bits.
    """
    tokens = np.full(len(rows), -1, dtype=np.int64)  # rows that allow nothing keep -1 / -inf
    logprobs = np.full(len(rows), NEG_INF, dtype=np.float32)
    lens = np.fromiter((i.size for i in ids), dtype=np.int64, count=len(ids))
    live = np.flatnonzero(lens)
    if not live.size:
        return tokens, logprobs
    rows_l, lens_l = rows[live], lens[live]
    flat = np.concatenate([ids[i] for i in live])
    starts = np.zeros(live.size, dtype=np.int64)
    np.cumsum(lens_l[:-1], out=starts[1:])
    seg = np.repeat(np.arange(live.size), lens_l)
    at = rows_l[seg]
    x = _gather(logits, at, flat) * inv_t[at]
    top = np.maximum.reduceat(x, starts)
    # 1. keys: x + noise where a token can still win (rng.PRUNE_MARGIN), -inf elsewhere; x on greedy rows
    is_random = (temperature[rows_l] != 0)[seg]
    near = is_random & (x > NEG_INF) & (x >= (top - np.float32(PRUNE_MARGIN))[seg])
    key = np.where(is_random, np.float32(NEG_INF), x)
    pick = np.flatnonzero(near)
    key[pick] = x[pick] + gumbel_numpy(flat[pick], key_a[at[pick]], key_b[at[pick]])
    # 2. argmax per row, lowest id on ties; -1 where nothing is allowed
    best = np.maximum.reduceat(key, starts)
    tok = np.minimum.reduceat(np.where(key == best[seg], flat, NO_TOKEN), starts)
    tok = np.where(best == NEG_INF, -1, tok)
    # 3. logprob under the masked, tempered distribution: x_token - logsumexp over the allowed ids
    safe = np.where(top == NEG_INF, np.float32(0.0), top)
    total = torch.zeros(live.size).index_add_(0, torch.from_numpy(seg), torch.exp(torch.from_numpy(x - safe[seg])))
    x_tok = _gather(logits, rows_l, np.maximum(tok, 0)) * inv_t[rows_l]
    lp = x_tok - (safe + torch.log(total).numpy())
    tokens[live], logprobs[live] = tok, np.where(tok >= 0, lp, np.float32(NEG_INF))
    return tokens, logprobs


def _gather(logits: torch.Tensor, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """float32 logits[rows, cols] (a numpy view of float32 logits; other dtypes gathered, then cast)."""
    if logits.dtype == torch.float32:
        return logits.detach().numpy()[rows, cols]
    return logits[torch.from_numpy(rows), torch.from_numpy(cols)].float().numpy()


def draw_dense(x: torch.Tensor, temperature: np.ndarray, key_a: np.ndarray, key_b: np.ndarray):
    """(tokens int64 [R], logprobs float32 [R]) numpy, for the rows of `x` (float32 [R, width], -inf
    where forbidden): noise only where a token can still win, gathered, then a segment argmax.

    The comparisons and index searches are numpy's (torch's bool compare + nonzero over a 128k row
    cost ~6x more); the max, the noise and the log-softmax are the same ops on the same values.
    """
    xn = x.detach().numpy()
    top = x.amax(dim=1).detach().numpy()
    is_random = temperature != 0
    # Rows with nothing allowed (top = -inf) or greedy get an unreachable threshold: no noise.
    limit = np.where(is_random & (top > NEG_INF), top - np.float32(PRUNE_MARGIN), np.float32(np.inf))
    flat = np.flatnonzero(xn >= limit[:, None])  # row-major: ids ascend per row
    if flat.size * 4 > xn.size:  # flat rows: noise for every column beats gathering most of them
        every = torch.arange(x.shape[1])[None, :]
        a, b = torch.from_numpy(key_a)[:, None], torch.from_numpy(key_b)[:, None]
        key = torch.where(torch.from_numpy(is_random)[:, None], x + gumbel_torch(every, a, b), x)
        tokens = key.max(dim=1).indices.numpy()  # the reference's dense form: the same op on the same keys
    else:
        tokens = _segment_argmax(xn, flat, key_a, key_b)
    greedy = np.flatnonzero(~is_random)
    if greedy.size:  # the reference's argmax: the first (lowest) column of the row's maximum
        tokens[greedy] = xn[greedy].argmax(axis=1)
    tokens = np.where(top == NEG_INF, -1, tokens)
    return tokens, _logprobs_of(x, tokens)


def _logprobs_of(x: torch.Tensor, tokens: np.ndarray) -> np.ndarray:
    """float32 [R]: log_softmax(x)[r, token] (-inf where token < 0), one row at a time (each row's
    temporary stays in cache; the same kernel per row gives the batched call's bits)."""
    out = np.full(len(tokens), NEG_INF, dtype=np.float32)
    for r, t in enumerate(tokens.tolist()):
        if t >= 0:
            out[r] = torch.log_softmax(x[r], dim=0)[t]
    return out


def _segment_argmax(xn: np.ndarray, flat: np.ndarray, key_a: np.ndarray, key_b: np.ndarray) -> np.ndarray:
    """int64 [R]: per row of `xn` ([R, width]), the lowest column of the best x + noise among the
    flat (row-major, ascending) indices `flat`; NO_TOKEN on rows with none."""
    tokens = np.full(xn.shape[0], NO_TOKEN, dtype=np.int64)
    if not flat.size:
        return tokens
    rows, cols = np.divmod(flat, xn.shape[1])
    key = xn.reshape(-1)[flat] + gumbel_numpy(cols, key_a[rows], key_b[rows])
    starts = np.concatenate(([0], np.flatnonzero(rows[1:] != rows[:-1]) + 1))
    best = np.maximum.reduceat(key, starts)
    counts = np.diff(starts, append=flat.size)
    cand = np.where(key == np.repeat(best, counts), cols, NO_TOKEN)
    tokens[rows[starts]] = np.minimum.reduceat(cand, starts)
    return tokens


def masked_scaled(logits, table, states, remaining, counters, inv_t) -> torch.Tensor:
    """float32 [B, width]: sample.py's _masked_scaled (mask(logits) / T, -inf where forbidden) from
    the cached allowed sets; for the sort path (top-k/top-p), which needs the whole row."""
    x = logits.float() * inv_t[:, None]
    for b, (kind, ids) in enumerate(row_sets(logits, table, states, remaining, counters, logits.shape[1])):
        if kind == "sparse":  # every grammar row: sparse_max is the width
            kept = x[b, ids]
            x[b].fill_(NEG_INF)
            x[b, ids] = kept
    return x
