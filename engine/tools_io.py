"""Reading tool definitions from files: a JSON Schema, a JSON list or JSONL of tools, an MCP
tool list ({"tools": [...]}) or an OpenAI tools array, and the word `seed` for the built-in
four-tool catalog. Returns plain dicts ({name, description, parameters, ...}); turning them into
`Tool` objects is `surecall.tools`' job.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from surecall.errors import ToolDefinitionError


def read_json_records(path: str | Path, error: Callable[[str], Exception] = ToolDefinitionError):
    """A file as one JSON value or as JSONL: (True, [(path, value)]) or (False, [("path:line", value), ...]).

    The one reader behind `surecall compile`, `lint`, `breakeven` and `catalog-cost`; `error` builds
    the exception each caller raises (it names the file, and the line for a bad JSONL line).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from exc
    return parse_json_records(text, path, error)


def parse_json_records(text: str, path: str | Path, error: Callable[[str], Exception] = ToolDefinitionError):
    """`read_json_records` on text already read (the CLI reads through its size and file-type checks)."""
    try:
        return True, [(str(path), json.loads(text))]
    except RecursionError as exc:  # the C parser bounds its own recursion; say so instead of a traceback
        raise error(f"{path}: JSON nested too deeply to parse") from exc
    except json.JSONDecodeError as whole:
        records = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append((f"{path}:{lineno}", json.loads(line)))
            except RecursionError as exc:
                raise error(f"{path}:{lineno}: JSON nested too deeply to parse") from exc
            except json.JSONDecodeError as exc:
                if not records:
                    raise error(f"{path}: not JSON or JSONL ({whole.msg} at line {whole.lineno})") from exc
                raise error(f"{path}:{lineno}: invalid JSON line ({exc.msg})") from exc
        return False, records


def load_tool_dicts(source: str | Path) -> list[dict]:
    """Tool definitions from `source`; a bare JSON Schema becomes one tool named after the file."""
    if str(source) == "seed":
        from surecall.catalog import seed_tools

        return seed_tools()
    path = Path(source)
    if not path.is_file():
        raise ToolDefinitionError(f"tools file not found: {path} (expected a JSON/JSONL file or 'seed')")
    whole, records = read_json_records(path)
    return tool_dicts_from_records(whole, records, path)


def tool_dicts_from_records(whole: bool, records: list, path: str | Path) -> list[dict]:
    """Tool dicts from `read_json_records`/`parse_json_records` output (see `load_tool_dicts`)."""
    path = Path(path)
    data = records[0][1] if whole else [value for _, value in records]
    return [_normalise(item, path, i) for i, item in enumerate(_as_list(data, path))]


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
