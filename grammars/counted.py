"""Counted regions: string bodies whose length a per-row counter bounds, instead of one state per character.

The regex marks each bounded string `"` ENTER body* `"` EXIT (schema/to_regex.py: counted_string_regex).
`cut_marks` removes the marks from the byte DFA (edges into ENTER go to the body, edges into
EXIT to what follows) and returns each body's states as one region with its (lo, hi) bounds.
`char_rows` says, per counted state and token, how many characters the token starts inside the
body and whether it closes the string (the dense rows the mask kernel reads); `check_entries`
drops transitions that would break a bound statically (a token that opens and closes a whole
string, or opens one with too many characters) and returns the counter each entering token
sets. The counter counts characters *started* (a JSON escape or a multi-byte UTF-8 character is
one, counted at its first byte), so a token ending mid-character never commits past `hi`.
`add_counts_inplace` fills a built table's count fields and its counted `dist`. This module
does not build CSR or mask rows (compile.py does) and runs no kernels.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from surecall.grammars.automaton import ByteDFA, bfs_order, coreachable, successor_lists
from surecall.grammars.schema.to_regex import COUNT_ENTER, COUNT_EXIT
from surecall.grammars.table import TokenTable

_QUOTE = 0x22
_MARK_NIBBLES = 16  # 8 nibbles of lo, 8 of hi
MAX_CHARS = 63  # int8 rows: a token starting more characters in a body is never allowed there
MAX_FILL = MAX_CHARS  # the counted dist assumes at most this many characters per token
INVALID = -1  # char_rows value of a token that leaves a body other than by its closing quote
_FREE = -128  # while merging rows: a token dead in that state (any value will do)


class CountedCutError(ValueError):
    """The marks of a counted string could not be cut out cleanly (the caller compiles without counters)."""


@dataclass
class Regions:
    """Counted regions of a byte DFA (ids of that DFA)."""

    region: np.ndarray  # int32 [S]: region of each state, -1 outside counted bodies
    head: np.ndarray  # int32 [R]: each region's character boundary (where `"` closes the string)
    lo: np.ndarray  # int64 [R]: minLength
    hi: np.ndarray  # int64 [R]: maxLength (to_regex.NO_MAX_LENGTH when absent)

    @property
    def num_regions(self) -> int:
        return int(self.head.shape[0])

    def is_head(self) -> np.ndarray:
        out = np.zeros(self.region.shape[0], dtype=bool)
        out[self.head] = True
        return out


def cut_marks(dfa: ByteDFA) -> tuple[ByteDFA, Regions]:
    """The DFA without count marks, and its counted regions (none when the regex had no marks)."""
    cut, regions, _ = cut_marks_renumbered(dfa)
    return cut, regions


def cut_marks_renumbered(dfa: ByteDFA) -> tuple[ByteDFA, Regions, np.ndarray]:
    """cut_marks, plus the old -> new state ids of the pruned DFA (-1: pruned)."""
    trans = dfa.trans.copy()
    heads: dict[int, tuple[int, int]] = {}
    for kind in (COUNT_ENTER, COUNT_EXIT):
        for p in np.flatnonzero(trans[:, kind] >= 0).tolist():
            target, bounds = _follow_mark(trans, p, kind)
            into = trans == p
            if kind == COUNT_ENTER:
                if not (into[:, _QUOTE].sum() == into.sum() > 0):
                    raise CountedCutError(f"state {p}: a counted string is entered other than by '\"'")
                if heads.get(target, bounds) != bounds:
                    raise CountedCutError(f"state {target}: one body with two pairs of bounds")
                heads[target] = bounds
            trans[into] = target
    trans[:, COUNT_ENTER] = -1
    trans[:, COUNT_EXIT] = -1
    succ = successor_lists(trans)
    live = coreachable(succ, dfa.accept)
    order = bfs_order(succ, 0, live)
    new_id = np.full(trans.shape[0] + 1, -1, dtype=np.int32)
    new_id[order] = np.arange(order.size, dtype=np.int32)
    cut = ByteDFA(np.ascontiguousarray(new_id[trans[order]], dtype=np.int32), dfa.accept[order].copy())
    live_heads = [(int(new_id[h]), b) for h, b in sorted(heads.items()) if new_id[h] >= 0]
    return cut, _regions(cut, live_heads), new_id


def _follow_mark(trans: np.ndarray, p: int, kind: int) -> tuple[int, tuple[int, int]]:
    """Walk the mark from `p`: (the state after it, its (lo, hi))."""
    if (trans[p] >= 0).sum() != 1:
        raise CountedCutError(f"state {p}: a count mark shares its state with other text")
    q = int(trans[p, kind])
    nibbles = []
    for _ in range(_MARK_NIBBLES):
        live = np.flatnonzero(trans[q] >= 0)
        if live.size != 1 or not 0x10 <= live[0] <= 0x1F:
            raise CountedCutError(f"state {q}: a count mark is not followed by its bounds")
        nibbles.append(int(live[0]) - 0x10)
        q = int(trans[q, live[0]])
    lo = int("".join(f"{n:x}" for n in nibbles[:8]), 16)
    hi = int("".join(f"{n:x}" for n in nibbles[8:]), 16)
    return q, (lo, hi)


def _regions(dfa: ByteDFA, heads: list[tuple[int, tuple[int, int]]]) -> Regions:
    """Each head's body: the states it reaches without closing the string."""
    region = np.full(dfa.num_states, -1, dtype=np.int32)
    for r, (h, _) in enumerate(heads):
        stack, seen = [h], {h}
        while stack:
            q = stack.pop()
            row = dfa.trans[q].copy()
            if q == h:
                row[_QUOTE] = -1
            for t in np.unique(row[row >= 0]).tolist():
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        members = np.fromiter(seen, dtype=np.int64)
        if (region[members] >= 0).any() or dfa.accept[members].any() or 0 in seen:
            raise CountedCutError(f"state {h}: a counted body overlaps other text")
        region[members] = r
    return Regions(
        region=region,
        head=np.asarray([h for h, _ in heads], dtype=np.int32),
        lo=np.asarray([b[0] for _, b in heads], dtype=np.int64),
        hi=np.asarray([b[1] for _, b in heads], dtype=np.int64),
    )


def _local_table(dfa: ByteDFA, regions: Regions, r: int) -> tuple[np.ndarray, np.ndarray]:
    """(local [L, 256] table, local -> global ids) of region r, BFS-numbered from its head.

    Entries: a local state, -2 for the closing quote at the head, -3 for a byte that leaves the
    body otherwise, -1 for a dead byte.
    """
    h = int(regions.head[r])
    inside_rows = []
    order, seen = [h], {h: 0}
    i = 0
    while i < len(order):
        row = dfa.trans[order[i]].astype(np.int64)
        inside = (row >= 0) & (regions.region[np.maximum(row, 0)] == r)
        if i == 0:
            inside[_QUOTE] = False
        inside_rows.append((row, inside))
        for t in row[inside].tolist():  # byte order: a canonical numbering for the shape cache
            if t not in seen:
                seen[t] = len(order)
                order.append(t)
        i += 1
    g = np.asarray(order, dtype=np.int64)
    to_local = np.full(dfa.num_states, -1, dtype=np.int64)
    to_local[g] = np.arange(g.size)
    local = np.empty((g.size, 256), dtype=np.int32)
    for li, (row, inside) in enumerate(inside_rows):
        local[li] = np.where(inside, to_local[np.maximum(row, 0)], np.where(row >= 0, -3, -1))
    local[0, _QUOTE] = -2 if dfa.trans[h, _QUOTE] >= 0 else -1
    return local, g


def char_rows(dfa: ByteDFA, regions: Regions, vi) -> tuple[np.ndarray, np.ndarray, int]:
    """(row index per DFA state (-1 outside bodies), int8 [R, V] rows, fill K).

    Row value: 2 * characters started + 1 if the token closes the string there; INVALID when it
    leaves the body otherwise. K: every count 1..K is some token's that stays at the head, so
    the counted `dist` may assume K characters per token towards a minimum.
    """
    row_of = np.full(dfa.num_states, -1, dtype=np.int32)
    rows: list[np.ndarray] = []
    defined: list[np.ndarray] = []
    by_sig: dict[bytes, int] = {}
    fill = MAX_FILL
    for r in range(regions.num_regions):
        local, g = _local_table(dfa, regions, r)
        sig = local.tobytes()
        if sig not in by_sig:
            key = ("counted", sig)
            if key not in vi.classes:
                vi.classes[key] = _walk_local(local, vi)
            values, k = vi.classes[key]
            if ("counted-defined", sig) not in vi.classes:  # each row's defined tokens, found once per shape
                vi.classes[("counted-defined", sig)] = [np.flatnonzero(v != _FREE) for v in values]
            by_sig[sig] = len(rows)
            rows.extend(values)
            defined.extend(vi.classes[("counted-defined", sig)])
            fill = min(fill, k)
        row_of[g] = by_sig[sig] + np.arange(g.size, dtype=np.int32)
    merged, where = _merge_rows(rows, defined)
    row_of = np.where(row_of >= 0, where[np.maximum(row_of, 0)], -1).astype(np.int32)
    return row_of, merged, fill


def _merge_rows(rows: list[np.ndarray], defined_tokens: list[np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Rows that agree wherever both are defined share one (a token dead in a state is masked out
    there, so its value is free); returns the int8 rows and each input row's merged row.

    Greedy, in order: a row joins the first merged row it agrees with, compared on the row's
    defined tokens only (most rows define few: a mid-character state's continuation bytes);
    `defined_tokens` are those per row when the caller has them.
    """
    merged: list[np.ndarray] = []
    where = np.zeros(len(rows), dtype=np.int32)
    for i, row in enumerate(rows):
        defined = np.flatnonzero(row != _FREE) if defined_tokens is None else defined_tokens[i]
        values = row[defined]
        for j, m in enumerate(merged):
            seen = m[defined]
            if not ((seen != _FREE) & (seen != values)).any():
                m[defined] = values
                where[i] = j
                break
        else:
            where[i] = len(merged)
            merged.append(row.copy())
    if not merged:
        return np.zeros((0, 0), dtype=np.int8), where
    table = np.stack(merged)
    table[table == _FREE] = INVALID
    return table, where


def _walk_local(local: np.ndarray, vi) -> tuple[list[np.ndarray], int]:
    """Walk every token from every local state of one body shape (vectorised over both).

    Only tokens whose first byte is live in a state are walked there (a mid-character state
    has few); the rest are free (_FREE) in its row.
    """
    num_local, v = local.shape[0], vi.vocab_size
    firsts = [vi.tokens_with_first(local[i] != -1).astype(np.int64) for i in range(num_local)]
    state = np.concatenate([np.full(f.size, i, dtype=np.int32) for i, f in enumerate(firsts)])
    tok = np.concatenate(firsts)
    chars = np.zeros(state.size, dtype=np.int64)
    closes = np.zeros(state.size, dtype=bool)
    dead = vi.lens[tok] == 0
    bad = np.zeros(state.size, dtype=bool)
    active = np.flatnonzero(~dead)
    pos = 0
    while active.size:
        active = active[vi.lens[tok[active]] > pos]
        b = vi.flat[vi.off[tok[active]] + pos]
        q = state[active]
        nxt = local[q, b]
        chars[active] += (q == 0) & (nxt >= 0)
        closes[active[nxt == -2]] = True
        dead[active[nxt == -1]] = True
        bad[active[nxt == -3]] = True
        keep = nxt >= 0
        state[active[keep]] = nxt[keep]
        active = active[keep]
        pos += 1
    value = np.where(bad | (chars > MAX_CHARS), INVALID, 2 * np.minimum(chars, MAX_CHARS) + closes)
    value = np.where(dead, _FREE, value).astype(np.int8)
    values = np.full((num_local, v), _FREE, dtype=np.int8)
    values[state_of := np.repeat(np.arange(num_local), [f.size for f in firsts]), tok] = value
    head = state_of == 0
    at_head = head & ~dead & ~bad & ~closes & (state == 0) & (chars <= MAX_CHARS)
    present = np.zeros(MAX_FILL + 2, dtype=bool)
    present[np.minimum(chars[at_head], MAX_FILL + 1)] = True
    k = 0
    while k < MAX_FILL and present[k + 1]:
        k += 1
    return list(values), k


def check_entries(rows, dfa: ByteDFA, regions: Regions, vi) -> dict[tuple[int, int], int]:
    """Drop transitions that break a bound on their own; return {(state, token): counter set}.

    Only tokens with a `"` can open or close a counted string: walked per (state, token) from
    where the source state's own body (if any) was closed, or from the start otherwise.
    """
    src, tok = _quoted_pairs(rows, regions, vi.has_quote)
    ok, post, enters = _walk_static(dfa, regions, vi, src, tok)
    bad = {}
    for q, t in zip(src[~ok].tolist(), tok[~ok].tolist(), strict=True):
        bad.setdefault(q, []).append(t)
    for q, toks in bad.items():
        _drop_inplace(rows, q, np.asarray(sorted(toks), dtype=np.int32))
    keep = ok & enters & (post != 0)
    return {(q, t): c for q, t, c in zip(src[keep].tolist(), tok[keep].tolist(), post[keep].tolist(), strict=True)}


def _quoted_pairs(rows, regions: Regions, has_quote: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(state, token) int64 pairs of every row's tokens holding a `"`, per state its own tokens
    then (for a donated row outside a body: only it could open a body here) its class part's."""
    own = [row.tok if row.tok.size <= 4096 else row.tok[has_quote[row.tok]] for row in rows]  # big: filtered first
    donated = [q for q, row in enumerate(rows) if row.base is not None and regions.region[q] < 0]
    own_tok = np.concatenate(own).astype(np.int64) if own else np.zeros(0, dtype=np.int64)
    own_key = 2 * np.repeat(np.arange(len(rows), dtype=np.int64), [t.size for t in own])
    pick = has_quote[own_tok]
    based = [rows[q].base.quoted_tok for q in donated]  # the class walk's quoted tokens, found once
    tok = np.concatenate([own_tok[pick], *based]).astype(np.int64)
    key = np.concatenate([own_key[pick], np.repeat(2 * np.asarray(donated, dtype=np.int64) + 1,
                                                   [t.size for t in based])]).astype(np.int64)
    order = np.argsort(key, kind="stable")
    return key[order] >> 1, tok[order]


def _walk_static(dfa, regions, vi, src, tok):
    """(valid, counter at the end, ends in a body it entered) for each (state, token) pair."""
    region, is_head = regions.region, regions.is_head()
    lo, hi = regions.lo, regions.hi
    n = src.size
    state = src.astype(np.int64).copy()
    dynamic = region[state] >= 0  # still inside the source's body: the kernels check that part
    count = np.zeros(n, dtype=np.int64)
    ok = np.ones(n, dtype=bool)
    active = np.flatnonzero(vi.lens[tok] > 0)
    pos = 0
    while active.size:
        active = active[vi.lens[tok[active]] > pos]
        q = state[active]
        b = vi.flat[vi.off[tok[active]] + pos]
        nxt = dfa.trans[q, b].astype(np.int64)
        dead = nxt < 0
        ok[active[dead]] = False
        r = region[q]
        closing = is_head[q] & (b == _QUOTE) & (r >= 0)
        static = ~dynamic[active]
        # closing a body this token opened: its bounds are known here
        sc = closing & static
        c = count[active]
        ok[active[sc & ((c < lo[np.maximum(r, 0)]) | (c > hi[np.maximum(r, 0)]))]] = False
        # the source's body closed: from here on everything is static
        dynamic[active[closing & ~static]] = False
        stays = (r >= 0) & ~closing
        count[active] = np.where(stays & static, c + is_head[q], np.where(closing, 0, c))
        opening = (r < 0) & (region[np.maximum(nxt, 0)] >= 0)
        count[active[opening]] = 0
        state[active[~dead]] = nxt[~dead]
        active = active[~dead]
        pos += 1
    end_region = region[state]
    enters = ~dynamic & (end_region >= 0)
    ok &= ~enters | (count <= hi[np.maximum(end_region, 0)])
    return ok, count, enters


def _drop_inplace(rows, q: int, toks: np.ndarray) -> None:
    row = rows[q]
    if row.base is not None and np.isin(toks, row.base.tok).any():
        t, n = row.materialize()
        row.base, row.g = None, None
    else:
        t, n = row.tok, row.nxt
    keep = ~np.isin(t, toks)
    row.tok, row.nxt = t[keep], n[keep]


def add_counts_inplace(table, counts, order: np.ndarray, new_id: np.ndarray) -> None:
    """The count_* fields (DFA ids renumbered) and the counted dist."""
    regions, row_of, chars, fill, entries = counts
    region = regions.region[order]
    inside = region >= 0
    table.count_row = row_of[order].astype(np.int32)
    table.count_lo = np.where(inside, regions.lo[np.maximum(region, 0)], 0).astype(np.int32)
    table.count_hi = np.where(inside, regions.hi[np.maximum(region, 0)], 0).astype(np.int32)
    table.count_chars = chars
    if (table.count_lo > 0).any() and fill < 1:
        raise CountedCutError("no token adds one character to a string body: a minLength cannot be reached")
    table.count_fill = max(1, int(fill))
    table.count_entry_key, table.count_entry_val = _entry_arrays(entries, new_id, table.logits_width)
    table.dist = counted_dist(table)
    if (table.dist < 0).any():
        raise CountedCutError("a counted string body cannot be closed with this vocabulary's tokens")


def _entry_arrays(entries: dict, new_id: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(sorted keys new_id[q] * width + t, counters) of the entries whose state survived."""
    pairs = np.fromiter((x for qt in entries for x in qt), dtype=np.int64, count=2 * len(entries)).reshape(-1, 2)
    vals = np.fromiter(entries.values(), dtype=np.int64, count=len(entries))
    q = new_id[pairs[:, 0]].astype(np.int64)
    keep = q >= 0
    key = q[keep] * width + pairs[keep, 1]
    order = np.argsort(key, kind="stable")  # (state, token) pairs are distinct: so are the keys
    return key[order], vals[keep][order].astype(np.int32)


def counted_dist(table: TokenTable) -> np.ndarray:
    """Fewest tokens to acceptance with counters (table.py): Dijkstra from the accepting states.

    Inside a counted body only tokens that start no character are edges (1 token each); a token
    that opens a body costs 1 + need(0) of it. A state's unmet minimum (need) is then added by
    the kernels from the row's counter, so dist + need is exact enough to always leave a token
    that completes in time: a filler of min(fill, lo - c) characters, or the dist path.
    """
    n = table.num_states
    need0 = -(-table.count_lo.astype(np.int64) // table.count_fill)
    src, dst, weight = _counted_edges(table, need0)
    return dist_to_accept(n, table.accept, src, dst, weight)


def dist_to_accept(n: int, accept: np.ndarray, src: np.ndarray, dst: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Dijkstra from the accepting states over weighted edges src -> dst (duplicates allowed):
    per state, the lightest total weight to acceptance (-1 where none)."""
    # One edge per (source, target), its lightest weight; then predecessors grouped by target.
    src, dst, weight = _lightest_edges(n, src, dst, weight)
    by_dst = np.argsort(dst, kind="stable")
    ptr = np.searchsorted(dst[by_dst], np.arange(n + 1)).tolist()
    pred_src, pred_w = src[by_dst].tolist(), weight[by_dst].tolist()
    dist = [-1] * n
    heap = [(0, int(s)) for s in np.flatnonzero(accept)]
    heapq.heapify(heap)
    while heap:
        d, t = heapq.heappop(heap)
        if dist[t] >= 0:
            continue
        dist[t] = d
        for i in range(ptr[t], ptr[t + 1]):
            s = pred_src[i]
            if dist[s] < 0:
                heapq.heappush(heap, (d + pred_w[i], s))
    return np.asarray(dist, dtype=np.int32)


def _lightest_edges(n: int, src: np.ndarray, dst: np.ndarray, weight: np.ndarray):
    """(source, target, weight) once per distinct edge with its lightest weight, sorted by edge."""
    span = int(weight.max()) + 1 if weight.size else 1
    if n * n * span < 2**62 and (weight.size == 0 or int(weight.min()) >= 0):
        key = (src * n + dst) * span + weight
        key.sort(kind="stable")  # the edges arrive in sorted runs
        edge, light = np.divmod(key, span)
        first = np.ones(edge.size, dtype=bool)
        first[1:] = edge[1:] != edge[:-1]
        s, d = np.divmod(edge[first], n)
        return s, d, light[first]
    order = np.lexsort((weight, dst, src))
    src, dst, weight = src[order], dst[order], weight[order]
    first = np.ones(src.size, dtype=bool)
    first[1:] = (src[1:] != src[:-1]) | (dst[1:] != dst[:-1])
    return src[first], dst[first], weight[first]


def _counted_edges(table: TokenTable, need0: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(source, target, weight) of every token edge counted_dist uses, duplicates included.

    Outside counted bodies only the distinct next states matter (the defaults and exceptions);
    inside, the tokens that start no character, looked up per state.
    """
    n = table.num_states
    plain = table.count_row < 0
    has_default = plain & (table.trans_default >= 0)
    owner = np.repeat(np.arange(n), np.diff(table.exc_ptr.astype(np.int64)))
    from_plain = plain[owner]
    src = [np.flatnonzero(has_default), owner[from_plain]]
    dst = [table.trans_default[has_default].astype(np.int64), table.exc_next[from_plain].astype(np.int64)]
    weight = [np.where(table.count_row[d] >= 0, 1 + need0[d], 1) for d in dst]
    starts_none: dict[int, np.ndarray] = {}  # count row -> tokens that start no character there
    states = np.flatnonzero(~plain)
    rows = table.count_row[states].astype(np.int64)
    for r in np.unique(rows).tolist():
        starts_none[r] = np.flatnonzero((table.count_chars[r] == 0) | (table.count_chars[r] == 1))
    sizes = np.asarray([starts_none[r].size for r in rows.tolist()], dtype=np.int64)
    s = np.repeat(states, sizes)
    tok = np.concatenate([starts_none[r] for r in rows.tolist()] or [np.zeros(0, np.int64)])
    nxt = table.next_states_many(s, tok).astype(np.int64)
    ok = nxt >= 0
    s, tok, nxt = s[ok], tok[ok], nxt[ok]
    closes = table.count_chars[table.count_row[s], tok] == 1
    src.append(s)
    dst.append(nxt)
    weight.append(np.where(closes & (table.count_row[nxt] >= 0), 1 + need0[nxt], 1))
    return (np.concatenate(src).astype(np.int64), np.concatenate(dst), np.concatenate(weight).astype(np.int64))
