"""Counted regions: string bodies whose length a per-row counter bounds, instead of one state per character.

The regex marks each bounded string `"` ENTER body `"` EXIT (schema/to_regex.py: counted_string_regex,
counted_body_regex): the body is `char*` or any string-body regex (a `pattern` or `format`).
`cut_marks` removes the marks from the byte DFA (edges into ENTER go to the body, edges into
EXIT to what follows) and returns each body's states as one region with its (lo, hi) bounds, the
JSON-text phase of each state (at a character boundary, inside an escape, inside a UTF-8
character) and `rest`: the fewest characters the body still needs before its closing quote.
The counter is the characters *started* so far plus `rest` of the row's state (a JSON escape or a
multi-byte UTF-8 character is one, counted at its first byte), so it never decreases, closing
needs counter >= lo and a token is kept only if the counter stays <= hi: a body's shortest way
out always fits, so a row never runs into a dead end. `char_rows` says, per counted state and
token, how much the token adds to the counter and whether it closes the string (the dense rows
the mask kernel reads); `check_entries` drops transitions that break a bound statically and
returns the counter each entering token sets. `add_counts_inplace` fills a built table's count
fields and its counted `dist`.

A counted repetition (to_regex.ticked_string_regex: a word count) is a body whose counter counts
the repetition's iterations: its ENTER mark carries TICKS_NIBBLE, and a TICK mark (ENTER with
TICK_NIBBLE, no bounds) follows each iteration's first character. `cut_marks` keeps the byte
edges into a TICK as `Regions.tick_edges`; there the counter adds one per tick edge crossed
instead of one per character started (`Regions.weights`), rest counts the fewest iterations
left, and everything else (rows, entries, dist, the kernels) is the same.

This module does not build CSR or mask rows (compile.py does) and runs no kernels.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from surecall.grammars.automaton import (
    ByteDFA,
    Digraph,
    bfs_order,
    coreachable,
    regex_to_dfa,
    weighted_distances,
)
from surecall.grammars.schema.to_regex import COUNT_ENTER, COUNT_EXIT, read_mark
from surecall.grammars.table import TokenTable

_QUOTE = 0x22
MAX_CHARS = 63  # int8 rows: a token starting more characters in a body is never allowed there
MAX_FILL = MAX_CHARS  # the counted dist assumes at most this many characters per token
INVALID = -1  # char_rows value of a token that leaves a body other than by its closing quote
_FREE = -128  # while merging rows: a token dead in that state (any value will do)
BOUNDARY = 0  # phase of a body state where the next byte starts a character
NUM_PHASES = 16
# A pattern or format body counted beside its maxLength has at most this many character-boundary
# states (body_fewest_chars): each walks the whole vocabulary, while a state inside a UTF-8
# character walks only the few tokens that start there and its row merges with its kind's.
MAX_COUNTED_BODY_STATES = 128


def _phase_table() -> np.ndarray:
    """int8 [NUM_PHASES, 256]: the JSON-text phase after each byte (-1: not string-body text).

    0 boundary; 1 after `\\`; 2..5 hex digits of `\\u` left (4..1); 6..8 UTF-8 continuations left
    (1..3); a high surrogate `\\uD[89AB]..` and its low partner are one character: 9 after `\\uD`,
    10..11 its hex digits left (2..1), 12 expecting `\\`, 13 `u`, 14..15 the low half's first two hex
    digits left, then 4..5 as for any `\\u` (a minimal DFA merges those states).
    """
    nxt = np.full((NUM_PHASES, 256), -1, dtype=np.int8)
    nxt[0, :] = 0  # at a boundary any other byte is one character (a JSON body holds none but ASCII here)
    nxt[0, ord("\\")] = 1
    nxt[0, _QUOTE] = -1  # closes the string: not a body byte
    nxt[0, 0xC2:0xE0], nxt[0, 0xE0:0xF0], nxt[0, 0xF0:0xF5] = 6, 7, 8
    nxt[1, [ord(c) for c in '"\\/bfnrt']] = 0
    nxt[1, ord("u")] = 2
    hexdig = np.asarray([ord(c) for c in "0123456789abcdefABCDEF"])
    for p, after in ((2, 3), (3, 4), (4, 5), (5, 0), (10, 11), (11, 12), (14, 15), (15, 4)):
        nxt[p, hexdig] = after
    nxt[2, [ord("d"), ord("D")]] = 9
    nxt[9, hexdig] = 4
    nxt[9, [ord(c) for c in "89abAB"]] = 10
    nxt[12, ord("\\")] = 13
    nxt[13, ord("u")] = 14
    for p in (6, 7, 8):
        nxt[p, 0x80:0xC0] = p - 1 if p > 6 else 0
    return nxt


_NEXT_PHASE = _phase_table()


class CountedCutError(ValueError):
    """The marks of a counted string could not be cut out cleanly (the caller compiles without counters)."""


@dataclass
class Regions:
    """Counted regions of a byte DFA (ids of that DFA)."""

    region: np.ndarray  # int32 [S]: region of each state, -1 outside counted bodies
    head: np.ndarray  # int32 [R]: each region's first state (after the opening `"`)
    lo: np.ndarray  # int64 [R]: minLength
    hi: np.ndarray  # int64 [R]: maxLength (to_regex.NO_MAX_LENGTH when absent)
    phase: np.ndarray  # int8 [S]: JSON-text phase (BOUNDARY: a character starts here), -1 outside bodies
    rest: np.ndarray  # int64 [S]: fewest counted units the body needs before its closing quote, 0 outside
    # A counted repetition's region (ticks[r]) counts the iterations it starts instead of characters:
    # the byte edges that start one are `tick_edges` (sorted state * 256 + byte).
    ticks: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))  # bool [R]
    tick_edges: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def num_regions(self) -> int:
        return int(self.head.shape[0])

    def weights(self, states: np.ndarray, trans: np.ndarray) -> np.ndarray:
        """int8 [len(states), 256]: what each live byte edge of `states` (body states) adds to its
        body's counter: 1 where a character starts (a character count's boundary states) or an
        iteration starts (a counted repetition's tick edges), else 0."""
        live = trans[states] >= 0
        region = self.region[states]
        w = (live & (self.phase[states] == BOUNDARY)[:, None]).astype(np.int8)
        ticked = (region >= 0) & np.append(self.ticks, False)[region]
        if ticked.any():
            flat = states[ticked].astype(np.int64)[:, None] * 256 + np.arange(256)
            w[ticked] = (np.isin(flat, self.tick_edges) & live[ticked]).astype(np.int8)
        return w

    def at_boundary(self) -> np.ndarray:
        """bool [S]: a body state where the next byte starts a character (or `"` closes the string)."""
        return self.phase == BOUNDARY


def cut_marks(dfa: ByteDFA) -> tuple[ByteDFA, Regions]:
    """The DFA without count marks, and its counted regions (none when the regex had no marks)."""
    cut, regions, _ = cut_marks_renumbered(dfa)
    return cut, regions


def cut_marks_renumbered(dfa: ByteDFA, is_pruned: bool = False) -> tuple[ByteDFA, Regions, np.ndarray]:
    """cut_marks, plus the old -> new state ids of the pruned DFA (-1: pruned).

    `is_pruned`: `dfa` is prune()'s output (BFS-numbered, no dead state), so without marks it is
    its own result and the prune is skipped (a fixpoint: the same arrays either way).
    """
    if is_pruned and not (dfa.trans[:, [COUNT_ENTER, COUNT_EXIT]] >= 0).any():
        return dfa, _regions(dfa, []), np.append(np.arange(dfa.num_states, dtype=np.int32), np.int32(-1))
    trans = dfa.trans.copy()
    heads: dict[int, tuple[int, int, bool]] = {}
    ticks: list[np.ndarray] = []  # edges into a counted repetition's TICK marks (flat, this DFA's ids)
    marks = [(kind, p) for kind in (COUNT_ENTER, COUNT_EXIT) for p in np.flatnonzero(trans[:, kind] >= 0).tolist()]
    into = _edges_into(trans, [p for _, p in marks])
    flat = trans.reshape(-1)
    for kind, p in marks:  # in order, each redirect seen by the marks after it (as `trans == p` would)
        target, (low, high, unit) = _follow_mark(trans, p, kind)
        edges = into.pop(p)
        if unit == "tick":
            ticks.append(edges)
        elif kind == COUNT_ENTER:
            if not (edges.size and ((edges & 255) == _QUOTE).all()):
                raise CountedCutError(f"state {p}: a counted string is entered other than by '\"'")
            bounds = (low, high, unit == "ticks")
            if heads.get(target, bounds) != bounds:
                raise CountedCutError(f"state {target}: one body with two pairs of bounds")
            heads[target] = bounds
        flat[edges] = target
        if target in into:  # a mark still to cut: these edges are cut with it
            into[target] = np.concatenate([into[target], edges])
    trans[:, COUNT_ENTER] = -1
    trans[:, COUNT_EXIT] = -1
    graph = Digraph.of_dfa(trans)
    # A pruned DFA's states all reach acceptance, and still do once the marks' edges skip them
    # (only the mark states become unreachable): the reverse walk is needed otherwise only.
    live = np.ones(trans.shape[0], dtype=bool) if is_pruned else coreachable(graph, dfa.accept)
    order = bfs_order(graph, 0, live)
    new_id = np.full(trans.shape[0] + 1, -1, dtype=np.int32)
    new_id[order] = np.arange(order.size, dtype=np.int32)
    cut = ByteDFA(np.ascontiguousarray(new_id[trans[order]], dtype=np.int32), dfa.accept[order].copy())
    live_heads = [(int(new_id[h]), b) for h, b in sorted(heads.items()) if new_id[h] >= 0]
    tick_edges = np.zeros(0, dtype=np.int64)
    if ticks:
        edges = np.concatenate(ticks).astype(np.int64)
        src = new_id[edges >> 8].astype(np.int64)
        tick_edges = np.unique(src[src >= 0] * 256 + (edges[src >= 0] & 255))
    return cut, _regions(cut, live_heads, tick_edges), new_id


def _edges_into(trans: np.ndarray, states: list[int]) -> dict[int, np.ndarray]:
    """Per state of `states`, the flat indices (row * 256 + byte) of the edges into it: one pass
    over `trans` for all of them."""
    is_target = np.zeros(trans.shape[0] + 1, dtype=bool)  # slot -1 (dead) stays False
    is_target[states] = True
    flat = trans.reshape(-1)
    at = np.flatnonzero(is_target[flat])
    at = at[np.argsort(flat[at], kind="stable")]
    target = flat[at]
    return {p: at[np.searchsorted(target, p, "left") : np.searchsorted(target, p, "right")] for p in states}


def _follow_mark(trans: np.ndarray, p: int, kind: int) -> tuple[int, tuple[int, int, str]]:
    """Walk the mark from `p`: (the state after it, its (lo, hi, unit): to_regex.read_mark)."""
    if (trans[p] >= 0).sum() != 1:
        raise CountedCutError(f"state {p}: a count mark shares its state with other text")
    q = int(trans[p, kind])

    def next_nibble() -> int:
        nonlocal q
        live = np.flatnonzero(trans[q] >= 0)
        if live.size != 1 or not 0x10 <= live[0] <= 0x1F:
            raise CountedCutError(f"state {q}: a count mark is not followed by its bounds")
        q = int(trans[q, live[0]])
        return int(live[0]) - 0x10

    try:
        bounds = read_mark(next_nibble)
    except ValueError as exc:
        raise CountedCutError(f"state {p}: {exc}") from None
    if bounds[2] == "tick" and kind != COUNT_ENTER:
        raise CountedCutError(f"state {p}: a repetition's tick on an exit mark")
    return q, bounds


def _regions(dfa: ByteDFA, heads: list[tuple[int, tuple[int, int, bool]]],
             tick_edges: np.ndarray | None = None) -> Regions:
    """Each head's body: the states it reaches without closing the string, with their phases and
    rest; `tick_edges` start a counted repetition's iterations (each in a region that counts them)."""
    region, phase = _all_body_phases(dfa.trans, [h for h, _ in heads])
    inside = region >= 0
    if dfa.accept[inside].any() or inside[0]:
        raise CountedCutError("a counted body overlaps other text (an accepting or the start state)")
    out = Regions(
        region=region,
        head=np.asarray([h for h, _ in heads], dtype=np.int32),
        lo=np.asarray([b[0] for _, b in heads], dtype=np.int64),
        hi=np.asarray([b[1] for _, b in heads], dtype=np.int64),
        phase=phase,
        rest=np.zeros(dfa.num_states, dtype=np.int64),
        ticks=np.asarray([b[2] for _, b in heads], dtype=bool),
        tick_edges=np.zeros(0, dtype=np.int64) if tick_edges is None else tick_edges,
    )
    src = out.tick_edges >> 8
    if src.size and not ((region[src] >= 0) & out.ticks[np.maximum(region[src], 0)]).all():
        raise CountedCutError("a repetition's tick outside the counted repetition it belongs to")
    members = np.flatnonzero(inside)
    if members.size:  # bodies are disjoint and their edges stay inside: one walk for them all
        out.rest[members] = _fewest_chars(dfa.trans, members, phase[members] == BOUNDARY,
                                          out.weights(members, dfa.trans))
    return out


def _all_body_phases(trans: np.ndarray, heads: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(int32 region, int8 phase) per state of the bodies from `heads` (as _body_phases, all
    bodies at once, one breadth-first level per step); -1 outside. A state reached from two
    heads or in two phases, or a byte that is no string-body text, raises CountedCutError."""
    n = trans.shape[0]
    region = np.full(n, -1, dtype=np.int32)
    phase = np.full(n, -1, dtype=np.int8)
    if not heads:
        return region, phase
    frontier = np.asarray(heads, dtype=np.int64)
    if np.unique(frontier).size < frontier.size:
        raise CountedCutError("one counted body with two pairs of bounds")
    region[frontier] = np.arange(frontier.size, dtype=np.int32)
    phase[frontier] = BOUNDARY
    while frontier.size:
        rows = trans[frontier].astype(np.int64)
        ph = phase[frontier]
        live = rows >= 0
        live[ph == BOUNDARY, _QUOTE] = False  # closes the string: not a body byte
        at, byte = np.nonzero(live)
        nph = _NEXT_PHASE[ph[at], byte].astype(np.int64)
        if (nph < 0).any():
            q = int(frontier[at[np.argmax(nph < 0)]])
            raise CountedCutError(f"state {q}: a counted body holds a byte that is not JSON string text")
        key = np.unique((rows[at, byte] << 40) + (region[frontier[at]].astype(np.int64) << 8) + nph)
        t, r, p = key >> 40, (key >> 8) & 0xFFFFFFFF, key & 0xFF
        if t.size > 1 and (t[1:] == t[:-1]).any():
            q = int(t[1:][t[1:] == t[:-1]][0])
            raise CountedCutError(f"state {q}: a counted body state both starts and continues a character, "
                                  "or two bodies overlap")
        seen = region[t] >= 0
        if ((region[t] != r) | (phase[t] != p))[seen].any():
            q = int(t[seen & ((region[t] != r) | (phase[t] != p))][0])
            raise CountedCutError(f"state {q}: a counted body state both starts and continues a character, "
                                  "or two bodies overlap")
        frontier = t[~seen]
        region[frontier] = r[~seen]
        phase[frontier] = p[~seen]
    return region, phase


def _body_phases(trans: np.ndarray, head: int) -> tuple[np.ndarray, np.ndarray]:
    """(states, phases) of the body from `head` (phase BOUNDARY): every state it reaches before a
    `"` at a boundary closes it. A state reached in two phases, or a byte that is no string-body
    text, raises CountedCutError."""
    phase_of, stack = {head: BOUNDARY}, [head]
    while stack:
        q = stack.pop()
        live = np.flatnonzero(trans[q] >= 0)
        nph = _NEXT_PHASE[phase_of[q], live].astype(np.int64)
        if phase_of[q] == BOUNDARY:
            live, nph = live[live != _QUOTE], nph[live != _QUOTE]
        if (nph < 0).any():
            raise CountedCutError(f"state {q}: a counted body holds a byte that is not JSON string text")
        for pair in np.unique(trans[q, live].astype(np.int64) * 32 + nph).tolist():
            t, p = divmod(pair, 32)
            if t not in phase_of:
                phase_of[t] = p
                stack.append(t)
            elif phase_of[t] != p:
                raise CountedCutError(f"state {t}: a counted body state both starts and continues a character")
    return np.asarray(list(phase_of), dtype=np.int64), np.asarray(list(phase_of.values()), dtype=np.int8)


def _fewest_chars(trans: np.ndarray, members: np.ndarray, boundary: np.ndarray,
                  weights: np.ndarray | None = None) -> np.ndarray:
    """int64 per member: the fewest counted units before a `"` (at a boundary) closes the body (a
    0-1 BFS over the body's distinct reversed edges). `weights` [n, 256]: what each byte edge adds
    (Regions.weights); by default a byte from a boundary state starts one character."""
    n = members.size
    to_local = np.full(trans.shape[0] + 1, -1, dtype=np.int64)  # slot -1 (dead) stays -1
    to_local[members] = np.arange(n)
    rows = trans[members].astype(np.int64)
    closes = boundary & (rows[:, _QUOTE] >= 0)
    inside = rows >= 0
    inside[:, _QUOTE] &= ~boundary
    if weights is None:
        weights = _char_weights(trans, members, boundary)
    src = np.repeat(np.arange(n), inside.sum(axis=1))
    w = weights[inside].astype(np.int64)
    key = np.unique((src * n + to_local[rows[inside]]) * 2 + w)  # (src, dst) with its lighter weight first
    src, dst, w = key // 2 // n, key // 2 % n, key % 2
    by_dst = np.argsort(dst, kind="stable")
    ptr = np.searchsorted(dst[by_dst], np.arange(n + 1)).tolist()
    pred, cost = src[by_dst].tolist(), w[by_dst].tolist()
    never = np.iinfo(np.int64).max // 2
    rest = [0 if c else never for c in closes.tolist()]
    queue = deque(np.flatnonzero(closes).tolist())
    while queue:  # weights 0/1: a 0-edge goes to the front, a 1-edge to the back
        t = queue.popleft()
        for i in range(ptr[t], ptr[t + 1]):
            s = pred[i]
            d = rest[t] + cost[i]
            if d < rest[s]:
                rest[s] = d
                (queue.appendleft if cost[i] == 0 else queue.append)(s)
    rest = np.asarray(rest, dtype=np.int64)
    if (rest >= never).any():
        raise CountedCutError(f"state {int(members[np.argmax(rest)])}: a counted body cannot be closed")
    return rest


def _char_weights(trans: np.ndarray, members: np.ndarray, boundary: np.ndarray) -> np.ndarray:
    """int8 [n, 256]: 1 on the live byte edges of the members at a character boundary."""
    return ((trans[members] >= 0) & boundary[:, None]).astype(np.int8)


def _body_states(body: str) -> tuple[ByteDFA, int, np.ndarray, np.ndarray]:
    """(byte DFA of `"body"`, the body's head, its states, their phases); CountedCutError where the
    body matches nothing or holds bytes that are no string text."""
    dfa = regex_to_dfa(f'"(?:{body})"')
    head = int(dfa.trans[0, _QUOTE])
    if head < 0:
        raise CountedCutError("the string body matches nothing")
    members, phases = _body_phases(dfa.trans, head)
    return dfa, head, members, phases


@lru_cache(maxsize=256)
def ticks_countable(regex: str) -> bool:
    """Whether a counted repetition's string (to_regex.ticked_string_regex) cuts cleanly: each
    TICK mark alone after its iteration's first character (so every string has one count of
    iterations), one body that counts them."""
    from surecall.errors import SchemaError

    try:
        _, regions = cut_marks(regex_to_dfa(regex))
    except (CountedCutError, SchemaError):
        return False
    return regions.num_regions == 1 and bool(regions.ticks.all()) and regions.tick_edges.size > 0


@lru_cache(maxsize=512)
def body_fewest_chars(body: str) -> int:
    """The fewest characters of any string body `body` (a string-body regex) matches, found as the
    counter finds it (raises CountedCutError where a counter could not ride that body, or where its
    MAX_COUNTED_BODY_STATES would make the counter's rows cost more than they are worth)."""
    dfa, head, members, phases = _body_states(body)
    starts = int((phases == BOUNDARY).sum())
    if starts > MAX_COUNTED_BODY_STATES:
        raise CountedCutError(f"its body has {starts} character states, above the {MAX_COUNTED_BODY_STATES} a counter "
                              "rides (each walks the whole vocabulary)")
    rest = _fewest_chars(dfa.trans, members, phases == BOUNDARY)
    return int(rest[members == head][0])


@lru_cache(maxsize=512)
def body_char_range(body: str) -> tuple[int, int | None] | None:
    """(fewest, most) characters of the strings a string-body regex `body` matches (most None:
    unbounded), counted as the counter counts them; None where `"body"` is not one JSON string
    (a `"` inside it would close the string and go on) or a counter could not ride it."""
    try:
        dfa, head, members, phases = _body_states(body)
        boundary = phases == BOUNDARY
        closes = dfa.trans[members[boundary], _QUOTE]
        closes = closes[closes >= 0]
        if not (dfa.accept[closes] & (dfa.trans[closes] < 0).all(axis=1)).all():
            return None  # the closing quote leads on: `body` is not one string's body
        rest = _fewest_chars(dfa.trans, members, boundary)
    except CountedCutError:
        return None
    fewest = int(rest[members == head][0])
    # Longest: the body's states without closing quotes, weighted by the characters started.
    local = {int(q): i for i, q in enumerate(members.tolist())}
    succ = []
    for q, at_boundary in zip(members.tolist(), boundary.tolist(), strict=True):
        row = dfa.trans[q].copy()
        if at_boundary:
            row[_QUOTE] = -1
        succ.append({local[t] for t in row[row >= 0].tolist()})
    indegree = [0] * len(succ)
    for s in succ:
        for t in s:
            indegree[t] += 1
    order = [i for i, d in enumerate(indegree) if d == 0]
    for i in order:  # Kahn's order; a cycle leaves states out (an unbounded body)
        for t in succ[i]:
            indegree[t] -= 1
            if indegree[t] == 0:
                order.append(t)
    if len(order) < len(succ):
        return fewest, None
    most = [0] * len(succ)
    for i in reversed(order):
        most[i] = max((most[t] for t in succ[i]), default=0) + int(boundary[i] and bool(succ[i]))
    return fewest, most[local[head]]


def _local_table(dfa: ByteDFA, regions: Regions, r: int) -> tuple[np.ndarray, np.ndarray]:
    """(local [L, 256] table, local -> global ids) of region r, BFS-numbered from its head.

    Entries: a local state, -2 for the closing quote (at a character boundary), -3 for a byte that
    leaves the body otherwise, -1 for a dead byte.
    """
    h = int(regions.head[r])
    members = np.flatnonzero(regions.region == r)  # (the BFS below reaches those it reaches)
    rows = dfa.trans[members].astype(np.int64)
    inside = (rows >= 0) & (np.append(regions.region, -1)[rows] == r)
    inside[regions.phase[members] == BOUNDARY, _QUOTE] = False
    at, byte = np.nonzero(inside)  # row-major: each member's targets in byte order
    targets = rows[at, byte].tolist()
    bounds = np.searchsorted(at, np.arange(members.size + 1)).tolist()
    index = {q: i for i, q in enumerate(members.tolist())}
    order, seen = [h], {h}
    for q in order:  # BFS in byte order: a canonical numbering for the shape cache
        i = index[q]
        for t in targets[bounds[i] : bounds[i + 1]]:
            if t not in seen:
                seen.add(t)
                order.append(t)
    g = np.asarray(order, dtype=np.int64)
    to_local = np.full(dfa.num_states + 1, -1, dtype=np.int64)  # slot -1 (dead) stays -1
    to_local[g] = np.arange(g.size)
    sel = np.asarray([index[q] for q in order], dtype=np.int64)
    rows, inside = rows[sel], inside[sel]
    local = np.where(inside, to_local[rows], np.where(rows >= 0, -3, -1)).astype(np.int32)
    boundary = regions.phase[g] == BOUNDARY
    local[boundary, _QUOTE] = np.where(dfa.trans[g[boundary], _QUOTE] >= 0, -2, -1)
    return local, g


def char_rows(dfa: ByteDFA, regions: Regions, vi) -> tuple[np.ndarray, np.ndarray, int]:
    """(row index per DFA state (-1 outside bodies), int8 [R, V] rows, fill K).

    Row value: 2 * what the token adds to the counter (characters started + rest after - rest
    before) + 1 if it closes the string there; INVALID when it leaves the body otherwise. K: every
    count 1..K is some token's that stays at the head, so the counted `dist` may assume K
    characters per token towards a minimum (only bodies with a minimum constrain K).
    """
    row_of = np.full(dfa.num_states, -1, dtype=np.int32)
    rows: list[np.ndarray] = []
    defined: list[np.ndarray] = []
    by_sig: dict[bytes, int] = {}
    fill = MAX_FILL
    for r in range(regions.num_regions):
        local, g = _local_table(dfa, regions, r)
        boundary, rest = regions.phase[g] == BOUNDARY, regions.rest[g]
        weight = regions.weights(g, dfa.trans) if regions.ticks[r] else None  # a repetition's iterations
        sig = local.tobytes() + boundary.tobytes() + rest.tobytes() + (b"" if weight is None else weight.tobytes())
        if sig not in by_sig:
            key = ("counted", sig)
            if key not in vi.classes:
                vi.classes[key] = _walk_local(local, boundary, rest, vi, weight)
            values, k = vi.classes[key]
            if ("counted-defined", sig) not in vi.classes:  # each row's defined tokens, found once per shape
                vi.classes[("counted-defined", sig)] = [np.flatnonzero(v != _FREE) for v in values]
            by_sig[sig] = len(rows)
            rows.extend(values)
            defined.extend(vi.classes[("counted-defined", sig)])
        if regions.lo[r] > 0:  # only a body with a minimum needs fillers
            fill = min(fill, vi.classes[("counted", sig)][1])
        row_of[g] = by_sig[sig] + np.arange(g.size, dtype=np.int32)
    merged, where = _merged_rows(vi, tuple(by_sig), rows, defined)
    row_of = np.where(row_of >= 0, where[np.maximum(row_of, 0)], -1).astype(np.int32)
    return row_of, merged, fill


_MERGED_KEPT = 64  # merged row sets cached per vocabulary (each [R, V] int8): the most recent ones


def _merged_rows(vi, shapes: tuple, rows: list[np.ndarray], defined: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """_merge_rows of the rows of `shapes` (body signatures, in order), which depend on those
    alone: cached per vocabulary next to the shapes' walks, for the _MERGED_KEPT latest lists."""
    cache = vi.classes.setdefault(("counted-merged",), OrderedDict())
    hit = cache.get(shapes)
    if hit is None:
        hit = cache[shapes] = _merge_rows(rows, defined)
        while len(cache) > _MERGED_KEPT:
            cache.popitem(last=False)
    cache.move_to_end(shapes)
    return hit[0].copy(), hit[1]  # the table owns its rows


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


def _walk_local(local: np.ndarray, boundary: np.ndarray, rest: np.ndarray, vi,
                weight: np.ndarray | None = None) -> tuple[list[np.ndarray], int]:
    """Walk every token from every local state of one body shape (vectorised over both).

    Only tokens whose first byte is live in a state are walked there (a mid-character state
    has few); the rest are free (_FREE) in its row. `weight` [L, 256]: a counted repetition's
    tick edges (Regions.weights), counted instead of the characters started.
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
        chars[active] += (boundary[q] if weight is None else weight[q, b] > 0) & (nxt >= 0)
        closes[active[nxt == -2]] = True
        dead[active[nxt == -1]] = True
        bad[active[nxt == -3]] = True
        keep = nxt >= 0
        state[active[keep]] = nxt[keep]
        active = active[keep]
        pos += 1
    state_of = np.repeat(np.arange(num_local), [f.size for f in firsts])
    # what the counter gains: characters started, plus the rest where the token ends, less the rest
    # it started from (>= 0: rest is the fewest characters of any way out)
    added = chars + np.where(closes | dead | bad, 0, rest[state]) - rest[state_of]
    value = np.where(bad | (added > MAX_CHARS), INVALID, 2 * np.clip(added, 0, MAX_CHARS) + closes)
    value = np.where(dead, _FREE, value).astype(np.int8)
    values = np.full((num_local, v), _FREE, dtype=np.int8)
    values[state_of, tok] = value
    head = state_of == 0
    at_head = head & ~dead & ~bad & ~closes & (state == 0) & (chars <= MAX_CHARS)
    present = np.zeros(MAX_FILL + 2, dtype=bool)
    present[np.minimum(chars[at_head], MAX_FILL + 1)] = True
    k = 0
    while k < MAX_FILL and present[k + 1]:
        k += 1
    return list(values), k


def check_entries(rows, dfa: ByteDFA, regions: Regions, vi) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Drop transitions that break a bound on their own; return the (state, token, counter set)
    int64 arrays of the transitions that enter a counted body with a counter.

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
    return src[keep], tok[keep], post[keep]


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
    """(valid, counter at the end (started + rest in a body it entered), ends in a body it entered)
    for each (state, token) pair; the last two mean nothing where the pair is not valid.

    The pairs go in order of decreasing token length, so those still walking at byte k are a
    prefix of the arrays (slices, no compaction); a walk that dies goes on in an extra dead state
    that is in no body.
    """
    n = dfa.num_states
    flat_trans = np.full((n + 1, 256), n, dtype=np.int64)
    flat_trans[:n] = np.where(dfa.trans >= 0, dfa.trans, n)
    flat_trans = flat_trans.reshape(-1)
    region = np.append(regions.region, -1)
    boundary = np.append(regions.at_boundary(), False)
    ticked = np.append(regions.ticks, False)  # per region (-1: outside, never), a counted repetition
    tick_edges = regions.tick_edges
    lo, hi = regions.lo, regions.hi
    lens = vi.lens[tok]
    order = np.argsort(-lens, kind="stable")
    lens, off = lens[order], vi.off[tok[order]]
    state = src[order].astype(np.int64)
    dynamic = region[state] >= 0  # still inside the source's body: the kernels check that part
    count = np.zeros(src.size, dtype=np.int64)
    ok = np.ones(src.size, dtype=bool)
    still = np.searchsorted(-lens, -np.arange(int(lens[0]) if lens.size else 0), side="left")  # len > k
    for k, m in enumerate(still.tolist()):
        q = state[:m]
        b = vi.flat[off[:m] + k]
        nxt = flat_trans[q * 256 + b]
        valid = ok[:m]
        valid &= nxt != n
        r = region[q]
        closing = boundary[q] & (b == _QUOTE) & (r >= 0)
        dyn = dynamic[:m]
        static = ~dyn
        c = count[:m]
        # closing a body this token opened: its bounds are known here
        r0 = np.maximum(r, 0)
        valid &= ~(closing & static & ((c < lo[r0]) | (c > hi[r0])))
        # the source's body closed: from here on everything is static
        dyn &= ~closing
        stays = (r >= 0) & ~closing
        add = boundary[q].astype(np.int64)
        tq = ticked[r]
        if tq.any():  # a counted repetition's body: its tick edges count, not the characters
            add[tq] = np.isin(q[tq] * 256 + b[tq], tick_edges)
        c[:] = np.where(stays & static, c + add, np.where(closing, 0, c))
        c[(r < 0) & (region[nxt] >= 0)] = 0  # opening a body
        state[:m] = nxt
    end_region = region[state]
    enters = ~dynamic & (end_region >= 0)
    count = np.where(enters, count + np.append(regions.rest, 0)[state], count)  # started + the body's rest
    ok &= ~enters | (count <= hi[np.maximum(end_region, 0)])
    out = [np.empty_like(x) for x in (ok, count, enters)]
    for o, x in zip(out, (ok, count, enters), strict=True):
        o[order] = x
    return tuple(out)


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


def _entry_arrays(entries: tuple, new_id: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(sorted keys new_id[q] * width + t, counters) of the entries (check_entries) whose state survived."""
    src, tok, vals = entries
    q = new_id[src].astype(np.int64)
    keep = q >= 0
    key = q[keep] * width + tok[keep]
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
    from surecall.grammars.stack import dist_edges, stack_sentinel

    src, dst, weight = dist_edges(table, *_counted_edges(table, need0), stack_sentinel(table))
    return dist_to_accept(n, table.accept, src, dst, weight)


def dist_to_accept(n: int, accept: np.ndarray, src: np.ndarray, dst: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Dijkstra from the accepting states over weighted edges src -> dst (duplicates allowed):
    per state, the lightest total weight to acceptance (-1 where none)."""
    return weighted_distances(n, dst, src, weight, np.flatnonzero(accept))


def _counted_body_edges(table: TokenTable, states: np.ndarray):
    """(source, target, closes) of the tokens that start no character in counted body `states`
    (count_chars 0, or 1: closes): one per such exception and one per default target and kind,
    not one per token (duplicates left in).

    An exception is its own edge; the default target is an edge of a kind when some allowed
    token of that kind is no exception (popcounts of the mask row against the kind's bits).
    """
    distinct, row_at = np.unique(table.count_row[states], return_inverse=True)
    v = table.count_chars.shape[1]
    used, mask_row = np.unique(table.mask_row[states], return_inverse=True)  # only these rows, dense
    words, mask_row = table.mask_dense(used).view(np.uint32), mask_row.reshape(-1).astype(np.int64)
    stops = table.stop_ids[table.stop_ids < v].astype(np.int64)
    stop_allowed = _bits_at(words, np.repeat(mask_row, stops.size),
                            np.tile(stops, states.size)).reshape(states.size, stops.size)
    at = np.full(table.num_states, -1, dtype=np.int64)
    at[states] = np.arange(states.size)
    owner, e_tok, e_next = table.state_exceptions(states)
    e_at, e_tok, e_next = at[owner], e_tok.astype(np.int64), e_next.astype(np.int64)
    inside = e_tok < v
    e_at, e_tok, e_next = e_at[inside], e_tok[inside], e_next[inside]
    e_ok = _bits_at(words, mask_row[e_at], e_tok) & ~np.isin(e_tok, stops)
    e_value = table.count_chars[distinct[row_at[e_at]], e_tok]
    default = table.trans_default[states].astype(np.int64)
    # (mask row, count row) pairs repeat across a body's states: popcount each distinct pair once
    pair_rows, pair_at = np.unique(np.stack([mask_row, row_at]), axis=1,
                                   return_inverse=True)
    pair_rows, pair_at = pair_rows.T, pair_at.reshape(-1)
    src, dst, closes = [], [], []
    for k in (0, 1):
        kind = table.count_chars[distinct] == k  # bool [R', V]
        packed = np.zeros((distinct.size, words.shape[1] * 4), dtype=np.uint8)
        packed[:, : (v + 7) // 8] = np.packbits(kind, axis=1, bitorder="little")
        free = np.bitwise_count(words[pair_rows[:, 0]] & packed.view(np.uint32)[pair_rows[:, 1]])
        free = free.sum(axis=1, dtype=np.int64)[pair_at]
        free -= (stop_allowed & kind[:, stops][row_at]).sum(axis=1)
        hit = e_ok & (e_value == k)
        free -= np.bincount(e_at[hit], minlength=states.size)
        has = (free > 0) & (default >= 0)
        src += [states[has], states[e_at[hit]]]
        dst += [default[has], e_next[hit]]
        closes.append(np.full(int(has.sum()) + int(hit.sum()), bool(k), dtype=bool))
    return np.concatenate(src).astype(np.int64), np.concatenate(dst).astype(np.int64), np.concatenate(closes)


def _bits_at(words: np.ndarray, at: np.ndarray, tok: np.ndarray) -> np.ndarray:
    """bool per i: whether row at[i] of the uint32 bit rows `words` has bit tok[i]."""
    w = words[at, tok >> 5]
    return ((w >> (tok & 31).astype(np.uint32)) & 1).astype(bool)


def target_edges(table: TokenTable, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int64 (source, target) of each distinct next state of the states where bool [S] `states`
    holds: the default (when any token takes it) and each exception target."""
    has_default = states & (table.trans_default >= 0)
    owner, targets = table.state_targets()
    keep = states[owner]
    return (np.concatenate([np.flatnonzero(has_default), owner[keep]]).astype(np.int64),
            np.concatenate([table.trans_default[has_default], targets[keep]]).astype(np.int64))


def _counted_edges(table: TokenTable, need0: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(source, target, weight) of every token edge counted_dist uses, duplicates included.

    Outside counted bodies only the distinct next states matter (the defaults and exceptions);
    inside, the tokens that start no character, found from exceptions and popcounts (_counted_body_edges).
    """
    plain = table.count_row < 0
    src, dst = target_edges(table, plain)  # outside bodies, each distinct target once
    src, dst = [src], [dst]
    weight = [np.where(table.count_row[d] >= 0, 1 + need0[d], 1) for d in dst]
    s, nxt, closes = _counted_body_edges(table, np.flatnonzero(~plain))
    src.append(s)
    dst.append(nxt)
    weight.append(np.where(closes & (table.count_row[nxt] >= 0), 1 + need0[nxt], 1))
    return (np.concatenate(src).astype(np.int64), np.concatenate(dst), np.concatenate(weight).astype(np.int64))
