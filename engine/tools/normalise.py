"""The one normaliser: every accepted tool shape -> `Tool`.

Shapes: a `Tool`; a pydantic model class; an OpenAI tool (`{"type": "function", "function":
{...}}` or its inner `{name, description, parameters}`, `strict` kept in `annotations`); an MCP
tool (`{name, description, inputSchema, annotations}`; the level follows the MCP hints); a bare
JSON Schema dict (named after its `title`, else `tool`). Every other module that takes
tools (the LLM, the compiler CLI, lint, catalog cost, the dispatch runtime) goes through here.
It does not read files (`surecall.tools.loading`) or validate arguments (`surecall.dispatch`).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from typing import Any

from surecall.errors import ToolDefinitionError
from surecall.grammars.tool_shape import is_tool_dict, looks_like_schema, tool_fields
from surecall.tools.tool import SideEffect, Tool

_EXPECTED = ("expected a Tool, a pydantic model class, a JSON Schema object, an MCP tool {name, inputSchema} or an "
             "OpenAI function {'type': 'function', 'function': {name, parameters}}")


def normalise_tool(obj: Any, *, level: SideEffect | int | str | None = None, index: int = 0,
                   where: str | None = None, **extra) -> Tool:
    """One tool definition in any accepted shape as a `Tool`.

    `level` overrides the side-effect level (default: from MCP annotations when the definition
    carries them, else A3); `extra` goes to the `Tool` constructor (handler, probe, compensator).
    """
    where = where or f"tool #{index}"
    if isinstance(obj, Tool):
        return obj if level is None and not extra else _replace(obj, level, extra)
    if isinstance(obj, type) and hasattr(obj, "model_json_schema"):
        return Tool.from_pydantic(obj, level=SideEffect.A3 if level is None else level, **extra)
    if hasattr(obj, "model_json_schema") and not isinstance(obj, Mapping):
        raise ToolDefinitionError(f"{where}: {_EXPECTED}, got an instance of {type(obj).__name__} (pass the class)")
    if isinstance(obj, Mapping) and not is_tool_dict(obj):
        if not looks_like_schema(obj):
            raise ToolDefinitionError(f"{where}: {_EXPECTED}, got a dict with keys {sorted(obj)[:8]}")
        return _from_bare_schema(obj, level, extra, where)
    if not isinstance(obj, Mapping):
        raise ToolDefinitionError(f"{where}: {_EXPECTED}, got {type(obj).__name__}")
    fields = tool_fields(obj, where)
    annotations = dict(fields.annotations)
    if "strict" in fields.extra:
        annotations.setdefault("strict", fields.extra["strict"])
    is_mcp = "inputSchema" in _inner(obj) or "input_schema" in _inner(obj)
    if level is None:
        declared = fields.extra.get("level")
        level = declared if declared is not None else (
            SideEffect.from_mcp_annotations(fields.annotations) if is_mcp else SideEffect.A3)
    return Tool(name=fields.name, description=fields.description, input_schema=copy.deepcopy(fields.schema),
                level=level, annotations=annotations, **extra)


def normalise_tools(tools: Any, *, where: str = "tools") -> list[Tool]:
    """A list (or one) tool definition(s) as `Tool`s; duplicate names are refused."""
    if tools is None:
        return []
    if isinstance(tools, (Mapping, Tool)) or isinstance(tools, type) or not isinstance(tools, Iterable) or isinstance(tools, str):
        if isinstance(tools, str):
            raise ToolDefinitionError(f"{where}: expected tool definitions, got a string {tools[:40]!r}")
        tools = [tools]
    out: list[Tool] = []
    for i, tool in enumerate(tools):
        normalised = normalise_tool(tool, index=i, where=f"{where}[{i}]")
        if any(t.name == normalised.name for t in out):
            raise ToolDefinitionError(f"{where}[{i}]: duplicate tool name {normalised.name!r}")
        out.append(normalised)
    return out


def _from_bare_schema(schema: Mapping, level, extra: dict, where: str) -> Tool:
    title = schema.get("title")
    name = re.sub(r"[^A-Za-z0-9_-]+", "_", title).strip("_") if isinstance(title, str) else ""
    name = name or "tool"
    description = schema.get("description") if isinstance(schema.get("description"), str) else ""
    try:
        return Tool(name=name, description=description, input_schema=copy.deepcopy(dict(schema)),
                    level=SideEffect.A3 if level is None else level, **extra)
    except ToolDefinitionError as exc:
        raise ToolDefinitionError(f"{where}: {exc}") from None


def _inner(obj: Mapping) -> Mapping:
    return obj["function"] if obj.get("type") == "function" and isinstance(obj.get("function"), Mapping) else obj


def _replace(tool: Tool, level, extra: dict) -> Tool:
    import dataclasses

    changes = dict(extra)
    if level is not None:
        changes["level"] = level
    return dataclasses.replace(tool, **changes)
