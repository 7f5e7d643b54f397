"""`if/then/else`, `not` and overlapping `oneOf` rewritten as keywords the converter enforces.

`negation(sub, resolve)` writes the complement of a schema built from type, const/enum,
required, properties, not, anyOf/allOf, oneOf (none holds, or two do), if/then/else (the
condition and then's complement, or its complement and else's), $ref, integral bounds (min/max, lengths, item and
property counts), items (one schema: some item fails it, a `contains`), contains (every item
fails it), dependencies (a trigger present and a key absent or its schema failed), multipleOf
and pattern (as a `not` the number or string algebra writes) and, as an object-level `not`
that schema/object_exists.py writes, patternProperties, additionalProperties and propertyNames,
exactly: De Morgan over the keywords, "absent" as `properties: {name: false}`, a const/enum
as NOT_IN (the converter excludes those values per type). `conditional_parts` gives
the allOf parts that replace, in one node, `if` (anyOf[if and then, not-if and else]), `not`
and a oneOf whose branches overlap (each branch and the negation of every other one). Anything
else raises NotNegatable with the reason, and the keyword stays relaxed. It builds no regex
beyond the number pieces of NOT_IN (fractions, integer gaps).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

from surecall.grammars.schema.alternatives import Alternatives
from surecall.grammars.schema.keywords import is_undefined
from surecall.grammars.schema.ranges import integer_range_regex
from surecall.grammars.schema.string_formats import EXACT_FORMATS, FORMAT_NAMES

# Internal keyword: the instance equals none of these JSON values (the `not` of a const/enum).
NOT_IN = "$surecall:not_in"
NOT_IN_AT = "$surecall:not_in_at"  # beside NOT_IN: (pointer, keyword) to list if it cannot be enforced
KEPT_AT = "$surecall:kept_at"  # beside a `not` a negation wrote: the same, for that `not`
# A number that is not an integer, even once read as a double: at most 7 integer and 8 fraction
# digits, the last one non-zero (15 significant digits survive the round trip, so the double is
# not integral either: 5265126542732811.76 reads as an integer). Stricter than "not an
# integer": 1.5e1, 0.123456789 and 1.50 are left out.
FRACTION = r"-?(?:0|[1-9][0-9]{0,6})\.[0-9]{0,7}[1-9]"
MAX_EXCLUSIVE_BRANCHES = 6  # a oneOf of n branches writes n * (n - 1) negations
MAX_EXCLUSIVE_PRODUCT = 16  # ... and one branch crosses the disjuncts of the others' negations
MAX_IF_BRANCHES = 64  # branches the if/then/else parts of one allOf cross into; past it they stay relaxed
MAX_NEGATION_CHARS = 20_000  # a negation written out (JSON) past this stays relaxed
MAX_NEGATED_ONE_OF = 6  # a negated oneOf of n branches: none holds, or one of n * (n - 1) / 2 pairs does
# Object keywords whose complement is an existence ("some key it rules has a value it rejects"):
# negated as an object-level `not` kept for object_exists.py, which writes it within its caps.
EXISTS_KEYS = ("patternProperties", "additionalProperties", "propertyNames")
_MAX_DEPTH = 16
_TYPES = ("object", "array", "string", "number", "boolean", "null")
_IGNORED = {"title", "description", "$comment", "comment", "examples", "default", "$schema", "$id", "id",
            "definitions", "$defs", "deprecated", "readOnly", "writeOnly", "then", "else",
            "markdownDescription", "$surecall:at", "$surecall:from", KEPT_AT}
_BOUNDS = {  # keyword -> (type, keyword of the complement, offset of the complement's bound)
    "minLength": ("string", "maxLength", -1), "maxLength": ("string", "minLength", 1),
    "minItems": ("array", "maxItems", -1), "maxItems": ("array", "minItems", 1),
    "minimum": ("number", "exclusiveMaximum", 0), "maximum": ("number", "exclusiveMinimum", 0),
    "exclusiveMinimum": ("number", "maximum", 0), "exclusiveMaximum": ("number", "minimum", 0),
    "minProperties": ("object", "maxProperties", -1), "maxProperties": ("object", "minProperties", 1),
}


class NotNegatable(Exception):
    """The schema has a keyword whose complement is not written here (the message says which)."""


Resolve = Callable[[str], object]  # a $ref -> its target (marked with its pointer)
Mark = Callable[[object, str], object]  # (subschema, pointer it was written at) -> marked subschema


def negation(sub: object, resolve: Resolve, depth: int = 0) -> object:
    """A schema matched by exactly the instances `sub` rejects (False: none; True: all)."""
    if sub is True or sub is False:
        return not sub
    if not isinstance(sub, dict):
        raise NotNegatable(f"expected a schema, got {type(sub).__name__}")
    if depth > _MAX_DEPTH:
        raise NotNegatable("references nest too deeply to negate")
    if "$ref" in sub:  # siblings hold beside the target (as the converter reads them)
        rest = {k: v for k, v in sub.items() if k != "$ref"}
        return negation({"allOf": [resolve(sub["$ref"]), rest]}, resolve, depth + 1)
    disjuncts: list = []
    for key, value in sub.items():
        if key not in _IGNORED and not is_undefined(key):
            disjuncts += _keyword_negation(sub, key, value, resolve, depth)
    disjuncts = [d for d in disjuncts if d is not False]
    if any(d is True for d in disjuncts):
        return True
    out = False if not disjuncts else disjuncts[0] if len(disjuncts) == 1 else {"anyOf": disjuncts}
    if len(json.dumps(out, default=str)) > MAX_NEGATION_CHARS:
        raise NotNegatable(f"the negation grows past {MAX_NEGATION_CHARS} characters")
    return out


def _keyword_negation(sub: dict, key: str, value: object, resolve: Resolve, depth: int) -> list:
    """The schemas whose union is the instances failing keyword `key` of `sub` (one disjunct each)."""
    if key == "type":
        return [type_complement([value] if isinstance(value, str) else list(value))]
    if key == "format" and value not in FORMAT_NAMES:  # a format no draft defines is an annotation: nothing fails it
        return []
    if key == "format" and value in EXACT_FORMATS:  # the strings its regex rejects, for the string algebra
        return [{"type": "string", "not": {"format": value}}]
    if key in ("const", "enum"):
        values = [value] if key == "const" else list(value)
        if any(isinstance(v, (dict, list)) for v in values):
            raise NotNegatable("excluding an object or array literal is not written")
        return [{NOT_IN: values}]
    if key == "required":
        return [{"type": "object", "properties": {name: False}} for name in dict.fromkeys(value)]
    if key == "properties":
        negated = {name: negation(s, resolve, depth + 1) for name, s in value.items()}
        return [{"type": "object", "required": [name], "properties": {name: n}}
                for name, n in negated.items() if n is not False]
    if key == "not":
        return [value]
    if key == "anyOf":
        return [{"allOf": [negation(s, resolve, depth + 1) for s in value]}]
    if key == "oneOf" and isinstance(value, list):  # none of the branches holds, or two of them do
        if len(value) > MAX_NEGATED_ONE_OF:
            raise NotNegatable(f"the complement of a oneOf of {len(value)} branches (past {MAX_NEGATED_ONE_OF}) "
                               "is not written")
        none = [negation(s, resolve, depth + 1) for s in value]
        return ([] if False in none else [{"allOf": none}]) + [
            {"allOf": [value[i], value[j]]} for i in range(len(value)) for j in range(i + 1, len(value))]
    if key == "if":  # the condition holds and `then` fails, or it fails and `else` does
        out = []
        then, otherwise = negation(sub.get("then", True), resolve, depth + 1), negation(sub.get("else", True),
                                                                                         resolve, depth + 1)
        if then is not False:
            out.append({"allOf": [value, then]})
        if otherwise is not False:
            out.append({"allOf": [negation(value, resolve, depth + 1), otherwise]})
        return out
    if key == "allOf":
        return [negation(s, resolve, depth + 1) for s in value]
    if key in _BOUNDS:
        return _bound_negation(sub, key, value)
    if key == "items" and isinstance(value, (dict, bool)) and "prefixItems" not in sub:
        negated = negation(value, resolve, depth + 1)  # some item fails the item schema
        if holds_key(negated, "contains", resolve):  # Handwritten oneofanyofitc7: 25 s to pass the state cap
            raise NotNegatable("the complement of 'items' would nest a contains inside a contains (their automata "
                               "multiply)")
        return [] if negated is False else [{"type": "array", "contains": negated}]
    if key == "contains" and not any(k in sub for k in ("minContains", "maxContains")):
        return [{"type": "array", "items": negation(value, resolve, depth + 1)}]  # no item meets it
    if key in ("dependencies", "dependentRequired", "dependentSchemas") and isinstance(value, dict):
        return _dependency_negation(value, resolve, depth)
    if key in EXISTS_KEYS:
        return [_kept_not(sub, key, value, resolve)]
    if key == "multipleOf":  # the numbers that are not multiples, for the number algebra (regular.py)
        return [{"type": "number", "not": {"multipleOf": value}}]
    if key == "pattern":  # the strings it does not find, for the string algebra (regular.py)
        return [{"type": "string", "not": {"pattern": value}}]
    raise NotNegatable(f"the complement of {key!r} is not written (a finite automaton could, this converter does not)")


def holds_key(sub: object, keyword: str, resolve: Resolve | None = None, seen: set | None = None) -> bool:
    """Whether `keyword` is a key anywhere in `sub` (a JSON value), through its `$ref`s with `resolve`
    (an unresolvable one counts as holding it)."""
    if isinstance(sub, list):
        return any(holds_key(v, keyword, resolve, seen) for v in sub)
    if not isinstance(sub, dict):
        return False
    if keyword in sub:
        return True
    if resolve is not None and isinstance(sub.get("$ref"), str):
        seen = set() if seen is None else seen
        if sub["$ref"] not in seen:
            seen.add(sub["$ref"])
            try:
                if holds_key(resolve(sub["$ref"]), keyword, resolve, seen):
                    return True
            except Exception:  # noqa: BLE001 - an unresolvable $ref: the converter reports it
                return True
    return any(holds_key(v, keyword, resolve, seen) for v in sub.values())


def _kept_not(sub: dict, key: str, value: object, resolve: Resolve) -> dict:
    """Objects failing `key` (EXISTS_KEYS): some key it rules has a value it rejects, an existence
    written as an object-level `not` that object_exists.py writes (conditional_parts keeps it).
    additionalProperties takes the names and patterns beside it, their values left free."""
    if key != "propertyNames" and holds_key(value, "not", resolve):  # Handwritten oneofpr1/2: 18 s to pass the state cap
        raise NotNegatable(f"the complement of {key!r} would nest a not in the values of an object-level not (their "
                           "automata multiply)")
    if key != "additionalProperties":
        return {"type": "object", "not": {key: value}}
    inner: dict = {}
    for names in ("properties", "patternProperties"):
        if names in sub:
            if not isinstance(sub[names], dict):
                raise NotNegatable(f"{names} is not an object")
            inner[names] = {name: True for name in sub[names]}
    return {"type": "object", "not": {**inner, "additionalProperties": value}}


def is_kept_not(sub: object) -> bool:
    """A `not` value negation() gives back as a `not`: object keywords with an EXISTS_KEYS one (left
    to object_exists.py), a lone multipleOf, pattern or exact format (left to the number or string algebra,
    schema/regular.py), or an anyOf of those (an allOf's two kept nots merged)."""
    if not isinstance(sub, dict):
        return False
    annotation = [k for k in sub if k in _IGNORED or is_undefined(k)]
    if set(sub) - set(annotation) in ({"multipleOf"}, {"pattern"}):
        return True
    if set(sub) - set(annotation) == {"format"} and sub["format"] in EXACT_FORMATS:
        return True
    if set(sub) - set(annotation) == {"anyOf"} and isinstance(sub["anyOf"], list):  # two merged (to_regex.merge_keyword)
        return all(is_kept_not(branch) for branch in sub["anyOf"])
    return any(k in sub for k in EXISTS_KEYS) and all(k in EXISTS_KEYS or k == "properties" or k in annotation for k in sub)


def _dependency_negation(value: dict, resolve: Resolve, depth: int) -> list:
    """Objects failing one dependency: its trigger present and a named key absent, or (a schema
    dependency) the trigger present and the schema failed."""
    out: list = []
    for name, dep in value.items():
        if isinstance(dep, list):
            out += [{"type": "object", "required": [name], "properties": {other: False}}
                    for other in dict.fromkeys(dep) if other != name]
        else:
            negated = negation(dep, resolve, depth + 1)
            if negated is not False:
                out.append({"type": "object", "allOf": [{"required": [name]}, negated]})
    return out


def type_complement(types: list[str]) -> dict | bool:
    """The values of none of `types` ("integer" left out of "number": non-integral numbers)."""
    rest = [t for t in _TYPES if t not in types]
    if "integer" in types and "number" not in types:
        return {"type": rest, "not": {"type": "integer"}}
    return {"type": rest} if rest else False


def _bound_negation(sub: dict, key: str, value: object) -> list:
    kind, other, offset = _BOUNDS[key]
    if kind == "number" and any(isinstance(sub.get(k), bool) for k in ("exclusiveMinimum", "exclusiveMaximum")):
        raise NotNegatable("draft-4 boolean exclusive bounds are not negated")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer():
        raise NotNegatable(f"a non-integral {key!r} is not negated (the converter relaxes it)")
    bound = int(value) + offset
    if bound < 0 and kind != "number":
        return []  # minLength 0: nothing fails it
    return [{"type": kind, other: bound}]


def conditional_parts(schema: dict, ptr: str, mark: Mark, resolve: Resolve,
                      disjoint: Callable[[list], bool]) -> Alternatives | None:
    """The rewrite of `schema`'s `if`, `not` and overlapping `oneOf` (None: none applies)."""
    keys, parts = [], []
    if "if" in schema and _negated(schema["if"], resolve) is not None:
        keys += [k for k in ("if", "then", "else") if k in schema]
        parts.append((if_then_else(schema, ptr, mark, resolve), ptr))
    if "not" in schema and not is_type_only(schema["not"]) and not is_kept_not(schema["not"]):
        # (`not: {type}` the converter reads itself; a kept `not` is object_exists.py's or regular.py's)
        negated = _negated(schema["not"], resolve)
        if negated is not None:
            keys.append("not")
            parts.append((mark(tagged(negated, ptr, "not"), _join(ptr, "not")), ptr))
    if isinstance(schema.get("oneOf"), list) and len(schema["oneOf"]) > 1 and not disjoint(schema["oneOf"]):
        branches = exclusive_branches(schema["oneOf"], ptr, mark, resolve)
        if branches is not None:
            keys.append("oneOf")
            parts.append(({"anyOf": branches}, ptr))
    return Alternatives(tuple(keys), parts) if parts else None


def if_then_else(schema: dict, ptr: str, mark: Mark, resolve: Resolve) -> dict:
    """anyOf[if and then, not-if and else] (a missing then/else holds for every value)."""
    cond = mark(schema["if"], _join(ptr, "if"))
    then = mark(schema.get("then", True), _join(ptr, "then"))
    other = mark(schema.get("else", True), _join(ptr, "else"))
    opposite = mark(tagged(negation(schema["if"], resolve), ptr, "if"), _join(ptr, "if"))
    return {"anyOf": [{"allOf": [cond, then]}, {"allOf": [opposite, other]}]}


def exclusive_branches(branches: list, ptr: str, mark: Mark, resolve: Resolve) -> list | None:
    """oneOf as anyOf: branch i and the negation of every other branch (None: some branch has
    no negation here, or there are past MAX_EXCLUSIVE_BRANCHES: one_of_reason says which)."""
    negated, _ = _branch_negations(branches, resolve)
    if negated is None:
        return None
    return [{"allOf": [mark(b, _join(ptr, "oneOf", i)),
                       *(mark(tagged(n, ptr, "oneOf"), _join(ptr, "oneOf", j)) for j, n in enumerate(negated) if j != i)]}
            for i, b in enumerate(branches)]


def one_of_reason(branches: list, resolve: Resolve) -> str | None:
    """Why exclusive_branches does not write an overlapping oneOf (None: it would)."""
    return _branch_negations(branches, resolve)[1]


def _branch_negations(branches: list, resolve: Resolve) -> tuple[list | None, str | None]:
    """(each branch's negation, None), or (None, why exclusive_branches cannot write the oneOf)."""
    if len(branches) > MAX_EXCLUSIVE_BRANCHES:
        return None, (f"{len(branches)} overlapping branches are past the {MAX_EXCLUSIVE_BRANCHES} written exactly "
                      "(each beside the negation of every other)")
    negated = []
    for i, branch in enumerate(branches):
        try:
            negated.append(negation(branch, resolve))
        except NotNegatable as exc:
            return None, f"branch {i} is not negated to keep the others out: {exc}"
    product = math.prod(_num_disjuncts(n) for n in negated)
    if product > MAX_EXCLUSIVE_PRODUCT:
        return None, f"the branches' negations cross into {product} branches (past {MAX_EXCLUSIVE_PRODUCT} written exactly)"
    return negated, None


def if_branches(parts: list, resolve: Resolve) -> int:
    """How many branches the rewritten if/then/else parts of one allOf cross into (each: its
    `then`, or one per disjunct of the negated `if`)."""
    total = 1
    for sub in parts:
        if isinstance(sub, dict) and "if" in sub:
            negated = _negated(sub["if"], resolve)
            total *= 1 if negated is None else 1 + _num_disjuncts(negated)
    return total


def tagged(sub: object, ptr: str, keyword: str) -> object:
    """`sub` with NOT_IN_AT = (ptr, keyword) beside each NOT_IN it holds and KEPT_AT beside each
    `not` (a kept one, or a type's complement beside bounds: inner tags kept): what the converter
    cannot enforce there it lists as `keyword` at `ptr`, the keyword the negation was written for."""
    if isinstance(sub, list):
        return [tagged(s, ptr, keyword) for s in sub]
    if not isinstance(sub, dict):
        return sub
    out = {k: tagged(v, ptr, keyword) if k != NOT_IN else v for k, v in sub.items()}
    if NOT_IN in out:
        out.setdefault(NOT_IN_AT, [ptr, keyword])
    if "not" in out:
        out.setdefault(KEPT_AT, [ptr, keyword])
    return out


def _num_disjuncts(sub: object) -> int:
    """How many branches `sub` crosses into once its anyOfs (nested in allOfs too) are merged."""
    if not isinstance(sub, dict):
        return 1
    count = sum(_num_disjuncts(d) for d in sub["anyOf"]) if isinstance(sub.get("anyOf"), list) else 1
    return count * math.prod(_num_disjuncts(p) for p in sub.get("allOf", []) if isinstance(sub.get("allOf"), list))


def relaxed_reason(schema: dict, key: str, resolve: Resolve) -> str | None:
    """Why `schema`'s `not`/`if` is left relaxed (None: no specific reason known)."""
    if key not in ("not", "if") or key not in schema:
        return None
    if key == "not" and is_kept_not(schema["not"]):
        kept = schema["not"]
        if any(holds_key(kept, k) for k in EXISTS_KEYS):
            return ("negation is not enforced: an object-level not (some key holding a value it rejects) is written "
                    "only within object_exists.py's caps")
        what, algebra = ("multipleOf", "number") if holds_key(kept, "multipleOf") else ("pattern", "string")
        return (f"negation is not enforced: a not of {what} is written only by the {algebra} algebra "
                f"(schema/regular.py), which did not take this {algebra} schema (keywords beside it that it "
                "does not read, or past its caps)")
    try:
        negation(schema[key], resolve)
    except NotNegatable as exc:
        return f"{'negation' if key == 'not' else 'the else branch'} is not enforced: {exc}"
    return None


def is_type_only(sub: object) -> bool:
    return isinstance(sub, dict) and "type" in sub and all(k == "type" or k in _IGNORED or is_undefined(k) for k in sub)


def _negated(sub: object, resolve: Resolve) -> object | None:
    try:
        return negation(sub, resolve)
    except NotNegatable:
        return None


def integer_gaps(low: int, high: int, excluded: list[int]) -> str | None:
    """Regex for the integers low..high other than `excluded` (None: there are none)."""
    pieces, start = [], low
    for value in sorted({v for v in excluded if low <= v <= high}):
        if start <= value - 1:
            pieces.append(integer_range_regex(start, value - 1))
        start = value + 1
    if start <= high:
        pieces.append(integer_range_regex(start, high))
    pieces = [p for p in pieces if p is not None]
    if not pieces:
        return None
    return pieces[0] if len(pieces) == 1 else "|".join(f"(?:{p})" for p in pieces)


def kind_of(value: object) -> str:
    """The JSON type of a Python value from json.loads ("integer" for integral numbers)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "integer" if float(value).is_integer() else "number"
    return {str: "string", list: "array", dict: "object"}[type(value)]


def _join(ptr: str, *parts: object) -> str:
    return ptr + "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)
