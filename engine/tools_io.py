"""Reading tool definitions from files: a JSON Schema, a JSON list or JSONL of tools, an MCP
tool list ({"tools": [...]}) or an OpenAI tools array, and the word `seed` for the built-in
four-tool catalog. Returns plain dicts ({name, description, parameters, ...}); turning them into
`Tool` objects is `surecall.tools`' job.
"""

from __future__ import annotations

import json
from pathlib import Path

from surecall.errors import ToolDefinitionError


def load_tool_dicts(source: str | Path) -> list[dict]:
    """Tool definitions from `source`; a bare JSON Schema becomes one tool named after the file."""
    if str(source) == "seed":
        from surecall.catalog import seed_tools

        return seed_tools()
    path = Path(source)
    if not path.is_file():
        raise ToolDefinitionError(f"tools file not found: {path} (expected a JSON/JSONL file or 'seed')")
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = _parse_jsonl(path, text)
    return [_normalise(item, path, i) for i, item in enumerate(_as_list(data, path))]


def _parse_jsonl(path: Path, text: str) -> list:
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ToolDefinitionError(f"{path}:{lineno}: not JSON or JSONL ({exc.msg})") from exc
    return rows


def _as_list(data, path: Path) -> list:
    if isinstance(data, list):
        return data
    if isinstance(data, dict) and isinstance(data.get("tools"), list):
        return data["tools"]
    if isinstance(data, dict) and ("name" in data or "function" in data):
        return [data]
    if isinstance(data, dict) and ("type" in data or "properties" in data or "$schema" in data):
        return [{"name": path.stem.replace(".", "_"), "description": "", "parameters": data}]
    raise ToolDefinitionError(
        f"{path}: expected a JSON Schema, a list/JSONL of tools or an MCP tool list, got {type(data).__name__}"
    )


def _normalise(item, path: Path, index: int) -> dict:
    if not isinstance(item, dict):
        raise ToolDefinitionError(f"{path}: tool #{index} is {type(item).__name__}, expected an object")
    if item.get("type") == "function" and isinstance(item.get("function"), dict):
        item = {**item["function"], **{k: v for k, v in item.items() if k not in ("type", "function")}}
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise ToolDefinitionError(f"{path}: tool #{index} has no 'name'")
    params = item.get("parameters_json_schema") or item.get("parameters") or item.get("inputSchema") or item.get("input_schema")
    if params is None:
        params = {"type": "object", "properties": {}}
    if not isinstance(params, dict):
        raise ToolDefinitionError(f"{path}: tool {name!r} has parameters of type {type(params).__name__}, expected an object")
    out = dict(item)
    out["name"] = name
    out["description"] = item.get("description", "")
    out["parameters"] = params
    return out
