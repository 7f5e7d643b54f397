"""Objects whose `not` asks for keys to exist, written exactly: key classes and a small member automaton.

`ObjectReader` reads an object schema (through allOf/anyOf/$ref/not) as a union of terms, each
universal rules "every key of class C has a value in V" (properties, patternProperties with
their own additionalProperties, propertyNames), existentials "some key of class E has a value
in W" (what `not` of those keywords, or `required`, means) and a property count range.
`exists_object_regex` partitions the keys of each term into atoms (key classes as one DFA,
schema/string_automaton.py), lets each member credit the existentials it meets, walks the
states (existentials met, member count) and writes them as a regex with JSON whitespace; keys
may come in any order. Values are converted by the Converter. It takes over only where an
object-level `not` is not negated by schema/conditionals.py, and answers False (the converter
relaxes as before) past its caps or on any keyword it does not read. Duplicate keys are not told
apart (as for the converter's extra keys): a repeated key counts as one more member. Over 400
lines: reading the schema into terms and writing a term's automaton are one pipeline.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from surecall.grammars.schema.keywords import is_undefined
from surecall.grammars.schema.regular import _Reader
from surecall.grammars.schema.string_automaton import (
    RegularUnsupported,
    StringAutomaton,
    _coreachable,
)

MAX_LOOKED = 64  # subschemas needs_exists looks at (it runs on every node the converter reads)
MAX_TERMS = 32  # branches of the union one object schema reads as
MAX_ATOMS = 48  # key classes of one term
MAX_CREDITING = 4  # existentials with a value condition one key class may meet together (2^n members)
MAX_STATES = 256  # (existentials met, count) states of one term
MAX_COUNT = 32  # maxProperties counted exactly (past it: not taken over)
MAX_LISTED = 256  # integers a member value's bounds may leave to be written out (listed_integers)
MAX_REGEX_CHARS = 400_000  # the object's regex written out
_IGNORED = {"title", "description", "$comment", "comment", "examples", "default", "$schema", "$id", "id",
            "definitions", "$defs", "deprecated", "readOnly", "writeOnly", "markdownDescription",
            "$surecall:at", "$surecall:from", "$surecall:kept_at", "$anchor"}
_OTHER_TYPE_KEYS = {"items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems", "contains",
                    "minContains", "maxContains", "minLength", "maxLength", "pattern", "format", "minimum",
                    "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "contentEncoding",
                    "contentMediaType"}
_TRIGGERS = ("propertyNames", "patternProperties", "additionalProperties", "minProperties", "maxProperties")


def _is_annotation(key: str) -> bool:
    """A key read as asserting nothing: a known annotation, or one no draft defines (keywords.py)."""
    return key in _IGNORED or is_undefined(key)


class NotExact(Exception):
    """The object schema is not written exactly here (the message says why)."""


@dataclass
class Term:
    """One branch: every key in rules[i][0] has a value in rules[i][1]; for each exists[j] some key in
    its class has a value in its schema; lo <= number of members <= hi."""

    rules: list = field(default_factory=list)  # (key class expr, value schema)
    exists: list = field(default_factory=list)  # (key class expr, value schema)
    lo: int = 0
    hi: int | None = None

    def merged(self, other: Term) -> Term | None:
        hi = other.hi if self.hi is None else self.hi if other.hi is None else min(self.hi, other.hi)
        lo = max(self.lo, other.lo)
        if hi is not None and lo > hi:
            return None
        exists = list({_key(e): e for e in [*self.exists, *other.exists]}.values())
        return Term([*self.rules, *other.rules], exists, lo, hi)


def _key(item) -> str:
    return json.dumps(item, sort_keys=True, default=str)


def needs_exists(schema: object, resolve: Callable[[str], object]) -> bool:
    """Whether an object-level `not` sits in `schema` (through allOf/anyOf/$ref, at most
    MAX_LOOKED subschemas looked at): the cases taken over."""
    todo, seen = [(schema, False)], set()
    while todo and len(seen) < MAX_LOOKED:
        sub, under_not = todo.pop()
        if not isinstance(sub, dict) or (id(sub), under_not) in seen:
            continue
        seen.add((id(sub), under_not))
        if under_not and any(k in sub for k in _TRIGGERS):
            return True
        todo += [(s, under_not) for k in ("allOf", "anyOf") if isinstance(sub.get(k), list) for s in sub[k]]
        todo += [(sub["not"], True)] if isinstance(sub.get("not"), dict) else []
        if isinstance(sub.get("$ref"), str):
            try:
                todo.append((resolve(sub["$ref"]), under_not))
            except Exception:  # noqa: BLE001 - the converter reports the reference
                return False
    return False


class ObjectReader:
    """An object schema as a union of Terms (NotExact on what it does not read)."""

    def __init__(self, resolve: Callable[[str], object], ref_rest: Callable[[dict], dict], siblings_ignored: bool):
        self.resolve = resolve
        self.ref_rest = ref_rest
        self.names = _Reader(resolve, siblings_ignored)  # propertyNames schemas as string expressions
        self.depth = 0

    def admits_non_objects(self, schema: object) -> bool:
        """Whether a value that is not an object may be valid (only type, object keywords and combinators read)."""
        if isinstance(schema, bool):
            return schema
        parts = []
        for key, value in schema.items():
            if key == "type":
                types = [value] if isinstance(value, str) else list(value)
                parts.append(any(t != "object" for t in types))
            elif key == "not":
                parts.append(not self.admits_non_objects(value))
            elif key == "allOf":
                parts.append(all(self.admits_non_objects(s) for s in value))
            elif key == "anyOf":
                parts.append(any(self.admits_non_objects(s) for s in value))
            elif key == "$ref":
                parts.append(self.admits_non_objects(self.resolve(value)))
        return all(parts)

    def positive(self, schema: object) -> list[Term]:
        if schema is True:
            return [Term()]
        if schema is False:
            return []
        if not isinstance(schema, dict):
            raise NotExact(f"expected a schema, got {type(schema).__name__}")
        self.enter()
        try:
            if "$ref" in schema:
                return self.conjoined([self.resolve(schema["$ref"]), self.ref_rest(schema)], self.positive)
            out = [Term()]
            for key, value in schema.items():
                out = self.conjoin(out, self.keyword(schema, key, value))
                if not out:
                    return []
            return out
        finally:
            self.depth -= 1

    def negative(self, schema: object) -> list[Term]:
        """The objects `schema` rejects: one disjunct per keyword."""
        if schema is True:
            return []
        if schema is False:
            return [Term()]
        if not isinstance(schema, dict):
            raise NotExact(f"expected a schema, got {type(schema).__name__}")
        self.enter()
        try:
            if "$ref" in schema:
                return self.negative({"allOf": [self.resolve(schema["$ref"]), self.ref_rest(schema)]})
            out: list[Term] = []
            for key, value in schema.items():
                out += self.negated_keyword(schema, key, value)
                self.check_terms(out)
            return out
        finally:
            self.depth -= 1

    def enter(self) -> None:
        self.depth += 1
        if self.depth > 24:
            raise NotExact("references nest too deeply")

    def conjoin(self, left: list[Term], right: list[Term]) -> list[Term]:
        out = [m for a in left for b in right if (m := a.merged(b)) is not None]
        self.check_terms(out)
        return out

    def conjoined(self, schemas: list, read) -> list[Term]:
        out = [Term()]
        for sub in schemas:
            out = self.conjoin(out, read(sub))
        return out

    def check_terms(self, terms: list) -> None:
        if len(terms) > MAX_TERMS:
            raise NotExact(f"the object schema crosses into more than {MAX_TERMS} branches")

    def key_class(self, names_schema: object) -> object:
        try:
            return self.names.expr(names_schema)
        except RegularUnsupported as exc:
            raise NotExact(f"propertyNames is not read as a key class: {exc}") from exc

    def keyword(self, schema: dict, key: str, value: object) -> list[Term]:
        if _is_annotation(key) or key in _OTHER_TYPE_KEYS:
            return [Term()]
        if key == "type":
            types = [value] if isinstance(value, str) else list(value)
            return [Term()] if "object" in types else []
        if key == "propertyNames":
            return [Term(rules=[(("not", self.key_class(value)), False)])]
        if key in ("properties", "patternProperties", "additionalProperties"):
            return [Term(rules=[rule for rule in member_rules(schema, key)])]
        if key == "required":
            return [Term(exists=[(("lit", (name,)), True) for name in dict.fromkeys(value)])]
        if key in ("minProperties", "maxProperties"):
            bound = _natural(value, key)
            return [Term(lo=bound)] if key == "minProperties" else [Term(hi=bound)]
        if key == "allOf":
            return self.conjoined(value, self.positive)
        if key == "anyOf":
            out = [t for sub in value for t in self.positive(sub)]
            self.check_terms(out)
            return out
        if key == "not":
            return self.negative(value)
        raise NotExact(f"{key!r} is not read beside an object-level not")

    def negated_keyword(self, schema: dict, key: str, value: object) -> list[Term]:
        if _is_annotation(key) or key in _OTHER_TYPE_KEYS:
            return []  # holds for every object: its negation for none
        if key == "type":
            types = [value] if isinstance(value, str) else list(value)
            return [] if "object" in types else [Term()]
        if key == "propertyNames":
            return [Term(exists=[(("not", self.key_class(value)), True)])]
        if key in ("properties", "patternProperties", "additionalProperties"):
            return [Term(exists=[(cls, _negated_value(sub))]) for cls, sub in member_rules(schema, key)
                    if sub is not True]
        if key == "required":
            return [Term(rules=[(("lit", (name,)), False)]) for name in dict.fromkeys(value)]
        if key in ("minProperties", "maxProperties"):
            bound = _natural(value, key)
            if key == "minProperties":
                return [Term(hi=bound - 1)] if bound > 0 else []
            return [Term(lo=bound + 1)]
        if key == "allOf":
            return [t for sub in value for t in self.negative(sub)]
        if key == "anyOf":
            return self.conjoined(value, self.negative)
        if key == "not":
            return self.positive(value)
        raise NotExact(f"the negation of {key!r} is not read at object level")


def member_rules(schema: dict, key: str) -> list[tuple[object, object]]:
    """The (key class, value schema) rules keyword `key` of `schema` states (additionalProperties
    relative to its own node's properties and patternProperties)."""
    if key == "properties":
        return [(("lit", (name,)), sub) for name, sub in value_items(schema, key)]
    if key == "patternProperties":
        return [(("pat", pattern), sub) for pattern, sub in value_items(schema, key)]
    others = [("lit", (name,)) for name, _ in value_items(schema, "properties")]
    others += [("pat", pattern) for pattern, _ in value_items(schema, "patternProperties")]
    return [(("not", ("any", others)), schema[key])]


def value_items(schema: dict, key: str) -> list[tuple[str, object]]:
    value = schema.get(key, {})
    if not isinstance(value, dict):
        raise NotExact(f"{key} is not an object")
    return list(value.items())


def _negated_value(sub: object) -> object:
    if isinstance(sub, bool):
        return not sub
    if isinstance(sub, dict) and "not" in sub and all(k == "not" or _is_annotation(k) for k in sub):
        return sub["not"]
    return {"not": sub}


def _natural(value: object, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or not float(value).is_integer():
        raise NotExact(f"{key} {value!r} is not a natural number")
    return int(value)


def listed_integers(schemas: list, is_valid: Callable[[int], bool]) -> str | None | bool:
    """The integers an allOf of `schemas` admits, written out, when one of them is `type: integer`
    and their bounds leave at most MAX_LISTED values (False: not such a value; None: none pass).
    For member values whose keywords the converter would relax (not: multipleOf beside bounds)."""
    low, high, is_integer = None, None, False
    todo = list(schemas)
    while todo:
        sub = todo.pop()
        if not isinstance(sub, dict):
            continue
        is_integer = is_integer or sub.get("type") == "integer"
        todo += sub.get("allOf", []) if isinstance(sub.get("allOf"), list) else []
        for key, value in sub.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if key in ("minimum", "exclusiveMinimum"):
                bound = math.floor(value) + 1 if key == "exclusiveMinimum" else math.ceil(value)
                low = bound if low is None else max(low, bound)
            elif key in ("maximum", "exclusiveMaximum"):
                bound = math.ceil(value) - 1 if key == "exclusiveMaximum" else math.floor(value)
                high = bound if high is None else min(high, bound)
    if not is_integer or low is None or high is None or high - low >= MAX_LISTED:
        return False
    passing = [str(n) for n in range(low, high + 1) if is_valid(n)]
    return "|".join(passing) if passing else None


# --- terms -> regex ---------------------------------------------------------------------------


@dataclass
class Writer:
    """What the regex needs from the Converter: values, exactness checks, whitespace."""

    value: Callable[[list], str | None]  # allOf of these value schemas -> regex (None: no value; [] any)
    exact_value: Callable[[list], str | None]  # the same, NotExact if any of it is relaxed
    ws: str
    deadline: float | None
    share: Callable[[str], str] = lambda regex: regex  # a value regex written on several edges -> its placeholder


def term_regex(term: Term, writer: Writer) -> str | None:
    """The objects of one term as a regex (None: none). Values are converted only for the
    members some accepted object uses (a class no object reaches adds no relaxed keyword)."""
    classes = [cls for cls, _ in term.rules] + [cls for cls, _ in term.exists]
    try:
        automaton = StringAutomaton(("any", classes), writer.deadline)
        members = _members(automaton, term, _atoms(automaton, term))
    except RegularUnsupported as exc:
        raise NotExact(f"the key classes are not written: {exc}") from exc
    values: dict[int, str | None] = {}
    while True:
        alive = [i for i in range(len(members)) if values.get(i, "") is not None]
        graph = _explore([members[i][2] for i in alive], len(term.exists), term.lo, term.hi)
        used = sorted({alive[m] for out in graph[1].values() for ms in out.values() for m in ms})
        todo = [i for i in used if i not in values]
        if not todo:
            break
        for i in todo:
            _, schemas, _, exact = members[i]
            values[i] = writer.exact_value(schemas) if exact else writer.value(schemas)
    if graph[0] is None:
        return None
    uses: dict[str, int] = {}
    for i in used:
        uses[values[i]] = uses.get(values[i], 0) + 1
    shared = {value: writer.share(value) if n > 1 else value for value, n in uses.items()}
    written = [(members[i][0], shared.get(values.get(i))) for i in alive]  # unused ones are on no edge
    return _written(_minimised(graph, written), writer.ws)


def _atoms(automaton: StringAutomaton, term: Term) -> list[tuple[object, frozenset]]:
    """The key classes no rule or existential tells apart: (DFA, indices of the classes it lies in),
    keys of a rule with value False left out."""
    forbidden = [cls for cls, value in term.rules if value is False]
    universe = automaton.constant(True)
    if forbidden:
        _, up = automaton.build(("any", forbidden), lower=False, upper=True)
        universe = automaton.product([universe, automaton.complement(up)], all)
    atoms = [(universe, frozenset())] if _nonempty(universe) else []
    classes = [cls for cls, _ in term.rules] + [cls for cls, _ in term.exists]
    for i, cls in enumerate(classes):
        if i < len(term.rules) and term.rules[i][1] is False:
            continue
        low, up = automaton.build(cls, lower=True, upper=True)
        outside = automaton.complement(up)
        split = []
        for dfa, inside in atoms:
            for part, bits in ((automaton.product([dfa, low], all), inside | {i}),
                               (automaton.product([dfa, outside], all), inside)):
                if _nonempty(part):
                    split.append((part, bits))
        atoms = split
        if len(atoms) > MAX_ATOMS:
            raise NotExact(f"the keys split into more than {MAX_ATOMS} classes")
    return atoms


def _nonempty(dfa) -> bool:
    return 0 in _coreachable(dfa)


def _members(automaton, term: Term, atoms) -> list[tuple[str, list, int, bool]]:
    """(key regex, value schemas, bit mask of the existentials it meets, whether the value must be
    exact) for each atom and each choice of the value-conditioned existentials its value meets."""
    num_rules = len(term.rules)
    members = []
    for dfa, inside in atoms:
        values = [term.rules[i][1] for i in sorted(inside) if i < num_rules]
        met = [i - num_rules for i in sorted(inside) if i >= num_rules]
        always = sum(1 << j for j in met if term.exists[j][1] is True)
        chosen = [j for j in met if term.exists[j][1] is not True]
        if len(chosen) > MAX_CREDITING:
            raise NotExact(f"a key class meets {len(chosen)} existentials with value conditions "
                           f"(past {MAX_CREDITING})")
        body = automaton.emit(dfa)
        if body is None:
            continue
        for size in range(len(chosen) + 1):
            for subset in itertools.combinations(chosen, size):
                schemas = values + [term.exists[j][1] for j in subset]
                members.append((f'"(?:{body})"', schemas, always | sum(1 << j for j in subset), bool(subset)))
    return members


def _explore(credits: list[int], num_exists: int, lo: int, hi: int | None) -> tuple:
    """The states (existentials met, members counted up to hi, or up to lo when open) that reach
    acceptance: (states in visit order or None when the start does not, {state: {state: [member
    index]}} between them, accepting test)."""
    if hi is not None and hi > MAX_COUNT:
        raise NotExact(f"maxProperties {hi} beside an object-level not is past {MAX_COUNT}")
    full, cap = (1 << num_exists) - 1, lo if hi is None else hi

    def accepting(state) -> bool:
        return state[0] == full and state[1] >= lo

    edges: dict = {}
    order, seen = [(0, 0)], {(0, 0)}
    for state in order:
        if hi is not None and state[1] + 1 > hi:
            continue
        for m, credit in enumerate(credits):
            nxt = (state[0] | credit, min(state[1] + 1, cap))
            edges.setdefault(state, {}).setdefault(nxt, []).append(m)
            if nxt not in seen:
                seen.add(nxt)
                order.append(nxt)
                if len(order) > MAX_STATES:
                    raise NotExact(f"the member automaton passes {MAX_STATES} states")
    live = {s for s in order if accepting(s)}
    changed = True
    while changed:
        changed = False
        for s in order:
            if s not in live and any(t in live for t in edges.get(s, {})):
                live.add(s)
                changed = True
    if (0, 0) not in live:
        return None, {}, accepting
    kept = {s: {t: ms for t, ms in edges.get(s, {}).items() if t in live} for s in order if s in live}
    return [s for s in order if s in live], kept, accepting


def _minimised(graph: tuple, members: list[tuple[str, str]]) -> tuple[dict, set]:
    """The live states merged where they accept the same continuations (Moore): (edges between
    blocks as {block: {block: {value: [keys]}}}, accepting blocks); block 0 holds the start."""
    states, edges, accepting = graph
    moves = {s: {members[m]: t for t, ms in edges[s].items() for m in ms} for s in states}
    block = {s: int(accepting(s)) for s in states}
    while True:
        signature = {s: (block[s], tuple(sorted((m, block[t]) for m, t in moves[s].items()))) for s in states}
        ids: dict = {}
        for s in states:  # numbered in order of first visit: the start's block is 0
            ids.setdefault(signature[s], len(ids))
        new = {s: ids[signature[s]] for s in states}
        if len(ids) == len(set(block.values())):
            break
        block = new
    block = new
    out: dict = {}
    for s in states:
        for (key, value), t in moves[s].items():
            keys = out.setdefault(block[s], {}).setdefault(block[t], {}).setdefault(value, [])
            if key not in keys:
                keys.append(key)
    return out, {block[s] for s in states if accepting(s)}


def _written(graph: tuple[dict, set], ws: str) -> str:
    """The member automaton as `{...}`: each block's continuations written once per way in (the
    graph is acyclic but for self-loops, as members only add to what is met and counted)."""
    edges, finals = graph
    sep = f"{ws},{ws}"
    label = {(s, t): "|".join(f"(?:{'|'.join(keys)}){ws}:{ws}(?:{value})" for value, keys in by_value.items())
             for s, out in edges.items() for t, by_value in out.items()}
    open_states: set = set()
    rest: dict = {}

    def after(s) -> str:  # what may follow once state s is reached by at least one member
        if s in open_states:
            raise NotExact("the minimised member automaton has a cycle")
        if s not in rest:
            open_states.add(s)
            loop = label.get((s, s))
            exits = [f"{sep}(?:{label[(s, t)]}){after(t)}" for t in edges.get(s, {}) if t != s]
            exits += [""] if s in finals else []
            open_states.discard(s)
            head = f"(?:{sep}(?:{loop}))*" if loop else ""
            tail = exits[0] if len(exits) == 1 else "(?:" + "|".join(exits) + ")"
            rest[s] = head + tail
            if len(rest[s]) > MAX_REGEX_CHARS:
                raise NotExact(f"the object's regex passes {MAX_REGEX_CHARS} characters")
        return rest[s]

    firsts = [f"(?:{label[(0, t)]}){after(t)}" for t in edges.get(0, {})]
    if not firsts:
        return f"\\{{{ws}\\}}"
    body = "|".join(f"(?:{f})" for f in firsts)
    if 0 in finals:
        return f"\\{{{ws}(?:(?:{body}){ws})?\\}}"
    return f"\\{{{ws}(?:{body}){ws}\\}}"


def exists_object_regex(schema: dict, reader: ObjectReader, writer: Writer) -> str | None:
    """The objects `schema` admits, exactly (NotExact: not written here; it may admit non-objects)."""
    if reader.admits_non_objects(schema):
        raise NotExact("the schema also admits values that are not objects")
    terms = reader.positive(schema)
    regexes = list(dict.fromkeys(r for r in (term_regex(t, writer) for t in terms) if r is not None))
    if not regexes:
        return None
    return regexes[0] if len(regexes) == 1 else "|".join(f"(?:{r})" for r in regexes)
