"""Return states: a large object or array subschema compiled once and *called* from every place it
occurs, instead of one DFA copy per place (the splice's copies are what a flat DFA cannot avoid:
each copy remembers where its value returns to).

The row's bracket stack (grammars/stack.py, kernels/stack.py) carries the return sites. A call
pushes a frame of k levels, its site's code (among its piece's sites; a site is a (piece, return
state)) innermost and zeros above; the body's closing byte pops it, and its outcome for that code
leads to the site's return state. The stack table's outcomes (conditions on the innermost bits,
pops, pushes) express this as they are: the kernels do not change.

**Budget without a kernel change.** The kernels keep a row within max_tokens by the rule dist[s] +
max(d - 1, 0) <= remaining: one token per level beyond the innermost. Here `dist` of a state
inside a body counts the tokens to the body's own closing byte (a token that pops leads to the
stack's sentinel, dist 0), and each site's frame is padded to k >= dist[t] + [t outside every
body] levels for its return state t: its levels pay for the rest of the caller's value after the
return. The bound holds by construction (a fixed point over byte distances, which bound the token
distances from above; a push from outside every body adds k - 1 to the need, from inside one k).
Frames nest at most MAX_STACK_DEPTH levels along any chain of calls (pieces only hold earlier
pieces: no recursion), so a push is never refused. A place whose caller's rest is long (more than
CALL_LEVELS_CAP levels) or whose opening byte meets another edge keeps a copy of the body.

Free-form values outside the bodies share the stack (a token crossing both kinds of event is
refused); a body holding one is not called (its levels read the container around, a frame is read
by the site: compile.py converts again with free-form values unrolled where that blocks the calls).
compile.py calls where the splice's copies pass _CALLS_FROM states (GrammarOptions.call_pieces).

Marks (removed before the token walk): a call's place in a piece's DFA is CALL_LEAD and 4 letters
naming the piece (like a splice placeholder, never spliced); the joined DFA writes a call as
`beta PUSH_MARK <site letters>` into the body (beta its first byte, `{` or `[`) and a body's end as
`gamma POP_MARK <site letters>` to each site's return state.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from surecall.grammars.automaton import ByteDFA, minimize, prune

# Bytes no valid UTF-8 text holds: never in a JSON grammar's text, free for marks.
CALL_LEAD, PUSH_MARK, POP_MARK = 0xF7, 0xF8, 0xF9
_LETTER = ord("A")  # digits A-P, 4 per index (as splice placeholders)
_DIGITS = 4
MIN_CALL_STATES = 64  # a smaller piece is spliced as before (its copies cost less than its calls)
_OPENERS = (ord("{"), ord("["))


class CallsUnusable(ValueError):
    """The grammar's pieces cannot be called (shape, a conflict at a call's place, free-form values,
    counted arrays around a call, or frames past the stack's depth): the flat splice stands."""


def marker_dfa(index: int) -> ByteDFA:
    """The stand-in for piece `index` in its users' DFAs: CALL_LEAD then its 4 letters."""
    letters = [_LETTER + ((index >> (4 * i)) & 15) for i in range(_DIGITS - 1, -1, -1)]
    trans = np.full((_DIGITS + 2, 256), -1, dtype=np.int32)
    trans[0, CALL_LEAD] = 1
    for i, b in enumerate(letters):
        trans[1 + i, b] = 2 + i
    accept = np.zeros(_DIGITS + 2, dtype=bool)
    accept[-1] = True
    return ByteDFA(trans, accept)


def body_shape(dfa: ByteDFA) -> int | None:
    """The opening byte when `dfa` can be called (its start reads only `{` or `[`, no edge leads
    back to the start, one accepting state with no edges, no free-form stack mark), else None."""
    from surecall.grammars.stack import STACK_MARK

    row = np.flatnonzero(dfa.trans[0] >= 0)
    if row.size != 1 or int(row[0]) not in _OPENERS or dfa.accept[0]:
        return None
    acc = np.flatnonzero(dfa.accept)
    if acc.size != 1 or (dfa.trans[acc[0]] >= 0).any() or (dfa.trans == 0).any():
        return None
    if (dfa.trans[:, STACK_MARK] >= 0).any() or (dfa.trans[:, [PUSH_MARK, POP_MARK]] >= 0).any():
        return None
    return int(row[0])


def _letters(value: int) -> list[int]:
    return [_LETTER + ((value >> (4 * i)) & 15) for i in range(_DIGITS - 1, -1, -1)]


def _call_places(dfa: ByteDFA) -> list[tuple[int, int, int]]:
    """Every call place (s, piece, t) of a DFA: s --CALL_LEAD, 4 letters--> t."""
    return [(s, piece, t) for s in np.flatnonzero(dfa.trans[:, CALL_LEAD] >= 0).tolist()
            for piece, t in _follow_letters(dfa.trans, int(dfa.trans[s, CALL_LEAD]))]


CALL_LEVELS_CAP = 24  # a place whose frame would need more levels is copied (its caller's rest is long)
_JOIN_ROUNDS = 8


@dataclass
class _Layout:
    """Components side by side (root, each body, each copied place's private body) and the call
    places left, in joined ids."""

    trans: np.ndarray  # int32 [n, 256]: every component's edges, shifted; a copy's end leads to its place's return
    accept: np.ndarray  # bool [n]: the root's accepting states
    eps: dict  # copied place's source -> [its copy's start] (a copy that meets another edge: subsets)
    places: list  # (key, s, piece, t) of the places still called
    entry: dict  # piece -> its body's state after the opening byte
    end: dict  # piece -> its body's accepting state
    beta: dict  # piece -> the opening byte


def _layout(root: ByteDFA, bodies: dict[int, ByteDFA], copied: set) -> _Layout:
    comps: list[tuple[object, ByteDFA, int | None]] = [(("root",), root, None)]  # (key, dfa, copied place's return)
    places: list = []
    size, k = 0, 0
    offsets: list[int] = []
    entry, end, beta = {}, {}, {}
    used: set[int] = set()  # bodies some kept component calls (an unused body's calls would keep dead parts alive)
    while k < len(comps):
        key, dfa, _ = comps[k]
        offsets.append(size)
        for s, p, t in _call_places(dfa):
            place = (key, s, p, t)
            if p not in bodies:
                raise CallsUnusable(f"piece {p} is called but has no body")
            if place in copied:
                comps.append((("copy", place), bodies[p], None))
            elif p not in used:
                used.add(p)
                comps.append((("body", p), bodies[p], None))
            places.append((place, size + s, p, size + t))
        size += dfa.num_states
        k += 1
    trans = np.full((size, 256), -1, dtype=np.int32)
    accept = np.zeros(size, dtype=bool)
    for (key, dfa, _), off in zip(comps, offsets, strict=True):
        block = trans[off : off + dfa.num_states]
        np.add(dfa.trans, off, out=block)
        block[dfa.trans < 0] = -1
        if key[0] == "root":
            accept[off : off + dfa.num_states] = dfa.accept
        elif key[0] == "body":
            p = key[1]
            beta[p] = int(np.flatnonzero(dfa.trans[0] >= 0)[0])
            entry[p] = off + int(dfa.trans[0, beta[p]])
            end[p] = off + int(np.flatnonzero(dfa.accept)[0])
    trans[:, CALL_LEAD] = -1  # the places' letter states become unreachable (pruned)
    copy_at = {comp[0][1]: (off, comp[1].num_states) for comp, off in zip(comps, offsets, strict=True)
               if comp[0][0] == "copy"}
    eps: dict[int, list[int]] = {}
    called = []
    for place, s, p, t in places:
        if place in copied:  # its copy's start by an epsilon move, its end onto the return
            off, num = copy_at[place]
            acc = off + int(np.flatnonzero(bodies[p].accept)[0])
            block = trans[off : off + num]
            block[block == acc] = t  # only the copy's own edges lead there
            eps.setdefault(s, []).append(off)
        else:
            called.append((place, s, p, t))
    return _Layout(trans, accept, eps, called, entry, end, beta)


def _lightest_to_end(n: int, src, dst, w, ends) -> np.ndarray:
    """Per node of an n-node graph given as weighted edges, the lightest path's weight to any of
    `ends` (inf where none): the shared step of _place_levels' and frame_levels' fixed points."""
    from scipy.sparse import csr_array
    from scipy.sparse.csgraph import dijkstra

    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    w = np.asarray(w, dtype=np.float64)
    order = np.lexsort((w, dst, src))  # parallel edges: the lightest (a CSR sums duplicates)
    src, dst, w = src[order], dst[order], w[order]
    first = np.r_[True, (src[1:] != src[:-1]) | (dst[1:] != dst[:-1])] if src.size else np.zeros(0, bool)
    back = csr_array((w[first], (dst[first], src[first])), shape=(n, n))
    return dijkstra(back, directed=True, indices=np.asarray(ends, dtype=np.int64), min_only=True)


def _place_levels(lay: _Layout) -> tuple[np.ndarray, list]:
    """(levels each called place's frame needs, the places whose opening meets another edge),
    by calls.frame_levels' byte-level fixed point over the layout (a copy's moves as edges)."""
    n = lay.trans.shape[0]
    clash, seen = [], set()
    for place, s, p, _ in lay.places:
        b = lay.beta[p]
        if lay.trans[s, b] >= 0 or (s, b) in seen or s in lay.eps:
            clash.append(place)
        seen.add((s, b))
    body_of = np.full(n, -1, dtype=np.int64)  # root (-1) or a body; a copy is its caller's
    for p, start in lay.entry.items():
        body_of[start] = p
    q, b = np.nonzero(lay.trans >= 0)
    r = lay.trans[q, b].astype(np.int64)
    eq = np.asarray([x for x, ys in lay.eps.items() for _ in ys], dtype=np.int64)
    er = np.asarray([y for ys in lay.eps.values() for y in ys], dtype=np.int64)
    ends = np.isin(r, list(lay.end.values()))
    sink = n
    sites = {}
    for _, _, p, _ in lay.places:
        sites[p] = sites.get(p, 0) + 1
    bits = {p: max(int(np.ceil(np.log2(max(c, 1)))), 1) for p, c in sites.items()}
    src0 = np.concatenate([q[~ends], eq, q[ends]])
    dst0 = np.concatenate([r[~ends], er, np.full(int(ends.sum()), sink)])
    w0 = np.concatenate([np.ones(int((~ends).sum())), np.full(eq.size, 0.5), np.ones(int(ends.sum()))])
    # body membership of each place's source: a sweep per body over its edges and places (cheap enough
    # at join time: bodies are what the splice would copy)
    graph_src = np.concatenate([src0, [s for _, s, _, _ in lay.places]]).astype(np.int64)
    graph_dst = np.concatenate([dst0, [t for _, _, _, t in lay.places]]).astype(np.int64)
    keep = graph_dst < n
    from surecall.grammars.automaton import Digraph, range_indices

    order = np.argsort(graph_src[keep], kind="stable")
    g = Digraph(n, graph_src[keep][order], graph_dst[keep][order])
    for p, start in lay.entry.items():
        frontier = np.asarray([start], dtype=np.int64)
        while frontier.size:
            frontier = np.unique(g.dst[range_indices(g.ptr[frontier], g.ptr[frontier + 1] - g.ptr[frontier])])
            frontier = frontier[body_of[frontier] < 0]
            body_of[frontier] = p
    in_root = np.asarray([body_of[s] < 0 for _, s, _, _ in lay.places], dtype=bool)
    t_of = np.asarray([t for _, _, _, t in lay.places], dtype=np.int64)
    t_root = np.asarray([body_of[t] < 0 for _, _, _, t in lay.places], dtype=np.int64)
    s_of = np.asarray([s for _, s, _, _ in lay.places], dtype=np.int64)
    e_of = np.asarray([lay.entry[p] for _, _, p, _ in lay.places], dtype=np.int64)
    code = np.asarray([bits[p] for _, _, p, _ in lay.places], dtype=np.int64)
    accepting = np.flatnonzero(lay.accept)
    k = code.copy()
    for _ in range(32):
        charge = np.where(in_root, np.maximum(k - 1, 0), k)
        found = _lightest_to_end(n + 1, np.concatenate([src0, s_of]), np.concatenate([dst0, e_of]),
                                 np.concatenate([w0, 1 + charge]) * 2,  # epsilon moves weigh 0.5 bytes
                                 np.append(accepting, sink))[t_of] / 2
        new = np.maximum(code, np.where(np.isfinite(found), np.ceil(found), 10**6).astype(np.int64) + t_root)
        new = np.minimum(new, 10**6)
        if np.array_equal(new, k):
            break
        k = new
    return k, clash


def join_calls(root: ByteDFA, bodies: dict[int, ByteDFA], max_states: int = 1 << 30,
               check=lambda: None) -> ByteDFA:
    """One DFA: `root` and each called body once, every call place written with PUSH_MARK and each
    body's end with POP_MARK (pruned; the marks are cut by cut_call_marks). A place whose opening
    byte meets another edge there, or whose frame would need more than CALL_LEVELS_CAP levels (its
    caller's rest is long), gets a copy of the body instead (an epsilon move, made deterministic by
    the splice's subset construction), and the places inside that copy are placed in turn."""
    from surecall.grammars.splice import _check_states, _determinize

    copied: set = set()
    for _ in range(_JOIN_ROUNDS):
        lay = _layout(root, bodies, copied)
        _check_states(lay.trans.shape[0], max_states)
        levels, clash = _place_levels(lay)
        more = set(clash) | {place for (place, *_), k in zip(lay.places, levels.tolist(), strict=True)
                             if k > CALL_LEVELS_CAP}
        if not more - copied:
            break
        copied |= more
        check()
    else:
        raise CallsUnusable("call places kept changing as copies were made")
    trans, accept = lay.trans, lay.accept
    # a site is a (piece, return state): places that return to the same state share its code
    site_id: dict[tuple[int, int], int] = {}
    for _, _, p, t in lay.places:
        site_id.setdefault((p, t), len(site_id))
    if not site_id:
        raise CallsUnusable("no place is left to call")
    sites_of: dict[int, list[tuple[int, int]]] = {}
    for (p, t), g in site_id.items():
        sites_of.setdefault(p, []).append((g, t))
    extra = (1 + _DIGITS) * len(lay.places) + sum(1 + _DIGITS * len(v) for v in sites_of.values())
    size = trans.shape[0]
    trans = np.vstack([trans, np.full((extra, 256), -1, dtype=np.int32)])
    accept = np.append(accept, np.zeros(extra, dtype=bool))
    nxt = size

    def fresh() -> int:
        nonlocal nxt
        nxt += 1
        return nxt - 1

    for _, s, p, t in lay.places:
        m = fresh()
        trans[s, lay.beta[p]] = m
        u = fresh()
        trans[m, PUSH_MARK] = u
        for d, b in enumerate(_letters(site_id[(p, t)])):
            v = lay.entry[p] if d == _DIGITS - 1 else fresh()
            trans[u, b] = v
            u = v
    for p, sites in sites_of.items():
        trie = fresh()  # the end: the accepting state becomes the pop mark's state, a trie over the sites
        trans[lay.end[p], POP_MARK] = trie
        for g, t in sites:
            u = trie
            for d, b in enumerate(_letters(g)):
                if d == _DIGITS - 1:
                    trans[u, b] = t
                else:
                    v = trans[u, b]
                    if v < 0:
                        v = trans[u, b] = fresh()
                    u = int(v)
    trans, accept = trans[:nxt], accept[:nxt]
    if lay.eps:  # copies met other edges at their places: one subset construction, as the splice's
        trans, accept, start, merged = _determinize(trans, accept, lay.eps, 0, max_states, check)
        dfa = prune(trans, accept, start)
        return minimize(dfa, check) if merged else dfa
    return prune(trans, accept, 0)


@dataclass
class CallMarks:
    """The call events of a DFA whose call marks were cut (ids of that DFA)."""

    push: np.ndarray  # int32 [S, 256]: the site a byte edge calls (it leads into the body), -1 elsewhere
    pop: np.ndarray  # int32 [S, 256]: the piece whose body a byte edge ends (the edge is removed), -1 elsewhere
    site_piece: np.ndarray  # int32 [N]: each site's piece (dense piece ids 0..P-1)
    site_code: np.ndarray  # int64 [N]: its code among its piece's sites
    site_target: np.ndarray  # int32 [N]: its return state
    body: np.ndarray  # int32 [S]: the piece whose body holds each state, -1 outside every body
    code_bits: np.ndarray  # int64 [P]: bits of each piece's site codes (>= 1)
    targets: np.ndarray  # int32 [P, R]: return state per (piece, code), -1 past its sites
    site_of: np.ndarray  # int64 [P, R]: the site per (piece, code), -1 past its sites
    levels: np.ndarray  # int64 [N]: levels of each site's frame (its code innermost, zeros above)

    def need_after_push(self, src: np.ndarray, levels: np.ndarray) -> np.ndarray:
        """The rise of the stack's need (max(d - 1, 0)) when `levels` are pushed from `src`."""
        return np.where(self.body[src] < 0, np.maximum(levels - 1, 0), levels)


def _follow_letters(trans: np.ndarray, u: int) -> list[tuple[int, int]]:
    """(value, state after) of every 4-letter path from u."""
    frontier = [(u, 0)]
    for _ in range(_DIGITS):
        step = []
        for v, value in frontier:
            row = trans[v]
            digits = row[_LETTER : _LETTER + 16]
            if int((row >= 0).sum()) != int((digits >= 0).sum()):
                raise CallsUnusable(f"state {v}: a call mark shares its state with other text")
            step += [(int(digits[d]), value * 16 + d) for d in np.flatnonzero(digits >= 0).tolist()]
        frontier = step
    return [(value, v) for v, value in frontier]


def cut_call_marks(dfa: ByteDFA) -> tuple[ByteDFA, CallMarks] | None:
    """The DFA without call marks (same ids; mark states left unreachable) and its events; None
    when it has none. A push edge leads straight into the body; a pop edge is removed. A frame's
    levels are its code's bits here (`frame_levels` pads them)."""
    trans = dfa.trans
    pushes = np.flatnonzero(trans[:, PUSH_MARK] >= 0)
    pops = np.flatnonzero(trans[:, POP_MARK] >= 0)
    if not pushes.size and not pops.size:
        return None
    n = trans.shape[0]
    cut = trans.copy()
    push = np.full((n, 256), -1, dtype=np.int32)
    pop = np.full((n, 256), -1, dtype=np.int32)
    site: dict[int, tuple[int, int, int]] = {}  # global site -> (piece, code, return state)
    piece_of = np.full(n + 1, -1, dtype=np.int64)  # per pop mark's state its piece; per push mark's -2
    piece_of[pops] = np.arange(pops.size)
    piece_of[pushes] = -2
    into_q, into_b = np.nonzero(piece_of[trans] != -1)  # every edge into a mark's state (-1 reads slot n)
    into_m = trans[into_q, into_b]
    for k, a in enumerate(pops.tolist()):
        if (trans[a] >= 0).sum() != 1 or dfa.accept[a]:
            raise CallsUnusable(f"state {a}: a body's end shares its state with other text")
        for code, (g, t) in enumerate(sorted(_follow_letters(trans, int(trans[a, POP_MARK])))):
            site[g] = (k, code, t)
    ends = piece_of[into_m] >= 0
    pop[into_q[ends], into_b[ends]] = piece_of[into_m[ends]]
    cut[into_q[ends], into_b[ends]] = -1
    cut[:, POP_MARK] = -1
    calls = ~ends
    for s, byte, m in zip(into_q[calls].tolist(), into_b[calls].tolist(), into_m[calls].tolist(), strict=True):
        if (trans[m] >= 0).sum() != 1:
            raise CallsUnusable(f"state {m}: a call mark shares its state with other text")
        (g, b), = _follow_letters(trans, int(trans[m, PUSH_MARK]))
        if g not in site:
            raise CallsUnusable(f"state {m}: a call to site {g}, whose body has no end")
        cut[s, byte] = b
        push[s, byte] = g
    cut[:, PUSH_MARK] = -1
    out = ByteDFA(cut, dfa.accept.copy())
    ids = sorted(site)
    dense = {g: i for i, g in enumerate(ids)}
    push[push >= 0] = np.asarray([dense[int(g)] for g in push[push >= 0].tolist()], dtype=np.int32)
    rows = np.asarray([site[g] for g in ids], dtype=np.int64).reshape(-1, 3)
    num_pieces = pops.size
    width = int(rows[:, 1].max()) + 1
    targets = np.full((num_pieces, width), -1, dtype=np.int32)
    targets[rows[:, 0], rows[:, 1]] = rows[:, 2]
    site_of = np.full((num_pieces, width), -1, dtype=np.int64)
    site_of[rows[:, 0], rows[:, 1]] = np.arange(rows.shape[0])
    sites = np.bincount(rows[:, 0], minlength=num_pieces)
    code_bits = np.maximum(np.ceil(np.log2(np.maximum(sites, 1))).astype(np.int64), 1)
    marks = CallMarks(push, pop, rows[:, 0].astype(np.int32), rows[:, 1].astype(np.int64), rows[:, 2].astype(np.int32),
                      np.full(n, -1, dtype=np.int32), code_bits, targets, site_of, code_bits[rows[:, 0]].copy())
    marks.body = _bodies(out, marks)
    return out, marks


def _bodies(dfa: ByteDFA, marks: CallMarks) -> np.ndarray:
    """The piece whose body holds each state (-1: outside every body): a sweep from each body's
    entries over its plain edges and, past a call, from the call's place to its return state."""
    n = dfa.num_states
    body = np.full(n, -1, dtype=np.int32)
    ps, pb = np.nonzero(marks.push >= 0)
    site = marks.push[ps, pb]
    plain = dfa.trans.copy()
    plain[ps, pb] = -1
    summary: dict[int, list[int]] = {}
    for s, g in zip(ps.tolist(), site.tolist(), strict=True):
        summary.setdefault(s, []).append(int(marks.site_target[g]))
    seeds: dict[int, set[int]] = {-1: {0}}
    for s, b, g in zip(ps.tolist(), pb.tolist(), site.tolist(), strict=True):
        seeds.setdefault(int(marks.site_piece[g]), set()).add(int(dfa.trans[s, b]))
    from surecall.grammars.automaton import Digraph, range_indices

    sq = np.asarray([q for q, ts in summary.items() for _ in ts], dtype=np.int64)
    st = np.asarray([t for ts in summary.values() for t in ts], dtype=np.int64)
    pq, pb = np.nonzero(plain >= 0)
    src = np.concatenate([pq, sq])
    dst = np.concatenate([plain[pq, pb].astype(np.int64), st])
    order = np.argsort(src, kind="stable")
    graph = Digraph(n, src[order], dst[order])
    seen = np.zeros(n, dtype=bool)
    for piece, states in seeds.items():
        frontier = np.asarray(sorted(states), dtype=np.int64)
        while frontier.size:
            clash = seen[frontier] & (body[frontier] != piece)
            if clash.any():
                raise CallsUnusable(f"state {int(frontier[clash][0])}: in two bodies")
            frontier = frontier[~seen[frontier]]
            seen[frontier] = True
            body[frontier] = piece
            frontier = np.unique(graph.dst[range_indices(graph.ptr[frontier], graph.ptr[frontier + 1] - graph.ptr[frontier])])
    ends = np.nonzero(marks.pop >= 0)
    if (body[ends[0]] != marks.pop[ends]).any():
        raise CallsUnusable("a body's end lies outside its body")
    return body


def frame_levels(dfa: ByteDFA, marks: CallMarks, max_depth: int, free_form=None, rounds: int = 64) -> None:
    """Set marks.levels: per site k >= its piece's code bits and >= dist[t] + [t outside every body]
    for its return state t (dist: fewest bytes to the body's end, or to acceptance outside every
    body, a push charged the need its levels add). A fixed point over the sites' levels, which the
    pushes' charges feed back into (a site whose own rest needs a call of itself finds none);
    raises CallsUnusable when none is found within `rounds` or the levels along some chain of calls
    pass `max_depth`. `free_form`: the grammar's StackMarks, whose closers (cut from the DFA) count
    as byte edges to their targets here."""
    n = dfa.num_states
    trans = dfa.trans
    q, b = np.nonzero(trans >= 0)
    r = trans[q, b].astype(np.int64)
    g = marks.push[q, b].astype(np.int64)
    if free_form is not None:  # a free-form value's closers: one byte on to each of their targets
        fq, fb = np.nonzero(free_form.pop >= 0)
        ft = free_form.targets[free_form.pop[fq, fb]]
        fq, ft = np.repeat(fq, 3), ft.reshape(-1)
        live = ft >= 0
        q, r, g = np.concatenate([q, fq[live]]), np.concatenate([r, ft[live]]), np.concatenate([g, np.full(int(live.sum()), -1)])
    is_push = g >= 0
    pq, pb = np.nonzero(marks.pop >= 0)
    sink = n  # every body's end leads there, one byte on
    accepting = np.flatnonzero(dfa.accept & (marks.body < 0))
    in_root_t = (marks.body[marks.site_target] < 0).astype(np.int64)
    bits = marks.code_bits[marks.site_piece].astype(np.int64)
    t = marks.site_target.astype(np.int64)
    k = bits.copy()
    for _ in range(rounds):
        charge = marks.need_after_push(q[is_push], k[g[is_push]])
        found = _lightest_to_end(n + 1, np.concatenate([q[~is_push], q[is_push], pq]),
                                 np.concatenate([r[~is_push], r[is_push], np.full(pq.size, sink)]),
                                 np.concatenate([np.ones(int((~is_push).sum())), 1 + charge, np.ones(pq.size)]),
                                 np.append(accepting, sink))
        if not np.isfinite(found[t]).all():
            raise CallsUnusable("a call's return state cannot reach its end")
        new = np.maximum(bits, found[t].astype(np.int64) + in_root_t)
        if (new > max_depth).any():
            raise CallsUnusable(f"a call's frame needs {int(new.max())} levels, past {max_depth}")
        if np.array_equal(new, k):
            break
        k = new
    else:
        raise CallsUnusable("the frames' levels found no fixed point")
    # the deepest chain of frames: a body's calls into other bodies (pieces hold earlier pieces only)
    calls_from: dict[int, list[int]] = {}
    for s, site in zip(q[is_push].tolist(), g[is_push].tolist(), strict=True):
        calls_from.setdefault(int(marks.body[s]), []).append(int(site))
    depth: dict[int, int] = {}

    def deepest(piece: int, seen: frozenset) -> int:
        if piece in seen:
            raise CallsUnusable("a body calls itself")
        if piece not in depth:
            depth[piece] = max([int(k[site]) + deepest(int(marks.site_piece[site]), seen | {piece})
                                for site in calls_from.get(piece, ())] or [0])
        return depth[piece]

    if deepest(-1, frozenset()) > max_depth:
        raise CallsUnusable(f"frames along a chain of calls need {deepest(-1, frozenset())} levels, past {max_depth}")
    marks.levels = k.astype(np.int64)


def call_entries(dfa: ByteDFA, marks: CallMarks, vi, counted: np.ndarray | None = None, items=None):
    """Walk every (state, token) pair whose token crosses a call or a body's end, with a symbolic
    stack: the frames the token pushes itself are known; a frame of the row's it pops is one of its
    piece's sites, one outcome per site. Returns (StackEntries with their dist weights, the DFA
    edges to drop): a token that crosses a counted string's or a counted array's event beside a
    call event is not kept (its single-byte steps are)."""
    from surecall.grammars.stack import (
        CTX_NONE,
        MAX_STACK_DEPTH,
        _bracket_tokens,
        _candidates,
        _empty_entries,
        _grouped,
        _near_pushes,
    )

    n = dfa.num_states
    toks = _bracket_tokens(vi)
    none = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    if not toks.size:
        return _empty_entries(), none
    event = (marks.push >= 0) | (marks.pop >= 0)
    # states a token can carry to an event: a backward sweep over the byte edges, token-length deep
    level = _near_pushes(dfa, SimpleNamespace(ctx=np.full(n, CTX_NONE, np.int8), push=event.astype(np.int8)),
                         int(vi.lens[toks].max()) - 1)
    # (a push edge leads into its body: its byte lives in trans)
    src, tok = _candidates(dfa, SimpleNamespace(push=(marks.push >= 0).astype(np.int8), pop=marks.pop), vi,
                           np.flatnonzero(level >= 0), toks, level)
    trans = np.vstack([np.where(dfa.trans >= 0, dfa.trans, n), np.full((1, 256), n)]).astype(np.int64).reshape(-1)
    push = np.vstack([marks.push, np.full((1, 256), -1, np.int32)]).reshape(-1)
    pop = np.vstack([marks.pop, np.full((1, 256), -1, np.int32)]).reshape(-1)
    bad = np.zeros((n + 1) * 256, dtype=bool)
    if counted is not None:
        bad[: n * 256] |= counted.reshape(-1)
    if items is not None:
        bad[: n * 256] |= (items.events != 0).reshape(-1)
    levels = marks.levels.astype(np.int64)
    nsites = np.bincount(marks.site_piece, minlength=marks.code_bits.size)
    targets = marks.targets.astype(np.int64)
    site_of = marks.site_of
    w = {"src": src, "tok": tok, "q": src.copy(), "pos": np.zeros(src.size, np.int64),
         "ins_len": np.zeros(src.size, np.int64), "ins_bits": np.zeros(src.size, np.int64),
         "clen": np.zeros(src.size, np.int64), "cbits": np.zeros(src.size, np.int64),
         "event": np.zeros(src.size, bool), "closed": np.zeros(src.size, bool), "forbid": np.zeros(src.size, bool)}
    done = []
    while w["src"].size:
        end = vi.lens[w["tok"]] <= w["pos"]
        if end.any():
            done.append({key: a[end] for key, a in w.items()})
            w = {key: a[~end] for key, a in w.items()}
            if not w["src"].size:
                break
        at = w["q"] * 256 + vi.flat[vi.off[w["tok"]] + w["pos"]].astype(np.int64)
        w["forbid"] |= bad[at]
        g, pc = push[at], pop[at]
        nxt = trans[at]
        pushing = g >= 0
        kp = levels[np.maximum(g, 0)]
        w["ins_bits"] = np.where(pushing, (w["ins_bits"] << kp) | marks.site_code[np.maximum(g, 0)], w["ins_bits"])
        w["ins_len"] = w["ins_len"] + np.where(pushing, kp, 0)
        popping = pc >= 0
        w["event"] |= pushing | popping
        w["closed"] |= popping
        w["q"] = np.where(popping, w["q"], nxt)
        w["pos"] = w["pos"] + 1
        if popping.any():
            pcs = np.maximum(pc, 0)
            own = popping & (w["ins_len"] > 0)
            code = np.minimum(w["ins_bits"] & ((np.int64(1) << marks.code_bits[pcs]) - 1), targets.shape[1] - 1)
            kf = levels[np.maximum(site_of[pcs, code], 0)]
            w["q"] = np.where(own, targets[pcs, code], w["q"])
            w["ins_bits"] = np.where(own, w["ins_bits"] >> kf, w["ins_bits"])
            w["ins_len"] = np.where(own, w["ins_len"] - kf, w["ins_len"])
            row = popping & ~own
            if row.any():  # one walker per site of the piece whose frame the row pops
                idx = np.flatnonzero(row)
                count = nsites[pc[idx]]
                rep = np.repeat(idx, count)
                r = np.arange(rep.size) - np.repeat(np.cumsum(count) - count, count)
                # only the sites whose return state takes the token's next byte (or where it ends):
                # the others die on that byte (most do: 2.1M -> 0.2M on Github_ultra o19343)
                tok_r, at_next = w["tok"][rep], w["pos"][rep]
                length = vi.lens[tok_r]
                ends = at_next >= length
                nb = vi.flat[vi.off[tok_r] + np.minimum(at_next, length - 1)].astype(np.int64)
                step = targets[pc[rep], r] * 256 + nb
                fits = ends | (trans[step] < n) | (pop[step] >= 0)
                rep, r = rep[fits], r[fits]
                split = {key: a[rep] for key, a in w.items()}
                kr = levels[site_of[pc[rep], r]]
                split["q"] = targets[pc[rep], r]
                split["cbits"] = split["cbits"] | (r.astype(np.int64) << split["clen"])
                split["clen"] = split["clen"] + kr
                keep = ~row
                w = {key: np.concatenate([a[keep], split[key]]) for key, a in w.items()}
        alive = (w["q"] >= 0) & (w["q"] < n) & (w["ins_len"] <= MAX_STACK_DEPTH) & (w["clen"] <= MAX_STACK_DEPTH)
        w = {key: a[alive] for key, a in w.items()}
    if not done:
        return _empty_entries(), none
    out = {key: np.concatenate([d[key] for d in done]) for key in done[0]}
    plain = ~out["closed"]
    drop = out["event"] & out["forbid"] & plain
    drop = (out["src"][drop], out["tok"][drop])
    keep = out["event"] & ~out["forbid"]
    out = {key: a[keep] for key, a in out.items()}
    rise = marks.need_after_push(out["src"], out["ins_len"])
    pops_row = out["clen"] > 0
    weight = np.where(pops_row, 0, 1 + rise)
    size = out["src"].size
    flat = {"src": out["src"], "tok": out["tok"], "known_len": out["clen"], "known_bits": out["cbits"],
            "exact": np.full(size, -1, np.int64), "j": out["clen"], "ins_len": out["ins_len"],
            "ins_bits": out["ins_bits"], "q": out["q"], "closed": out["closed"], "tail": np.zeros(size, np.int64),
            "inc": np.zeros(size, np.int64), "flag": np.zeros(size, np.int64), "counter": np.full(size, -1, np.int64),
            "weight": weight}
    # Per entry whose token pops a frame of the row's: one more outcome that no row meets (depth past
    # the stack's) and leads to the sentinel: dist's edge "one token, then the frame's levels pay".
    pair = np.unique(out["src"][pops_row] * vi.vocab_size + out["tok"][pops_row])
    m = pair.size
    phantom = {"src": pair // vi.vocab_size, "tok": pair % vi.vocab_size, "known_len": np.zeros(m, np.int64),
               "known_bits": np.zeros(m, np.int64), "exact": np.full(m, MAX_STACK_DEPTH + 1, np.int64),
               "j": np.zeros(m, np.int64), "ins_len": np.zeros(m, np.int64), "ins_bits": np.zeros(m, np.int64),
               "q": np.full(m, n, np.int64), "closed": np.ones(m, bool), "tail": np.zeros(m, np.int64),
               "inc": np.zeros(m, np.int64), "flag": np.zeros(m, np.int64), "counter": np.full(m, -1, np.int64),
               "weight": np.ones(m, np.int64)}
    merged = {key: np.concatenate([flat[key], phantom[key]]) for key in flat}
    return _grouped(merged, vi.vocab_size), drop


def check_call_dist(table, marks: CallMarks, new_id: np.ndarray) -> None:
    """Raise CallsUnusable unless every site's return state t keeps dist[t] + [t outside every
    body] <= its frame's levels (the bound the budget stands on; byte distances bound it, so this
    only guards the construction)."""
    t = new_id[marks.site_target]
    live = t >= 0
    dist = table.dist.astype(np.int64)[np.maximum(t, 0)]
    need = dist + (marks.body[marks.site_target] < 0)
    bad = live & ((dist < 0) | (need > marks.levels))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise CallsUnusable(f"site {i}: its return state needs {int(need[i])} tokens, its frame "
                            f"{int(marks.levels[i])} levels")
