"""Numeric parts of the oneOf disjointness proof (the rest is `Converter.excludes` in to_regex.py).

A oneOf is written as the plain alternation of its branches only when no value the grammar
writes for one branch satisfies another; `Converter.disjoint` proves that pairwise with
sufficient tests, and lists `oneOf` as relaxed when it cannot. This module holds the range test:
two number schemas whose minimum/maximum (draft 4's boolean exclusives and draft 6's numeric ones)
leave no common value, counting only integers when `integral`. multipleOf and the rest are ignored,
so "meet" may be a false alarm (then oneOf stays relaxed), never a false proof.
"""

from __future__ import annotations

import math

Bound = tuple[float, bool] | None  # (value, is_exclusive); None: unbounded


def bounds(schema: dict) -> tuple[Bound, Bound]:
    """(low, high) of a number schema across drafts, each the tighter of its two spellings."""
    low = high = None
    if _is_number(schema.get("minimum")):
        low = (schema["minimum"], schema.get("exclusiveMinimum") is True)
    if _is_number(schema.get("maximum")):
        high = (schema["maximum"], schema.get("exclusiveMaximum") is True)
    ex_low, ex_high = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if _is_number(ex_low) and (low is None or ex_low >= low[0]):
        low = (ex_low, True)
    if _is_number(ex_high) and (high is None or ex_high <= high[0]):
        high = (ex_high, True)
    return low, high


def ranges_meet(a: dict, b: dict, integral: bool) -> bool:
    """Whether the ranges of `a` and `b` share a number (an integer, when `integral`)."""
    (low_a, high_a), (low_b, high_b) = bounds(a), bounds(b)
    low, high = _tighter(low_a, low_b, max), _tighter(high_a, high_b, min)
    if low is None or high is None:
        return True
    if integral:
        first = math.ceil(low[0]) + (1 if low[1] and float(low[0]).is_integer() else 0)
        last = math.floor(high[0]) - (1 if high[1] and float(high[0]).is_integer() else 0)
        return first <= last
    return low[0] < high[0] or (low[0] == high[0] and not (low[1] or high[1]))


def _tighter(x: Bound, y: Bound, pick) -> Bound:
    """The tighter of two lower (pick=max) or upper (pick=min) bounds."""
    if x is None or y is None:
        return x if y is None else y
    if x[0] != y[0]:
        return x if pick(x[0], y[0]) == x[0] else y
    return (x[0], x[1] or y[1])


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
