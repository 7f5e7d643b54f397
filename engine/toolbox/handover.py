"""The command's directory, opened without following symlinks, and handed over to the sandbox uid.

A command may rewrite its workspace at any time (another command can run concurrently), so
the directory a command runs in is opened component by component from `/` with `O_NOFOLLOW`
(`open_directory`); the sandbox then binds that fd (`--bind-fd`), never the path again. A
runtime that runs as root runs each command as an unprivileged uid, which must be able to read
(and, with `write`, change) the directory: `hand_over` chowns its root-owned directories and
regular files to that uid, walking by fd (`os.fwalk`, no symlinks) and changing each entry
through its own `O_NOFOLLOW` fd after `fstat` shows it is still a root-owned directory or a
regular file with one link (a hard link could name a file outside). Symlinks, devices, FIFOs
and sockets are left alone; nothing is ever given to root.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from surecall.errors import PathOutsideWorkspace

_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_directory(path: Path) -> int:
    """An fd (close-on-exec) of the directory `path` reached from `/` through no symlink;
    PathOutsideWorkspace when a component is a symlink or not a directory (any more)."""
    if not path.is_absolute() or any(part in (".", "..") for part in path.parts):
        raise PathOutsideWorkspace(f"bash_execute refused: {str(path)!r} is not an absolute, normalised path")
    fd = os.open("/", _DIR_FLAGS)
    try:
        for part in path.parts[1:]:
            fd_next = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = fd_next
    except OSError as exc:
        os.close(fd)
        raise PathOutsideWorkspace(
            f"bash_execute refused: {str(path)!r} is not a directory reached without symlinks now "
            f"({exc.strerror} at {part!r}); was a component replaced?"
        ) from exc
    return fd


def hand_over(dir_fd: int, uid: int, gid: int) -> int:
    """Chown the root-owned entries under the directory `dir_fd` (itself included) to `uid:gid`; how many."""
    if uid == 0 or gid == 0:
        raise ValueError(f"Invalid hand-over target: expected a non-root uid and gid, got {uid}:{gid}")
    changed = _chown_fd(dir_fd, os.fstat(dir_fd), uid, gid)
    for _root, dirs, files, fd in os.fwalk(".", dir_fd=dir_fd, follow_symlinks=False):
        for name in dirs + files:
            changed += _chown_entry(fd, name, uid, gid)
    return changed


def _chown_entry(dir_fd: int, name: str, uid: int, gid: int) -> int:
    try:
        before = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if not _is_ours_to_change(before):
            return 0
        fd = os.open(name, _OPEN_FLAGS, dir_fd=dir_fd)
    except OSError:
        return 0  # gone, a symlink now (ELOOP), or unopenable: leave it
    try:
        now = os.fstat(fd)
        return _chown_fd(fd, now, uid, gid) if (now.st_dev, now.st_ino) == (before.st_dev, before.st_ino) else 0
    finally:
        os.close(fd)


def _chown_fd(fd: int, st: os.stat_result, uid: int, gid: int) -> int:
    if not _is_ours_to_change(st):
        return 0
    os.fchown(fd, uid, gid)  # also clears any setuid/setgid bit of a regular file
    return 1


def _is_ours_to_change(st: os.stat_result) -> bool:
    if st.st_uid != 0:
        return False
    return stat.S_ISDIR(st.st_mode) or (stat.S_ISREG(st.st_mode) and st.st_nlink == 1)
