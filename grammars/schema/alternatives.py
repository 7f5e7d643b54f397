"""Object keywords rewritten as alternatives (anyOf) of keywords the converter already enforces.

`alternative_parts(schema, ptr)` gives the allOf parts that replace, in one schema node:
`dependentRequired` / array-valued `dependencies` (each trigger name: absent, or present with
the names it requires), `dependentSchemas` / schema-valued `dependencies` (absent, or present
and the schema holds) and `not: {required: [...]}` (an object with some listed name absent).
"Absent" is `properties: {name: false}`. Each trigger doubles the branches the object regex is
written for, so past MAX_TRIGGERS the node is left as it is (the keywords stay relaxed). It
builds no regex and does not look inside the dependent schemas.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from surecall.grammars.schema.keywords import is_undefined

MAX_TRIGGERS = 3  # 2^3 branches of one object at most
_ANNOTATIONS = {"title", "description", "$comment", "examples", "default"}


@dataclass
class Alternatives:
    """The keywords replaced, and the allOf parts (subschema, JSON pointer it stands for) replacing them."""

    keys: tuple[str, ...]
    parts: list[tuple[object, str]]


def alternative_parts(schema: dict, ptr: str, mark: Callable[[object, str], object]) -> Alternatives | None:
    """The rewrite of `schema`'s dependency keywords and `not: {required}` (None: none, or too many).

    `mark(sub, pointer)` tags a dependent schema with the pointer it was written at."""
    keys, parts = [], []
    for key in ("dependentRequired", "dependencies", "dependentSchemas"):
        if isinstance(schema.get(key), dict) and schema[key]:
            keys.append(key)
            for name, need in schema[key].items():
                at = _join(ptr, key, name)
                parts.append((_dependency(name, need if isinstance(need, list) else mark(need, at)), at))
    names = _not_required(schema.get("not"))
    if names:
        keys.append("not")
        absent = [{"properties": {n: False}} for n in names]
        parts.append(({"type": "object", "anyOf": absent} if len(absent) > 1 else {"type": "object", **absent[0]},
                      _join(ptr, "not")))
    if not parts or len(parts) > MAX_TRIGGERS:
        return None
    return Alternatives(tuple(keys), parts)


def _dependency(name: str, need: object) -> dict:
    """`name` absent, or present with `need` (a list of required names, or a schema)."""
    absent = {"properties": {name: False}}
    if isinstance(need, list):
        return {"anyOf": [absent, {"required": [name, *need]}]}
    return {"anyOf": [absent, {"allOf": [{"required": [name]}, need]}]}


def _not_required(sub: object) -> list[str] | None:
    """The names of a `not` whose only assertion is `required` (None otherwise)."""
    if not isinstance(sub, dict) or not isinstance(sub.get("required"), list) or not sub["required"]:
        return None
    if any(k not in _ANNOTATIONS and k != "required" and not is_undefined(k) for k in sub):
        return None
    return list(dict.fromkeys(sub["required"]))


def _join(ptr: str, *parts: object) -> str:
    return ptr + "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)
