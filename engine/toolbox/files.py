"""`file_view` and `file_edit`: a windowed viewer and an exact-replacement editor.

Both take a path relative to the workspace, checked by `paths.resolve_in_workspace` and then
opened component by component from a workspace directory fd (`paths.open_parent`), so a
directory swapped for a symlink mid-call is refused, never followed out. They refuse binary
files (a NUL byte or invalid UTF-8) and files over `FileLimits.max_file_bytes`. `file_edit`
replaces an exact string; zero matches, several without `allow_multiple`, or a result over
`FileLimits.max_result_bytes` leave the file byte for byte unchanged. The write is locked and
atomic (`atomic.locked_file`, `atomic.replace_file`): concurrent edits of one file each see the
previous one's result, and a crash leaves the old or the new file. The module also holds
`file_edit`'s reconciliation probe. It never creates files (except its own temporary ones).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from surecall.errors import ToolError
from surecall.toolbox.atomic import locked_file, replace_file, sweep_stale_temps
from surecall.toolbox.paths import (
    display_path,
    open_parent,
    open_regular_file,
    read_fd,
    resolve_in_workspace,
)
from surecall.toolbox.result import ToolResult

MAX_FILE_BYTES = 8 * 1024 * 1024  # a file larger than this is refused by both tools
MAX_LINE_CHARS = 2000  # file_view cuts longer lines (minified code) with a marker
SNIPPET_CONTEXT_LINES = 3


@dataclass(frozen=True)
class FileLimits:
    """What file_view and file_edit accept. The result limit defaults to the read limit, so
    whatever file_edit writes, both tools can still open."""

    max_file_bytes: int = MAX_FILE_BYTES
    max_result_bytes: int = MAX_FILE_BYTES
    lock_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("max_file_bytes", "max_result_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Invalid FileLimits.{name}: expected a positive integer, got {value!r}")
        if not (isinstance(self.lock_timeout_s, (int, float)) and 0 < self.lock_timeout_s < float("inf")):
            raise ValueError(f"Invalid FileLimits.lock_timeout_s: expected a finite number > 0, got {self.lock_timeout_s!r}")


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


def _decode(fd: int, path: str, limits: FileLimits) -> str:
    """The text of an open file, or ToolError for huge or binary files."""
    size = os.fstat(fd).st_size
    raw = read_fd(fd, limits.max_file_bytes) if size <= limits.max_file_bytes else None
    if raw is None:
        raise ToolError(
            f"file {path!r} is {max(size, limits.max_file_bytes + 1)} bytes, "
            f"over the {limits.max_file_bytes}-byte limit of this tool"
        )
    if b"\x00" in raw[:8192]:
        raise ToolError(f"file {path!r} looks binary (NUL byte); this tool only handles UTF-8 text")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToolError(f"file {path!r} is not valid UTF-8 (byte {exc.start}); this tool only handles text") from None


def read_text_file(
    workspace: Path, path: str, *, approved: Path | None = None, limits: FileLimits = FileLimits()
) -> tuple[Path, str]:
    """(real path, text) of a workspace file, or ToolError for missing, binary or huge files.

    `approved` is the real path a capability was checked against: it is opened as is, and a
    symlink met on the way (the path changed since the check) is refused."""
    real = approved if approved is not None else resolve_in_workspace(workspace, path)
    with open_parent(workspace, real, path) as (dir_fd, name):
        fd = open_regular_file(dir_fd, name, path)
        try:
            return real, _decode(fd, path, limits)
        finally:
            os.close(fd)


# --- file_view ----------------------------------------------------------------------------
def _numbered(lines: list[str], first_line: int) -> tuple[str, bool]:
    out, cut = [], False
    for i, line in enumerate(lines):
        if len(line) > MAX_LINE_CHARS:
            line, cut = f"{line[:MAX_LINE_CHARS]}[... line cut at {MAX_LINE_CHARS} chars]", True
        out.append(f"{first_line + i:>6}\t{line}")
    return "\n".join(out), cut


def file_view(
    args: FileViewArgs, workspace: Path, *, approved: Path | None = None, limits: FileLimits = FileLimits()
) -> ToolResult:
    """Lines offset..offset+limit-1 with numbers, and a note on where the window stands."""
    real, text = read_text_file(workspace, args.path, approved=approved, limits=limits)
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
def _snippet(text: str, index: int, new_str: str) -> tuple[str, int]:
    """Numbered lines around the first replacement and the line number where it starts."""
    line_no = text.count("\n", 0, index) + 1
    lines = text.splitlines()
    start = max(line_no - SNIPPET_CONTEXT_LINES, 1)
    stop = min(line_no + new_str.count("\n") + SNIPPET_CONTEXT_LINES, len(lines))
    body, _ = _numbered(lines[start - 1 : stop], start)
    return body, line_no


def _replaced(args: FileEditArgs, text: str, limits: FileLimits) -> tuple[str, int]:
    """(edited text, number of replacements), or ToolError with the file left unchanged."""
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
    num_new_bytes = len(args.new_str.encode("utf-8"))
    # checked before building the result: 65536 copies of 64 KiB would be 4 GiB
    size = len(text.encode("utf-8")) + count * (num_new_bytes - len(args.old_str.encode("utf-8")))
    if size > limits.max_result_bytes:
        raise ToolError(
            f"the edit would make {args.path!r} {size} bytes ({count} replacement(s) by {num_new_bytes} bytes), "
            f"over the {limits.max_result_bytes}-byte limit of file_edit; the file is unchanged"
        )
    return text.replace(args.old_str, args.new_str), count


def file_edit(
    args: FileEditArgs, workspace: Path, *, approved: Path | None = None, limits: FileLimits = FileLimits()
) -> ToolResult:
    """Replace `old_str` by `new_str` (once, or everywhere with allow_multiple), locked and atomic."""
    real = approved if approved is not None else resolve_in_workspace(workspace, args.path)
    with open_parent(workspace, real, args.path) as (dir_fd, name):
        sweep_stale_temps(dir_fd)
        with locked_file(dir_fd, name, args.path, limits.lock_timeout_s) as (fd, st):
            text = _decode(fd, args.path, limits)
            edited, count = _replaced(args, text, limits)
            replace_file(dir_fd, name, st, edited.encode("utf-8"), args.path)
    snippet, line_no = _snippet(edited, text.index(args.old_str), args.new_str)
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
