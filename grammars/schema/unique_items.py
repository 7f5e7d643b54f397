"""`uniqueItems` over a small finite item set, as the regex of every ordered selection.

When an array's items can only be one of at most MAX_DISTINCT JSON values (`enum`/`const`,
`type: boolean`, `type: null`), the arrays with distinct items are finitely many: each
ordered selection of 0..n of them (at most 64 for n = 4), and the regex lists them within
min/maxItems. Larger or open item sets stay relaxed (a finite automaton would have to remember
which items it has written). It does not build the item literals' regexes (the caller passes
a function for that).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from itertools import permutations

import jsonschema_rs

MAX_DISTINCT = 4
_LITERAL_KEYS = {"enum", "const", "type", "title", "description", "$comment", "default", "examples"}


def finite_items(items: object) -> list | None:
    """The distinct values an item schema allows, when it is a small literal set (None otherwise)."""
    if not isinstance(items, dict) or any(k not in _LITERAL_KEYS for k in items):
        return None
    if "enum" in items or "const" in items:
        values = list(items["enum"]) if "enum" in items else [items["const"]]
    else:
        kind = items.get("type")
        values = {"boolean": [True, False], "null": [None]}.get(kind) if isinstance(kind, str) else None
        if values is None:
            return None
    try:
        is_valid = jsonschema_rs.validator_for(items).is_valid
    except Exception:  # noqa: BLE001 - a schema the validator cannot load: not a literal set here
        return None
    distinct: dict[str, object] = {}
    for value in values:
        if is_valid(value):
            distinct.setdefault(canonical_json(value), value)
    return list(distinct.values()) if len(distinct) <= MAX_DISTINCT else None


def selections_regex(values: list, low: int, high: int | None, literal: Callable[[object], str], ws: str) -> str | None:
    """`[...]` holding each ordered selection of distinct `values` of low..high items (None: none)."""
    top = len(values) if high is None else min(high, len(values))
    arrays = []
    for count in range(low, top + 1):
        for chosen in permutations(values, count):
            body = f"{ws},{ws}".join(f"(?:{literal(v)})" for v in chosen)
            arrays.append(f"\\[{ws}{body}{ws}\\]" if chosen else f"\\[{ws}\\]")
    return "|".join(f"(?:{a})" for a in arrays) if arrays else None


def canonical_json(value: object) -> str:
    """A text equal for JSON-equal values, as JSON Schema compares them (uniqueItems, enum, const):
    key order ignored, 1 == 1.0."""
    def by_value(v: object) -> object:
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if isinstance(v, dict):
            return {k: by_value(x) for k, x in v.items()}
        return [by_value(x) for x in v] if isinstance(v, list) else v

    return json.dumps(by_value(value), sort_keys=True)
