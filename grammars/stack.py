"""Free-form values of any depth: a per-row bracket stack instead of one DFA copy per level.

A value under an unconstrained schema (`{}`, `true`, an object's undeclared members) is any JSON
value. Unrolled into a flat DFA it doubles per level of nesting (the DFA must remember whether each
open container is an object or an array), so it used to be cut at `max_any_depth` levels and a
valid value nested deeper was never written. Here the grammar instead keeps one small automaton
whose states know only the innermost container's kind, and each batch row carries a stack of the
open containers' kinds: depth d (int32) and one bit per level (int64, bit 0 the innermost: 0 an
object, 1 an array), at most MAX_STACK_DEPTH deep.

The regex (`stack_value_regex`) marks every stack event with STACK_MARK and a letter: `{` or `[`
followed by PUSH (a container opens, its kind the byte before), and `}` or `]` followed by one of
POP_OBJECT / POP_ARRAY / POP_EXIT (the container closed: the one around it, now innermost, is an
object / an array / there is none, the value ended). The regex over-approximates the language
(any pop letter after any closer); the row's stack picks the one letter that is true. It is the
state elimination of the bracket automaton (hubs: a value or the text after one, in an object or
in an array, and a closer pending):

    Q2Q* Q2P (C1 | C2 Q2Q* Q2P)* EXIT   or a scalar

where Q2Q / Q2P read from a container's opening to the next opening / to a closer, and C1 / C2 from a
pop letter to a closer / to an opening.

`cut_stack_marks` removes the marks: a push becomes a plain byte edge plus an event, a closer's edge
is removed from the DFA and kept aside with its three targets. `stack_entries` walks every (state,
token) pair that crosses a stack event with a symbolic stack (the kinds the token pushed itself and
the levels it reveals below), branching where the row's own stack decides; each branch is an
outcome (a condition on the row's stack, the pops and pushes, the next state). The kernels' side is
kernels/stack.py; the table fields are grammars/table.py's "Bracket stack".
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from surecall.grammars.automaton import ByteDFA, Digraph, range_indices, regex_to_dfa
from surecall.grammars.schema import json_lex as lex

STACK_MARK = 0x0C  # a form feed: never raw in JSON text (a string escapes it, it is not whitespace)
PUSH, POP_OBJECT, POP_ARRAY, POP_EXIT = b"p", b"o", b"a", b"x"
MAX_STACK_DEPTH = 62  # open free-form containers a row may hold (int64 kind bits); deeper ones are not written
OBJECT, ARRAY = 0, 1  # a level's kind bit
CTX_NONE, CTX_OBJECT, CTX_ARRAY = 0, 1, 2  # a state's innermost free-form container (none: outside one)
_OPENERS = {ord("{"): OBJECT, ord("["): ARRAY}
_CLOSERS = {ord("}"): OBJECT, ord("]"): ARRAY}


class StackCutError(ValueError):
    """The grammar's free-form values cannot go on the bracket stack (compile_schema then unrolls
    them max_any_depth levels deep)."""


def _mark(letter: bytes) -> str:
    return f"\\x{STACK_MARK:02x}{letter.decode()}"


@lru_cache(maxsize=8)
def stack_value_regex(ws: str) -> str:
    """Any JSON value, containers of any depth, with stack marks (`ws`: one whitespace place)."""
    g = lambda r: f"(?:{r})"  # noqa: E731
    scalar = g(f"{lex.STRING}|{lex.NUMBER}|{lex.BOOLEAN}|{lex.NULL}")
    ob, ar = f"\\{{{_mark(PUSH)}{ws}", f"\\[{_mark(PUSH)}{ws}"
    member = f"{lex.STRING}{ws}:{ws}"
    comma = f"{ws},{ws}"
    lo, la = f"(?:{comma}{member}{scalar})*", f"(?:{comma}{scalar})*"
    q2p = g(f"{ob}(?:\\}}|{member}{scalar}{lo}{ws}\\}})|{ar}(?:\\]|{scalar}{la}{ws}\\])")
    q2q = g(f"{ob}{member}(?:{scalar}{lo}{comma}{member})?|{ar}(?:{scalar}{la}{comma})?")
    c1 = g(f"{_mark(POP_OBJECT)}{lo}{ws}\\}}|{_mark(POP_ARRAY)}{la}{ws}\\]")
    c2 = g(f"{_mark(POP_OBJECT)}{lo}{comma}{member}|{_mark(POP_ARRAY)}{la}{comma}")
    nested = f"{q2q}*{q2p}(?:{c1}|{c2}{q2q}*{q2p})*{_mark(POP_EXIT)}"
    return f"{scalar}|{nested}"


def holds_stack(regex: str) -> bool:
    return _mark(POP_EXIT) in regex


@dataclass
class StackMarks:
    """The stack events of a byte DFA whose marks were cut (ids of that DFA)."""

    push: np.ndarray  # int8 [S, 256]: 1 + kind where the byte edge opens a container, 0 elsewhere
    pop: np.ndarray  # int32 [S, 256]: index into `targets` where the byte edge closes one, -1 elsewhere
    targets: np.ndarray  # int32 [P, 3]: next state when the container around is an object / an array / none
    ctx: np.ndarray  # int8 [S]: CTX_* of each state


def cut_stack_marks(dfa: ByteDFA) -> tuple[ByteDFA, StackMarks] | None:
    """The DFA without stack marks (same ids; mark states left unreachable) and its events; None
    when it has no marks. A closer's byte edge is removed (its targets are in `StackMarks`)."""
    trans = dfa.trans
    marked = trans[:, STACK_MARK] >= 0
    if not marked.any():
        return None
    n = trans.shape[0]
    if ((trans[marked] >= 0).sum(axis=1) != 1).any():
        p = int(np.flatnonzero(marked & ((trans >= 0).sum(axis=1) != 1))[0])
        raise StackCutError(f"state {p}: a stack mark shares its state with other text")
    after = np.full(n + 1, -1, dtype=np.int64)  # per marked state: the state after its mark byte
    after[:n][marked] = trans[marked, STACK_MARK]
    letter_of = {b: trans[np.maximum(after[:n], 0), b[0]] for b in (PUSH, POP_OBJECT, POP_ARRAY, POP_EXIT)}
    into_q, into_b = np.nonzero(marked[np.maximum(trans, 0)] & (trans >= 0))
    p = trans[into_q, into_b].astype(np.int64)
    is_open = np.isin(into_b, list(_OPENERS))
    is_close = np.isin(into_b, list(_CLOSERS))
    live = trans[after[:n][marked]] >= 0  # the letters each mark reads
    letters_ok = np.zeros(n, dtype=bool)
    push_only = np.zeros(n, dtype=bool)
    codes = np.asarray([PUSH[0], POP_OBJECT[0], POP_ARRAY[0], POP_EXIT[0]])
    other = live.copy()
    other[:, codes] = False
    push_only[marked] = live[:, PUSH[0]] & (live.sum(axis=1) == 1)
    letters_ok[marked] = ~other.any(axis=1) & ~live[:, PUSH[0]]
    bad = (is_open & ~push_only[p]) | (is_close & ~letters_ok[p]) | ~(is_open | is_close)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise StackCutError(f"state {int(p[i])}: a stack mark after {bytes([int(into_b[i])])!r} reads "
                            f"{[bytes([c]) for c in np.flatnonzero(trans[after[p[i]]] >= 0).tolist()]}")
    cut = trans.copy()
    push = np.zeros((n, 256), dtype=np.int8)
    push[into_q[is_open], into_b[is_open]] = 1 + (into_b[is_open] == ord("[")).astype(np.int8)
    cut[into_q[is_open], into_b[is_open]] = letter_of[PUSH][p[is_open]]
    pending, pop_index = np.unique(p[is_close], return_inverse=True)
    pop = np.full((n, 256), -1, dtype=np.int32)
    pop[into_q[is_close], into_b[is_close]] = pop_index
    cut[into_q[is_close], into_b[is_close]] = -1
    cut[:, STACK_MARK] = -1
    tgt = np.stack([letter_of[POP_OBJECT][pending], letter_of[POP_ARRAY][pending], letter_of[POP_EXIT][pending]],
                   axis=1).astype(np.int32)
    out = ByteDFA(cut, dfa.accept.copy())
    return out, StackMarks(push, pop, tgt, _contexts(out, push, pop, tgt))


def _contexts(dfa: ByteDFA, push: np.ndarray, pop: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Each state's innermost free-form container: a breadth-first sweep from the states a push or
    a pop (into an object or an array) leads to, over plain edges (which never leave a free-form
    value: only a closer's "none around" target does); every other state is outside (CTX_NONE).
    A state met in two contexts, or a closer outside any container, raises StackCutError."""
    n = dfa.num_states
    ctx = np.full(n, -1, dtype=np.int8)
    pq, pb = np.nonzero(push > 0)
    seeds_t = [dfa.trans[pq, pb].astype(np.int64), targets[:, 0].astype(np.int64), targets[:, 1].astype(np.int64)]
    seeds_c = [np.where(push[pq, pb] == 1, CTX_OBJECT, CTX_ARRAY).astype(np.int8),
               np.full(targets.shape[0], CTX_OBJECT, np.int8), np.full(targets.shape[0], CTX_ARRAY, np.int8)]
    t, c = np.concatenate(seeds_t), np.concatenate(seeds_c)
    while t.size:
        live = t >= 0
        t, c = t[live], c[live]
        order = np.lexsort((c, t))
        t, c = t[order], c[order]
        first = np.r_[True, t[1:] != t[:-1]] if t.size else np.zeros(0, bool)
        clash = ~first & (c != np.r_[c[:1], c[:-1]])
        seen = ctx[t] >= 0
        clash |= seen & (ctx[t] != c)
        if clash.any():
            raise StackCutError(f"state {int(t[clash][0])}: reached inside two kinds of container")
        new = first & ~seen
        t, c = t[new], c[new]
        ctx[t] = c
        q, b = np.nonzero(dfa.trans[t] >= 0)
        nxt = dfa.trans[t[q], b].astype(np.int64)
        plain = push[t[q], b] == 0  # a push edge seeds its own context
        t, c = nxt[plain], c[q][plain]
    ctx = np.where(ctx < 0, CTX_NONE, ctx).astype(np.int8)
    closers = (pop >= 0).any(axis=1)
    if (closers & (ctx == CTX_NONE)).any():
        raise StackCutError(f"state {int(np.flatnonzero(closers & (ctx == CTX_NONE))[0])}: a closer outside any "
                            "free-form container")
    return ctx


@dataclass
class StackEntries:
    """Per (state, token) that crosses a stack event, its outcomes (DFA ids; `ptr` slices them).

    An outcome applies to a row whose stack's innermost `cond_len` kinds are `cond_bits` and whose
    depth is `cond_depth` exactly (>= 0) or at least `cond_len` (-1); the row then pops `pops`
    levels, pushes `push_len` levels `push_bits` (bit 0 the new innermost) and goes to `next`.
    An entry whose token crosses no closer (`edge`) is a DFA edge too, to the same next state (one
    outcome); a token that crosses a closer is no DFA edge and its outcomes are the only way on."""

    src: np.ndarray  # int64 [E]
    tok: np.ndarray  # int64 [E]
    ptr: np.ndarray  # int64 [E + 1]
    edge: np.ndarray  # bool [E]: the token crosses no closer (it only pushes)
    cond_len: np.ndarray  # int8 [O]
    cond_bits: np.ndarray  # int64 [O]
    cond_depth: np.ndarray  # int32 [O]
    pops: np.ndarray  # int8 [O]
    push_len: np.ndarray  # int8 [O]
    push_bits: np.ndarray  # int64 [O]
    next: np.ndarray  # int32 [O]
    closer_last: np.ndarray  # bool [O]: the token's last byte pops a level of the row's stack
    item_inc: np.ndarray  # int32 [O]: separators crossed in the row's innermost counted array (tokens that pop)
    item_flag: np.ndarray  # int8 [O]: items.FLAG_CLOSES | FLAG_OPENS, as an item entry's
    item_set: np.ndarray  # int32 [O]: the counter of the array it leaves open (-1: none)
    weight: np.ndarray | None = None  # int64 [O]: each outcome's dist weight where the walk set it (calls.py)



def _near_pushes(dfa: ByteDFA, marks: StackMarks, limit: int) -> np.ndarray:
    """int64 [S]: per state the fewest bytes before a push edge can be read (0 inside a free-form
    value, where closers are events too), -1 past `limit` (a breadth-first search backwards over
    the byte edges)."""
    level = np.where(marks.ctx != CTX_NONE, 0, -1).astype(np.int64)
    frontier = np.flatnonzero((marks.push > 0).any(axis=1))
    level[frontier] = 0
    back = Digraph.of_dfa(dfa.trans).reversed()
    for step in range(1, max(limit, 0) + 1):
        found = np.unique(back.dst[range_indices(back.ptr[frontier], back.ptr[frontier + 1] - back.ptr[frontier])])
        frontier = found[level[found] < 0]
        if not frontier.size:
            break
        level[frontier] = step
    return level


def counted_edges(dfa: ByteDFA, counted) -> np.ndarray | None:
    """bool [S, 256]: the byte edges into, inside or out of counted string bodies (None: none)."""
    if not counted.num_regions:
        return None
    region = np.append(counted.region, -1)
    return (region[:-1] >= 0)[:, None] | (region[dfa.trans] >= 0)


def stack_entries(dfa: ByteDFA, marks: StackMarks, vi, counted: np.ndarray | None = None, items=None,
                  ws: str | None = None) -> tuple[StackEntries, tuple[np.ndarray, np.ndarray]]:
    """Walk every (state, token) pair whose token holds a bracket byte with a symbolic stack.

    `counted`: counted_edges (a token with a stack event crosses none unless it only pushes one
    level from outside a free-form value: the string kernel's budget is then exact as it is);
    `items`: the counted arrays (ItemRegions): a token that pops may cross their separators and
    close the innermost (its outcomes say how many, the stack kernels count them); a token that
    only pushes is held to the rule for counted strings (the item kernel counts it as a DFA edge).
    `ws`: the grammar's whitespace regex; where given, the states of every copy of
    `stack_value_regex(ws)` take the outcomes that stay inside the value from one walk of the
    value's own automaton per process (`_shared_copies`), and only the pairs that may leave it are
    walked here. Returns the entries and the (state, token) DFA edges to drop (they push and break
    that rule)."""
    toks = _bracket_tokens(vi)
    if not toks.size:
        return _empty_entries(), (np.zeros(0, np.int64), np.zeros(0, np.int64))
    level = _near_pushes(dfa, marks, int(vi.lens[toks].max()) - 1)
    near = level >= 0
    parts, drops, flat = [], [], None
    shared = _shared_copies(dfa, marks, vi, ws, counted, items) if ws is not None else None
    if shared is not None:
        covered, internal, resume = shared
        near &= ~covered
        parts.append(internal)
        if resume["src"].size:  # walkers that left the value: on from where each copy's end leads
            flat = _flat_rows(dfa, marks, counted, items)
            out, drop = _walk(dfa, marks, vi, None, None, counted, items, resume=resume, flat=flat)
            parts.append(out)
            drops.append(drop)
    src, tok = _candidates(dfa, marks, vi, np.flatnonzero(near), toks, level)
    if src.size:
        out, drop = _walk(dfa, marks, vi, src, tok, counted, items, flat=flat)
        parts.append(out)
        drops.append(drop)
    drop = (np.concatenate([d[0] for d in drops] or [np.zeros(0, np.int64)]),
            np.concatenate([d[1] for d in drops] or [np.zeros(0, np.int64)]))
    parts = [p for p in parts if p["src"].size]
    if not parts:
        return _empty_entries(), drop
    return _grouped({key: np.concatenate([p[key] for p in parts]) for key in _OUTCOME_KEYS}, vi.vocab_size), drop


_BRACKET_TOKENS: dict[int, tuple] = {}  # id(vocab index) -> (the index, kept alive, its bracket tokens)


def _bracket_tokens(vi) -> np.ndarray:
    """int64 ids of the tokens that hold a `{`, `}`, `[` or `]` byte (found once per vocabulary)."""
    hit = _BRACKET_TOKENS.get(id(vi))
    if hit is not None and hit[0] is vi:
        return hit[1]
    bracket = np.zeros(256, dtype=bool)
    bracket[[*_OPENERS, *_CLOSERS]] = True
    has = np.concatenate([[0], np.cumsum(bracket[vi.flat])])
    toks = np.flatnonzero((vi.lens > 0) & (has[vi.off + vi.lens] > has[vi.off])).astype(np.int64)
    toks.flags.writeable = False
    _BRACKET_TOKENS[id(vi)] = (vi, toks)
    return toks


def _candidates(dfa: ByteDFA, marks: StackMarks, vi, states: np.ndarray, toks: np.ndarray,
                level: np.ndarray | None = None):
    """(src, tok) of `states` x `toks` whose first byte lives and whose plain walk reaches an event
    (`level`: _near_pushes', a token shorter than that many bytes and the push cannot)."""
    if not states.size or not toks.size:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    # tokens grouped by first byte, longest first: per live (state, first byte) the tokens long
    # enough to reach an event are a prefix of the byte's group (no [S', T] matrix: 0.4 s -> 0.05 s
    # at 19k states x 1.8k tokens)
    first = vi.flat[vi.off[toks]].astype(np.int64)
    lens = vi.lens[toks].astype(np.int64)
    order = np.lexsort((-lens, first))
    first, lens, by_first = first[order], lens[order], toks[order].astype(np.int64)
    span = int(lens.max()) + 1
    key = first * span + (span - 1 - lens)  # ascending: by byte, then longest first
    bounds = np.searchsorted(first, np.arange(257))
    si, b = np.nonzero((dfa.trans[states] >= 0) | (marks.pop[states] >= 0))  # [S', 256]
    shortest = 1 if level is None else np.maximum(level[states[si]], 0) + 1  # a token needs len > level
    count = np.searchsorted(key, b * span + (span - np.asarray(shortest)), side="left") - bounds[b]
    count = np.maximum(count, 0)
    src = np.repeat(states[si].astype(np.int64), count)
    tok = by_first[range_indices(bounds[b], count)]
    keep = _reaches_an_event(dfa, marks, vi, src, tok)
    src, tok = src[keep], tok[keep]
    order = np.lexsort((tok, src))  # by state, then token id
    return src[order], tok[order]


# -- one walk of the free-form value per process, shared by its copies ------------------------------
#
# Every place a free-form value occurs holds its own copy of stack_value_regex's automaton (the
# copies differ only in where the value's end leads), and each copy's (state, token) pairs used to
# be walked anew: ~13 ms of a one-copy schema's ~35, 4 s of a 52-copy one. A token walked from
# inside the value that never leaves it (no closer reveals "none around") has the same outcomes in
# every copy, up to the copy's state ids; those are walked once per process, vocabulary and
# whitespace style from the value's own automaton (_Template) and mapped to each copy found by a
# lockstep search from its openings (_match_copy). The pairs that may leave the value (a walk took
# the "none around" branch in the template) are walked from each copy and keep only such outcomes.


@dataclass
class _Template:
    dfa: ByteDFA  # stack_value_regex(ws)'s automaton, marks cut
    marks: StackMarks
    entry: dict  # opening byte -> the state its push from the start leads to
    internal: dict  # flat outcomes (_OUTCOME_KEYS) of pairs from inside the value that stay inside (template ids)
    exits: dict  # walkers stopped where the value ended (_walk's `exits`, concatenated; template ids)
    tree: list  # per level of a breadth-first tree from the entries: (parent, byte, kind, child) arrays


_TEMPLATES: dict[tuple[int, str], tuple] = {}  # (id(vocab index), ws) -> (the index, kept alive, _Template or None)


def _template(vi, ws: str) -> _Template | None:
    hit = _TEMPLATES.get((id(vi), ws))
    if hit is not None and hit[0] is vi:
        return hit[1]
    cut = cut_stack_marks(regex_to_dfa(stack_value_regex(ws)))
    template = None
    if cut is not None:
        dfa, marks = cut
        entry = {b: int(dfa.trans[0, b]) for b in _OPENERS if marks.push[0, b] > 0 and dfa.trans[0, b] >= 0}
        inside = np.flatnonzero(marks.ctx != CTX_NONE)
        src, tok = _candidates(dfa, marks, vi, inside, _bracket_tokens(vi))
        exits: list = []
        out, _ = _walk(dfa, marks, vi, src, tok, None, None, exits=exits)
        keys = (*_RESUME_KEYS, "xq", "xb")
        template = _Template(dfa, marks, entry, out,
                             {key: np.concatenate([e[key] for e in exits] or [np.zeros(0, np.int64)]) for key in keys},
                             _spanning_tree(dfa, marks, entry))
    _TEMPLATES[(id(vi), ws)] = (vi, template)
    return template


def _shared_copies(dfa: ByteDFA, marks: StackMarks, vi, ws: str, counted, items):
    """(covered states, their outcomes that stay inside the value, the walkers to resume where it
    ends) of the copies of the free-form value that match the template, or None."""
    t = _template(vi, ws)
    if t is None:
        return None
    n = dfa.num_states
    maps = _match_copies(dfa, marks, t)
    if not maps:
        return None
    covered = np.zeros(n, dtype=bool)
    for g in maps:
        covered[g[g >= 0]] = True
    # the template knows nothing of counted strings or arrays: a copy must hold none of their events
    if counted is not None and counted[covered].any():
        return None
    if items is not None and (items.events[covered] != 0).any():
        return None
    internal, resume = [], []
    for g in maps:
        src = g[t.internal["src"]]
        use = src >= 0
        part = {key: a[use] for key, a in t.internal.items()}
        part["src"], part["q"] = src[use], g[part["q"]]
        if (part["q"] < 0).any():
            return None
        internal.append(part)
        e = t.exits
        src, xq = g[e["src"]], g[e["xq"]]
        use = (src >= 0) & (xq >= 0)
        pidx = marks.pop[np.maximum(xq, 0), e["xb"]]
        use &= pidx >= 0
        q = np.where(use, marks.targets[np.maximum(pidx, 0), 2], -1)
        use &= q >= 0
        part = {key: e[key][use] for key in _RESUME_KEYS}
        part["src"], part["q"] = src[use], q[use].astype(np.int64)
        resume.append(part)
    merged = {key: np.concatenate([p[key] for p in internal]) for key in _OUTCOME_KEYS}
    return covered, merged, {key: np.concatenate([p[key] for p in resume]) for key in (*_RESUME_KEYS, "q")}


def _spanning_tree(dfa: ByteDFA, marks: StackMarks, entry: dict) -> list:
    """The template's states inside the value as a breadth-first tree from its entries: per level,
    (parent, byte, kind, child), kind -1 for a byte edge, 0 / 1 for a closer's object / array target."""
    seen = np.zeros(dfa.num_states, dtype=bool)
    frontier = np.asarray(sorted(set(entry.values())), dtype=np.int64)
    seen[frontier] = True
    levels = []
    while frontier.size:
        par, byte, kind, child = [], [], [], []
        i, b = np.nonzero(dfa.trans[frontier] >= 0)
        par.append(frontier[i]), byte.append(b), kind.append(np.full(i.size, -1)), child.append(dfa.trans[frontier[i], b])
        i, b = np.nonzero(marks.pop[frontier] >= 0)
        for k in (0, 1):
            tgt = marks.targets[marks.pop[frontier[i], b], k]
            live = tgt >= 0
            par.append(frontier[i][live]), byte.append(b[live]), kind.append(np.full(int(live.sum()), k))
            child.append(tgt[live])
        par, byte, kind, child = (np.concatenate(x).astype(np.int64) for x in (par, byte, kind, child))
        _, first = np.unique(child, return_index=True)
        new = first[~seen[child[first]]]
        if not new.size:
            break
        levels.append((par[new], byte[new], kind[new], child[new]))
        seen[child[new]] = True
        frontier = child[new]
    return levels


def _match_copies(dfa: ByteDFA, marks: StackMarks, t: _Template) -> list[np.ndarray]:
    """Per copy of the value that matches the template: template id -> this DFA's state (-1 where
    the copy does not reach it). A copy is entered by the pushes from states outside any value;
    its states are found along the template's spanning tree (all copies at once), then every edge
    of every matched state is checked against the template's. A copy that disagrees anywhere, or
    shares a state with another, is dropped (its states are walked as they are)."""
    n, nt = dfa.num_states, t.dfa.num_states
    pq, pb = np.nonzero(marks.push > 0)
    outside = marks.ctx[pq] == CTX_NONE
    pq, pb = pq[outside].astype(np.int64), pb[outside]
    if not pq.size:
        return []
    # places whose openings lead to the same states share one copy (minimisation merges copies
    # whose continuations agree): a copy is keyed by its entry states
    into = np.full((n, 2), -1, dtype=np.int64)
    into[pq, (pb == ord("[")).astype(np.int64)] = dfa.trans[pq, pb]
    keys = np.unique(into[np.unique(pq)], axis=0)
    copies = keys.shape[0]
    g = np.full((copies, nt + 1), -1, dtype=np.int64)  # column nt: "none", so that g[:, -1] reads -1
    failed = np.zeros(copies, dtype=bool)
    for col, byte in ((0, ord("{")), (1, ord("["))):
        local = t.entry.get(byte, -1)
        if local >= 0:
            g[:, local] = keys[:, col]
        failed |= (local < 0) & (keys[:, col] >= 0)
    failed |= (keys < 0).any(axis=1)  # a place that opens only one kind: walked as it is
    rows = np.arange(copies)[:, None]
    for par, byte, kind, child in t.tree:
        at = g[:, par]  # [copies, level]
        ok = at >= 0
        safe = np.maximum(at, 0)
        step = np.where(kind < 0, dfa.trans[safe, byte], -1)
        pidx = marks.pop[safe, byte]
        step = np.where((kind >= 0) & (pidx >= 0), marks.targets[np.maximum(pidx, 0), np.maximum(kind, 0)], step)
        g[rows, child] = np.where(ok, step, -1)
    g = g[:, :nt]
    # check every edge of every matched state
    c, loc = np.nonzero(g >= 0)
    a = g[c, loc]
    ra, rb = dfa.trans[a], t.dfa.trans[loc]
    bad = ((ra >= 0) != (rb >= 0)).any(axis=1) | (marks.push[a] != t.marks.push[loc]).any(axis=1)
    pa, pt = marks.pop[a], t.marks.pop[loc]
    bad |= ((pa >= 0) != (pt >= 0)).any(axis=1)
    bad |= (marks.ctx[a] != t.marks.ctx[loc]) | (marks.ctx[a] == CTX_NONE) | (dfa.accept[a] != t.dfa.accept[loc])
    gx = np.concatenate([g, np.full((copies, 1), -1, dtype=np.int64)], axis=1)
    bad |= (np.where(rb >= 0, ra, -1) != gx[c[:, None], rb]).any(axis=1)
    i, b = np.nonzero(pt >= 0)
    ta, tb = marks.targets[np.maximum(pa[i, b], 0)], t.marks.targets[pt[i, b]]
    wrong = (pa[i, b] < 0) | ((ta[:, 2] >= 0) != (tb[:, 2] >= 0))
    for k in (0, 1):  # a level around: inside the value (the "none around" target leaves it)
        wrong |= ta[:, k] != gx[c[i], tb[:, k]]
    bad[i[wrong]] = True
    failed[c[bad]] = True
    # a state in two copies, or two template states on one state of a copy: not a copy
    order = np.argsort(a, kind="stable")
    twice = a[order][1:] == a[order][:-1]
    failed[c[order][1:][twice]] = True
    failed[c[order][:-1][twice]] = True
    return [g[k] for k in np.flatnonzero(~failed).tolist()]


def _reaches_an_event(dfa: ByteDFA, marks: StackMarks, vi, src: np.ndarray, tok: np.ndarray) -> np.ndarray:
    """bool per (state, token): the token's plain walk reaches a push or closer edge before it dies
    or ends (most pairs from inside strings never do: one cheap pass before the symbolic walk)."""
    n = dfa.num_states
    flat = dfa.trans.reshape(-1)
    event = ((marks.push > 0) | (marks.pop >= 0)).reshape(-1)
    out = np.zeros(src.size, dtype=bool)
    idx = np.arange(src.size)
    q = src.astype(np.int64)
    ptr = vi.off[tok].astype(np.int64)
    end = ptr + vi.lens[tok]
    while idx.size:
        at = q * 256 + vi.flat[ptr]
        hit = event[at]
        out[idx[hit]] = True
        nxt = flat[at].astype(np.int64)
        ptr = ptr + 1
        go = ~hit & (nxt >= 0) & (nxt < n) & (ptr < end)
        idx, q, ptr, end = idx[go], nxt[go], ptr[go], end[go]
    return out


def _empty_entries() -> StackEntries:
    z64, z8 = np.zeros(0, np.int64), np.zeros(0, np.int8)
    return StackEntries(z64, z64, np.zeros(1, np.int64), np.zeros(0, bool), z8, z64, np.zeros(0, np.int32), z8, z8, z64,
                        np.zeros(0, np.int32), np.zeros(0, bool), np.zeros(0, np.int32), z8, np.zeros(0, np.int32))


_OUTCOME_KEYS = ("src", "tok", "known_len", "known_bits", "exact", "j", "ins_len", "ins_bits", "q", "closed", "tail",
                 "inc", "flag", "counter")


_RESUME_KEYS = ("src", "tok", "pos", "ins_len", "ins_bits", "j", "known_len", "known_bits", "exact")


def _flat_rows(dfa: ByteDFA, marks: StackMarks, counted, items) -> tuple:
    """_walk's tables, flat over state * 256 + byte, with a dead row n (no edge leads to n)."""
    n = dfa.num_states
    trans = np.empty((n + 1, 256), dtype=np.int64)
    trans[:n] = np.where(dfa.trans >= 0, dfa.trans, n)
    trans[n] = n
    push = np.vstack([marks.push, np.zeros((1, 256), np.int8)]).reshape(-1)
    pop = np.vstack([marks.pop, np.full((1, 256), -1, np.int32)]).reshape(-1)
    bad = None if counted is None else np.vstack([counted, np.zeros((1, 256), bool)]).reshape(-1)
    events = None if items is None else np.vstack([items.events, np.zeros((1, 256), np.int8)]).reshape(-1)
    return trans.reshape(-1), push, pop, bad, events


def _walk(dfa, marks: StackMarks, vi, src, tok, counted, items, exits: list | None = None, resume: dict | None = None,
          flat: tuple | None = None):
    """The symbolic walk of stack_entries, vectorised over walkers; a walker that reaches a pop
    whose revealed level is unknown splits in three (an object, an array, no level: the value ends).
    Returns the outcomes (flat, _OUTCOME_KEYS) and the DFA edges to drop.

    `exits` (the template's walk): a walker that takes a "no level" branch stops there and its
    state is appended (_RESUME_KEYS, plus the closer's state `xq` and byte `xb`), not walked on.
    `resume`: walkers that start at such a point instead of at `src` (_RESUME_KEYS and `q`, the
    state the value's end leads to; `src`/`tok` are then ignored). `flat`: _flat_rows' tables."""
    n = dfa.num_states
    trans, push, pop, bad, events = flat if flat is not None else _flat_rows(dfa, marks, counted, items)
    targets = marks.targets.astype(np.int64)
    ctx = marks.ctx
    if resume is None:
        w = {  # one entry per walker
            "src": src, "tok": tok, "q": src.copy(), "pos": np.zeros(src.size, np.int64),
            "ins_len": np.zeros(src.size, np.int64), "ins_bits": np.zeros(src.size, np.int64),
            "j": np.zeros(src.size, np.int64),
            "known_len": (ctx[src] != CTX_NONE).astype(np.int64),
            "known_bits": (ctx[src] == CTX_ARRAY).astype(np.int64),
            "exact": np.where(ctx[src] == CTX_NONE, 0, -1).astype(np.int64),
            "event": np.zeros(src.size, bool), "closed": np.zeros(src.size, bool),
            "tail": np.zeros(src.size, np.int64), "forbid": np.zeros(src.size, bool),
            "item": np.zeros(src.size, bool),
        }
    else:  # past a closer that ended the value: its last level popped, nothing walked since
        m = resume["src"].size
        w = {key: resume[key].astype(np.int64) for key in (*_RESUME_KEYS, "q")}
        w.update({"event": np.ones(m, bool), "closed": np.ones(m, bool), "tail": np.full(m, -1, np.int64),
                  "forbid": np.zeros(m, bool), "item": np.zeros(m, bool)})
    if exits is not None:
        w.update({"xnow": np.zeros(w["src"].size, bool), "xq": np.zeros(w["src"].size, np.int64),
                  "xb": np.zeros(w["src"].size, np.int64)})
    if items is not None:  # the item walk's own state (grammars/items.py), keys prefixed
        from surecall.grammars.items import item_walk_start

        w.update({f"i_{k}": a for k, a in item_walk_start(items, w["src"]).items()})
    lens = vi.lens
    done = []
    while w["src"].size:
        end = lens[w["tok"]] <= w["pos"]
        if end.any():
            done.append({key: a[end] for key, a in w.items()})
            w = {key: a[~end] for key, a in w.items()}
            if not w["src"].size:
                break
        b = vi.flat[vi.off[w["tok"]] + w["pos"]].astype(np.int64)
        at = w["q"] * 256 + b
        p = pop[at]
        if bad is not None:
            w["forbid"] |= bad[at]
        if events is not None:  # counted arrays' separators, openings and closings (as items.py walks them)
            from surecall.grammars.items import item_walk_step

            ev = events[at]
            view = {k[2:]: a for k, a in w.items() if k.startswith("i_")}
            item_walk_step(items, view, np.arange(ev.size), np.minimum(w["q"], n - 1), ev)
            w["item"] |= ev != 0
        closing = p >= 0
        # plain bytes and pushes
        nxt = trans[at]
        kind = push[at].astype(np.int64)
        opens = kind > 0
        w["ins_bits"] = np.where(opens, (w["ins_bits"] << 1) | (kind - 1), w["ins_bits"])
        w["ins_len"] = w["ins_len"] + opens
        w["event"] |= opens | closing
        if exits is not None:
            w["xq"], w["xb"] = w["q"].copy(), b
        w["q"] = np.where(closing, w["q"], nxt)
        w["tail"] += 1
        w["pos"] = w["pos"] + 1
        if closing.any():
            w = _pop_step(w, closing, p, targets, n)
        keep = w["q"] < n
        if exits is not None:  # the value ended: where it goes is the copy's, the template stops here
            x = w["xnow"] & keep
            if x.any():
                exits.append({key: w[key][x] for key in (*_RESUME_KEYS, "xq", "xb")})
                keep &= ~x
        w = {key: a[keep] for key, a in w.items()}
    no_drop = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    if not done:
        return {key: np.zeros(0, np.int64) for key in _OUTCOME_KEYS}, no_drop
    out = {key: np.concatenate([d[key] for d in done]) for key in done[0]}
    # Beside an item event or a counted string, a stack event is kept only where it adds nothing to
    # the row's need (one level pushed from outside a free-form value, nothing closed): the item and
    # string kernels' budget is then exact without the stack's part. A token that only pushes is a
    # DFA edge already: where it is not kept, it goes.
    plain = ~out["closed"]
    adds = (ctx[out["src"]] != CTX_NONE) | (out["ins_len"] > 1)
    bad = np.where(plain, out["forbid"] & adds, out["forbid"])
    inc = np.zeros(plain.size, np.int64)
    flag = np.zeros(plain.size, np.int64)
    counter = np.full(plain.size, -1, np.int64)
    if items is not None:  # a token that pops and crosses item events: its outcome carries them
        from surecall.grammars.items import item_walk_finish

        view = {k[2:]: a for k, a in out.items() if k.startswith("i_")}
        ok, inc, flag, counter = item_walk_finish(items, view, out["src"], out["q"], np.arange(plain.size))
        bad |= ~plain & out["item"] & ~ok
        inc, flag = np.where(plain, 0, inc), np.where(plain, 0, flag)
    out["inc"], out["flag"], out["counter"] = inc, flag, counter
    drop = out["event"] & bad & plain
    drop = (out["src"][drop], out["tok"][drop])
    keep = out["event"] & ~bad
    return {key: out[key][keep] for key in _OUTCOME_KEYS}, drop


def _grouped(out: dict, vocab_size: int) -> StackEntries:
    """Flat outcomes -> StackEntries: entries by s * V + t, outcomes inside one in a fixed order (the
    walkers' conditions are disjoint, so the order says nothing; fixed, a table is the same
    whichever walk found its outcomes)."""
    key = out["src"] * vocab_size + out["tok"]
    order = np.lexsort((out["q"], out["ins_bits"], out["ins_len"], out["j"], out["known_bits"], out["exact"],
                        out["known_len"], key))
    out = {k: a[order] for k, a in out.items()}
    key = key[order]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if key.size else np.zeros(0, np.int64)
    ptr = np.append(starts, key.size).astype(np.int64)
    return StackEntries(
        src=out["src"][starts], tok=out["tok"][starts], ptr=ptr, edge=~out["closed"][starts].astype(bool),
        cond_len=out["known_len"].astype(np.int8), cond_bits=out["known_bits"].astype(np.int64),
        cond_depth=out["exact"].astype(np.int32), pops=out["j"].astype(np.int8),
        push_len=out["ins_len"].astype(np.int8), push_bits=out["ins_bits"].astype(np.int64),
        next=out["q"].astype(np.int32), closer_last=(out["j"] > 0) & (out["tail"] < 0),
        item_inc=out["inc"].astype(np.int32), item_flag=out["flag"].astype(np.int8),
        item_set=np.where((out["flag"] & 2) != 0, out["counter"], -1).astype(np.int32),
        weight=out["weight"].astype(np.int64) if "weight" in out else None)


def _pop_step(w: dict, closing: np.ndarray, p: np.ndarray, targets: np.ndarray, n: int) -> dict:
    """Apply a closer byte to the walkers where `closing` holds (pop index `p`), splitting those
    whose revealed level is unknown."""
    idx = np.flatnonzero(closing)
    own = w["ins_len"][idx] > 0
    # a level this token pushed: pop it; otherwise pop a level of the row's stack (its kind is
    # known: the DFA state's context, or a level revealed before)
    w["ins_len"][idx] = np.where(own, w["ins_len"][idx] - 1, 0)
    w["ins_bits"][idx] = np.where(own, w["ins_bits"][idx] >> 1, 0)
    w["j"][idx] = np.where(own, w["j"][idx], w["j"][idx] + 1)
    w["tail"][idx] = np.where(own, w["tail"][idx], -1)  # -1: nothing walked since the row's last level popped
    w["closed"][idx] = True
    ins_len, ins_bits, j = w["ins_len"][idx], w["ins_bits"][idx], w["j"][idx]
    known_len, known_bits, exact = w["known_len"][idx], w["known_bits"][idx], w["exact"][idx]
    tgt = targets[p[idx]]
    # the revealed level: one this token pushed, a known level of the row, none (exact depth), or unknown
    mine = ins_len > 0
    known = ~mine & (known_len > j)
    ends = ~mine & ~known & (exact == j)
    unknown = ~mine & ~known & ~ends
    rev_kind = np.where(mine, ins_bits & 1, (known_bits >> j) & 1)
    q = np.where(ends, tgt[:, 2], tgt[np.arange(idx.size), rev_kind])
    w["q"][idx] = np.where(unknown, n, np.where(q >= 0, q, n))
    if not unknown.any():
        return w
    # split: the unknown level is an object, an array, or there is none (the row's depth is j)
    u = idx[unknown]
    extra = {key: np.concatenate([a[u]] * 3) for key, a in w.items()}
    m = u.size
    tu = tgt[unknown]
    branch = np.repeat(np.arange(3), m)
    q3 = np.concatenate([tu[:, 0], tu[:, 1], tu[:, 2]])
    none_ok = np.concatenate([np.ones(2 * m, bool), extra["exact"][2 * m:] < 0])  # a known depth is never j here
    extra["q"] = np.where((q3 >= 0) & none_ok, q3, n)
    if "xnow" in extra:  # the template's walk: these walkers have just left the value
        extra["xnow"] = branch == 2
    jj = extra["j"]
    is_level = branch < 2
    extra["known_bits"] = np.where(is_level, extra["known_bits"] | (branch.astype(np.int64) << jj), extra["known_bits"])
    extra["known_len"] = np.where(is_level, jj + 1, extra["known_len"])
    extra["exact"] = np.where(is_level, extra["exact"], jj)
    return {key: np.concatenate([a, extra[key]]) for key, a in w.items()}


# -- the table (grammars/table.py "Bracket stack") --------------------------------------------------


def free_form_weights(entries: StackEntries) -> np.ndarray:
    """int64 [O]: each free-form outcome's weight as an edge of dist (0: none): from outside a
    free-form value 1 + the levels left open beyond the first; from inside one that holds at depth
    1 and leaves the stack as deep or deeper 1 + the levels pushed; one that closes its last level
    with the token's last byte 1 (dist_edges)."""
    is_f = entries.cond_depth != 0  # a source inside a free-form value (depth >= 1)
    cl, cd, pops, pl = entries.cond_len, entries.cond_depth, entries.pops, entries.push_len.astype(np.int64)
    return np.where(~is_f, 1 + np.maximum(pl - 1, 0),
                    np.where((cd < 0) & (cl <= 1) & (pops == 0), 1 + pl,
                             np.where((cd == 1) & (pops == 1) & entries.closer_last & (pl == 0), 1, 0))).astype(np.int64)


def merge_entries(a: StackEntries, b: StackEntries) -> StackEntries:
    """One StackEntries of two whose (state, token) pairs are disjoint (free-form values' and
    calls'), entries in key order, each outcome with its weight (free_form_weights where unset)."""
    wa = a.weight if a.weight is not None else free_form_weights(a)
    wb = b.weight if b.weight is not None else free_form_weights(b)
    src, tok = np.concatenate([a.src, b.src]), np.concatenate([a.tok, b.tok])
    width = int(max(tok.max(initial=0), 0)) + 1
    order = np.lexsort((tok, src))
    key = src[order] * width + tok[order]
    if key.size > 1 and (key[1:] == key[:-1]).any():
        raise StackCutError("a token crosses a free-form value's bracket and a call in one entry")
    ptr = np.concatenate([a.ptr[:-1], b.ptr[:-1] + a.ptr[-1]])
    count = np.concatenate([np.diff(a.ptr), np.diff(b.ptr)])
    outs = range_indices(ptr[order], count[order])
    new_ptr = np.zeros(order.size + 1, dtype=np.int64)
    new_ptr[1:] = np.cumsum(count[order])

    def cat(name: str) -> np.ndarray:
        return np.concatenate([getattr(a, name), getattr(b, name)])[outs]

    return StackEntries(
        src=src[order], tok=tok[order], ptr=new_ptr, edge=np.concatenate([a.edge, b.edge])[order],
        cond_len=cat("cond_len"), cond_bits=cat("cond_bits"), cond_depth=cat("cond_depth"), pops=cat("pops"),
        push_len=cat("push_len"), push_bits=cat("push_bits"), next=cat("next"), closer_last=cat("closer_last"),
        item_inc=cat("item_inc"), item_flag=cat("item_flag"), item_set=cat("item_set"),
        weight=np.concatenate([wa, wb])[outs])


def add_stack_inplace(table, entries: StackEntries, new_id: np.ndarray) -> None:
    """The stack_* fields (DFA ids renumbered by `new_id`; entries of pruned states go, outcomes
    into pruned states go). Set before dist: `dist_edges` reads them."""
    width = table.logits_width
    src = new_id[entries.src]
    per = np.diff(entries.ptr)
    owner = np.repeat(np.arange(entries.src.size), per)
    nxt = new_id[entries.next]
    live_out = (src[owner] >= 0) & (nxt >= 0)
    kept = np.bincount(owner[live_out], minlength=entries.src.size)
    live = src >= 0
    key = src.astype(np.int64) * width + entries.tok
    order = np.argsort(np.where(live, key, np.iinfo(np.int64).max), kind="stable")[: int(live.sum())]
    ptr = np.zeros(order.size + 1, dtype=np.int64)
    ptr[1:] = np.cumsum(kept[order])
    outs = range_indices(entries.ptr[order], per[order])  # every outcome of the entries in `order`, in order
    outs = outs[live_out[outs]]
    weight = (entries.weight if entries.weight is not None else free_form_weights(entries))[outs]
    table.stack_key = key[order].astype(np.int64)
    table.stack_ptr = ptr.astype(np.int32)
    table.stack_edge = entries.edge[order].astype(np.int8)
    table.stack_cond_len = entries.cond_len[outs].astype(np.int8)
    table.stack_cond_bits = entries.cond_bits[outs].astype(np.int64)
    table.stack_cond_depth = entries.cond_depth[outs].astype(np.int32)
    table.stack_pops = entries.pops[outs].astype(np.int8)
    table.stack_push_len = entries.push_len[outs].astype(np.int8)
    table.stack_push_bits = entries.push_bits[outs].astype(np.int64)
    table.stack_next = nxt[outs].astype(np.int32)
    table.stack_weight = weight.astype(np.int8)
    table.stack_item_inc = entries.item_inc[outs].astype(np.int32)
    table.stack_item_flag = entries.item_flag[outs].astype(np.int8)
    table.stack_item_set = entries.item_set[outs].astype(np.int32)


def dist_edges(table, src: np.ndarray, dst: np.ndarray, weight: np.ndarray, sentinel: int):
    """The token edges of dist with the stack's part: (source, target, weight).

    Edges into `sentinel` (where every token that pops is sent in the plain table) are replaced by
    the outcomes dist may use, and the DFA edges of tokens that push are charged their levels: an
    outcome from outside a free-form value (depth 0), or from inside one that holds at depth 1 and
    leaves the stack as deep or deeper, or closes its last level with the token's last byte
    (`stack_weight`: 1 + the levels left open beyond the first). A row at depth d then needs at
    most dist[s] + max(d - 1, 0) tokens: close the innermost container as at depth 1, then one
    closer per level (dist[a] <= dist[x] + 1 where a closer's targets are a and x, checked by
    check_stack_dist). A pair (s, t) reached by tokens that push different numbers of levels is
    charged the most (an upper bound: the rule above still holds)."""
    if not table.has_stack:
        return src, dst, weight
    n = np.int64(table.num_states)
    e_src = np.repeat(table.stack_key // table.logits_width, np.diff(table.stack_ptr.astype(np.int64)))
    e_edge = np.repeat(table.stack_edge.astype(bool), np.diff(table.stack_ptr.astype(np.int64)))
    extra = table.stack_weight.astype(np.int64) - 1
    pushes = e_edge & (extra > 0)
    pair = e_src[pushes] * n + table.stack_next[pushes]
    charged, at = np.unique(pair, return_inverse=True)
    most = np.zeros(charged.size, dtype=np.int64)
    np.maximum.at(most, at, extra[pushes])
    key = src.astype(np.int64) * n + dst
    i = np.minimum(np.searchsorted(charged, key), max(charged.size - 1, 0))
    hit = (charged[i] == key) if charged.size else np.zeros(key.size, dtype=bool)
    weight = weight.astype(np.int64) + np.where(hit, most[i] if charged.size else 0, 0)
    keep = dst != sentinel
    used = ~e_edge & (table.stack_weight > 0)
    acc = int(np.flatnonzero(table.accept)[0])
    return (np.concatenate([src[keep], e_src[used], [sentinel]]).astype(np.int64),
            np.concatenate([dst[keep], table.stack_next[used], [acc]]).astype(np.int64),
            np.concatenate([weight[keep], table.stack_weight[used], [0]]).astype(np.int64))


def add_item_charges_inplace(table) -> None:
    """stack_item_charge: for an outcome that leaves a counted array open, that array's unmet
    minimum in tokens (item_cost * max(item_lo - counter, 0) of its next state; the item entry's
    counter for a token that only pushes, the outcome's own for one that pops): the stack kernel
    adds it to the row's unmet minItems before the token."""
    per = np.diff(table.stack_ptr.astype(np.int64))
    table.stack_item_charge = np.zeros(table.stack_next.size, dtype=np.int32)
    if not table.has_items:
        return
    nxt = table.stack_next.astype(np.int64)
    opens = (table.stack_item_flag & 2) != 0
    counter = table.stack_item_set.astype(np.int64)
    if table.item_key.size:
        key = np.repeat(table.stack_key, per)
        i = np.minimum(np.searchsorted(table.item_key, key), table.item_key.size - 1)
        edge = (table.item_key[i] == key) & ((table.item_flag[i] & 2) != 0) & np.repeat(table.stack_edge != 0, per)
        opens, counter = opens | edge, np.where(edge, table.item_set[i], counter)
    short = np.maximum(table.item_lo[nxt].astype(np.int64) - np.maximum(counter, 0), 0)
    table.stack_item_charge = np.where(opens, table.item_cost[nxt].astype(np.int64) * short, 0).astype(np.int32)


def check_stack_dist(table, marks: StackMarks, new_id: np.ndarray) -> None:
    """Raise StackCutError unless, at every closer, dist[a] <= dist[x] + 1 for its targets a (a level
    around) and x (none around): the rule dist_edges' bound stands on (a closer token exists)."""
    t = np.where(marks.targets >= 0, new_id[np.maximum(marks.targets, 0)], -1)
    t = t[t[:, 2] >= 0]
    dist = table.dist.astype(np.int64)
    for k in (0, 1):
        has = t[:, k] >= 0
        bad = has & ((dist[t[:, k]] < 0) | (dist[t[:, k]] > dist[t[:, 2]] + 1))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise StackCutError(f"state {int(t[i, k])}: a free-form container cannot be closed in one token "
                             f"(dist {int(dist[t[i, k]])} against {int(dist[t[i, 2]])} after it)")


def add_pop_tokens(rows, entries: StackEntries, sentinel: int) -> None:
    """Put every token that pops into its source's row, leading to `sentinel` (the plain mask
    allows it; the stack kernels choose its outcome)."""
    from surecall.grammars.tokenwalk import Row

    empty = np.zeros(0, dtype=np.int32)
    rows.append(Row(None, None, empty, empty))
    pops = ~entries.edge
    src, tok = entries.src[pops], entries.tok[pops]
    for q in np.unique(src).tolist():
        row = rows[q]
        t = tok[src == q].astype(np.int32)
        merged = np.concatenate([row.tok, t])
        nxt = np.concatenate([row.nxt, np.full(t.size, sentinel, dtype=np.int32)])
        at = np.argsort(merged, kind="stable")
        row.tok, row.nxt = merged[at], nxt[at].astype(row.nxt.dtype)


def drop_pairs(rows, pairs: tuple[np.ndarray, np.ndarray]) -> None:
    from surecall.grammars.counted import _drop_inplace

    src, tok = pairs
    for q in np.unique(src).tolist():
        _drop_inplace(rows, q, np.sort(tok[src == q]).astype(np.int32))


def stack_sentinel(table) -> int:
    """The state of tokens that pop (no DFA edge): the last one, with no tokens of its own."""
    return table.num_states - 1 if table.has_stack else -1


def concat_stack(tables: list, offsets: np.ndarray) -> dict:
    """The stack_* fields of several tables stacked (TokenTable.concat): keys, pointers and next
    states shifted, every other field as it is (each keeps the dtype of the first table's)."""
    from surecall.grammars.table import STACK_ARRAYS

    width = tables[0].logits_width
    stacked = [(t, off) for t, off in zip(tables, offsets.tolist(), strict=True) if t.has_stack]
    dtypes = {name: getattr(stacked[0][0], name).dtype for name in STACK_ARRAYS}
    parts: dict[str, list] = {name: [] for name in STACK_ARRAYS}
    parts["stack_ptr"].append(np.zeros(1, np.int64))
    base = 0
    for t, off in stacked:
        for name in STACK_ARRAYS:
            parts[name].append(getattr(t, name))
        parts["stack_key"][-1] = t.stack_key.astype(np.int64) + off * width
        parts["stack_ptr"][-1] = t.stack_ptr[1:].astype(np.int64) + base
        parts["stack_next"][-1] = t.stack_next.astype(np.int64) + off
        base += int(t.stack_ptr[-1])
    return {name: np.concatenate(p).astype(dtypes[name]) for name, p in parts.items()}


# -- the host side of the contract (kernels/stack.py on devices) -------------------------------------


def outcome(table, state: int, token: int, depth: int, bits: int, item=None):
    """(next state, depth, bits, item counters) after `token` from `state` for a row whose stack is
    (depth, bits) and item counters `item` (a stack, outermost first; None: the table has none);
    None when the token has an entry and no outcome holds, a push would pass MAX_STACK_DEPTH, or
    its separators break the innermost counted array's bounds. A token without an entry leaves
    both stacks alone: (-1, depth, bits, item)."""
    key = int(state) * table.logits_width + int(token)
    i = int(np.searchsorted(table.stack_key, key))
    if i >= table.stack_key.size or int(table.stack_key[i]) != key:
        return -1, depth, bits, item
    for o in range(int(table.stack_ptr[i]), int(table.stack_ptr[i + 1])):
        m = int(table.stack_cond_len[o])
        if bits & ((1 << m) - 1) != int(table.stack_cond_bits[o]):
            continue
        want = int(table.stack_cond_depth[o])
        if (depth != want) if want >= 0 else (depth < m):
            continue
        pops, pl = int(table.stack_pops[o]), int(table.stack_push_len[o])
        d = depth - pops + pl
        if d > MAX_STACK_DEPTH:
            return None
        inc, flag = int(table.stack_item_inc[o]), int(table.stack_item_flag[o])
        if inc or flag:
            from surecall.grammars.items import FLAG_CLOSES, FLAG_OPENS, as_stack

            if not table.has_items:
                return None
            item = as_stack(item)
            at = int(table.item_depth[state]) - 1
            closes = bool(flag & FLAG_CLOSES)
            if table.item_hi[state] >= 0:
                total = int(item[at]) + inc
                if total > int(table.item_hi[state]) or (closes and total < int(table.item_lo[state])):
                    return None
                item[at] = 0 if closes else total
            elif inc or closes:
                return None
            if flag & FLAG_OPENS:
                item[min(max(at + 1 - int(closes), 0), len(item) - 1)] = int(table.stack_item_set[o])
        return int(table.stack_next[o]), d, ((bits >> pops) << pl) | int(table.stack_push_bits[o]), item
    return None


def stack_step(table, state: int, depth: int, bits: int, toks: np.ndarray, nexts: np.ndarray, remaining: int,
               item=None):
    """Per token of `state`'s row (`nexts` its plain next states): (ok, next state, depth, bits,
    item counters) after it for a row whose stack is (depth, bits), with `remaining` tokens left
    (this one included): the host reference of kernels/stack.py. `ok` is the stack's rule: an
    outcome holds and, unless the token only pushes one level from outside a free-form value,
    dist[next] + stack_need(depth after) + the row's unmet minItems (before the token) + the
    outcome's item charge <= remaining - 1. The other rules (walk.kept, items.kept) apply with
    stack_remaining."""
    from surecall.grammars import items as item_rules

    n = toks.size
    ok = np.ones(n, dtype=bool)
    nexts = np.asarray(nexts, dtype=np.int64).copy()
    depths = np.full(n, depth, dtype=np.int64)
    kinds = np.full(n, bits, dtype=np.int64)
    after = [item] * n
    if not table.has_stack or not n:
        return ok, nexts, depths, kinds, after
    width = table.logits_width
    lo, hi = np.searchsorted(table.stack_key, [state * width, (state + 1) * width])
    if lo == hi:
        return ok, nexts, depths, kinds, after
    key = state * width + np.asarray(toks, dtype=np.int64)
    e = lo + np.searchsorted(table.stack_key[lo:hi], key)
    hit = np.flatnonzero((e < hi) & (table.stack_key[np.minimum(e, hi - 1)] == key))
    e = e[hit]
    o = _matching_outcomes(table, e, depth, bits)
    found = o >= 0
    oo = np.maximum(o, 0)
    d_after = depth - table.stack_pops[oo].astype(np.int64) + table.stack_push_len[oo].astype(np.int64)
    good = found & (d_after <= MAX_STACK_DEPTH)
    extra = int(item_rules.item_need(table, np.asarray([state]), np.asarray([item_rules.as_stack(item)]))[0]
                ) if table.has_items else 0
    nx = table.stack_next[oo].astype(np.int64)
    dist = table.dist[nx].astype(np.int64)
    if table.has_counts:
        body = table.count_row[nx] >= 0
        dist = dist + np.where(body, -(-table.count_lo[nx].astype(np.int64) // table.count_fill), 0)
    charge = table.stack_item_charge[oo].astype(np.int64) if table.stack_item_charge is not None else 0
    checked = (table.stack_edge[e] == 0) | (stack_need(d_after) > stack_need(depth))
    good &= ~checked | (dist + stack_need(d_after) + extra + charge <= remaining - 1)
    for i in np.flatnonzero(good & ((table.stack_item_inc[oo] != 0) | (table.stack_item_flag[oo] != 0))).tolist():
        got = outcome(table, state, int(toks[hit[i]]), depth, bits, item)  # the item counters' part
        if got is None:
            good[i] = False
        else:
            after[hit[i]] = got[3]
    ok[hit] = good
    nexts[hit] = np.where(good, nx, nexts[hit])
    depths[hit] = np.where(good, d_after, depth)
    kinds[hit] = np.where(good, ((bits >> table.stack_pops[oo].astype(np.int64)) << table.stack_push_len[oo].astype(
        np.int64)) | table.stack_push_bits[oo], bits)
    return ok, nexts, depths, kinds, after


def _matching_outcomes(table, entries: np.ndarray, depth: int, bits: int) -> np.ndarray:
    """Per entry, the outcome that holds for a row with stack (depth, bits), -1 where none does."""
    lo = table.stack_ptr[entries].astype(np.int64)
    count = table.stack_ptr[entries + 1].astype(np.int64) - lo
    width = int(count.max()) if count.size else 0
    out = np.full(entries.size, -1, dtype=np.int64)
    for j in range(width):
        o = np.minimum(lo + j, max(table.stack_cond_len.size - 1, 0))
        m = table.stack_cond_len[o].astype(np.int64)
        want = table.stack_cond_depth[o].astype(np.int64)
        holds = (j < count) & (out < 0) & ((bits & ((1 << m) - 1)) == table.stack_cond_bits[o])
        holds &= np.where(want >= 0, depth == want, depth >= m)
        out = np.where(holds, o, out)
    return out




def _dist_entry(table, state: int) -> int:
    """dist, plus a counted body's unmet minimum where `state` opens one (kernels.table.dist_entry)."""
    d = int(table.dist[state])
    if table.has_counts and table.count_row[state] >= 0:
        d += -(-int(table.count_lo[state]) // table.count_fill)
    return d


def stack_need(depth) -> np.ndarray | int:
    """Tokens a row's stack adds to dist: one closer per level beyond the innermost."""
    return np.maximum(np.asarray(depth) - 1, 0)
