"""Byte DFA x vocabulary -> each state's allowed tokens and the state each leads to.

Walking every token from every state is the whole cost of a compile, so the walk is shared:
- Lexical classes. A state inside a cycle (a JSON string body, a number, whitespace) walks its
  tokens inside its strongly connected component; that walk depends only on the component's
  shape seen from the state (canonically relabelled), not on where the component sits in the
  grammar, so it is computed once per (vocabulary, shape) and cached in `VocabIndex`. Only the
  tokens that leave the component (a `"` and what follows) are walked per state.
- Donors. An acyclic state whose byte row agrees with a lexical-class state on most first bytes
  (the first character of a `minLength: 1` string) copies that state's row for those bytes.
- Everything else is one batched, vectorised numpy walk over (state, token) pairs, pruned by the
  token's first byte. This module does not prune, number or pack anything: `compile.py` does.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import numpy as np

from surecall.grammars.automaton import ByteDFA, strongly_connected, successor_lists

# Lexical regions are the strongly connected components of the DFA without its structural
# edges (these bytes, unless on a self-loop): a string body, a number, a whitespace run, not
# a whole object's member loop. Any partition is exact (leaving a region is walked per state);
# this one keeps regions small and their shapes shared.
_STRUCTURAL = b'"{}[],:'
_MIN_DONOR_TOKENS = 1024  # below this, copying a donor row costs more than walking
_MAX_CACHED_VOCABS = 4


@dataclass
class ClassWalk:
    """All tokens walked from local state 0 of one lexical-class shape."""

    cand: np.ndarray  # int32 [n] candidate token ids, sorted
    end: np.ndarray  # int32 [n] local end state (>= 0), -1 dead, <= -2: left the class from local state -2-end
    exit_pos: np.ndarray  # int32 [n] byte offset of the leaving byte (only where end <= -2)


@dataclass
class VocabIndex:
    """A vocabulary as flat bytes, grouped by first byte, plus the per-shape walk cache."""

    vocab_size: int
    flat: np.ndarray  # uint8 [total bytes] of every normal token, in id order
    off: np.ndarray  # int64 [V] start of each token in `flat`
    lens: np.ndarray  # int64 [V] byte length; 0 for special and empty tokens (never walked)
    first_byte: np.ndarray  # int16 [V] first byte, -1 for tokens never walked
    grp_ptr: np.ndarray  # int64 [257] tokens with first byte b are grp_ids[grp_ptr[b]:grp_ptr[b+1]]
    grp_ids: np.ndarray  # int32 [num normal] ids grouped by first byte, ascending inside a group
    grp_count: np.ndarray  # int64 [256]
    grp2_ptr: np.ndarray  # int64 [257*256+1] the same by (first byte, second byte or 256 for one-byte tokens)
    grp2_ids: np.ndarray  # int32 [num normal]
    grp2_count: np.ndarray  # int64 [257*256]
    classes: dict = field(default_factory=dict)  # shape signature -> ClassWalk

    @staticmethod
    def build(vocab) -> VocabIndex:
        v = vocab.vocab_size
        special = np.zeros(v, dtype=bool)
        special[[i for i in vocab.special_ids if i < v]] = True
        lens = np.fromiter((len(b) for b in vocab.token_bytes), dtype=np.int64, count=v)
        lens[special] = 0
        normal = lens > 0
        flat = np.frombuffer(
            b"".join(b for b, ok in zip(vocab.token_bytes, normal.tolist(), strict=True) if ok), dtype=np.uint8
        )
        off = np.zeros(v, dtype=np.int64)
        off[1:] = np.cumsum(lens)[:-1]
        first_byte = np.full(v, -1, dtype=np.int16)
        ids = np.flatnonzero(normal)
        first_byte[ids] = flat[off[ids]]
        order = ids[np.argsort(first_byte[ids], kind="stable")]
        count = np.bincount(first_byte[ids], minlength=256).astype(np.int64)
        ptr = np.zeros(257, dtype=np.int64)
        ptr[1:] = np.cumsum(count)
        second = np.where(lens[ids] > 1, flat[np.minimum(off[ids] + 1, flat.size - 1)].astype(np.int64), 256)
        key2 = first_byte[ids].astype(np.int64) * 257 + second
        order2 = ids[np.argsort(key2, kind="stable")]
        count2 = np.bincount(key2, minlength=256 * 257).astype(np.int64)
        ptr2 = np.zeros(256 * 257 + 1, dtype=np.int64)
        ptr2[1:] = np.cumsum(count2)
        # Token ids as int32 end to end: the table stores them so, and casting 10^6-long rows costs.
        return VocabIndex(v, flat, off, lens, first_byte, ptr, order.astype(np.int32), count, ptr2,
                          order2.astype(np.int32), count2)

    def tokens_with_first(self, live: np.ndarray) -> np.ndarray:
        """Ids whose first byte b has live[b] (bool [256]), grouped by first byte."""
        return _gather_groups(self, np.flatnonzero(live))


_INDEXES: OrderedDict[str, VocabIndex] = OrderedDict()


def vocab_index(vocab) -> VocabIndex:
    """The VocabIndex of `vocab`, built once per process per vocabulary fingerprint."""
    key = vocab.fingerprint
    if key in _INDEXES:
        _INDEXES.move_to_end(key)
        return _INDEXES[key]
    index = VocabIndex.build(vocab)
    _INDEXES[key] = index
    while len(_INDEXES) > _MAX_CACHED_VOCABS:
        _INDEXES.popitem(last=False)
    return index


def _gather_groups(vi: VocabIndex, bytes_: np.ndarray, two: bool = False) -> np.ndarray:
    """Ids of the first-byte groups `bytes_` (or of the two-byte groups, keys b1*257+b2)."""
    ptr, count, ids = (vi.grp2_ptr, vi.grp2_count, vi.grp2_ids) if two else (vi.grp_ptr, vi.grp_count, vi.grp_ids)
    starts = ptr[bytes_]
    lengths = count[bytes_]
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int32)
    seg_start = np.cumsum(lengths) - lengths
    pos = np.arange(total, dtype=np.int64) + np.repeat(starts - seg_start, lengths)
    return ids[pos]


def walk(trans: np.ndarray, vi: VocabIndex, tok: np.ndarray, state: np.ndarray, pos: np.ndarray):
    """Walk token `tok[i]` from byte `pos[i]` starting in `state[i]` through `trans` (int32 [n, 256]).

    Returns (end state, end byte offset). End state -1: a byte was dead; <= -2: a class exit code
    (the walk stops on it; its byte is at end offset - 1). Vectorised over pairs, compacting the
    active set after every byte so cost follows the bytes actually walked.
    """
    flat_trans = trans.reshape(-1)
    out_state = state.astype(np.int32, copy=True)
    out_ptr = vi.off[tok] + pos
    end = vi.off[tok] + vi.lens[tok]
    idx = np.flatnonzero(out_ptr < end)
    ptr, end, cur = out_ptr[idx], end[idx], out_state[idx].astype(np.int64)
    while idx.size:
        cur = flat_trans[cur * 256 + vi.flat[ptr]].astype(np.int64)
        ptr = ptr + 1
        done = (cur < 0) | (ptr >= end)
        if done.any():
            out_state[idx[done]] = cur[done]
            out_ptr[idx[done]] = ptr[done]
            keep = ~done
            idx, ptr, end, cur = idx[keep], ptr[keep], end[keep], cur[keep]
    return out_state, out_ptr - vi.off[tok]


def _region_shape(dfa: ByteDFA, succ, comp: np.ndarray, root: int):
    """Canonical local table of root's region (BFS from its root), local -> global ids, and its hash.

    Regions built by the same regex construct get the same table, so their walks are shared;
    two isomorphic regions seen from different roots only cost an extra (exact) walk.
    """
    c = comp[root]
    order = [root]
    seen = {root}
    queue = deque([root])
    while queue:
        s = queue.popleft()
        for t in succ[s]:
            if comp[t] == c and t not in seen:
                seen.add(t)
                order.append(t)
                queue.append(t)
    g = np.asarray(order, dtype=np.int64)
    local = np.full(dfa.num_states + 1, -1, dtype=np.int64)
    local[g] = np.arange(g.size)
    rows = dfa.trans[g].astype(np.int64)
    inside = local[rows] >= 0  # rows == -1 indexes the sentinel slot, which stays -1
    exits = -2 - np.arange(g.size, dtype=np.int64)[:, None]
    table = np.where(rows < 0, -1, np.where(inside, local[rows], exits)).astype(np.int32)
    sig = hashlib.blake2b(table.tobytes(), digest_size=16).digest() + g.size.to_bytes(4, "little")
    return table, g, sig


def _class_walk(vi: VocabIndex, table: np.ndarray, sig: bytes, start: int) -> ClassWalk:
    """Every token walked from local state `start` of a region table (cached per vocabulary)."""
    key = sig + start.to_bytes(4, "little")
    hit = vi.classes.get(key)
    if hit is not None:
        return hit
    cand = np.sort(vi.tokens_with_first(table[start] >= 0))
    begin = np.full(cand.size, start, np.int32)
    end, end_pos = walk(table, vi, cand, begin, np.zeros(cand.size, np.int64))
    result = ClassWalk(cand=cand, end=end, exit_pos=(end_pos - 1).astype(np.int32))
    vi.classes[key] = result
    return result


def lexical_regions(dfa: ByteDFA):
    """(successor lists without structural edges, region id per state, whether its region cycles)."""
    trans = dfa.trans.copy()
    self_loop = np.arange(dfa.num_states, dtype=np.int32)
    for b in _STRUCTURAL:
        col = trans[:, b]
        col[col != self_loop] = -1
    succ = successor_lists(trans)
    comp, comp_cyclic = strongly_connected(succ)
    return succ, comp, comp_cyclic[comp]


def token_rows(dfa: ByteDFA, vi: VocabIndex) -> list[tuple[np.ndarray, np.ndarray]]:
    """For every DFA state: (candidate token ids sorted, int32 next states, -1 where dead)."""
    succ, comp, cyclic = lexical_regions(dfa)
    live = dfa.trans >= 0  # [S, 256]
    walk_bytes = live.copy()  # first bytes still to walk generically, per state
    shared: list = [None] * dfa.num_states  # rows from class walks or donors
    # 1. Lexical-class states: shared class walk for first bytes that stay inside, then the
    #    tokens that leave the class later on, per state.
    exit_jobs = []  # (state, positions in its row, tokens, global start states, byte offsets)
    shapes: dict[int, tuple] = {}  # region id -> (table, local -> global, signature, global -> local)
    for q in np.flatnonzero(cyclic).tolist():
        if comp[q] not in shapes:  # states are BFS-numbered: q is the region's first-reached state
            table, g, sig = _region_shape(dfa, succ, comp, q)
            shapes[comp[q]] = (table, g, sig, {int(x): i for i, x in enumerate(g.tolist())})
        table, g, sig, local = shapes[comp[q]]
        start = local[q]
        cw = _class_walk(vi, table, sig, start)
        nexts = np.full(cw.cand.size, -1, dtype=np.int32)
        stay = cw.end >= 0
        nexts[stay] = g[cw.end[stay]]
        leave = np.flatnonzero(cw.end <= -2)
        if leave.size:  # tokens that leave the region: walked per state from where they leave
            exit_jobs.append((q, leave, cw.cand[leave], g[-2 - cw.end[leave]], cw.exit_pos[leave]))
        shared[q] = (cw.cand, nexts)
        walk_bytes[q] &= table[start] < -1
    _run_exit_jobs(dfa, vi, shared, exit_jobs)
    # 2. Acyclic states: copy from a donor where the byte rows agree.
    _choose_donors_inplace(dfa, vi, shared, cyclic, walk_bytes)
    # 3. Everything left: one batched walk, pruned by the first two bytes.
    walked = _walk_generic(dfa, vi, walk_bytes)
    return [_merge(shared[q], walked.get(q)) for q in range(dfa.num_states)]


def _run_exit_jobs(dfa, vi, rows, jobs) -> None:
    if not jobs:
        return
    tok = np.concatenate([j[2] for j in jobs])
    start = np.concatenate([j[3] for j in jobs]).astype(np.int32)
    pos = np.concatenate([j[4] for j in jobs]).astype(np.int64)
    end, _ = walk(dfa.trans, vi, tok, start, pos)
    at = 0
    for q, leave, *_ in jobs:
        rows[q][1][leave] = end[at : at + leave.size]
        at += leave.size


def _choose_donors_inplace(dfa, vi, shared, cyclic, walk_bytes) -> None:
    """Fill `shared` for acyclic states from the best-agreeing class row; clear those bytes.

    Candidate donors are the region states a state's live bytes lead to (the first character
    of a `minLength: 1` string leads into the body whose row it mostly shares).
    """
    is_donor = np.zeros(dfa.num_states + 1, dtype=bool)  # slot -1 (dead) stays False
    for q in np.flatnonzero(cyclic).tolist():
        is_donor[q] = shared[q][0].size >= _MIN_DONOR_TOKENS
    for q in np.flatnonzero(~cyclic).tolist():
        row = dfa.trans[q]
        targets = np.unique(row[walk_bytes[q]])
        donors = targets[is_donor[targets]]
        if not donors.size:
            continue
        # Only bytes the donor's shared row covers: its first bytes that leave its region are
        # walked later (walk_bytes[donor]) and are not in shared[donor] yet.
        agree = (dfa.trans[donors] == row) & walk_bytes[q] & ~walk_bytes[donors]  # [D, 256]
        weight = agree.astype(np.int64) @ vi.grp_count
        best = int(np.argmax(weight))
        if weight[best] < _MIN_DONOR_TOKENS:
            continue
        cand, nexts = shared[int(donors[best])]
        sel = agree[best][vi.first_byte[cand]]
        shared[q] = (cand[sel], nexts[sel])
        walk_bytes[q] &= ~agree[best]


def _walk_generic(dfa, vi, walk_bytes) -> dict[int, tuple]:
    """Walk (state, token) pairs whose first two bytes are live, all states in one batch."""
    qi, bi = np.nonzero(walk_bytes)
    if not qi.size:
        return {}
    # Second bytes live after (q, b), plus the one-byte token b itself (key b*257+256).
    mid = dfa.trans[qi, bi]
    live2 = np.concatenate([dfa.trans[mid] >= 0, np.ones((qi.size, 1), dtype=bool)], axis=1)  # [P, 257]
    pi, b2 = np.nonzero(live2)
    keys = bi[pi].astype(np.int64) * 257 + b2
    counts = vi.grp2_count[keys]
    tok = _gather_groups(vi, keys, two=True)
    state = np.repeat(qi[pi], counts).astype(np.int32)
    end, _ = walk(dfa.trans, vi, tok, state, np.zeros(tok.size, np.int64))
    ok = end >= 0
    state, tok, end = state[ok], tok[ok], end[ok]
    order = np.lexsort((tok, state))
    state, tok, end = state[order], tok[order], end[order]
    states = np.unique(state)
    lo = np.searchsorted(state, states, side="left")
    hi = np.searchsorted(state, states, side="right")
    return {int(q): (tok[a:b], end[a:b]) for q, a, b in zip(states.tolist(), lo.tolist(), hi.tolist(), strict=True)}


def _merge(a, b):
    """Union of two sorted rows with disjoint tokens (b is usually the small one)."""
    if a is None and b is None:
        return (np.zeros(0, np.int32), np.zeros(0, np.int32))
    if a is None or b is None:
        return a if b is None else b
    if b[0].size > a[0].size:
        a, b = b, a
    at = np.searchsorted(a[0], b[0])
    return np.insert(a[0], at, b[0]), np.insert(a[1], at, b[1])
