"""Large subschemas as sub-automata: each compiled once, spliced into the parent's byte DFA.

schema.to_regex (`splice=True`) writes a large value as a placeholder: PLACEHOLDER_LEAD (byte
0x00: JSON text escapes it, no mark uses it) and 4 index letters `A`-`P`; `Pieces` keeps its regex.
`build_spliced` builds each piece's DFA once, bottom-up (pieces hold earlier pieces), pieces with
equal DFAs sharing one symbol; each placeholder path s --lead, index--> t of the (minimised over
those symbols) parent becomes an epsilon move into a copy of the piece's DFA that leaves for t, one
copy per (piece, t) (alternatives at one place: one copy of their union; large ones are unioned
before their splice, as their pieces' own DFAs), and a subset construction
makes it deterministic. The language is the inlined regex's, and the result its minimal DFA on
JSON schemas (tests check it array for array): marks are plain bytes in it, so the token walk,
counters and tables do not change. It saves regex text and outlines-core time, not DFA states.
(string_bodies.py lays JSON string bodies in the same way, without a subset construction.)
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence

import numpy as np

from surecall.errors import CompileBudgetExceeded
from surecall.grammars.automaton import ByteDFA, byte_classes, minimize, prune

PLACEHOLDER_LEAD = 0x00
_INDEX_BASE = ord("A")  # index digits are the letters A-P (one hex nibble each)
_INDEX_DIGITS = 4
MAX_PIECES = 16**_INDEX_DIGITS
RESERVED_PIECES = 32  # the top indices stand for string_bodies.py's shared bodies, never a piece
_PLACEHOLDER_TEXT = re.compile(r"\\x00([A-P]{4})")
# The splice's peak per state of the joined automaton: its int32 [n, 256] rows twice (NFA and
# DFA), prune's edge lists and minimise's hashed signatures (measured: 1.7 GB RSS at 132k states).
BYTES_PER_STATE = 12 * 1024
# Alternatives whose spliced DFAs hold more states than this are joined as the union of their
# parents (placeholders still bytes), spliced, instead of by a subset construction over the spliced
# DFAs, which walks a prefix they share once per alternative (Github_ultra o65418: three 26k-state
# variants of one object, 5.5 s).
_UNION_BY_SUBSETS = 4096


def placeholder(index: int) -> str:
    """The regex text standing for piece `index`: `\\x00` then 4 letters (the nibbles, high first)."""
    if not 0 <= index < MAX_PIECES:
        raise ValueError(f"Invalid piece index: expected 0..{MAX_PIECES - 1}, got {index}")
    letters = "".join(chr(_INDEX_BASE + ((index >> (4 * i)) & 15)) for i in range(_INDEX_DIGITS - 1, -1, -1))
    return f"\\x00{letters}"


def placeholders_in(regex: str) -> set[int]:
    """Indices of the placeholders written in `regex` (by its text; may over-report, never miss)."""
    return {sum((ord(c) - _INDEX_BASE) << (4 * (_INDEX_DIGITS - 1 - i)) for i, c in enumerate(letters))
            for letters in _PLACEHOLDER_TEXT.findall(regex)}


class Pieces:
    """Sub-regexes by index; equal texts share one index. `has_items[i]`: piece i holds an item
    counter mark (directly or inside a piece it uses), as schema.to_regex must know."""

    def __init__(self, item_mark_text: str | tuple[str, ...]):
        self.regexes: list[str] = []
        self.has_items: list[bool] = []
        self._index: dict[str, int] = {}
        self._item_mark_texts = (item_mark_text,) if isinstance(item_mark_text, str) else tuple(item_mark_text)

    def add(self, regex: str) -> str:
        """The placeholder for `regex` (registered on first sight)."""
        index = self._index.get(regex)
        if index is None:
            if len(self.regexes) >= MAX_PIECES - RESERVED_PIECES:
                raise CompileBudgetExceeded(
                    f"the schema needs more than {MAX_PIECES - RESERVED_PIECES} spliced sub-automata")
            index = self._index[regex] = len(self.regexes)
            self.regexes.append(regex)
            self.has_items.append(self.holds_items(regex))
        return placeholder(index)

    def holds_items(self, regex: str) -> bool:
        """Whether `regex` holds an item counter mark, looking through its placeholders."""
        return any(t in regex for t in self._item_mark_texts) or any(
            i < len(self.has_items) and self.has_items[i] for i in placeholders_in(regex))


def build_spliced(regex: str, pieces: Sequence[str], build: Callable[[str], ByteDFA],
                  memory_budget_bytes: int, check: Callable[[], None] = lambda: None,
                  shared: Callable[[int], tuple[ByteDFA | None, Callable[[ByteDFA], None] | None]] | None = None,
                  calls: bool = False, resume: dict | None = None) -> ByteDFA:
    """The byte DFA of `regex` with every placeholder replaced by its piece's language.

    `build` turns one regex (placeholders as plain bytes) into a pruned byte DFA; each piece is
    built once, on first use, and spliced itself before use; `check()` runs after each splice and
    between the batches of each subset construction (a time budget raises there). Raises CompileBudgetExceeded when a joined automaton would exceed
    `memory_budget_bytes`. `shared(index)`, when given, says whether a piece's spliced DFA is kept
    by the caller beyond this call: (its DFA, None) to use it as it is, (None, keep) to build it
    and hand it to keep(dfa), (None, None) to just build it.

    With `calls`, a piece whose spliced DFA is an object or array value of at least
    calls.MIN_CALL_STATES states is not copied: its users hold a call mark, and the result joins
    each such body once (calls.join_calls; raises calls.CallsUnusable where that cannot be done).

    `resume` (without `calls`): a dict that keeps the pieces spliced so far, for a later call with
    the same regex, pieces and build (a larger budget, after this one raised): it starts from every
    piece an earlier call finished (one that raised midway left only whole pieces there).
    """
    from surecall.grammars import calls as call_marks

    max_states = max(memory_budget_bytes // BYTES_PER_STATE, 1)
    if resume is None or calls:
        resume = {}
    built: dict[tuple[int, ...], ByteDFA] = resume.setdefault("built", {})
    parents: dict[int, ByteDFA] = resume.setdefault("parents", {})  # each piece's own DFA (before its splice)
    canonical: dict[int, int] = resume.setdefault("canonical", {})  # piece -> the first with the same DFA
    first_of = resume.setdefault("first_of", _FirstOf())
    bodies: dict[int, ByteDFA] = {}  # with `calls`: the called pieces' DFAs (unions of them past len(pieces))
    unions = 0  # with `calls`: how many called unions have been numbered past the pieces

    def canonical_of(index: int, user: int) -> int:
        if not 0 <= index < min(user, len(pieces)):  # pieces hold earlier pieces only: no cycle
            raise ValueError(f"Invalid placeholder: piece {index} used by piece {user} of {len(pieces)}")
        if index not in canonical:
            dfa, keep = shared(index) if shared is not None else (None, None)
            if dfa is None:
                dfa = splice_dfa(parent_of(index), lambda k: sub_of(k), lambda i: canonical_of(i, index), max_states, check)
                if keep is not None:
                    keep(dfa)
            check()
            canonical[index] = first_of.first(dfa, index)
            if calls and canonical[index] == index and dfa.num_states >= call_marks.MIN_CALL_STATES \
                    and call_marks.body_shape(dfa) is not None:
                bodies[index] = dfa
                dfa = call_marks.marker_dfa(index)
            built.setdefault((canonical[index],), dfa)
        return canonical[index]

    def parent_of(index: int) -> ByteDFA:
        if index not in parents:
            parents[index] = build(pieces[index])
        return parents[index]

    def called_union(key: tuple[int, ...]) -> ByteDFA | None:
        """With calls: alternatives of which some are called objects (or arrays) as one called body,
        the union of every alternative that opens with the same byte (None: none is called)."""
        nonlocal unions
        real = {i: bodies.get(i, built[(i,)]) for i in key}
        groups: dict[int, list[int]] = {}
        rest = []
        for i in key:
            b = call_marks.body_shape(real[i])
            (groups.setdefault(b, []) if b is not None else rest).append(i)
        if not any(i in bodies for members in groups.values() for i in members):
            return None
        parts = [built[(i,)] for i in rest]
        for b, members in groups.items():
            if any(real[i].trans[0, b] >= 0 for i in rest):
                return None  # another alternative opens with the same byte: copied
            if len(members) == 1:
                parts.append(built[(members[0],)])
                continue
            union = union_dfa([real[i] for i in members], max_states, check)
            if call_marks.body_shape(union) is None:
                return None
            index = len(pieces) + unions
            unions += 1
            bodies[index] = union
            parts.append(call_marks.marker_dfa(index))
        return parts[0] if len(parts) == 1 else union_dfa(parts, max_states, check)

    def sub_of(key: tuple[int, ...]) -> ByteDFA:
        if key not in built and calls and len(key) > 1:
            called = called_union(key)
            if called is not None:
                built[key] = called
        if key not in built:  # alternatives at one place: their union, built once for every user
            subs = [built[(i,)] for i in key]
            if sum(d.num_states for d in subs) <= _UNION_BY_SUBSETS:
                built[key] = union_dfa(subs, max_states, check)
            else:  # the union of their parents, spliced: large common parts are walked once, not in lockstep
                parent = union_dfa([parent_of(i) for i in key], max_states, check)
                built[key] = splice_dfa(parent, sub_of, lambda i: canonical_of(i, max(key)), max_states, check)
            check()
        return built[key]

    whole = _whole_piece(regex)
    if whole is not None:  # the regex is one placeholder: the grammar is its piece (no parent to splice into)
        root = built[(canonical_of(whole, len(pieces)),)]
    else:
        root = splice_dfa(build(regex), sub_of, lambda i: canonical_of(i, len(pieces)), max_states, check)
    if not bodies:
        return root
    _check_states(root.num_states + sum(d.num_states for d in bodies.values()), max_states)
    return call_marks.join_calls(root, bodies, max_states, check)


def flat_states_estimate(regex: str, pieces: Sequence[str], build: Callable[[str], ByteDFA], over: int,
                         shared: Callable[[int], tuple[ByteDFA | None, object]] | None = None) -> tuple[int, int] | None:
    """(low, high) estimates of the states build_spliced's copies come to, without copying: a
    DFA's symbolic parent (symbolic_parent, each piece its own symbol) plus, per distinct (pieces,
    exit) move, the pieces' estimates, alternatives at one place counted as their largest (low)
    or their sum (high). None when even a cheap bound over every placeholder path stays within
    `over` (then nothing is minimised). On JSONSchemaBench's 40 largest flat splices (11k-67k
    states), low is 0.92-1.16x their states and high 1.0-3.3x; past 65,536 states they part more
    (Github_ultra o38670: low 75k, high 218k)."""
    seen: dict[int, tuple[ByteDFA | None, int, list]] = {}  # piece -> (its parent DFA, states, placeholders)

    def parent(i: int) -> tuple[ByteDFA | None, int, list]:
        if i not in seen:
            done = shared(i)[0] if shared is not None else None
            if done is not None:  # a shared piece comes spliced: its states are known
                seen[i] = (None, done.num_states, [])
            else:
                dfa = build(pieces[i])
                seen[i] = (dfa, dfa.num_states, find_placeholders(dfa))
        return seen[i]

    bound: dict[int, int] = {}

    def upper(i: int) -> int:  # every placeholder path copied, the parent unminimised
        if i not in bound:
            _, own, paths = parent(i)
            bound[i] = own + sum(upper(k) for _, k, _ in paths)
        return bound[i]

    whole = _whole_piece(regex)
    root = None if whole is not None else build(regex)
    root_found = [] if root is None else find_placeholders(root)
    if (upper(whole) if whole is not None else root.num_states + sum(upper(k) for _, k, _ in root_found)) <= over:
        return None
    sizes: dict[int, tuple[int, int]] = {}

    def estimate(dfa: ByteDFA, paths: list) -> tuple[int, int]:
        if not paths:
            return dfa.num_states, dfa.num_states
        small, moves = symbolic_parent(dfa, paths, lambda k: k)
        at: dict[tuple[int, int], set[int]] = {}
        for s, k, t in moves:
            at.setdefault((s, t), set()).add(k)
        low = high = small.num_states
        for key in {(tuple(sorted(ks)), t) for (_, t), ks in at.items()}:
            parts = [sized(k) for k in key[0]]
            low += max(p[0] for p in parts)
            high += sum(p[1] for p in parts)
        return low, high

    def sized(i: int) -> tuple[int, int]:
        if i not in sizes:
            dfa, own, paths = parent(i)
            sizes[i] = (own, own) if dfa is None else estimate(dfa, paths)
        return sizes[i]

    return sized(whole) if whole is not None else estimate(root, root_found)


def _whole_piece(regex: str) -> int | None:
    """The piece index when `regex` is exactly one placeholder (a catalog's union), else None."""
    return min(placeholders_in(regex)) if _PLACEHOLDER_TEXT.fullmatch(regex) else None


class _FirstOf:
    """The first piece index seen with each DFA. DFAs are grouped by their number of states and
    hashed only when a second one of that size comes (a catalog's lone piece is never hashed)."""

    def __init__(self):
        self._by_size: dict[int, tuple[ByteDFA, int] | dict[bytes, int]] = {}

    def first(self, dfa: ByteDFA, index: int) -> int:
        seen = self._by_size.get(dfa.num_states)
        if seen is None:
            self._by_size[dfa.num_states] = (dfa, index)
            return index
        if isinstance(seen, tuple):  # a second DFA of this size: hash the one held, from now on by digest
            seen = self._by_size[dfa.num_states] = {_digest(seen[0]): seen[1]}
        return seen.setdefault(_digest(dfa), index)


def _digest(dfa: ByteDFA) -> bytes:
    """Equal for equal DFAs: pruned minimal DFAs in BFS order are equal iff their languages are."""
    h = hashlib.blake2b(np.ascontiguousarray(dfa.trans).tobytes(), digest_size=20)
    h.update(dfa.accept.tobytes())
    return h.digest()


def find_placeholders(dfa: ByteDFA) -> list[tuple[int, int, int]]:
    """Every placeholder path (s, piece index, t): s --lead--> 4 index letters --> t."""
    found = []
    for s in np.flatnonzero(dfa.trans[:, PLACEHOLDER_LEAD] >= 0).tolist():
        frontier = [(int(dfa.trans[s, PLACEHOLDER_LEAD]), 0)]
        for _ in range(_INDEX_DIGITS):
            step = []
            for u, value in frontier:
                row = dfa.trans[u]
                digits = row[_INDEX_BASE : _INDEX_BASE + 16]
                if int((row >= 0).sum()) != int((digits >= 0).sum()):
                    raise ValueError(f"Invalid placeholder: state {u} after the lead byte has a non-index edge")
                step += [(int(digits[d]), value * 16 + d) for d in np.flatnonzero(digits >= 0).tolist()]
            frontier = step
        found += [(s, index, t) for t, index in frontier]
    return found


def symbolic_parent(parent: ByteDFA, found: list[tuple[int, int, int]], canonical: Callable[[int], int],
                    check: Callable[[], None] | None = None):
    """(minimal parent, its placeholder moves (s, canonical piece, t)): each placeholder path is one
    move on a symbol of its own (column 256 + k), pieces with equal DFAs share a symbol, and the
    parent is minimised over that alphabet (states told apart only by which of two equal pieces
    follows are merged before any copy is made)."""
    keys = _symbol_keys(found, canonical)
    symbols = sorted(set(keys))
    column = {key: 256 + k for k, key in enumerate(symbols)}
    trans = np.full((parent.num_states, 256 + len(symbols)), -1, dtype=np.int32)
    trans[:, :256] = parent.trans
    trans[:, PLACEHOLDER_LEAD] = -1  # the index states become unreachable: pruned
    for (s, _, t), key in zip(found, keys, strict=True):
        trans[s, column[key]] = t
    small = minimize(prune(trans, parent.accept), check)
    rows, cols = np.nonzero(small.trans[:, 256:] >= 0)
    moves = [(int(r), symbols[int(c)][0], int(small.trans[r, 256 + c])) for r, c in zip(rows, cols)]
    return ByteDFA(np.ascontiguousarray(small.trans[:, :256]), small.accept), moves


def _symbol_keys(found: list[tuple[int, int, int]], canonical: Callable[[int], int]) -> list[tuple[int, int]]:
    """Each placeholder move's symbol: (canonical piece, -1), or (canonical piece, index) where
    equal pieces leave one state for different states (`ab|ac` as piece 0 and `a(?:b|c)` as
    piece 2 in `P0 1|P2 3`): one symbol there would keep only one of the moves."""
    pieces = [canonical(index) for _, index, _ in found]
    targets: dict[tuple[int, int], set[int]] = {}
    for (s, _, t), piece in zip(found, pieces, strict=True):
        targets.setdefault((s, piece), set()).add(t)
    return [(piece, index if len(targets[(s, piece)]) > 1 else -1)
            for (s, index, _), piece in zip(found, pieces, strict=True)]


def splice_dfa(parent: ByteDFA, sub_of: Callable[[tuple[int, ...]], ByteDFA], canonical: Callable[[int], int],
               max_states: int, check: Callable[[], None] = lambda: None) -> ByteDFA:
    """`parent` with each placeholder path replaced by a copy of its piece's DFA, determinised
    and pruned, minimised where subsets merged states (returned unchanged without placeholders).

    `canonical(index)` names the piece (building it first); pieces that are alternatives between
    the same s and t are one sub-automaton, their union: `sub_of` gets the sorted tuple of their
    canonical indices (one index for a lone piece).
    """
    found = find_placeholders(parent)
    if not found:
        return parent
    parent, moves = symbolic_parent(parent, found, canonical, check)
    grouped: dict[tuple[int, int], set[int]] = {}
    for s, index, t in moves:
        grouped.setdefault((s, t), set()).add(index)
    # 1. One copy per distinct (sub-automaton, exit state); the NFA's states are parent's, then the copies'.
    copies: dict[tuple[tuple[int, ...], int], int] = {}
    subs: list[ByteDFA] = [parent]
    entries: list[tuple[int, int]] = []
    size = parent.num_states
    for (s, t), indices in grouped.items():
        key = (tuple(sorted(indices)), t)
        if key not in copies:
            copies[key] = size
            subs.append(sub_of(key[0]))
            size += subs[-1].num_states
            _check_states(size, max_states)
        entries.append((s, copies[key]))
    exits = [t for _, t in copies]
    trans, accept, eps = _joined(subs, exits)
    for s, start in entries:
        eps.setdefault(s, []).append(start)  # a copy's start is its state 0
    # 2. Back to a DFA. Components are minimal and pairwise distinct, so only states merged into
    #    subsets (alternatives sharing first bytes) leave equivalent states: minimise then.
    dfa_trans, dfa_accept, start, is_merged = _determinize(trans, accept, eps, 0, max_states, check)
    dfa = prune(dfa_trans, dfa_accept, start)
    return minimize(dfa, check) if is_merged else dfa


def union_dfa(subs: list[ByteDFA], max_states: int, check: Callable[[], None] = lambda: None) -> ByteDFA:
    """The minimal DFA of the union of the `subs`' languages (subset construction from a fresh start)."""
    _check_states(1 + sum(d.num_states for d in subs), max_states)
    trans, accept, eps = _joined([ByteDFA(np.full((1, 256), -1, dtype=np.int32), np.zeros(1, bool)), *subs], None)
    offsets = np.cumsum([1] + [d.num_states for d in subs])[:-1]
    eps[0] = offsets.tolist()
    dfa_trans, dfa_accept, start, _ = _determinize(trans, accept, eps, 0, max_states, check)
    return minimize(prune(dfa_trans, dfa_accept, start), check)


def _joined(dfas: list[ByteDFA], exits: list[int] | None):
    """(trans, accept, eps) of the DFAs side by side, ids shifted; with `exits`, dfas[1 + i] is a
    copy whose accepting states move (epsilon) to state exits[i] of dfas[0] instead of accepting."""
    size = sum(d.num_states for d in dfas)
    trans = np.empty((size, 256), dtype=np.int32)
    accept = np.zeros(size, dtype=bool)
    eps: dict[int, list[int]] = {}
    offset = 0
    for i, dfa in enumerate(dfas):
        block = trans[offset : offset + dfa.num_states]
        np.add(dfa.trans, offset, out=block)
        block[dfa.trans < 0] = -1
        if exits is None or i == 0:
            accept[offset : offset + dfa.num_states] = dfa.accept
        else:
            for q in np.flatnonzero(dfa.accept).tolist():
                eps[offset + q] = [exits[i - 1]]
        offset += dfa.num_states
    return trans, accept, eps


def _check_states(size: int, max_states: int) -> None:
    if size > max_states:
        raise CompileBudgetExceeded(
            f"splicing sub-automata needs more than {max_states} states (the memory budget allows "
            f"~{BYTES_PER_STATE // 1024} KiB each); simplify the schema or raise memory_budget_bytes")


_BATCH_BYTES = 64 << 20  # the subset construction's gathered rows per batch of subsets


def _determinize(trans: np.ndarray, accept: np.ndarray, eps: dict[int, list[int]], start: int, max_states: int,
                 check: Callable[[], None] = lambda: None):
    """Subset construction for a DFA plus epsilon moves `eps`: (trans, accept, start, whether
    some subset holds two or more live states); `check()` runs between batches.

    A state keeps its id as a singleton (its row mapped through the closures in one numpy
    step); only subsets of two or more states get new rows, a batch of subsets at a time: their
    members' rows are gathered, closed, sorted and deduplicated in numpy, and only each distinct
    new subset costs a dict look-up.
    """
    n = trans.shape[0]
    # An inert state (no edge, not accepting: a copy's final state, a placeholder's source with
    # nothing else to do) adds nothing to a subset: leaving it out keeps most subsets singletons.
    inert = ~accept & (trans < 0).all(axis=1)
    closure = {x: tuple(y for y in _closure(x, eps) if not inert[y]) for x in eps}
    width = max([1, *map(len, closure.values())])
    closed = np.full((n + 1, width), n, dtype=np.int32)  # each state's closure; n pads (and is "none")
    closed[:n, 0] = np.where(inert, n, np.arange(n, dtype=np.int32))
    for x, members in closure.items():
        closed[x] = n
        closed[x, : len(members)] = members
    ids: dict[tuple[int, ...], int] = {}
    subsets: list[tuple[int, ...]] = []

    def subset_id(members: tuple[int, ...]) -> int:
        if len(members) <= 1:  # a closed singleton is the state itself; none is dead
            return members[0] if members else -1
        k = ids.get(members)
        if k is None:
            k = ids[members] = n + len(subsets)
            subsets.append(members)
        return k

    closure_id = np.arange(n + 1, dtype=np.int32)
    closure_id[n] = -1  # index -1 (dead) reads the last slot
    for x, members in closure.items():
        closure_id[x] = subset_id(members)
    rows = [closure_id[trans]]
    accepts = [accept]
    # Bytes whose columns are equal in every state lead every subset alike: subsets are walked on
    # one byte per class (a JSON grammar has a few dozen classes of 256) and the rows widened after.
    if subsets:
        reps, byte_class = np.unique(byte_classes(trans), return_inverse=True)
        padded = np.vstack([np.where(trans[:, reps] < 0, n, trans[:, reps]), np.full((1, reps.size), n, dtype=np.int32)])
    done = 0
    while done < len(subsets):
        k = max(len(m) for m in subsets[done : done + 64])
        batch = subsets[done : done + max(1, _BATCH_BYTES // (k * width * reps.size * 4 * 2))]
        done += len(batch)
        row, acc = _subset_rows(batch, padded, closed, accept, subset_id)
        row = row[:, byte_class.reshape(-1)]
        _check_states(n + len(subsets), max_states)  # alternatives can multiply subsets
        check()
        rows.append(row)
        accepts.append(acc)
    out_trans = np.concatenate(rows)
    return out_trans, np.concatenate(accepts), int(closure_id[start]), bool(subsets)


def _subset_rows(batch: list[tuple[int, ...]], padded: np.ndarray, closed: np.ndarray, accept: np.ndarray,
                 subset_id: Callable[[tuple[int, ...]], int]) -> tuple[np.ndarray, np.ndarray]:
    """The DFA rows (int32 [B, C]) and acceptance of a batch of subsets (`padded`: the C columns
    of trans walked, dead as n, and a row n of n; `closed`: each state's closure padded with n)."""
    n = padded.shape[0] - 1
    k = max(map(len, batch))
    members = np.full((len(batch), k), n, dtype=np.int32)
    for i, m in enumerate(batch):
        members[i, : len(m)] = m
    # [B, C, k * width]: every member's successor, closed, per column; sorted, duplicates to n.
    succ = closed[padded[members]].transpose(0, 2, 1, 3).reshape(len(batch), padded.shape[1], -1)
    succ.sort(axis=2)
    succ[:, :, 1:][succ[:, :, 1:] == succ[:, :, :-1]] = n
    succ.sort(axis=2)
    count = (succ < n).sum(axis=2)
    row = np.where(count == 1, succ[:, :, 0], -1).astype(np.int32)
    many = np.nonzero(count > 1)
    if many[0].size:
        wide = succ[many[0], many[1], : int(count.max())]
        keys, inverse = np.unique(wide, axis=0, return_inverse=True)
        new_ids = np.asarray([subset_id(tuple(x for x in key if x < n)) for key in keys.tolist()], dtype=np.int32)
        row[many] = new_ids[inverse.reshape(-1)]
    accept_padded = np.append(accept, False)
    return row, accept_padded[members].any(axis=1)


def _closure(x: int, eps: dict[int, list[int]]) -> tuple[int, ...]:
    """The states reachable from `x` by epsilon moves (x included), sorted."""
    seen = {x}
    stack = [x]
    while stack:
        for y in eps.get(stack.pop(), ()):
            if y not in seen:
                seen.add(y)
                stack.append(y)
    return tuple(sorted(seen))
