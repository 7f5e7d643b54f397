"""Reading tool definitions from files: a JSON Schema, a JSON list or JSONL of tools, an MCP
tool list ({"tools": [...]}) or an OpenAI tools array, and the built-in catalogs by name
(`seed`, `seed-hardened`, see `surecall.tools.catalog`). Every entry goes through the one
normaliser (`surecall.tools.normalise`). Files that are not regular, too large, or hold no tool
definition are refused with the file's name. It does not lint or compile anything.
"""

from __future__ import annotations

import json
import stat
from collections.abc import Callable
from pathlib import Path

from surecall.errors import ToolDefinitionError
from surecall.grammars.tool_shape import is_tool_dict, looks_like_schema, tool_fields
from surecall.tools.normalise import normalise_tool
from surecall.tools.tool import Tool

MAX_TOOLS_FILE_BYTES = 64 * 1024 * 1024


def read_json_records(path: str | Path, error: Callable[[str], Exception] = ToolDefinitionError):
    """A file as one JSON value or as JSONL: (True, [(path, value)]) or (False, [("path:line", value), ...]).

    The one reader behind `surecall compile`, `lint`, `breakeven` and `catalog-cost`; `error` builds
    the exception each caller raises (it names the file, and the line for a bad JSONL line).
    """
    check_regular_file(Path(path), error)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from exc
    return parse_json_records(text, path, error)


def parse_json_records(text: str, path: str | Path, error: Callable[[str], Exception] = ToolDefinitionError):
    """`read_json_records` on text already read (the CLI reads through its own size and file-type checks)."""
    try:
        return True, [(str(path), _loads(text, path, error))]
    except json.JSONDecodeError as whole:
        records = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append((f"{path}:{lineno}", _loads(line, f"{path}:{lineno}", error)))
            except json.JSONDecodeError as exc:
                if not records:
                    raise error(f"{path}: not JSON or JSONL ({whole.msg} at line {whole.lineno})") from exc
                raise error(f"{path}:{lineno}: invalid JSON line ({exc.msg})") from exc
        return False, records


def tool_dicts_from_records(whole: bool, records: list, path: str | Path) -> list[dict]:
    """Tool dicts {name, description, parameters, ...} from `parse_json_records` output (shape only)."""
    path = Path(path)
    data = records[0][1] if whole else [value for _, value in records]
    items = _as_list(data, path)
    if not items:
        raise ToolDefinitionError(f"{path}: holds no tool definitions")
    return [_shape_dict(item, f"{path}[{i}]") for i, item in enumerate(items)]


def _loads(text: str, where, error: Callable[[str], Exception]):
    try:
        return json.loads(text)
    except RecursionError:
        raise error(f"{where}: JSON nested too deeply to parse") from None


def load_tools(source: str | Path) -> list[Tool]:
    """`Tool`s from a file or a built-in catalog name; a bare JSON Schema becomes one tool named after the file."""
    return [normalise_tool(item, index=i, where=where) for i, (where, item) in enumerate(_load_items(source))]


def load_tool_dicts(source: str | Path) -> list[dict]:
    """Like `load_tools`, as plain definitions {name, description, parameters, ...}, reading the shape only:
    a schema the grammar or `Tool` would refuse (BFCL's `"type": "dict"`) is kept for lint and token counts."""
    return [_shape_dict(item, where) for where, item in _load_items(source)]


def _shape_dict(item, where: str) -> dict:
    fields = tool_fields(item, where)
    return {**fields.extra, "name": fields.name, "description": fields.description, "parameters": fields.schema}


def _load_items(source: str | Path) -> list[tuple[str, object]]:
    from surecall.tools.catalog import CATALOGS, catalog_tools

    if str(source) in CATALOGS:
        return [(f"{source}[{i}]", item) for i, item in enumerate(catalog_tools(str(source)))]
    path = Path(source)
    check_regular_file(path, ToolDefinitionError, what="tools file", hint=f"expected a JSON/JSONL file or one of {sorted(CATALOGS)}")
    whole, records = read_json_records(path)
    data = records[0][1] if whole else [value for _, value in records]
    items = _as_list(data, path)
    if not items:
        raise ToolDefinitionError(f"{path}: holds no tool definitions")
    return [(f"{path}[{i}]", item) for i, item in enumerate(items)]


def check_regular_file(path: Path, error: Callable[[str], Exception], *, what: str = "file", hint: str = "",
                       max_bytes: int = MAX_TOOLS_FILE_BYTES) -> None:
    """Refuse a missing, non-regular (FIFO, device, directory) or oversized file before reading it."""
    try:
        st = path.stat()
    except OSError as exc:
        raise error(f"{what} not found: {path}" + (f" ({hint})" if hint else "") if isinstance(exc, FileNotFoundError)
                    else f"cannot read {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{path}: not a regular file (a directory, FIFO or device); pass a JSON/JSONL file")
    if st.st_size > max_bytes:
        raise error(f"{path}: {st.st_size} bytes, over the {max_bytes}-byte limit for a {what}")
    if st.st_size == 0:
        raise error(f"{path}: empty file; expected JSON or JSONL")


def _as_list(data, path: Path) -> list:
    if isinstance(data, list):
        return data
    if isinstance(data, dict) and isinstance(data.get("tools"), list):
        return data["tools"]
    if isinstance(data, dict) and is_tool_dict(data):
        return [data]
    if isinstance(data, dict) and looks_like_schema(data):
        return [{"name": path.stem.replace(".", "_").replace("-", "_"), "description": "", "parameters": data}]
    raise ToolDefinitionError(
        f"{path}: expected a JSON Schema, a list/JSONL of tools or an MCP tool list, got {type(data).__name__}"
    )
