"""The metaschema check the compiler, the dispatch validator and `surecall lint` share.

`checked_schema(schema)` returns the schema to use (itself, or the spelling below) or raises
SchemaError. It adds two things to jsonschema-rs's `meta.validate`:

- Patterns are ECMA-262 regexes, read by browsers and Node with Annex B, where a `{`, `}` or `]`
  that cannot be syntax is a literal character (`{{.+}}`, `a{`, `x}`). jsonschema-rs refuses
  them (its `format: regex` check, which drafts 4-7 assert, and its validators alike; Python's
  `jsonschema` and xgrammar accept them). Such characters are written escaped
  (`annex_b_escaped`: the same language, checked by reading both spellings with the pattern
  translator) before the check, and the schema is returned in that spelling, which jsonschema-rs
  then compiles (dispatch validates with it; the compiler converts the patterns as written, its
  translator reading ECMA-262 and Python alike, and gives its jsonschema-rs probes `rs_validator`).
  A pattern jsonschema-rs cannot compile in either spelling is a SchemaError at its pointer.
- Its error for a value under `anyOf` (e.g. `items`: a schema or an array of schemas) quotes
  the whole value and says only that no branch matched; the SchemaError here names the deepest
  cause (a bad pattern, a misspelt type) at its own pointer, shortened to one readable line.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import jsonschema_rs

from surecall.errors import SchemaError
from surecall.grammars.schema.pattern import PatternUnsupported, _outside_classes, translate_pattern

_QUANTIFIER = re.compile(r"\{[0-9]+(?:,[0-9]*)?\}")
_MAX_MESSAGE = 240  # characters of jsonschema-rs's message kept (it starts with the whole instance)
# (a `dependencies` value may also be a list of names: _escaped passes anything but a dict through)
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_ONE = ("additionalProperties", "additionalItems", "unevaluatedProperties", "unevaluatedItems", "items",
               "contains", "not", "if", "then", "else", "propertyNames", "contentSchema")
_REGEX_FORMAT = jsonschema_rs.validator_for({"format": "regex"}, validate_formats=True)


def checked_schema(schema: Any, registry: jsonschema_rs.Registry | None = None, what: str = "invalid JSON Schema"):
    """`schema` with Annex B pattern characters escaped (the same object when there are none), once
    it passes its draft's metaschema; else SchemaError("<what>: <the deepest cause>", pointer, keyword)."""
    if isinstance(schema, bool):
        return schema
    if not isinstance(schema, dict):
        raise SchemaError(f"{what}: a schema must be an object or a boolean, got {type(schema).__name__}", "")
    escaped = escaped_patterns(schema, what)
    error = _meta_error(escaped, registry)
    if error is not None:
        raise schema_error(error, what)
    return escaped


def rs_validator(schema: Any) -> jsonschema_rs.Validator:
    """jsonschema-rs's validator of `schema` (its draft), its patterns in the spelling jsonschema-rs
    reads (`escaped_patterns`): for the compiler's probes of subschemas of a checked schema."""
    return jsonschema_rs.validator_for(escaped_patterns(schema))


def _meta_error(schema: dict, registry) -> jsonschema_rs.ValidationError | None:
    try:
        jsonschema_rs.meta.validate(schema, registry=registry)
    except jsonschema_rs.ValidationError as exc:
        return exc
    except Exception as exc:  # noqa: BLE001 - an unknown $schema, an unresolvable metaschema
        raise SchemaError(f"cannot check the schema against its metaschema: {exc}", "", "$schema") from None
    return None


def schema_error(error: jsonschema_rs.ValidationError, what: str = "invalid JSON Schema") -> SchemaError:
    """SchemaError for a metaschema error: its deepest cause (inside anyOf/oneOf branches), named
    by pointer and the schema keyword it sits under, the message shortened to one line."""
    cause = deepest_cause(error)
    path = [str(p) for p in cause.instance_path]
    pointer = "".join("/" + _escape(p) for p in path)
    keyword = path[-1] if path else str(list(cause.schema_path)[-1])
    message = " ".join(cause.message.split())
    if len(message) > _MAX_MESSAGE:
        message = message[: _MAX_MESSAGE - 1] + "…"
    if _kind(cause) == "Format" and isinstance(cause.instance, str):  # a pattern: say what is wrong with it
        try:
            translate_pattern(cause.instance, 48)
        except PatternUnsupported as exc:
            message += f" ({exc})"
    return SchemaError(f"{what}: {message}", pointer, keyword)


def deepest_cause(error: jsonschema_rs.ValidationError) -> jsonschema_rs.ValidationError:
    """The error's most specific cause: the deepest one under its anyOf/oneOf branches (a branch
    refused only on its type, usually the branch not meant, loses a tie)."""
    leaves, stack = [], [error]
    while stack:
        err = stack.pop()
        branches = getattr(err.kind, "context", None) or []
        subs = [sub for branch in branches for sub in branch]
        if subs:
            stack.extend(reversed(subs))
        else:
            leaves.append(err)
    return max(leaves, key=lambda e: (len(list(e.instance_path)), _kind(e) != "Type"))


def _kind(error) -> str:
    return type(error.kind).__name__


# --- Annex B patterns --------------------------------------------------------------------------
def annex_b_escaped(pattern: str) -> str:
    """`pattern` with each `{`, `}` and `]` that Annex B reads as a literal written escaped: a `{`
    that starts no `{n}`, `{n,}` or `{n,m}`, a `}` or `]` outside a class. Escapes and classes
    are kept as they are."""
    at, past = [], 0
    for i, c, _ in _outside_classes(pattern):
        if i < past:  # inside a quantifier already kept
            continue
        quantifier = _QUANTIFIER.match(pattern, i) if c == "{" else None
        if quantifier:
            past = quantifier.end()
        elif c in "{}]":
            at.append(i)
    cuts = [0, *at, len(pattern)]
    return "\\".join(pattern[a:b] for a, b in zip(cuts, cuts[1:]))


@lru_cache(maxsize=4096)  # a schema's $defs repeat their patterns
def _readable(pattern: str) -> str | None:
    """`pattern`, or its escaped spelling where jsonschema-rs refuses the pattern but takes that
    spelling (and the pattern translator, where it reads the pattern, reads both alike: `x{,2}`,
    which it leaves alone as Python reads it otherwise, is text to ECMA-262 and so escaped);
    None when jsonschema-rs reads neither."""
    if _REGEX_FORMAT.is_valid(pattern):
        return pattern
    escaped = annex_b_escaped(pattern)
    if escaped == pattern or not _REGEX_FORMAT.is_valid(escaped):
        return None
    try:
        original = translate_pattern(pattern, 48).regex
    except PatternUnsupported:
        return escaped
    try:
        same = original == translate_pattern(escaped, 48).regex
    except PatternUnsupported:
        return None
    return escaped if same else None


def escaped_patterns(schema: Any, what: str = "invalid JSON Schema") -> Any:
    """`schema` with its patterns (`pattern` values, `patternProperties` keys) `_readable`: the
    same object when none changes, else a copy of the changed path (values under enum, const,
    default and examples are data, never touched). SchemaError names the first pattern that
    jsonschema-rs cannot compile in either spelling (the dispatch validator could not check it)."""
    try:
        return _escaped(schema, "")
    except RecursionError:  # deeper than Python's stack: checked as written
        return schema
    except _Unreadable as exc:
        raise SchemaError(f"{what}: {exc.args[0]}", exc.args[1], "pattern") from None


class _Unreadable(Exception):
    """(message, pointer) of a pattern jsonschema-rs cannot compile."""


def _unreadable(pattern: str, pointer: str) -> _Unreadable:
    try:
        translate_pattern(pattern, 48)
        why = "jsonschema-rs, which validates calls, cannot compile it"
    except PatternUnsupported as exc:
        why = str(exc)
    return _Unreadable(f"pattern {pattern!r} is not a regular expression ({why})", pointer)


def _pattern(pattern: str, pointer: str) -> str:
    readable = _readable(pattern)
    if readable is None:
        raise _unreadable(pattern, pointer)
    return readable


def _escaped(schema: Any, pointer: str) -> Any:
    if not isinstance(schema, dict):
        return schema
    changed: dict[str, Any] = {}
    if isinstance(schema.get("pattern"), str):
        readable = _pattern(schema["pattern"], pointer + "/pattern")
        if readable != schema["pattern"]:
            changed["pattern"] = readable
    for key in SCHEMA_MAPS:
        children = schema.get(key)
        if isinstance(children, dict):
            at = f"{pointer}/{key}/"
            new = {(_pattern(k, at + _escape(k)) if key == "patternProperties" else k): _escaped(v, at + _escape(k))
                   for k, v in children.items()}
            if len(new) == len(children) and any(a != b or new[a] is not children[b]
                                                  for a, b in zip(new, children)):
                changed[key] = new
    for key in (*_SCHEMA_LISTS, *_SCHEMA_ONE):
        child = schema.get(key)
        if isinstance(child, list):  # allOf, ..., and the draft 4-7 tuple `items`
            new_list = [_escaped(c, f"{pointer}/{key}/{i}") for i, c in enumerate(child)]
            if any(a is not b for a, b in zip(new_list, child)):
                changed[key] = new_list
        elif key in _SCHEMA_ONE:
            new_child = _escaped(child, f"{pointer}/{key}")
            if new_child is not child:
                changed[key] = new_child
    return {**schema, **changed} if changed else schema


def _escape(part: str) -> str:
    return str(part).replace("~", "~0").replace("/", "~1")
