"""One string expression (schema/regular.py's leaves and combinators) as a DFA over code points, and its body regex.

`StringAutomaton(expr, deadline, meter).body()` parses each `pattern` leaf (pattern.py's recursive
descent, building trees over (lower, upper) character sets), partitions the code points into
the classes no set tells apart, builds each leaf's DFA (Thompson NFA, subset construction),
combines them by product (dense numpy pairs) and complement, minimises (Moore) and writes the
JSON string body regex by state elimination (multiple_of.eliminate), escapes spelled as
json.dumps writes them. Past its caps it is stricter, never looser (see `combine`, `tree_emit`)
or raises RegularUnsupported. It reads no schema. Over 400 lines: pattern trees, the alphabet
partition, NFA/DFA construction, algebra and regex writing are one pipeline over one alphabet.
"""

# Product and complement of DFAs and Moore's partition refinement are the textbook
# constructions (Hopcroft, Motwani & Ullman, "Introduction to Automata Theory", ch. 4).

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from surecall.grammars.automaton import _refine
from surecall.grammars.schema import json_lex as lex
from surecall.grammars.schema.multiple_of import eliminate
from surecall.grammars.schema.pattern import (
    _CLASS_ESCAPES,
    _LINE_TERMINATORS,
    _PY_SPACE,
    PatternUnsupported,
    _outside_classes,
    _Parser,
    _python_ranges,
    _top_branches,
    leading_lookaheads,
)

MAX_NFA_STATES = 20_000  # one pattern's Thompson automaton (counted repetitions are copies)
MAX_DFA_STATES = 30_000  # any automaton built on the way (before minimising)
MAX_PRODUCT_PAIRS = 1_000_000  # state pairs of one product laid out densely
MAX_BODY_CHARS = 12_000  # the string body regex written out
# Groups nested in a body regex: outlines-core's parser (regex-syntax) refuses past 250 ("error
# building NFA"); the converter wraps a body in a few more (a string, a member, an object).
MAX_BODY_NESTING = 160
MAX_EMITTED_STATES = 400  # states state elimination is tried on (its cost is quadratic in them)
MAX_KEPT_STATES = 1_000  # a union cut to the branches that fit stops growing past this
MAX_TREE_FINALS = 8  # accepting states whose shortest paths a too-long body regex is cut to
MAX_CLASS_RANGES = 8  # past-ASCII ranges of one character set (see _fewer_ranges)
# Every control character, each as json.dumps writes it (short escapes where there is one).
_CONTROL_ESCAPES = r"\\[bfnrt]|\\u00(?:0[0-7bBeEfF]|1[0-9a-fA-F])"


class RegularUnsupported(Exception):
    """The schema is not read here as one string automaton (the message says why)."""


class RegularGaveUp(RegularUnsupported):
    """The schema is one string automaton, but building it passed the step cap or the time budget."""


class WorkMeter:
    """Steps the string automata of one schema may still take: a cap that, unlike a time limit,
    gives the same result on a fast host and a loaded one. A step is one state (or state pair)
    built or re-signed; `StringAutomaton.spend` charges them."""

    def __init__(self, steps: int):
        self.cap = self.left = steps

    @property
    def spent(self) -> int:
        return self.cap - self.left


# --- patterns -> syntax trees over (lower, upper) character sets ----------------------------
# ("set", lower ranges, upper ranges), ("cat", [nodes]), ("alt", [nodes]), ("rep", node, lo, hi), and the
# zero-width anchors inside a pattern ("bol",) (`^`: holds before the first character only) and ("eol",)
# (`$`: after the last only; the upper reading drops it); the top-level ones are read by parse_top as before.


def _pattern_node(pattern: str) -> tuple[object, bool]:
    """(tree of the strings `pattern` finds a match in, whether lower and upper sets all agree)."""
    anything = ("rep", ("set", lex.ALL_CHARS, lex.ALL_CHARS), 0, None)
    trailing_newline = ("rep", ("set", [], [(0x0A, 0x0A)]), 0, 1)  # Python's `$` also ends before one
    branches, is_exact = [], True
    try:
        for branch in _top_branches(pattern):
            parser = _TreeParser(branch)
            for starts, body, ends in parser.parse_top():
                branches.append(("cat", [body if starts else ("cat", [anything, body]),
                                         trailing_newline if ends else anything]))
                is_exact = is_exact and parser.is_agreed and not ends
    except PatternUnsupported as exc:
        raise RegularUnsupported(f"pattern {pattern!r}: {exc}") from exc
    return ("alt", branches), is_exact


class _TreeParser(_Parser):
    """pattern.py's recursive descent, building trees instead of regex text."""

    def __init__(self, pattern: str):
        super().__init__(pattern, max_repeat=1 << 31)
        self.is_agreed = True
        self.depth = 0  # groups open around the parser's position

    def parse_alternation(self):
        options = [self.parse_sequence(top=False)]
        while self.peek() == "|":
            self.pos += 1
            options.append(self.parse_sequence(top=False))
        return ("alt", options)

    def parse_sequence(self, top: bool):
        parts = []
        while self.peek() not in ("", "|", ")") and not (top and self.peek() == "$" and self._dollar_ends()):
            parts.append(self.parse_quantified())
        return ("cat", parts)

    def repeat(self, atom, low: int, high: int | None):
        return ("rep", atom, low, high)

    def parse_atom(self):
        c = self.peek()
        if c == "(":
            return self.parse_group()
        if c == "[":
            return self.char_set(self.parse_class())
        if c == ".":  # ECMA leaves out every line terminator, Python only \n
            self.pos += 1
            return self.char_set((lex.complement(_LINE_TERMINATORS), lex.complement([(0x0A, 0x0A)])))
        if c in "^$":  # an anchor inside the pattern (no multiline flag: the input's ends only)
            self.pos += 1
            if self.peek() in ("*", "+", "?", "{"):
                raise self.fail("a quantified anchor")
            if c == "^":
                return ("bol",)
            # Python's `$` also holds before a final newline: lower reads the end only, upper no
            # assertion at all (a superset of both readings, as an upper language must be)
            self.is_agreed = False
            return ("eol",)
        if c in "*+?":
            raise self.fail("a quantifier with nothing to repeat")
        if c == "\\":
            return self.char_set(self.parse_escape(in_class=False))
        self.pos += 1
        return ("set", [(ord(c), ord(c))], [(ord(c), ord(c))])

    def parse_group(self):
        """A group's tree (it needs no (?:...) around it). A positive lookahead that ends a branch
        not anchored at its end (`X(?=Y)`) is read as the group itself: a string holds a match of
        X followed by one of Y exactly where it holds a match of XY (the search may stop anywhere)."""
        self.depth += 1
        try:
            if not self.src.startswith("(?=", self.pos) or self.depth > 1:
                return self.parse_group_body()
            start = self.pos
            self.pos += 3
            inner = self.parse_alternation()
            if self.peek() != ")":
                raise self.fail("an unbalanced parenthesis")
            self.pos += 1
            if self.peek() not in ("", "|"):
                self.pos = start
                raise self.fail("a lookaround that does not end an unanchored branch")
            return inner
        finally:
            self.depth -= 1

    def parse_escape(self, in_class: bool, negated: bool = False):
        c = self.peek(1)
        if c.lower() in _CLASS_ESCAPES:  # Python's own (Unicode-wide) \d \w \s, not pattern.py's stand-in
            self.pos += 2
            ecma = list(_CLASS_ESCAPES[c.lower()])
            python = list(_PY_SPACE) if c.lower() == "s" else list(_python_ranges(c.lower()))
            return (lex.complement(ecma), lex.complement(python)) if c.isupper() else (ecma, python)
        return super().parse_escape(in_class, negated)

    def char_set(self, sets) -> tuple:
        ecma, python = lex.normalize(sets[0]), lex.normalize(sets[1])
        lower = _fewer_ranges(lex.subtract(ecma, lex.complement(python)), widen=False)
        upper = _fewer_ranges(lex.normalize(ecma + python), widen=True)
        self.is_agreed = self.is_agreed and lower == upper
        return ("set", lower, upper)


def _fewer_ranges(ranges: list[tuple[int, int]], widen: bool) -> list[tuple[int, int]]:
    """`ranges` with at most MAX_CLASS_RANGES ranges past ASCII (Python's \\d and \\w have
    hundreds, and each edge of the body regex spells its class out): the gaps between them filled
    (`widen`: a superset, for an upper set) or the narrowest dropped (a subset, for a lower one)."""
    ascii_part = [r for r in ranges if r[1] < 0x80]
    wide = [r for r in ranges if r[1] >= 0x80]
    if len(wide) <= MAX_CLASS_RANGES:
        return ranges
    if not widen:
        return lex.normalize(ascii_part + sorted(wide, key=lambda r: r[0] - r[1])[:MAX_CLASS_RANGES])
    gaps = sorted(range(len(wide) - 1), key=lambda i: wide[i + 1][0] - wide[i][1])
    filled = [(wide[i][1], wide[i + 1][0]) for i in gaps[: len(wide) - MAX_CLASS_RANGES]]
    return lex.subtract(lex.normalize(ranges + filled), [(0xD800, 0xDFFF)])


# --- expressions -> DFAs over atoms (classes of code points) --------------------------------


@dataclass
class _DFA:
    trans: list[list[int]]  # [state][atom] -> state (complete: a dead state is a state)
    accept: list[bool]  # start state 0


def expand_lookaheads(expr: object) -> object:
    """`expr` with each pattern leaf that opens with lookaheads (pattern.leading_lookaheads) written
    as the conjunction of its parts, which the automaton builds by product and complement."""
    if isinstance(expr, bool):
        return expr
    if expr[0] == "pat":
        parts = leading_lookaheads(expr[1])
        return expr if parts is None else ("all", parts)
    if expr[0] == "not":
        return ("not", expand_lookaheads(expr[1]))
    if expr[0] in ("all", "any", "one"):
        return (expr[0], [expand_lookaheads(e) for e in expr[1]])
    return expr


class StringAutomaton:
    def __init__(self, expr: object, deadline: float | None, meter: WorkMeter | None = None):
        expr = expand_lookaheads(expr)
        self.expr = expr
        self.deadline = deadline
        self.meter = meter
        ranges: list[list[tuple[int, int]]] = []
        self.patterns: dict[str, tuple[object, bool]] = {}  # pattern -> (tree, lower and upper agree)
        _collect_sets(expr, ranges, self.patterns)
        self.pattern_dfas: dict[tuple[str, bool], _DFA] = {}
        self.atoms, self.bounds, self.interval_atom = _partition(ranges)
        self.num_atoms = len(self.atoms)
        self.masks: dict[tuple, int] = {}
        self.is_approximate = False  # a union was cut to the branches that fit (stricter)

    def body(self) -> str | None:
        lower, _ = self.build(self.expr, lower=True, upper=False)
        try:
            body = self.emit(lower)
        except RegularUnsupported:
            self.is_approximate = True
            body = self.tree_emit(lower)
        if body is None and self.is_approximate:
            raise RegularUnsupported("the union left after dropping branches past the size caps is empty")
        return body

    def matches_nothing(self) -> bool:
        """Whether no string is in the upper language of the expression (one that holds every string
        either validator accepts): then none is valid, whichever reads the schema."""
        _, upper = self.build(self.expr, lower=False, upper=True)
        return self.is_empty(upper)

    @staticmethod
    def is_empty(dfa: _DFA) -> bool:
        """Whether `dfa` accepts no string."""
        return 0 not in _coreachable(dfa)

    def check_time(self) -> None:
        if self.deadline is not None and time.perf_counter() > self.deadline:
            raise RegularGaveUp("the string automaton ran past the compile's time budget")

    def spend(self, steps: int) -> None:
        """Charge `steps` to the meter (past its cap: RegularUnsupported), then check the time."""
        if self.meter is not None:
            self.meter.left -= steps
            if self.meter.left < 0:
                raise RegularGaveUp(f"the string automata passed their cap of {self.meter.cap:,} steps "
                                    "(surecall.grammars.schema.to_regex.MAX_REGULAR_STEPS)")
        self.check_time()

    def build(self, expr: object, lower: bool, upper: bool) -> tuple[_DFA | None, _DFA | None]:
        """(lower, upper), each when asked for: a DFA inside both validators' languages of `expr`,
        and one holding both (None where not asked)."""
        self.spend(1)
        if isinstance(expr, bool):
            dfa = self.constant(expr)
            return dfa, dfa
        kind = expr[0]
        if kind == "pat":
            is_exact = self.patterns[expr[1]][1]
            low = self.pattern_dfa(expr[1], upper=False) if lower or is_exact else None
            return low, (low if is_exact else self.pattern_dfa(expr[1], upper=True)) if upper else None
        if kind in ("len", "lit"):
            dfa = self.length_dfa(expr[1], expr[2]) if kind == "len" else self.literal_dfa(expr[1])
            return dfa, dfa
        if kind == "not":  # the strings surely outside are those outside the upper language
            low, up = self.build(expr[1], lower=upper, upper=lower)
            outside = self.complement(up) if lower else None
            return outside, (outside if low is up else self.complement(low)) if upper else None
        if kind == "one":
            parts = [self.build(e, lower=True, upper=True) for e in expr[1]]
            return self.exactly_one([p[0] for p in parts], [p[1] for p in parts], lower, upper)
        expr = (kind, _flattened(kind, expr[1]))
        parts = [self.build(e, lower, upper) for e in expr[1]]
        test = all if kind == "all" else any
        try:
            low = self.combine([p[0] for p in parts], test, may_drop=kind == "any") if lower else None
        except RegularUnsupported:
            if kind != "all" or upper or not any(_is_union(e) for e in expr[1]):
                raise
            return self.build(_distributed(expr), lower=True, upper=False)
        if upper and lower and all(p[0] is p[1] for p in parts):
            return low, low
        return low, self.combine([p[1] for p in parts], test, may_drop=kind == "all") if upper else None

    def combine(self, dfas: list[_DFA], test, may_drop: bool) -> _DFA:
        """The product of `dfas` under `test` (all: intersection, any: union). Past the size caps,
        with `may_drop`, of the fewest-state operands that fit: a smaller union for a lower
        language, a larger intersection for an upper one (never looser where it is used)."""
        try:
            return self.fold(dfas, test)
        except RegularUnsupported:
            if not may_drop:
                raise
        self.is_approximate = True
        kept = self.constant(test is all)
        for dfa in sorted(dfas, key=lambda d: len(d.accept)):
            try:
                grown = self.product([kept, dfa], test)
            except RegularUnsupported:
                break
            if len(grown.accept) > MAX_KEPT_STATES:
                break
            kept = grown
        return kept

    def fold(self, dfas: list[_DFA], test) -> _DFA:
        """The product two at a time, smallest first, minimised after each step."""
        if not dfas:
            return self.constant(test is all)
        dfas = sorted(dfas, key=lambda d: len(d.accept))
        out = dfas[0]
        for dfa in dfas[1:]:
            out = self.product([out, dfa], test)
        return out

    def exactly_one(self, lowers: list, uppers: list, lower: bool, upper: bool) -> tuple[_DFA | None, _DFA | None]:
        """oneOf: lower holds where branch i surely holds and no other possibly does; upper the converse."""
        n = len(lowers)
        if all(lo is up for lo, up in zip(lowers, uppers)):
            one = self.product(lowers, lambda bits: sum(bits) == 1)
            return one, one
        both = lowers + uppers
        low = self.product(both, lambda b: any(b[i] and not any(b[n + j] for j in range(n) if j != i)
                                               for i in range(n))) if lower else None
        up = self.product(both, lambda b: any(b[n + i] and not any(b[j] for j in range(n) if j != i)
                                              for i in range(n))) if upper else None
        return low, up

    # -- leaves
    def constant(self, value: bool) -> _DFA:
        return _DFA([[0] * self.num_atoms], [value])

    def length_dfa(self, low: int, high: int | None) -> _DFA:
        """Counts characters up to high + 1 (dead) or, with no high, up to low (then stays)."""
        top = low if high is None else high + 1
        trans = [[min(i + 1, top)] * self.num_atoms for i in range(top + 1)]
        accept = [i >= low and (high is None or i <= high) for i in range(top + 1)]
        return _DFA(trans, accept)

    def literal_dfa(self, strings: tuple[str, ...]) -> _DFA:
        trans, accept = [[-1] * self.num_atoms], [False]
        for text in strings:
            state = 0
            for ch in text:
                atom = self.interval_atom[bisect.bisect_right(self.bounds, ord(ch)) - 1]
                if atom is None:  # a lone surrogate: no JSON text the grammar writes
                    break
                if trans[state][atom] < 0:
                    trans.append([-1] * self.num_atoms)
                    accept.append(False)
                    trans[state][atom] = len(trans) - 1
                state = trans[state][atom]
            else:
                accept[state] = True
        dead = len(trans)
        trans.append([dead] * self.num_atoms)
        accept.append(False)
        return _DFA([[dead if t < 0 else t for t in row] for row in trans], accept)

    def mask(self, ranges: list[tuple[int, int]]) -> int:
        """The atoms (as bits) whose code points lie in `ranges` (a union of elementary intervals)."""
        key = tuple(ranges)
        if key not in self.masks:
            bits = 0
            for lo, hi in ranges:
                i = bisect.bisect_right(self.bounds, lo) - 1
                while i < len(self.interval_atom) and self.bounds[i] <= hi:
                    if self.interval_atom[i] is not None:
                        bits |= 1 << self.interval_atom[i]
                    i += 1
            self.masks[key] = bits
        return self.masks[key]

    def pattern_dfa(self, pattern: str, upper: bool) -> _DFA:
        key = (pattern, upper)
        if key not in self.pattern_dfas:
            nfa = _NFA()
            start, end = nfa.fragment(self.patterns[pattern][0], upper, self)
            self.pattern_dfas[key] = self.minimise(self.determinise(nfa, start, end))
        return self.pattern_dfas[key]

    def determinise(self, nfa: _NFA, start: int, end: int) -> _DFA:
        """Subset construction. An anchor inside the pattern is a zero-width edge: `^` is crossed
        only before the first character (the start's closure), `$` only where the string ends (a
        subset accepts when its closure over `$` edges holds the end); the start's subset is a
        state of its own, as it alone may cross `^`."""
        has_bol, has_eol = bool(nfa.anchors["bol"]), bool(nfa.anchors["eol"])
        first = nfa.closure({start}, ("bol",)) if has_bol else nfa.closure({start})
        atoms_of: dict[int, tuple] = {}  # an edge's atom bits -> the atoms (few distinct bit sets, many edges)
        index = {("start", first) if has_bol else first: 0}
        order = [first]
        trans: list[list[int]] = []
        while len(trans) < len(order):
            if len(order) > MAX_DFA_STATES:
                raise RegularUnsupported(f"a pattern's automaton passes {MAX_DFA_STATES} states")
            members = order[len(trans)]
            moves: list[set] = [set() for _ in range(self.num_atoms)]
            for s in members:
                for bits, t in nfa.edges[s]:
                    atoms = atoms_of.get(bits)
                    if atoms is None:
                        atoms = atoms_of[bits] = tuple(_bits(bits))
                    for a in atoms:
                        moves[a].add(t)
            row = []
            for targets in moves:
                key = nfa.closure(targets)
                if key not in index:
                    index[key] = len(order)
                    order.append(key)
                row.append(index[key])
            trans.append(row)
            self.spend(len(members) + self.num_atoms)
        if not has_eol:
            return _DFA(trans, [end in m for m in order])
        ends = [nfa.closure({start}, ("bol", "eol"))] + [nfa.closure(m, ("eol",)) for m in order[1:]]
        return _DFA(trans, [end in m for m in ends])

    # -- algebra
    def complement(self, dfa: _DFA) -> _DFA:
        return _DFA(dfa.trans, [not a for a in dfa.accept])

    def product(self, dfas: list[_DFA], test: Callable[[tuple], bool]) -> _DFA:
        """The reachable product of `dfas`, accepting where `test` of their acceptances holds,
        minimised. Two at a time over dense numpy tables (state pairs as i * n2 + j)."""
        trans, accepts = np.asarray(dfas[0].trans, np.int64), [np.asarray(dfas[0].accept)]
        for dfa in dfas[1:]:
            other = np.asarray(dfa.trans, np.int64)
            n1, n2 = len(trans), len(other)
            if n1 * n2 > MAX_PRODUCT_PAIRS:
                raise RegularUnsupported(f"a product automaton of {n1} x {n2} states passes {MAX_PRODUCT_PAIRS} pairs")
            pairs = (trans[:, None, :] * n2 + other[None, :, :]).reshape(n1 * n2, self.num_atoms)
            accepts = [np.repeat(acc, n2) for acc in accepts] + [np.tile(np.asarray(dfa.accept), n1)]
            reached = _reachable(pairs)
            if reached.size > MAX_DFA_STATES:
                raise RegularUnsupported(f"a product automaton passes {MAX_DFA_STATES} states")
            remap = np.full(n1 * n2, -1, np.int64)
            remap[reached] = np.arange(reached.size)
            trans, accepts = remap[pairs[reached]], [acc[reached] for acc in accepts]
            self.spend(n1 * n2)
        bits = np.stack(accepts, axis=1)
        accept = [test(tuple(row)) for row in bits.tolist()]
        return self.minimise(_DFA(trans, accept))

    def minimise(self, dfa: _DFA) -> _DFA:
        """The coarsest partition (automaton._refine's hashed worklist rounds, checked to be a
        congruence, else Moore's exact rounds over whole rows); blocks renumbered in order of
        first visit."""
        trans = np.asarray(dfa.trans, np.int64)
        accept_a = np.asarray(dfa.accept, bool)
        block = _refine(trans, accept_a, check=lambda: self.spend(len(trans)))
        num_blocks = int(block.max()) + 1
        rep = np.zeros(num_blocks, np.int64)
        rep[block[::-1]] = np.arange(len(block))[::-1]  # each block's first state
        if not (np.array_equal(block[trans], block[trans[rep[block]]]) and np.array_equal(accept_a, accept_a[rep[block]])):
            block, num_blocks = self.moore_blocks(trans, accept_a)
        quotient = np.zeros((num_blocks, trans.shape[1]), np.int64)
        quotient[block] = block[trans]
        accept = np.zeros(num_blocks, bool)
        accept[block] = np.asarray(dfa.accept, bool)
        order = _reachable(quotient, sort=False, start=int(block[0]))  # breadth-first: the start's block first
        remap = np.full(num_blocks, -1, np.int64)
        remap[order] = np.arange(order.size)
        return _DFA(remap[quotient[order]].tolist(), accept[order].tolist())

    def moore_blocks(self, trans: np.ndarray, accept: np.ndarray) -> tuple[np.ndarray, int]:
        """Moore's partition refinement over whole rows (exact: no hashing), as (block, count)."""
        _, block = np.unique(accept, return_inverse=True)
        block = block.reshape(-1)
        num_blocks = int(block.max()) + 1
        while True:
            new = _row_ids(np.concatenate([block[:, None], block[trans]], axis=1))
            if new.max() + 1 == num_blocks:
                return block, num_blocks
            block, num_blocks = new, int(new.max()) + 1
            self.spend(len(trans))

    # -- regex
    def emit(self, dfa: _DFA) -> str | None:
        """The body regex of `dfa` (None: it accepts nothing)."""
        live = _coreachable(dfa)
        if 0 not in live:
            return None
        if len(live) > MAX_EMITTED_STATES:
            raise RegularUnsupported(f"the string automaton keeps {len(live)} states, past {MAX_EMITTED_STATES}")
        labels: dict[tuple[int, int], int] = {}
        for s in live:
            for a, t in enumerate(dfa.trans[s]):
                if t in live:
                    labels[(s, t)] = labels.get((s, t), 0) | (1 << a)
        edges = {pair: self.label(bits) for pair, bits in labels.items()}
        finals = {s for s in live if dfa.accept[s]}
        regex = eliminate(edges, 0, finals, MAX_BODY_CHARS)
        if regex is None:
            raise RegularUnsupported(f"the string body regex passes {MAX_BODY_CHARS} characters")
        return _not_too_nested(regex)

    def tree_emit(self, dfa: _DFA) -> str | None:
        """A sub-language of `dfa` with a short regex, where its own is too long: the shortest
        paths to its MAX_TREE_FINALS nearest accepting states, each state on them keeping its
        self-loops (stricter than the schema, never looser; None: it accepts nothing)."""
        live = _coreachable(dfa)
        if 0 not in live:
            return None
        parent: dict[int, int | None] = {0: None}
        order = [0]
        for s in order:  # grows while read: breadth first over live states
            for t in dfa.trans[s]:
                if t in live and t not in parent:
                    parent[t] = s
                    order.append(t)
        finals = [s for s in order if dfa.accept[s]][:MAX_TREE_FINALS]
        kept: set[int] = set()
        for s in finals:
            while s is not None and s not in kept:
                kept.add(s)
                s = parent[s]
        labels: dict[tuple[int, int], int] = {}
        for s in kept:
            for a, t in enumerate(dfa.trans[s]):
                if t == s or (t in kept and parent[t] == s):
                    labels[(s, t)] = labels.get((s, t), 0) | (1 << a)
        edges = {pair: self.label(bits) for pair, bits in labels.items()}
        regex = eliminate(edges, 0, set(finals), MAX_BODY_CHARS)
        if regex is None:
            raise RegularUnsupported(f"even the shortest paths' body regex passes {MAX_BODY_CHARS} characters")
        return _not_too_nested(regex)

    def label(self, bits: int) -> str:
        ranges = lex.normalize([r for a in _bits(bits) for r in self.atoms[a]])
        if lex.subtract([(0, 0x1F)], ranges):  # some control character left out: one escape each
            return lex.char_set_regex(ranges) or ""
        rest = [p for p in (lex.char_set_regex(lex.subtract(ranges, [(0, 0x1F)])), _CONTROL_ESCAPES) if p]
        return "|".join(rest)


def _flattened(kind: str, exprs: list) -> list:
    """`exprs` with the children of nested `kind` nodes lifted into them."""
    out = []
    for e in exprs:
        out.extend(_flattened(kind, e[1]) if isinstance(e, tuple) and e[0] == kind else [e])
    return out


def _is_union(expr: object) -> bool:
    return isinstance(expr, tuple) and expr[0] == "any"


def _distributed(expr: tuple) -> tuple:
    """all[..., any[b1, ..., bn], ...] as any[all[..., b1, ...], ...] (its widest union spread)."""
    parts = list(expr[1])
    i = max((j for j, e in enumerate(parts) if _is_union(e)), key=lambda j: len(parts[j][1]))
    rest = parts[:i] + parts[i + 1:]
    return ("any", [("all", [*rest, branch]) for branch in parts[i][1]])


def _bits(bits: int):
    a = 0
    while bits:
        if bits & 1:
            yield a
        bits >>= 1
        a += 1


def _row_ids(rows: np.ndarray) -> np.ndarray:
    """Dense ids of the distinct rows of `rows` [S, k] (equal rows, equal ids), a column at a time."""
    packed = np.ascontiguousarray(rows, np.int32)
    keys = packed.view(np.dtype((np.void, packed.dtype.itemsize * packed.shape[1]))).reshape(-1)
    _, ids = np.unique(keys, return_inverse=True)
    return ids.reshape(-1)


def _reachable(trans: np.ndarray, sort: bool = True, start: int = 0) -> np.ndarray:
    """The states reachable from `start` in `trans` [S, A], sorted or in breadth-first order."""
    seen = np.zeros(len(trans), bool)
    seen[start] = True
    order, frontier = [np.array([start])], np.array([start])
    while frontier.size:
        nxt = np.unique(trans[frontier].reshape(-1))
        frontier = nxt[~seen[nxt]]
        seen[frontier] = True
        order.append(frontier)
    return np.flatnonzero(seen) if sort else np.concatenate(order)


def _coreachable(dfa: _DFA) -> set[int]:
    preds: list[set[int]] = [set() for _ in dfa.accept]
    for s, row in enumerate(dfa.trans):
        for t in row:
            preds[t].add(s)
    live = {s for s, a in enumerate(dfa.accept) if a}
    todo = list(live)
    while todo:
        for p in preds[todo.pop()]:
            if p not in live:
                live.add(p)
                todo.append(p)
    return live


def _collect_sets(expr: object, out: list, patterns: dict) -> None:
    """The character sets `expr` tells apart, into `out`; each pattern parsed into `patterns`."""
    if isinstance(expr, bool):
        return
    kind = expr[0]
    if kind == "pat" and expr[1] not in patterns:
        patterns[expr[1]] = _pattern_node(expr[1])
        _collect_node_sets(patterns[expr[1]][0], out)
    elif kind == "lit":
        out.extend([[(ord(c), ord(c))] for text in expr[1] for c in text])
    elif kind == "not":
        _collect_sets(expr[1], out, patterns)
    elif kind in ("all", "any", "one"):
        for e in expr[1]:
            _collect_sets(e, out, patterns)


def _collect_node_sets(node: tuple, out: list) -> None:
    if node[0] in ("bol", "eol"):
        return
    if node[0] == "set":
        out.extend([node[1], node[2]])
    elif node[0] == "rep":
        _collect_node_sets(node[1], out)
    else:
        for child in node[1]:
            _collect_node_sets(child, out)


def _partition(sets: list[list[tuple[int, int]]]):
    """Atoms: the classes of code points no set tells apart (each a list of ranges), the
    elementary intervals' bounds, and each interval's atom (None: the surrogates)."""
    points = {0, 0xD800, 0xE000, lex.MAX_CODE_POINT + 1}
    for ranges in sets:
        for lo, hi in ranges:
            points.update((lo, hi + 1))
    bounds = sorted(p for p in points if p <= lex.MAX_CODE_POINT + 1)
    signature = [0] * (len(bounds) - 1)
    for k, ranges in enumerate({tuple(r) for r in sets}):
        for lo, hi in ranges:
            i = bisect.bisect_left(bounds, lo)
            while i < len(signature) and bounds[i] <= hi:
                signature[i] |= 1 << k
                i += 1
    atom_of_sig: dict[int, int] = {}
    interval_atom: list[int | None] = []
    atoms: list[list[tuple[int, int]]] = []
    for i, sig in enumerate(signature):
        if 0xD800 <= bounds[i] <= 0xDFFF:
            interval_atom.append(None)
            continue
        if sig not in atom_of_sig:
            atom_of_sig[sig] = len(atoms)
            atoms.append([])
        interval_atom.append(atom_of_sig[sig])
        atoms[atom_of_sig[sig]].append((bounds[i], bounds[i + 1] - 1))

    return atoms, bounds, interval_atom


class _NFA:
    """Thompson automaton: per state, epsilon targets and (atom bits, target) edges."""

    def __init__(self):
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[int, int]]] = []
        self.anchors: dict[str, list[tuple[int, int]]] = {"bol": [], "eol": []}  # zero-width edges
        self.closures: dict = {}

    def state(self) -> int:
        if len(self.eps) >= MAX_NFA_STATES:
            raise RegularUnsupported(f"a pattern's NFA passes {MAX_NFA_STATES} states")
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1

    def fragment(self, node: tuple, upper: bool, builder: StringAutomaton) -> tuple[int, int]:
        kind = node[0]
        start = self.state()
        if kind in ("bol", "eol"):
            end = self.state()
            if kind == "eol" and upper:
                self.eps[start].append(end)
            else:
                self.anchors[kind].append((start, end))
            return start, end
        if kind == "set":
            end = self.state()
            bits = builder.mask(node[2] if upper else node[1])
            if bits:
                self.edges[start].append((bits, end))
            return start, end
        if kind == "cat":
            end = start
            for child in node[1]:
                s, e = self.fragment(child, upper, builder)
                self.eps[end].append(s)
                end = e
            return start, end
        if kind == "alt":
            end = self.state()
            for child in node[1]:
                s, e = self.fragment(child, upper, builder)
                self.eps[start].append(s)
                self.eps[e].append(end)
            return start, end
        _, child, low, high = node
        end = start
        for _ in range(low):
            s, e = self.fragment(child, upper, builder)
            self.eps[end].append(s)
            end = e
        if high is None:
            s, e = self.fragment(child, upper, builder)
            self.eps[end].append(s)
            self.eps[e].append(s)
            self.eps[s].append(e)
            return start, e
        final = self.state()
        for _ in range(high - low):
            self.eps[end].append(final)
            s, e = self.fragment(child, upper, builder)
            self.eps[end].append(s)
            end = e
        self.eps[end].append(final)
        return start, final

    def closure(self, states, anchors: tuple[str, ...] = ()) -> frozenset:
        """The states reached from `states` over epsilon edges and the zero-width `anchors` edges."""
        key = (frozenset(states), anchors)
        if key not in self.closures:
            extra: dict[int, list[int]] = {}
            for kind in anchors:
                for s, t in self.anchors[kind]:
                    extra.setdefault(s, []).append(t)
            seen, todo = set(key[0]), list(key[0])
            while todo:
                s = todo.pop()
                for t in (*self.eps[s], *extra.get(s, ())):
                    if t not in seen:
                        seen.add(t)
                        todo.append(t)
            self.closures[key] = frozenset(seen)
        return self.closures[key]


def group_nesting(regex: str) -> int:
    """How deep `regex`'s groups nest (escapes and character classes skipped)."""
    return max((depth for _, c, depth in _outside_classes(regex) if c == "("), default=0)


def _not_too_nested(regex: str) -> str:
    nesting = group_nesting(regex)
    if nesting > MAX_BODY_NESTING:
        raise RegularUnsupported(f"the string body regex nests {nesting} groups deep, past {MAX_BODY_NESTING} "
                                 "(outlines-core's regex parser refuses past 250)")
    return regex
