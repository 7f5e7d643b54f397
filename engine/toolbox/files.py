"""`file_view` and `file_edit`: a windowed viewer and an exact-replacement editor.

Both take a path relative to the workspace (resolved by `paths.resolve_in_workspace`) and refuse
binary files (a NUL byte or invalid UTF-8) and files over `MAX_FILE_BYTES`. `file_edit` replaces
an exact string; zero matches, or several without `allow_multiple`, leave the file byte for byte
unchanged. The write is atomic: a temporary file in the same directory, fsync, `os.replace`,
with the original mode kept, so a crash leaves either the old or the new file. The module also
holds `file_edit`'s reconciliation probe. It never creates or deletes files.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from surecall.errors import ToolError
from surecall.toolbox.paths import display_path, resolve_in_workspace
from surecall.toolbox.result import ToolResult

MAX_FILE_BYTES = 8 * 1024 * 1024  # a file larger than this is refused by both tools
MAX_LINE_CHARS = 2000  # file_view cuts longer lines (minified code) with a marker
SNIPPET_CONTEXT_LINES = 3


class FileViewArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: Annotated[str, Field(min_length=1, max_length=4096, description="File path, relative to the workspace.")]
    offset: Annotated[int, Field(ge=1, le=10_000_000, description="First line to show (1-indexed).")] = 1
    limit: Annotated[int, Field(ge=1, le=500, description="Number of lines to show, at most 500.")] = 100


class FileEditArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: Annotated[str, Field(min_length=1, max_length=4096, description="File path, relative to the workspace.")]
    old_str: Annotated[str, Field(min_length=1, max_length=65536, description="The exact text to replace.")]
    new_str: Annotated[str, Field(max_length=65536, description="The replacement text.")]
    allow_multiple: Annotated[
        bool, Field(description="Replace every occurrence instead of requiring exactly one.")
    ] = False


def read_text_file(workspace: Path, path: str) -> tuple[Path, str]:
    """(real path, text) of a workspace file, or ToolError for missing, binary or huge files."""
    real = resolve_in_workspace(workspace, path)
    if not real.exists():
        raise ToolError(f"file {path!r} does not exist")
    if not real.is_file():
        raise ToolError(f"{path!r} is not a regular file")
    size = real.stat().st_size
    if size > MAX_FILE_BYTES:
        raise ToolError(f"file {path!r} is {size} bytes, over the {MAX_FILE_BYTES}-byte limit of this tool")
    raw = real.read_bytes()
    if b"\x00" in raw[:8192]:
        raise ToolError(f"file {path!r} looks binary (NUL byte); this tool only handles UTF-8 text")
    try:
        return real, raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToolError(f"file {path!r} is not valid UTF-8 (byte {exc.start}); this tool only handles text") from None


# --- file_view ----------------------------------------------------------------------------
def _numbered(lines: list[str], first_line: int) -> tuple[str, bool]:
    out, cut = [], False
    for i, line in enumerate(lines):
        if len(line) > MAX_LINE_CHARS:
            line, cut = f"{line[:MAX_LINE_CHARS]}[... line cut at {MAX_LINE_CHARS} chars]", True
        out.append(f"{first_line + i:>6}\t{line}")
    return "\n".join(out), cut


def file_view(args: FileViewArgs, workspace: Path) -> ToolResult:
    """Lines offset..offset+limit-1 with numbers, and a note on where the window stands."""
    real, text = read_text_file(workspace, args.path)
    lines = text.splitlines()
    num_lines = len(lines)
    if args.offset > max(num_lines, 1):
        raise ToolError(f"offset {args.offset} is past the end of {args.path!r}, which has {num_lines} lines")
    window = lines[args.offset - 1 : args.offset - 1 + args.limit]
    last = args.offset + len(window) - 1
    body, cut = _numbered(window, args.offset)
    if num_lines == 0:
        note = "[empty file: 0 lines]"
    elif args.offset - 1 + args.limit >= num_lines:
        note = f"[end of file: lines {args.offset}-{last} of {num_lines}]"
    else:
        note = f"[lines {args.offset}-{last} of {num_lines}; next offset {last + 1}]"
    output = f"{body}\n{note}" if body else note
    data = {"path": display_path(real, workspace), "first_line": args.offset, "last_line": last, "num_lines": num_lines}
    return ToolResult(output=output, truncated=cut, data=data)


# --- file_edit ----------------------------------------------------------------------------
def atomic_write(path: Path, payload: bytes) -> None:
    """Replace `path` with `payload` so a crash leaves the old or the new file, never half of one."""
    st = path.stat()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".surecall-tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, st.st_mode & 0o7777)
        if os.geteuid() == 0:
            os.chown(tmp, st.st_uid, st.st_gid)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a power cut
    finally:
        os.close(dir_fd)


def _snippet(text: str, index: int, new_str: str) -> tuple[str, int]:
    """Numbered lines around the first replacement and the line number where it starts."""
    line_no = text.count("\n", 0, index) + 1
    lines = text.splitlines()
    start = max(line_no - SNIPPET_CONTEXT_LINES, 1)
    stop = min(line_no + new_str.count("\n") + SNIPPET_CONTEXT_LINES, len(lines))
    body, _ = _numbered(lines[start - 1 : stop], start)
    return body, line_no


def file_edit(args: FileEditArgs, workspace: Path) -> ToolResult:
    """Replace `old_str` by `new_str` (once, or everywhere with allow_multiple), atomically."""
    real, text = read_text_file(workspace, args.path)
    count = text.count(args.old_str)
    if count == 0:
        raise ToolError(f"old_str was not found in {args.path!r} (0 matches); the file is unchanged")
    if count > 1 and not args.allow_multiple:
        raise ToolError(
            f"old_str occurs {count} times in {args.path!r}; add surrounding context to make it unique "
            "or pass allow_multiple=true; the file is unchanged"
        )
    if args.old_str == args.new_str:
        raise ToolError("old_str and new_str are identical; the file is unchanged")
    index = text.index(args.old_str)
    edited = text.replace(args.old_str, args.new_str)
    atomic_write(real, edited.encode("utf-8"))
    snippet, line_no = _snippet(edited, index, args.new_str)
    shown = display_path(real, workspace)
    output = f"Edited {shown}: replaced {count} occurrence(s), first at line {line_no}.\n{snippet}"
    return ToolResult(output=output, data={"path": shown, "num_replacements": count, "line": line_no})


def probe_file_edit(args: FileEditArgs, workspace: Path) -> bool | None:
    """Was this edit applied? True (applied), False (not applied), None (cannot tell).

    Applied: the file holds new_str and no longer old_str. Not applied: old_str is still there
    the way the edit requires (once, or at least once with allow_multiple) and new_str is not
    (unless new_str is part of old_str). When new_str contains old_str, or the file is gone or
    unreadable, the probe cannot tell and the record stays IN_DOUBT. A heuristic: an applied
    edit whose replacement recreates old_str from its neighbours reads as "cannot tell".
    """
    if args.old_str in args.new_str:
        return None
    try:
        _, text = read_text_file(workspace, args.path)
    except ToolError:
        return None
    num_old, has_new = text.count(args.old_str), args.new_str in text
    if num_old == 0 and has_new:
        return True
    count_ok = num_old == 1 or (num_old > 1 and args.allow_multiple)
    if count_ok and (not has_new or args.new_str in args.old_str):
        return False
    return None
