"""Bound what compiling a search pattern can cost, before it is compiled.

The `regex` package expands a counted repeat into its compiled program, so `x{100000000}` or
`((a{1000}){1000}){1000}` compiles for minutes and cannot be interrupted. `repeat_expansion`
scans the pattern once (escapes and character classes skipped) and returns an upper bound on
how many copies of one atom the counted repeats make: a counted repeat multiplies the largest
expansion seen so far in its group (deliberately pessimistic: `a{100}b{100}` counts 10 000, and
whitespace or verbose-mode comments cannot hide a nesting). It does not parse the syntax
(the compiler does that) and leaves `*`, `+`, `?` alone: they do not grow the program.
"""

from __future__ import annotations

import re

_COUNTED = re.compile(r"\{(\d*)(?:,(\d*))?\}")


def _class_end(pattern: str, i: int) -> int:
    """Index just past the character class that opens at `pattern[i] == '['`."""
    j = i + 1
    if j < len(pattern) and pattern[j] == "^":
        j += 1
    if j < len(pattern) and pattern[j] == "]":
        j += 1  # a leading ']' is a literal
    while j < len(pattern) and pattern[j] != "]":
        j += 2 if pattern[j] == "\\" else 1
    return j + 1


def _bound(match: re.Match) -> int | None:
    """The largest count of a `{n}`, `{n,}`, `{,m}` or `{n,m}`, or None when it is a literal brace."""
    low, high = match.group(1), match.group(2)
    if match.group(0) in ("{}", "{,}"):
        return None
    if high is None:
        return int(low)
    return int(high) if high else int(low or 0)


def repeat_expansion(pattern: str) -> int:
    """An upper bound on the copies of one atom the pattern's counted repeats compile into."""
    frames = [1]  # per open group: the largest expansion seen so far in it
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            i += 2
            continue
        if char == "[":
            i = _class_end(pattern, i)
            continue
        if char == "(":
            frames.append(1)
        elif char == ")" and len(frames) > 1:
            inner = frames.pop()
            frames[-1] = max(frames[-1], inner)
        elif char == "{":
            match = _COUNTED.match(pattern, i)
            count = _bound(match) if match else None
            if count is not None:
                frames[-1] *= max(count, 1)
                i = match.end()
                continue
        i += 1
    return max(frames)
