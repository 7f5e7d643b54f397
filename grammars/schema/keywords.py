"""Which keys of a schema object JSON Schema defines, so that every other key is read as an annotation.

JSON Schema ignores keys it does not define (a `ddd` holding definitions, an `x-` extension, an
editor's `markdownEnumDescriptions`); the converter does, and so must the modules that decide
whether a shortcut applies (object_exists, conditionals, discriminators, alternatives,
property_counts): a key they do not read is NotExact there only when some draft defines it.
"""

from __future__ import annotations

from surecall.grammars.schema.meta import SCHEMA_MAPS

# Every keyword of drafts 4 to 2020-12 (core, applicators, validation, format, content,
# meta-data), and OpenAPI's `nullable`, which the converter reads.
JSON_SCHEMA_KEYWORDS = frozenset({
    "$schema", "$id", "id", "$ref", "$defs", "definitions", "$anchor", "$dynamicRef", "$dynamicAnchor",
    "$recursiveRef", "$recursiveAnchor", "$vocabulary", "$comment", "allOf", "anyOf", "oneOf", "not", "if",
    "then", "else", "dependentSchemas", "dependencies", "prefixItems", "items", "additionalItems", "contains",
    "properties", "patternProperties", "additionalProperties", "propertyNames", "unevaluatedItems",
    "unevaluatedProperties", "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum",
    "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems", "minItems", "uniqueItems",
    "maxContains", "minContains", "maxProperties", "minProperties", "required", "dependentRequired", "format",
    "contentEncoding", "contentMediaType", "contentSchema", "title", "description", "default", "deprecated",
    "readOnly", "writeOnly", "examples", "nullable"})
# Keywords that assert nothing about an instance (meta-data, identifiers, content hints).
ANNOTATION_KEYWORDS = frozenset({"$schema", "$id", "id", "$anchor", "$comment", "title", "description", "default",
                                 "deprecated", "readOnly", "writeOnly", "examples", "contentEncoding",
                                 "contentMediaType", "contentSchema"})
_OWN_MARKS = "$surecall:"  # the converter's own keys (positions, excluded values): never annotations here


def is_undefined(key: str) -> bool:
    """A key no draft defines (nor one of the converter's own): an annotation JSON Schema ignores."""
    return key not in JSON_SCHEMA_KEYWORDS and not key.startswith(_OWN_MARKS)


def is_annotation(key: str) -> bool:
    """A key that asserts nothing: a meta-data keyword, or one no draft defines."""
    return key in ANNOTATION_KEYWORDS or is_undefined(key)


# Keys whose object maps names (of properties, patterns, definitions) to schemas or lists, and keys
# whose value is JSON data: their own keys are never keywords.
_NAME_MAPS = frozenset({*SCHEMA_MAPS, "dependentRequired"})
_DATA = frozenset({"enum", "const", "default", "examples"})


def without_own_marks(schema: object, parent: str | None = None) -> object:
    """`schema` without the keys a user wrote under the converter's own prefix (`$surecall:...`).

    No draft defines them, so JSON Schema ignores them; the converter would read them as its own
    marks (`$surecall:not_in` excludes values), so they are dropped before it runs. Property,
    pattern and definition names, and JSON data (enum, const, default, examples), are kept as
    written. The same object when nothing is dropped."""
    if isinstance(schema, list):
        items = [without_own_marks(v, None) for v in schema]
        return schema if all(a is b for a, b in zip(items, schema)) else items
    if not isinstance(schema, dict) or parent in _DATA:
        return schema
    names = parent in _NAME_MAPS
    out = {k: v if k in _DATA and not names else without_own_marks(v, None if names else k)
           for k, v in schema.items() if names or not k.startswith(_OWN_MARKS)}
    same = len(out) == len(schema) and all(out[k] is schema[k] for k in out)
    return schema if same else out
