"""Byte DFA x vocabulary -> each state's allowed tokens and the state each leads to.

Walking every token from every state is the whole cost of a compile, so the walk is shared:
- Lexical classes. A state inside a cycle (a JSON string body, a number, whitespace) walks its
  tokens inside its strongly connected component; that walk depends only on the component's
  shape seen from the state (canonically relabelled), not on where the component sits in the
  grammar, so it is computed once per (vocabulary, shape) and cached in `VocabIndex`. Only the
  tokens that leave the component (a `"` and what follows) are walked per state.
- Donors. An acyclic state whose byte row agrees with a lexical-class state on most first bytes
  (the first character of a `minLength: 1` string) copies that state's row for those bytes.
- Chains. The acyclic class positions left (a JSON number's bounded digits, `[0-9]{0,14}`) are
  cut into short chains walked like lexical classes (by shape, cached), their rows shared alike.
- Everything else is one batched, vectorised numpy walk over (state, token) pairs, pruned by the
  token's first two bytes, with no compaction (pairs in decreasing token length).
A state's `Row` keeps its class part shared (the class walk plus its region's id map) next to
its own extra tokens, so `compile.py` derives a class part's default next state and exceptions
once and copies its packed mask words whole. This module does not prune, number or pack anything: `compile.py` does.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import numpy as np

from surecall.grammars.automaton import ByteDFA, Digraph, range_indices, strongly_connected

# Lexical regions are the strongly connected components of the DFA without its structural
# edges (these bytes, unless on a self-loop): a string body, a number, a whitespace run, not
# a whole object's member loop. Any partition is exact (leaving a region is walked per state);
# this one keeps regions small and their shapes shared.
_STRUCTURAL = b'"{}[],:'
_MIN_DONOR_TOKENS = 1024  # below this, copying a donor row costs more than walking
_MAX_CACHED_VOCABS = 4


@dataclass
class ClassWalk:
    """Every token walked from one local state of one lexical-class shape, split by outcome.

    `tok`/`end` are the tokens that stay inside the class (shared verbatim by every state of
    that shape); `leave_*` are those that leave it, walked on per state from where they leave.
    """

    tok: np.ndarray  # int32 sorted ids of the tokens that end inside the class
    end: np.ndarray  # int32 their local end states
    ends: np.ndarray  # int64 distinct local end states
    words: np.ndarray  # uint32 [ceil(vocab_size / 32)] LSB-first bitmask of `tok`
    first_bytes: np.ndarray  # bool [256] first bytes among `tok`
    leave_tok: np.ndarray  # int32 sorted ids of the tokens that leave the class
    leave_local: np.ndarray  # int64 local state they leave from
    leave_pos: np.ndarray  # int64 byte offset of the leaving byte
    quoted_tok: np.ndarray  # int32 sorted: the ids among `tok` whose bytes hold a `"` (counted.check_entries)
    # what a table derives from the walk (compile.py), kept with it: a walk is cached per vocabulary,
    # so the next grammar with this class reuses them too
    derived: dict = field(default_factory=dict, repr=False, compare=False)

    def end_counts(self) -> np.ndarray:
        """int64 tokens per local end state, aligned with `ends`."""
        counts = self.derived.get("end_counts")
        if counts is None:
            counts = self.derived["end_counts"] = np.bincount(self.end)[self.ends] if self.ends.size else self.ends
        return counts

    def most_common_end(self) -> int:
        """The local end state most tokens reach, the smallest on a tie; -1 when none stays."""
        end = self.derived.get("most_common_end")
        if end is None:
            counts = self.end_counts()
            end = self.derived["most_common_end"] = int(self.ends[np.argmax(counts)]) if counts.size else -1
        return end

    def without_first_bytes(self, drop: np.ndarray, vi: VocabIndex) -> ClassWalk:
        """The walk of the tokens whose first byte is not in `drop` (bool [256]); no leaving tokens
        (a donated row walks those itself). Not cached here: the caller keeps it for one walk."""
        keep = ~drop[vi.first_byte[self.tok]]
        tok, end = self.tok[keep], self.end[keep]
        bits = np.zeros((vi.vocab_size + 31) // 32 * 32, dtype=bool)
        bits[tok] = True
        quoted = self.quoted_tok[np.isin(self.quoted_tok, tok, assume_unique=True)]
        none = np.zeros(0, dtype=np.int64)
        return ClassWalk(tok=tok, end=end, ends=np.unique(end).astype(np.int64),
                         words=np.packbits(bits, bitorder="little").view(np.uint32),
                         first_bytes=self.first_bytes & ~drop, leave_tok=none.astype(np.int32), leave_local=none,
                         leave_pos=none, quoted_tok=quoted)

    def not_ending_at(self, local: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, their local ends) of the tokens that do not end at local state `local`."""
        key = ("not_ending_at", local)
        if key not in self.derived:
            keep = self.end != local
            self.derived[key] = (self.tok, self.end) if keep.all() else (self.tok[keep], self.end[keep])
        return self.derived[key]


@dataclass
class Row:
    """One DFA state's tokens: a shared class part (`base` seen through `g`) plus its own extras."""

    base: ClassWalk | None  # tokens staying in a class region, next state g[base.end]
    g: np.ndarray | None  # int64 local -> global state ids of base's region
    tok: np.ndarray  # int32 sorted extra token ids, disjoint from base.tok
    nxt: np.ndarray  # int32 their next states (all >= 0)

    @property
    def size(self) -> int:
        return self.tok.size + (0 if self.base is None else self.base.tok.size)

    def materialize(self) -> tuple[np.ndarray, np.ndarray]:
        """(sorted token ids, next states) of the whole row."""
        if self.base is None:
            return self.tok, self.nxt
        return merge_rows((self.base.tok, self.g[self.base.end].astype(np.int32)), (self.tok, self.nxt))


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
    has_quote: np.ndarray  # bool [V]: the token's bytes hold a `"` (only those can open or close a string)
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
        quotes = np.concatenate([[0], np.cumsum(flat == ord('"'))])
        has_quote = quotes[off + lens] > quotes[off]
        # Token ids as int32 end to end: the table stores them so, and casting 10^6-long rows costs.
        return VocabIndex(v, flat, off, lens, first_byte, ptr, order.astype(np.int32), count, ptr2,
                          order2.astype(np.int32), count2, has_quote)

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
    if not lengths.sum():
        return np.zeros(0, dtype=np.int32)
    pos = range_indices(starts, lengths)
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


_LAST_EXTENDED: list = [(None, None)]  # walk_region's last (region table, its extension)


def walk_region(table: np.ndarray, vi: VocabIndex, tok: np.ndarray, start: int):
    """`walk(table, vi, tok, start, 0)` for a region table (class exit codes allowed), in two passes.

    First every token is walked whole, without compaction (walk_whole's order by length), through
    `table` extended with absorbing rows: a dead one and one per exit code, so a walk that stops
    keeps where and why it stopped. Only the tokens that leave are then walked again by `walk`,
    for the byte offset they leave at. A class walk mostly keeps or kills its tokens, so this is
    3-4x faster than compacting the active set after every byte (Github_trivial o40225's 78k
    candidates of a `[a-zA-Z]` class: 16.8 -> 4.3 ms).
    """
    n = table.shape[0]
    last = _LAST_EXTENDED[0]  # a region's states are walked one after the other: extend its table once
    if last[0] is table:
        ext = last[1]
    else:
        ext = np.empty((2 * n + 1, 256), dtype=np.int64)
        ext[:n] = np.where(table >= 0, table, np.where(table == -1, n, n - 1 - table.astype(np.int64)))
        ext[n:] = np.arange(n, 2 * n + 1, dtype=np.int64)[:, None]  # dead n, exit from local i: n + 1 + i
        ext = ext.reshape(-1)
        _LAST_EXTENDED[0] = (table, ext)  # (holding the table: its id stays its own)
    end = walk_whole(table, vi, tok, np.full(tok.size, start, dtype=np.int32), 0, ext, sinks=True)
    end_pos = vi.lens[tok].copy()
    out = np.where(end < n, end, -1).astype(np.int32)
    leave = np.flatnonzero(end > n)
    if leave.size:
        out[leave], end_pos[leave] = walk(table, vi, tok[leave], np.full(leave.size, start, dtype=np.int32),
                                          np.zeros(leave.size, dtype=np.int64))
    return out, end_pos


def dead_extended(trans: np.ndarray) -> np.ndarray:
    """`trans` flattened to int64 with one extra all-dead row n (dead edges lead to it), as walk_whole
    reads it: a caller walking several batches over one DFA builds it once."""
    num_states = trans.shape[0]
    ext = np.empty((num_states + 1, 256), dtype=np.int64)
    ext[:num_states] = trans
    ext[ext < 0] = num_states
    ext[num_states] = num_states
    return ext.reshape(-1)


_SETTLED_EVERY = 8  # walk_whole's bytes between two looks at whether every walk has settled


def walk_whole(trans: np.ndarray, vi: VocabIndex, tok: np.ndarray, state: np.ndarray, pos=0,
               flat_trans: np.ndarray | None = None, sinks: bool = False) -> np.ndarray:
    """End state (-1: dead) of walking token `tok[i]` from byte `pos[i]` on, from `state[i]`, through `trans`.

    The pairs are put in order of decreasing token length, so the pairs still walking at byte k
    are a prefix of the arrays: each byte costs two gathers over that prefix and no compaction.
    Dead walks continue in an extra all-dead row (`flat_trans`: dead_extended(trans), when the
    caller has it). `trans` must hold no class exit codes. With `sinks`, `flat_trans` is the
    caller's own extension (walk_region's absorbing rows) and the raw end rows are returned.
    """
    num_states = trans.shape[0]
    if flat_trans is None:
        flat_trans = dead_extended(trans)
    lens = vi.lens[tok] - pos
    order = np.argsort(-lens.astype(np.int16), kind="stable")  # a radix sort on 16-bit keys
    lens = lens[order]
    cur = state[order].astype(np.int64)
    off = vi.off[tok[order]] + (pos[order] if isinstance(pos, np.ndarray) else pos)
    still = np.searchsorted(-lens, -np.arange(int(lens[0]) if lens.size else 0), side="left")  # len > k
    for k, m in enumerate(still.tolist()):
        head = cur[:m]
        if k % _SETTLED_EVERY == _SETTLED_EVERY - 1 and head.min() >= num_states:
            break  # every walk still going is in an absorbing row (dead, or a sink): nothing moves any more
        head *= 256
        head += vi.flat[off[:m] + k]
        np.take(flat_trans, head, out=head)
    out = np.empty(tok.size, dtype=np.int64 if sinks else np.int32)
    out[order] = cur if sinks else np.where(cur == num_states, -1, cur)
    return out


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
    cand = _class_candidates(vi, table, start)
    end, end_pos = walk_region(table, vi, cand, start)
    stay = end >= 0
    tok = cand[stay]
    bits = np.zeros((vi.vocab_size + 31) // 32 * 32, dtype=bool)
    bits[tok] = True
    first_bytes = np.zeros(256, dtype=bool)
    first_bytes[vi.first_byte[tok]] = True
    leave = end <= -2
    ends = np.flatnonzero(np.bincount(end[stay], minlength=table.shape[0])).astype(np.int64)
    result = ClassWalk(tok=tok, end=end[stay], ends=ends,
                       words=np.packbits(bits, bitorder="little").view(np.uint32), first_bytes=first_bytes,
                       leave_tok=cand[leave], leave_local=(-2 - end[leave]).astype(np.int64),
                       leave_pos=(end_pos[leave] - 1).astype(np.int64), quoted_tok=tok[vi.has_quote[tok]])
    vi.classes[key] = result
    return result


def _class_candidates(vi: VocabIndex, table: np.ndarray, start: int) -> np.ndarray:
    """Sorted ids of the tokens whose first byte stays in the region from `start` and whose
    second byte (if any) is not dead there: the others die at once, so no walk is needed."""
    firsts = np.flatnonzero(table[start] >= 0)
    if not firsts.size:
        return np.zeros(0, dtype=np.int32)
    after = table[table[start, firsts]]  # [F, 256] the rows reached by the first byte
    fi, b2 = np.nonzero(after != -1)
    keys = np.concatenate([firsts[fi].astype(np.int64) * 257 + b2, firsts.astype(np.int64) * 257 + 256])
    cand = _gather_groups(vi, keys, two=True)
    if cand.size * _DENSE_SORT_FRACTION < vi.vocab_size:
        return np.sort(cand)
    seen = np.zeros(vi.vocab_size, dtype=bool)  # many ids: a pass over the vocabulary beats a sort
    seen[cand] = True
    return np.flatnonzero(seen).astype(np.int32)


def lexical_regions(dfa: ByteDFA):
    """(successor lists without structural edges, region id per state, whether its region cycles)."""
    trans = dfa.trans.copy()
    self_loop = np.arange(dfa.num_states, dtype=np.int32)
    for b in _STRUCTURAL:
        col = trans[:, b]
        col[col != self_loop] = -1
    graph = Digraph.of_dfa(trans)
    comp, comp_cyclic = strongly_connected(graph)
    return graph.lists(), comp, comp_cyclic[comp]


def _no_check() -> None:
    pass


_CHECK_EVERY_STATES = 64  # class rows between two checks of the caller's time budget


def token_rows(dfa: ByteDFA, vi: VocabIndex, regions=None, check=_no_check) -> list[Row]:
    """For every DFA state its Row: every token that does not die, and the state it leads to.

    `regions` is `lexical_regions(dfa)` when the caller has it already; `check()` runs between
    batches of the walks (a compile's time budget raises there, not only after the whole walk).
    """
    succ, comp, cyclic = lexical_regions(dfa) if regions is None else regions
    walk_bytes = dfa.trans >= 0  # [S, 256] first bytes still to walk generically, per state
    rows: list[Row | None] = [None] * dfa.num_states
    # 1. Lexical-class states: the shared class part, then the tokens that leave the class
    #    later on, walked per state from where they leave.
    shapes: dict[int, tuple] = {}  # region id -> (table, local -> global, signature, global -> local)
    _class_rows_inplace(dfa, vi, succ, comp, np.flatnonzero(cyclic).tolist(), rows, walk_bytes, shapes, check)
    # 2. Acyclic states: copy from a donor where the byte rows agree.
    _choose_donors_inplace(dfa, vi, rows, cyclic, walk_bytes)
    # 2b. Acyclic class positions left (a number's digits): chains, walked like classes by shape;
    #     their rows keep the shared class part too (20 integer properties: 50 -> 32 ms; Github_medium
    #     o9913's token walk 51 -> 20 s, where the materialised chain rows were 36M pairs more).
    has_row = np.fromiter((row is not None for row in rows), dtype=bool, count=dfa.num_states)
    comp, chains, in_chain = _chain_regions(dfa, succ, comp, cyclic | has_row)
    for root in chains:  # a chain's shape is seen from its root (not always its smallest id)
        table, g, sig = _region_shape(dfa, succ, comp, root)
        shapes[comp[root]] = (table, g, sig, {int(x): i for i, x in enumerate(g.tolist())})
    _class_rows_inplace(dfa, vi, succ, comp, np.flatnonzero(in_chain).tolist(), rows, walk_bytes, shapes, check)
    # 3. Everything left: one batched walk, pruned by the first two bytes.
    walked = _walk_generic(dfa, vi, walk_bytes, check)
    out: list[Row] = []
    for q in range(dfa.num_states):
        row, extra = rows[q], walked.get(q)
        if row is None:
            row = Row(None, None, *(extra or (_EMPTY, _EMPTY)))
        elif extra is not None:
            row.tok, row.nxt = merge_rows((row.tok, row.nxt), extra)
        out.append(row)
    return out


def _class_rows_inplace(dfa, vi, succ, comp, states: list, rows, walk_bytes, shapes, check=_no_check) -> None:
    """Class rows of `states` (their regions' shapes cached in `shapes`), then the tokens that
    leave the class later on, walked per state from where they leave (one batch)."""
    exit_jobs = []  # (state, tokens, global start states, byte offsets)
    starts: dict[int, tuple[list, list]] = {}  # region -> its states here and their local ids
    for i, q in enumerate(states):
        if i % _CHECK_EVERY_STATES == _CHECK_EVERY_STATES - 1:
            check()
        c = comp[q]
        if c not in shapes:  # states are BFS-numbered: q is the region's first-reached state
            table, g, sig = _region_shape(dfa, succ, comp, q)
            shapes[c] = (table, g, sig, {int(x): i for i, x in enumerate(g.tolist())})
        table, g, sig, local = shapes[c]
        start = local[q]
        cw = _class_walk(vi, table, sig, start)
        if cw.leave_tok.size:
            exit_jobs.append((q, cw.leave_tok, g[cw.leave_local], cw.leave_pos))
        rows[q] = Row(cw, g, _EMPTY, _EMPTY)
        at = starts.setdefault(c, ([], []))
        at[0].append(q)
        at[1].append(start)
    for c, (qs, local_ids) in starts.items():  # first bytes that leave the class: walked later, per state
        walk_bytes[qs] &= shapes[c][0][local_ids] < -1
    _run_exit_jobs(dfa, vi, rows, exit_jobs, check)


_EMPTY = np.zeros(0, dtype=np.int32)


def _run_exit_jobs(dfa, vi, rows, jobs, check=_no_check) -> None:
    """Walk each job's leaving tokens on from where they leave, in batches of whole jobs of about
    GENERIC_BATCH_PAIRS pairs (a walk's arrays cost ~40 bytes a pair: one unbatched walk of a
    large grammar's exits took gigabytes), `check()` between batches."""
    if not jobs:
        return
    sizes = np.fromiter((j[1].size for j in jobs), dtype=np.int64, count=len(jobs))
    batch = np.cumsum(sizes) // GENERIC_BATCH_PAIRS  # a job goes by where its last pair falls
    cuts = [0, *(np.flatnonzero(batch[1:] != batch[:-1]) + 1).tolist(), len(jobs)]
    flat_trans = dead_extended(dfa.trans) if len(cuts) > 2 else None
    for lo, hi in zip(cuts[:-1], cuts[1:], strict=True):
        part_jobs = jobs[lo:hi]
        tok = np.concatenate([j[1] for j in part_jobs])
        start = np.concatenate([j[2] for j in part_jobs]).astype(np.int32)
        pos = np.concatenate([j[3] for j in part_jobs])
        end = walk_whole(dfa.trans, vi, tok, start, pos, flat_trans)
        at = 0
        for q, leave_tok, *_ in part_jobs:
            part = end[at : at + leave_tok.size]
            at += leave_tok.size
            ok = part >= 0
            rows[q].tok, rows[q].nxt = leave_tok[ok], part[ok]
        check()


_MIN_CHAIN_BYTES = 8  # an acyclic state with this many non-structural bytes is a class position
_MAX_CHAIN_STATES = 64  # a chain's class walks are one call per state: keep chains short
_NON_STRUCTURAL = np.ones(256, dtype=bool)
_NON_STRUCTURAL[list(_STRUCTURAL)] = False


def _chain_regions(dfa: ByteDFA, succ, comp: np.ndarray, done: np.ndarray):
    """(region ids with acyclic chains added, their roots, bool [S] in a chain): bounded
    repetitions of a class (the digits of a JSON number, `[0-9]{0,14}`), which recur across a
    grammar and across grammars. States in `done` (cyclic, or given a donor's row) are left out.

    A chain holds acyclic class positions (states with at least _MIN_CHAIN_BYTES non-structural
    bytes: a literal, a property name or an enum has one or a few per state) connected over
    non-structural bytes, from its first-numbered one, at most _MAX_CHAIN_STATES, two or more.
    Its walks are then shared by shape, like a cyclic class's (exact: tokens leaving a region
    are walked per state).
    """
    wide = ~done & ((dfa.trans[:, _NON_STRUCTURAL] >= 0).sum(axis=1) >= _MIN_CHAIN_BYTES)
    in_chain = np.zeros(dfa.num_states, dtype=bool)
    if wide.sum() < 2:
        return comp, [], in_chain
    comp = comp.copy()
    taken = ~wide
    next_id = int(comp.max()) + 1
    chains = []
    for root in np.flatnonzero(wide).tolist():
        if taken[root]:
            continue
        members, queue = [root], deque([root])
        taken[root] = True
        while queue and len(members) < _MAX_CHAIN_STATES:
            for t in succ[queue.popleft()]:
                if not taken[t] and len(members) < _MAX_CHAIN_STATES:
                    taken[t] = True
                    members.append(t)
                    queue.append(t)
        if len(members) < 2:
            continue  # a lone position: the generic walk is cheaper
        comp[members] = next_id
        in_chain[members] = True
        next_id += 1
        chains.append(root)
    return comp, chains, in_chain


def _choose_donors_inplace(dfa, vi, rows, cyclic, walk_bytes) -> None:
    """Fill `rows` for acyclic states from the best-agreeing class row; clear those bytes.

    Candidate donors are the region states a state's live bytes lead to (the first character
    of a `minLength: 1` string leads into the body whose row it mostly shares).
    """
    is_donor = np.zeros(dfa.num_states + 1, dtype=bool)  # slot -1 (dead) stays False
    for q in np.flatnonzero(cyclic).tolist():
        is_donor[q] = rows[q].size >= _MIN_DONOR_TOKENS
    # Only bytes the donor's row covers: its first bytes that leave its region are walked
    # later (walk_bytes[donor]) and are not in its row yet.
    qs, ds, agree = _pick_donors(dfa.trans, vi, np.flatnonzero(~cyclic), walk_bytes, ~walk_bytes, is_donor)
    subsets: dict = {}  # (donor's class walk, first bytes left out) -> its part, shared by the states that take it
    for q, d, bytes_ in zip(qs.tolist(), ds.tolist(), agree, strict=True):
        rows[q] = _donated(vi, rows[d], bytes_, subsets)
        walk_bytes[q] &= ~bytes_


def _pick_donors(trans: np.ndarray, vi: VocabIndex, acyclic: np.ndarray, own: np.ndarray, lent: np.ndarray,
                 is_donor: np.ndarray):
    """(states, their donors, the bytes each shares [K, 256]): per acyclic state, among the donors
    its `own` bytes lead to, the one that agrees on the most tokens (first donor id on a tie) over
    bytes the state walks (`own`) and the donor's row holds (`lent`); kept where that is at least
    _MIN_DONOR_TOKENS. `is_donor` has a last slot (for -1) that is False."""
    none = np.zeros(0, dtype=np.int64)
    if not acyclic.size or not is_donor.any():
        return none, none, np.zeros((0, 256), dtype=bool)
    # Every (acyclic state, donor it reaches on a byte it walks), once.
    qi, bi = np.nonzero(own[acyclic])
    targets = trans[acyclic[qi], bi]
    hit = is_donor[targets]
    n = trans.shape[0]
    pairs = np.unique(acyclic[qi[hit]].astype(np.int64) * n + targets[hit])
    qs, ds = pairs // n, pairs % n
    agree = (trans[ds] == trans[qs]) & own[qs] & lent[ds]  # [P, 256]
    weight = agree.astype(np.int64) @ vi.grp_count
    order = np.lexsort((ds, -weight, qs))
    first = np.ones(order.size, dtype=bool)
    first[1:] = qs[order][1:] != qs[order][:-1]
    best = order[first]
    best = best[weight[best] >= _MIN_DONOR_TOKENS]
    return qs[best], ds[best], agree[best]


def donor_cover(dfa: ByteDFA, vi: VocabIndex, comp: np.ndarray, cyclic: np.ndarray) -> tuple[np.ndarray, int]:
    """Before any walk, what _choose_donors_inplace is expected to give the acyclic states: bool
    [S, 256] the first bytes a donor's class part will cover, and the bytes of the class-walk parts
    made for them (ClassWalk.without_first_bytes, one per pattern of bytes). For compile's memory
    estimate: a donor is any class state whose bytes that stay in its region start enough tokens
    (its walk is not known yet), as _choose_donors_inplace picks one per state."""
    n = dfa.num_states
    trans = dfa.trans
    covered = np.zeros((n, 256), dtype=bool)
    cyc = np.flatnonzero(cyclic)
    stay = np.zeros((n, 256), dtype=bool)
    row = trans[cyc]
    stay[cyc] = (row >= 0) & (comp[np.maximum(row, 0)] == comp[cyc][:, None])
    is_donor = np.append(cyclic & (stay.astype(np.int64) @ vi.grp_count >= _MIN_DONOR_TOKENS), False)
    qs, ds, agree = _pick_donors(trans, vi, np.flatnonzero(~cyclic), trans >= 0, stay, is_donor)
    covered[qs] = agree
    drop = stay[ds] & ~agree
    has = drop.any(axis=1)
    if not has.any():
        return covered, 0
    kept = stay[ds[has]] & ~drop[has]
    patterns, at = np.unique(np.concatenate([np.packbits(kept, axis=1), np.packbits(drop[has], axis=1)], axis=1),
                             axis=0, return_index=True)
    tokens = kept[at].astype(np.int64) @ vi.grp_count  # one part per pattern: 8 bytes a token, plus its bitmask
    return covered, int(tokens.sum()) * 8 + patterns.shape[0] * (vi.vocab_size // 8 + 256)


def _donated(vi: VocabIndex, donor: Row, agree: np.ndarray, subsets: dict) -> Row:
    """The part of `donor`'s row whose first bytes are in `agree`: its class part shared, or where
    some of its first bytes disagree, the class walk without them (one per donor walk and set of
    bytes, shared by every state that takes it: a key that is not one of an object's declared
    names, one trie state per prefix, used to copy ~125k pairs each)."""
    keep = agree[vi.first_byte[donor.tok]]
    tok, nxt = donor.tok[keep], donor.nxt[keep]
    base = donor.base
    drop = base.first_bytes & ~agree
    if not drop.any():
        return Row(base, donor.g, tok, nxt)
    key = (id(base), drop.tobytes())
    part = subsets.get(key)
    if part is None:
        part = subsets[key] = (base, base.without_first_bytes(drop, vi))  # base kept: its id stays its own
    return Row(part[1], donor.g, tok, nxt)


_DENSE_SORT_FRACTION = 16  # rows over 1/16 of the vocabulary are sorted through a dense buffer
GENERIC_BATCH_PAIRS = 1 << 22  # (state, token) pairs walked per batch: bounds the walk's memory


def _walk_generic(dfa, vi, walk_bytes, check=_no_check) -> dict[int, tuple]:
    """Walk (state, token) pairs whose first two bytes are live, in batches of whole states."""
    qi, bi = np.nonzero(walk_bytes)
    if not qi.size:
        return {}
    # Second bytes live after (q, b), plus the one-byte token b itself (key b*257+256).
    mid = dfa.trans[qi, bi]
    live2 = np.concatenate([dfa.trans[mid] >= 0, np.ones((qi.size, 1), dtype=bool)], axis=1)  # [P, 257]
    pi, b2 = np.nonzero(live2)
    keys = bi[pi].astype(np.int64) * 257 + b2
    counts = vi.grp2_count[keys]
    states = qi[pi]
    # Batch boundaries fall between states (rows stay whole), every ~GENERIC_BATCH_PAIRS pairs.
    cum = np.cumsum(counts)
    new_state = np.flatnonzero(np.concatenate([[True], states[1:] != states[:-1]]))
    cuts = np.unique(new_state[np.searchsorted(cum[new_state] - counts[new_state],
                                               np.arange(0, int(cum[-1]), GENERIC_BATCH_PAIRS), side="right") - 1])
    out: dict[int, tuple] = {}
    flat_trans = dead_extended(dfa.trans) if cuts.size > 1 else None
    for lo, hi in zip(cuts.tolist(), [*cuts[1:].tolist(), keys.size], strict=True):
        out.update(_walk_generic_batch(dfa, vi, keys[lo:hi], counts[lo:hi], states[lo:hi], flat_trans))
        check()
    return out


def _walk_generic_batch(dfa, vi, keys, counts, states, flat_trans=None) -> dict[int, tuple]:
    tok = _gather_groups(vi, keys, two=True)
    state = np.repeat(states.astype(np.int32), counts)
    # The first two bytes are the group's: start after them (after one for one-byte tokens).
    b1, b2 = keys // 257, keys % 257
    after1 = dfa.trans[states, b1]
    one = b2 == 256
    after = np.where(one, after1, dfa.trans[after1, np.minimum(b2, 255)])
    end = walk_whole(dfa.trans, vi, tok, np.repeat(after, counts), np.repeat(np.where(one, 1, 2), counts), flat_trans)
    ok = end >= 0
    return _sorted_rows(vi.vocab_size, state[ok], tok[ok], end[ok])


def _sorted_rows(vocab_size: int, state, tok, end) -> dict[int, tuple]:
    """Group (state, token, end) triples (states non-decreasing) into rows sorted by token.

    Long rows are sorted by scattering into one vocabulary-wide buffer (linear); the short
    ones by one lexsort together.
    """
    starts = np.flatnonzero(np.concatenate([[True], state[1:] != state[:-1]])) if state.size else np.zeros(0, int)
    stops = np.append(starts[1:], state.size)
    rows: dict[int, tuple] = {}
    is_long = (stops - starts) * _DENSE_SORT_FRACTION >= vocab_size
    if is_long.any():
        buf = np.full(vocab_size, -1, dtype=np.int32)
        for lo, hi in zip(starts[is_long].tolist(), stops[is_long].tolist(), strict=True):
            buf[tok[lo:hi]] = end[lo:hi]
            ids = np.flatnonzero(buf >= 0).astype(np.int32)
            rows[int(state[lo])] = (ids, buf[ids])
            buf[ids] = -1
    short = ~is_long
    if short.any():
        lo, hi = starts[short], stops[short]
        sizes = hi - lo
        if short.all():  # (the usual case) every pair: no gather
            st, tk, en = sort_by_state_token(state, tok, end, vocab_size)
        else:
            pick = range_indices(lo, sizes)
            st, tk, en = sort_by_state_token(state[pick], tok[pick], end[pick], vocab_size)
        bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()
        heads = st[np.asarray(bounds[:-1], dtype=np.int64)].tolist()
        for i, q in enumerate(heads):
            rows[q] = (tk[bounds[i] : bounds[i + 1]], en[bounds[i] : bounds[i + 1]])
    return rows


def sort_by_state_token(state, tok, end, vocab_size: int):
    """(state, token, end) triples sorted by (state, token): one sort of packed int64 keys (the
    pairs are distinct) when they fit, else a lexsort."""
    span = int(end.max()) + 1 if end.size else 1
    top = (int(state.max()) + 1 if state.size else 1) * vocab_size * span
    if top >= 2**62:
        order = np.lexsort((tok, state))
        return state[order], tok[order], end[order]
    key = (state.astype(np.int64) * vocab_size + tok) * span + end
    key.sort(kind="stable")  # a merge of sorted runs (the rows arrive in first-byte groups)
    pair, end_sorted = np.divmod(key, span)
    st, tk = np.divmod(pair, vocab_size)
    return st.astype(state.dtype), tk.astype(tok.dtype), end_sorted.astype(end.dtype)


def merge_rows(a, b):
    """Union of two sorted rows with disjoint tokens (b is usually the small one)."""
    if a is None and b is None:
        return (np.zeros(0, np.int32), np.zeros(0, np.int32))
    if a is None or b is None:
        return a if b is None else b
    if b[0].size > a[0].size:
        a, b = b, a
    # b's entries land at their rank in a plus their own index (np.insert's result, in a's dtypes)
    at = np.searchsorted(a[0], b[0]) + np.arange(b[0].size)
    from_a = np.ones(a[0].size + b[0].size, dtype=bool)
    from_a[at] = False
    out = []
    for x, y in zip(a, b, strict=True):
        merged = np.empty(from_a.size, dtype=x.dtype)
        merged[at] = y
        merged[from_a] = x
        out.append(merged)
    return tuple(out)
