"""Counted arrays: minItems/maxItems of any size enforced by a per-row stack of item counters.

The regex marks a counted array `[` MARK ... `,` MARK ... `]` MARK, one byte whose kind is the
byte before it (schema/to_regex.py: counted_array_regex); a counted object (min/maxProperties
over undeclared keys: Converter.counted_object) is marked `{` MARK ... `}` MARK and its members are
counted as items. `cut_item_marks` removes the marks from
the byte DFA and returns each array's states as one region with its bounds, each state's stack of
open arrays (at most MAX_ITEM_DEPTH deep: an array of counted arrays is counted at every level),
plus an event per (state, byte): an item separator, the closing `]`, or the opening `[`.
`item_entries` walks every (state, token) pair that can cross such a byte and returns, sparsely,
how many separators the token crosses in the innermost open array, whether it closes it, and the
counter of an array it leaves open (dropping tokens that break a bound on their own, and tokens a
one-level entry cannot describe: closing two open arrays, or closing one and crossing a separator
of the next, or leaving two new arrays open; shorter tokens spell the same text).
`add_items_inplace` fills a built table's item_* fields and the dist with unmet minItems. Each
counter counts separators crossed, so it stays within [max(minItems - 1, 0), maxItems - 1] (the
regex itself spells the empty array only when minItems is 0). It builds no CSR and runs no
kernels; the kernels' side is kernels/items.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from surecall.grammars.automaton import ByteDFA
from surecall.grammars.counted import (
    CountedCutError,
    Regions,
    _counted_edges,
    _drop_inplace,
    _follow_mark,
    cut_marks_renumbered,
    dist_to_accept,
    target_edges,
)
from surecall.grammars.schema.to_regex import ITEM_MARK, MAX_ITEM_DEPTH
from surecall.grammars.stack import dist_edges, stack_sentinel
from surecall.grammars.table import ITEM_ARRAYS, TokenTable

SEP, CLOSE, OPEN = 1, 2, 3  # events of a byte edge
# the byte before an item mark: its kind (a counted object's members are counted as items)
_EVENTS = {ord("["): OPEN, ord("{"): OPEN, ord(","): SEP, ord("]"): CLOSE, ord("}"): CLOSE}
FLAG_CLOSES, FLAG_OPENS = 1, 2  # item_flag bits: the token closes its state's array / opens one
# MAX_ITEM_DEPTH (schema/to_regex.py): counted arrays open at once, a row's stack of item counters
_MAX_ROUNDS = 12  # dist <-> per-item cost rounds before a grammar is compiled without item counters


@dataclass
class ItemRegions:
    """Counted arrays of a byte DFA (ids of that DFA)."""

    region: np.ndarray  # int32 [S]: the innermost array each state lies in, -1 outside counted arrays
    lo: np.ndarray  # int64 [R]: minItems
    hi: np.ndarray  # int64 [R]: maxItems (to_regex.NO_MAX_LENGTH when absent)
    events: np.ndarray  # int8 [S, 256]: SEP, CLOSE or OPEN on a byte edge, 0 elsewhere
    levels: np.ndarray  # int32 [S, MAX_ITEM_DEPTH]: the open arrays, outermost first, -1 past the depth

    @property
    def depth(self) -> np.ndarray:
        return (self.levels >= 0).sum(axis=1).astype(np.int32)

    @property
    def num_regions(self) -> int:
        return int(self.lo.shape[0])

    def sep_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Per region, the separator counter's (lo, hi): max(minItems - 1, 0), maxItems - 1."""
        return np.maximum(self.lo - 1, 0), self.hi - 1

    def renumbered(self, new_id: np.ndarray, num_states: int) -> ItemRegions:
        """The regions in the ids of a DFA pruned and renumbered by `new_id` (old -> new, -1 gone)."""
        keep = np.flatnonzero(new_id[: self.region.shape[0]] >= 0)
        region = np.full(num_states, -1, dtype=np.int32)
        events = np.zeros((num_states, 256), dtype=np.int8)
        levels = np.full((num_states, MAX_ITEM_DEPTH), -1, dtype=np.int32)
        region[new_id[keep]] = self.region[keep]
        events[new_id[keep]] = self.events[keep]
        levels[new_id[keep]] = self.levels[keep]
        return ItemRegions(region, self.lo, self.hi, events, levels)


def cut_all_marks(dfa: ByteDFA, is_pruned: bool = False) -> tuple[ByteDFA, Regions, ItemRegions | None]:
    """The DFA without string or item marks, its counted strings and its counted arrays (None: none);
    `is_pruned` as in cut_marks_renumbered (a grammar without marks is then returned as it is)."""
    if not (dfa.trans[:, ITEM_MARK] >= 0).any():
        cut, regions = cut_marks_renumbered(dfa, is_pruned)[:2]
        return cut, regions, None
    marked, items = cut_item_marks(dfa)
    cut, regions, new_id = cut_marks_renumbered(marked)
    items = items.renumbered(new_id, cut.num_states)
    if not (items.region >= 0).any():
        return cut, regions, None
    return cut, regions, items


def cut_item_marks(dfa: ByteDFA) -> tuple[ByteDFA, ItemRegions]:
    """The DFA (same ids; mark states left unreachable) without item marks, and its counted arrays."""
    trans = dfa.trans.copy()
    events = np.zeros(trans.shape, dtype=np.int8)
    heads: dict[int, tuple[int, int]] = {}
    for p in np.flatnonzero(trans[:, ITEM_MARK] >= 0).tolist():
        into = trans == p
        before = np.unique(np.nonzero(into)[1])
        if before.size != 1 or int(before[0]) not in _EVENTS:
            raise CountedCutError(f"state {p}: an item mark follows {bytes(before.tolist())!r}, not one of {bytes(_EVENTS)!r}")
        event = _EVENTS[int(before[0])]
        if event == SEP:
            if (trans[p] >= 0).sum() != 1:
                raise CountedCutError(f"state {p}: an item mark shares its state with other text")
            target, bounds = int(trans[p, ITEM_MARK]), None
        else:
            target, bounds = _follow_mark(trans, p, ITEM_MARK)
        if event == OPEN:
            if heads.get(target, bounds) != bounds:
                raise CountedCutError(f"state {target}: one array with two pairs of bounds")
            heads[target] = bounds
        events[into] = event
        trans[into] = target
    trans[:, ITEM_MARK] = -1
    cut = ByteDFA(trans, dfa.accept.copy())
    return cut, _item_regions(cut, events, sorted(heads.items()))


def _item_regions(dfa: ByteDFA, events: np.ndarray, heads: list) -> ItemRegions:
    """Each state's stack of open arrays (one walk from the start; a state met with two stacks, a
    `]` or `,` outside an array, or an accepting state inside one raises CountedCutError)."""
    region_of = {h: r for r, (h, _) in enumerate(heads)}
    stack_of: dict[int, tuple] = {0: ()}
    todo = [0]
    while todo:
        q = todo.pop()
        here = stack_of[q]
        live = np.flatnonzero(dfa.trans[q] >= 0)
        for pair in np.unique(dfa.trans[q, live].astype(np.int64) * 4 + events[q, live]).tolist():
            t, ev = divmod(pair, 4)
            if ev == OPEN:
                if t not in region_of:
                    raise CountedCutError(f"state {t}: an array opened without its bounds")
                after = (*here, region_of[t])
            elif ev == CLOSE:
                if not here:
                    raise CountedCutError(f"state {q}: a `]` closes no counted array")
                after = here[:-1]
            else:
                if ev == SEP and not here:
                    raise CountedCutError(f"state {q}: an item separator outside its array")
                after = here
            if len(after) > MAX_ITEM_DEPTH:
                raise CountedCutError(f"state {t}: counted arrays nested deeper than {MAX_ITEM_DEPTH}")
            if t not in stack_of:
                stack_of[t] = after
                todo.append(t)
            elif stack_of[t] != after:
                raise CountedCutError(f"state {t}: a counted array overlaps other text")
    levels = np.full((dfa.num_states, MAX_ITEM_DEPTH), -1, dtype=np.int32)
    for q, stack in stack_of.items():
        levels[q, : len(stack)] = stack
    depth = (levels >= 0).sum(axis=1)
    if (dfa.accept & (depth > 0)).any():
        raise CountedCutError(f"state {int(np.flatnonzero(dfa.accept & (depth > 0))[0])}: accepting inside an array")
    region = np.where(depth > 0, levels[np.arange(dfa.num_states), np.maximum(depth - 1, 0)], -1).astype(np.int32)
    return ItemRegions(
        region=region,
        lo=np.asarray([b[0] for _, b in heads], dtype=np.int64),
        hi=np.asarray([b[1] for _, b in heads], dtype=np.int64),
        events=events,
        levels=levels,
    )


@dataclass
class ItemEntries:
    """Sparse (state, token) facts of the tokens that cross an item event (DFA ids)."""

    src: np.ndarray  # int64 [E]
    tok: np.ndarray  # int64 [E]
    inc: np.ndarray  # int32 [E]: separators crossed in the source state's array before it closes
    flag: np.ndarray  # int8 [E]: FLAG_CLOSES | FLAG_OPENS
    set: np.ndarray  # int32 [E]: the counter after the token; -1: counter + inc (stays in its array)


def item_entries(rows, dfa: ByteDFA, items: ItemRegions, vi) -> ItemEntries:
    """Drop transitions that break an item bound on their own; return the sparse entries."""
    ev_byte = np.zeros(256, dtype=bool)
    ev_byte[list(_EVENTS)] = True
    counts = np.concatenate([[0], np.cumsum(ev_byte[vi.flat])])
    has_ev = counts[vi.off + vi.lens] > counts[vi.off]
    src, tok = [], []
    for q, row in enumerate(rows):
        parts = [row.tok[has_ev[row.tok]]]
        if row.base is not None:
            parts.append(row.base.tok[has_ev[row.base.tok]])
        t = np.concatenate(parts)
        src.append(np.full(t.size, q, dtype=np.int64))
        tok.append(t.astype(np.int64))
    src, tok = np.concatenate(src), np.concatenate(tok)
    ok, inc, flag, counter = _walk_items(dfa, items, vi, src, tok)
    bad: dict[int, list[int]] = {}
    for q, t in zip(src[~ok].tolist(), tok[~ok].tolist(), strict=True):
        bad.setdefault(q, []).append(t)
    for q, toks in bad.items():
        _drop_inplace(rows, q, np.asarray(sorted(toks), dtype=np.int32))
    keep = ok & ((inc > 0) | (flag != 0))
    return ItemEntries(src[keep], tok[keep], inc[keep].astype(np.int32), flag[keep].astype(np.int8),
                       counter[keep].astype(np.int32))


def _walk_items(dfa, items: ItemRegions, vi, src, tok):
    """(valid, inc, flag, counter of the array left open or -1) for each (state, token) pair,
    walked byte by byte with the token's own stack of arrays above the source's open ones."""
    n = src.size
    state = src.copy()
    w = item_walk_start(items, src)
    active = np.flatnonzero(vi.lens[tok] > 0)
    pos = 0
    while active.size:
        active = active[vi.lens[tok[active]] > pos]
        q = state[active]
        b = vi.flat[vi.off[tok[active]] + pos]
        nxt = dfa.trans[q, b].astype(np.int64)
        item_walk_step(items, w, active, q, items.events[q, b])
        dead = nxt < 0
        w["ok"][active[dead]] = False
        state[active[~dead]] = nxt[~dead]
        active = active[~dead]
        pos += 1
    return item_walk_finish(items, w, src, state, np.arange(n))


def item_walk_start(items: ItemRegions, src: np.ndarray) -> dict:
    """Per walker from state src[i]: the item state _walk_items (and stack.py's walk) carry."""
    n = src.size
    depth = items.depth[src].astype(np.int64)  # arrays open now
    return {"depth": depth, "dyn_top": depth - 1,  # the innermost of the source's arrays still open
            "cnt": np.zeros((n, MAX_ITEM_DEPTH + 1), dtype=np.int64),  # separators in arrays the token opened
            "inc": np.zeros(n, dtype=np.int64), "flag": np.zeros(n, dtype=np.int64), "ok": np.ones(n, dtype=bool)}


def item_walk_step(items: ItemRegions, w: dict, active: np.ndarray, q: np.ndarray, ev: np.ndarray) -> None:
    """Walkers `active` cross a byte from states `q` with item events `ev` (0: none)."""
    region = items.region
    sep_lo, sep_hi = items.sep_bounds()
    depth, dyn_top, cnt, inc, flag, ok = w["depth"], w["dyn_top"], w["cnt"], w["inc"], w["flag"], w["ok"]
    lvl = depth[active] - 1
    own = lvl <= dyn_top[active]  # an array open before this token
    fresh = (flag[active] & FLAG_CLOSES) == 0
    sep, close = ev == SEP, ev == CLOSE
    cnt[active[sep & ~own], lvl[sep & ~own]] += 1
    inc[active[sep & own & fresh]] += 1
    ok[active[sep & own & ~fresh]] = False  # a separator of the array below one it closed
    ok[active[close & own & ~fresh]] = False  # a second array of the row's closed
    flag[active[close & own]] |= FLAG_CLOSES
    dyn_top[active[close & own]] -= 1
    shut = close & ~own  # an array opened and closed by this token: bounds known
    c, r = cnt[active[shut], lvl[shut]], region[q[shut]]
    ok[active[shut][(c < sep_lo[r]) | (c > sep_hi[r])]] = False
    opening = active[ev == OPEN]
    cnt[opening, np.minimum(depth[opening], MAX_ITEM_DEPTH)] = 0
    depth[active[close]] -= 1
    depth[opening] += 1


def item_walk_finish(items: ItemRegions, w: dict, src: np.ndarray, state: np.ndarray, rows: np.ndarray):
    """(valid, inc, flag, counter of the array left open or -1) of walkers `rows` that started in
    `src` and ended in `state`."""
    region = items.region
    sep_hi = items.sep_bounds()[1]
    depth, dyn_top = w["depth"][rows], w["dyn_top"][rows]
    inc, flag, ok = w["inc"][rows], w["flag"][rows], w["ok"][rows].copy()
    left_open = depth - 1 - dyn_top  # arrays this token opened and left open
    ok &= left_open <= 1
    opens = left_open == 1
    counter = np.where(opens, w["cnt"][rows, np.clip(depth - 1, 0, MAX_ITEM_DEPTH)], -1)
    r_end = region[state]
    ok &= ~opens | (counter <= sep_hi[np.maximum(r_end, 0)])
    r_src = region[src]
    stays = (r_src >= 0) & ((flag & FLAG_CLOSES) == 0)
    ok &= ~stays | (inc <= sep_hi[np.maximum(r_src, 0)])
    flag = np.where(opens, flag | FLAG_OPENS, flag & ~FLAG_OPENS)
    return ok, inc, flag, counter


def add_items_inplace(table: TokenTable, items: ItemRegions, entries: ItemEntries, order: np.ndarray,
                      new_id: np.ndarray) -> None:
    """The item_* fields (DFA ids renumbered) and the dist with unmet minItems."""
    region = items.region[order]
    inside = region >= 0
    sep_lo, sep_hi = items.sep_bounds()
    table.item_lo = np.where(inside, sep_lo[np.maximum(region, 0)], 0).astype(np.int32)
    table.item_hi = np.where(inside, sep_hi[np.maximum(region, 0)], -1).astype(np.int32)
    src = new_id[entries.src]
    live = src >= 0
    key = src[live].astype(np.int64) * table.logits_width + entries.tok[live]
    nxt = _next_states_many(table, src[live].astype(np.int64), entries.tok[live].astype(np.int64))
    present = nxt >= 0  # transitions pruned at token level are gone
    at = np.argsort(key[present], kind="stable")
    table.item_key = key[present][at]
    table.item_inc = entries.inc[live][present][at].astype(np.int32)
    table.item_flag = entries.flag[live][present][at].astype(np.int8)
    table.item_set = entries.set[live][present][at].astype(np.int32)
    table.item_next = nxt[present][at].astype(np.int32)
    table.item_cost = np.where(inside, 1, 0).astype(np.int32)
    _settle_costs_inplace(table, region)
    _add_levels_inplace(table, items, order)


def _next_states_many(table: TokenTable, states: np.ndarray, toks: np.ndarray) -> np.ndarray:
    """int64 per (states[i], toks[i]): the state the token leads to, -1 where it is no transition
    (TokenTable.next_states for many states at once: the exceptions found by one sorted search)."""
    rows = table.mask_row[states].astype(np.int64)
    ok = ((table.mask_word_at(rows, toks >> 5) >> (toks & 31).astype(np.uint32)) & 1).astype(bool)
    ok &= ~np.isin(toks, table.stop_ids)  # a stop id ends a row, it is never a transition
    ptr = table.exc_ptr.astype(np.int64)
    width = np.int64(table.logits_width)
    exc_key = np.repeat(np.arange(ptr.size - 1, dtype=np.int64), np.diff(ptr)) * width + table.exc_tok
    nxt = table.trans_default[states].astype(np.int64)
    if exc_key.size:
        want = table.exc_row[states].astype(np.int64) * width + toks
        i = np.minimum(np.searchsorted(exc_key, want), exc_key.size - 1)
        hit = np.flatnonzero(exc_key[i] == want)
        nxt[hit] = table.exc_targets[table.exc_base[states[hit]].astype(np.int64) + table.exc_slot[i[hit]].astype(np.int64)]
    return np.where(ok, nxt, -1)


def _add_levels_inplace(table: TokenTable, items: ItemRegions, order: np.ndarray) -> None:
    """item_depth and, per state, the minimum and cost of each open array below the innermost."""
    levels = items.levels[order]
    depth = (levels >= 0).sum(axis=1)
    region = items.region[order]
    cost = np.zeros(items.num_regions, dtype=np.int64)
    cost[region[region >= 0]] = table.item_cost[region >= 0]  # one cost per array (_required_costs)
    below = (levels[:, : MAX_ITEM_DEPTH - 1] >= 0) & (np.arange(MAX_ITEM_DEPTH - 1)[None, :] < depth[:, None] - 1)
    sep_lo = items.sep_bounds()[0]
    at = np.maximum(levels[:, : MAX_ITEM_DEPTH - 1], 0)
    table.item_depth = depth.astype(np.int32)
    table.item_below_lo = np.where(below, sep_lo[at], 0).astype(np.int32)
    table.item_below_cost = np.where(below, cost[at], 0).astype(np.int32)


def _settle_costs_inplace(table: TokenTable, region: np.ndarray) -> None:
    """item_cost (tokens per unmet separator, per array) and dist, each from the other, to a fixed point.

    A row in array state s with counter c below item_lo needs at most dist[s] + item_cost[s] *
    (item_lo[s] - c) more tokens: from every state, either a token that crosses no separator
    lowers dist (1 + dist[t] <= dist[s]) or one that crosses exactly one keeps the sum
    (1 + dist[t] <= dist[s] + cost). A token that opens an array is charged its unmet minimum.
    """
    opens = np.flatnonzero((table.item_flag & FLAG_OPENS) != 0)
    src = table.item_key[opens] // table.logits_width
    tok = table.item_key[opens] % table.logits_width
    usable = _usable(table, src, tok)
    opens, src, tok = opens[usable], src[usable], tok[usable]
    nxt = table.item_next[opens].astype(np.int64)
    body = _body_entry(table, src, tok, nxt)
    edges = _edges_without_opening_only(table, src, nxt)
    minimum_rows = _minimum_rows(table, region)
    for _ in range(_MAX_ROUNDS):
        extra = _opening_charge(table, nxt, table.item_set[opens])
        e_src, e_dst, e_weight = edges
        table.dist = dist_to_accept(table.num_states, table.accept, *dist_edges(
            table, np.concatenate([e_src, src]), np.concatenate([e_dst, nxt]),
            np.concatenate([e_weight, 1 + extra + body]), stack_sentinel(table)))
        if (table.dist < 0).any():
            raise CountedCutError("a counted array cannot be closed with this vocabulary's tokens")
        need = _required_costs(table, region, minimum_rows)
        if (need <= table.item_cost).all():
            return
        table.item_cost = np.maximum(table.item_cost, need).astype(np.int32)
    raise CountedCutError("the per-item token cost of a counted array did not settle")


def _opening_charge(table: TokenTable, nxt: np.ndarray, item_set: np.ndarray) -> np.ndarray:
    """Tokens a token that opens the array of `nxt` with counter `item_set` still owes its minimum."""
    return table.item_cost[nxt].astype(np.int64) * np.maximum(table.item_lo[nxt] - np.maximum(item_set, 0), 0)


def _edges_without_opening_only(table: TokenTable, open_src: np.ndarray, open_next: np.ndarray):
    """(source, target, weight) of every usable token that opens no array, without item charges, as
    counted_dist weighs them, one edge per distinct target (not one per token: a map of long strings
    has tens of millions of transitions and a few distinct targets per state). The opening tokens,
    charged their unmet minimum, are edges of their own: a target reached only by opening tokens
    (counted with `_pair_counts`) loses its uncharged edge."""
    if table.count_row is None:
        src, dst = target_edges(table, np.ones(table.num_states, dtype=bool))
        weight = np.ones(src.size, dtype=np.int64)
    else:
        src, dst, weight = _counted_edges(table, -(-table.count_lo.astype(np.int64) // table.count_fill))
    if not open_src.size:
        return src, dst, weight
    n = np.int64(table.num_states)
    pair, opening = np.unique(open_src * n + open_next, return_counts=True)
    only = pair[_pair_counts(table, pair // n, pair % n) == opening]  # every usable token of the pair opens
    drop = np.isin(src * n + dst, only)
    return src[~drop], dst[~drop], weight[~drop]


def _pair_counts(table: TokenTable, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """int64 per (src[i], dst[i]): how many usable tokens (those _usable keeps) lead from one to the
    other. Outside counted bodies from the layout (a mask row's popcount less its exceptions for the
    default target, an exception row's slot counts for the others); inside them token by token."""
    out = np.zeros(src.size, dtype=np.int64)
    plain = np.ones(src.size, dtype=bool) if table.count_row is None else table.count_row[src] < 0
    idx = np.flatnonzero(plain)
    if idx.size:
        s, t = src[idx], dst[idx]
        rows = table.exc_row[s].astype(np.int64)
        lo, hi = table.exc_ptr[rows].astype(np.int64), table.exc_ptr[rows + 1].astype(np.int64)
        allowed = table.row_transition_counts()[table.mask_row[s]]
        counts = np.where(t == table.trans_default[s], allowed - (hi - lo), 0)
        for i in np.flatnonzero(t != table.trans_default[s]).tolist():  # an exception target: its slot's count
            base = int(table.exc_base[s[i]])
            slots = table.exc_targets[base : int(table.exc_base[s[i] + 1])]
            k = int(np.flatnonzero(slots == t[i])[0])
            counts[i] = int(np.count_nonzero(table.exc_slot[lo[i] : hi[i]] == k))
        out[idx] = counts
    for i in np.flatnonzero(~plain).tolist():  # inside a counted body: the usable tokens themselves
        toks, nexts = table.transitions(int(src[i]))
        usable = _usable(table, np.full(toks.size, src[i], dtype=np.int64), toks)
        out[i] = int(np.count_nonzero(usable & (nexts == dst[i])))
    return out


def _minimum_rows(table: TokenTable, region: np.ndarray) -> tuple:
    """(owner, token (-1: an outcome), next state, inc, flag, set, extra weight) of every transition of the states in arrays
    with a minimum (only those need a per-item cost), usable ones only (in a counted body: those
    starting no character). A token with a bracket-stack event counts by its outcomes that dist
    uses (grammars/stack.py dist_edges: their next state, item events and stack weight)."""
    states = np.flatnonzero((region >= 0) & (table.item_lo > 0))
    empty = np.zeros(0, dtype=np.int64)
    owner, tok, nxt = empty, empty, empty
    if states.size:
        rows = [table.transitions(int(q)) for q in states.tolist()]
        owner = np.repeat(states, [t.size for t, _ in rows]).astype(np.int64)
        tok = np.concatenate([t for t, _ in rows]).astype(np.int64)
        nxt = np.concatenate([x for _, x in rows]).astype(np.int64)
        usable = _usable(table, owner, tok)
        if table.has_stack:  # replaced by their outcomes below
            usable &= ~np.isin(owner * table.logits_width + tok, table.stack_key)
        owner, tok, nxt = owner[usable], tok[usable], nxt[usable]
    _, inc, flag, item_set = _lookup_many(table, owner, tok)
    extra = np.zeros(owner.size, dtype=np.int64)
    if table.has_stack and states.size:
        per = np.diff(table.stack_ptr.astype(np.int64))
        e_src = np.repeat(table.stack_key // table.logits_width, per)
        e_tok = np.repeat(table.stack_key % table.logits_width, per)
        e_edge = np.repeat(table.stack_edge != 0, per)
        use = np.isin(e_src, states) & (table.stack_weight > 0)
        hit, p_inc, p_flag, p_set = _lookup_many(table, e_src[use], e_tok[use])
        own = ~e_edge[use]  # a token that pops carries its item events in its outcome
        owner = np.concatenate([owner, e_src[use]])
        tok = np.concatenate([tok, np.full(int(use.sum()), -1, dtype=np.int64)])
        nxt = np.concatenate([nxt, table.stack_next[use].astype(np.int64)])
        inc = np.concatenate([inc, np.where(own, table.stack_item_inc[use], p_inc)])
        flag = np.concatenate([flag, np.where(own, table.stack_item_flag[use], p_flag)])
        item_set = np.concatenate([item_set, np.where(own, table.stack_item_set[use], p_set)])
        extra = np.concatenate([extra, table.stack_weight[use].astype(np.int64) - 1])
    return owner, tok, nxt, inc.astype(np.int64), flag.astype(np.int64), item_set.astype(np.int64), extra


def _required_costs(table: TokenTable, region: np.ndarray, minimum_rows: tuple) -> np.ndarray:
    """Per state, the cost its array needs so the dist rule above holds there (max over the array)."""
    states = np.flatnonzero((region >= 0) & (table.item_lo > 0))  # an array without a minimum needs none
    owner, tok, nxt, inc, flag, item_set, wextra = minimum_rows
    dist = table.dist.astype(np.int64)
    extra = np.where((flag & FLAG_OPENS) != 0, _opening_charge(table, nxt, item_set), 0)
    body = np.zeros(owner.size, dtype=np.int64)
    plain = tok >= 0  # an outcome of a bracket-stack token never opens a counted string
    body[plain] = _body_entry(table, owner[plain], tok[plain], nxt[plain])
    weight = 1 + extra + wextra + body
    stay = (flag & FLAG_CLOSES) == 0
    gain = weight + dist[nxt] - dist[owner]
    n = table.num_states
    settled = np.zeros(n, dtype=bool)
    settled[owner[stay & (inc == 0) & (gain <= 0)]] = True
    never = np.iinfo(np.int64).max
    best = np.full(n, never, dtype=np.int64)
    one = stay & (inc == 1)
    np.minimum.at(best, owner[one], gain[one])
    need = np.where(settled, 0, best)[states]
    if (need == never).any():
        s = int(states[np.flatnonzero(need == never)[0]])
        raise CountedCutError(f"state {s}: no token adds one item to a counted array with a minimum")
    per_region = np.zeros(int(region.max()) + 1, dtype=np.int64)
    np.maximum.at(per_region, region[states], need)
    return np.where(region >= 0, per_region[np.maximum(region, 0)], 0)


def _usable(table: TokenTable, s: np.ndarray, tok: np.ndarray) -> np.ndarray:
    """Transitions counted_dist uses from `s` (in a counted string body: those starting no character)."""
    if table.count_row is None:
        return np.ones(tok.size, dtype=bool)
    r = table.count_row[s]
    v = table.count_chars[np.maximum(r, 0), tok]
    return (r < 0) | (v == 0) | (v == 1)


def _body_entry(table: TokenTable, s: np.ndarray, tok: np.ndarray, nxt: np.ndarray) -> np.ndarray:
    """The unmet string minimum counted_dist charges a token that opens a counted string body."""
    if table.count_row is None:
        return np.zeros(tok.size, dtype=np.int64)
    need0 = -(-table.count_lo.astype(np.int64) // table.count_fill)
    r = table.count_row[s]
    v = table.count_chars[np.maximum(r, 0), tok]
    opens = (table.count_row[nxt] >= 0) & ((r < 0) | (v == 1))
    return np.where(opens, need0[nxt], 0)


# -- the host side of the contract (grammars/table.py "Item counters"; kernels/items.py on devices) --


def _lookup_many(table: TokenTable, states: np.ndarray, tokens: np.ndarray):
    """(hit, inc, flag, set) of each (state, token)'s entry (zeros and -1 where it has none)."""
    key = np.asarray(states, dtype=np.int64) * table.logits_width + tokens.astype(np.int64)
    n = table.item_key.shape[0]
    if n == 0:
        z = np.zeros(key.shape[0], dtype=np.int64)
        return z.astype(bool), z, z, z - 1
    i = np.minimum(np.searchsorted(table.item_key, key), n - 1)
    hit = table.item_key[i] == key
    return (hit, np.where(hit, table.item_inc[i], 0).astype(np.int64), np.where(hit, table.item_flag[i], 0),
            np.where(hit, table.item_set[i], -1).astype(np.int64))


def _lookup(table: TokenTable, state: int, tokens: np.ndarray):
    """(hit, inc, flag, set) of each token's entry from `state` (zeros where it has none)."""
    return _lookup_many(table, np.full(tokens.shape[0], state, dtype=np.int64), tokens)


def as_stack(counters) -> np.ndarray:
    """int64 [MAX_ITEM_DEPTH]: a row's item counters, outermost first (an int: one open array)."""
    out = np.zeros(MAX_ITEM_DEPTH, dtype=np.int64)
    if np.ndim(counters) == 0:
        out[0] = int(counters)
    else:
        out[: len(counters)] = np.asarray(counters, dtype=np.int64)
    return out


def _top(table: TokenTable, state: int, stack: np.ndarray) -> int:
    """The counter of `state`'s innermost open array (0 outside)."""
    depth = int(table.item_depth[state]) if table.item_depth is not None else int(table.item_hi[state] >= 0)
    return int(stack[depth - 1]) if depth > 0 else 0


def item_allows(table: TokenTable, state: int, counters, tokens: np.ndarray) -> np.ndarray:
    """bool per token (allowed by the mask): whether the item bounds keep it."""
    if table.item_hi is None or table.item_hi[state] < 0:
        return np.ones(tokens.shape[0], dtype=bool)
    _, inc, flag, _ = _lookup(table, state, tokens)
    total = _top(table, state, as_stack(counters)) + inc
    closes = (flag & FLAG_CLOSES) != 0
    return (total <= table.item_hi[state]) & (~closes | (total >= table.item_lo[state]))


def next_item_counters(table: TokenTable, state: int, counters, tokens: np.ndarray) -> np.ndarray:
    """int64 [n, MAX_ITEM_DEPTH]: the row's counters after each token (transitions of `state`):
    the innermost gains inc, or is popped when the token closes it; an array the token leaves
    open is pushed with item_set."""
    stack = np.tile(as_stack(counters), (tokens.shape[0], 1))
    if table.item_hi is None:
        return stack
    hit, inc, flag, after = _lookup(table, state, tokens)
    depth = int(table.item_depth[state])
    closes, opens = (flag & FLAG_CLOSES) != 0, (flag & FLAG_OPENS) != 0
    if depth > 0:
        stack[:, depth - 1] = np.where(closes, 0, stack[:, depth - 1] + inc)
    at = np.clip(depth - closes.astype(np.int64), 0, MAX_ITEM_DEPTH - 1)
    rows = np.flatnonzero(opens & hit)
    stack[rows, at[rows]] = after[rows]
    return stack


def next_item_counter(table: TokenTable, state: int, counters, tokens: np.ndarray) -> np.ndarray:
    """The counter of the innermost open array after each token (0 outside arrays)."""
    stacks = next_item_counters(table, state, counters, tokens)
    if table.item_hi is None:
        return np.zeros(tokens.shape[0], dtype=np.int64)
    nexts = table.next_states(state, tokens).astype(np.int64)
    depth = np.where(nexts >= 0, table.item_depth[np.maximum(nexts, 0)], 0)
    return np.where(depth > 0, stacks[np.arange(tokens.shape[0]), np.maximum(depth - 1, 0)], 0)


def item_need(table: TokenTable, states: np.ndarray, stacks: np.ndarray) -> np.ndarray:
    """Tokens the unmet minItems of every open array add to dist (0 outside counted arrays);
    `stacks`: int [n, MAX_ITEM_DEPTH] (or [n] innermost counters of one-level rows)."""
    states = np.asarray(states, dtype=np.int64)
    if table.item_hi is None:
        return np.zeros(np.shape(states), dtype=np.int64)
    stacks = np.asarray(stacks, dtype=np.int64)
    if stacks.ndim == 1:
        stacks = np.stack([as_stack(k) for k in stacks]) if stacks.size else np.zeros((0, MAX_ITEM_DEPTH), np.int64)
    depth = table.item_depth[states].astype(np.int64)
    top = stacks[np.arange(states.size), np.maximum(depth - 1, 0)]
    short = np.maximum(table.item_lo[states].astype(np.int64) - top, 0)
    need = np.where(table.item_hi[states] >= 0, table.item_cost[states].astype(np.int64) * short, 0)
    under = np.maximum(table.item_below_lo[states].astype(np.int64) - stacks[:, : MAX_ITEM_DEPTH - 1], 0)
    return need + (table.item_below_cost[states].astype(np.int64) * under).sum(axis=1)


def kept(table: TokenTable, state: int, counter: int, icounters, toks: np.ndarray, nexts: np.ndarray,
         remaining: int) -> np.ndarray:
    """bool per transition: string and item counters keep it and it can still finish within the budget
    (dist[next] + string need + item need <= remaining - 1: the rule kernels/items.py implements)."""
    ok = table.count_allows(state, counter, toks) & item_allows(table, state, icounters, toks)
    nexts = nexts.astype(np.int64)
    need = np.zeros(toks.shape[0], dtype=np.int64)
    if table.has_counts:  # as walk.kept: a token that does not stay in its body is charged need(0)
        start = np.zeros(toks.shape[0], dtype=np.int64)
        if table.count_row[state] >= 0:
            v = table.count_chars[table.count_row[state], toks].astype(np.int64)
            start = np.where((v >= 0) & (v % 2 == 0), counter + v // 2, 0)
        fill, lo = table.count_fill, table.count_lo[nexts].astype(np.int64)
        need = np.where(table.count_row[nexts] >= 0, -(-np.maximum(lo - start, 0) // fill), 0)
    after = next_item_counters(table, state, icounters, toks)
    return ok & (table.dist[nexts] + need + item_need(table, nexts, after) <= remaining - 1)


def concat_items(tables: list[TokenTable], offsets: np.ndarray) -> dict:
    """The item_* fields of several tables stacked (TokenTable.concat; tables without items get none)."""
    width = tables[0].logits_width
    out: dict[str, list] = {name: [] for name in ITEM_ARRAYS}
    for t, off in zip(tables, offsets.tolist(), strict=True):
        if not t.has_items:
            out["item_lo"].append(np.zeros(t.num_states, dtype=np.int32))
            out["item_hi"].append(np.full(t.num_states, -1, dtype=np.int32))
            out["item_cost"].append(np.zeros(t.num_states, dtype=np.int32))
            out["item_depth"].append(np.zeros(t.num_states, dtype=np.int32))
            out["item_below_lo"].append(np.zeros((t.num_states, MAX_ITEM_DEPTH - 1), dtype=np.int32))
            out["item_below_cost"].append(np.zeros((t.num_states, MAX_ITEM_DEPTH - 1), dtype=np.int32))
            continue
        for name in ("item_lo", "item_hi", "item_cost", "item_inc", "item_flag", "item_set", "item_depth",
                     "item_below_lo", "item_below_cost"):
            out[name].append(getattr(t, name))
        out["item_key"].append(t.item_key.astype(np.int64) + off * width)
        out["item_next"].append(t.item_next.astype(np.int64) + off)
    dtypes = {"item_key": np.int64, "item_flag": np.int8}
    return {name: np.concatenate(parts).astype(dtypes.get(name, np.int32)) if parts else
            np.zeros(0, dtype=dtypes.get(name, np.int32)) for name, parts in out.items()}
