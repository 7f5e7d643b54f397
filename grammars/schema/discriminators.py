"""allOf parts `{if: {properties: {k: {const|enum}}, required?: [k]}, then, else}` on one key, as one union.

`discriminator_groups(parts, ptr, mark)` finds, among an allOf's parts, two or more whose `if`
tests only the value of one property k (a const or an enum of scalars, `required: [k]` or
not) and writes them as one anyOf over k's cases: k equal to each value named (every part's
then or else by whether it names the value), k present and none of them, k absent (the `if`
without `required` holds vacuously: its then applies), and a non-object value (every `if`
holds: every then applies). So n parts cross into n + 3 branches instead of 2^n. A group whose
then/else holds a `$ref` is left as it is (declined, with the reason): every branch repeats the
thens, and JsonSchemaStore's (minecraft-predicate) reach recursive discriminators whose exact
tables run past the splice budget. It converts nothing; other `if`s are left to conditionals.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from surecall.grammars.schema.conditionals import (
    KEPT_AT,
    NOT_IN,
    _join,
    holds_key,
    kind_of,
    tagged,
    type_complement,
)
from surecall.grammars.schema.keywords import is_undefined
from surecall.grammars.schema.unique_items import canonical_json

Mark = Callable[[object, str], object]
_AT = "$surecall:at"
_FROM = "$surecall:from"
_IGNORED = {"title", "description", "$comment", "comment", "markdownDescription", _AT, _FROM, KEPT_AT}


@dataclass(frozen=True)
class Case:
    """One allOf part on discriminator `key`: its values, whether the `if` requires the key, its branches."""

    index: int
    ptr: str
    key: str
    values: tuple
    required: bool
    then: object
    other: object


def discriminator_groups(parts: list, ptr: str, mark: Mark) -> tuple[list, dict[int, str]]:
    """`parts` with every group of two or more discriminator parts on one key replaced by its union
    (at the place of the group's first part); the other parts as they are. Also: index -> why
    the part's group was declined."""
    cases = [_case(sub, _part_ptr(sub, ptr, i), i) for i, sub in enumerate(parts)]
    by_key: dict[str, list[Case]] = {}
    for case in cases:
        if case is not None:
            by_key.setdefault(case.key, []).append(case)
    groups, declined = {}, {}
    for key, group in by_key.items():
        if len(group) < 2:
            continue
        if any(holds_key(c.then, "$ref") or holds_key(c.other, "$ref") for c in group):
            declined.update({c.index: f"its then/else on {key!r} hold a $ref (not written as a discriminator union)"
                             for c in group})
        else:
            groups[group[0].index] = group
    grouped = {case.index for group in groups.values() for case in group}
    out, why_at = [], {}
    for i, sub in enumerate(parts):
        if i in groups:
            out.append(mark(discriminated_union(groups[i], mark), groups[i][0].ptr))
        elif i not in grouped:
            if i in declined:
                why_at[len(out)] = declined[i]
            out.append(sub)
    return out, why_at


def discriminated_union(group: list[Case], mark: Mark) -> dict:
    """anyOf over the cases of the group's key (see the module docstring); each then/else marked
    with its own pointer, each condition with its `if`'s."""
    key, where = group[0].key, _join(group[0].ptr, "if")
    values: list = []
    for case in group:
        values += [v for v in case.values if not any(same_value(v, w) for w in values)]

    def branch(condition: dict, holds: Callable[[Case], bool]) -> dict:
        chosen = [mark(c.then, _join(c.ptr, "then")) if holds(c) else mark(c.other, _join(c.ptr, "else"))
                  for c in group]
        return {"allOf": [mark(condition, where), *(s for s in chosen if s is not True)]}

    branches = [branch({"type": "object", "required": [key], "properties": {key: {"const": v}}},
                       lambda c, v=v: any(same_value(v, w) for w in c.values)) for v in values]
    others = tagged({NOT_IN: values}, group[0].ptr, "if")
    branches.append(branch({"type": "object", "required": [key], "properties": {key: others}}, lambda c: False))
    branches.append(branch({"type": "object", "properties": {key: False}}, lambda c: not c.required))
    non_object = type_complement(["object"])
    branches.append(branch(non_object, lambda c: True))
    return {"anyOf": branches}


def same_value(a: object, b: object) -> bool:
    """JSON equality of two scalars as the validator reads it (1 == 1.0; true != 1)."""
    return canonical_json(a) == canonical_json(b)


def _case(sub: object, ptr: str, index: int) -> Case | None:
    """The part as a Case, or None when its `if` is not a test of one property's value."""
    if not isinstance(sub, dict) or "if" not in sub or any(
            k not in ("if", "then", "else") and k not in _IGNORED and not is_undefined(k) for k in sub):
        return None
    cond = sub["if"]
    if not isinstance(cond, dict) or any(k not in ("properties", "required") and k not in _IGNORED and not is_undefined(k) for k in cond):
        return None
    props = cond.get("properties")
    if not isinstance(props, dict) or len(props) != 1:
        return None
    (key, prop), = props.items()
    required = cond.get("required", [])
    if not isinstance(required, list) or any(name != key for name in required):
        return None
    values = _values(prop)
    if values is None:
        return None
    return Case(index, ptr, key, values, bool(required), sub.get("then", True), sub.get("else", True))


def _values(prop: object) -> tuple | None:
    """The scalars a `{const}`/`{enum}` (with a `type` beside it, or not) admits; None otherwise."""
    if not isinstance(prop, dict) or ("const" in prop) == ("enum" in prop):
        return None
    if any(k not in ("const", "enum", "type") and k not in _IGNORED and not is_undefined(k) for k in prop):
        return None
    values = [prop["const"]] if "const" in prop else prop["enum"]
    if not isinstance(values, list) or any(isinstance(v, (dict, list)) for v in values):
        return None
    types = prop.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else types
        if not isinstance(types, list):
            return None
        values = [v for v in values if kind_of(v) in types or (kind_of(v) == "integer" and "number" in types)]
    return tuple(values)


def _part_ptr(sub: object, ptr: str, index: int) -> str:
    return sub.get(_AT, _join(ptr, "allOf", index)) if isinstance(sub, dict) else _join(ptr, "allOf", index)
