"""The one resolver for what a command reads: `--tokenizer`, `--tools`, and the files behind them.

Every command that takes a tokenizer or a tools/schema file goes through here, so each accepts
the same inputs: `shared:NAME`, a tokenizer directory or file (tokenizer.json, vocab.json +
merges.txt, a SentencePiece or tiktoken `tokenizer.model`, *.tiktoken); `seed`, a JSON / JSONL /
MCP / OpenAI tools file, or a python `module:attr`. A JSON input is checked on its open
descriptor before a byte is read, a tokenizer file by `stat` before its loader opens it: a FIFO,
device or directory is refused (reading one hangs or never ends), as is an empty file, one over
the size limit (SURECALL_MAX_INPUT_BYTES, default 64 MiB) or JSON nested deeper than
MAX_JSON_DEPTH. It parses no tokenizer itself and never downloads.
"""

from __future__ import annotations

import importlib
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from surecall.errors import RequestError, SchemaError, ToolDefinitionError, VocabError

MAX_INPUT_BYTES_ENV = "SURECALL_MAX_INPUT_BYTES"
DEFAULT_MAX_INPUT_BYTES = 64 * 2**20
MAX_TOKENIZER_BYTES = 2**30  # the largest public tokenizer.json files are ~30 MB
# JSON nesting (each object or array is one level) accepted from an input file: real schemas stay
# under 30, and the schema walkers recurse a few frames per level under Python's 1000-frame limit.
MAX_JSON_DEPTH = 128
TARGET_EXPECTED = "a JSON Schema file, a JSON list or JSONL file of tools, module:attr, or `seed`"
_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFDIR: "a directory", stat.S_IFSOCK: "a socket"}

ErrorFactory = Callable[[str], Exception]


# --- input files -----------------------------------------------------------------------------
def max_input_bytes() -> int:
    """The input size limit: SURECALL_MAX_INPUT_BYTES when set (a positive integer), else 64 MiB."""
    raw = os.environ.get(MAX_INPUT_BYTES_ENV)
    if raw is None:
        return DEFAULT_MAX_INPUT_BYTES
    if not raw.strip().isdigit() or int(raw) < 1:
        raise RequestError(f"Invalid {MAX_INPUT_BYTES_ENV}: expected a positive integer of bytes, got {raw!r}")
    return int(raw)


def read_input_bytes(path: str | Path, error: ErrorFactory = RequestError, max_bytes: int | None = None) -> bytes:
    """The bytes of a regular, non-empty file of at most `max_bytes`, else `error(...)` naming it.

    Opened with O_NONBLOCK so a FIFO cannot block the open, then checked with fstat on that same
    descriptor (no window for a swap between the check and the read).
    """
    limit = max_input_bytes() if max_bytes is None else max_bytes
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise error(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = _KINDS.get(stat.S_IFMT(info.st_mode), "not a regular file")
            raise error(f"refusing to read {path}: it is {kind}, expected a regular file")
        if info.st_size > limit:
            raise error(f"refusing to read {path}: {info.st_size} bytes, over the {limit}-byte input limit "
                        f"(set {MAX_INPUT_BYTES_ENV} to raise it)")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise error(f"cannot read {path}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    if len(data) > limit:  # it grew after the fstat
        raise error(f"refusing to read {path}: over the {limit}-byte input limit (set {MAX_INPUT_BYTES_ENV} to raise it)")
    if not data.strip():
        raise error(f"{path} is empty")
    return data


def read_input_text(path: str | Path, error: ErrorFactory = RequestError) -> str:
    data = read_input_bytes(path, error)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"cannot read {path}: not UTF-8 text (byte {exc.start})") from exc


def read_json_input(path: str | Path, error: ErrorFactory = ToolDefinitionError) -> tuple[bool, list]:
    """`tools.loading.parse_json_records` over a checked file; every record within MAX_JSON_DEPTH."""
    from surecall.tools.loading import parse_json_records

    whole, records = parse_json_records(read_input_text(path, error), path, error)
    for where, value in records:
        depth = json_depth(value)
        if depth > MAX_JSON_DEPTH:
            raise error(f"{where}: JSON nested {depth} levels deep, over the limit of {MAX_JSON_DEPTH}")
    return whole, records


def json_depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value (a scalar is 0), walked without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest


# --- --tokenizer ---------------------------------------------------------------------------------
def tokenizer_source(spec: str) -> tuple[Path, str | None, int | None]:
    """(local path, shared name or None, the shared model's logits width or None) for a --tokenizer."""
    if spec.startswith("shared:"):
        from surecall.grammars.vocab.loaders import SHARED_ALIASES, SHARED_VOCABS
        from surecall.grammars.vocab.shared import require_shared

        name = spec.removeprefix("shared:")
        key = SHARED_ALIASES.get(name, name)
        if key not in SHARED_VOCABS:
            raise VocabError(f"unknown shared vocabulary {name!r}: expected one of {sorted(SHARED_VOCABS)}")
        relative, width = SHARED_VOCABS[key]
        try:
            return require_shared(f"tokenizers/{relative}"), key, width
        except FileNotFoundError as exc:
            raise VocabError(str(exc)) from exc
    path = Path(spec).expanduser()
    if path.exists() and not path.is_dir():
        read_check(path, VocabError, MAX_TOKENIZER_BYTES)
    return path, None, None


def read_check(path: Path, error: ErrorFactory, max_bytes: int) -> None:
    """The file checks of `read_input_bytes` without reading the file (its loader reads it)."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise error(f"cannot read {path}: {exc.strerror or exc}") from exc
    if not stat.S_ISREG(info.st_mode):
        raise error(f"refusing to read {path}: it is {_KINDS.get(stat.S_IFMT(info.st_mode), 'not a regular file')}, "
                    f"expected a regular file")
    if info.st_size > max_bytes:
        raise error(f"refusing to read {path}: {info.st_size} bytes, over the {max_bytes}-byte limit")
    if info.st_size == 0:
        raise error(f"{path} is empty")


def load_vocab(spec: str, logits_width: int | None = None):
    """The grammar compiler's `Vocab` for a --tokenizer (`vocab`, `compile`, `sample`)."""
    from surecall.grammars.vocab.loaders import load

    path, name, width = tokenizer_source(spec)
    return load(path, logits_width=width if logits_width is None else logits_width, name=name)


def load_counting_tokenizer(spec: str, context_window: int | None = None):
    """A counting/rendering tokenizer for a --tokenizer (`catalog-cost`)."""
    from surecall.models.tokenizers import load_counting_tokenizer as load

    path, name, _ = tokenizer_source(spec)
    tok = load(path, context_window)
    if name:
        tok.name = name
    return tok


# --- --tools and schema targets ------------------------------------------------------------------
def load_tools(spec: str) -> list[dict]:
    """Tool dicts {name, description, parameters, ...} from `seed`, a tools file or `module:attr`."""
    from surecall.tools import normalise_tool
    from surecall.tools.catalog import CATALOGS, catalog_tools
    from surecall.tools.loading import tool_dicts_from_records

    if spec in CATALOGS:
        return catalog_tools(spec)
    if is_python_spec(spec):
        return [normalise_tool(obj, index=i, where=f"{spec}[{i}]").descriptor()
                for i, obj in enumerate(python_objects(spec))]
    if not Path(spec).exists():
        raise ToolDefinitionError(f"tools file not found: {spec} (expected a JSON/JSONL file, `seed` or module:attr)")
    whole, records = read_json_input(spec, ToolDefinitionError)
    tools = tool_dicts_from_records(whole, records, spec)
    if not tools:
        raise ToolDefinitionError(f"{spec}: holds no tool definitions")
    return tools


def load_schema_or_tools(spec: str) -> tuple[str, object]:
    """("tools", [tool, ...]) or ("schema", dict) from a path, `module:attr` or `seed` (`compile`, `sample`)."""
    from surecall.tools.catalog import CATALOGS

    if spec in CATALOGS or is_python_spec(spec):
        return "tools", load_tools(spec)

    def error(message):
        return SchemaError(message, pointer=None, keyword=None)  # a file-level error: no pointer

    if not os.path.exists(spec):
        raise error(f"{spec!r} is not a file: expected {TARGET_EXPECTED}")
    whole, records = read_json_input(spec, error)
    data = records[0][1] if whole else [value for _, value in records]
    if isinstance(data, list) and data:
        return "tools", data
    if isinstance(data, dict) and "name" in data and any(k in data for k in ("parameters", "inputSchema", "function")):
        return "tools", [data]
    if isinstance(data, (dict, bool)):
        return "schema", data
    got = "an empty list" if data == [] else f"JSON {type(data).__name__}"
    raise error(f"{spec}: expected {TARGET_EXPECTED}, got {got}")


def is_python_spec(spec: str) -> bool:
    """`package.module:attr` that is not an existing path (a Windows-style `C:` never reaches here)."""
    return ":" in spec and not os.path.exists(spec) and not spec.startswith("shared:")


def python_objects(spec: str) -> list:
    """The objects `module:attr` names: a Tool, a pydantic model, a dict, a list of them, or a
    zero-argument callable returning one of those."""
    module_name, _, attr = spec.partition(":")
    sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ToolDefinitionError(f"cannot load {spec}: {exc}") from exc
    finally:
        sys.path.pop(0)
    if callable(obj) and not hasattr(obj, "model_json_schema") and not isinstance(obj, type):
        obj = obj()
    return list(obj) if isinstance(obj, (list, tuple)) else [obj]
