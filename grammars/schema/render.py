"""Render a JSON value the way the grammar of a schema spells it (the canonical accepted text).

`grammar_dumps(value, schema, options)` writes compact-or-one-space JSON (per the options'
separators), object keys in the schema's declared property order (the order the grammar
demands by default), then any undeclared keys in their own order (values under the
patternProperties schema their key matches, else additionalProperties); integral floats under an integer type
become integers. For anyOf/oneOf it picks the first branch whose regex (counted strings and
arrays spelled out) accepts the rendering.
It does not validate: a value the schema rejects is rendered all the same.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache

from surecall.grammars.options import GrammarOptions
from surecall.grammars.schema.to_regex import _ASSERTING, Converter, expand_marks


def grammar_dumps(value: object, schema: object, options: GrammarOptions | None = None) -> str:
    """The grammar-style text of `value` under `schema` (keys in declared order)."""
    options = options or GrammarOptions()
    return _Renderer(schema, options).dumps(value, schema)


class _Renderer:
    def __init__(self, root: object, options: GrammarOptions):
        self.conv = Converter(root, options)
        self.options = options
        self.item_sep, self.key_sep = options.separators()

    def plain(self, value: object) -> str:
        return json.dumps(value, ensure_ascii=False, separators=(self.item_sep, self.key_sep))

    def effective(self, schema: object, depth: int = 0) -> object:
        """Follow $ref and allOf the way the converter does (anyOf/oneOf left in place)."""
        while isinstance(schema, dict) and depth < 64:
            depth += 1
            if "$ref" in schema:
                target, _ = self.conv.resolve(schema["$ref"], "")
                rest = self.conv.ref_rest(schema)
                schema = {"allOf": [target, rest]} if any(k in _ASSERTING for k in rest) else target
            elif "allOf" in schema:
                schema = self.conv.merge_all_of(schema, "")
            else:
                break
        return schema

    def dumps(self, value: object, schema: object) -> str:
        schema = self.effective(schema)
        if not isinstance(schema, dict) or not any(k in _ASSERTING for k in schema):
            return self.plain(value)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return self.dumps_union(value, schema, key)
        if "enum" in schema or "const" in schema:
            return self.plain(value)
        if isinstance(value, dict):
            return self.dumps_object(value, schema)
        if isinstance(value, list):
            return self.dumps_array(value, schema)
        if isinstance(value, float) and value.is_integer() and "integer" in self.conv.types_of(schema):
            return self.plain(int(value))
        return self.plain(value)

    def dumps_union(self, value: object, schema: dict, key: str) -> str:
        rest = {k: v for k, v in schema.items() if k != key}
        has_rest = any(k in _ASSERTING for k in rest)
        first = None
        for sub in schema[key]:
            branch = {"allOf": [rest, sub]} if has_rest else sub
            text = self.dumps(value, branch)
            first = first or text
            regex = _branch_regex(self.conv, branch)
            if regex is not None and _compiled(expand_marks(regex, self.conv.ws)).fullmatch(text):
                return text
        return first if first is not None else self.plain(value)

    def dumps_object(self, value: dict, schema: dict) -> str:
        props = dict(schema.get("properties", {}))
        for name in schema.get("required", []):
            props.setdefault(name, schema.get("additionalProperties", True))
        extra = schema.get("additionalProperties", True)
        order = [k for k in props if k in value] + [k for k in value if k not in props]
        parts = []
        for key in order:
            sub = props[key] if key in props else _pattern_schema(schema, key, extra)
            parts.append(self.plain(key) + self.key_sep + self.dumps(value[key], sub))
        return "{" + self.item_sep.join(parts) + "}"

    def dumps_array(self, value: list, schema: dict) -> str:
        items = schema.get("items", True)
        if isinstance(items, list):
            prefix, rest = items, schema.get("additionalItems", True)
        else:
            prefix, rest = list(schema.get("prefixItems", [])), items
        parts = [self.dumps(v, prefix[i] if i < len(prefix) else rest) for i, v in enumerate(value)]
        return "[" + self.item_sep.join(parts) + "]"


def _pattern_schema(schema: dict, key: str, extra: object) -> object:
    """The schema of an undeclared key: the first patternProperties schema it matches, else `extra`."""
    for pattern, sub in (schema.get("patternProperties") or {}).items():
        try:
            if re.search(pattern, key):
                return sub
        except re.error:
            continue
    return extra


def _branch_regex(conv: Converter, branch: object) -> str | None:
    try:
        return conv.convert(branch, "")
    except Exception:
        return None


@lru_cache(maxsize=256)
def _compiled(regex: str) -> re.Pattern:
    return re.compile(regex)
