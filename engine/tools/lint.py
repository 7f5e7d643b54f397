"""Schema lint: the five rules for tool input schemas and the anti-pattern table.

Rules (R*) and anti-patterns (AP*) each have an id, a slug and a fix. A finding names the rule,
the JSON pointer of the offending subschema (nested objects, `$defs`, `items`, union branches
included: pydantic does not carry `additionalProperties: false` into nested models), a message
and a suggested fix. Each problem is reported once, under the most specific id: a free-form
string is AP2 (unbounded input), while R3 covers numbers, arrays and maps. This module reads
schemas only; it does not validate instances or change a schema.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from surecall.errors import SchemaError

# id -> (slug, what it asks for, suggested fix)
RULES: dict[str, tuple[str, str, str]] = {
    "R0": ("valid-schema", "the schema is valid under its own metaschema (`$schema`, default 2020-12)",
           "fix the keyword the metaschema rejects (a misspelt type, a wrong-typed bound)"),
    "R1": ("closed-properties", "every object declares its properties and sets additionalProperties: false",
           "add \"additionalProperties\": false"),
    "R2": ("required-complete", "every field without a default is in `required`, and `required` names declared fields",
           "add the field to \"required\" or give it a \"default\""),
    "R3": ("bounded-types", "every number, array and map has a bound",
           "add minimum/maximum (numbers), maxItems (arrays) or maxProperties (maps)"),
    "R4": ("units-in-names", "a quantity carries its unit in its name (timeout_ms, size_bytes)",
           "rename with a unit suffix such as _ms, _s, _bytes"),
    "R5": ("tagged-unions", "every branch of a union of objects has the same required `const` discriminator",
           "give every branch a required property (e.g. \"kind\") with a distinct \"const\""),
    "AP1": ("untyped-argument-bag", "a free-form object or an untyped value the model can fill with anything",
            "declare the fields (\"properties\", closed) or give the value a \"type\""),
    "AP2": ("unbounded-input", "a free-text string with no maxLength: the model can write forever",
            "add \"maxLength\" (or an enum/const)"),
    "AP3": ("untagged-union", "a union of objects with no discriminator at all",
            "add a required \"kind\" property with a distinct \"const\" per branch"),
    "AP4": ("implicit-unit", "a bare quantity name such as `timeout` or `delay`: seconds or milliseconds?",
            "rename with the unit (timeout_ms, delay_s)"),
    "AP5": ("whole-file-rewrite", "a path plus whole `content`: the model must reproduce the whole file",
            "use an exact-replacement edit (path, old_str, new_str) instead of whole-file content"),
}

_QUANTITY_WORDS = {
    "timeout", "delay", "duration", "interval", "ttl", "wait", "elapsed", "age", "period", "expiry",
    "expiration", "retention", "backoff", "latency", "sleep", "lifetime", "size", "memory", "bandwidth",
    "capacity", "quota", "distance", "radius", "height", "width", "weight", "temperature", "speed",
    "altitude", "elevation", "price", "cost", "budget", "frequency",
}
_UNIT_WORDS = {
    "ms", "millis", "milliseconds", "millisecond", "us", "ns", "s", "sec", "secs", "second", "seconds", "min",
    "mins", "minute", "minutes", "h", "hr", "hrs", "hour", "hours", "day", "days", "week", "weeks", "month",
    "months", "year", "years", "b", "byte", "bytes", "kb", "kib", "mb", "mib", "gb", "gib", "tb", "bits",
    "px", "pt", "percent", "pct", "ratio", "m", "km", "cm", "mm", "meter", "meters", "metre", "metres", "mile",
    "miles", "ft", "feet", "inch", "inches", "kg", "g", "lb", "lbs", "celsius", "fahrenheit", "kelvin", "usd",
    "eur", "cents", "mph", "kmh", "kph", "hz", "khz", "mhz", "epoch", "unix", "timestamp", "iso", "percentage",
}
_BARE_PREFIXES = {"max", "min", "default", "limit", "the"}
_PATH_NAMES = {"path", "file", "filepath", "filename", "file_path", "file_name", "target_file", "target_path"}
_CONTENT_NAMES = {"content", "contents", "file_content", "file_contents", "new_content", "file_text", "new_file_content"}
_BOUNDED_FORMATS = {"date", "date-time", "time", "uuid", "ipv4", "ipv6"}
_CHILD_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_CHILD_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_CHILD_ONE = ("additionalProperties", "items", "contains", "not", "if", "then", "else", "unevaluatedProperties", "propertyNames")


@dataclass(frozen=True)
class Finding:
    rule: str  # R0..R5 or AP1..AP5
    pointer: str  # JSON pointer into the schema ("" is the root)
    message: str
    fix: str
    tool: str | None = None

    @property
    def slug(self) -> str:
        return RULES[self.rule][0]

    def to_dict(self) -> dict:
        return {**asdict(self), "slug": self.slug}


def lint_schema(schema: Any, tool_name: str | None = None) -> list[Finding]:
    """Every finding in one tool's input schema, sorted by pointer then rule."""
    if not isinstance(schema, dict):
        return [Finding("AP1", "", f"schema is {type(schema).__name__}, not an object schema", RULES["AP1"][2], tool_name)]
    invalid = _metaschema_finding(schema, tool_name)
    if invalid is not None:
        return [invalid]  # the other rules read keywords the metaschema just refused
    findings = {(f.pointer, f.rule): f for f in _walk(schema, "", schema, tool_name)}
    return sorted(findings.values(), key=lambda f: (f.pointer, f.rule))


def _metaschema_finding(schema: dict, tool: str | None) -> Finding | None:
    """R0 when the schema breaks its metaschema (jsonschema-rs picks the draft from `$schema`)."""
    from surecall.grammars.schema.meta import checked_schema

    try:
        checked_schema(schema, what="invalid under its metaschema")
    except SchemaError as exc:
        return Finding("R0", exc.pointer, exc.reason, RULES["R0"][2], tool)
    except (ValueError, TypeError) as exc:  # a non-JSON value
        return Finding("R0", "", f"cannot check against a metaschema: {exc}", RULES["R0"][2], tool)
    return None


def lint_tools(tools: Iterable[tuple[str, Any]]) -> list[Finding]:
    """Findings over (name, schema) pairs."""
    return [f for name, schema in tools for f in lint_schema(schema, name)]


def count_by_rule(findings: Iterable[Finding]) -> dict[str, int]:
    counts = Counter(f.rule for f in findings)
    return {rule: counts.get(rule, 0) for rule in RULES}


# --- the walk ------------------------------------------------------------------------------
def _walk(node: Any, pointer: str, root: dict, tool: str | None) -> Iterator[Finding]:
    if not isinstance(node, dict):
        return
    yield from _check_node(node, pointer, root, tool)
    for key in _CHILD_MAPS:
        children = node.get(key)
        if isinstance(children, dict):
            for name, child in children.items():
                yield from _walk(child, f"{pointer}/{key}/{_esc(name)}", root, tool)
    for key in _CHILD_LISTS:
        children = node.get(key)
        if isinstance(children, list):
            for i, child in enumerate(children):
                yield from _walk(child, f"{pointer}/{key}/{i}", root, tool)
    for key in _CHILD_ONE:
        if isinstance(node.get(key), dict):
            yield from _walk(node[key], f"{pointer}/{key}", root, tool)


def _check_node(node: dict, pointer: str, root: dict, tool: str | None) -> Iterator[Finding]:
    def finding(rule: str, message: str, at: str = pointer) -> Finding:
        return Finding(rule, at, message, RULES[rule][2], tool)

    types = _types(node)
    if node.get("enum") is not None or "const" in node:
        return  # a closed set of values is bounded and typed
    if "object" in types or "properties" in node:
        yield from _check_object(node, pointer, root, finding)
    if "string" in types and "maxLength" not in node and node.get("format") not in _BOUNDED_FORMATS:
        yield finding("AP2", "string has no maxLength")
    if types & {"integer", "number"}:
        missing = [b for b, alts in (("minimum", ("minimum", "exclusiveMinimum")), ("maximum", ("maximum", "exclusiveMaximum")))
                   if not any(a in node for a in alts)]
        if missing:
            yield finding("R3", f"{'/'.join(sorted(types & {'integer', 'number'}))} has no {' or '.join(missing)}")
    if "array" in types:
        if "items" not in node and "prefixItems" not in node:
            yield finding("AP1", "array has no `items`: its elements are untyped")
        if "maxItems" not in node:
            yield finding("R3", "array has no maxItems")
    if not types and not _is_composite(node) and pointer and _parent_key(pointer) in ("properties", "items", "additionalProperties"):
        yield finding("AP1", "value has no type: the model may send anything")
    if any(isinstance(node.get(k), list) for k in ("anyOf", "oneOf")):
        yield from _check_union(node, pointer, root, finding)


def _check_object(node: dict, pointer: str, root: dict, finding) -> Iterator[Finding]:
    props = node.get("properties") if isinstance(node.get("properties"), dict) else {}
    extra = node.get("additionalProperties", node.get("unevaluatedProperties"))
    if not props and not node.get("patternProperties"):
        if extra is not False and not isinstance(extra, dict) and not _is_composite(node):
            yield finding("AP1", "object declares no properties: an untyped argument bag")
        elif isinstance(extra, dict) and "maxProperties" not in node:
            yield finding("R3", "map (additionalProperties schema) has no maxProperties")
    elif extra is not False:
        yield finding("R1", "object does not set additionalProperties: false (unknown fields pass)")
    required = node.get("required") if isinstance(node.get("required"), list) else []
    for name in required:
        if props and name not in props and extra is False:
            yield finding("R2", f"required field {name!r} is not declared in properties")
    for name, sub in props.items():
        at = f"{pointer}/properties/{_esc(name)}"
        if name not in required and not (isinstance(sub, dict) and "default" in sub):
            yield finding("R2", f"field {name!r} is optional but has no default: is it mandatory?", at)
        yield from _check_unit(name, sub, at, finding)
    yield from _check_whole_file(props, pointer, finding)


def _check_unit(name: str, sub: Any, at: str, finding) -> Iterator[Finding]:
    if not isinstance(sub, dict) or not (_types(sub) & {"integer", "number"} or not _types(sub) and not _is_composite(sub)):
        return
    words = _words(name)
    if not (set(words) & _QUANTITY_WORDS) or set(words) & _UNIT_WORDS:
        return
    if len(words) <= 2 and set(words) <= (_QUANTITY_WORDS | _BARE_PREFIXES):
        yield finding("AP4", f"{name!r} is a quantity without a unit", at)
    else:
        yield finding("R4", f"{name!r} names a quantity but no unit", at)


def _check_whole_file(props: dict, pointer: str, finding) -> Iterator[Finding]:
    lowered = {name.lower(): name for name in props}
    if not any(n in _PATH_NAMES for n in lowered):
        return
    for low, name in lowered.items():
        sub = props[name]
        if low in _CONTENT_NAMES and isinstance(sub, dict) and "string" in _types(sub):
            yield finding("AP5", f"{name!r} next to a path asks for the whole file content", f"{pointer}/properties/{_esc(name)}")


def _check_union(node: dict, pointer: str, root: dict, finding) -> Iterator[Finding]:
    for key in ("anyOf", "oneOf"):
        branches = node.get(key)
        if not isinstance(branches, list):
            continue
        objects = [(i, _deref(b, root)) for i, b in enumerate(branches)]
        objects = [(i, b) for i, b in objects if isinstance(b, dict) and ("object" in _types(b) or "properties" in b)]
        if len(objects) < 2:
            continue
        tags = [set(_const_props(b)) for _, b in objects]
        if not any(tags):
            yield finding("AP3", f"{key} of {len(objects)} objects has no const discriminator", f"{pointer}/{key}")
            continue
        common = set.intersection(*tags)
        if not common:
            yield finding("R5", f"{key} branches share no const discriminator property", f"{pointer}/{key}")
            continue
        tag = sorted(common)[0]
        values = [_const_props(b)[tag] for _, b in objects]
        unrequired = [i for i, b in objects if tag not in (b.get("required") or [])]
        if len({repr(v) for v in values}) < len(values):
            yield finding("R5", f"discriminator {tag!r} repeats a const value across branches", f"{pointer}/{key}")
        elif unrequired:
            yield finding("R5", f"discriminator {tag!r} is not required in branch(es) {unrequired}", f"{pointer}/{key}")


# --- small helpers -------------------------------------------------------------------------
def _types(node: dict) -> set[str]:
    t = node.get("type")
    if isinstance(t, str):
        return {t}
    return {x for x in t if isinstance(x, str)} if isinstance(t, list) else set()


def _is_composite(node: dict) -> bool:
    return any(k in node for k in ("$ref", "$dynamicRef", "anyOf", "oneOf", "allOf", "enum", "const", "not", "if"))


def _const_props(branch: dict) -> dict[str, Any]:
    props = branch.get("properties") if isinstance(branch.get("properties"), dict) else {}
    out = {}
    for name, sub in props.items():
        if isinstance(sub, dict) and "const" in sub:
            out[name] = sub["const"]
        elif isinstance(sub, dict) and isinstance(sub.get("enum"), list) and len(sub["enum"]) == 1:
            out[name] = sub["enum"][0]
    return out


def _deref(node: Any, root: dict) -> Any:
    """Follow local `#/...` refs (a few hops) so union branches that are `$ref`s are inspected."""
    for _ in range(8):
        if not (isinstance(node, dict) and isinstance(node.get("$ref"), str) and node["$ref"].startswith("#/")):
            return node
        target: Any = root
        for part in node["$ref"][2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            target = target.get(part) if isinstance(target, dict) else None
        node = target
    return node


def _words(name: str) -> list[str]:
    return [w.lower() for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+", name)]


def _parent_key(pointer: str) -> str:
    parts = pointer.split("/")
    if len(parts) >= 3 and parts[-2] in ("properties", "patternProperties", "$defs", "definitions"):
        return parts[-2]
    return parts[-1]


def _esc(token: str) -> str:
    return str(token).replace("~", "~0").replace("/", "~1")
