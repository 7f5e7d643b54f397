"""Which keys of a schema object JSON Schema defines, so that every other key is read as an annotation.

JSON Schema ignores keys it does not define (a `ddd` holding definitions, an `x-` extension, an
editor's `markdownEnumDescriptions`); the converter does, and so must the modules that decide
whether a shortcut applies (object_exists, conditionals, discriminators, alternatives,
property_counts): a key they do not read is NotExact there only when some draft defines it.
"""

from __future__ import annotations

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
_OWN_MARKS = "$surecall:"  # the converter's own keys (positions, excluded values): never annotations here


def is_undefined(key: str) -> bool:
    """A key no draft defines (nor one of the converter's own): an annotation JSON Schema ignores."""
    return key not in JSON_SCHEMA_KEYWORDS and not key.startswith(_OWN_MARKS)
