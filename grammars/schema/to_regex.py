"""JSON Schema -> one regex over the whole JSON text, plus the keywords the regex does not enforce.

`schema_to_regex(schema, options)` validates the schema (JSON Schema metaschema, by its
`$schema` or 2020-12), then walks it: objects list their declared properties in declared order
(required ones always, optional ones maybe; any order for small objects with
options.any_property_order), then extra keys where `additionalProperties` is written out, the
object is free-form, options allow them, or `patternProperties` match; arrays honour
prefixItems/items and min/maxItems (any size: counted arrays, marked for compile.py), strings
min/maxLength (counted strings) and `pattern` (one quantified set: counted too) and known
`format`s, integers their bounds (digit-range regexes), numbers `multipleOf` (a remainder
automaton, schema/multiple_of.py), dependencies and `not: {required}` as alternatives
(schema/alternatives.py), if/then/else, `not` and overlapping oneOf by negation
(schema/conditionals.py), min/maxProperties and propertyNames (schema/property_counts.py),
`uniqueItems` over a few literal items (schema/unique_items.py).
Keywords beside a `$ref` apply from draft 2019-09 on; drafts 3-7 ignore them, as their validators do.
A schema without `type` takes the types its keywords imply (`properties`: an object; an empty one
restricts nothing and implies nothing), or every type where that reading leaves no value (`notes`). The metaschema check is schema/meta.py's.
Whatever restricts values but is not enforced is returned in `relaxed` as (JSON pointer,
keyword) with its reason; nothing is dropped silently. A `$ref` target is converted once per
nesting context and its regex reused: inlined, or with `splice` any value regex past
SPLICE_MIN_CHARS is a placeholder for a sub-automaton (splice.py), as is each level of a
free-form value (max_any_depth: the regex grows linearly with depth, the DFA still doubles). It
does not build automata: the regex dialect is the common subset of Python `re` and
regex-automata (outlines-core). Over 400 lines because the keyword walk is one concern.
"""

# Adapted from the idea of outlines-core's build_regex_from_schema
# (https://github.com/dottxt-ai/outlines-core/blob/main/src/json_schema/parsing.rs): declared
# property order, optional properties by nested alternation, depth-limited recursion.

from __future__ import annotations

import collections
import contextvars
import dataclasses
import itertools
import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from functools import lru_cache

from surecall.errors import CompileBudgetExceeded, SchemaError, UnsupportedSchema
from surecall.grammars.options import GrammarOptions, budget_started
from surecall.grammars.schema import json_lex as lex
from surecall.grammars.schema.alternatives import Alternatives, alternative_parts
from surecall.grammars.schema.conditionals import (
    FRACTION,
    KEPT_AT,
    MAX_IF_BRANCHES,
    NOT_IN,
    NOT_IN_AT,
    conditional_parts,
    if_branches,
    integer_gaps,
    is_kept_not,
    kind_of,
    one_of_reason,
    relaxed_reason,
)
from surecall.grammars.schema.discriminators import discriminator_groups
from surecall.grammars.schema.disjoint import ranges_meet
from surecall.grammars.schema.keywords import is_annotation, without_own_marks
from surecall.grammars.schema.meta import checked_schema, rs_validator
from surecall.grammars.schema.multiple_of import (
    NEAREST_LISTED,
    MultipleOfUnsupported,
    combined_multiple,
    multiple_of_regex,
    nearest_multiples_regex,
)
from surecall.grammars.schema.object_exists import (
    NotExact,
    ObjectReader,
    Writer,
    exists_object_regex,
    listed_integers,
    needs_exists,
)
from surecall.grammars.schema.pattern import (
    CHAR_RUN_FACTOR,
    MAX_INPROCESS_WEIGHT,
    PatternUnsupported,
    _outside_classes,
    _top_branches,
    ambiguity_weight,
    counted_repetition,
    counted_run,
    leading_lookaheads,
    loose_run,
    translate_pattern,
)
from surecall.grammars.schema.pattern_keys import KeysNotWritten, key_atoms, string_not_in
from surecall.grammars.schema.property_counts import (
    MAX_EXTRA_REPEATS,
    MAX_OPTIONAL,
    MAX_SELECTION_CHARS,
    bounded_extras,
    bounded_members,
    extra_keys,
)
from surecall.grammars.schema.ranges import fraction_digits, integer_range_regex, number_range_regex
from surecall.grammars.schema.regular import (
    MAX_FOLDED_LENGTH,
    RegularUnsupported,
    _Reader,
    may_be_scalar_algebra,
    number_regex,
    string_body,
)
from surecall.grammars.schema.string_automaton import RegularGaveUp, StringAutomaton, WorkMeter
from surecall.grammars.schema.string_formats import (
    COUNTED_FORMATS,
    FORMAT_NAMES,
    STRING_FORMATS,
    format_leaf,
)
from surecall.grammars.schema.unique_items import canonical_json, finite_items, selections_regex
from surecall.grammars.splice import Pieces, placeholder, placeholders_in
from surecall.grammars.stack import MAX_STACK_DEPTH, stack_value_regex

_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
_OBJECT_KEYS = {"properties", "required", "additionalProperties", "patternProperties",
                "propertyNames", "minProperties", "maxProperties", "dependentRequired",
                "unevaluatedProperties"}
_ARRAY_KEYS = {"items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems",
               "contains", "minContains", "maxContains", "unevaluatedItems"}
_STRING_KEYS = {"minLength", "maxLength", "pattern", "format"}
_NUMBER_KEYS = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}
_VACUOUS = ({}, [])  # `properties: {}`, `required: []`: no type is implied by a keyword that restricts nothing
# Restrict values, never enforced by the grammar: always listed when their type is possible.
_RELAXED_ANY = ("not", "if", "dependentSchemas", "dependencies")
_RELAXED_OBJECT = ("propertyNames", "dependentRequired", "unevaluatedProperties")
_RELAXED_ARRAY = ("contains", "unevaluatedItems")
_CONTAINS_ALSO = "$surecall:contains_also"  # the other `contains` an allOf merged beside the first one
MAX_CONTAINS = 3  # contains on one array written exactly (13 ordered partitions of 3); past it relaxed
_UNSUPPORTED = ("$dynamicRef", "$recursiveRef")
_LOWER_BOUNDS = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties", "minContains")
_UPPER_BOUNDS = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties", "maxContains")
_ASSERTING = _OBJECT_KEYS | _ARRAY_KEYS | _STRING_KEYS | _NUMBER_KEYS | {
    "type", "enum", "const", "allOf", "anyOf", "oneOf", "$ref", "nullable", NOT_IN, *_RELAXED_ANY}
# Whitespace-free JSON values from the grammar's point of view.
_SCALARS = f"{lex.STRING}|{lex.NUMBER}|{lex.BOOLEAN}|{lex.NULL}"


def _any_value_text(ws: str, inner: str) -> str:
    """Any scalar, or an object or array whose values are `inner` (`ws`: one whitespace place)."""
    sep = f"{ws},{ws}"
    member = f"{lex.STRING}{ws}:{ws}{_group(inner)}"
    obj = f"\\{{{ws}(?:{member}(?:{sep}{member})*{ws})?\\}}"
    arr = f"\\[{ws}(?:{_group(inner)}(?:{sep}{_group(inner)})*{ws})?\\]"
    return f"{_SCALARS}|{obj}|{arr}"


@lru_cache(maxsize=8)
def free_value_regex(ws: str) -> str:
    """The regex of any JSON value at most one container deep, as `Converter.any_value(1)` writes
    it: the same text in every schema (its own splice piece), so compile.py builds its DFA once
    per process, like string_bodies.py's string bodies and numbers."""
    return _any_value_text(ws, _SCALARS)


def free_value_depth(regex: str, ws: str, depth_of: Callable[[int], int]) -> int:
    """d when `regex` is the piece `Converter.any_value(d)` writes under whitespace `ws`, else 0.

    Level 1 is free_value_regex(ws); level d holds one placeholder, of a piece at level d - 1
    (`depth_of(index)`: that piece's level, 0 if none). A level's language depends on d and ws
    only, not on the schema or its piece numbering: compile.py keeps each level's spliced DFA
    once per process."""
    if regex == free_value_regex(ws):
        return 1
    inner = placeholders_in(regex)
    if len(inner) != 1:
        return 0
    (index,) = inner
    below = depth_of(index)
    return below + 1 if below and regex == _any_value_text(ws, placeholder(index)) else 0


# multipleOf regexes (grammars/schema/multiple_of.py) one schema may hold together: m = 8 is ~2k
# characters, and a union of allOf branches can repeat it many times.
_MAX_MULTIPLE_CHARS = 16_000
_SHARED_VALUE_CHARS = 200  # a value regex an object's member automaton writes on several edges: spliced past this
# One object's properties sharing a value regex (the same `$ref` under 47 properties: JsonSchemaStore
# nuget-project, a 194k-character regex) splice it once its copies add up past this many characters.
_REPEATED_MEMBER_CHARS = 16_000
# Steps one schema's string automata (schema/regular.py) may take together: a deterministic cap
# (the same result on any host), about 2-3 s of this project's 2-core CPU; Handwritten string5 takes 2.9M.
MAX_REGULAR_STEPS = 8_000_000
_ALL_KINDS = ("object", "array", "string", "number", "integer", "boolean", "null")
_MAX_EXCLUDE_DEPTH = 4  # property levels `excludes` looks down for discriminators
_MAX_UNION_ALTERNATIVES = 16  # branches of a union `excludes` looks through, per side
_MAX_OBJECT_ONE_OF = 64  # branches objects_one_of separates (its proof takes every ordered pair twice)
# Object keywords beside which an undeclared key may be written or refused by more than the policy
# and additionalProperties (`Converter.value_written_for` then does not say).
_NAME_DEPENDENT = ("patternProperties", "propertyNames", "dependencies", "dependentSchemas", "dependentRequired",
                   "unevaluatedProperties", "if", "then", "else", "not", "allOf", "anyOf", "oneOf")
# Internal mark on a subschema moved by a merge: the JSON pointer it was written at.
_AT = "$surecall:at"
# Internal key on a merged allOf: {keyword: pointer of the branch it came from}.
_FROM = "$surecall:from"
# Integral numbers below this are spelled both ways in literals ("1" and "1.0"); past it a float's repr
# is exponent notation (1e+16) and no longer names one integer exactly.
_EXACT_FLOAT_INTEGERS = 10**15
# Drafts 3-7 ignore every keyword beside `$ref` (so do jsonschema and jsonschema-rs); 2019-09 on apply them.
_SIBLINGS_IGNORED = re.compile(r"https?://json-schema\.org/draft-0[3-7]/schema#?")


# Pattern bodies whose automaton ran past a budget in check_blowup, per memory budget: the same
# schema again (a retry, a fallback's second conversion) fails at once instead of after the budget.
_TOO_LARGE: dict[tuple[str, int], tuple[float, str]] = {}


@dataclass
class RegexResult:
    """The regex (matches the whole JSON text) and the (pointer, keyword) pairs it does not enforce."""

    regex: str
    relaxed: list[tuple[str, str]] = field(default_factory=list)
    reasons: dict[tuple[str, str], str] = field(default_factory=dict)  # why each relaxed pair is not enforced
    pieces: list[str] = field(default_factory=list)  # with splice: the sub-regexes its placeholders stand for
    narrowed: dict[tuple[str, str], str] = field(default_factory=dict)  # (pointer, keyword) -> why stricter than the schema
    recursion_cut: bool = False  # a recursive `$ref` was cut at max_ref_depth (listed in `narrowed`)
    notes: list[str] = field(default_factory=list)  # how the schema was read where it was not as usual


def schema_to_regex(schema: dict | bool, options: GrammarOptions | None = None, splice: bool = False) -> RegexResult:
    """Regex for the JSON texts (in the grammar's whitespace style) that satisfy `schema`.

    With `splice`, values whose regex is longer than SPLICE_MIN_CHARS are written as placeholders
    (grammars/splice.py) and their regexes returned in `pieces`: `splice.build_spliced` joins them
    at the DFA level, so the text stays small however often a `$ref` is used.
    """
    options = options or GrammarOptions()
    checked_schema(schema)  # converted as written: the translator reads patterns as ECMA-262 and Python both do
    schema = without_own_marks(schema)  # a user's `$surecall:...` keys are annotations, not the converter's marks
    conv, regex = _converted(schema, options, splice, keywords_imply_types=True)
    notes = []
    if regex is None and conv.truncated_at is None and conv.implied_a_type:
        # With types implied by keywords nothing matches; JSON Schema reads an untyped schema as
        # every type (`oneOf: [{not: {required: [e]}}, {properties: {e: false}}]` holds for every
        # non-object). Tried only here: the implied reading stays wherever it leaves a value.
        untyped, again = _converted(schema, options, splice, keywords_imply_types=False)
        if again is not None:
            conv, regex = untyped, again
            notes.append("no value matches with types implied by keywords (`properties`: an object, ...), so "
                         "schemas without `type` take every type, as JSON Schema reads them; add `type` to narrow it")
    if regex is None:
        if conv.truncated_at is not None:
            raise UnsupportedSchema(
                f"recursion cannot end within max_ref_depth={options.max_ref_depth}",
                conv.truncated_at, "$ref")
        raise UnsupportedSchema("schema is unsatisfiable (no value can match it)", conv.unsatisfiable_at(), None)
    pieces = [] if conv.pieces is None else list(conv.pieces.regexes)
    narrowed = dict(conv.narrowed)
    if conv.truncated_at is not None:
        narrowed.setdefault((conv.truncated_at, "$ref"), (
            f"recursion cut at max_ref_depth={options.max_ref_depth}: "
            "values nested deeper through this reference are never written"))
    return RegexResult(regex=regex, relaxed=list(conv.relaxed), reasons=_with_algebra_notes(conv), pieces=pieces,
                       narrowed=narrowed, recursion_cut=conv.truncated_at is not None, notes=notes)


def _converted(schema, options: GrammarOptions, splice: bool, keywords_imply_types: bool):
    """(the Converter, its regex or None) of one walk over `schema`."""
    conv = Converter(schema, options, Pieces(_COUNTED_ENTERS) if splice else None)
    conv.keywords_imply_types = keywords_imply_types
    demoted = _DEMOTED_TICKS.set([])
    try:
        regex = conv.convert(schema, "")
        why = (f"a repeated group's bound above max_bounded_length={options.max_bounded_length} (widened: the "
               "string is one of several in a union, whose counter could not count its iterations beside the others)")
        for ticked in dict.fromkeys(_DEMOTED_TICKS.get()):
            for ptr in conv.ticked_at.get(ticked, [""]):  # never silent: the root where its place is not known
                conv.relax(ptr, "pattern", why)
        return conv, regex
    except RecursionError:
        if "$ref" in json.dumps(schema):
            raise UnsupportedSchema("references or values nest too deeply to convert (past Python's recursion "
                                    "limit; lower max_ref_depth or nest values less deeply)", "", "$ref") from None
        raise UnsupportedSchema("the schema nests values too deeply to convert (past Python's recursion limit)",
                                "", None) from None
    finally:
        _DEMOTED_TICKS.reset(demoted)


def _with_algebra_notes(conv) -> dict[tuple[str, str], str]:
    """Each relaxed pair's reason, plus, below a schema whose exact string automaton was given up
    (schema/regular.py: step cap or time), that it was and why: the keyword is relaxed for that;
    and below an object whose `not` object_exists.py did not write, why it did not."""
    reasons = dict(conv.relaxed)
    declined: dict[str, str] = {}
    for ptr, why in getattr(conv, "exists_failures", []):
        declined.setdefault(ptr, why)
    for (pointer, keyword), why in reasons.items():
        at = next((p for p in conv.algebra_gave_up if pointer == p or pointer.startswith(p + "/")), None)
        if at is not None:
            why = reasons[(pointer, keyword)] = (f"{why}; the exact string automaton at {at or '/'} was given up: "
                                                 f"{conv.algebra_gave_up[at]}")
        at = next((p for p in declined if pointer == p or pointer.startswith(p + "/")), None)
        if keyword == "not" and at is not None:
            reasons[(pointer, keyword)] = f"{why}; the object at {at or '/'} is not written with its keys' existence: {declined[at]}"
    return reasons


def ref_siblings_ignored(root: object) -> bool:
    """Whether `root`'s `$schema` names draft 3 to 7, where keywords beside a `$ref` do not apply."""
    name = root.get("$schema") if isinstance(root, dict) else None
    return isinstance(name, str) and _SIBLINGS_IGNORED.fullmatch(name) is not None


def pointer_join(pointer: str, *parts: object) -> str:
    return pointer + "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def json_literal(value: object, options: GrammarOptions, integral_floats: bool = True) -> str:
    """Regex matching one JSON value spelled canonically, with the whitespace the options allow
    wherever JSON allows it (object keys in the value's own order). An integral number may also
    be spelled with `.0` unless `integral_floats` is False (under draft 3/4 `type: integer`,
    `1.0` is not an integer)."""
    ws = options.whitespace_regex()
    if isinstance(value, dict):
        members = [f"{_text_literal(k)}{ws}:{ws}{json_literal(v, options, integral_floats)}" for k, v in value.items()]
        return f"\\{{{ws}" + (f"{ws},{ws}".join(members) + ws if members else "") + "\\}"
    if isinstance(value, list):
        items = [json_literal(v, options, integral_floats) for v in value]
        return f"\\[{ws}" + (f"{ws},{ws}".join(items) + ws if items else "") + "\\]"
    return _text_literal(value, integral_floats)


def _as_floats(value: object) -> object:
    """`value` with every integral number as a float (1 -> 1.0): its other spelling."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return float(value) if _is_integral(value) and abs(value) < _EXACT_FLOAT_INTEGERS else value
    if isinstance(value, list):
        return [_as_floats(v) for v in value]
    if isinstance(value, dict):
        return {k: _as_floats(v) for k, v in value.items()}
    return value


def _has_integral(value: object) -> bool:
    """Whether `value` holds an integral number that json_literal may also spell with `.0`."""
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return _is_integral(value) and abs(value) < _EXACT_FLOAT_INTEGERS
    if isinstance(value, list):
        return any(_has_integral(v) for v in value)
    if isinstance(value, dict):
        return any(_has_integral(v) for v in value.values())
    return False


def _text_literal(value: object, integral_floats: bool = True) -> str:
    if not isinstance(value, bool) and _is_integral(value) and abs(value) < _EXACT_FLOAT_INTEGERS:
        # JSON Schema compares numbers by value: `1` and `1.0` are the same enum/const member
        return f"{int(value)}(?:\\.0)?" if integral_floats else str(int(value))
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    return "".join(lex.regex_char(ord(c)) for c in text)


# A counted string is `"` ENTER body* `"` EXIT, where ENTER/EXIT are a control byte plus its
# bounds as nibble bytes (count_mark: each bound's length, then its hex digits; a short mark
# keeps outlines-core's DFA small: the seed catalog's went from 494 to 430 states). Raw control
# bytes never occur in JSON text, so the marks cannot clash with anything; compile.py
# (grammars/counted.py) cuts them out of the byte DFA and keeps the body's states as one counted region. The exit mark also keeps bodies of different bounds
# (or an unbounded one) from being merged by DFA minimisation.
COUNT_ENTER, COUNT_EXIT = 0x01, 0x02
NO_MAX_LENGTH = (1 << 30) - 1  # hi of a string with minLength only
_MATERIALISED_RUN = 8  # a `^[set]{n,m}$` pattern with m <= this is spelled out, not counted
_NIBBLE_BASE = 0x10


# A counted repetition inside a pattern (pattern.counted_repetition: a word count) is a counted
# string whose counter counts the repetition's iterations instead of characters: its marks open
# with the nibble TICKS_NIBBLE before the bounds, and its body holds a TICK mark (COUNT_ENTER and
# the nibble TICK_NIBBLE) right after the first character of each iteration; the counted cut
# (grammars/counted.py) turns the edges into a TICK mark into edges that add one to the counter.
TICKS_NIBBLE, TICK_NIBBLE = 9, 10  # a bound never has more than 8 hex digits: these are free
TICK_TEXT = f"\\x{COUNT_ENTER:02x}\\x{_NIBBLE_BASE + TICK_NIBBLE:02x}"


def count_mark(kind: int, low: int, high: int, ticks: bool = False) -> bytes:
    """The mark bytes: `kind`, then (with `ticks`, for a counted repetition: TICKS_NIBBLE) low and
    high, each as its number of hex digits (one nibble byte, 0 for NO_MAX_LENGTH) and those
    digits, most significant first (read_mark)."""
    nibbles = [TICKS_NIBBLE] if ticks else []
    for value in (low, high):
        digits = [] if value == NO_MAX_LENGTH else [int(d, 16) for d in f"{value:x}"]
        nibbles += [len(digits), *digits]
    return bytes([kind] + [_NIBBLE_BASE + n for n in nibbles])


def read_mark(next_nibble) -> tuple[int, int, str]:
    """(low, high, unit) of a mark from its nibbles after the kind byte: unit "chars", "ticks" (a
    counted repetition's bounds) or "tick" (one iteration inside its body; low = high = 0);
    `next_nibble()` gives each (0..15) in turn and raises where the mark is malformed (the
    inverse of count_mark)."""
    count, unit = next_nibble(), "chars"
    if count == TICK_NIBBLE:
        return 0, 0, "tick"
    if count == TICKS_NIBBLE:
        count, unit = next_nibble(), "ticks"
    bounds = []
    for _ in range(2):
        if count > 8:
            raise ValueError(f"Invalid count mark: a bound of {count} hex digits")
        bounds.append(NO_MAX_LENGTH if count == 0 else int("".join(f"{next_nibble():x}" for _ in range(count)), 16))
        count = next_nibble() if len(bounds) < 2 else 0
    return bounds[0], bounds[1], unit


def read_mark_bounds(next_nibble) -> tuple[int, int]:
    """(low, high) of a character count's mark (read_mark; a counted repetition's raises)."""
    low, high, unit = read_mark(next_nibble)
    if unit != "chars":
        raise ValueError(f"Invalid count mark: a counted repetition's ({unit}) where a length's was expected")
    return low, high


def _mark_text_bounds(text: str) -> tuple[int, int]:
    """(low, high) of a mark's nibbles written as regex text (`\\x1h` each)."""
    digits = iter(int(text[i + 3], 16) for i in range(0, len(text), 4))
    bounds = read_mark_bounds(lambda: next(digits))
    if next(digits, None) is not None:
        raise ValueError(f"Invalid count mark: {text!r} is longer than its bounds")
    return bounds


def counted_string_regex(low: int, high: int | None, char: str = lex.STRING_CHAR) -> str:
    """`"` ENTER char* `"` EXIT: a string of low..high `char`s (one JSON-escaped character each)."""
    high = NO_MAX_LENGTH if high is None else min(high, NO_MAX_LENGTH)
    low = min(low, NO_MAX_LENGTH)

    def mark(kind: int) -> str:
        return "".join(f"\\x{b:02x}" for b in count_mark(kind, low, high))

    body = char if char == lex.STRING_CHAR else _group(char)
    return f'"{mark(COUNT_ENTER)}{body}*"{mark(COUNT_EXIT)}'


def counted_body_regex(body: str, high: int) -> str:
    """`"` ENTER (?:body) `"` EXIT: a string `body` matches, of at most `high` characters (the
    counter starts at the fewest characters the body needs: grammars/counted.py)."""

    def mark(kind: int) -> str:
        return "".join(f"\\x{b:02x}" for b in count_mark(kind, 0, min(high, NO_MAX_LENGTH)))

    return f'"{mark(COUNT_ENTER)}{_group(body)}"{mark(COUNT_EXIT)}'


def ticked_string_regex(rep) -> str:
    """`"` ENTER body `"` EXIT of a pattern.CountedRepetition: `A (?:B A){low}` then iterations
    `(?:B TICK ... A)*` whose count (at most high - low) the string counter keeps, TICK after each
    iteration's first character; `(...)?` where the pattern also takes the empty string."""
    def mark(kind: int) -> str:
        return "".join(f"\\x{b:02x}" for b in count_mark(kind, 0, rep.high - rep.low, ticks=True))

    spelled = f"(?:{rep.first}{rep.rest}{_group(rep.lead)}){{{rep.low}}}" if rep.low else ""
    body = f"{_group(rep.lead)}{spelled}(?:{rep.first}{TICK_TEXT}{rep.rest}{_group(rep.lead)})*"
    if rep.empty:
        body = f"(?:{body})?"
    return f'"{mark(COUNT_ENTER)}{body}"{mark(COUNT_EXIT)}'


_TICKED = re.compile(  # a counted repetition (ticked_string_regex): its marks carry TICKS_NIBBLE
    '"' + re.escape(f"\\x{COUNT_ENTER:02x}\\x{_NIBBLE_BASE + TICKS_NIBBLE:02x}") + "((?:\\\\x1[0-9a-f])+)(.*?)"
    + '"' + re.escape(f"\\x{COUNT_EXIT:02x}\\x{_NIBBLE_BASE + TICKS_NIBBLE:02x}") + "(?:\\\\x1[0-9a-f])+",
    re.DOTALL,
)


def _ticked_spelled(m: re.Match) -> str:
    """A counted repetition spelled for Python `re`: its ticked group's `*` as `{0,high}`."""
    high = _mark_text_bounds(m.group(1))[1]
    body = m.group(2)
    at = body.index(TICK_TEXT)
    pairs, opened = [], []
    for i, c, _ in _outside_classes(body):  # the group pairs (escapes and classes skipped)
        if c == "(":
            opened.append(i)
        elif c == ")":
            pairs.append((opened.pop(), i))
    close = min(c for o, c in pairs if o < at < c)
    if body[close + 1 : close + 2] != "*":
        raise ValueError("Invalid counted repetition: its ticked group is not starred")
    body = body[: close + 1] + f"{{0,{high}}}" + body[close + 2 :]
    return '"' + body.replace(TICK_TEXT, "") + '"'


_COUNTED = re.compile(  # a counted body holds no other mark
    '"' + re.escape(f"\\x{COUNT_ENTER:02x}") + "((?:\\\\x1[0-9a-f])+)((?:(?!" + re.escape(f"\\x{COUNT_ENTER:02x}")
    + ").)*?)" + '"' + re.escape(f"\\x{COUNT_EXIT:02x}") + "(?:\\\\x1[0-9a-f])+",
    re.DOTALL,
)


def expand_counts(regex: str) -> str:
    """`regex` with each counted string spelled out as `"char{lo,hi}"`: the language the counters
    enforce, for Python `re` (tests, references); far too large for a byte DFA at real bounds."""

    def spelled(m: re.Match) -> str:
        low, high = _mark_text_bounds(m.group(1))
        upper = "" if high == NO_MAX_LENGTH else str(high)
        if m.group(2).endswith("*"):  # char*: the character under the counted bounds
            return f'"{m.group(2)[:-1]}{{{low},{upper}}}"'
        return f'"(?=(?:{lex.STRING_CHAR}){{{low},{upper}}}"){m.group(2)}"'  # a body: its length looked ahead

    return _COUNTED.sub(spelled, _TICKED.sub(_ticked_spelled, regex))


_REASONS = {
    "uniqueItems": "a finite automaton cannot remember which items were already written",
    "multipleOf": "divisibility is not enforced here (the remainder automaton's regex is too long)",
    "pattern": "the pattern uses a construct without an exact translation (lookaround, backreference, ...)",
    "format": "the format has no regex here (regex), or a pattern already constrains the string",
    "oneOf": "exclusivity of the branches is not enforced (any branch may match)",
    "contains": "which items match `contains` is not tracked",
    "not": "negation of a schema is not enforced",
    "if": "if/then/else is not enforced",
}


def relax_reason(keyword: str) -> str:
    """The default reason a keyword is relaxed (the converter gives a specific one where it knows it)."""
    return _REASONS.get(keyword, f"{keyword!r} is not enforced by the grammar (the validator checks it)")


# A counted array is `[` MARK ws (item (ws `,` MARK ws item)*)? ws `]` MARK: one control byte
# (ITEM_MARK, free of every other mark: counted strings 0x01, 0x02, 0x10-0x1F; tool-mode
# placeholders 0x03-0x08; automaton's 0x0E, 0x0F) whose kind is the byte before it: after `[` and
# `]` it carries minItems/maxItems as count_mark's nibbles, after `,` it is alone. compile.py
# (grammars/items.py: cut_item_marks) cuts the marks out like the string marks; a per-row item
# counter then counts the separators crossed. Arrays of counted arrays are counted at every
# level (a per-row stack of counters) up to MAX_ITEM_DEPTH open at once; an outer array beyond
# that is materialised or relaxed.
# A counted object (maxProperties over undeclared keys) is marked alike, `{` MARK ... `,` MARK ...
# `}` MARK, and its members counted like items: the same counters, kernels and depth limit.
ITEM_MARK = 0x0B
MAX_ITEM_DEPTH = 4
_ITEM_MARK_TEXT = f"\\x{ITEM_MARK:02x}"
_ITEM_ENTER_TEXT = "\\[" + _ITEM_MARK_TEXT
_ITEM_EXIT_TEXT = "\\]" + _ITEM_MARK_TEXT
_OBJECT_ENTER_TEXT = "\\{" + _ITEM_MARK_TEXT
_OBJECT_EXIT_TEXT = "\\}" + _ITEM_MARK_TEXT
_COUNTED_ENTERS = (_ITEM_ENTER_TEXT, _OBJECT_ENTER_TEXT)
_COUNTED_EDGE = re.compile("|".join(re.escape(t) for t in (*_COUNTED_ENTERS, _ITEM_EXIT_TEXT, _OBJECT_EXIT_TEXT)))


def counted_array_depth(regex: str) -> int:
    """How many counted arrays or objects `regex` opens inside each other at most (0: none)."""
    depth = deepest = 0
    for m in _COUNTED_EDGE.finditer(regex):
        depth += 1 if m.group(0) in _COUNTED_ENTERS else -1
        deepest = max(deepest, depth)
    return deepest


def counted_array_regex(item: str, low: int, high: int | None, ws: str, prefix: tuple[str, ...] = ()) -> str:
    """The marked regex of an array of `low..high` items that each match `item` (after the
    `prefix` items, in order, as far as the array reaches: prefixItems)."""
    high = NO_MAX_LENGTH if high is None else min(high, NO_MAX_LENGTH)

    def mark(kind: int) -> str:
        return "".join(f"\\x{b:02x}" for b in count_mark(kind, low, high))

    sep = f"{ws},{_ITEM_MARK_TEXT}{ws}"
    body = f"{_group(item)}(?:{sep}{_group(item)})*"
    for p in reversed(prefix):
        body = f"{_group(p)}(?:{sep}{body})?"
    body += ws
    return f"\\[{mark(ITEM_MARK)}{ws}{body if low >= 1 else _group(body) + '?'}\\]{mark(ITEM_MARK)}"


_ANY_ENTER = "(?:" + "|".join(re.escape(t) for t in _COUNTED_ENTERS) + ")"
_COUNTED_REGION = re.compile(  # an innermost counted array or object (no other opens inside it)
    "(" + _ANY_ENTER + ")((?:\\\\x1[0-9a-f])+)((?:(?!" + _ANY_ENTER + ").)*?)"
    + "(?:" + re.escape(_ITEM_EXIT_TEXT) + "|" + re.escape(_OBJECT_EXIT_TEXT) + ")(?:\\\\x1[0-9a-f])+",
    re.DOTALL,
)


def expand_items(regex: str, ws: str | None = None) -> str:
    """`regex` with each counted array spelled out as `[item(,item){lo-1,hi-1}]` for Python `re`
    (`ws`: the whitespace regex it was written with, GrammarOptions' default when None). A counted
    object loses its marks only: Python `re` cannot count its members past nested values, so this
    regex admits more members than maxProperties (the tables' counters do not)."""
    ws = GrammarOptions().whitespace_regex() if ws is None else ws
    sep = f",{_ITEM_MARK_TEXT}"

    def spelled(m: re.Match) -> str:
        if m.group(1) == _OBJECT_ENTER_TEXT:
            return "\\{" + m.group(3).replace(sep, ",") + "\\}"
        low, high = _mark_text_bounds(m.group(2))
        # pieces between separators: ws, "(?:" when optional, then "(?:item)(?:" each; the last
        # "(?:item))*", one ")?" per prefix item, ws, ")?" when optional
        pieces = m.group(3).split(f"{ws}{sep}{ws}")
        first = pieces[0][len(ws) + (0 if low >= 1 else 3) :]
        items = [first[3:-4]] + [p[3:-4] for p in pieces[1:-1]]
        *prefix, item = items
        return array_regex(prefix, item, low, None if high == NO_MAX_LENGTH else high, ws)

    while True:  # innermost arrays first: each outer one is innermost once its items are spelled
        expanded = _COUNTED_REGION.sub(spelled, regex)
        if expanded == regex:
            return regex
        regex = expanded


def expand_marks(regex: str, ws: str | None = None, stack_depth: int = 2) -> str:
    """Both kinds of counted regions spelled out (expand_counts after expand_items), and free-form
    values on the bracket stack unrolled `stack_depth` containers deep (as max_any_depth unrolls them; `re` has no stack:
    a deeper value the table accepts is no match here)."""
    return expand_counts(expand_items(expand_stack(regex, ws, stack_depth), ws))


def expand_stack(regex: str, ws: str | None = None, depth: int = 2) -> str:
    """`regex` with each bracket-stack value (grammars/stack.py) unrolled `depth` containers deep."""
    ws = GrammarOptions().whitespace_regex() if ws is None else ws
    marked = stack_value_regex(ws)
    if marked not in regex:
        return regex
    inner = _SCALARS
    for _ in range(depth):
        inner = _any_value_text(ws, inner)
    return regex.replace(marked, inner)


def array_regex(items: list[str], rest: str | None, low: int, high: int | None, ws: str) -> str:
    """`[` the prefix `items` in order, then `rest` items, `low..high` in all `]`, spelled out."""
    sep = f"{ws},{ws}"
    count = len(items) if high is None else min(len(items), high)
    tail = ""
    if rest is not None and (high is None or high > count):
        rest_low = max(1, low - count)
        rest_high = "" if high is None else str(high - count - 1)
        more = f"(?:{sep}{_group(rest)}){{{rest_low - 1},{rest_high}}}"
        tail = _group(rest) + more
    body = tail if count == 0 else None
    # build from the last prefix item backwards: item i, then (optionally) the rest
    for i in range(count - 1, -1, -1):
        after = body if i < count - 1 else tail
        if after:
            after = f"{sep}{after}" if i + 1 < low else f"(?:{sep}{after})?"
        body = _group(items[i]) + (after or "")
    if not body:
        return f"\\[{ws}\\]"
    if low >= 1:
        return f"\\[{ws}{body}{ws}\\]"
    return f"\\[{ws}(?:{body}{ws})?\\]"


# With splicing, a value whose regex is longer than this becomes a sub-automaton (grammars/splice.py).
SPLICE_MIN_CHARS = 2000


def _group(regex: str) -> str:
    return f"(?:{regex})"


def _alternation(branches: list[str | None]) -> str | None:
    alive = list(dict.fromkeys(b for b in branches if b is not None))
    if not alive:
        return None
    if len(alive) > 1 and any(b.startswith(('"', '(?:"')) and _COUNT_ENTER_TEXT in b for b in alive):
        alive = _merged_counted_strings(alive)
    return alive[0] if len(alive) == 1 else "|".join(_group(b) for b in alive)


_COUNT_ENTER_TEXT = f'"\\x{COUNT_ENTER:02x}'


def _merged_counted_strings(alive: list[str]) -> list[str]:
    """`alive` with its counted strings and the other strings beside them as one counted string.

    A union of a counted string (`"` ENTER body `"` EXIT) and other strings puts the count mark
    and the other bodies behind one `"`, which no counter can ride (counted.cut_marks refuses it,
    and the whole schema fell back to uncounted strings: Snowplow's `anyOf: [hostname, ipv4,
    ipv6]`, or `anyOf: [{maxLength: 64}, {enum: [...]}]`). When the counted strings share their
    bounds and every other string's length lies within them, the union is one counted string of
    the union of the bodies: the same language. Otherwise `alive` is returned as it is.
    """
    from surecall.grammars.counted import body_char_range  # grammars.counted imports this module

    # only a branch that starts a string (or a group of them) is scanned: an object or array is opaque
    leaves = [leaf for b in alive for leaf in (_top_branches(b) if b.startswith(('"', '(?:"')) else [b])]
    if any(TICK_TEXT in leaf for leaf in leaves):
        merged = _merged_ticked(leaves)
        if merged is not None:
            return merged
        demoted = _DEMOTED_TICKS.get()
        widened = []
        for leaf in leaves:
            m = _TICKED.fullmatch(leaf)
            if m is not None and demoted is not None:
                demoted.append(leaf)
            widened.append(leaf if m is None else '"' + m.group(2).replace(TICK_TEXT, "") + '"')
        leaves = alive = list(dict.fromkeys(widened))
    counted, plain, others = {}, [], []
    for leaf in leaves:
        m = _COUNTED.fullmatch(leaf)
        if m is not None:
            counted.setdefault(m.group(1), []).append(m.group(2))
            continue
        body = _single_string_body(leaf)
        (plain if body is not None else others).append(body if body is not None else leaf)
    if len(counted) != 1 or not plain:
        return alive
    (marks, bodies), = counted.items()
    low, high = _mark_text_bounds(marks)
    for body in plain:
        found = body_char_range(body)
        if found is None or found[0] < low or (high != NO_MAX_LENGTH and (found[1] is None or found[1] > high)):
            return alive
    union = "|".join(_group(b) for b in dict.fromkeys([*bodies, *plain]))
    enter = "".join(f"\\x{b:02x}" for b in count_mark(COUNT_ENTER, low, high))
    leave = "".join(f"\\x{b:02x}" for b in count_mark(COUNT_EXIT, low, high))
    return [f'"{enter}(?:{union})"{leave}', *others]


# The counted repetitions (ticked_string_regex) that a union widened back (_merged_ticked could not
# keep them beside the other strings), for the converter to list: set per conversion (_converted).
_DEMOTED_TICKS: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("surecall_demoted_ticks",
                                                                                  default=None)


def _merged_ticked(leaves: list[str]) -> list[str] | None:
    """The leaves of a union holding a counted repetition, with it and the other strings as one
    counted repetition of the union of their bodies (the others start no iteration), where that
    stays one count per string (counted.ticks_countable); None where it does not (another string
    overlaps an iteration's start, a character count or another repetition's bounds beside it):
    the caller widens the repetition. A repetition alone among non-strings is kept as it is."""
    from surecall.grammars.counted import ticks_countable  # grammars.counted imports this module

    ticked = [(leaf, m) for leaf in leaves if (m := _TICKED.fullmatch(leaf)) is not None]
    strings = [leaf for leaf in leaves if leaf.startswith('"') and _TICKED.fullmatch(leaf) is None]
    if len(ticked) == 1 and not strings:
        return leaves
    bodies = [_single_string_body(leaf) for leaf in strings]
    if (not ticked or any(b is None for b in bodies) or any(TICK_TEXT in leaf or _COUNTED.fullmatch(leaf)
                                                            for leaf in strings)):
        return None
    first, m = ticked[0]
    if any(other.group(1) != m.group(1) for _, other in ticked):
        return None
    union = "|".join(_group(b) for b in dict.fromkeys([*(t.group(2) for _, t in ticked), *bodies]))
    merged = first[: m.start(2)] + f"(?:{union})" + first[m.end(2) :]
    if not ticks_countable(merged):
        return None
    return [merged, *(leaf for leaf in leaves if not leaf.startswith('"'))]


def _single_string_body(regex: str) -> str | None:
    """X of a regex `"X"` that is one quoted string (balanced X, the quotes literal and unquantified);
    None otherwise (counted.body_char_range then checks that no `"` inside X closes the string)."""
    if len(regex) < 2 or regex[0] != '"' or regex[-1] != '"' or regex[1] in "?*+{":
        return None
    chars = list(_outside_classes(regex))  # the closing quote must be one of them: not escaped
    if chars[-1] != (len(regex) - 1, '"', 0) or any(d < 0 or (c == "|" and d == 0) for _, c, d in chars):
        return None
    return regex[1:-1]


class Converter:
    """One walk over one schema document; collects relaxed keywords as it goes."""

    def __init__(self, root: dict | bool, options: GrammarOptions, pieces: Pieces | None = None):
        self.root = root
        self.pieces = pieces  # None: every value inlined as text; else large ones become placeholders
        self.options = options
        self.ws = options.whitespace_regex()
        self.relaxed: dict[tuple[str, str], str] = {}  # (pointer, keyword) -> why it is not enforced
        self.narrowed: dict[tuple[str, str], str] = {}  # (pointer, keyword) -> why the grammar is stricter there
        self.origins: tuple[str, dict] = ("", {})  # the node being converted: its pointer, its keywords' origins
        self.causes: dict[str, str] = {}  # node -> the node it matches nothing because of (blame)
        self.ref_depth: dict[str, int] = {}
        self.ticked_at: dict[str, list[str]] = {}  # a counted repetition's regex -> where it was written
        # Each $ref target's regex is converted once per class of nesting contexts and reused:
        # ref -> [(its reads of ref depths, regex)] (memo_ref). The string is inlined at each use.
        self.ref_regex: dict[str, list[tuple[tuple[tuple[str, int, int], ...], str | None]]] = {}
        self.depth_reads: list[tuple[dict[str, int], dict[str, int]]] = []  # per memo conversion under way
        self.ref_uses: dict[str, list[int]] = {}  # ref -> [times inlined, characters each]
        self.ref_stack: list[str] = []
        self.followed: list[str] | None = None  # the $refs the allOf merge under way follows
        self.any_regex: dict[int | str, str] = {}  # by depth; "stack": the bracket-stack value
        self.enum_validators: dict[str, object] = {}  # enum filter probe (canonical text) -> validator
        self.enum_validators_by_id: dict[int, tuple] = {}  # id(subschema) -> (it, its enum_validator), for none_valid
        self.multiple_chars = 0  # characters of multipleOf regexes written so far (_MAX_MULTIPLE_CHARS)
        self.algebra_gave_up: dict[str, str] = {}  # pointer -> why its string automaton was given up
        self.regular_work = WorkMeter(MAX_REGULAR_STEPS)  # the string automata's steps (schema/regular.py), one cap per schema
        self.truncated_at: str | None = None
        self.deadline = budget_started() + options.time_budget_s  # shared with the compile's later stages
        self.checked_bodies: set[str] = set()  # pattern bodies check_blowup built in the child
        self.ref_siblings_ignored = ref_siblings_ignored(root)
        # A schema without `type` takes the types its keywords are about (`properties`: an object),
        # stricter than JSON Schema (every type); schema_to_regex drops that reading where it
        # leaves no value at all (keywords_imply_types False: every type, as a validator reads it).
        self.keywords_imply_types = True
        self.implied_a_type = False  # types_of took a type from keywords somewhere (the other reading may differ)

    def ref_rest(self, schema: dict) -> dict:
        """The keywords beside `schema`'s `$ref` that apply: none in drafts 3-7 (our marks kept)."""
        return {k: v for k, v in schema.items()
                if k != "$ref" and (not self.ref_siblings_ignored or k in (_AT, _FROM))}

    def relax(self, pointer: str, keyword: str, reason: str | None = None) -> None:
        """List `keyword` at `pointer`, or, for the node being converted, where the keyword was
        written: every place, when an allOf merged two values of it (both are left to the validator)."""
        found = self.origins[1].get(keyword, pointer) if pointer == self.origins[0] else pointer
        for where in found if isinstance(found, tuple) else (found,):
            key = ((pointer if where is None else where) or "", keyword)
            if reason is not None or key not in self.relaxed:
                self.relaxed[key] = reason or relax_reason(keyword)

    def check_size(self, regex: str | None, ptr: str, keyword: str | None = None) -> str | None:
        if regex is not None and len(regex) > self.options.max_regex_length:
            raise UnsupportedSchema(
                f"the regex grows past max_regex_length={self.options.max_regex_length}{self.ref_growth()}",
                ptr, keyword)
        return regex

    def ref_growth(self) -> str:
        """Which $ref is being expanded and which one the regex inlines most (for size errors)."""
        if not self.ref_uses:
            return ""
        ref, (uses, chars) = max(self.ref_uses.items(), key=lambda kv: kv[1][0] * kv[1][1])
        inside = f" inside $ref {self.ref_stack[-1]!r};" if self.ref_stack else ";"
        return (f"{inside} $ref {ref!r} grows it most: inlined {uses} times, {chars} characters each "
                "(lower max_ref_depth or give the schema fewer repeated references)")

    # -- entry ---------------------------------------------------------------------------
    def convert(self, schema: object, ptr: str) -> str | None:
        if time.perf_counter() > self.deadline:
            raise CompileBudgetExceeded(
                f"schema -> regex ran past time_budget_s={self.options.time_budget_s} (at {ptr or '/'})")
        origins: dict = {}
        if isinstance(schema, dict) and (_AT in schema or _FROM in schema):
            ptr, origins = schema.get(_AT, ptr), schema.get(_FROM, {})
            schema = {k: v for k, v in schema.items() if k not in (_AT, _FROM)}
        outer, self.origins = self.origins, (ptr, origins)
        try:
            regex = self.as_piece(self.check_size(self.convert_unchecked(schema, ptr), ptr))
        finally:
            self.origins = outer
        if regex is None and isinstance(schema, dict) and any(k in schema for k in _ALTERNATIVE_KEYWORDS):
            self.causes.pop(ptr, None)  # every alternative fails, each its own way: the node itself is the place
        return regex

    def blame(self, ptr: str, cause: str) -> None:
        """The node at `ptr` matches nothing because the one at `cause` does (a required property)."""
        if cause != ptr:
            self.causes[ptr] = cause

    def unsatisfiable_at(self) -> str:
        """Where an unsatisfiable schema fails: the root's cause, its cause, ... as deep as known."""
        at, seen = "", {""}
        while at in self.causes and self.causes[at] not in seen:
            at = self.causes[at]
            seen.add(at)
        return at

    def as_piece(self, regex: str | None) -> str | None:
        """`regex`, or when splicing and it is long, the placeholder of a sub-automaton built once."""
        if self.pieces is None or regex is None or len(regex) <= SPLICE_MIN_CHARS:
            return regex
        return self.pieces.add(regex)

    def item_nesting(self, regex: str) -> int:
        """How many counted arrays `regex` opens inside each other at most (through spliced pieces:
        an upper bound, the deepest piece it uses added to its own)."""
        depth = counted_array_depth(regex)
        if self.pieces is None or not self.holds_item_counter(regex):
            return depth
        cache = self.__dict__.setdefault("_piece_nesting", {})
        for i in placeholders_in(regex):
            if i < len(self.pieces.regexes) and i not in cache:
                cache[i] = self.item_nesting(self.pieces.regexes[i])
        return depth + max((cache.get(i, 0) for i in placeholders_in(regex)), default=0)

    def holds_item_counter(self, regex: str) -> bool:
        """Whether `regex` holds a counted array (inside a spliced piece too)."""
        return self.pieces.holds_items(regex) if self.pieces is not None else any(t in regex for t in _COUNTED_ENTERS)

    def convert_unchecked(self, schema: object, ptr: str) -> str | None:
        if schema is False:
            return None
        if schema is not True and not isinstance(schema, dict):
            raise SchemaError(f"expected a schema object, got {type(schema).__name__}", ptr)
        for key in _UNSUPPORTED:
            if schema is not True and key in schema:
                raise UnsupportedSchema("dynamic references are not supported", ptr, key)
        if schema is True or not any(k in _ASSERTING for k in schema):
            if self.options.free_form_stack:
                self.narrowed.setdefault((ptr, "max_any_depth"), (
                    f"a free-form value is written at most {MAX_STACK_DEPTH} containers deep (the bracket stack's "
                    "depth): a valid value nested deeper is never written"))
                return self.stack_value()
            depth = self.options.max_any_depth
            self.narrowed.setdefault((ptr, "max_any_depth"), (
                f"a free-form value is written at most {depth} container{'s' if depth != 1 else ''} deep "
                f"(max_any_depth={depth}): a valid value nested deeper is never written" if depth else
                "a free-form value is written as a scalar (max_any_depth=0): a valid object or array is never written"))
            return self.any_value(depth)
        if "$ref" in schema:
            return self.convert_ref(schema, ptr)
        regular = self.regular_string(schema, ptr)
        if regular is not False:
            return regular
        alternatives = self.rewrite_parts(schema, ptr)
        if alternatives is not None:
            return self.convert_alternatives(schema, alternatives, ptr)
        exists = self.exists_object(schema, ptr)
        if exists is not False:
            return exists
        if "allOf" in schema:
            return self.convert_all_of(schema, ptr)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return self.convert_union(schema, key, ptr)
        if "enum" in schema or "const" in schema:
            return self.convert_enum(schema, ptr)  # every other keyword filters the values
        types = self.types_of(schema)
        negated = _negated_types(schema.get("not"))
        if negated is not None and self.is_fraction_only(schema, types, negated):
            rest = {k: v for k, v in schema.items() if k != "not"}
            self.relax_generic(rest, ptr)
            others = [t for t in types if t not in negated and t != "number"]
            return _alternation([self.convert_type(t, rest, ptr) for t in others] + [FRACTION])
        if negated is not None and not ("integer" in negated and "number" in types):
            types = [t for t in types if t not in negated and not (t == "integer" and "number" in negated)]
            schema = {k: v for k, v in schema.items() if k != "not"}
        self.relax_generic(schema, ptr)
        return _alternation([self.convert_type(t, schema, ptr) for t in types])

    def regular_string(self, schema: dict, ptr: str) -> str | None | bool:
        """A strings-only schema whose patterns, lengths and literals sit under not/oneOf/allOf, as
        one automaton's body (schema/regular.py); False when it is not one (converted as before)."""
        if self.regular_work.left <= 0 or not may_be_scalar_algebra(schema):
            return False
        try:
            found = string_body(schema, lambda ref: self.resolve(ref, ptr)[0], self.ref_siblings_ignored,
                                self.deadline, self.regular_work)
        except RegularGaveUp as exc:
            self.algebra_gave_up.setdefault(ptr, str(exc))
            return self.regular_number(schema, ptr)
        except RegularUnsupported:
            return self.regular_number(schema, ptr)
        bounds = {"minLength": found.min_length, "maxLength": found.max_length}
        if found.narrowed:
            self.narrowed[(ptr, _algebra_keyword(schema))] = found.narrowed
        return None if found.body is None else self.convert_string(
            {k: v for k, v in bounds.items() if v is not None}, ptr, found.body)

    def regular_number(self, schema: dict, ptr: str) -> str | None | bool:
        """A numbers-only schema of integral multipleOf under not/anyOf/oneOf (schema/regular.py)."""
        try:
            regex, narrowed = number_regex(schema, lambda ref: self.resolve(ref, ptr)[0], self.ref_siblings_ignored)
        except RegularUnsupported:
            return False
        if narrowed:
            self.narrowed[(ptr, _algebra_keyword(schema))] = narrowed
        return regex

    def convert_alternatives(self, schema: dict, alternatives: Alternatives, ptr: str) -> str | None:
        """`schema` with its dependency keywords (and `not: {required}`) as allOf parts of alternatives."""
        rest = self.with_origins({k: v for k, v in schema.items() if k not in alternatives.keys}, ptr)
        parts = [_at(part, at) for part, at in alternatives.parts]
        return self.convert({"allOf": [_at(rest, ptr), *parts]}, ptr)

    def rewrite_parts(self, schema: dict, ptr: str) -> Alternatives | None:
        """Dependencies and `not: {required}` (schema/alternatives.py), else `if`, `not` and an
        overlapping oneOf (schema/conditionals.py), as allOf parts; None when neither applies."""
        found = alternative_parts(schema, ptr, _at)
        if found is None and self.options.rewrite_conditionals:
            found = conditional_parts(schema, ptr, _at, lambda ref: _at(*self.resolve(ref, ptr)), self.disjoint)
        return found

    def is_fraction_only(self, schema: dict, types: list[str], negated: set[str]) -> bool:
        """`number` with `not: {type: integer}` (and no number keyword): written as FRACTION."""
        return ("integer" in negated and "number" in types and "number" not in negated
                and not any(k in schema for k in (*_NUMBER_KEYS, NOT_IN)))

    def relax_generic(self, schema: dict, ptr: str) -> None:
        for key in _RELAXED_ANY:
            if key in schema:
                why = relaxed_reason(schema, key, lambda ref: self.resolve(ref, ptr)[0])
                at, keyword = schema.get(KEPT_AT, (ptr, key)) if key == "not" else (ptr, key)
                if keyword != key:  # a `not` a negation wrote for an if/oneOf/not elsewhere: listed as that one
                    why = f"{relax_reason(keyword)}: {why or relax_reason(key)}"
                self.relax(at, keyword, why)

    # -- references and combinators ------------------------------------------------------
    def resolve(self, ref: str, ptr: str) -> tuple[object, str]:
        if not ref.startswith("#") and "#" in ref and ref.split("#", 1)[0] == self.root_id():
            ref = "#" + ref.split("#", 1)[1]  # the document's own absolute URI
        if not ref.startswith("#"):
            raise UnsupportedSchema(f"only local references are supported, got {ref!r}", ptr, "$ref")
        fragment = ref[1:]
        if fragment and not fragment.startswith("/"):
            raise UnsupportedSchema(f"anchor references are not supported, got {ref!r}", ptr, "$ref")
        from urllib.parse import unquote

        node: object = self.root
        for raw in fragment.split("/")[1:]:
            part = unquote(raw).replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise SchemaError(f"reference {ref!r} does not resolve", ptr, "$ref")
        return node, fragment

    def root_id(self) -> str | None:
        """The root's `$id` (draft 4: `id`) without its fragment, when it is an absolute URI."""
        if not isinstance(self.root, dict):
            return None
        root_id = self.root.get("$id", self.root.get("id"))
        return root_id.split("#", 1)[0] if isinstance(root_id, str) and ":" in root_id else None

    def convert_ref(self, schema: dict, ptr: str) -> str | None:
        target, target_ptr = self.resolve(schema["$ref"], ptr)
        rest = self.ref_rest(schema)
        ref = schema["$ref"]
        depth = self.read_depth(ref)
        if depth >= self.options.max_ref_depth + 1:
            self.truncated_at = self.truncated_at or ptr
            return None
        if any(k in _ASSERTING for k in rest):
            # the validator reports the target's keywords under the referencing schema's path
            return self.expand_ref(ref, depth, lambda: self.convert({"allOf": [_at(target, ptr), _at(rest, ptr)]}, ptr))
        regex = self.memo_ref(ref, lambda: self.expand_ref(ref, depth, lambda: self.convert(target, target_ptr)))
        if regex is not None:
            uses = self.ref_uses.setdefault(ref, [0, len(regex)])
            uses[0] += 1
        return regex

    def read_depth(self, ref: str) -> int:
        """How often `ref` is being expanded here, noted as read by the conversion under way."""
        if self.depth_reads:
            entry, offsets = self.depth_reads[-1]
            depth = self.ref_depth.get(ref, 0)
            offsets[ref] = max(offsets.get(ref, 0), depth - entry.get(ref, 0))
            return depth
        return self.ref_depth.get(ref, 0)

    def memo_ref(self, ref: str, convert) -> str | None:
        """`ref`'s regex in this nesting context, converted once per class of contexts.

        A conversion uses a ref's depth only as `depth >= max_ref_depth + 1`, read at depths
        entry + k for k up to the largest offset K it read: two entry depths that agree on that
        test for every k <= K give the same regex (their classes: depth_class). An entry keeps
        (ref, K, entry depth) per ref read; a memo hit counts as the reads its entry made.
        """
        entries = self.ref_regex.setdefault(ref, [])
        for reads, regex in entries:
            if all(self.depth_class(self.ref_depth.get(n, 0), k) == self.depth_class(d, k) for n, k, d in reads):
                self.note_reads(reads)
                return regex
        frame: tuple[dict[str, int], dict[str, int]] = (dict(self.ref_depth), {})
        self.depth_reads.append(frame)
        try:
            regex = convert()
        finally:
            self.depth_reads.pop()
        reads = tuple((n, k, frame[0].get(n, 0)) for n, k in sorted(frame[1].items()))
        self.note_reads(reads)
        entries.append((reads, regex))
        return regex

    def note_reads(self, reads: tuple[tuple[str, int, int], ...]) -> None:
        """Record an inner conversion's reads (ref, largest offset, ...) here, in the one under way."""
        if not self.depth_reads:
            return
        entry, offsets = self.depth_reads[-1]
        for n, k, _ in reads:
            offsets[n] = max(offsets.get(n, 0), k + self.ref_depth.get(n, 0) - entry.get(n, 0))

    def depth_class(self, depth: int, offset: int) -> int:
        """`depth` up to what the tests `depth + k >= max_ref_depth + 1` (k = 0..offset) tell apart."""
        top = self.options.max_ref_depth + 1
        return min(max(depth, top - offset - 1), top)

    def expand_ref(self, ref: str, depth: int, convert) -> str | None:
        self.ref_depth[ref] = depth + 1
        self.ref_stack.append(ref)
        try:
            return convert()
        finally:
            self.ref_stack.pop()
            self.ref_depth[ref] = depth

    def merge_all_of(self, schema: dict, ptr: str, hops: int = 0) -> dict | bool:
        """One keyword dict equal to the allOf (references inside it followed)."""
        merged: dict | bool = {k: v for k, v in schema.items() if k not in ("allOf", _AT, _FROM)}
        parts, declined = self.discriminated(schema["allOf"], ptr)
        num_branches = if_branches(parts, lambda ref: self.resolve(ref, ptr)[0])
        for i, sub in enumerate(parts):
            sub_ptr = sub.get(_AT, pointer_join(ptr, "allOf", i)) if isinstance(sub, dict) else ptr
            if num_branches > MAX_IF_BRANCHES and isinstance(sub, dict) and "if" in sub:
                why = f"; {declined[i]}" if i in declined else ""
                self.relax(sub_ptr, "if", f"the allOf's if/then/else parts cross into {num_branches} branches "
                           f"(past {MAX_IF_BRANCHES}){why}")
                sub = {k: v for k, v in sub.items() if k not in ("if", "then", "else")}
            sub = self.flatten(sub, sub_ptr, hops)
            if sub is False:
                return False
            if sub is not True:
                merged = self.merge_pair(merged, _mark_children(sub, sub_ptr), sub_ptr)
                if merged is False:
                    return False
        return merged

    def discriminated(self, parts: list, ptr: str) -> tuple[list, dict[int, str]]:
        """The allOf's parts with its `if`s on one property's value as one union, and why a group
        was declined, by index (schema/discriminators.py)."""
        if not self.options.rewrite_conditionals:
            return parts, {}
        return discriminator_groups(parts, ptr, _at)

    def convert_all_of(self, schema: dict, ptr: str) -> str | None:
        """The allOf merged into one dict and converted, the `$ref`s the merge followed counted as
        expanded meanwhile: recursion through allOf ends at max_ref_depth like any other."""
        outer, self.followed = self.followed, []
        try:
            merged = self.merge_all_of(schema, ptr)
            refs = list(dict.fromkeys(self.followed))
        finally:
            self.followed = outer
        saved = {ref: self.read_depth(ref) for ref in refs}
        if any(depth >= self.options.max_ref_depth + 1 for depth in saved.values()):
            self.truncated_at = self.truncated_at or ptr
            return None
        self.ref_depth.update({ref: depth + 1 for ref, depth in saved.items()})
        try:
            return self.convert(merged, ptr)
        finally:
            self.ref_depth.update(saved)

    def flatten(self, sub: object, ptr: str, hops: int) -> dict | bool:
        """A subschema with its own $ref and allOf resolved (anyOf/oneOf kept as they are)."""
        if hops > 32:
            raise UnsupportedSchema("a cycle of references through allOf", ptr, "$ref")
        if isinstance(sub, dict) and "$ref" in sub:
            if self.followed is not None:
                self.followed.append(sub["$ref"])
            target, _ = self.resolve(sub["$ref"], ptr)
            rest = self.ref_rest(sub)
            sub = {"allOf": [_at(target, ptr), _at(rest, ptr)]}  # reported under the referencing path
        alternatives = self.rewrite_parts(sub, ptr) if isinstance(sub, dict) else None
        if alternatives is not None:  # rewritten before the merge: two branches' `not`s both hold
            rest = {k: v for k, v in sub.items() if k not in alternatives.keys}
            sub = {"allOf": [_at(rest, ptr), *(_at(part, at) for part, at in alternatives.parts)]}
        if isinstance(sub, dict) and "allOf" in sub:
            return self.merge_all_of(sub, ptr, hops + 1)
        if isinstance(sub, dict) and all(k == _AT for k in sub):
            return True
        return sub

    def merge_pair(self, a: dict, b: dict, ptr: str) -> dict | bool:
        """allOf of two keyword dicts as one dict (False: unsatisfiable)."""
        for own, other in ((a, b), (b, a)):
            if _additional_scope_lost(own, other):
                where = own.get(_FROM, {}).get("additionalProperties") or own.get(_AT) or ptr
                self.relax(where if isinstance(where, str) else ptr, "additionalProperties",
                           "an allOf part's additionalProperties beside another part's patternProperties: the keys "
                           "those patterns find are not held to it")
        a, b = _localize_additional(a, b), _localize_additional(b, a)
        a, b = _localize_items(a, b), _localize_items(b, a)
        out = dict(a)
        origins = dict(a.get(_FROM, {}))
        for key, value in b.items():
            if key in (_AT, _FROM):
                continue
            if key not in out:
                out[key] = value
                origins.setdefault(key, b.get(_FROM, {}).get(key, ptr))
            elif key in ("anyOf", "oneOf") or not _json_equal(out[key], value):
                merged = self.merge_keyword(out, key, value, ptr)
                if merged is False:
                    return False
                origins[key] = _both_origins(origins.get(key), b.get(_FROM, {}).get(key, ptr))
            else:  # the same value written twice: a validator may report either place (Handwritten mod306)
                origins[key] = _both_origins(origins.get(key), b.get(_FROM, {}).get(key, ptr))
        if "anyOf" in out and "oneOf" in out:  # A and oneOf(B) = anyOf over x in A of (x and oneOf(B)): exact
            any_of, one_of = out.pop("anyOf"), out.pop("oneOf")
            inner = _one_of_kept(one_of, origins.pop("oneOf", None))
            out["anyOf"] = [{"allOf": [x, inner]} for x in any_of]
        out[_FROM] = origins
        return out

    def merge_keyword(self, out: dict, key: str, value: object, ptr: str) -> bool:
        """Combine out[key] with value in place; False when no value can satisfy both."""
        old = out[key]
        if key == "oneOf":  # oneOf(A) and oneOf(B) = oneOf over x in A of (x and oneOf(B)): exact
            out[key] = [{"allOf": [x, _one_of_kept(value, ptr)]} for x in old]
        elif key == "anyOf":  # a oneOf beside them is distributed by merge_pair
            out[key] = [{"allOf": [x, y]} for x in old for y in value]
        elif key in ("properties", "patternProperties"):
            props = dict(old)
            for name, sub in value.items():
                props[name] = {"allOf": [props[name], sub]} if name in props else sub
            out[key] = props
        elif key == "required":
            out[key] = list(dict.fromkeys([*old, *value]))
        elif key == "type":
            left = [old] if isinstance(old, str) else list(old)
            right = [value] if isinstance(value, str) else list(value)
            both = [t for t in left if t in right or (t == "integer" and "number" in right)]
            both += [t for t in right if t == "integer" and "number" in left and t not in both]
            out[key] = both
        elif key in _LOWER_BOUNDS and not isinstance(value, bool) and not isinstance(old, bool):
            out[key] = max(old, value)
        elif key in _UPPER_BOUNDS and not isinstance(value, bool) and not isinstance(old, bool):
            out[key] = min(old, value)
        elif key == "enum":
            out[key] = [v for v in old if any(_json_equal(v, w) for w in value)]
        elif key == "const":
            return False
        elif key == "uniqueItems":
            out[key] = bool(old) or bool(value)
        elif key == NOT_IN:  # none of these and none of those
            out[key] = [*old, *(v for v in value if not any(_json_equal(v, w) for w in old))]
        elif key == "multipleOf" and combined_multiple(old, value) is not None:
            out[key] = combined_multiple(old, value)
        elif key == "not" and _negated_types(old) is not None and _negated_types(value) is not None:
            out[key] = {"type": sorted(_negated_types(old) | _negated_types(value))}  # not A and not B
        elif key == "prefixItems" and isinstance(old, list) and isinstance(value, list):  # position by position
            out[key] = [{"allOf": [x, y]} for x, y in zip(old, value)] + old[len(value):] + value[len(old):]
        elif key in ("additionalProperties", "items", "additionalItems") and not (
                isinstance(old, list) or isinstance(value, list)):
            out[key] = {"allOf": [old, value]}
        elif key == "contains":  # both hold: some item matches each (contains_array)
            out[_CONTAINS_ALSO] = [*out.get(_CONTAINS_ALSO, []), _at(value, pointer_join(ptr, "contains"))]
        elif key == _CONTAINS_ALSO:
            out[key] = [*old, *value]
        elif key == "format" and (old not in FORMAT_NAMES or value not in FORMAT_NAMES):
            out[key] = old if old in FORMAT_NAMES else value  # an undefined format is an annotation: the other holds
        elif key == "not" and is_kept_not(old) and is_kept_not(value):  # not A and not B: not (A or B), kept too
            out[key] = {"anyOf": [*(old["anyOf"] if set(old) == {"anyOf"} else [old]), value]}
        elif key in ("pattern", "format", "multipleOf", *_RELAXED_ANY, *_RELAXED_OBJECT, *_RELAXED_ARRAY):
            self.relax(ptr, key)  # the first one is kept (and enforced where it can be)
        elif key in _ASSERTING:
            raise UnsupportedSchema(f"allOf with two different {key!r} cannot be merged", ptr, key)
        return True

    def convert_union(self, schema: dict, key: str, ptr: str) -> str | None:
        rest = self.with_origins({k: v for k, v in schema.items() if k != key}, ptr)
        has_rest = any(k in _ASSERTING for k in rest)
        branches = []
        for i, sub in enumerate(schema[key]):
            sub_ptr = pointer_join(ptr, key, i)
            if has_rest:
                branches.append(self.convert({"allOf": [_at(rest, ptr), _at(sub, sub_ptr)]}, ptr))
            else:
                branches.append(self.convert(sub, sub_ptr))
        effective = [{"allOf": [rest, sub]} for sub in schema[key]] if has_rest else schema[key]
        if key == "oneOf" and sum(b is not None for b in branches) > 1 and not self.disjoint(effective):
            marked = [{"allOf": [_at(rest, ptr), _at(sub, pointer_join(ptr, key, i))]} if has_rest
                      else _at(sub, pointer_join(ptr, key, i)) for i, sub in enumerate(schema[key])]
            exact = self.finite_one_of(effective, ptr)
            if exact is False:
                exact = self.arrays_one_of(effective, marked, ptr)
            if exact is False:
                exact = self.objects_one_of(effective, marked, ptr)
            if exact is not False:
                return exact
            self.relax(ptr, "oneOf", self.one_of_reason(effective, ptr))
        return _alternation(branches)

    def one_of_reason(self, effective: list, ptr: str) -> str:
        """Why an overlapping oneOf is relaxed: what keeps conditionals.exclusive_branches from it."""
        why = one_of_reason(effective, lambda ref: self.resolve(ref, ptr)[0])
        if why is None:
            why = ("written exactly only with rewrite_conditionals on" if not self.options.rewrite_conditionals
                   else "its exact rewrite was not taken here")
        return f"{relax_reason('oneOf')}: {why}"

    def finite_one_of(self, effective: list, ptr: str) -> str | None | bool:
        """A oneOf whose every branch lists its values (enum/const beside any other keyword): the
        listed values that validate exactly one branch, every keyword counted (the validator
        decides), as an enum; None when none does. False where a branch lists no values or the
        validator cannot run here."""
        flat = self.flatten_all(effective)
        lists = None if flat is None else [_constants(f) for f in flat]
        if lists is None or any(values is None for values in lists):
            return False
        candidates: list = []
        for value in itertools.chain.from_iterable(lists):
            if not any(_json_equal(value, seen) for seen in candidates):
                candidates.append(value)
        kept = []
        for value in candidates:
            verdicts = [self.none_valid([value], sub) for sub in effective]
            if None in verdicts:
                return False
            if verdicts.count(False) == 1:  # valid under exactly one branch
                kept.append(value)
        return self.convert({"enum": kept}, ptr) if kept else None

    def arrays_one_of(self, effective: list, marked: list, ptr: str) -> str | None | bool:
        """A oneOf of array-only branches that are disjoint once each writes at least one item
        (e.g. arrays of numbers or arrays of arrays): those non-empty branches, plus `[]` when
        exactly one branch takes it (the validator says which). False where that does not hold."""
        flat = self.flatten_all(effective)
        if flat is None or not all(isinstance(f, dict) and self.kinds(f, 0) <= {"array"} for f in flat):
            return False
        if not self.disjoint([{"allOf": [sub, {"minItems": 1}]} for sub in effective]):
            return False
        takes_empty = [self.none_valid([[]], sub) for sub in effective]
        if None in takes_empty:
            return False
        branches = [self.convert({"allOf": [sub, {"minItems": 1}]}, ptr) for sub in marked]
        if [verdict is False for verdict in takes_empty].count(True) == 1:
            branches.append(f"\\[{self.ws}\\]")
        return _alternation(branches)

    def objects_one_of(self, effective: list, marked: list, ptr: str) -> str | None | bool:
        """A oneOf whose overlapping branches are objects, each written without what lets it meet
        another (listed as narrowed): for a pair that may meet, the first branch leaves out a name
        the other requires, or else requires one of its own names the other (additionalProperties
        false) never takes. The strengthened branches must pass `disjoint`; False where some pair
        has neither, or the proof fails (the oneOf is then relaxed as before)."""
        flat = self.flatten_all(effective)
        if flat is None or len(flat) > _MAX_OBJECT_ONE_OF or not all(isinstance(f, dict) for f in flat):
            return False
        kinds = [self.kinds(f, 0) for f in flat]
        memo: dict = {}
        extra: list[dict] = [{} for _ in flat]  # per branch: {"forbid": [...], "require": [...]}
        for i, j in itertools.permutations(range(len(flat)), 2):
            shared = kinds[i] & kinds[j]
            if not shared or self.excludes(flat[i], flat[j], effective[i], effective[j], shared=shared, memo=memo):
                continue
            if shared != {"object"}:
                return False
            step = self.name_that_separates(flat[i], flat[j])
            if step is None:
                return False
            extra[i].setdefault(step[0], []).append(step[1])
        added = [_separated(e) for e in extra]
        stronger = [{"allOf": [sub, more]} if more else sub for sub, more in zip(effective, added)]
        if not self.disjoint(stronger):
            return False
        self.narrowed[(ptr, "oneOf")] = ("written as its branches each without what lets it meet another (a name "
                                         "another requires left out, or one of its own names that another does not "
                                         "take required): a value of one branch that has those is not written")
        return _alternation([self.convert({"allOf": [sub, more]} if more else sub, ptr) for sub, more in zip(marked, added)])

    def name_that_separates(self, flat: dict, other: dict) -> tuple[str, str] | None:
        """("forbid", name): `other` requires a name `flat` may leave out; else ("require", name): a
        name `flat` declares (not false) that `other` never takes (additionalProperties false, no
        pattern keys); None when neither exists."""
        required = set(flat.get("required", []))
        props = flat.get("properties", {})
        for name in other.get("required", []):
            if name not in required and props.get(name) is not False:
                return "forbid", name
        if other.get("additionalProperties") is False and not other.get("patternProperties"):
            other_props = other.get("properties", {})
            for name, sub in props.items():
                if sub is not False and name not in other_props:
                    return "require", name
        return None

    def with_origins(self, rest: dict, ptr: str) -> dict:
        """`rest` (keywords of the node at `ptr`) carrying the allOf branches its keywords came from,
        so a keyword relaxed inside each anyOf/oneOf branch is listed where it was written."""
        if ptr != self.origins[0] or not self.origins[1]:
            return rest
        return {**rest, _FROM: {k: v for k, v in self.origins[1].items() if k in rest}}

    def flatten_all(self, branches: list) -> list | None:
        """Each branch flattened (None when one cannot be: a SchemaError on the way)."""
        try:
            return [self.flatten(sub, "", 0) for sub in branches]
        except SchemaError:
            return None

    def disjoint(self, branches: list) -> bool:
        """True when nothing the grammar emits for one branch satisfies another branch.

        Sufficient tests, per ordered pair (the range test is schema/disjoint.py): a branch of literals
        none of whose values validates against the other branch; then, per type both branches
        admit: number ranges that do not meet; objects where one never writes a name the other
        requires (or forbids one the other always writes), or a name both write with values
        that exclude each other (the same tests, a few levels down: discriminators).
        """
        flat = self.flatten_all(branches)
        if flat is None:
            return False
        memo: dict = {}  # id(property schema) -> (it, flattened): each flattened once per oneOf
        kinds = [self.kinds(f, 0) if isinstance(f, dict) else set() if f is False else set(_ALL_KINDS) for f in flat]
        for i, j in itertools.permutations(range(len(flat)), 2):
            shared = kinds[i] & kinds[j]
            if shared and not self.excludes(flat[i], flat[j], branches[i], branches[j], shared=shared, memo=memo):
                return False
        return True

    def excludes(self, emitted: object, other: object, raw_emitted: object, raw_other: object, depth: int = 0,
                 shared: set | None = None, memo: dict | None = None) -> bool:
        """True when no value the grammar writes for `emitted` satisfies `other` (both flattened;
        raw_*: the same schemas before flattening, for the validator; shared: the types both
        admit, when the caller has them)."""
        if emitted is False or other is False:
            return True
        if not isinstance(emitted, dict) or not isinstance(other, dict) or depth > _MAX_EXCLUDE_DEPTH:
            return False
        for literal, against, constants in ((emitted, raw_other, _written_constants), (other, raw_emitted, _constants)):
            values = constants(literal)
            verdict = None if values is None else self.none_valid(values, against)
            if verdict is not None:  # a value the grammar writes for a branch validates against it
                return verdict
        memo = {} if memo is None else memo
        if shared is None:
            shared = self.kinds_once(emitted, depth, memo) & self.kinds_once(other, depth, memo)
        if not shared:
            return True
        if any(k in sub for sub in (emitted, other) for k in ("not", "if", NOT_IN)):
            return False
        for side in (emitted, other):  # a union on either side: every branch must be excluded
            key = next((k for k in ("anyOf", "oneOf") if k in side), None)
            if key is None:
                continue
            alternatives = self.union_alternatives(side, key, memo)
            if alternatives is None:
                return False
            for flat, branch in alternatives:
                pair = (flat, other, {"allOf": [raw_emitted, branch]}, raw_other) if side is emitted else (
                    emitted, flat, raw_emitted, {"allOf": [raw_other, branch]})
                if not self.excludes(*pair, depth + 1, memo=memo):
                    return False
            return True
        return all(self.excludes_as(kind, emitted, other, depth, memo) for kind in shared)

    def kinds_once(self, flat: dict, depth: int, memo: dict) -> set[str]:
        """`kinds(flat, depth)` once per (flat, depth) in `memo`."""
        hit = memo.get(("kinds", id(flat), depth))
        if hit is None or hit[0] is not flat:
            hit = memo[("kinds", id(flat), depth)] = (flat, self.kinds(flat, depth))
        return hit[1]

    def union_alternatives(self, flat: dict, key: str, memo: dict) -> list | None:
        """(flattened rest-and-branch, branch) per branch of `flat`'s anyOf/oneOf: a value the grammar
        writes for `flat`, or one that satisfies it, satisfies one of them (None: too many, a
        branch that cannot be flattened, or not a list). Once per `flat` in `memo`, so the
        pairs of a oneOf and the levels below share each expansion."""
        hit = memo.get(("union", id(flat)))
        if hit is not None and hit[0] is flat:
            return hit[1]
        branches = flat.get(key)
        found = None
        if isinstance(branches, list) and len(branches) <= _MAX_UNION_ALTERNATIVES:
            rest = {k: v for k, v in flat.items() if k != key}
            try:
                found = [(self.flatten({"allOf": [rest, branch]}, "", 0), branch) for branch in branches]
            except SchemaError:
                found = None
        memo[("union", id(flat))] = (flat, found)
        return found

    def kinds(self, flat: dict, depth: int) -> set[str]:
        """The JSON types a flattened schema admits ("number" brings "integer"): its type (or the
        types its keywords belong to), its literals' types, narrowed by each anyOf/oneOf."""
        values = _constants(flat)
        types = {kind_of(v) for v in values} if values is not None else set(self.types_of(flat))
        if "number" in types:
            types.add("integer")
        for key in ("anyOf", "oneOf"):
            if isinstance(flat.get(key), list) and depth <= _MAX_EXCLUDE_DEPTH:
                union = set()
                for sub in flat[key]:
                    try:
                        sub = self.flatten(sub, "", 0)
                    except SchemaError:
                        return types
                    union |= self.kinds(sub, depth + 1) if isinstance(sub, dict) else set() if sub is False else set(_ALL_KINDS)
                types &= union
        return types

    def excludes_as(self, kind: str, emitted: dict, other: dict, depth: int, memo: dict) -> bool:
        """`excludes` for the values of one JSON type both schemas admit."""
        if kind in ("integer", "number"):
            return not ranges_meet(emitted, other, integral=kind == "integer")
        if kind == "array":
            return self.arrays_exclude(emitted, other, depth, memo)
        if kind != "object":
            return False
        props, other_props = emitted.get("properties", {}), other.get("properties", {})
        is_open = self.options.allow_additional_properties or "additionalProperties" in emitted
        is_closed = bool(props) and not emitted.get("patternProperties") and (
            emitted.get("additionalProperties") is False or not is_open)
        written = set(props) | set(emitted.get("required", []))  # required-undeclared are written too
        if is_closed and any(name not in written for name in other.get("required", [])):
            return True
        always = set(emitted.get("required", []))
        if (other.get("additionalProperties") is False and not other.get("patternProperties")
                and any(name not in other_props for name in always)):
            return True
        for name in sorted(always & set(props) & set(other_props)):
            left, right = self.flattened(props[name], memo), self.flattened(other_props[name], memo)
            if left is not None and right is not None and self.excludes(
                    left, right, props[name], other_props[name], depth + 1, memo=memo):
                return True
        maximum = other.get("maxProperties")
        if isinstance(maximum, int) and not isinstance(maximum, bool) and len(always) > maximum:
            return True  # every value written holds more names than `other` allows
        for name in sorted(set(other.get("required", [])) & set(other_props)):  # a name `other` requires:
            value = self.value_written_for(emitted, name)  # never written, or only with values it rejects
            if value is False:
                return True
            if value is None or (name in always and name in props):  # (tried above)
                continue
            left, right = self.flattened(value, memo), self.flattened(other_props[name], memo)
            if left is not None and right is not None and self.excludes(
                    left, right, value, other_props[name], depth + 1, memo=memo):
                return True
        return False

    def value_written_for(self, flat: dict, name: str) -> object | None:
        """The schema of the values the grammar writes under key `name` in an object of `flat` (a
        flattened object schema), False when it never writes that key, None when that is not known
        here (pattern keys, dependencies, propertyNames and the like may write or refuse it)."""
        props = flat.get("properties", {})
        if name in props:
            return props[name]
        if any(k in flat for k in _NAME_DEPENDENT):
            return None
        extra = flat.get("additionalProperties", True)
        if extra is False:
            return False
        shaped = any(v is not False for v in props.values())
        if (self.closed_by_policy(flat, list(props), shaped) and name not in flat.get("required", [])
                and "minProperties" not in flat):
            return False  # an undeclared key is not written (extra_member)
        return extra if isinstance(extra, dict) else None

    def arrays_exclude(self, emitted: dict, other: dict, depth: int, memo: dict) -> bool:
        """Arrays: `emitted` writes at least one item, its items never satisfy `other`'s items (plain
        `items` schemas on both sides, no tuple forms)."""
        if int(emitted.get("minItems", 0)) < 1 or any(k in sub for sub in (emitted, other)
                                                      for k in ("prefixItems", "contains")):
            return False
        items, other_items = emitted.get("items", True), other.get("items", True)
        if isinstance(items, list) or isinstance(other_items, list):
            return False
        left, right = self.flattened(items, memo), self.flattened(other_items, memo)
        return left is not None and right is not None and self.excludes(left, right, items, other_items, depth + 1,
                                                                       memo=memo)

    def flattened(self, sub: object, memo: dict) -> object | None:
        """`flatten(sub)` once per object in `memo` (None: it cannot be flattened)."""
        hit = memo.get(id(sub))
        if hit is None or hit[0] is not sub:
            try:
                hit = memo[id(sub)] = (sub, self.flatten(sub, "", 0))
            except SchemaError:
                hit = memo[id(sub)] = (sub, None)
        return hit[1]

    def none_valid(self, values: list, schema: object) -> bool | None:
        """Whether no value of `values` validates against `schema` (None: the validator cannot
        be built or run here, e.g. a $ref outside definitions/$defs)."""
        if schema is False or schema is True:
            return schema is False
        if not isinstance(schema, dict):
            return None
        hit = self.enum_validators_by_id.get(id(schema))  # the same subschema again (a oneOf's pairs)
        if hit is None or hit[0] is not schema:
            hit = self.enum_validators_by_id[id(schema)] = (schema, self.enum_validator(_unmarked(schema)))
        validator = hit[1]
        if validator is None:
            return None
        try:
            return not any(validator.is_valid(v) for v in values)
        except Exception:
            return None

    # -- constants -----------------------------------------------------------------------
    def convert_enum(self, schema: dict, ptr: str) -> str | None:
        if schema.get("type") == []:  # an allOf merged disjoint types: no value (the validator refuses `type: []`)
            return None
        values = list(schema["enum"]) if "enum" in schema else [schema["const"]]
        if "const" in schema and "enum" in schema:
            values = [v for v in values if _json_equal(v, schema["const"])]
        if NOT_IN in schema:
            values = [v for v in values if not any(_json_equal(v, w) for w in schema[NOT_IN])]
            schema = {k: v for k, v in schema.items() if k not in (NOT_IN, NOT_IN_AT)}
        others = {k: v for k, v in schema.items() if k in _ASSERTING and k not in ("enum", "const")}
        if others:
            values = [v for v in values if self.value_satisfies(v, schema, others, ptr)]
        # a member's integral numbers may be spelled `1.0` where that spelling is valid too (not
        # under a draft 3/4 `type: integer`: Github_easy o31279's walks wrote `1.0`)
        return _alternation([json_literal(v, self.options, not others or not _has_integral(v)
                                          or self.value_satisfies(_as_floats(v), schema, others, ptr))
                             for v in values])

    def value_satisfies(self, value: object, schema: dict, others: dict, ptr: str) -> bool:
        validator = self.enum_validator({k: v for k, v in schema.items() if k not in ("enum", "const")})
        try:
            if validator is not None:
                return validator.is_valid(value)
        except Exception:
            pass
        for key in others:
            self.relax(ptr, key)
        return True

    def enum_validator(self, probe: dict):
        """A validator of `probe` beside the root's definitions (built once per probe), or None."""
        text = json.dumps(probe, sort_keys=True, default=repr)
        if text not in self.enum_validators:
            refers = 'Ref"' in text or '"$ref"' in text  # without a reference the definitions are not compiled
            for key in ("$defs", "definitions", "$schema") if refers else ("$schema",):  # $schema: the root's draft
                if isinstance(self.root, dict) and key in self.root and key not in probe:
                    probe = {**probe, key: self.root[key]}
            try:
                self.enum_validators[text] = rs_validator(probe)
            except Exception:
                self.enum_validators[text] = None
        return self.enum_validators[text]

    # -- types ---------------------------------------------------------------------------
    def types_of(self, schema: dict) -> list[str]:
        declared = schema.get("type")
        if isinstance(declared, str):
            types = [declared]
        elif isinstance(declared, list):
            types = list(declared)
        else:
            types = []
            for name, keys in (("object", _OBJECT_KEYS), ("array", _ARRAY_KEYS),
                               ("string", _STRING_KEYS), ("number", _NUMBER_KEYS)):
                if self.keywords_imply_types and any(k in schema and schema[k] not in _VACUOUS for k in keys):
                    types.append(name)
                    self.implied_a_type = True
            if not types:
                types = ["object", "array", "string", "number", "boolean", "null"]
        if schema.get("nullable") is True and "null" not in types:
            types.append("null")
        return types

    def convert_type(self, kind: str, schema: dict, ptr: str) -> str | None:
        if NOT_IN in schema:
            return self.convert_excluding(kind, schema, ptr)
        handler = {
            "object": self.convert_object, "array": self.convert_array,
            "string": self.convert_string, "number": self.convert_number,
            "integer": self.convert_integer,
        }.get(kind)
        if handler is not None:
            return handler(schema, ptr)
        if kind == "boolean":
            return lex.BOOLEAN
        if kind == "null":
            return lex.NULL
        raise SchemaError(f"unknown type {kind!r}", ptr, "type")

    def convert_excluding(self, kind: str, schema: dict, ptr: str) -> str | None:
        """A `kind` value equal to none of schema's NOT_IN values (the `not` of a const/enum,
        schema/conditionals.py): strings by a trie complement (unescaped, stricter), integers by
        range gaps, numbers as integers in gaps plus fractions when unbounded (stricter: no
        exponent), booleans and null by what is left; the rest relaxed as `not`."""
        rest = {k: v for k, v in schema.items() if k not in (NOT_IN, NOT_IN_AT)}
        kinds = ("integer", "number") if kind == "number" else (kind,)
        values = [v for v in schema[NOT_IN] if kind_of(v) in kinds and self.value_satisfies(v, rest, {}, ptr)]
        if not values:
            return self.convert_type(kind, rest, ptr)
        if kind == "null":
            return None
        if kind == "boolean":
            return _alternation([json_literal(b, self.options) for b in (True, False) if b not in values])
        if kind == "string" and not any(k in rest for k in ("pattern", "format")):
            return self.convert_string(rest, ptr, _string_not_in(values))
        if kind in ("integer", "number") and "multipleOf" not in rest:
            low, high = _integer_bounds(rest)
            low = -lex.LARGEST_INTEGER if low is None else max(low, -lex.LARGEST_INTEGER)
            high = lex.LARGEST_INTEGER if high is None else min(high, lex.LARGEST_INTEGER)
            whole = integer_gaps(low, high, [int(v) for v in values if kind_of(v) == "integer"])
            is_free = not any(k in rest for k in _NUMBER_KEYS) and all(kind_of(v) == "integer" for v in values)
            return _alternation([whole, FRACTION if kind == "number" and is_free else None])
        at, keyword = schema.get(NOT_IN_AT, (ptr, "not"))  # the `not` (or `if`) the values came from
        self.relaxed[(at, keyword)] = (f"excluding a {kind} literal beside {sorted(k for k in rest if k in _ASSERTING)} "
                                       "is not written")
        return self.convert_type(kind, rest, ptr)

    def stack_value(self) -> str:
        """Any JSON value, nested to any depth, on the bracket stack (grammars/stack.py): one splice
        piece (its DFA built once per process) or its text."""
        if "stack" not in self.any_regex:
            text = stack_value_regex(self.ws)
            self.any_regex["stack"] = text if self.pieces is None else self.pieces.add(text)
        return self.any_regex["stack"]

    def any_value(self, depth: int) -> str:
        """Any JSON value nested at most `depth` containers deep (built once per depth).

        With splicing, every level is a piece of its own (placeholder), the top one too, so a level
        refers to the one inside it instead of copying it twice (regex text linear in depth), and
        each level's DFA is the same in every schema (compile.py builds it once per process).
        """
        if depth <= 0:
            return _SCALARS
        if depth not in self.any_regex:
            inner = _SCALARS if depth == 1 else self.any_value(depth - 1)
            text = _any_value_text(self.ws, inner)
            # spliced, every level is a piece (the top one too): its DFA is built once per process
            self.any_regex[depth] = text if self.pieces is None else self.pieces.add(text)
        return self.any_regex[depth]

    # -- strings -------------------------------------------------------------------------
    def convert_string(self, schema: dict, ptr: str, body: str | None = None) -> str | None:
        """A string of the schema's keywords (`body`: the string body regex instead of a pattern's)."""
        run = self.counted_pattern(schema) if body is None else None
        if run is not None:
            return self.run_string(schema, ptr, *run)
        loose = self.loose_pattern(schema, ptr) if body is None else None
        if loose is not None:
            return self.run_string(schema, ptr, loose[0], loose[1], None)
        ticked = self.repetition_string(schema, ptr) if body is None else None
        if ticked is not None:
            return ticked
        own_pattern = "pattern" in schema and body is None
        if own_pattern:
            body = self.pattern_body(schema["pattern"], pointer_join(ptr, "pattern"), ptr)
            if body is False:  # the pattern finds a match in no string (`/^[0-9]{4}$/`): no string is valid
                return None
        if schema.get("format") in FORMAT_NAMES:  # any other format is an annotation: validators ignore it
            fmt = STRING_FORMATS.get(schema["format"])
            counted = self.counted_format(schema)
            if fmt is not None and body is not None and own_pattern:  # both, where their automaton is exact
                both = self.pattern_and_format(schema)
                if both is False:
                    self.relax(ptr, "format")
                else:
                    body = both
            elif fmt is None or body is not None:
                self.relax(ptr, "format")
            elif counted is not None:
                schema, body = counted
            else:
                body = fmt
        if body is not None:
            if self.options.counted_lengths and ("minLength" in schema or "maxLength" in schema):
                return self.counted_body(schema, ptr, body)
            for key in ("minLength", "maxLength"):
                if key in schema:
                    self.relax(ptr, key, "the string also has a pattern or format that is not one quantified "
                               "character set (`^[set]{n,m}$`): its length is left to the validator")
            return f'"{_group(body)}"'
        if self.options.counted_lengths:
            return self.counted_string(schema)
        low, high = self.length_bounds(schema, "minLength", "maxLength", ptr)
        if high is not None and low > high:
            return None
        upper = "" if high is None else str(high)
        if low == 0 and high is None:
            return lex.STRING
        return f'"{lex.STRING_CHAR}{{{low},{upper}}}"'

    def repetition_string(self, schema: dict, ptr: str) -> str | None:
        """A string of a pattern that repeats one group more than max_bounded_length times (a word
        count, pattern.counted_repetition) with the repetitions counted, any number, exactly
        (ticked_string_regex), when nothing else needs the string's counter (no format, no
        maxLength, a minLength its shortest match meets) and the counter can tell each iteration's
        start (counted.ticks_countable); None: written as before (widened and listed)."""
        # grammars.counted imports this module: imported here
        from surecall.grammars.counted import CountedCutError, body_fewest_chars, ticks_countable

        pattern, low = schema.get("pattern"), int(schema.get("minLength", 0))
        if (not self.options.counted_lengths or not isinstance(pattern, str) or "format" in schema
                or "maxLength" in schema):
            return None
        rep = counted_repetition(pattern, self.options.max_bounded_length)
        if rep is None or ambiguity_weight(rep.unbounded) > MAX_INPROCESS_WEIGHT:  # its DFA is built in-process
            return None
        if rep.empty and low > 0:  # the empty string is too short: that branch is out
            rep = dataclasses.replace(rep, empty=False)
        regex = ticked_string_regex(rep)
        if not ticks_countable(regex):
            return None
        try:
            fewest = body_fewest_chars(_TICKED.fullmatch(regex).group(2).replace(TICK_TEXT, ""))
        except CountedCutError:
            return None
        if low > fewest:
            return None
        self.ticked_at.setdefault(regex, []).append(ptr)  # a union that widens it again lists it (_converted)
        return regex

    def pattern_and_format(self, schema: dict) -> str | bool:
        """The body of the strings the schema's `pattern` finds that also match its format's regex
        (a subset of the format), as one string automaton; False: not written so (no exact
        translation, the automaton would be cut, or no string of the subset matches, where one of
        the whole format might: the format is then relaxed)."""
        built = self.automaton_body(("all", [("pat", schema["pattern"]), format_leaf(schema["format"])]))
        return False if built is None or built[0].is_approximate or built[1] is None else built[1]

    def automaton_body(self, expr: object) -> tuple[StringAutomaton, str | None] | None:
        """(the string automaton of `expr`, its body: None where no string is in it), or None where
        it is not one (a pattern without an exact translation, past the caps or the deadline)."""
        try:
            automaton = StringAutomaton(expr, self.deadline)
            return automaton, automaton.body()
        except RegularUnsupported:
            return None

    def counted_format(self, schema: dict) -> tuple[dict, str] | None:
        """(the schema with the format's length cap as its maxLength, the format's free body) for
        a format of COUNTED_FORMATS under counters, when its minLength leaves the cap room."""
        free = COUNTED_FORMATS.get(schema.get("format"))
        if free is None or not self.options.counted_lengths or int(schema.get("minLength", 0)) > free[1]:
            return None
        body, cap = free
        high = schema.get("maxLength")
        return {**schema, "maxLength": cap if high is None else min(int(high), cap)}, body

    def counted_string(self, schema: dict) -> str | None:
        """A string whose length bounds (any size) a counter enforces: marked for compile.py."""
        low = int(schema.get("minLength", 0))
        high = schema.get("maxLength")
        if high is not None and low > int(high):
            return None
        if low == 0 and high is None:
            return lex.STRING
        return counted_string_regex(low, None if high is None else int(high))

    def counted_body(self, schema: dict, ptr: str, body: str) -> str | None:
        """A string of a pattern's (or format's) body whose maxLength a counter enforces (any size).
        minLength is enforced where the body's own shortest match meets it, else relaxed."""
        # grammars.counted imports this module: imported here
        from surecall.grammars.counted import CountedCutError, body_fewest_chars

        low, high = int(schema.get("minLength", 0)), schema.get("maxLength")
        high = None if high is None else int(high)
        try:
            fewest = body_fewest_chars(body)
        except CountedCutError as exc:
            for key in ("minLength", "maxLength"):
                if key in schema:
                    self.relax(ptr, key, f"the string's pattern or format has a body no counter can ride ({exc})")
            return f'"{_group(body)}"'
        if high is not None and max(low, fewest) > high:
            return None
        if low > fewest:
            folded = self.pattern_with_min_length(schema, low, ptr)
            if folded is False:
                self.relax(ptr, "minLength", f"minLength {low} is above the {fewest} characters the string's pattern "
                           "or format needs (only maxLength is counted beside one; the validator checks it)")
            elif folded is None:
                return None
            else:
                body = folded
        if high is None:
            return f'"{_group(body)}"'
        return counted_body_regex(body, high)

    def pattern_with_min_length(self, schema: dict, low: int, ptr: str) -> str | None | bool:
        """The body of the strings of at least `low` characters the schema's `pattern` finds, as one
        string automaton (schema/string_automaton.py; low at most MAX_FOLDED_LENGTH); None: there
        are none; False: not written so (a format but COUNTED_FORMATS, a longer bound, past the
        automaton's caps)."""
        pattern = schema.get("pattern")
        leaves = []
        if pattern is None and schema.get("format") in COUNTED_FORMATS:  # its free body (counted_format)
            pattern = f"^(?:{COUNTED_FORMATS[schema['format']][0]})$"
        elif isinstance(pattern, str) and schema.get("format") in STRING_FORMATS:  # both (pattern_and_format)
            leaves.append(format_leaf(schema["format"]))
        if not isinstance(pattern, str) or low > MAX_FOLDED_LENGTH:
            return False
        built = self.automaton_body(("all", [("pat", pattern), *leaves, ("len", low, None)]))
        if built is None:
            return False
        automaton, body = built
        own = pattern != schema.get("pattern")  # a format's body, our regex: its `$` admits no final newline
        if automaton.is_approximate or (not own and not all(exact for _, exact in automaton.patterns.values())):
            self.narrowed[(ptr, "minLength")] = ("the pattern's strings of at least minLength characters are written "
                                                 "stricter (an approximate translation, `$` before a final newline, "
                                                 "or past the string automaton's size caps)")
        return body

    def counted_pattern(self, schema: dict) -> tuple[str, int, int | None] | None:
        """(character regex, low, high) of a `pattern` that is one anchored, quantified character
        set (pattern.counted_run), when nothing else (a `format`) constrains the string."""
        if not isinstance(schema.get("pattern"), str) or "format" in schema:
            return None
        return counted_run(schema["pattern"])

    def loose_pattern(self, schema: dict, ptr: str) -> tuple[str, int] | None:
        """pattern.loose_run of a pattern whose run is too long to spell out (above
        max_bounded_length), under counters and without a format: the string is then that run
        alone, counted (narrowed: a valid string with other characters around the run is not
        written), instead of a widened, relaxed pattern and one state per character."""
        if not self.options.counted_lengths or not isinstance(schema.get("pattern"), str) or "format" in schema:
            return None
        found = loose_run(schema["pattern"])
        if found is None or found[1] <= self.options.max_bounded_length:
            return None
        self.narrowed[(ptr, "pattern")] = (f"an unanchored run of at least {found[1]} characters is written as the "
                                           "whole string (counted), never with other characters around it")
        return found

    def run_string(self, schema: dict, ptr: str, char: str, low: int, high: int | None) -> str | None:
        """A string of `char`s whose length is the pattern's quantifier and min/maxLength together:
        counted (any size, exact), or materialised when tiny or, without counters, within
        max_bounded_length (above it widened and listed)."""
        low = max(low, int(schema.get("minLength", 0)))
        if schema.get("maxLength") is not None:
            high = int(schema["maxLength"]) if high is None else min(high, int(schema["maxLength"]))
        if high is not None and low > high:
            return None
        if low <= 1 and high is None:
            return f'"(?:{char}){"+" if low else "*"}"'
        if self.options.counted_lengths and (high is None or high > _MATERIALISED_RUN):
            return counted_string_regex(low, high, char)
        limit = self.options.max_bounded_length
        if low > limit or (high is not None and high > limit):
            why = f"a length above max_bounded_length={limit} without counters (widened: the validator checks it)"
            for key in ("pattern", "minLength", "maxLength"):
                if key in schema:
                    self.relax(ptr, key, why)
            low, high = min(low, limit), None if high is None or high > limit else high
        return f'"(?:{char}){{{low},{"" if high is None else high}}}"'

    def pattern_body(self, pattern: str, pattern_ptr: str, ptr: str) -> str | None | bool:
        """The pattern's string body; None: not written (relaxed, listed); False: no string matches it."""
        try:
            translated = translate_pattern(pattern, self.options.max_bounded_length)
        except PatternUnsupported as exc:
            body = self.automaton_pattern_body(pattern, ptr)
            if body is None:
                self.relax(ptr, "pattern", f"no exact translation: {exc}")
            return body
        self.check_blowup(pattern, translated.regex, pattern_ptr)
        if not translated.is_exact:
            limit = self.options.max_bounded_length
            if counted_repetition(pattern, limit) is not None:  # repetition_string did not take it
                why = ("a repeated group's bound above max_bounded_length={limit} (widened: its iterations are counted "
                       "only where nothing else needs the string's counter, a maxLength, a minLength above the "
                       "pattern's own, or a format, and where the counter can tell each iteration's start)")
            else:
                why = ("a repetition bound above max_bounded_length={limit} ({wide} for a set of one-byte characters) "
                       "inside a larger pattern (widened; only a whole-pattern `^[set]{{n,m}}$` and a repeated group "
                       "`^(?:A B){{n,m}}A$` are counted)")
            self.relax(ptr, "pattern", why.format(limit=limit, wide=limit * CHAR_RUN_FACTOR))
        return translated.regex

    def automaton_pattern_body(self, pattern: str, ptr: str) -> str | None | bool:
        """The body of a pattern that opens with lookaheads (`^(?=.*[0-9])(?!.*\\s).{8,}$`), as one
        string automaton of its parts (pattern.leading_lookaheads), or of a pattern with anchors
        inside (`(^|,)x`, `([^,]+(,|$)){3,}`: zero-width edges of its automaton); None where it is
        neither, a part has no exact translation, or no string the lower reading keeps matches
        while one might under a validator (the pattern is then relaxed); False where no string
        matches under either validator (the string cannot match at all)."""
        parts = leading_lookaheads(pattern)
        built = self.automaton_body(("all", parts) if parts is not None else ("pat", pattern))
        if built is None:
            return None
        automaton, body = built
        if body is None:
            try:
                return False if automaton.matches_nothing() else None
            except RegularUnsupported:
                return None
        if automaton.is_approximate:
            self.narrowed[(ptr, "pattern")] = ("the pattern's string automaton (its lookaheads and rest, or its "
                                               "anchors) has no regex within the size caps: a union keeps the "
                                               "branches that fit, a long body keeps its shortest paths")
        return body

    def check_blowup(self, pattern: str, body: str, pattern_ptr: str) -> None:
        """A pattern whose automaton may be exponential (pattern.ambiguity_weight) is built first in
        the child process that enforces the time and memory budgets: past them it raises
        CompileBudgetExceeded naming the pattern, where an in-process build (outlines-core cannot be
        interrupted) would run on past both; within them, the in-process builds after it are small."""
        if ambiguity_weight(pattern) <= MAX_INPROCESS_WEIGHT or body in self.checked_bodies:
            return
        from surecall.grammars.automaton import regex_to_dfa_isolated

        left_s = max(self.deadline - time.perf_counter(), 0.01)
        key = (body, self.options.memory_budget_bytes)
        failed = _TOO_LARGE.get(key)  # (time budget it ran past, or inf past the memory budget; why)
        if failed is None or failed[0] * 1.5 < left_s:  # retried only with clearly more time
            try:
                regex_to_dfa_isolated(f'"(?:{body})"', left_s, self.options.memory_budget_bytes)
                failed = None
            except CompileBudgetExceeded as exc:
                failed = _TOO_LARGE[key] = (math.inf if "memory" in str(exc) else left_s, str(exc))
                while len(_TOO_LARGE) > 64:
                    del _TOO_LARGE[next(iter(_TOO_LARGE))]
            except SchemaError:  # outlines-core rejects it: the in-process build reports it with its context
                failed = None
        if failed is not None:
            raise CompileBudgetExceeded(f"the pattern {pattern!r} at {pattern_ptr or '/'} has an automaton too large "
                                        f"to build: {failed[1]}")
        self.checked_bodies.add(body)

    def length_bounds(self, schema: dict, min_key: str, max_key: str, ptr: str,
                      why: str | None = None) -> tuple[int, int | None]:
        """(low, high) as materialised; bounds above max_bounded_length are relaxed and listed."""
        limit = self.options.max_bounded_length
        low = int(schema.get(min_key, 0))
        high = schema.get(max_key)
        high = None if high is None else int(high)
        why = why or f"above max_bounded_length={limit} and not counted (widened: the validator checks it)"
        if low > limit:
            self.relax(ptr, min_key, why)
            low = 0
        if high is not None and high > limit:
            self.relax(ptr, max_key, why)
            high = None
        return low, high

    # -- numbers -------------------------------------------------------------------------
    def convert_integer(self, schema: dict, ptr: str) -> str | None:
        """Bounds are enforced, within +-lex.LARGEST_INTEGER (below 2^53, where I-JSON is exact);
        with a multipleOf, by its regex (integer parts uncapped there: schema/multiple_of.py)."""
        low, high = _integer_bounds(schema)
        if "multipleOf" in schema and schema["multipleOf"] != 1:
            multiples = self.multiples(schema, ptr, is_integer=True)
            if multiples is not False:
                return multiples
        if low is None and high is None:
            return lex.INTEGER
        low = -lex.LARGEST_INTEGER if low is None else max(low, -lex.LARGEST_INTEGER)
        high = lex.LARGEST_INTEGER if high is None else min(high, lex.LARGEST_INTEGER)
        return integer_range_regex(low, high)

    def convert_number(self, schema: dict, ptr: str) -> str | None:
        """Bounds that are finite decimals of at most MAX_BOUND_FRACTION_DIGITS fraction digits
        are enforced (numbers then carry no exponent and stay within +-lex.LARGEST_INTEGER);
        others, and ones entirely beyond that, are relaxed."""
        if "multipleOf" in schema:
            multiples = self.multiples(schema, ptr, is_integer=False)
            if multiples is not False:
                return multiples
        bounds = [k for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
                  if k in schema and not isinstance(schema[k], bool)]
        if not bounds:
            return lex.NUMBER
        if all(_short_decimal(schema[k]) for k in bounds):
            (low, low_excl), (high, high_excl) = _number_bounds(schema)
            # Past the schema's bounds the grammar's own cap is |x| < LARGEST_INTEGER + 1 (an integer
            # part of at most LARGEST_INTEGER, any fraction), as a free number's: an inclusive cap at
            # LARGEST_INTEGER would forbid fractions there, a 16-digit chain that made `minimum: 0`
            # 439 regex characters instead of 71 (~120 DFA states per copy). A bound just inside the
            # cap's last unit keeps the inclusive cap, which is stricter than it.
            cap = lex.LARGEST_INTEGER + 1
            if low is None or low <= -cap:
                low, low_excl = -cap, True
            elif low < -lex.LARGEST_INTEGER:
                low, low_excl = -lex.LARGEST_INTEGER, False
            if high is None or high >= cap:
                high, high_excl = cap, True
            elif high > lex.LARGEST_INTEGER:
                high, high_excl = lex.LARGEST_INTEGER, False
            regex = number_range_regex(low, high, low_excl, high_excl)
            if regex is not None or not _number_bounds_overlap(schema):
                return regex
        for key in bounds:
            self.relax(ptr, key)
        return lex.NUMBER

    def multiples(self, schema: dict, ptr: str, is_integer: bool) -> str | None | bool:
        """The multiples of schema's multipleOf within its bounds (None: there are none), or
        False with the keyword relaxed when no regex within the limits says it exactly."""
        try:
            regex = multiple_of_regex(schema, schema["multipleOf"], is_integer)
        except MultipleOfUnsupported as exc:
            return self.nearest_multiples(schema, is_integer, ptr, str(exc))
        self.multiple_chars += len(regex or "")
        if self.multiple_chars > _MAX_MULTIPLE_CHARS:  # each copy is more DFA to build
            return self.nearest_multiples(schema, is_integer, ptr, f"the schema's multipleOf regexes pass "
                                          f"{_MAX_MULTIPLE_CHARS} characters together")
        return regex

    def nearest_multiples(self, schema: dict, is_integer: bool, ptr: str, why: str) -> str | None | bool:
        """Where the exact multiples have no regex within the limits (`why`): the NEAREST_LISTED ones
        nearest zero within the bounds, written out and listed as narrowed (stricter: a walk never
        breaks multipleOf); False with the keyword relaxed where even that is not written."""
        try:
            regex = nearest_multiples_regex(schema, schema["multipleOf"], is_integer)
        except MultipleOfUnsupported as exc:
            self.relax(ptr, "multipleOf", f"not enforced: {exc}")
            return False
        self.narrowed[(ptr, "multipleOf")] = (f"only the {NEAREST_LISTED} multiples nearest zero within the bounds are "
                                              f"written ({why})")
        return regex

    # -- arrays --------------------------------------------------------------------------
    def wants_item_counter(self, schema: dict) -> bool:
        """Whether min/maxItems are above what is spelled out (and counters are on)."""
        low, high = int(schema.get("minItems", 0)), schema.get("maxItems")
        return self.options.counted_lengths and (low > _MATERIALISED_RUN or (
            high is not None and int(high) > _MATERIALISED_RUN))

    def counted_array(self, schema: dict, rest: str, ptr: str, prefix: tuple[str, ...] = ()) -> str | None:
        """An array of `rest` items (after the `prefix` items) whose minItems/maxItems (any size) an
        item counter enforces; items holding MAX_ITEM_DEPTH counted arrays inside each other fall
        back (spelled out up to max_bounded_length, else relaxed)."""
        low, high = int(schema.get("minItems", 0)), schema.get("maxItems")
        high = None if high is None else int(high)
        if high is not None and low > high:
            return None
        if max(self.item_nesting(r) for r in (rest, *prefix)) >= MAX_ITEM_DEPTH:
            why = (f"above max_bounded_length={self.options.max_bounded_length} and the items hold "
                   f"{MAX_ITEM_DEPTH} counted arrays inside each other (a row counts at most {MAX_ITEM_DEPTH} "
                   "open at once; widened: the validator checks it)")
            low, high = self.length_bounds(schema, "minItems", "maxItems", ptr, why)
            return self.array_regex(list(prefix), rest, low, high)
        return counted_array_regex(rest, low, high, self.ws, tuple(prefix))

    def convert_array(self, schema: dict, ptr: str) -> str | None:
        prefix, rest_schema, rest_ptr = _array_items(schema, ptr)
        unique = self.unique_items(schema, prefix, rest_schema)
        if unique is not False:
            return unique
        contained = self.contains_array(schema, prefix, rest_schema, rest_ptr, ptr)
        if contained is not False:
            return contained
        counted = self.wants_item_counter(schema)
        if counted:  # counted, or (items: false) spelled out to the prefix's length: exact either way
            low, high = int(schema.get("minItems", 0)), schema.get("maxItems")
            high = None if high is None else int(high)
        else:
            low, high = self.length_bounds(schema, "minItems", "maxItems", ptr)
        if schema.get("uniqueItems") is True and (high is None or high > 1):
            self.relax(ptr, "uniqueItems")
        for key in _RELAXED_ARRAY:
            if key in schema:
                self.relax(ptr, key)
        items = [self.convert(s, pointer_join(ptr, "prefixItems", i)) for i, s in enumerate(prefix)]
        if None in items:
            cut = items.index(None)
            items, rest, high = items[:cut], None, cut if high is None else min(high, cut)
        else:
            rest = self.convert(rest_schema, rest_ptr)
            if rest is not None and counted:
                return self.counted_array(schema, rest, ptr, tuple(items))
        if rest is None:
            high = len(items) if high is None else min(high, len(items))
        if high is not None and low > high:
            return None
        return self.array_regex(items, rest, low, high)

    def unique_items(self, schema: dict, prefix: list, rest_schema: object) -> str | None | bool:
        """uniqueItems over a small literal item set: every ordered selection (schema/unique_items.py);
        False when it does not apply (no uniqueItems, prefixItems, `contains`, an open item set)."""
        if schema.get("uniqueItems") is not True or prefix or any(k in schema for k in _RELAXED_ARRAY):
            return False
        values = finite_items(_unmarked(rest_schema))
        if values is None:
            return False
        high = schema.get("maxItems")
        return selections_regex(values, int(schema.get("minItems", 0)), None if high is None else int(high),
                                lambda v: json_literal(v, self.options), self.ws)

    def contains_array(self, schema: dict, prefix: list, rest_schema: object, rest_ptr: str, ptr: str) -> str | None | bool:
        """`contains` (up to MAX_CONTAINS of them, merged from an allOf) on a plain item list: items,
        some matching each `contains` (None: no list can); False when other array keywords
        (prefixItems, item or contains counts, uniqueItems) come with it, not combined here.

        A list holds every C_j iff it is items with, in order, the first witnesses: an ordered
        partition T_1..T_m of the contains, the witness of T_i an item matching all of T_i. The
        regex is the union over those partitions (3 for two contains, 13 for three)."""
        others = ("prefixItems", "minContains", "maxContains", "maxItems", "uniqueItems", "unevaluatedItems")
        if "contains" not in schema or prefix or any(k in schema for k in others) or int(schema.get("minItems", 0)) > 1:
            return False
        wanted = [_at(schema["contains"], pointer_join(ptr, "contains")), *schema.get(_CONTAINS_ALSO, [])]
        if len(wanted) > MAX_CONTAINS:
            return False
        hits: dict[frozenset, str | None] = {}

        def hit(subset: frozenset) -> str | None:
            if subset not in hits:
                hits[subset] = self.unless_none(lambda: self.convert(
                    {"allOf": [_at(rest_schema, rest_ptr), *(wanted[j] for j in sorted(subset))]}, ptr))
            return hits[subset]

        item = self.convert(rest_schema, rest_ptr)
        sep = f"{self.ws},{self.ws}"
        between = f"(?:{sep}{_group(item)})*" if item is not None else ""
        before = f"(?:{_group(item)}{sep})*" if item is not None else ""
        lists = []
        for parts in ordered_partitions(list(range(len(wanted)))):
            witnesses = [hit(frozenset(p)) for p in parts]
            if None not in witnesses:
                lists.append(before + sep.join(f"{_group(w)}{between}" for w in witnesses))
        if not lists:
            return None
        body = lists[0] if len(lists) == 1 else _group(_alternation(lists))  # one contains: as before
        return f"\\[{self.ws}{body}{self.ws}\\]"

    def unless_none(self, convert) -> str | None:
        """convert(), whose relaxed keywords are dropped when it admits nothing (None) and memoized
        no reference meanwhile: an empty branch (one item matching exclusive contains) leaves
        nothing to the validator."""
        relaxed, memo = dict(self.relaxed), sum(map(len, self.ref_regex.values()))
        regex = convert()
        if regex is None and memo == sum(map(len, self.ref_regex.values())):
            self.relaxed.clear()
            self.relaxed.update(relaxed)
        return regex

    def array_regex(self, items: list[str], rest: str | None, low: int, high: int | None) -> str:
        return array_regex(items, rest, low, high, self.ws)

    # -- objects -------------------------------------------------------------------------
    def exists_object(self, schema: dict, ptr: str) -> str | None | bool:
        """An object whose `not` asks for keys to exist, written exactly (schema/object_exists.py);
        False when it is not one or is not written there (then converted, and relaxed, as before)."""
        def resolve(ref: str) -> object:
            return self.resolve(ref, ptr)[0]

        if not needs_exists(schema, resolve):
            return False
        saved = dict(self.relaxed), dict(self.narrowed)
        values: dict[str, str | None] = {}

        def value(schemas: list, exact: bool = False) -> str | None:
            key = json.dumps(schemas, sort_keys=True, default=str)
            if key not in values or exact:
                before = dict(self.relaxed)
                values[key] = self.convert({"allOf": schemas} if len(schemas) > 1 else schemas[0] if schemas else True, ptr)
                if set(self.relaxed) - set(before):
                    listed = listed_integers(schemas, self.all_of_validator(schemas))
                    if listed is not False:
                        self.relaxed, values[key] = before, listed
                if exact and set(self.relaxed) - set(before):
                    raise NotExact("a value an existing key must have is not enforced exactly")
            return values[key]

        def share(regex: str) -> str:  # written on several edges: one sub-automaton when splicing
            return self.pieces.add(regex) if self.pieces is not None and len(regex) > _SHARED_VALUE_CHARS else regex

        writer = Writer(value, lambda schemas: value(schemas, exact=True), self.ws, self.deadline, share)
        try:
            return exists_object_regex(schema, ObjectReader(resolve, self.ref_rest, self.ref_siblings_ignored), writer)
        except (NotExact, RegularUnsupported) as exc:
            self.relaxed, self.narrowed = saved
            self.exists_failures = getattr(self, "exists_failures", []) + [(ptr, str(exc))]
            return False

    def convert_object(self, schema: dict, ptr: str) -> str | None:
        for key in _RELAXED_OBJECT:
            if key in schema and key != "propertyNames":  # propertyNames: extra_key, blocked_names
                self.relax(ptr, key)
        props = dict(schema.get("properties", {}))
        for name, sub in props.items():  # a declared name also takes the patternProperties it matches
            matching = _pattern_schemas(schema.get("patternProperties", {}), name, ptr)
            props[name] = {"allOf": [_at(sub, pointer_join(ptr, "properties", name)), *matching]} if matching else sub
        required = list(dict.fromkeys(schema.get("required", [])))
        extra_schema = schema.get("additionalProperties", True)
        for name in required:
            if name not in props:
                matching = _pattern_schemas(schema.get("patternProperties", {}), name, ptr)
                if not matching and extra_schema is False:
                    self.blame(ptr, pointer_join(ptr, "required"))
                    return None
                props[name] = {"allOf": matching} if matching else extra_schema
        for name in self.blocked_names(schema, list(props), ptr):
            props[name] = False  # fails propertyNames: never written (still no extra key)
        members, values = [], {}
        for name, sub in props.items():
            sub_ptr = pointer_join(ptr, "properties", name) if name in schema.get("properties", {}) else ptr
            value = self.convert(sub, sub_ptr)
            if value is None:
                if name in required:
                    self.blame(ptr, sub_ptr)
                    return None
                continue
            values[name] = value
        spliced = self.repeated_member_values(list(values.values()))
        for name, value in values.items():
            key = '"' + lex.escape_literal(name) + '"'
            value = self.pieces.add(value) if value in spliced else value
            members.append((f"{key}{self.ws}:{self.ws}{_group(value)}", name in required))
        if schema.get("patternProperties"):
            repeated = self.pattern_members(schema, list(props), extra_schema, ptr)
        else:
            repeated = [self.extra_member(schema, extra_schema, list(props), ptr,
                                          shaped=any(sub is not False for sub in props.values()))]
        extra = _alternation(repeated)
        extra = None if extra is None else _group(extra)  # one atom: it is repeated after separators
        num_required = sum(req for _, req in members)
        bounded = self.bounded_object(schema, members, extra, ptr)
        if bounded is not False:
            return bounded
        counted = self.counted_object(schema, members, extra, ptr)
        if counted is not False:
            return counted
        self.check_property_counts(schema, num_required, len(members), extra is not None, ptr)
        nonempty = schema.get("minProperties", 0) >= 1 and num_required == 0
        return self.object_regex(members, extra, nonempty, ptr)

    def repeated_member_values(self, values: list[str]) -> set[str]:
        """The values (too short to be pieces on their own) that one object's properties repeat past
        _REPEATED_MEMBER_CHARS together: spliced once, as a piece, when splicing. A piece written in
        a sequence costs next to nothing to splice; its copies would cost outlines-core the text."""
        if self.pieces is None:
            return set()
        uses = collections.Counter(v for v in values if _SHARED_VALUE_CHARS < len(v) <= SPLICE_MIN_CHARS)
        return {v for v, n in uses.items() if n > 1 and n * len(v) > _REPEATED_MEMBER_CHARS}

    def bounded_object(self, schema: dict, members: list[tuple[str, bool]], extra: str | None,
                       ptr: str) -> str | bool:
        """The object with min/maxProperties written in (schema/property_counts.py): declared
        members enumerated by count, or up to MAX_EXTRA_REPEATS extras of a free-form object;
        False when the counts need nothing more or are not written here (then relaxed)."""
        low, high = int(schema.get("minProperties", 0)), schema.get("maxProperties")
        high = None if high is None else int(high)
        num_required = sum(req for _, req in members)
        if not (low > max(num_required, 1 if low == 1 else 0)
                or (high is not None and (extra is not None or len(members) > high))):
            return False
        ws, sep = self.ws, f"{self.ws},{self.ws}"
        if extra is not None:
            if members or low > 1 or high is None or high > MAX_EXTRA_REPEATS:
                return False
            body = bounded_extras(extra, high, sep) if high >= 1 else None
            is_empty_ok = low == 0
        else:
            if len(members) - num_required > MAX_OPTIONAL or (
                    self.options.any_property_order and 2 <= len(members) <= MAX_ANY_ORDER):
                return False
            body = bounded_members(members, max(low, 1), high, sep)
            is_empty_ok = low == 0 and num_required == 0
            if body is not None and len(body) > MAX_SELECTION_CHARS:
                return False
        if body is None:  # no selection fits: relaxed as before (extras may be closed by policy only)
            return f"\\{{{ws}\\}}" if is_empty_ok else False
        return f"\\{{{ws}(?:{body}{ws})?\\}}" if is_empty_ok else f"\\{{{ws}{body}{ws}\\}}"

    def counted_object(self, schema: dict, members: list[tuple[str, bool]], extra: str | None,
                       ptr: str) -> str | None | bool:
        """An object with undeclared keys whose members (any number) an item counter counts
        (items.py counts them as it counts items): up to maxProperties, when every declared member
        fits under it (extra keys come after the declared ones, so a row at the maximum can always
        close), and at least minProperties (a row can always add an extra key). minProperties stays
        listed all the same: it counts distinct keys, and a repeated key counts once. False: not
        counted here (counters off, no extra keys, bounds that leave the counts to the validator,
        or MAX_ITEM_DEPTH counted arrays or objects inside each other)."""
        high = schema.get("maxProperties")
        high = NO_MAX_LENGTH if high is None else int(high)
        low, num_required = int(schema.get("minProperties", 0)), sum(req for _, req in members)
        needs_min = low > max(num_required, 1 if low == 1 else 0)
        if not self.options.counted_lengths or extra is None or not (needs_min or high < NO_MAX_LENGTH):
            return False
        if not max(1, low, len(members)) <= high <= NO_MAX_LENGTH or low >= NO_MAX_LENGTH:
            return False
        if self.item_nesting("".join([extra, *(m for m, _ in members)])) >= MAX_ITEM_DEPTH:
            return False
        if needs_min:
            self.relax(ptr, "minProperties", f"at least {low} members are written (counted), but {_MIN_OVER_EXTRA_KEYS}")
        return self.object_regex(members, extra, low >= 1 and num_required == 0, ptr,
                                 counted=(low if needs_min else 0, high))

    def all_of_validator(self, schemas: list):
        """is_valid of the allOf of `schemas` (the root's definitions beside it for its $refs)."""
        probe: dict = {"allOf": _unmarked(schemas)}
        for defs in ("$defs", "definitions"):
            if isinstance(self.root, dict) and defs in self.root:
                probe[defs] = self.root[defs]
        return rs_validator(probe).is_valid

    def blocked_names(self, schema: dict, names: list[str], ptr: str) -> list[str]:
        """The declared (or required) names that fail propertyNames (one that cannot be told
        leaves propertyNames relaxed)."""
        if "propertyNames" not in schema:
            return []
        verdicts = {name: self.name_valid(schema["propertyNames"], name) for name in names}
        if None in verdicts.values():
            self.relax(ptr, "propertyNames", "a declared name could not be checked against it")
        return [name for name, ok in verdicts.items() if ok is False]

    def name_valid(self, names: object, name: str) -> bool | None:
        """Whether `name` satisfies the propertyNames schema `names` (None: cannot tell)."""
        probe = dict(names) if isinstance(names, dict) else names
        for defs in ("$defs", "definitions"):
            if isinstance(probe, dict) and isinstance(self.root, dict) and defs in self.root:
                probe.setdefault(defs, self.root[defs])
        try:
            return rs_validator(_unmarked(probe)).is_valid(name)
        except Exception:  # noqa: BLE001 - an unresolvable $ref: the keyword stays relaxed
            return None

    def extra_key(self, schema: dict, declared: list[str], ptr: str) -> str | None:
        """The key of an undeclared member: none of `declared`, and under propertyNames (an
        enum's other names, or its string schema when no declared name meets it; else relaxed)."""
        anything = '"' + _string_not_in(declared) + '"'
        if "propertyNames" not in schema:
            return anything
        names = self.names_target(schema["propertyNames"], ptr)
        how = extra_keys(names, declared, self.name_valid)
        if how is True:
            return anything
        if isinstance(how, tuple):  # ("not_in", names): none of the declared names nor of these
            return '"' + _string_not_in([*declared, *how[1]]) + '"'
        if isinstance(how, list):
            return _alternation([json_literal(name, self.options) for name in how])
        if isinstance(how, dict):
            return self.convert(how, pointer_join(ptr, "propertyNames"))
        body = self.names_body(names, declared, ptr)
        if body is not None:
            return '"' + body + '"'
        self.relax(ptr, "propertyNames", "undeclared keys are not written under it (a declared name "
                   "meets it, or it is not a string schema of pattern/length/format/enum, nor one automaton)")
        return anything

    def names_body(self, names: object, declared: list[str], ptr: str) -> str | None:
        """An undeclared key's body under a propertyNames schema of patterns, literals and lengths
        under not/oneOf/anyOf/allOf (JsonSchemaStore ansible-lint: a oneOf of an enum and a pattern),
        less the declared names, as one string automaton (schema/regular.py); None where it is not
        one exactly (a length bound left for a counter, past the caps, no key at all)."""
        if self.regular_work.left <= 0:
            return None
        whole = {"type": "string", "allOf": [names, *([{"not": {"enum": declared}}] if declared else [])]}
        try:
            found = string_body(whole, lambda ref: self.resolve(ref, ptr)[0], self.ref_siblings_ignored,
                                self.deadline, self.regular_work)
        except RegularUnsupported:
            return None
        if found.body is None or found.narrowed or found.max_length is not None or found.min_length > MAX_FOLDED_LENGTH:
            return None
        return found.body

    def names_target(self, names: object, ptr: str) -> object:
        """A propertyNames schema, position marks taken out, with its `$ref`s followed while nothing
        but annotations stands beside them (or siblings are ignored, drafts 4-7):
        `{"$ref": "#/definitions/direction"}` is read as the enum it points to."""
        names = _unmarked(names)
        for _ in range(_MAX_NAME_REFS):
            if not isinstance(names, dict) or not isinstance(names.get("$ref"), str):
                break
            if not self.ref_siblings_ignored and any(k != "$ref" and not is_annotation(k) for k in names):
                break
            try:
                names = _unmarked(self.resolve(names["$ref"], ptr)[0])
            except (SchemaError, UnsupportedSchema):
                break
        return names

    def check_property_counts(self, schema: dict, num_required: int, num_declared: int,
                              has_extra: bool, ptr: str) -> None:
        enumerated = (f"declared properties are counted by enumerating their in-order selections: past {MAX_OPTIONAL} "
                      "optional ones, or with any_property_order, they are not (the validator checks it)")
        low = schema.get("minProperties", 0)
        if low > max(num_required, 1 if low == 1 else 0):
            self.relax(ptr, "minProperties", _MIN_OVER_EXTRA_KEYS if has_extra else enumerated)
        high = schema.get("maxProperties")
        if high is not None and (has_extra or num_declared > high):
            if not has_extra:
                why = enumerated
            elif num_declared > high:
                why = f"{num_declared} declared properties, past maxProperties {high}, beside undeclared keys: not counted"
            else:
                why = None  # counters off, or counted arrays and objects nested MAX_ITEM_DEPTH deep
            self.relax(ptr, "maxProperties", why)

    def extra_member(self, schema: dict, extra_schema: object, declared: list[str], ptr: str,
                     shaped: bool = True) -> str | None:
        """One undeclared member (key none of `declared`: no duplicate of a declared key), or None.

        A free-form object (nothing declared, or only names declared `false`, as a negated
        `required` writes them) and one whose `additionalProperties` is written out (true or a
        schema) take extra keys; other objects (`shaped`: some declared property may be written)
        close by policy (options.allow_additional_properties). Extra keys follow the declared ones.
        """
        if extra_schema is False or self.closed_by_policy(schema, declared, shaped):
            return None
        value = self.convert(extra_schema, pointer_join(ptr, "additionalProperties"))
        key = self.extra_key(schema, declared, ptr)
        if value is None or key is None:
            return None
        return f"{_group(key)}{self.ws}:{self.ws}{_group(value)}"

    def closed_by_policy(self, schema: dict, declared: list, shaped: bool) -> bool:
        """Whether an object of `schema` writes no undeclared key by policy: it declares names, some may
        be written (`shaped`), and additionalProperties is not written out (options may open it)."""
        return bool(declared) and shaped and not ("additionalProperties" in schema or
                                                  self.options.allow_additional_properties)

    def pattern_members(self, schema: dict, declared: list[str], extra_schema: object, ptr: str) -> list[str]:
        """The undeclared members of an object with patternProperties: a key takes the schema of
        every pattern that finds it, a key no pattern finds takes additionalProperties (written
        where it is explicit, or objects are open by option; else such keys are closed by policy).

        One pattern whose translation writes only matching keys (bounds above max_bounded_length
        lowered to it) and finds no declared name is one member. Otherwise the keys are split
        into atoms by the patterns they match (schema/pattern_keys.py), each atom's value the
        allOf of its patterns' schemas; where that split is past its caps, the exactly
        translated patterns that find no declared name are members and patternProperties is
        listed as relaxed (the others are left out: stricter). Beside `propertyNames` (read as a
        string expression) every undeclared key meets it too.
        """
        patterns = schema.get("patternProperties") or {}
        names = None  # propertyNames as a string expression (schema/regular.py): every key meets it
        if "propertyNames" in schema:
            try:
                names = _Reader(lambda ref: self.resolve(ref, ptr)[0], self.ref_siblings_ignored).expr(
                    _unmarked(schema["propertyNames"]))
            except RegularUnsupported:
                self.relax(ptr, "patternProperties", "keys matching a pattern are not written beside a "
                           "propertyNames that is not a string schema of pattern/length/enum")
                return []
        with_rest = extra_schema is not False and (
            "additionalProperties" in schema or self.options.allow_additional_properties)
        if len(patterns) == 1 and not with_rest and names is None:
            (pattern, sub), = patterns.items()
            key = self.counted_key(pattern, declared)
            body = self.pattern_key_body(pattern, declared) if key is None else None
            if key is not None or body is not None:
                value = self.convert(sub, pointer_join(ptr, "patternProperties", pattern))
                key = key if key is not None else f'"{_group(body)}"'
                return [] if value is None else [f'{key}{self.ws}:{self.ws}{_group(value)}']
        try:
            split = key_atoms(tuple(patterns), tuple(declared), with_rest, self.deadline, names)
        except KeysNotWritten:
            if names is not None:
                self.relax(ptr, "patternProperties", "keys matching a pattern are not written beside propertyNames "
                           "(the keys do not split within the caps)")
                return []
            return self.pattern_members_relaxed(patterns, declared, ptr, with_rest)
        if not split.is_exact:
            self.narrowed[(ptr, "patternProperties")] = ("keys a pattern may or may not match (an approximate "
                                                          "translation, or `$` before a final newline) are not written")
        names = list(patterns)
        members = []
        for atom in split.atoms:
            if atom.patterns:
                subs = [_at(patterns[names[i]], pointer_join(ptr, "patternProperties", names[i]))
                        for i in sorted(atom.patterns)]
                value = self.convert(subs[0] if len(subs) == 1 else {"allOf": subs}, ptr)
            else:
                value = self.convert(extra_schema, pointer_join(ptr, "additionalProperties"))
            if value is not None:
                members.append(f"{atom.key}{self.ws}:{self.ws}{_group(value)}")
        return members

    def pattern_members_relaxed(self, patterns: dict, declared: list[str], ptr: str, with_rest: bool = False) -> list[str]:
        """One member per pattern whose keys the grammar writes exactly and that finds no declared
        name; patternProperties listed as relaxed (keys matching two patterns, left-out ones).
        Patterns that no key matches two of (patterns_disjoint: `^name$` literals, distinct
        prefixes) are exact members side by side: then only a pattern left out is listed, and the
        keys no pattern matches, which are not written here, are listed as narrowed."""
        members: list[str] = []
        for pattern, sub in patterns.items():
            body = self.pattern_key_body(pattern, declared)
            value = None if body is None else self.convert(sub, pointer_join(ptr, "patternProperties", pattern))
            if value is not None:
                members.append(f'"{_group(body)}"{self.ws}:{self.ws}{_group(value)}')
        if len(patterns) > 1 and not self.patterns_disjoint(list(patterns)):
            self.relax(ptr, "patternProperties", "a key matching two patterns must satisfy both schemas")
        elif len(members) < len(patterns):
            self.relax(ptr, "patternProperties", "the pattern has no exact translation or matches a declared name "
                       "(its keys are not written)")
        elif with_rest:
            self.narrowed[(ptr, "additionalProperties")] = ("keys that no pattern of patternProperties matches are "
                                                            "not written (the keys do not split within the caps)")
        return members

    def patterns_disjoint(self, patterns: list[str]) -> bool:
        """Whether no string is found by two of `patterns` under either validator: each pair's
        conjunction is empty in its upper reading (one string automaton over them all)."""
        if len(patterns) > MAX_DISJOINT_PATTERNS:
            return False
        try:
            automaton = StringAutomaton(("any", [("pat", p) for p in patterns]), self.deadline)
            for a, b in itertools.combinations(patterns, 2):
                _, both = automaton.build(("all", [("pat", a), ("pat", b)]), lower=False, upper=True)
                if not automaton.is_empty(both):
                    return False
        except RegularUnsupported:
            return False
        return True

    def counted_key(self, pattern: str, declared: list[str]) -> str | None:
        """A key pattern that is one anchored, quantified character set (`^.{1,256}$`) and finds no
        declared name, as a counted string (its length exact at any size, one state for the body),
        or None. Short runs are spelled out, as run_string does for values."""
        run = counted_run(pattern) if self.options.counted_lengths else None
        if run is None:
            return None
        char, low, high = run
        if (low <= 1 and high is None) or (high is not None and (high <= _MATERIALISED_RUN or low > high)):
            return None
        try:
            if any(re.search(pattern, name) for name in declared):
                return None
        except re.error:
            return None
        return counted_string_regex(low, high, char)

    def pattern_key_body(self, pattern: str, declared: list[str]) -> str | None:
        try:
            translated = translate_pattern(pattern, self.options.max_bounded_length, narrow=True)
            self.check_blowup(pattern, translated.regex, "")
            if any(re.search(pattern, name) for name in declared):
                # a key could repeat a declared name; a pattern that finds every string (".*")
                # takes any other key instead (the complement of the declared names)
                return _string_not_in(declared) if _finds_every_string(pattern) else None
        except (PatternUnsupported, re.error):
            return None
        return translated.regex if translated.is_subset else None  # stricter keys are fine

    def object_regex(self, members: list[tuple[str, bool]], extra: str | None, nonempty: bool,
                     ptr: str, counted: tuple[int, int] | None = None) -> str | None:
        """`{...}` with the members in order (optional ones maybe), then extras, comma-separated.

        The optional members before the first required one (and the extras, when nothing is
        required) form a run written by `_any_subset`; from the first required member on, each
        member is one flat `sep m` or `(?:sep m)?`, and the extras `(?:sep extra)*`. With
        `counted` (the members' low and high bounds), the braces and separators carry item marks
        (counted_object).
        """
        mark = "" if counted is None else "".join(f"\\x{b:02x}" for b in count_mark(ITEM_MARK, *counted))
        sep = f"{self.ws},{'' if counted is None else _ITEM_MARK_TEXT}{self.ws}"
        lb, rb = f"\\{{{mark}{self.ws}", f"{self.ws}\\}}{mark}"
        if self.options.any_property_order and extra is None and 2 <= len(members) <= MAX_ANY_ORDER:
            written = self.check_size(_any_order(members, sep), ptr, "properties")
            if any(req for _, req in members) or nonempty:
                return f"{lb}{written}{rb}"
            return f"{lb}(?:{written}{self.ws})?\\}}{mark}"
        first_required = next((i for i, (_, req) in enumerate(members) if req), None)
        if first_required is None:
            run = [(m, f"(?:{sep}{m})?") for m, _ in members]
            if extra is not None:
                run.append((f"{extra}(?:{sep}{extra})*", f"(?:{sep}{extra})*"))
            if not run:
                return None if nonempty else f"{lb}\\}}{mark}"
            written = self.check_size(_any_subset(run), ptr, "properties")
            if nonempty:
                return f"{lb}{written}{rb}"
            return f"{lb}(?:{written}{self.ws})?\\}}{mark}"
        run = [(m, f"(?:{sep}{m})?") for m, _ in members[:first_required]]
        written = members[first_required][0]
        if run:
            written = f"(?:{_any_subset(run)}{sep})?{written}"
        for regex, is_required in members[first_required + 1:]:
            written += f"{sep}{regex}" if is_required else f"(?:{sep}{regex})?"
            self.check_size(written, ptr, "properties")
        if extra is not None:
            written += f"(?:{sep}{extra})*"
        self.check_size(written, ptr, "properties")
        return f"{lb}{written}{rb}"


MAX_DISJOINT_PATTERNS = 32  # patternProperties checked pairwise for disjointness (pattern_members_relaxed)

_MIN_OVER_EXTRA_KEYS = ("minProperties over undeclared keys counts distinct keys: a finite automaton cannot tell a "
                        "repeated key from a new one (the validator checks it)")

# options.any_property_order permutes objects of at most this many declared members and no
# extra keys (the regex holds each member about e * n! / n times); larger ones keep declared order.
MAX_ANY_ORDER = 4


def _any_order(members: list[tuple[str, bool]], sep: str) -> str:
    """Regex for the members in any order: each at most once, every required one present."""
    branches = []
    for i, (regex, _) in enumerate(members):
        rest = members[:i] + members[i + 1:]
        if not rest:
            branches.append(regex)
            continue
        after = f"{sep}{_any_order(rest, sep)}"
        branches.append(regex + (after if any(req for _, req in rest) else f"(?:{after})?"))
    return _group("|".join(_group(b) for b in branches)) if len(branches) > 1 else branches[0]


# Past this many members a run is split in halves (regex nesting O(log n), not O(n): the
# regex parser of outlines-core stops at a nesting depth of 250, "error building NFA").
_LINEAR_RUN = 16


def _any_subset(run: list[tuple[str, str]]) -> str:
    """Regex for every non-empty in-order selection of `run`'s items, comma-separated.

    Each item is (written first, written after another item: with its separator). Short runs
    nest left to right (each item appears at most twice); long ones split in halves: a
    selection starts in the left half (then any of the right half follows) or in the right.
    """
    if len(run) <= _LINEAR_RUN:
        written = run[0][0]
        for first, after in run[1:]:
            written = f"(?:{written}{after}|{first})"
        return written
    half = len(run) // 2
    left, right = run[:half], run[half:]
    tail = "".join(after for _, after in right)
    return f"(?:{_any_subset(left)}{tail}|{_any_subset(right)})"


def _additional_scope_lost(own: dict, other: dict) -> bool:
    """Whether merging loses where `own`'s additionalProperties applies: `other` brings patterns
    `own` does not have, and a key they find but none of `own`'s names or patterns do must meet
    `own`'s additionalProperties, which the merged dict (one set of patterns) cannot say."""
    extra = own.get("additionalProperties", True)
    if extra is True or extra == {}:
        return False
    mine = own.get("patternProperties", {})
    return any(p not in mine for p in other.get("patternProperties", {}))


def _localize_additional(own: dict, other: dict) -> dict:
    """`own` with its additionalProperties written out for the names `other` declares or either requires.

    additionalProperties covers the names its own branch neither declares nor matches by
    pattern; once two allOf branches merge their properties that scope is lost, so each name
    the merge declares (or requires) that `own` leaves to additionalProperties gets it explicitly.
    """
    extra = own.get("additionalProperties", True)
    if extra is True:
        return own
    declared = own.get("properties", {})
    patterns = own.get("patternProperties", {})
    names = [*other.get("properties", {})]
    for side in (own, other):
        if isinstance(side.get("required"), list):
            names += side["required"]
    added = {n: extra for n in dict.fromkeys(names) if n not in declared and not _pattern_schemas(patterns, n)}
    return {**own, "properties": {**declared, **added}} if added else own


def _localize_items(own: dict, other: dict) -> dict:
    """`own` with its `items` (what follows its own prefixItems) written out at the positions that
    `other`'s longer prefixItems declares: once two allOf branches merge, `items` would otherwise
    apply only after the longer prefix (JSON-Schema-Test-Suite: "prefixItems in allOf does not
    constrain items"). The tuple `items` of drafts 4-7 does not merge with another form
    (merge_keyword refuses it), so only the 2020-12 form is written out here."""
    theirs, ours = other.get("prefixItems"), own.get("prefixItems", [])
    rest = own.get("items", True)
    if not isinstance(theirs, list) or not isinstance(ours, list) or rest is True or isinstance(rest, list) \
            or len(theirs) <= len(ours):
        return own
    return {**own, "prefixItems": [*ours, *([rest] * (len(theirs) - len(ours)))]}


_ALTERNATIVE_KEYWORDS = ("anyOf", "oneOf", "if", "not", "dependencies", "dependentRequired", "dependentSchemas")


def _both_origins(first: str | tuple | None, second: str | tuple) -> tuple:
    """The places a merged keyword came from (None: the node's own pointer), each once."""
    def parts(x):
        return x if isinstance(x, tuple) else (x,)

    return tuple(dict.fromkeys((*parts(first), *parts(second))))


def _one_of_kept(branches: list, origin) -> dict:
    """`{"oneOf": branches}` kept whole inside a distributed allOf, listed (if relaxed) where it was written."""
    return {"oneOf": branches} if origin is None else {"oneOf": branches, _FROM: {"oneOf": origin}}


def _at(sub: object, pointer: str) -> object:
    """`sub` marked with the pointer it was written at (an existing mark is kept)."""
    return {**sub, _AT: pointer} if isinstance(sub, dict) and _AT not in sub else sub


def _mark_children(sub: dict, ptr: str) -> dict:
    """`sub` (written at `ptr`) with its direct subschemas marked, so they keep their pointers once merged."""
    out = dict(sub)
    for key in ("additionalProperties", "items", "additionalItems", "contains", "propertyNames"):
        if isinstance(out.get(key), dict):
            out[key] = _at(out[key], pointer_join(ptr, key))
    for key in ("items", "prefixItems", "anyOf", "oneOf"):
        if isinstance(out.get(key), list):
            out[key] = [_at(s, pointer_join(ptr, key, i)) for i, s in enumerate(out[key])]
    for key in ("properties", "patternProperties"):
        if isinstance(out.get(key), dict):
            out[key] = {n: _at(s, pointer_join(ptr, key, n)) for n, s in out[key].items()}
    return out


def _unmarked(value: object) -> object:
    if isinstance(value, dict):
        return {k: _unmarked(v) for k, v in value.items() if k not in (_AT, _FROM)}
    return [_unmarked(v) for v in value] if isinstance(value, list) else value


def _pattern_schemas(pattern_properties: dict, name: str, ptr: str = "") -> list:
    """Schemas of the patternProperties whose pattern finds `name` (Python re approximates ECMA), marked."""
    found = []
    for pattern, sub in pattern_properties.items():
        try:
            hit = re.search(pattern, name) is not None
        except re.error:
            hit = True  # patternProperties is relaxed and listed: the validator decides
        if hit:
            found.append(_at(sub, pointer_join(ptr, "patternProperties", pattern)))
    return found


def _finds_every_string(pattern: str) -> bool:
    """Whether a (translatable) pattern finds a match in every string: it matches the empty string
    at the start and has no `$` (so the empty match at position 0 is there whatever follows)."""
    return "$" not in pattern and re.match(pattern, "") is not None


_MAX_NAME_REFS = 8  # $ref hops names_target follows


def _string_not_in(names: list[str]) -> str:
    """String body whose value is none of `names`: a complement over their trie (pattern_keys.py)."""
    return string_not_in(tuple(names))


def _array_items(schema: dict, ptr: str) -> tuple[list, object, str]:
    """(prefix item schemas, schema of the rest, its pointer) across drafts."""
    items = schema.get("items", True)
    if isinstance(items, list):  # draft 4-7 tuple form
        return items, schema.get("additionalItems", True), pointer_join(ptr, "additionalItems")
    return list(schema.get("prefixItems", [])), items, pointer_join(ptr, "items")


def _integer_bounds(schema: dict) -> tuple[int | None, int | None]:
    low = high = None
    if "minimum" in schema:
        low = math.ceil(schema["minimum"])
        if schema.get("exclusiveMinimum") is True and low == schema["minimum"]:
            low += 1
    if "maximum" in schema:
        high = math.floor(schema["maximum"])
        if schema.get("exclusiveMaximum") is True and high == schema["maximum"]:
            high -= 1
    ex_low, ex_high = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if not isinstance(ex_low, bool) and ex_low is not None:
        bound = math.floor(ex_low) + 1
        low = bound if low is None else max(low, bound)
    if not isinstance(ex_high, bool) and ex_high is not None:
        bound = math.ceil(ex_high) - 1
        high = bound if high is None else min(high, bound)
    return low, high


def _separated(extra: dict) -> dict:
    """The schema objects_one_of adds to a branch: the names it leaves out and those it requires."""
    out: dict = {}
    if extra.get("forbid"):
        out["properties"] = {name: False for name in dict.fromkeys(extra["forbid"])}
    if extra.get("require"):
        out["required"] = list(dict.fromkeys(extra["require"]))
    return out


def _constants(schema: object) -> list | None:
    """The values a const/enum schema allows (None: not a constant schema)."""
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return [schema["const"]]
    return list(schema["enum"]) if isinstance(schema.get("enum"), list) else None


# A pattern that finds one string only, anchored at both ends: `^Abs$`, `^v1\.0$` (letters, digits,
# a few plain punctuation marks, and escaped metacharacters).
_LITERAL_PATTERN = re.compile(r"\^((?:[A-Za-z0-9_ ,:;'\"!@#%&=<>/~`-]|\\[.^$|?*+()\[\]{}\\/-])*)\$")


def _written_constants(schema: object) -> list | None:
    """The values the grammar writes for `schema` when they are a known finite list: its const/enum,
    or the one string of a literal pattern (`{"type": "string", "pattern": "^Abs$"}` writes only
    "Abs": `$` is read as the end of the text, as ECMA-262 and `re` agree). None otherwise."""
    values = _constants(schema)
    if values is not None or not isinstance(schema, dict) or schema.get("type") not in ("string", ["string"]):
        return values
    pattern = schema.get("pattern")
    match = _LITERAL_PATTERN.fullmatch(pattern) if isinstance(pattern, str) else None
    if match is None or any(k not in _STRING_KEYS and k not in ("type", _AT, _FROM) and not is_annotation(k)
                             for k in schema):
        return None
    return [re.sub(r"\\(.)", r"\1", match.group(1))]


def _negated_types(not_schema: object) -> set[str] | None:
    """The types a `not: {type: ...}` schema excludes (None: not of that simple form)."""
    if not isinstance(not_schema, dict) or "type" not in not_schema:
        return None
    if any(k in _ASSERTING for k in not_schema if k != "type"):
        return None
    declared = not_schema["type"]
    return {declared} if isinstance(declared, str) else set(declared)


def _is_integral(value: object) -> bool:
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


# Fraction digits a number bound may carry to be written (0.0167 has 4); a longer one is relaxed.
MAX_BOUND_FRACTION_DIGITS = 12


def _short_decimal(value: object) -> bool:
    """Whether a bound is a finite number of at most MAX_BOUND_FRACTION_DIGITS fraction digits."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value) and fraction_digits(_decimal(value)) <= MAX_BOUND_FRACTION_DIGITS


def _decimal(value: int | float) -> Decimal:
    """A bound as the decimal it is written as (a float by its shortest repr: 0.1 is 0.1)."""
    return Decimal(value) if isinstance(value, int) else Decimal(repr(value))


def _number_bounds(schema: dict) -> tuple[tuple[Decimal | None, bool], tuple[Decimal | None, bool]]:
    """((low, is_exclusive), (high, is_exclusive)) across drafts (draft 4 boolean exclusives), as decimals."""
    low = high = None
    low_excl = high_excl = False
    if "minimum" in schema:
        low, low_excl = _decimal(schema["minimum"]), schema.get("exclusiveMinimum") is True
    if "maximum" in schema:
        high, high_excl = _decimal(schema["maximum"]), schema.get("exclusiveMaximum") is True
    ex_low, ex_high = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if ex_low is not None and not isinstance(ex_low, bool) and (low is None or _decimal(ex_low) >= low):
        low, low_excl = _decimal(ex_low), True
    if ex_high is not None and not isinstance(ex_high, bool) and (high is None or _decimal(ex_high) <= high):
        high, high_excl = _decimal(ex_high), True
    return (low, low_excl), (high, high_excl)


def _number_bounds_overlap(schema: dict) -> bool:
    """Whether the schema's own bounds leave any number (before the clamp to LARGEST_INTEGER)."""
    (low, low_excl), (high, high_excl) = _number_bounds(schema)
    return low is None or high is None or low < high or (low == high and not (low_excl or high_excl))


def _json_equal(a: object, b: object) -> bool:
    """JSON equality: key order ignored, 1 == 1.0 (JSON Schema compares numbers by value)."""
    return canonical_json(_unmarked(a)) == canonical_json(_unmarked(b))


def _algebra_keyword(schema: dict) -> str:
    """The keyword that made `schema` need the string/number automaton (for the narrowed list)."""
    return next((k for k in ("not", "oneOf", "anyOf", "allOf", "if", "$ref") if k in schema), "pattern")


def ordered_partitions(items: list) -> list[list[list]]:
    """Every sequence of non-empty disjoint blocks whose union is `items` (the first witnesses of
    several `contains`, in the order they appear)."""
    if not items:
        return [[]]
    out = []
    for mask in range(1, 1 << len(items)):
        block = [x for i, x in enumerate(items) if mask >> i & 1]
        rest = [x for i, x in enumerate(items) if not mask >> i & 1]
        out += [[block, *tail] for tail in ordered_partitions(rest)]
    return out
