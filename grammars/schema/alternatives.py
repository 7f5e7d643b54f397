"""Object keywords rewritten as alternatives (anyOf) of keywords the converter already enforces.

`alternative_parts(schema, ptr)` gives the allOf parts that replace, in one schema node:
`dependentRequired` / array-valued `dependencies` (each trigger name: absent, or present with
the names it requires), `dependentSchemas` / schema-valued `dependencies` (absent, or present
and the schema holds) and `not: {required: [...]}` (an object with some listed name absent).
"Absent" is `properties: {name: false}`. A trigger the node requires is present in every
instance: its names are required (its schema holds) with no branch, and a dependency whose names
are all required already adds nothing. Triggers that ask for the same names share one branch pair
(all absent, or the names present). Each other trigger doubles the branches the object regex is
written for, so past MAX_TRIGGERS of them the node is left as it is (the keywords stay relaxed). It
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
    keys, parts, fixed = [], [], []
    required = set(schema["required"]) if isinstance(schema.get("required"), list) else set()
    groups: dict[tuple, tuple[list, list]] = {}  # sorted names asked for -> (those names, the triggers asking)
    for key in ("dependentRequired", "dependencies", "dependentSchemas"):
        if isinstance(schema.get(key), dict) and schema[key]:
            keys.append(key)
            for name, need in schema[key].items():
                at = _join(ptr, key, name)
                if isinstance(need, list):
                    need = [n for n in dict.fromkeys(need) if n not in required and n != name]
                    if not need:  # every name it asks for is required already: nothing to add
                        continue
                    if name in required:  # the trigger is always there: its names are required too
                        fixed.append(({"required": need}, at))
                        continue
                    group = tuple(sorted(need))
                    if group not in groups:  # a later trigger of the same names joins this one's branches
                        parts.append((group, at))
                    groups.setdefault(group, (need, []))[1].append(name)
                elif need is True:
                    continue
                elif name in required:  # present in every instance: the dependent schema holds, no branch
                    fixed.append((mark(need, at), at))
                else:
                    parts.append((_dependency(name, mark(need, at)), at))
    parts = [(_triggers(*groups[part]) if isinstance(part, tuple) else part, at) for part, at in parts]
    names = _not_required(schema.get("not"))
    if names:
        keys.append("not")
        absent = [{"properties": {n: False}} for n in names]
        parts.append(({"type": "object", "anyOf": absent} if len(absent) > 1 else {"type": "object", **absent[0]},
                      _join(ptr, "not")))
    if not keys or len(parts) > MAX_TRIGGERS:  # (keys with nothing to add: every dependency already holds)
        return None
    return Alternatives(tuple(keys), fixed + parts)


def _triggers(need: list[str], names: list[str]) -> dict:
    """Triggers `names` that ask for the same names `need`: one trigger as _dependency writes it;
    several as every trigger absent, or the names present (2 branches where one each would make 2^k)."""
    if len(names) == 1:
        return _dependency(names[0], need)
    return {"anyOf": [{"properties": dict.fromkeys(names, False)}, {"required": need}]}


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
