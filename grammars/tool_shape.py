"""The one reader of tool-definition shapes: any accepted shape -> (name, description, schema).

Accepted: an object with `.name` and `.input_schema` (a `surecall.tools.Tool`), an OpenAI tool
`{"type": "function", "function": {...}}`, the inner `{name, description, parameters}`, an MCP
tool `{name, description, inputSchema, annotations}` and `parameters_json_schema`/`input_schema`
spellings. It lives on the ground floor so the grammar compiler and the engine's `Tool`
normaliser read shapes the same way. It does not build `Tool`s, read files or handle pydantic
classes (that is `surecall.tools.normalise`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from surecall.errors import ToolDefinitionError

SCHEMA_KEYS = ("parameters_json_schema", "inputSchema", "input_schema", "parameters")  # BFCL: the JSON-Schema copy first
EMPTY_OBJECT = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True)
class ToolFields:
    name: str
    description: str
    schema: dict
    annotations: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)  # other keys of a dict definition (e.g. `strict`, `level`)


def is_tool_dict(obj: Any) -> bool:
    """True for a dict that names a tool (as opposed to a bare JSON Schema)."""
    if not isinstance(obj, Mapping):
        return False
    if obj.get("type") == "function" and isinstance(obj.get("function"), Mapping):
        return True
    return isinstance(obj.get("name"), str) and (any(k in obj for k in SCHEMA_KEYS) or "description" in obj
                                                  or not looks_like_schema(obj))


def tool_fields(obj: Any, where: str = "tool") -> ToolFields:
    """Name, description and input schema of one tool definition; ToolDefinitionError naming `where`."""
    if hasattr(obj, "name") and hasattr(obj, "input_schema"):
        return ToolFields(obj.name, getattr(obj, "description", "") or "", obj.input_schema,
                          dict(getattr(obj, "annotations", None) or {}))
    if not isinstance(obj, Mapping):
        raise ToolDefinitionError(f"{where}: expected a tool definition (object), got {type(obj).__name__}")
    outer: dict = {}
    if obj.get("type") == "function" and isinstance(obj.get("function"), Mapping):
        outer = {k: v for k, v in obj.items() if k not in ("type", "function")}
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ToolDefinitionError(f"{where}: 'name' must be a non-empty string, got {name!r}")
    schema = next((obj[k] for k in SCHEMA_KEYS if obj.get(k) is not None), None)
    if schema is None:
        schema = dict(EMPTY_OBJECT)
    if not isinstance(schema, Mapping):
        raise ToolDefinitionError(f"{where}: tool {name!r} has parameters of type {type(schema).__name__}, expected an object")
    description = obj.get("description") or ""
    if not isinstance(description, str):
        raise ToolDefinitionError(f"{where}: tool {name!r} has a description of type {type(description).__name__}, expected a string")
    annotations = obj.get("annotations") or {}
    if not isinstance(annotations, Mapping):
        raise ToolDefinitionError(f"{where}: tool {name!r} has annotations of type {type(annotations).__name__}, expected an object")
    extra = {**outer, **{k: v for k, v in obj.items() if k not in ("name", "description", "annotations", *SCHEMA_KEYS)}}
    return ToolFields(name, description, dict(schema), dict(annotations), extra)


def looks_like_schema(obj: Mapping) -> bool:
    return any(k in obj for k in ("type", "properties", "$schema", "$defs", "anyOf", "oneOf", "allOf", "$ref"))
