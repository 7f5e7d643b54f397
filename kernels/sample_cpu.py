"""The CPU sampler: `sample_torch`'s draws, token for token, without full-vocabulary work per grammar row.

A grammar row's allowed set is a function of its state, its counter bounds and its budget. Per
(state, counter bounds) it is computed once (the mask bits through mask.py's accessor, the
state's CSR slice searched once) and kept in a bounded LRU: the allowed ids sorted by the budget distance each is
charged, so a binding budget keeps a prefix (a bisect, not a pass over the vocabulary). Rows that
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
from surecall.kernels.rng import PRUNE_MARGIN, gumbel_torch
from surecall.kernels.table import DeviceTable

NEG_INF = float("-inf")
NO_TOKEN = 1 << 62  # larger than any token id (amin identity)
MAX_HALF = 63  # largest character count an int8 count_chars entry (2 * chars + closes) holds
CACHE_BYTES = 64 << 20  # per table: allowed-set entries beyond this are evicted, least recent first
MAX_STATE_ROWS = 16  # states whose allowed ids and CSR targets are kept for their counter keys
MAX_TABLES = 4  # tables whose caches are kept (the engine uses one concatenated table at a time)


@dataclass
class AllowedSet:
    """One (state, counter bounds) key's allowed tokens, ordered by budget distance then id."""

    ids: torch.Tensor  # int64 [n] allowed token ids, sorted by (dist, id)
    dist: np.ndarray  # int64 [n] tokens to acceptance the budget charges each id (0: not in the CSR)
    outside: torch.Tensor | None = None  # int64 ids of the columns not allowed (made on first dense use)

    @property
    def nbytes(self) -> int:
        return int(8 * self.ids.numel() + self.dist.nbytes + (0 if self.outside is None else 8 * self.outside.numel()))

    def kept(self, remaining: int | None, binding: bool) -> int:
        """How many ids (a prefix) the budget keeps: dist <= remaining - 1 on binding rows."""
        if remaining is None or not binding:
            return int(self.ids.numel())
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
            mask = torch.ones(self.width, dtype=torch.bool)
            mask[entry.ids] = False
            entry.outside = torch.nonzero(mask).flatten()
            self.nbytes += 8 * entry.outside.numel()
            self._evict()
        if kept == entry.ids.numel():
            return entry.outside
        return torch.cat([entry.outside, entry.ids[kept:]])

    def _evict(self) -> None:
        while self.nbytes > self.max_bytes and len(self.entries) > 1:
            _, old = self.entries.popitem(last=False)
            self.nbytes -= old.nbytes

    def _build(self, t: DeviceTable, state: int, p: int | None, q: int | None) -> AllowedSet:
        """The reference rule (allowed_columns, count_keep_torch, budget_drop_torch) for one key."""
        ids, found, nxt = self._state_row(t, state)
        stay_need = torch.full_like(ids, -1)
        if p is not None:  # inside a counted body (count_keep_torch with counter folded into p, q)
            r = self.count_row[state]
            in_cols = ids < t.count_cols
            v = t.count_chars[r, ids.clamp(max=t.count_cols - 1)].long()
            v = torch.where(in_cols, v, torch.full_like(v, -1))
            half, closes = torch.div(v, 2, rounding_mode="floor"), (v >= 0) & (v % 2 == 1)
            ok = (v >= 0) & (half <= p) & (~closes | (half >= q))
            need = torch.div((q - half).clamp(min=0) + t.count_fill - 1, t.count_fill, rounding_mode="floor")
            ids, found, nxt = ids[ok], found[ok], nxt[ok]
            stay_need = torch.where(~closes[ok], need[ok], torch.full_like(need[ok], -1))
        charged = torch.where(stay_need >= 0, t.dist[nxt].long() + stay_need, t.dist_entry[nxt].long())
        dist = torch.where(found, charged, torch.zeros_like(charged))  # a stop id: kept iff remaining >= 1
        dist, order = torch.sort(dist, stable=True)  # ids are ascending: ties stay in id order
        return AllowedSet(ids[order].contiguous(), dist.numpy())

    def _state_row(self, t: DeviceTable, state: int):
        """(allowed ids int64, in the CSR bool, next state int64 (0 where not)) of one state, shared
        by its counter keys; a few states are kept."""
        hit = self.rows.get(state)
        if hit is not None:
            self.rows.move_to_end(state)
            return hit
        ids = torch.nonzero(allowed_columns(t, torch.tensor([state]), self.width)[0]).flatten()
        # The state's exception slice is sorted: one searchsorted, where exc_find_torch loops ~20 steps
        # over every id; the other allowed non-stop ids go to trans_default (next_state_torch's rule).
        lo, end = int(t.exc_ptr[state]), int(t.exc_ptr[state + 1])
        zeros = torch.zeros_like(ids)
        if end > lo:
            row = t.exc_tok[lo:end].long()
            pos = torch.searchsorted(row, ids).clamp(max=end - lo - 1)
            in_exc, exc_next = row[pos] == ids, t.exc_next[lo + pos].long()
        else:
            in_exc, exc_next = torch.zeros(ids.shape, dtype=torch.bool), zeros
        default = int(t.trans_default[state])
        plain = (t.is_stop[ids] == 0) & (default >= 0)
        found = in_exc | plain
        nxt = torch.where(in_exc, exc_next, torch.where(plain, torch.full_like(ids, max(default, 0)), zeros))
        self.rows[state] = (ids, found, nxt)
        while len(self.rows) > MAX_STATE_ROWS:
            self.rows.popitem(last=False)
        return ids, found, nxt


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
            out.append(("sparse", entry.ids[:kept]))
        else:
            out.append(("dense", cache.forbidden(entry, kept)))
    return out


def draw_sparse(logits, rows: list[int], ids: list[torch.Tensor], inv_t, temperature, key_a, key_b):
    """(tokens int64 [R], logprobs float32 [R]) for `rows` drawn over their allowed `ids` only.

    The ids of all rows are one flat ragged array (segment = row); max, Gumbel argmax and
    logsumexp are segment reductions, so the cost is the number of allowed ids, not the vocabulary.
    """
    num = len(rows)
    rows_t = torch.tensor(rows, dtype=torch.int64)
    lens = torch.tensor([i.numel() for i in ids], dtype=torch.int64)
    flat = torch.cat(ids) if ids else torch.zeros(0, dtype=torch.int64)
    seg = torch.repeat_interleave(torch.arange(num), lens)
    at = rows_t[seg]
    x = logits[at, flat].float() * inv_t[at]
    top = torch.full((num,), NEG_INF).scatter_reduce_(0, seg, x, "amax")
    # 1. keys: x + noise where a token can still win (rng.PRUNE_MARGIN), -inf elsewhere; x on greedy rows
    is_random = (temperature[rows_t] != 0)[seg]
    near = is_random & (x > NEG_INF) & (x >= top[seg] - PRUNE_MARGIN)
    key = torch.where(is_random, torch.full_like(x, NEG_INF), x)
    pick = torch.nonzero(near).flatten()
    key[pick] = x[pick] + gumbel_torch(flat[pick], key_a[at[pick]], key_b[at[pick]])
    # 2. argmax per row, lowest id on ties; -1 where nothing is allowed
    best = torch.full((num,), NEG_INF).scatter_reduce_(0, seg, key, "amax")
    cand = torch.where(key == best[seg], flat, torch.full_like(flat, NO_TOKEN))
    tokens = torch.full((num,), NO_TOKEN, dtype=torch.int64).scatter_reduce_(0, seg, cand, "amin")
    tokens = torch.where(best == NEG_INF, torch.full_like(tokens, -1), tokens)
    # 3. logprob under the masked, tempered distribution: x_token - logsumexp over the allowed ids
    safe = torch.where(top == NEG_INF, torch.zeros_like(top), top)
    total = torch.zeros(num).index_add_(0, seg, torch.exp(x - safe[seg]))
    x_tok = logits[rows_t, tokens.clamp(min=0)].float() * inv_t[rows_t]
    logprobs = torch.where(tokens >= 0, x_tok - (safe + torch.log(total)), torch.full_like(x_tok, NEG_INF))
    return tokens, logprobs


def draw_dense(x: torch.Tensor, temperature, key_a, key_b):
    """(tokens int64 [R], logprobs float32 [R]) for the rows of `x` (float32 [R, width], -inf where
    forbidden): noise only where a token can still win, gathered, then a segment argmax."""
    top = x.amax(dim=1)
    is_random = temperature != 0
    # Rows with nothing allowed (top = -inf) or greedy get an unreachable threshold: no noise.
    limit = torch.where(is_random & (top > NEG_INF), top - PRUNE_MARGIN, torch.full_like(top, float("inf")))
    rows, cols = torch.nonzero(x >= limit[:, None], as_tuple=True)  # row-major: ids ascend per row
    if rows.numel() * 4 > x.numel():  # flat rows: noise for every column beats gathering most of them
        every = torch.arange(x.shape[1])[None, :]
        key = torch.where(is_random[:, None], x + gumbel_torch(every, key_a[:, None], key_b[:, None]), x)
        tokens = key.max(dim=1).indices  # the reference's dense form: the same op on the same keys
    else:
        tokens = _segment_argmax(x, rows, cols, key_a, key_b)
    greedy = torch.nonzero(~is_random).flatten()
    if greedy.numel():  # the reference's argmax (same op on the same row: same tie rule)
        tokens[greedy] = x[greedy].max(dim=1).indices
    tokens = torch.where(top == NEG_INF, torch.full_like(tokens, -1), tokens)
    logprobs = torch.log_softmax(x, dim=1).gather(1, tokens.clamp(min=0)[:, None])[:, 0]
    return tokens, torch.where(tokens >= 0, logprobs, torch.full_like(logprobs, NEG_INF))


def _segment_argmax(x, rows, cols, key_a, key_b) -> torch.Tensor:
    """int64 [R]: per row, the lowest column of the best x + noise among the (rows, cols) gathered."""
    key = x[rows, cols] + gumbel_torch(cols, key_a[rows], key_b[rows])
    num = x.shape[0]
    best = torch.full((num,), NEG_INF).scatter_reduce_(0, rows, key, "amax")
    cand = torch.where(key == best[rows], cols, torch.full_like(cols, NO_TOKEN))
    return torch.full((num,), NO_TOKEN, dtype=torch.int64).scatter_reduce_(0, rows, cand, "amin")


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
