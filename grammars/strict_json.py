"""Strict JSON for model output: I-JSON (RFC 7493) on top of the standard `json` parser.

`loads_strict(text, max_depth=...)` refuses what `json.loads` silently accepts: duplicate object
names at any level (json.loads keeps the last one, so `{"name": "a", "name": "b"}` would name
tool b), `NaN`/`Infinity`, and nesting deeper than `max_depth`. Depth is measured by one
iterative scan before the (recursive) C parser runs, so 100k nested `[` costs one linear pass,
never a RecursionError. It does not check lone surrogates (dispatch validation does).
"""

from __future__ import annotations

import json
import re
from typing import Any

from surecall.errors import MalformedCall

MAX_JSON_DEPTH = 128  # arguments may nest 64 levels (dispatch.validate.MAX_DEPTH); the envelope adds a few
_STRUCTURE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')  # a whole string literal, or a bracket


def check_depth(text: str, max_depth: int = MAX_JSON_DEPTH) -> None:
    """MalformedCall if brackets outside string literals nest deeper than `max_depth`."""
    depth = 0
    for match in _STRUCTURE.finditer(text):
        char = match.group()
        if char in "[{":
            depth += 1
            if depth > max_depth:
                raise MalformedCall(f"JSON nested deeper than {max_depth} levels (at char {match.start()})")
        elif char in "]}":
            depth -= 1


def _unique_names(pairs: list[tuple[str, Any]]) -> dict:
    seen: dict[str, Any] = {}
    for name, value in pairs:
        if name in seen:
            raise MalformedCall(f"duplicate object name {name!r}: I-JSON (RFC 7493) forbids duplicate names")
        seen[name] = value
    return seen


def _no_constant(name: str) -> Any:
    raise MalformedCall(f"{name} is not JSON: I-JSON (RFC 7493) numbers are finite")


def loads_strict(text: str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The JSON value of `text` under I-JSON rules; MalformedCall (with the position) otherwise."""
    check_depth(text, max_depth)
    try:
        return json.loads(text, object_pairs_hook=_unique_names, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise MalformedCall(f"not valid JSON: {exc.msg} at char {exc.pos}") from None
    except RecursionError:  # unreachable past check_depth; kept so a bad bound cannot crash a caller
        raise MalformedCall(f"JSON nested too deeply for the parser (bound {max_depth})") from None
