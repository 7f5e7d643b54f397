"""Resolve tool paths inside one workspace directory, and open them without a race.

Two halves. `resolve_in_workspace` is the check: the path is joined to the workspace (absolute
paths are taken as given), resolved with `realpath` (so `..` and every symlink are followed) and
admitted only when the result lies under the workspace by path components, never by string
prefix (`/work` does not admit `/workspace_evil`). A check by name cannot hold while another
process swaps a directory for a symlink, so the tools never reopen that name: `open_path`,
`open_parent` and `walk_tree` open the resolved path one component at a time from a workspace
directory fd with `O_NOFOLLOW | O_DIRECTORY`, and every read, temporary file and rename goes
through the fds they hand out. A symlink met on that walk (the path changed after the check) is
refused. Not defended: a directory moved out of the workspace mid-call by a process that sees
both sides (the shell sandbox sees only the workspace).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from surecall.errors import PathOutsideWorkspace, ToolError

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO planted in the workspace must not hang the tool
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
MAX_WALK_DEPTH = 64  # walk_tree holds one fd per level


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
    try:
        resolved = Path(os.path.realpath(candidate))
    except OSError as exc:  # a component changed while realpath walked it (EINVAL, ELOOP)
        raise ToolError(f"path {path!r} could not be resolved ({exc.strerror}); nothing was done") from None
    if not is_within(resolved, root):
        raise PathOutsideWorkspace(
            f"path {path!r} resolves to {str(resolved)!r}, outside the workspace {str(root)!r}"
        )
    return resolved


def display_path(path: Path, workspace: str | os.PathLike) -> str:
    """`path` relative to the workspace, for observations ('.' for the workspace itself)."""
    rel = os.path.relpath(path, real_workspace(workspace))
    return "." if rel == os.curdir else rel


# --- race-free opening --------------------------------------------------------------------
def _is_symlink(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _walk_error(exc: OSError, shown: str, dir_fd: int, name: str) -> ToolError:
    """The ToolError for a failed open of `name` in `dir_fd` on the way to `shown`."""
    if exc.errno == errno.ENOENT:
        return ToolError(f"path {shown!r} does not exist")
    if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_symlink(dir_fd, name):
        return ToolError(
            f"path {shown!r} changed while the tool ran ({name!r} is now a symbolic link); nothing was done"
        )
    if exc.errno == errno.ENOTDIR:
        return ToolError(f"path {shown!r}: {name!r} is not a directory")
    return ToolError(f"path {shown!r} could not be opened at {name!r}: {exc.strerror}")


def _components(real: Path, root: Path) -> tuple[str, ...]:
    if not is_within(real, root):
        raise PathOutsideWorkspace(f"path {str(real)!r} is outside the workspace {str(root)!r}")
    return real.parts[len(root.parts) :]


def _walk(root: Path, names: tuple[str, ...], shown: str) -> int:
    """An fd of root/names[0]/..., each component opened from its parent's fd, no symlink followed."""
    fd = os.open(root, DIR_FLAGS)
    for name in names:
        try:
            child = os.open(name, DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            raise _walk_error(exc, shown, fd, name) from None
        finally:
            os.close(fd)
        fd = child
    return fd


def _open_leaf(dir_fd: int, name: str, shown: str) -> int:
    try:
        return os.open(name, FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise _walk_error(exc, shown, dir_fd, name) from None


@contextmanager
def open_path(workspace: Path, real: Path, shown: str) -> Iterator[int]:
    """A read-only fd of `real` (a resolved workspace path: file or directory), closed on exit."""
    root = real_workspace(workspace)
    names = _components(real, root)
    fd = _walk(root, names[:-1], shown)
    if names:
        try:
            leaf = _open_leaf(fd, names[-1], shown)
        finally:
            os.close(fd)
        fd = leaf
    try:
        yield fd
    finally:
        os.close(fd)


@contextmanager
def open_parent(workspace: Path, real: Path, shown: str) -> Iterator[tuple[int, str]]:
    """(fd of the directory holding `real`, the last name of `real`), the fd closed on exit."""
    root = real_workspace(workspace)
    names = _components(real, root)
    if not names:
        raise ToolError(f"{shown!r} is not a regular file")
    fd = _walk(root, names[:-1], shown)
    try:
        yield fd, names[-1]
    finally:
        os.close(fd)


def open_regular_file(dir_fd: int, name: str, shown: str) -> int:
    """A read-only fd of the regular file `name` in `dir_fd` (never through a symlink)."""
    fd = _open_leaf(dir_fd, name, shown)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ToolError(f"{shown!r} is not a regular file")
    return fd


def walk_tree(
    dir_fd: int, rel: str = ".", skip_dirs: frozenset[str] = frozenset(), depth: int = 0
) -> Iterator[tuple[str, int, list[tuple[str, bool]]]]:
    """(relative directory, its fd, sorted [(name, is_symlink)] of its regular files and symlinks)
    for each directory under `dir_fd`, top-down. Subdirectories are opened by name from their
    parent's fd with O_NOFOLLOW, so a directory swapped for a symlink is skipped, not entered;
    below MAX_WALK_DEPTH levels nothing is opened (at most that many fds are held)."""
    with os.scandir(dir_fd) as it:
        entries = sorted(it, key=lambda e: e.name)
    files = [(e.name, e.is_symlink()) for e in entries if e.is_symlink() or e.is_file(follow_symlinks=False)]
    yield rel, dir_fd, files
    if depth >= MAX_WALK_DEPTH:
        return
    for entry in entries:
        if entry.name in skip_dirs or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            child = os.open(entry.name, DIR_FLAGS, dir_fd=dir_fd)
        except OSError:
            continue  # gone, or swapped for something that is not a directory
        try:
            yield from walk_tree(child, os.path.join(rel, entry.name), skip_dirs, depth + 1)
        finally:
            os.close(child)


def read_fd(fd: int, max_bytes: int) -> bytes | None:
    """Up to `max_bytes` bytes of an open file from its start, or None when it holds more."""
    chunks, total = [], 0
    while total <= max_bytes:
        chunk = os.pread(fd, min(1 << 20, max_bytes + 1 - total), total)
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return None if total > max_bytes else b"".join(chunks)
