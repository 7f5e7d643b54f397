"""JSON lexical regexes and code-point sets rendered over JSON-escaped text.

A JSON string's body is escaped text, so a set of characters (from a schema `pattern` or a
format) becomes: the characters that may appear literally, plus the canonical escape of those
that must be escaped (`"`, `\\`, control characters), the way `json.dumps(ensure_ascii=False)`
writes them. Escapes of lone surrogates are never allowed (RFC 8785 rejects them downstream).
The dialect is the common subset of Python `re` and Rust regex-automata (outlines-core).
"""

from __future__ import annotations

# One character of a JSON string body: a literal char, a short escape, or a \u escape that is
# not a lone surrogate (a high+low surrogate pair is one character).
STRING_BODY_CLASS = r'[^"\\\x00-\x1f]'
_HEX = "[0-9a-fA-F]"
_UNICODE_ESCAPE = (
    rf"\\u(?:[0-9a-cA-CefEF]{_HEX}{{3}}|[dD][0-7]{_HEX}{{2}}"
    rf"|[dD][89abAB]{_HEX}{{2}}\\u[dD][c-fC-F]{_HEX}{{2}})"
)
STRING_CHAR = rf'(?:{STRING_BODY_CLASS}|\\["\\/bfnrt]|{_UNICODE_ESCAPE})'
STRING = f'"{STRING_CHAR}*"'
# Every number the grammar writes is one that I-JSON consumers read exactly or as a finite double
# (RFC 7493; surecall.dispatch rejects integers past 2^53-1 and non-finite floats): integer parts
# stay below 9e15 (< 2^53, and a short regex) and exponents within +-99, so every value is below
# 9e15 * 1e99 and never parses to inf (1e999 or a 400-digit "1...1.5" would) nor underflows to 0.
LARGEST_INTEGER = 9 * 10**15 - 1
NATURAL = "(?:0|[1-9][0-9]{0,14}|[1-8][0-9]{15})"  # 0..LARGEST_INTEGER, canonical spelling
INTEGER = "(?:0|-?(?:[1-9][0-9]{0,14}|[1-8][0-9]{15}))"  # +-LARGEST_INTEGER, no "-0"
NUMBER = rf"-?{NATURAL}(?:\.[0-9]+)?(?:[eE][+-]?[0-9]{{1,2}})?"
BOOLEAN = "true|false"
NULL = "null"

MAX_CODE_POINT = 0x10FFFF
ALL_CHARS: list[tuple[int, int]] = [(0, 0xD7FF), (0xE000, MAX_CODE_POINT)]
_SHORT_ESCAPES = {0x22: '"', 0x5C: "\\", 0x08: "b", 0x0C: "f", 0x0A: "n", 0x0D: "r", 0x09: "t"}
_REGEX_META = set("\\.+*?()|[]{}^$")


def normalize(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, merged, inclusive code-point ranges."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(r for r in ranges if r[0] <= r[1]):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def subtract(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Code points in a but not in b."""
    out = []
    for lo, hi in normalize(a):
        for blo, bhi in normalize(b):
            if bhi < lo or blo > hi:
                continue
            if blo > lo:
                out.append((lo, blo - 1))
            lo = bhi + 1
            if lo > hi:
                break
        if lo <= hi:
            out.append((lo, hi))
    return normalize(out)


def complement(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return subtract(ALL_CHARS, ranges)


def escape_literal(text: str) -> str:
    """Regex matching exactly the JSON-escaped (canonical) spelling of `text` inside a string."""
    return "".join(_escape_char(ord(c)) for c in text)


def _escape_char(cp: int) -> str:
    if cp in _SHORT_ESCAPES:
        return "\\\\" + ("\\\\" if cp == 0x5C else _SHORT_ESCAPES[cp])
    if cp < 0x20:
        return "\\\\u00" + "".join(_hex_digit(d) for d in f"{cp:02x}")
    return regex_char(cp)


def _hex_digit(d: str) -> str:
    return f"[{d}{d.upper()}]" if d.isalpha() else d


def regex_char(cp: int) -> str:
    """One literal code point as a regex atom (outside a class)."""
    c = chr(cp)
    if c in _REGEX_META:
        return "\\" + c
    if 0x20 <= cp < 0x7F:
        return c
    return _class_endpoint(cp)


def _class_endpoint(cp: int) -> str:
    c = chr(cp)
    if c.isascii() and c.isalnum():
        return c
    return f"\\u{cp:04X}" if cp <= 0xFFFF else f"\\U{cp:08X}"


def char_set_regex(ranges: list[tuple[int, int]]) -> str | None:
    """Regex for one JSON-escaped character whose decoded value lies in `ranges` (None: empty)."""
    ranges = subtract(normalize(ranges), [(0xD800, 0xDFFF)])
    must_escape = normalize([(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)])
    literal = subtract(ranges, must_escape)
    escaped = subtract(ranges, literal)
    parts = []
    if literal:
        if len(literal) == 1 and literal[0][0] == literal[0][1]:
            parts.append(regex_char(literal[0][0]))
        else:
            body = "".join(
                _class_endpoint(lo) if lo == hi else f"{_class_endpoint(lo)}-{_class_endpoint(hi)}"
                for lo, hi in literal
            )
            parts.append(f"[{body}]")
    for lo, hi in escaped:
        parts.extend(_escape_char(cp) for cp in range(lo, hi + 1))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"
