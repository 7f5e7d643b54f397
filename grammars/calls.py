"""Return states: a large object or array subschema compiled once and *called* from every place it
occurs, instead of one DFA copy per place (the splice's copies are what a flat DFA cannot avoid:
each copy remembers where its value returns to).

The row's bracket stack (grammars/stack.py, kernels/stack.py) carries the return sites. A call
pushes a frame of k_P levels whose bits are the site's code among piece P's sites; the body's
closing byte pops the frame, and its outcome for that code leads to the site's return state. The
stack table's outcomes (conditions on the innermost bits, pops, pushes) express this as they are:
the kernels do not change.

**Budget without a kernel change.** The kernels keep a row within max_tokens by the rule dist[s] +
max(d - 1, 0) <= remaining: one token per level beyond the innermost. Here `dist` of a state
inside a body counts the tokens to the body's own closing byte (a token that pops leads to the
stack's sentinel, dist 0), and each frame is padded to k_P >= dist[t] + [t outside every body]
levels for every return state t of P: its levels pay for the rest of the caller's value after the
return. Every frame's bound holds by construction (a fixed point over byte-level distances, which
bound the token-level ones from above); a push from outside every body adds k_P - 1 to the need,
from inside one k_P. Frames nest at most MAX_STACK_DEPTH levels along any chain of calls (pieces
only hold earlier pieces: no recursion), so a push is never refused.

Used where the flat splice passes its memory budget (compile.py), and only for grammars without
free-form values (their stack reads the revealed level, not the popped one: the two do not mix).

Marks (removed before the token walk): a call's place in a piece's DFA is CALL_LEAD and 4 letters
naming the piece (like a splice placeholder, never spliced); the joined DFA writes a call as
`beta PUSH_MARK <site letters>` into the body (beta its first byte, `{` or `[`) and a body's end as
`gamma POP_MARK <site letters>` to each site's return state.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from surecall.grammars.automaton import ByteDFA, prune

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
    found = []
    for s in np.flatnonzero(dfa.trans[:, CALL_LEAD] >= 0).tolist():
        frontier = [(int(dfa.trans[s, CALL_LEAD]), 0)]
        for _ in range(_DIGITS):
            step = []
            for u, value in frontier:
                row = dfa.trans[u]
                digits = row[_LETTER : _LETTER + 16]
                if int((row >= 0).sum()) != int((digits >= 0).sum()):
                    raise CallsUnusable(f"state {u}: a call mark shares its state with other text")
                step += [(int(digits[d]), value * 16 + d) for d in np.flatnonzero(digits >= 0).tolist()]
            frontier = step
        found += [(s, piece, t) for t, piece in frontier]
    return found


def join_calls(root: ByteDFA, bodies: dict[int, ByteDFA]) -> ByteDFA:
    """One DFA: `root` and each called body once, every call place written with PUSH_MARK and each
    body's end with POP_MARK (pruned; the marks are cut by cut_call_marks). Raises CallsUnusable
    where a call's opening byte meets another edge of its place."""
    comps = [root]
    offset = {None: 0}
    size = root.num_states
    order = sorted(bodies)
    for p in order:
        offset[p] = size
        comps.append(bodies[p])
        size += bodies[p].num_states
    places = []  # (s, piece, t) in joined ids
    for key, dfa in zip([None, *order], comps, strict=True):
        off = offset[key]
        places += [(s + off, p, t + off) for s, p, t in _call_places(dfa)]
    sites_of: dict[int, list[int]] = {}
    for i, (_, p, _) in enumerate(places):
        if p not in bodies:
            raise CallsUnusable(f"piece {p} is called but has no body")
        sites_of.setdefault(p, []).append(i)
    extra = 0  # mark states: per site a push chain (1 + 4), per piece a pop trie (at most 4 per site)
    for sites in sites_of.values():
        extra += (1 + _DIGITS) * len(sites) + 1 + _DIGITS * len(sites)
    trans = np.full((size + extra, 256), -1, dtype=np.int32)
    accept = np.zeros(size + extra, dtype=bool)
    for key, dfa in zip([None, *order], comps, strict=True):
        off = offset[key]
        block = trans[off : off + dfa.num_states]
        np.add(dfa.trans, off, out=block)
        block[dfa.trans < 0] = -1
        if key is None:
            accept[off : off + dfa.num_states] = dfa.accept
    trans[:, CALL_LEAD] = -1  # the places' letter states become unreachable (pruned)
    nxt = size

    def fresh() -> int:
        nonlocal nxt
        nxt += 1
        return nxt - 1

    beta = {p: int(np.flatnonzero(bodies[p].trans[0] >= 0)[0]) for p in sites_of}
    for p, sites in sites_of.items():
        entry = offset[p] + int(bodies[p].trans[0, beta[p]])
        for i in sites:
            s = places[i][0]
            if trans[s, beta[p]] >= 0:
                raise CallsUnusable(f"state {s}: a call's opening {chr(beta[p])!r} meets another edge there")
            m = fresh()
            trans[s, beta[p]] = m
            u = fresh()
            trans[m, PUSH_MARK] = u
            for d, b in enumerate(_letters(i)):
                v = entry if d == _DIGITS - 1 else fresh()
                trans[u, b] = v
                u = v
        # the end: the accepting state becomes the pop mark's state, a trie over the sites' letters
        acc = offset[p] + int(np.flatnonzero(bodies[p].accept)[0])
        root_of_trie = fresh()
        trans[acc, POP_MARK] = root_of_trie
        for i in sites:
            u = root_of_trie
            for d, b in enumerate(_letters(i)):
                if d == _DIGITS - 1:
                    trans[u, b] = places[i][2]
                else:
                    v = trans[u, b]
                    if v < 0:
                        v = trans[u, b] = fresh()
                    u = int(v)
    return prune(trans[:nxt], accept[:nxt], 0)


@dataclass
class CallMarks:
    """The call events of a DFA whose call marks were cut (ids of that DFA)."""

    push: np.ndarray  # int32 [S, 256]: the site a byte edge calls (it leads into the body), -1 elsewhere
    pop: np.ndarray  # int32 [S, 256]: the piece whose body a byte edge ends (the edge is removed), -1 elsewhere
    site_piece: np.ndarray  # int32 [N]: each site's piece (dense piece ids 0..P-1)
    site_code: np.ndarray  # int64 [N]: its code among its piece's sites
    site_target: np.ndarray  # int32 [N]: its return state
    body: np.ndarray  # int32 [S]: the piece whose body holds each state, -1 outside every body
    frame: np.ndarray  # int32 [P]: levels per frame of each piece (k_P)
    targets: np.ndarray  # int32 [P, R]: return state per (piece, code), -1 past its sites

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
    when it has none. A push edge leads straight into the body; a pop edge is removed. Frames are
    one level each here (`frame_levels` sets them)."""
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
    for k, a in enumerate(pops.tolist()):
        if (trans[a] >= 0).sum() != 1 or dfa.accept[a]:
            raise CallsUnusable(f"state {a}: a body's end shares its state with other text")
        for code, (g, t) in enumerate(sorted(_follow_letters(trans, int(trans[a, POP_MARK])))):
            site[g] = (k, code, t)
        into = np.nonzero(trans == a)
        pop[into] = k
        cut[into] = -1
    cut[:, POP_MARK] = -1
    for m in pushes.tolist():
        into = np.nonzero(trans == m)
        if (trans[m] >= 0).sum() != 1 or into[0].size != 1:
            raise CallsUnusable(f"state {m}: a call mark shares its state with other text")
        (g, b), = _follow_letters(trans, int(trans[m, PUSH_MARK]))
        if g not in site:
            raise CallsUnusable(f"state {m}: a call to site {g}, whose body has no end")
        s, byte = int(into[0][0]), int(into[1][0])
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
    marks = CallMarks(push, pop, rows[:, 0].astype(np.int32), rows[:, 1].astype(np.int64), rows[:, 2].astype(np.int32),
                      np.full(n, -1, dtype=np.int32), np.ones(num_pieces, dtype=np.int32), targets)
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
    seen = np.zeros(n, dtype=bool)
    for piece, states in seeds.items():
        frontier = sorted(states)
        while frontier:
            step = []
            for q in frontier:
                if seen[q]:
                    if body[q] != piece:
                        raise CallsUnusable(f"state {q}: in two bodies")
                    continue
                seen[q] = True
                body[q] = piece
                step += plain[q][plain[q] >= 0].tolist() + summary.get(q, [])
            frontier = step
    ends = np.nonzero(marks.pop >= 0)
    if (body[ends[0]] != marks.pop[ends]).any():
        raise CallsUnusable("a body's end lies outside its body")
    return body


def frame_levels(dfa: ByteDFA, marks: CallMarks, max_depth: int, rounds: int = 32) -> None:
    """Set marks.frame: per piece k_P >= its sites' code bits and >= dist[t] + [t outside every
    body] for each of its return states t (dist: fewest bytes to the body's end, or to acceptance
    outside every body, a push charged its frame's need). A fixed point over the frames, which the
    pushes' charges feed back into; raises CallsUnusable when none is found within `rounds` or the
    frames along some chain of calls pass `max_depth` levels."""
    from scipy.sparse import csr_array
    from scipy.sparse.csgraph import dijkstra

    n = dfa.num_states
    num = marks.frame.size
    sites = np.bincount(marks.site_piece, minlength=num)
    bits = np.maximum(np.ceil(np.log2(np.maximum(sites, 1))).astype(np.int64), 1)
    trans = dfa.trans
    q, b = np.nonzero(trans >= 0)
    r = trans[q, b].astype(np.int64)
    g = marks.push[q, b]
    is_push = g >= 0
    pq, pb = np.nonzero(marks.pop >= 0)
    sink = n  # every body's end leads there, one byte on
    accepting = np.flatnonzero(dfa.accept & (marks.body < 0))
    in_root_t = (marks.body[marks.site_target] < 0).astype(np.int64)
    k = bits.copy()
    for _ in range(rounds):
        charge = marks.need_after_push(q[is_push], k[marks.site_piece[g[is_push]]])
        src = np.concatenate([q[~is_push], q[is_push], pq]).astype(np.int64)
        dst = np.concatenate([r[~is_push], r[is_push], np.full(pq.size, sink)]).astype(np.int64)
        w = np.concatenate([np.ones(int((~is_push).sum())), 1 + charge, np.ones(pq.size)])
        order = np.lexsort((w, dst, src))  # parallel edges: the lightest (a CSR sums duplicates)
        src, dst, w = src[order], dst[order], w[order]
        first = np.r_[True, (src[1:] != src[:-1]) | (dst[1:] != dst[:-1])]
        back = csr_array((w[first], (dst[first], src[first])), shape=(n + 1, n + 1))
        found = dijkstra(back, directed=True, indices=np.append(accepting, sink), min_only=True)
        t = marks.site_target.astype(np.int64)
        if not np.isfinite(found[t]).all():
            raise CallsUnusable("a call's return state cannot reach its end")
        want = np.zeros(num, dtype=np.int64)
        np.maximum.at(want, marks.site_piece, found[t].astype(np.int64) + in_root_t)
        new = np.maximum(bits, want)
        if (new > max_depth).any():
            raise CallsUnusable(f"a call's frame needs {int(new.max())} levels, past {max_depth}")
        if np.array_equal(new, k):
            break
        k = new
    else:
        raise CallsUnusable("the frames' levels found no fixed point")
    # the deepest chain of frames: a body's calls into other bodies (pieces hold earlier pieces only)
    callee = {}
    for s, site in zip(q[is_push].tolist(), g[is_push].tolist(), strict=True):
        callee.setdefault(int(marks.body[s]), set()).add(int(marks.site_piece[site]))
    depth: dict[int, int] = {}

    def deepest(piece: int, seen: frozenset) -> int:
        if piece in seen:
            raise CallsUnusable("a body calls itself")
        if piece not in depth:
            own = int(k[piece]) if piece >= 0 else 0
            depth[piece] = own + max([deepest(c, seen | {piece}) for c in callee.get(piece, ())] or [0])
        return depth[piece]

    if deepest(-1, frozenset()) > max_depth:
        raise CallsUnusable(f"frames along a chain of calls need {deepest(-1, frozenset())} levels, past {max_depth}")
    marks.frame = k.astype(np.int32)


def call_entries(dfa: ByteDFA, marks: CallMarks, vi, counted: np.ndarray | None = None, items=None):
    """Walk every (state, token) pair whose token crosses a call or a body's end, with a symbolic
    stack: the frames the token pushes itself are known; a frame of the row's it pops is one of its
    piece's sites, one outcome per site. Returns (StackEntries with their dist weights, the DFA
    edges to drop): a token that crosses a counted string's or a counted array's event beside a
    call event is not kept (its single-byte steps are)."""
    from surecall.grammars.stack import MAX_STACK_DEPTH, _bracket_tokens, _empty_entries, _grouped

    n = dfa.num_states
    toks = _bracket_tokens(vi)
    none = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    if not toks.size:
        return _empty_entries(), none
    event = (marks.push >= 0) | (marks.pop >= 0)
    # states a token can carry to an event: a backward sweep over the byte edges, token-length deep
    limit = int(vi.lens[toks].max()) - 1
    level = np.full(n, -1, dtype=np.int64)
    frontier = np.flatnonzero(event.any(axis=1))
    level[frontier] = 0
    from surecall.grammars.automaton import Digraph, range_indices

    back = Digraph.of_dfa(dfa.trans).reversed()
    for step in range(1, max(limit, 0) + 1):
        found = np.unique(back.dst[range_indices(back.ptr[frontier], back.ptr[frontier + 1] - back.ptr[frontier])])
        frontier = found[level[found] < 0]
        if not frontier.size:
            break
        level[frontier] = step
    states = np.flatnonzero(level >= 0)
    first = vi.flat[vi.off[toks]].astype(np.int64)
    live = ((dfa.trans[states][:, first] >= 0) | event[states][:, first]) & (vi.lens[toks][None, :] > level[states][:, None])
    si, ti = np.nonzero(live)
    src, tok = states[si].astype(np.int64), toks[ti].astype(np.int64)
    trans = np.vstack([np.where(dfa.trans >= 0, dfa.trans, n), np.full((1, 256), n)]).astype(np.int64).reshape(-1)
    push = np.vstack([marks.push, np.full((1, 256), -1, np.int32)]).reshape(-1)
    pop = np.vstack([marks.pop, np.full((1, 256), -1, np.int32)]).reshape(-1)
    bad = np.zeros((n + 1) * 256, dtype=bool)
    if counted is not None:
        bad[: n * 256] |= counted.reshape(-1)
    if items is not None:
        bad[: n * 256] |= (items.events != 0).reshape(-1)
    frame = marks.frame.astype(np.int64)
    nsites = np.bincount(marks.site_piece, minlength=frame.size)
    targets = marks.targets.astype(np.int64)
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
        kp = frame[marks.site_piece[np.maximum(g, 0)]]
        w["ins_bits"] = np.where(pushing, (w["ins_bits"] << kp) | marks.site_code[np.maximum(g, 0)], w["ins_bits"])
        w["ins_len"] = w["ins_len"] + np.where(pushing, kp, 0)
        popping = pc >= 0
        w["event"] |= pushing | popping
        w["closed"] |= popping
        w["q"] = np.where(popping, w["q"], nxt)
        w["pos"] = w["pos"] + 1
        if popping.any():
            kf = frame[np.maximum(pc, 0)]
            own = popping & (w["ins_len"] > 0)
            code = w["ins_bits"] & ((np.int64(1) << kf) - 1)
            w["q"] = np.where(own, targets[np.maximum(pc, 0), np.minimum(code, targets.shape[1] - 1)], w["q"])
            w["ins_bits"] = np.where(own, w["ins_bits"] >> kf, w["ins_bits"])
            w["ins_len"] = np.where(own, w["ins_len"] - kf, w["ins_len"])
            row = popping & ~own
            if row.any():  # one walker per site of the piece whose frame the row pops
                idx = np.flatnonzero(row)
                count = nsites[pc[idx]]
                rep = np.repeat(idx, count)
                r = np.arange(rep.size) - np.repeat(np.cumsum(count) - count, count)
                split = {key: a[rep] for key, a in w.items()}
                kr = frame[pc[rep]]
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
    bad = live & ((dist < 0) | (need > marks.frame[marks.site_piece]))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise CallsUnusable(f"site {i}: its return state needs {int(need[i])} tokens, its frame "
                            f"{int(marks.frame[marks.site_piece[i]])} levels")
