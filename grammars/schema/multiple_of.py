"""`multipleOf` as a regex: the JSON numbers that are exact decimal multiples of m, within bounds.

m = k / 10^d (a finite decimal). A number is a multiple when its digits, read as one integer
N with the fraction padded to d places, satisfy N = 0 (mod k) and the fraction has at most d
significant digits. A small DFA reads the digits tracking the remainder; it is minimised and
turned into a regex by state elimination. Spellings are canonical integers / plain decimals
(no exponent, no "-0"; an integer multipleOf writes integers only), so the grammar is never
looser than the schema. Bounds beside multipleOf are enforced: a lower bound with no upper
one by writing out the multiples below the next power of ten, a range of at most MAX_LISTED
multiples by listing them. When the regex would pass MAX_REGEX_CHARS (m = 11: ~5M characters)
or a range holds more multiples it raises MultipleOfUnsupported: the caller relaxes the
keyword. A decimal m must divide 1 (0.01, 0.5, not 2.5) and caps integer parts at
MAX_INT_DIGITS digits; an integer m leaves them uncapped (see positive_multiples_regex). It
does not decide what else the schema allows.
"""

# The digit DFA is the classic divisibility automaton; the regex comes from the state
# elimination method (Brzozowski & McCluskey 1963), e.g. https://en.wikipedia.org/wiki/Kleene%27s_algorithm

from __future__ import annotations

import math
import re
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache

from surecall.grammars.schema.ranges import integer_range_regex, number_range_regex

MAX_REGEX_CHARS = 4_000  # m = 3, 6, 8 fit (<= 2k characters); 7 (~31k) does not: its DFA, built in
# a union with other multiples, took outlines-core past 30 s; 11 or 24 take millions
MAX_LISTED = 64  # bounds that cut the multiples partway: at most this many written out
NEAREST_LISTED = 256  # where no exact regex fits: this many multiples nearest zero (nearest_multiples_regex)
_MAX_MINIMAL_STATES = 64  # m = 7 has 7 states (~31k characters); 12 states give millions
MAX_INT_DIGITS = 15  # integer digits where the cap is cheap (see positive_multiples_regex)
MAX_DFA_STATES = 2_000  # larger remainder automata are not built (their regex would be far too long)


class MultipleOfUnsupported(Exception):
    """multipleOf (with its bounds) has no regex within the limits; the message says why."""
_DIGITS = "0123456789"


def split_multiple(m: object) -> tuple[int, int] | None:
    """(k, d) with m = k / 10^d, k >= 1; None when m is not a positive finite decimal."""
    if isinstance(m, bool) or not isinstance(m, (int, float)) or not math.isfinite(m) or m <= 0:
        return None
    exact = Decimal(repr(m)) if isinstance(m, float) else Decimal(m)
    sign, digits, exponent = exact.normalize().as_tuple()
    d = max(-exponent, 0)
    k = int("".join(map(str, digits))) * 10 ** max(exponent, 0)
    return (k, d) if d <= 12 else None


def combined_multiple(a: object, b: object) -> int | float | None:
    """The multipleOf equal to both (their least common multiple), None when either is not a decimal."""
    left, right = split_multiple(a), split_multiple(b)
    if left is None or right is None:
        return None
    d = max(left[1], right[1])
    k = math.lcm(left[0] * 10 ** (d - left[1]), right[0] * 10 ** (d - right[1]))
    value = Fraction(k, 10**d)
    return int(value) if value.denominator == 1 else float(Decimal(k) / Decimal(10**d))


def _decimal_step(m: object, is_integer: bool) -> tuple[int, int, Fraction]:
    """(k, d, k/10^d): `m` as a decimal step, reduced for integers (an integer i is a multiple of
    k/10^d iff i*10^d = 0 mod k); MultipleOfUnsupported when `m` is not a short finite decimal."""
    split = split_multiple(m)
    if split is None:
        raise MultipleOfUnsupported(f"multipleOf {m!r} is not a finite decimal with at most 12 fraction digits")
    k, d = split
    if is_integer:
        k, d = k // math.gcd(k, 10**d), 0
    return k, d, Fraction(k, 10**d)


def multiple_of_regex(schema: dict, m: object, is_integer: bool) -> str | None:
    """Regex for the numbers (integers when `is_integer`) that are multiples of `m` and meet the
    schema's minimum/maximum/exclusive* bounds; None when there is none. MultipleOfUnsupported
    when not expressible within the limits (see the module doc)."""
    k, d, step = _decimal_step(m, is_integer)
    low_n, high_n = _multiplier_range(schema, step)
    if low_n is not None and high_n is not None and low_n > high_n:
        return None
    if k == 1 and d == 0:  # multiples of 1: the integers in range
        return integer_range_regex(low_n, high_n)
    if k == 1 and (low_n is not None or high_n is not None):  # 10^-d: the decimals of <= d places in range
        scale, cap = Decimal(10) ** -d, Decimal(10) ** MAX_INT_DIGITS  # integer parts capped as below
        low = -cap if low_n is None else max(low_n * scale, -cap)
        high = cap if high_n is None else min(high_n * scale, cap)
        return number_range_regex(low, high, low == -cap, high == cap, places=d)
    signed = [(sign, _positive_part(k, d, lo, hi, step))
              for sign, lo, hi in (("", _max(low_n, 1), high_n), ("-", _neg(_min(high_n, -1)), _neg(low_n)))
              if hi is None or lo <= hi]
    if len(signed) == 2 and signed[0][1] == signed[1][1]:
        signed = [("-?", signed[0][1])]
    parts = [sign + f"(?:{part})" for sign, part in signed]
    if (low_n is None or low_n <= 0) and (high_n is None or high_n >= 0):
        parts.insert(0, r"0(?:\.0+)?" if d else "0")
    return "|".join(f"(?:{p})" for p in parts) if parts else None


def nearest_multiples_regex(schema: dict, m: object, is_integer: bool, count: int = NEAREST_LISTED) -> str | None:
    """The `count` multiples of `m` within the schema's bounds nearest zero, written out (stricter
    than the schema: for a multipleOf whose exact regex is past the limits); None: none in bounds.
    MultipleOfUnsupported when `m` is not a short finite decimal."""
    k, d, step = _decimal_step(m, is_integer)
    low_n, high_n = _multiplier_range(schema, step)
    if low_n is not None and high_n is not None and low_n > high_n:
        return None
    if low_n is not None and low_n > 0:
        chosen = range(low_n, low_n + count if high_n is None else min(low_n + count, high_n + 1))
    elif high_n is not None and high_n < 0:
        chosen = range(high_n, high_n - count if low_n is None else max(high_n - count, low_n - 1), -1)
    else:  # zero in range: outward from it, positive first at each distance
        chosen = [0]
        for n in range(1, count):
            chosen += [x for x in (n, -n) if (low_n is None or x >= low_n) and (high_n is None or x <= high_n)]
            if len(chosen) >= count:
                break
    texts = [re.escape(_decimal_text(n * step)) for n in list(chosen)[:count]]
    return "|".join(f"(?:{t})" for t in texts) if texts else None


def _positive_part(k: int, d: int, lo: int, hi: int | None, step: Fraction) -> str | None:
    """The multiples n*step for lo <= n <= hi (hi None: unbounded), spelled as magnitudes.

    Unbounded above with lo > 1: the multiples below the next power of ten T >= lo*step are
    written out, those from T up are the DFA's with at least len(str(T)) integer digits."""
    if hi is None and lo > 1:
        threshold = 10 ** max(len(str(math.ceil(lo * step))) - 1, 0)
        threshold = threshold if threshold >= lo * step else threshold * 10
        below = math.ceil(threshold / step)  # multipliers from here up have threshold <= n*step
        listed = _listed(lo, below - 1, step, d) if below > lo else ""
        rest = positive_multiples_regex(k, d, len(str(threshold)))
        return f"{listed}|{rest}" if listed else rest
    if hi is None:
        return positive_multiples_regex(k, d)
    return _listed(lo, hi, step, d)


def _listed(lo: int, hi: int, step: Fraction, d: int) -> str:
    """The multiples n*step, lo <= n <= hi, each as its shortest decimal (trailing zeros allowed when d > 0)."""
    if hi - lo + 1 > MAX_LISTED:
        raise MultipleOfUnsupported(f"the bounds leave {hi - lo + 1} multiples, more than the {MAX_LISTED} "
                                    "written out, and cut them partway")
    texts = [re.escape(_decimal_text(n * step)) for n in range(lo, hi + 1)]
    if d > 0:
        texts = [t + ("0*" if "." in t else r"(?:\.0+)?") for t in texts]
    return "|".join(texts)


def _decimal_text(value: Fraction) -> str:
    text = format(Decimal(value.numerator) / Decimal(value.denominator), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def _multiplier_range(schema: dict, step: Fraction) -> tuple[int | None, int | None]:
    """(lowest n, highest n) with n*step within the schema's bounds (None: unbounded)."""
    low_n = high_n = None
    for key, is_excl in (("minimum", schema.get("exclusiveMinimum") is True), ("exclusiveMinimum", True)):
        bound = _exact(schema.get(key))
        if bound is not None:
            n = math.floor(bound / step) + 1 if is_excl else math.ceil(bound / step)
            low_n = n if low_n is None else max(low_n, n)
    for key, is_excl in (("maximum", schema.get("exclusiveMaximum") is True), ("exclusiveMaximum", True)):
        bound = _exact(schema.get(key))
        if bound is not None:
            n = math.ceil(bound / step) - 1 if is_excl else math.floor(bound / step)
            high_n = n if high_n is None else min(high_n, n)
    return low_n, high_n


def _exact(value: object) -> Fraction | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return Fraction(Decimal(repr(value))) if isinstance(value, float) else Fraction(value)


def _max(a: int | None, b: int) -> int:
    return b if a is None else max(a, b)


def _min(a: int | None, b: int) -> int:
    return b if a is None else min(a, b)


def _neg(a: int | None) -> int | None:
    return None if a is None else -a


def positive_multiples_regex(k: int, d: int, min_int_digits: int = 0) -> str:
    """Regex for the positive multiples of k/10^d spelled as canonical magnitudes (no sign),
    with at least `min_int_digits` integer digits (leading "0" not counted).

    A decimal step (d > 0) must divide 1 (k | 10^d: 0.01, 0.5, 0.25; then only the fraction
    decides) and its integer parts are capped at MAX_INT_DIGITS: json_lex's numbers stay below
    2^53, where floats still divide exactly. An integer step is uncapped: the validators divide
    integers exactly, and a cap would multiply the automaton's states by the digit count."""
    if d > 0 and 10**d % k:
        raise MultipleOfUnsupported(f"a decimal multipleOf {k}/10^{d} that does not divide 1 would need integer "
                                    "parts of unbounded length, past what floats divide exactly")
    regex = _positive_multiples(k, d, min_int_digits, MAX_INT_DIGITS if d > 0 else 0)
    if regex is None:
        raise MultipleOfUnsupported(f"the remainder automaton of multipleOf {k}/10^{d} gives a regex longer "
                                    f"than {MAX_REGEX_CHARS} characters")
    return regex


@lru_cache(maxsize=64)
def _positive_multiples(k: int, d: int, min_int_digits: int, max_int_digits: int) -> str | None:
    if k * (d + 2) * (max(min_int_digits, max_int_digits) + 1) > MAX_DFA_STATES:
        return None
    states, accepting = _digit_dfa(k, d, min_int_digits, max_int_digits)
    blocks = _minimise(states, accepting)
    return _eliminate(states, accepting, blocks)


def _digit_dfa(k: int, d: int, width: int, cap: int) -> tuple[dict, set]:
    """The reachable DFA over digits and '.': state (phase, remainder, fraction digits, nonzero
    seen, integer digits: counted up to `cap`, or saturating at `width` when cap is 0)."""
    start = ("S", 0, 0, False, 0)
    states: dict = {}
    todo = [start]
    while todo:
        state = todo.pop()
        if state in states:
            continue
        states[state] = {}
        for symbol in _DIGITS + ".":
            nxt = _step(state, symbol, k, d, width, cap)
            if nxt is not None:
                states[state][symbol] = nxt
                todo.append(nxt)
    accepting = {s for s in states if s[0] in "IZF" and s[3] and s[4] >= width
                 and (s[1] * 10 ** (d - s[2])) % k == 0}
    return states, accepting


def _step(state: tuple, symbol: str, k: int, d: int, width: int, cap: int) -> tuple | None:
    phase, r, j, nonzero, digits = state
    if symbol == ".":
        return ("D", r, 0, nonzero, digits) if phase in "IZ" and d > 0 else None
    c = int(symbol)
    if phase == "S":
        return ("Z", 0, 0, False, 0) if c == 0 else ("I", c % k, 0, True, 1 if cap else min(1, width))
    if phase == "I":
        if cap and digits >= cap:
            return None
        return ("I", (10 * r + c) % k, 0, True, digits + 1 if cap else min(digits + 1, width))
    if phase in "DF" and j < d:
        return ("F", (10 * r + c) % k, j + 1, nonzero or c > 0, digits)
    if phase == "F" and c == 0:
        return state  # trailing zeros past d places change nothing
    return None


def _minimise(states: dict, accepting: set) -> dict:
    """Moore partition refinement: state -> block number (the start state's block is 0)."""
    order = list(states)
    block = {s: int(s in accepting) for s in order}
    while True:
        signatures: dict = {}
        new = {}
        for s in order:
            key = (block[s], tuple(block.get(states[s].get(c)) for c in _DIGITS + "."))
            new[s] = signatures.setdefault(key, len(signatures))
        if len(signatures) == len(set(block.values())):
            return new
        block = new


def _eliminate(states: dict, accepting: set, blocks: dict) -> str | None:
    """State elimination on the minimal DFA; None past MAX_REGEX_CHARS."""
    labels: dict = {}
    for s, moves in states.items():
        for symbol, t in moves.items():
            labels.setdefault((blocks[s], blocks[t]), set()).add(symbol)
    inner = set(blocks.values())
    if len(inner) > _MAX_MINIMAL_STATES:
        return None
    edges = {pair: _label(symbols) for pair, symbols in labels.items()}
    finals = {blocks[s] for s in accepting}
    return eliminate(edges, blocks[("S", 0, 0, False, 0)], finals, MAX_REGEX_CHARS)


def eliminate(edges: dict, start: object, finals: set, max_chars: int) -> str | None:
    """The regex of the automaton with `edges` {(p, q): regex} from `start` to any of `finals`, by
    state elimination (the state with the fewest in x out paths first); None past `max_chars`
    on one edge (or four times that in all)."""
    edges = dict(edges)
    inner = {p for pair in edges for p in pair} | {start} | set(finals)
    edges[("start", start)] = ""
    for q in finals:
        edges[(q, "final")] = ""
    ins_of: dict = {q: set() for q in inner}
    outs_of: dict = {q: set() for q in inner}
    for a, b in edges:
        if b in ins_of:
            ins_of[b].add(a)
        if a in outs_of:
            outs_of[a].add(b)
    total = sum(map(len, edges.values()))
    while inner:
        q = min(inner, key=lambda x: len(ins_of[x] - {x}) * len(outs_of[x] - {x}))
        inner.discard(q)
        loop = edges.pop((q, q), None)
        ins = [(a, edges.pop((a, q))) for a in ins_of.pop(q) if a != q]
        outs = [(b, edges.pop((q, b))) for b in outs_of.pop(q) if b != q]
        for a, _ in ins:
            outs_of.get(a, set()).discard(q)
        for b, _ in outs:
            ins_of.get(b, set()).discard(q)
        middle = "" if loop is None else _atom(loop) + "*"
        for a, into in ins:
            for b, out in outs:
                path = _seq(into) + middle + _seq(out)
                old = edges.get((a, b))
                edges[(a, b)] = path if old is None else f"{old}|{path}"
                total += len(path) + (1 if old is not None else 0)
                if a in outs_of:
                    outs_of[a].add(b)
                if b in ins_of:
                    ins_of[b].add(a)
                if len(edges[(a, b)]) > max_chars:
                    return None
        total -= sum(len(r) for _, r in ins) + sum(len(r) for _, r in outs) + len(loop or "")
        if total > 4 * max_chars:
            return None
    return edges.get(("start", "final"))


def residues_regex(k: int, residues: frozenset[int], low: int | None = None) -> str | None:
    """Regex for the integers i (canonical, no exponent) with i mod k in `residues`, and i >= low
    when `low` is -1, 0 or 1 (None: unbounded); None when there are none. MultipleOfUnsupported
    past the limits (as for multipleOf: m = 7 already needs ~31k characters)."""
    if low is not None and low not in (-1, 0, 1):
        raise MultipleOfUnsupported(f"a lower bound of {low} beside residues mod {k} is not written")
    residues = frozenset(r % k for r in residues)
    parts = ["0"] if 0 in residues and (low is None or low <= 0) else []
    for sign, wanted in (("", residues), ("-", frozenset(-r % k for r in residues))):
        if wanted and (sign == "" or low is None or low <= -1):
            magnitudes = _residue_magnitudes(k, wanted) if len(wanted) < k else "[1-9][0-9]*"
            if low == -1 and sign == "-":  # only -1 below zero
                magnitudes = "1" if 1 % k in wanted else None
            parts += [f"{sign}(?:{magnitudes})"] if magnitudes else []
    return "|".join(parts) if parts else None


@lru_cache(maxsize=64)
def _residue_magnitudes(k: int, wanted: frozenset[int]) -> str | None:
    """The positive integers whose remainder mod k is in `wanted`, as a regex (None: past the limits)."""
    if k > MAX_DFA_STATES:
        raise MultipleOfUnsupported(f"residues mod {k} need more than {MAX_DFA_STATES} automaton states")
    states, _ = _digit_dfa(k, 0, 0, 0)
    accepting = {s for s in states if s[0] == "I" and s[1] in wanted}
    blocks = _minimise(states, accepting)
    inner = set(blocks.values())
    if len(inner) > _MAX_MINIMAL_STATES:
        raise MultipleOfUnsupported(f"residues mod {k} leave {len(inner)} automaton states, past {_MAX_MINIMAL_STATES}")
    labels: dict = {}
    for s, moves in states.items():
        for symbol, t in moves.items():
            if t[0] != "Z":  # magnitudes start with 1-9
                labels.setdefault((blocks[s], blocks[t]), set()).add(symbol)
    edges = {pair: _label(symbols) for pair, symbols in labels.items()}
    regex = eliminate(edges, blocks[("S", 0, 0, False, 0)], {blocks[s] for s in accepting}, MAX_REGEX_CHARS)
    if regex is None:
        raise MultipleOfUnsupported(f"residues mod {k} give a regex longer than {MAX_REGEX_CHARS} characters")
    return regex


def _label(symbols: set) -> str:
    digits = sorted(int(c) for c in symbols if c != ".")
    parts = ([r"\."] if "." in symbols else []) + ([_digit_class(digits)] if digits else [])
    return "|".join(parts)


def _digit_class(digits: list[int]) -> str:
    if len(digits) == 1:
        return str(digits[0])
    runs, i = [], 0
    while i < len(digits):
        j = i
        while j + 1 < len(digits) and digits[j + 1] == digits[j] + 1:
            j += 1
        runs.append(str(digits[i]) if i == j else f"{digits[i]}-{digits[j]}")
        i = j + 1
    return "[" + "".join(runs) + "]"


def _atom(regex: str) -> str:
    """`regex` as one quantifiable atom."""
    if len(regex) == 1 or re.fullmatch(r"\\.|\[[^\]]*\]", regex):
        return regex
    return f"(?:{regex})"


def _seq(regex: str) -> str:
    """`regex` safe to concatenate (grouped when it has a top-level alternation)."""
    return f"(?:{regex})" if "|" in regex else regex
