"""Translate a JSON Schema `pattern` (ECMA-262 regex, search semantics) to a string-body regex.

The result matches the JSON-escaped body of every string (between the quotes) that the pattern
finds a match in, each character written the way `json.dumps(ensure_ascii=False)` writes it.
`translate_pattern` raises PatternUnsupported for what it cannot express exactly (lookaround,
backreferences, word boundaries, anchors inside groups, Unicode property classes, inline flags);
it returns `exact=False` when a repetition bound above `max_repeat` was widened (the grammar is
then looser than the pattern and the caller lists the pattern as relaxed).
Character sets are kept per regex engine (ECMA-262, as jsonschema-rs reads them, and Python's
`re`, as the `jsonschema` package reads them: its class escapes are Unicode-wide) and the
grammar takes their intersection, so it never allows a character either validator would reject.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

import numpy as np

from surecall.grammars.schema.json_lex import (
    ALL_CHARS,
    MAX_CODE_POINT,
    STRING_CHAR,
    char_set_regex,
    complement,
    escape_literal,
    normalize,
    subtract,
)

_DIGIT = [(0x30, 0x39)]
_WORD = [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]
_SPACE = [(0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
          (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF)]
_LINE_TERMINATORS = [(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)]
_CLASS_ESCAPES = {"d": _DIGIT, "w": _WORD, "s": _SPACE}  # ECMA-262: \d, \w ASCII; \s with \ufeff
# Python's \s (str.isspace): no \ufeff, but \x1c-\x1f and \x85 (tests check it against `re`).
_PY_SPACE = [(0x09, 0x0D), (0x1C, 0x20), (0x85, 0x85), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
             (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000)]
# A character set as each engine reads it: (ECMA-262 ranges, Python `re` ranges).
Sets = tuple[list[tuple[int, int]], list[tuple[int, int]]]
_CONTROL_ESCAPES = {"n": 0x0A, "r": 0x0D, "t": 0x09, "f": 0x0C, "v": 0x0B, "0": 0x00}


class PatternUnsupported(ValueError):
    """The pattern uses a construct that has no exact translation; the message says which."""


@dataclass(frozen=True)
class Translated:
    regex: str  # the string body (without quotes)
    is_exact: bool
    is_subset: bool = True  # every string the regex matches is one the pattern finds a match in


def translate_pattern(pattern: str, max_repeat: int, narrow: bool = False) -> Translated:
    """String-body regex for strings in which `pattern` finds a match.

    A repetition bound above `max_repeat` is widened (unbounded: looser, not a subset), or with
    `narrow` lowered to `max_repeat` (stricter: a subset, as object keys need).
    """
    any_run = f"{STRING_CHAR}*"
    # Branches with the same anchors share their free runs: `.*(?:a|b).*`, not `(?:.*a.*)|(?:.*b.*)`
    # (the same language; outlines-core's subset construction of the latter tracks each branch's
    # search apart: nine unanchored words took it past 30 s and 12 GB).
    by_anchors: dict[tuple[bool, bool], list[str]] = {}
    is_exact, is_subset = True, True
    for branch in _top_branches(pattern):
        parser = _Parser(branch, max_repeat, narrow)
        for starts, body, ends in parser.parse_top():
            by_anchors.setdefault((starts, ends), []).append(body)
        is_exact = is_exact and parser.is_exact
        is_subset = is_subset and parser.is_subset
    out = []
    for (starts, ends), bodies in by_anchors.items():
        body = bodies[0] if len(bodies) == 1 else "|".join(f"(?:{b})" for b in bodies)
        if len(bodies) > 1 and (not starts or not ends):
            body = f"(?:{body})"
        out.append(("" if starts else any_run) + body + ("" if ends else any_run))
    regex = out[0] if len(out) == 1 else "|".join(f"(?:{b})" for b in out)
    return Translated(regex=regex, is_exact=is_exact, is_subset=is_subset)


# A pattern with more ambiguous positions than this may make outlines-core's subset construction
# exponential (`a[ab]{16}$`: 20 s and 2.5 GB, in-process where neither budget holds): to_regex
# builds its body first in the child process, where both budgets are enforced (check_blowup).
MAX_INPROCESS_WEIGHT = 12
_CLASS_ESCAPE_LETTERS = frozenset("dDwWsS")


def ambiguity_weight(pattern: str) -> int:
    """An estimate of the ambiguous positions of `pattern`: each `.`, `[...]` or class escape
    counts 1, a group what it holds (at least 1 with an alternative inside: `(a|b)` is `[ab]`), a
    `{n,m}` multiplies what it repeats by its bound (n when unbounded). About 2 ** weight subsets
    is what a DFA construction of it may have to track."""
    total, alts, last, i = [0], [False], 0, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            last = int(pattern[i + 1 : i + 2] in _CLASS_ESCAPE_LETTERS)
            total[-1] += last
            i += 2
            continue
        if c == "[":
            j = i + 1 + (pattern[i + 1 : i + 2] == "^")
            j += pattern[j : j + 1] == "]"
            while j < len(pattern) and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            last, i = 1, j + 1
            total[-1] += 1
            continue
        if c == "(":
            total.append(0)
            alts.append(False)
            i += 1
            if pattern[i : i + 1] == "?":  # (?:  (?=  (?!  (?<name>  (?<=  (?<!
                named = pattern[i + 1 : i + 2] == "<" and pattern[i + 2 : i + 3] not in ("=", "!")
                i = max(pattern.find(">", i) + 1, i + 2) if named else i + 2
            continue
        if c == ")":
            last = max(total.pop(), int(alts.pop())) if len(total) > 1 else 0
            total[-1] += last
            i += 1
            continue
        if c == "{":
            end = pattern.find("}", i)
            bounds = pattern[i + 1 : end].split(",") if end > i else []
            if 1 <= len(bounds) <= 2 and all(b.strip().isdigit() or (k == 1 and not b.strip()) for k, b in enumerate(bounds)):
                times = int(bounds[-1]) if bounds[-1].strip() else int(bounds[0])
                total[-1] += last * (max(times, 1) - 1)
                i = end + 1
                continue
        alts[-1] = alts[-1] or c == "|"
        last = int(c == ".") if c not in "*+?" else last
        total[-1] += int(c == ".")
        i += 1
    return sum(total)


def counted_run(pattern: str) -> tuple[str, int, int | None] | None:
    """(one character's regex, low, high) when `pattern` is one anchored character set under one
    quantifier (`^[A-Za-z0-9_-]{1,64}$`, `^\\d{1,255}$`, `^.{0,1000}$`), else None.

    Such a pattern says exactly "a string of low..high characters of that set": the schema
    converter hands it to the string counter (any bound exact) instead of materialising it.
    """
    branches = _top_branches(pattern)
    if len(branches) != 1 or not branches[0].startswith("^") or branches[0][1:2] in ("(", "^", "$", ""):
        return None
    parser = _Parser(branches[0][1:], max_repeat=1 << 31)
    char, low, high = None, 0, 0
    try:  # one set, or the same set several times (`^.......$`, `^\d{3}\d{2,4}$`): bounds add up
        while parser.src[parser.pos :] != "$":
            atom = parser.parse_atom()
            bounds = parser.parse_quantifier() or (1, 1)
            if parser.peek() == "?":
                parser.pos += 1
            if atom is None or (char is not None and atom != char):
                return None
            char, low = atom, low + bounds[0]
            high = None if high is None or bounds[1] is None else high + bounds[1]
    except PatternUnsupported:
        return None
    if char is None:
        return None
    return char, low, high


def loose_run(pattern: str) -> tuple[str, int] | None:
    """(one character's regex, low) when `pattern` is counted_run's shape with an anchor missing
    (`[a-zA-Z0-9_-]{162}`, `^\\w{100,}`, `\\d{64}$`): a search for a run of at least `low` of
    those characters somewhere in the string. Its strings made of that run alone
    (`^[set]{low,}$`) are a subset the string counter can write exactly; None otherwise."""
    branches = _top_branches(pattern)
    if len(branches) != 1:
        return None
    branch = branches[0]
    start = branch.startswith("^")
    end = branch.endswith("$") and not branch.endswith("\\$")
    if start and end:
        return None
    core = branch[1 if start else 0 : len(branch) - 1 if end else len(branch)]
    found = counted_run(f"^{core}$") if core[:1] not in ("(", "^", "$", "") else None
    return None if found is None else (found[0], found[1])


@dataclass(frozen=True)
class CountedRepetition:
    """`^(?:A B){low,high}A$` (optionally `^$|` beside it) as counted_repetition reads it, rotated
    to `A (?:B A){low,high}`: each iteration then opens with B's first character (`first`), right
    after an A, where the string counter can count it (a word count: `^(?:\\S+\\s+){0,49}\\S+$`).
    The fields are string-body regexes; `rest` is B after its first character."""

    lead: str
    first: str
    rest: str
    low: int
    high: int
    empty: bool  # the pattern also matches the empty string (`^$|...`)
    unbounded: str = ""  # the pattern with the bound dropped, `^(?:A B)*A$` (what the counted DFA spells)


_BOUNDED = re.compile(r"\{([0-9]+),([0-9]+)\}\??")


def counted_repetition(pattern: str, max_repeat: int) -> CountedRepetition | None:
    """The pattern's CountedRepetition when it is `^(?:A B){n,m}A$` (one group repeated, the text
    after it repeating the group's start; `^$|` may stand beside it) with m above `max_repeat`
    and B opening with one character set (alone or under `+`); None otherwise, or where a part has
    no exact translation. Whether the counter can tell each iteration's first character apart
    from A's (the counted cut) is the caller's check."""
    branches = _top_branches(pattern)
    empty = len(branches) == 2 and "^$" in branches
    if empty:
        branches = [b for b in branches if b != "^$"]
    if len(branches) != 1:
        return None
    branch = branches[0]
    if not (branch.startswith("^(") and branch.endswith("$")) or branch.endswith("\\$"):
        return None
    core = branch[1:-1]
    close = next((i for i, c, depth in _outside_classes(core) if c == ")" and depth == 0), None)
    inner = None if close is None else _unwrap_group(core[: close + 1])
    bounds = None if close is None else _BOUNDED.match(core, close + 1)
    if inner is None or bounds is None or len(_split_alternatives(inner)) != 1:
        return None
    low, high, lead = int(bounds.group(1)), int(bounds.group(2)), core[bounds.end() :]
    if high <= max_repeat or low > max_repeat or low > high or not lead or not inner.startswith(lead):
        return None
    try:
        lead_body = _exact_body(lead, max_repeat)
        parser = _Parser(inner[len(lead) :], max_repeat)
        first = parser.parse_atom()
        quantifier = parser.parse_quantifier()
        if parser.peek() == "?" and quantifier is not None:
            parser.pos += 1
        if quantifier not in (None, (1, None)) or first is None or not parser.is_exact:
            return None
        tail = parser.src[parser.pos :]
        tail_body = _exact_body(tail, max_repeat) if tail else ""
    except PatternUnsupported:
        return None
    if lead_body is None or tail_body is None:
        return None
    rest = (f"(?:{first})*" if quantifier else "") + tail_body
    return CountedRepetition(lead_body, first, rest, low, high, empty, f"^(?:{inner})*{lead}$")


def _exact_body(part: str, max_repeat: int) -> str | None:
    """The body regex of `^part$` when its translation is exact and one branch (None otherwise)."""
    parser = _Parser(part, max_repeat)
    found = parser.parse_top()
    if len(found) != 1 or found[0][0] or found[0][2] or not parser.is_exact:
        return None
    return found[0][1]


def _top_branches(pattern: str) -> list[str]:
    """Top-level alternatives, each unwrapped from groups that span all of it.

    `^$|(^a+$)` becomes `^$` and `^a+$`, so anchors written inside a whole-branch group are
    still at the ends of their branch (a group changes nothing about what it matches).
    """
    branches = []
    for branch in _split_alternatives(pattern):
        inner = _unwrap_group(branch)
        if inner is None:
            branches.append(branch)
        else:
            branches.extend(_top_branches(inner))
    return branches


def _outside_classes(pattern: str):
    """(index, char, group depth after it) for each character outside escapes and [...] classes."""
    depth, i, in_class = 0, 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        else:
            depth += (c == "(") - (c == ")")
            yield i, c, depth
        i += 1


def _split_alternatives(pattern: str) -> list[str]:
    parts, start = [], 0
    for i, c, depth in _outside_classes(pattern):
        if c == "|" and depth == 0:
            parts.append(pattern[start:i])
            start = i + 1
    parts.append(pattern[start:])
    return parts


def leading_lookaheads(pattern: str) -> list | None:
    """A pattern that is `^`, lookaheads, then the rest (`^(?=.*[A-Z])(?!.*\\s).{8,}$`), as the
    conjunction of string-expression leaves (schema/string_automaton.py) it means: a lookahead
    `(?=X)` at the start holds where `^X` finds a match (`^X1` or `^X2` for `X1|X2`), `(?!X)` where
    it does not, and the
    rest must match from the start too. None for any other pattern (a top-level `|`, no leading
    lookahead, an unbalanced group)."""
    if not pattern.startswith(("^(?=", "^(?!")) or len(_split_alternatives(pattern)) != 1:
        return None
    depth_after = {i: depth for i, c, depth in _outside_classes(pattern) if c in "()"}
    parts, i = [], 1
    while pattern.startswith(("(?=", "(?!"), i):
        close = next((j for j in sorted(depth_after) if j > i and pattern[j] == ")"
                      and depth_after[j] == depth_after[i] - 1), None)
        if close is None:
            return None
        alternatives = [("pat", "^" + branch) for branch in _split_alternatives(pattern[i + 3 : close])]
        leaf = alternatives[0] if len(alternatives) == 1 else ("any", alternatives)  # (no `$` inside a group)
        parts.append(leaf if pattern[i + 2] == "=" else ("not", leaf))
        i = close + 1
    parts.append(("pat", "^" + pattern[i:]))
    return parts


def _unwrap_group(branch: str) -> str | None:
    """The inside of a plain or named group that spans the whole branch, else None."""
    if not branch.startswith("(") or not branch.endswith(")") or branch.startswith("(?="):
        return None
    if branch.startswith(("(?!", "(?<=", "(?<!")):
        return None
    for i, c, depth in _outside_classes(branch):
        if c == ")" and depth == 0 and i != len(branch) - 1:
            return None
    body = branch[1:-1]
    if body.startswith("?:"):
        return body[2:]
    if body.startswith("?<"):
        end = body.find(">")
        return body[end + 1 :] if end > 0 else None
    return None if body.startswith("?") else body


# A repeated set of one-byte characters (`[a-fA-F0-9]{64}`: a SHA-256 inside a larger pattern) is a chain of
# one state per character, no larger per state than a bounded string's: it is spelled out up to this
# many times max_repeat (192 by default: SHA-512's 128 hex digits), where a repeated group (a word,
# `(?:\S+\s+){0,99}`), a multi-byte character or a key pattern (lowered, `narrow`: a long chain under a
# patternProperties key took Github_trivial o9840 from 1.9 to 22 s) keeps max_repeat.
CHAR_RUN_FACTOR = 4
_ONE_BYTE_CLASS = re.compile(r"\[(?:[^\[\]()|\\]|\\u00[0-7][0-9A-Fa-f]|\\[-\]\\^])+\]|[A-Za-z0-9 ]")


def _one_byte_class(atom: str) -> bool:
    """Whether `atom` (parser output) is one character set whose members are each one ASCII byte."""
    return _ONE_BYTE_CLASS.fullmatch(atom) is not None


class _Parser:
    """Recursive descent over the pattern; emits regex text directly (None = matches nothing)."""

    def __init__(self, pattern: str, max_repeat: int, narrow: bool = False):
        self.src = pattern
        self.pos = 0
        self.max_repeat = max_repeat
        self.narrow = narrow
        self.is_exact = True
        self.is_subset = True

    def fail(self, what: str) -> PatternUnsupported:
        return PatternUnsupported(f"{what} at offset {self.pos} of pattern {self.src!r}")

    def peek(self, k: int = 0) -> str:
        i = self.pos + k
        return self.src[i] if i < len(self.src) else ""

    def parse_top(self) -> list[tuple[bool, str, bool]]:
        branches = []
        while True:
            starts = ends = False
            while self.peek() == "^":
                self.pos += 1
                starts = True
            body = self.parse_sequence(top=True)
            while self.peek() == "$":
                self.pos += 1
                ends = True
            if self.peek() not in ("|", ""):
                raise self.fail("an anchor that is not at the start or end of the pattern")
            if body is not None:
                branches.append((starts, body, ends))
            if self.peek() == "":
                break
            self.pos += 1
        if not branches:
            raise self.fail("a pattern that matches nothing")
        return branches

    def parse_alternation(self) -> str | None:
        options = [self.parse_sequence(top=False)]
        while self.peek() == "|":
            self.pos += 1
            options.append(self.parse_sequence(top=False))
        alive = [o for o in options if o is not None]
        if not alive:
            return None
        return alive[0] if len(alive) == 1 else "(?:" + "|".join(alive) + ")"

    def parse_sequence(self, top: bool) -> str | None:
        parts: list[str] = []
        dead = False
        while self.peek() not in ("", "|", ")") and not (top and self.peek() == "$" and self._dollar_ends()):
            atom = self.parse_quantified()
            if atom is None:
                dead = True
            else:
                parts.append(atom)
        return None if dead else "".join(parts)

    def _dollar_ends(self) -> bool:
        rest = self.src[self.pos :]
        stripped = rest.lstrip("$")
        return stripped == "" or stripped.startswith("|")

    def parse_quantified(self) -> str | None:
        atom = self.parse_atom()
        bounds = self.parse_quantifier()
        if bounds is None:
            return atom
        low, high = bounds
        if self.peek() == "?":  # lazy: same language
            self.pos += 1
        return self.repeat(atom, low, high)

    def repeat(self, atom: str | None, low: int, high: int | None) -> str | None:
        if atom is None:
            return "" if low == 0 else None
        cap = self.max_repeat * CHAR_RUN_FACTOR if not self.narrow and _one_byte_class(atom) else self.max_repeat
        if low > cap:
            self.is_exact, self.is_subset, low = False, False, cap
        if high is not None and high > cap:
            self.is_exact = False
            if self.narrow:
                high = max(low, cap)
            else:
                self.is_subset, high = False, None
        if low == 0 and high is None:
            return f"(?:{atom})*"
        if low == 1 and high is None:
            return f"(?:{atom})+"
        if low == 0 and high == 1:
            return f"(?:{atom})?"
        upper = "" if high is None else str(high)
        if high == low:
            return f"(?:{atom}){{{low}}}"
        return f"(?:{atom}){{{low},{upper}}}"

    def parse_quantifier(self) -> tuple[int, int | None] | None:
        c = self.peek()
        if c in "*+?" and c:
            self.pos += 1
            return {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        if c == "{":
            if re.match(r"\{,[0-9]+\}", self.src[self.pos :]):
                raise self.fail("{,n} (Python's re reads it as {0,n}, ECMA-262 as literal text)")
            end = self.src.find("}", self.pos)
            body = self.src[self.pos + 1 : end] if end > 0 else ""
            low_s, _, high_s = body.partition(",")
            if low_s.isdigit() and (high_s.isdigit() or high_s == "") and end > 0:
                self.pos = end + 1
                low = int(low_s)
                high = low if "," not in body else (int(high_s) if high_s else None)
                if high is not None and high < low:
                    raise self.fail("a quantifier with max < min")
                return low, high
        return None

    def parse_atom(self) -> str | None:
        c = self.peek()
        if c == "(":
            return self.parse_group()
        if c == "[":
            return char_set_regex(_agreed(self.parse_class()))
        if c == ".":  # ECMA excludes all line terminators, Python only \n: ECMA's is the smaller set
            self.pos += 1
            return char_set_regex(complement(_LINE_TERMINATORS))
        if c in "^$":
            raise self.fail("an anchor inside the pattern")
        if c in "*+?":
            raise self.fail("a quantifier with nothing to repeat")
        if c == "\\":
            return char_set_regex(_agreed(self.parse_escape(in_class=False)))
        self.pos += 1
        return escape_literal(c)

    def parse_group(self) -> str | None:
        inner = self.parse_group_body()
        return None if inner is None else f"(?:{inner})"

    def parse_group_body(self):
        """A group's inner alternation (its header skipped, its `)` read), as parse_alternation gives it."""
        self.pos += 1
        if self.peek() == "?":
            if self.src.startswith("?:", self.pos):
                self.pos += 2
            elif self.peek(1) == "<" and self.peek(2) not in "=!":
                end = self.src.find(">", self.pos)
                if end < 0:
                    raise self.fail("an unterminated group name")
                self.pos = end + 1
            else:
                raise self.fail("a lookaround or inline flag group")
        inner = self.parse_alternation()
        if self.peek() != ")":
            raise self.fail("an unbalanced parenthesis")
        self.pos += 1
        return inner

    def parse_class(self) -> Sets:
        self.pos += 1
        negate = self.peek() == "^"
        if negate:
            self.pos += 1
        if self.peek() == "]":  # ECMA: [] matches nothing and [^] anything; Python reads a literal ]
            raise self.fail("an empty character class")
        ecma: list[tuple[int, int]] = []
        python: list[tuple[int, int]] = []
        while True:
            c = self.peek()
            if c == "":
                raise self.fail("an unterminated character class")
            if c == "]":
                self.pos += 1
                break
            lo = self.class_atom(negate)
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.pos += 1
                hi = self.class_atom(negate)
                lo_cp, hi_cp = _single_code_point(lo), _single_code_point(hi)
                if lo_cp is None or hi_cp is None:
                    raise self.fail("a class range with a class escape as an end")
                if hi_cp < lo_cp:
                    raise self.fail("a class range out of order")
                ecma.append((lo_cp, hi_cp))
                python.append((lo_cp, hi_cp))
            else:
                ecma.extend(lo[0])
                python.extend(lo[1])
        ecma, python = normalize(ecma), normalize(python)
        return (complement(ecma), complement(python)) if negate else (ecma, python)

    def class_atom(self, negated: bool) -> Sets:
        if self.peek() == "\\":
            return self.parse_escape(in_class=True, negated=negated)
        cp = ord(self.peek())
        self.pos += 1
        return _single(cp)

    def parse_escape(self, in_class: bool, negated: bool = False) -> Sets:
        self.pos += 1
        c = self.peek()
        self.pos += 1
        if c == "":
            raise self.fail("a trailing backslash")
        if c.lower() in _CLASS_ESCAPES:
            ecma, python = _CLASS_ESCAPES[c.lower()], _python_class(c.lower(), c.isupper() != negated)
            return (complement(ecma), complement(python)) if c.isupper() else (list(ecma), python)
        if c in _CONTROL_ESCAPES and not (c == "0" and self.peek().isdigit()):
            return _single(_CONTROL_ESCAPES[c])
        if c == "b" and in_class:
            return _single(0x08)
        if c in "xu":
            return _single(self.parse_hex_escape(c))
        if c == "c" and self.peek().isalpha():
            raise self.fail("the control escape \\c (Python's re has none)")
        if c.isalnum():
            raise self.fail(f"the escape \\{c} (word boundary, backreference or property class)")
        return _single(ord(c))

    def parse_hex_escape(self, kind: str) -> int:
        if kind == "u" and self.peek() == "{":
            end = self.src.find("}", self.pos)
            digits = self.src[self.pos + 1 : end] if end > 0 else ""
            self.pos = end + 1 if end > 0 else self.pos
        else:
            width = 2 if kind == "x" else 4
            digits = self.src[self.pos : self.pos + width]
            if len(digits) != width:
                digits = ""
            self.pos += len(digits)
        try:
            cp = int(digits, 16)
        except ValueError:
            raise self.fail(f"a malformed \\{kind} escape") from None
        if 0xD800 <= cp <= 0xDFFF or cp > 0x10FFFF:
            raise self.fail("a surrogate or out-of-range code point escape")
        return cp


def _single(cp: int) -> Sets:
    return [(cp, cp)], [(cp, cp)]


def _single_code_point(sets: Sets) -> int | None:
    ecma, python = sets
    one = len(ecma) == 1 and ecma[0][0] == ecma[0][1]
    return ecma[0][0] if one and ecma == python else None


def _agreed(sets: Sets) -> list[tuple[int, int]]:
    """The characters both engines put in the set (what the grammar may allow)."""
    ecma, python = sets
    return subtract(ecma, complement(python))


@cache
def _python_ranges(escape: str) -> tuple[tuple[int, int], ...]:
    """Code-point ranges Python's `re` matches with the class escape \\d or \\w (str patterns)."""
    every = np.arange(MAX_CODE_POINT + 1, dtype="<u4").tobytes().decode("utf-32-le", "surrogatepass")
    return tuple((m.start(), m.end() - 1) for m in re.finditer(f"\\{escape}+", every))


def _python_class(escape: str, is_complemented: bool) -> list[tuple[int, int]]:
    """Python's reading of \\d, \\s or \\w, exact wherever the grammar's set can tell.

    Python's \\d and \\w contain ECMA's (ASCII) ones, so where the escape is not complemented in
    the end (not \\D, nor \\d inside [^...]) the ECMA set stands in for Python's: their
    intersection is the same and the Unicode-wide scan (~50 ms, once) is skipped.
    """
    if escape == "s":
        return list(_PY_SPACE)
    return list(_python_ranges(escape)) if is_complemented else list(_CLASS_ESCAPES[escape])


ANY_CHAR_RANGES = ALL_CHARS
