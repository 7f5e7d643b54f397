"""Digit-range regexes: the JSON integers in [low, high], either side possibly open.

`integer_range_regex(low, high)` returns a regex matching exactly the canonical JSON spellings
(no leading zeros, no "-0", no fraction or exponent) of the integers in the range, or None when
the range is empty. It does not handle non-integer bounds (callers round them first).
"""

from __future__ import annotations

# Adapted from the classic "regex for a numeric range" construction (split by digit count, then
# by common prefix), e.g. https://github.com/dimka665/range-regex


def integer_range_regex(low: int | None, high: int | None) -> str | None:
    """Regex for the integers n with low <= n <= high (None = unbounded on that side)."""
    if low is not None and high is not None and low > high:
        return None
    parts: list[str] = []
    if low is None or low < 0:  # negative part, as "-" + magnitude
        mag_low = 1 if high is None or high >= 0 else -high
        mag_high = None if low is None else -low
        parts.append("-" + _group(_nonneg_range(mag_low, mag_high)))
    if high is None or high >= 0:
        parts.append(_nonneg_range(max(low, 0) if low is not None else 0, high))
    return parts[0] if len(parts) == 1 else "|".join(_group(p) for p in parts)


def _nonneg_range(low: int, high: int | None) -> str:
    """Regex for low <= n <= high over non-negative integers (high None = unbounded)."""
    if high is None:
        width = len(str(low))
        longer = f"[1-9][0-9]{{{width},}}"
        if low == 0:
            return "0|[1-9][0-9]*"
        return _alt([_nonneg_range(low, 10**width - 1), longer])
    branches, full = [], []  # full: widths whose every number is in range, written as one run
    for width in range(len(str(low)), len(str(high)) + 1):
        lo = max(low, 10 ** (width - 1) if width > 1 else 0)
        hi = min(high, 10**width - 1)
        if lo == max(1, 10 ** (width - 1)) and hi == 10**width - 1:
            full.append(width)
        elif lo <= hi:
            branches.append(_same_width(str(lo), str(hi)))
    if full:  # consecutive by construction: only the first and last width can be partial
        low_rest, high_rest = full[0] - 1, full[-1] - 1
        count = "" if high_rest == 0 else f"{{{low_rest}}}" if low_rest == high_rest else f"{{{low_rest},{high_rest}}}"
        branches.append("[1-9]" + ("" if not count else f"[0-9]{count}"))
    return _alt(branches)


def _same_width(lo: str, hi: str) -> str:
    """Regex for the digit strings of one width between lo and hi (inclusive)."""
    if lo == hi:
        return lo
    if len(lo) == 1:
        return _digit_class(lo, hi)
    if lo[0] == hi[0]:
        return lo[0] + _group(_same_width(lo[1:], hi[1:]))
    rest = len(lo) - 1
    branches = []
    first_mid, last_mid = int(lo[0]), int(hi[0])
    if lo[1:] != "0" * rest:
        branches.append(lo[0] + _group(_same_width(lo[1:], "9" * rest)))
        first_mid += 1
    if hi[1:] != "9" * rest:
        last_mid -= 1
    if first_mid <= last_mid:
        branches.append(_digit_class(str(first_mid), str(last_mid)) + f"[0-9]{{{rest}}}")
    if hi[1:] != "9" * rest:
        branches.append(hi[0] + _group(_same_width("0" * rest, hi[1:])))
    return _alt(branches)


def _digit_class(lo: str, hi: str) -> str:
    return lo if lo == hi else f"[{lo}-{hi}]"


def _alt(branches: list[str]) -> str:
    return branches[0] if len(branches) == 1 else "|".join(_group(b) for b in branches)


def _group(regex: str) -> str:
    """Wrap in a non-capturing group unless the regex is one atom-sequence without '|'."""
    return f"(?:{regex})" if "|" in regex else regex


_FRACTION_ANY = r"(?:\.[0-9]+)?"
_FRACTION_ZERO = r"(?:\.0+)?"
_FRACTION_NONZERO = r"\.[0-9]*[1-9][0-9]*"


def number_range_regex(low: int | None, high: int | None, is_low_exclusive: bool = False,
                       is_high_exclusive: bool = False) -> str | None:
    """Regex for JSON numbers x (no exponent, no "-0") with low <= x <= high (or <, per flags).

    Bounds are integers (callers relax fractional bounds); None = unbounded on that side.
    """
    parts = []
    if low is None or low < 0:  # x = -m with m > 0
        if high is None or high >= 0:
            m_low, m_low_excl = 0, True
        else:
            m_low, m_low_excl = -high, is_high_exclusive
        m_high = None if low is None else -low
        negative = _magnitude(m_low, m_low_excl, m_high, is_low_exclusive)
        if negative is not None:
            parts.append("-" + _group(negative))
    if high is None or high >= 0:
        if low is None or low < 0:
            a, a_excl = 0, False
        else:
            a, a_excl = low, is_low_exclusive
        non_negative = _magnitude(a, a_excl, high, is_high_exclusive)
        if non_negative is not None:
            parts.append(non_negative)
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else "|".join(_group(p) for p in parts)


def _magnitude(a: int, a_excl: bool, b: int | None, b_excl: bool) -> str | None:
    """Non-negative decimals m (integer part + fraction) with a <= m <= b (or <, per flags)."""
    if b is not None and b < a:
        return None
    if b is not None and b == a:
        return None if (a_excl or b_excl) else f"{a}{_FRACTION_ZERO}"
    parts = [f"{a}{_FRACTION_NONZERO if a_excl else _FRACTION_ANY}"]
    middle = integer_range_regex(a + 1, None if b is None else b - 1)
    if middle is not None:
        parts.append(_group(middle) + _FRACTION_ANY)
    if b is not None and not b_excl:
        parts.append(f"{b}{_FRACTION_ZERO}")
    return "|".join(_group(p) for p in parts)
