"""Digit-range regexes: the JSON integers in [low, high], either side possibly open.

`integer_range_regex(low, high)` returns a regex matching exactly the canonical JSON spellings
(no leading zeros, no "-0", no fraction or exponent) of the integers in the range, or None when
the range is empty; `number_range_regex` does the same for numbers between decimal bounds.
"""

from __future__ import annotations

from decimal import Decimal

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


def number_range_regex(low: Decimal | int | None, high: Decimal | int | None, is_low_exclusive: bool = False,
                       is_high_exclusive: bool = False, places: int | None = None) -> str | None:
    """Regex for JSON numbers x (no exponent, no "-0") with low <= x <= high (or <, per flags).

    Bounds are finite decimals (ints, or Decimals such as Decimal("0.25")); None = unbounded
    on that side. With `places`, only numbers of at most that many fraction digits (trailing
    zeros aside): the multiples of 10^-places (multipleOf 0.01 is places=2).
    """
    low = None if low is None else Decimal(low)
    high = None if high is None else Decimal(high)
    parts = []
    if low is None or low < 0:  # x = -m with m > 0
        if high is None or high >= 0:
            m_low, m_low_excl = Decimal(0), True
        else:
            m_low, m_low_excl = -high, is_high_exclusive
        m_high = None if low is None else -low
        negative = _magnitude(m_low, m_low_excl, m_high, is_low_exclusive, places)
        if negative is not None:
            parts.append("-" + _group(negative))
    if high is None or high >= 0:
        if low is None or low < 0:
            a, a_excl = Decimal(0), False
        else:
            a, a_excl = low, is_low_exclusive
        non_negative = _magnitude(a, a_excl, high, is_high_exclusive, places)
        if non_negative is not None:
            parts.append(non_negative)
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else "|".join(_group(p) for p in parts)


def fraction_digits(value: Decimal) -> int:
    """How many digits a finite decimal has after its point (0 for an integer)."""
    exponent = value.normalize().as_tuple().exponent
    return max(0, -exponent) if isinstance(exponent, int) else 0


def _split(value: Decimal) -> tuple[int, str]:
    """(integer part, fraction digits without trailing zeros) of a non-negative decimal."""
    whole = int(value)
    digits = fraction_digits(value)
    frac = "" if digits == 0 else str(int((value - whole).scaleb(digits))).rjust(digits, "0").rstrip("0")
    return whole, frac


def _magnitude(a: Decimal, a_excl: bool, b: Decimal | None, b_excl: bool, places: int | None) -> str | None:
    """Non-negative decimals m (integer part + fraction) with a <= m <= b (or <, per flags):
    split by integer part, the bounds' own integer parts taking fractions compared digit by digit."""
    if b is not None and (b < a or (b == a and (a_excl or b_excl))):
        return None
    (a_int, a_frac), (b_int, b_frac) = _split(a), (None, "") if b is None else _split(b)
    if b_int == a_int:  # one integer part: fractions between the two
        fraction = _digits_between(a_frac, a_excl, b_frac, b_excl, False, places)
        bare = not a_frac and not a_excl  # m = a itself, written without a fraction
        return _with_fraction(str(a_int), fraction, bare)
    parts = [_with_fraction(str(a_int), _digits_between(a_frac, a_excl, None, False, False, places),
                            not a_frac and not a_excl)]
    middle = integer_range_regex(a_int + 1, None if b_int is None else b_int - 1)
    if middle is not None:
        fraction = _FRACTION_ANY if places is None else _FRACTION_ZERO if places == 0 else rf"(?:\.[0-9]{{1,{places}}}0*)?"
        parts.append(_group(middle) + fraction)
    if b_int is not None:
        parts.append(_with_fraction(str(b_int), _digits_between("", False, b_frac, b_excl, False, places),
                                    bool(b_frac) or not b_excl))
    return "|".join(_group(p) for p in parts if p is not None) or None


def _with_fraction(integer: str, fraction: str | None, bare: bool) -> str | None:
    """`integer`, then `.` and a fraction of `fraction`'s digits (None: none), or nothing if `bare`."""
    if fraction is None:
        return integer if bare else None
    return f"{integer}(?:\\.(?:{fraction}))" + ("?" if bare else "")


def _digits_between(lo: str, lo_excl: bool, hi: str | None, hi_excl: bool, allow_empty: bool,
                    places: int | None = None) -> str | None:
    """Regex for the digit strings d (empty too when `allow_empty`) with 0.lo <= 0.d <= 0.hi (<
    per flags; hi None: no upper bound below 1), with `places`: non-zero digits only among the
    first `places`; lo and hi carry no trailing zeros. None: there are none."""
    if places == 0:  # only zeros left: d is 0
        ok = not lo and not lo_excl and not (hi == "" and hi_excl)
        return ("0*" if allow_empty else "0+") if ok else None
    if not lo and hi is None:  # every string, or (exclusive of 0) those with a non-zero digit
        if places is not None:
            if lo_excl:
                return f"[0-9]{{0,{places - 1}}}[1-9]0*"
            return f"[0-9]{{0,{places}}}0*" if allow_empty else f"[0-9]{{1,{places}}}0*"
        if lo_excl:
            return "[0-9]*[1-9][0-9]*"
        return "[0-9]*" if allow_empty else "[0-9]+"
    if not lo and hi == "":  # exactly 0
        return None if lo_excl or hi_excl else ("0*" if allow_empty else "0+")
    branches = []
    if allow_empty and not lo and not lo_excl:  # d empty is 0, below any hi > 0
        branches.append("")
    lo_first = int(lo[0]) if lo else 0
    hi_first = 9 if hi is None else int(hi[0])
    inner_lo, inner_hi = lo_first + 1, hi_first - (0 if hi is None else 1)
    if inner_lo <= inner_hi:  # strictly between the bounds' first digits: anything after
        tail = "[0-9]*" if places is None else f"[0-9]{{0,{places - 1}}}0*"
        branches.append(f"{_digit_class(str(inner_lo), str(inner_hi))}{tail}")
    after = None if places is None else places - 1
    if hi is not None and lo_first == hi_first:
        rest = _digits_between(lo[1:], lo_excl, hi[1:], hi_excl, True, after)
        if rest is not None:
            branches.append(f"{lo_first}(?:{rest})")
        return "|".join(f"(?:{b})" for b in branches) if branches else None
    rest = _digits_between(lo[1:], lo_excl, None, False, True, after)
    if rest is not None:
        branches.append(f"{lo_first}(?:{rest})")
    if hi is not None:
        rest = _digits_between("", False, hi[1:], hi_excl, True, after)
        if rest is not None:
            branches.append(f"{hi_first}(?:{rest})")
    return "|".join(f"(?:{b})" for b in branches) if branches else None
