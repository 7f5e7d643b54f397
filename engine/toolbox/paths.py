"""Resolve tool paths inside one workspace directory.

Every path a tool touches goes through `resolve_in_workspace`: the path is joined to the
workspace (absolute paths are taken as given), resolved with `realpath` (so `..` and every
symlink are followed), and admitted only when the result lies under the workspace by path
components, never by string prefix (`/work` does not admit `/workspace_evil`). It does not
open anything, and it cannot rule out a symlink swapped in after the check (the runtime runs
one call at a time; the shell sandbox cannot reach outside the workspace anyway).
"""

from __future__ import annotations

import os
from pathlib import Path

from surecall.errors import PathOutsideWorkspace, ToolError


def real_workspace(workspace: str | os.PathLike) -> Path:
    """The workspace as an existing, fully resolved directory."""
    path = Path(os.path.realpath(workspace))
    if not path.is_dir():
        raise ToolError(f"workspace {str(workspace)!r} is not a directory")
    return path


def is_within(path: Path, root: Path) -> bool:
    """True when `path` equals `root` or lies below it, compared component by component."""
    return path.parts[: len(root.parts)] == root.parts


def resolve_in_workspace(workspace: str | os.PathLike, path: str) -> Path:
    """The real path of `path` (relative to the workspace), or PathOutsideWorkspace."""
    if "\x00" in path:
        raise ToolError(f"path {path!r} contains a NUL byte")
    root = real_workspace(workspace)
    candidate = Path(path) if os.path.isabs(path) else root / path
    resolved = Path(os.path.realpath(candidate))
    if not is_within(resolved, root):
        raise PathOutsideWorkspace(
            f"path {path!r} resolves to {str(resolved)!r}, outside the workspace {str(root)!r}"
        )
    return resolved


def display_path(path: Path, workspace: str | os.PathLike) -> str:
    """`path` relative to the workspace, for observations ('.' for the workspace itself)."""
    rel = os.path.relpath(path, real_workspace(workspace))
    return "." if rel == os.curdir else rel
