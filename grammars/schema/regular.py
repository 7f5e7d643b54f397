"""String and number schemas as one regular language: patterns, lengths, literals, multipleOf
under not/allOf/anyOf/oneOf/if.

`string_body(schema, resolve)` reads a schema that admits only strings, built from `pattern`
(search semantics), min/maxLength, const/enum, type and the combinators (and $ref). Each leaf
becomes a DFA over classes of code points (a Thompson NFA from pattern.py's parser, then a
subset construction); they combine by product and complement, are minimised, and the JSON
string body regex comes out by state elimination (multiple_of.eliminate). Each character set is
kept as what both Python `re` and ECMA-262 put in it (lower) and what either does (upper; `$`
may also end before a final newline in `re`): under `not` the upper one is used, so the result
is a subset of both validators' languages. Length bounds on the schema's own conjunction are
handed back for the string counter (any size); nested ones become states up to
MAX_FOLDED_LENGTH. Past the size caps it is stricter, never looser: a union keeps the branches
that fit, an intersection spreads over its widest union first, and a body regex past
MAX_BODY_CHARS is cut to the shortest paths to MAX_TREE_FINALS accepting states (with their
self-loops). `number_regex` does integral multipleOf by remainders (multiple_of.residues_regex;
past its limits the 64 valid integers nearest zero). A `format` with a regex (string_formats.py,
a subset of the format) is read as that anchored pattern where no complement is around it (any
of EXACT_FORMATS, whose regex is the whole format, also under one). Both
raise RegularUnsupported on what they do not read exactly (a negated format, lookaround, ...) or
past the caps (and where a format's automaton would be cut): the caller then converts the
schema as before, relaxing what it cannot enforce. Objects and arrays are not handled here.
The automaton itself is schema/string_automaton.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from surecall.grammars.schema.conditionals import FRACTION, kind_of
from surecall.grammars.schema.multiple_of import MultipleOfUnsupported, residues_regex
from surecall.grammars.schema.string_automaton import RegularUnsupported, StringAutomaton, WorkMeter
from surecall.grammars.schema.string_formats import (
    EXACT_FORMATS,
    FORMAT_NAMES,
    STRING_FORMATS,
    format_leaf,
)

MAX_MODULUS = 2_000  # the lcm of the multipleOfs one number schema combines (past it: listed)
MAX_LISTED_INTEGERS = 64  # integers written out where the remainder set's regex is too long
MAX_SEARCHED = 200_000  # integers tried for that list
MAX_FOLDED_LENGTH = 64  # a length bound nested under a combinator: one state per character up to it
_MAX_DEPTH = 24  # $ref hops
_MAX_NODES = 4_000  # subschemas read for one schema (a guard against $refs that branch and recur)
_NOT_IN = "$surecall:not_in"  # conditionals.NOT_IN (the values the instance equals none of)
_STRING_KEYS = ("pattern", "minLength", "maxLength", "format")
_APPLIES = {  # keyword -> the one type it constrains (all others pass it)
    **{k: "object" for k in ("properties", "required", "additionalProperties", "patternProperties",
                             "propertyNames", "minProperties", "maxProperties", "dependentRequired",
                             "dependentSchemas", "dependencies", "unevaluatedProperties")},
    **{k: "array" for k in ("items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems",
                            "contains", "minContains", "maxContains", "unevaluatedItems")},
    **{k: "number" for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")},
    **{k: "string" for k in _STRING_KEYS},
}
_OTHER_TYPES = ("object", "array", "number", "boolean", "null")


Resolve = Callable[[str], object]  # a $ref -> its target schema


@dataclass(frozen=True)
class StringBody:
    body: str | None  # the JSON string body regex (None: no string is valid)
    min_length: int  # bounds on the whole string, for the counter (already folded when small)
    max_length: int | None
    narrowed: str | None = None  # why the body is stricter than the schema (None: exact)


def may_be_scalar_algebra(schema: object) -> bool:
    """A cheap first look: False when `schema` surely is neither a string_body nor a number_regex
    case (a type or keyword of objects/arrays at its top, or no combinator at all)."""
    if not isinstance(schema, dict) or not any(k in schema for k in ("not", "oneOf", "anyOf", "allOf", "if", "$ref")):
        return False
    types = schema.get("type")
    types = [types] if isinstance(types, str) else types if isinstance(types, list) else None
    if types is not None and not any(t in types for t in ("string", "number", "integer")):
        return False
    return not any(_APPLIES.get(k) in ("object", "array") for k in schema)


def string_body(schema: object, resolve: Resolve, siblings_ignored: bool = False,
                deadline: float | None = None, meter: WorkMeter | None = None) -> StringBody:
    """The strings `schema` admits as one body regex, when it admits only strings and needs the
    algebra (a pattern or bound under not/oneOf/if, or two patterns); else RegularUnsupported."""
    reader = _Reader(resolve, siblings_ignored, read_formats=True)
    if any(reader.truth(schema, kind) is not False for kind in _OTHER_TYPES):
        raise RegularUnsupported("the schema may admit values other than strings")
    expr = reader.expr(schema, top=True)
    needs_algebra = reader.needs_algebra or _max_conjoined(expr) > 1 or (reader.has_literal_under and reader.num_patterns)
    if not needs_algebra:
        raise RegularUnsupported("nothing here needs more than the converter's own string keywords")
    low, high = reader.min_length, reader.max_length
    if low > high if high is not None else False:
        return StringBody(None, low, high)
    if 0 < low <= MAX_FOLDED_LENGTH:
        expr = ("all", [expr, ("len", low, None)])
    automaton = StringAutomaton(expr, deadline, meter)
    body = automaton.body()
    if reader.num_formats and (automaton.is_approximate or body is None):  # the converter relaxes it instead:
        raise RegularUnsupported("a format's automaton is cut, or no string of its regex's subset is valid here")
    narrowed = ("the exact string language has no regex within the size caps: a union keeps the branches "
                "that fit, a long body keeps its shortest paths") if automaton.is_approximate else None
    return StringBody(body, low, high, narrowed)


def number_regex(schema: object, resolve: Resolve, siblings_ignored: bool = False) -> tuple[str | None, str | None]:
    """The numbers `schema` admits, when it admits only numbers built from integral multipleOf
    under not/anyOf/oneOf/if (and type, a lower bound of -1..1 on the whole): the integers by
    their remainder mod the lcm (multiple_of.residues_regex), or, where that regex is too long,
    the MAX_LISTED_INTEGERS nearest zero (stricter); non-integers (which no integral multipleOf
    holds) as conditionals.FRACTION where they pass and nothing bounds them. Returns (regex, why
    it is stricter than the schema or None); regex None: no number; RegularUnsupported for any
    other keyword."""
    reader = _Reader(resolve, siblings_ignored)
    if any(reader.truth(schema, kind) is not False for kind in ("object", "array", "string", "boolean", "null")):
        raise RegularUnsupported("the schema may admit values other than numbers")
    numbers = _NumberReader(reader)
    expr = numbers.expr(schema, top=True)
    if not numbers.needs_algebra:
        raise RegularUnsupported("no multipleOf sits under not/anyOf/oneOf/if")
    modulus = math.lcm(*numbers.moduli)
    narrowed = None
    has_fractions = _holds(expr, False, 0) and numbers.low is None
    try:
        if modulus > MAX_MODULUS:
            raise MultipleOfUnsupported(f"the multipleOfs combine modulo {modulus}, past {MAX_MODULUS}")
        residues = frozenset(np.flatnonzero(_holds_all(expr, np.arange(modulus))).tolist())
        whole = residues_regex(modulus, residues, numbers.low) if residues else None
    except MultipleOfUnsupported as exc:
        whole = _listed_integers(expr, numbers.low)
        narrowed = (f"{exc}: only the {MAX_LISTED_INTEGERS} integers nearest "
                    f"{'zero' if numbers.low is None else numbers.low} that pass are written") if whole else None
        if whole is None and (modulus > MAX_SEARCHED or not MAX_LISTED_INTEGERS):  # none seen is not none at all
            raise RegularUnsupported(str(exc)) from exc
    if whole is None and not has_fractions:
        if _holds(expr, False, 0):  # only the bounded fractions pass: not written here
            raise RegularUnsupported("only non-integers pass, beside a lower bound")
        return None, None
    parts = [p for p in (whole, FRACTION if has_fractions else None) if p]
    return "|".join(f"(?:{p})" for p in parts), narrowed


def _listed_integers(expr: object, low: int | None) -> str | None:
    """The MAX_LISTED_INTEGERS integers nearest zero (from `low` up) that meet `expr`, written out:
    stricter than the schema, for remainder sets whose regex is too long (mod 7 already is).
    None when none is found among the first MAX_SEARCHED."""
    steps = np.arange(MAX_SEARCHED)
    candidates = low + steps if low is not None else (steps + 1) // 2 * np.where(steps % 2 == 1, 1, -1)
    found = candidates[_holds_all(expr, candidates)][:MAX_LISTED_INTEGERS].tolist()  # 0, 1, -1, 2, -2, ...
    return "|".join(str(n) for n in sorted(found)) if found else None


class _NumberReader:
    """Number schemas as expressions over ("mof", k) and ("int",) leaves."""

    def __init__(self, reader: _Reader):
        self.reader = reader
        self.moduli: list[int] = [1]
        self.low: int | None = None  # the least integer the whole schema's lower bound leaves
        self.needs_algebra = False

    def expr(self, schema: object, top: bool = False, inside: bool = False, depth: int = 0) -> object:
        if isinstance(schema, bool):
            return schema
        self.reader.visit()
        if "$ref" in schema:
            return ("all", [self.expr(s, top, inside, depth + 1) for s in self.reader.target(schema, depth)])
        return ("all", [self.keyword_expr(schema, k, v, top, inside, depth) for k, v in schema.items()])

    def keyword_expr(self, schema: dict, key: str, value: object, top: bool, inside: bool, depth: int) -> object:
        if key == "type":
            types = [value] if isinstance(value, str) else list(value)
            return True if "number" in types else ("int",) if "integer" in types else False
        if key == "multipleOf":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 1 or not float(value).is_integer():
                raise RegularUnsupported(f"multipleOf {value!r} is not a positive integer")
            self.moduli.append(int(value))
            self.needs_algebra = self.needs_algebra or inside
            return ("mof", int(value))
        if key in ("minimum", "exclusiveMinimum") and top:
            self.lower_bound(key, value)
            return True
        if key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "const", "enum", _NOT_IN):
            raise RegularUnsupported(f"{key} is not read beside multipleOf algebra")
        sub = lambda s: self.expr(s, inside=True, depth=depth + 1)  # noqa: E731
        if key == "not":
            return ("not", sub(value))
        if key == "allOf":
            return ("all", [self.expr(s, top, inside, depth + 1) for s in value])
        if key in ("anyOf", "oneOf"):
            return ("any" if key == "anyOf" else "one", [sub(s) for s in value])
        if key == "if":
            cond, then, other = sub(value), sub(schema.get("then", True)), sub(schema.get("else", True))
            return ("any", [("all", [cond, then]), ("all", [("not", cond), other])])
        return True

    def lower_bound(self, key: str, value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RegularUnsupported(f"{key} {value!r} is not a number")
        low = math.ceil(value) if key == "minimum" else math.floor(value) + 1
        if low not in (-1, 0, 1):
            raise RegularUnsupported(f"a lower bound of {value!r} is not written beside multipleOf algebra")
        self.low = low if self.low is None else max(self.low, low)


def _holds_all(expr: object, integers: np.ndarray) -> np.ndarray:
    """_holds for each of `integers` at once (a bool array)."""
    if isinstance(expr, bool):
        return np.full(integers.shape, expr)
    kind = expr[0]
    if kind == "mof":
        return integers % expr[1] == 0
    if kind == "int":
        return np.ones(integers.shape, bool)
    if kind == "not":
        return ~_holds_all(expr[1], integers)
    bits = [_holds_all(e, integers) for e in expr[1]]
    if not bits:
        return np.full(integers.shape, kind == "all")
    if kind == "one":
        return np.sum(bits, axis=0) == 1
    return np.logical_and.reduce(bits) if kind == "all" else np.logical_or.reduce(bits)


def _holds(expr: object, is_integer: bool, residue: int) -> bool:
    """Whether a number (an integer with that remainder mod the lcm, or a non-integer) meets `expr`."""
    if isinstance(expr, bool):
        return expr
    kind = expr[0]
    if kind == "mof":  # `residue`: the integer itself, or its remainder mod a multiple of every k
        return is_integer and residue % expr[1] == 0
    if kind == "int":
        return is_integer
    if kind == "not":
        return not _holds(expr[1], is_integer, residue)
    bits = [_holds(e, is_integer, residue) for e in expr[1]]
    return all(bits) if kind == "all" else any(bits) if kind == "any" else sum(bits) == 1


# --- schema -> boolean expression over leaves ----------------------------------------------
# Leaves: ("pat", pattern) a pattern's search language (parsed once the algebra is needed), ("len", lo, hi), ("lit", strings);
# nodes: ("all" | "any" | "one", [exprs]), ("not", expr); True, False.


class _Reader:
    def __init__(self, resolve: Resolve, siblings_ignored: bool, read_formats: bool = False):
        self.resolve = resolve
        # formats as their regexes, where no complement is around them: string_body's own reading
        # (object_exists.py complements the key classes it reads here itself)
        self.read_formats = read_formats
        self.siblings_ignored = siblings_ignored
        self.min_length, self.max_length = 0, None
        self.needs_algebra = False  # a pattern or length under not/oneOf/if
        self.has_literal_under = False  # a const/enum under not/oneOf/if (needs it beside a pattern)
        self.num_patterns = 0
        self.num_formats = 0  # formats read as anchored patterns of their regex (never under a complement)
        self.negations = 0  # complements around the subschema read now (not, oneOf, if's condition)
        self.num_nodes = 0
        self.truths: dict[tuple[int, str], bool | None] = {}  # (id of subschema, type) -> truth

    def visit(self) -> None:
        self.num_nodes += 1
        if self.num_nodes > _MAX_NODES:
            raise RegularUnsupported(f"the schema has more than {_MAX_NODES} subschemas to read")

    def target(self, schema: dict, depth: int) -> list:
        """`schema`'s $ref target and the siblings that apply beside it."""
        if depth > _MAX_DEPTH:
            raise RegularUnsupported("references nest too deeply")
        try:
            target = self.resolve(schema["$ref"])
        except Exception as exc:  # an unresolvable $ref: the converter reports it
            raise RegularUnsupported(f"$ref {schema['$ref']!r}: {exc}") from exc
        rest = {} if self.siblings_ignored else {k: v for k, v in schema.items() if k != "$ref"}
        return [target, rest]

    def truth(self, schema: object, kind: str, depth: int = 0) -> bool | None:
        """Whether every (True), no (False) or some (None) value of JSON type `kind` is valid."""
        if isinstance(schema, bool):
            return schema
        if not isinstance(schema, dict):
            raise RegularUnsupported(f"expected a schema, got {type(schema).__name__}")
        if "nullable" in schema:
            raise RegularUnsupported("`nullable` is read by the converter")
        key = (id(schema), kind)
        if key not in self.truths:
            self.visit()
            self.truths[key] = None  # a reference cycle back here: unknown
            parts = self.target(schema, depth) if "$ref" in schema else None
            if parts is not None:
                self.truths[key] = _and3(self.truth(s, kind, depth + 1) for s in parts)
            else:
                self.truths[key] = _and3(self.keyword_truth(schema, k, v, kind, depth) for k, v in schema.items())
        return self.truths[key]

    def keyword_truth(self, schema: dict, key: str, value: object, kind: str, depth: int) -> bool | None:
        if key == "type":
            types = [value] if isinstance(value, str) else list(value)
            return True if kind in types else (None if kind == "number" and "integer" in types else False)
        if key in ("const", "enum", _NOT_IN):
            values = [value] if key == "const" else list(value)
            has_kind = any(_kind(v) == kind for v in values)
            return (None if has_kind else True) if key == _NOT_IN else (None if has_kind else False)
        if key == "not":
            inner = self.truth(value, kind, depth + 1)
            return None if inner is None else not inner
        if key in ("allOf", "anyOf", "oneOf"):
            if key == "allOf":
                return _and3(self.truth(s, kind, depth + 1) for s in value)
            parts = [self.truth(s, kind, depth + 1) for s in value]
            if key == "anyOf":
                return None if None in parts and True not in parts else any(parts)
            return None if None in parts else sum(parts) == 1
        if key == "if":
            cond = self.truth(value, kind, depth + 1)
            then = self.truth(schema.get("then", True), kind, depth + 1)
            other = self.truth(schema.get("else", True), kind, depth + 1)
            return then if cond is True else other if cond is False else (then if then == other else None)
        return None if _APPLIES.get(key) == kind else True

    def expr(self, schema: object, top: bool = False, depth: int = 0) -> object:
        """The strings `schema` admits as an expression (`top`: on the root's conjunction, where
        length bounds are collected for the counter instead)."""
        if isinstance(schema, bool):
            return schema
        self.visit()
        if "$ref" in schema:
            return ("all", [self.expr(s, top, depth + 1) for s in self.target(schema, depth)])
        parts = []
        for key, value in schema.items():
            if key in ("minLength", "maxLength") and top:
                self.length_bound(key, value)
            elif key == "allOf":
                parts.append(("all", [self.expr(s, top, depth + 1) for s in value]))
            else:
                parts.append(self.keyword_expr(schema, key, value, depth))
        return ("all", parts)

    def length_bound(self, key: str, value: object) -> None:
        bound = _natural(value, key)
        if key == "minLength":
            self.min_length = max(self.min_length, bound)
        else:
            self.max_length = bound if self.max_length is None else min(self.max_length, bound)

    def keyword_expr(self, schema: dict, key: str, value: object, depth: int) -> object:
        if key == "type":
            types = [value] if isinstance(value, str) else list(value)
            return "string" in types
        if key == "pattern":
            self.num_patterns += 1
            if not isinstance(value, str):
                raise RegularUnsupported(f"pattern {value!r} is not a string")
            return ("pat", value)
        if key in ("minLength", "maxLength"):
            bound = _natural(value, key)
            if bound > MAX_FOLDED_LENGTH:
                raise RegularUnsupported(f"{key} {bound} under a combinator is past {MAX_FOLDED_LENGTH}")
            return ("len", bound, None) if key == "minLength" else ("len", 0, bound)
        if key in ("const", "enum", _NOT_IN):
            values = [value] if key == "const" else list(value)
            lit = ("lit", tuple(sorted({v for v in values if isinstance(v, str)})))
            return ("not", lit) if key == _NOT_IN else lit
        if key == "format":
            if value not in FORMAT_NAMES:
                return True  # an annotation: validators ignore it
            if not self.read_formats or value not in STRING_FORMATS or (self.negations and value not in EXACT_FORMATS):
                raise RegularUnsupported("a format is read as an automaton only where it is not negated (but "
                                         f"{', '.join(sorted(EXACT_FORMATS))}: its regex is a subset of the format)")
            self.num_formats += 1
            return format_leaf(value)
        if key in ("not", "oneOf", "if"):  # literals alone the converter excludes (NOT_IN) or tells apart
            found = self.string_leaves(schema[key], depth)
            self.needs_algebra = self.needs_algebra or "bound" in found
            self.has_literal_under = self.has_literal_under or "literal" in found
        if key == "not":
            return ("not", self.negated(value, depth + 1))
        if key == "anyOf":
            return ("any", [self.expr(s, depth=depth + 1) for s in value])
        if key == "oneOf":  # exactly one: each branch also stands negated for the others
            return ("one", [self.negated(s, depth + 1) for s in value])
        if key == "if":
            cond = self.negated(value, depth + 1)
            then = self.expr(schema.get("then", True), depth=depth + 1)
            other = self.expr(schema.get("else", True), depth=depth + 1)
            return ("any", [("all", [cond, then]), ("all", [("not", cond), other])])
        return True  # then/else (read with `if`), annotations and keywords of other types

    def negated(self, schema: object, depth: int) -> object:
        """self.expr of a subschema that stands (also) under a complement."""
        self.negations += 1
        try:
            return self.expr(schema, depth=depth)
        finally:
            self.negations -= 1

    def string_leaves(self, sub: object, depth: int) -> set[str]:
        """Which string leaves sit anywhere in `sub` (through $refs): "bound" (pattern, lengths,
        format), "literal" (const/enum)."""
        if isinstance(sub, list):
            return set().union(*(self.string_leaves(s, depth) for s in sub))
        if not isinstance(sub, dict):
            return set()
        found = {"bound"} if any(k in sub for k in _STRING_KEYS) else set()
        found |= {"literal"} if "const" in sub or "enum" in sub else set()
        if "$ref" in sub:
            found |= self.string_leaves(self.target(sub, depth), depth + 1)
        for k in ("not", "allOf", "anyOf", "oneOf", "if", "then", "else"):
            found |= self.string_leaves(sub.get(k), depth)
        return found


def _max_conjoined(expr: object) -> int:
    """The most patterns one branch of `expr` must meet together (the converter keeps one of them)."""
    if isinstance(expr, bool) or expr[0] in ("len", "lit"):
        return 0
    if expr[0] == "pat":
        return 1
    if expr[0] == "not":
        return _max_conjoined(expr[1])
    counts = [_max_conjoined(e) for e in expr[1]]
    return sum(counts) if expr[0] == "all" else max(counts, default=0)


def _and3(parts) -> bool | None:
    """Kleene's and (None: unknown), stopping at the first False."""
    found: bool | None = True
    for part in parts:
        if part is False:
            return False
        if part is None:
            found = None
    return found


def _kind(value: object) -> str:
    """conditionals.kind_of, with every number (integral too) a "number"."""
    kind = kind_of(value)
    return "number" if kind == "integer" else kind


def _natural(value: object, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or not float(value).is_integer():
        raise RegularUnsupported(f"{key} {value!r} is not a natural number")
    return int(value)
