"""The command's directory, opened without following symlinks, and handed over to the sandbox uid.

A command may rewrite its workspace at any time (another command can run concurrently), so
the directory a command runs in is opened component by component from `/` with `O_NOFOLLOW`
(`open_directory`); the sandbox then binds that fd (`--bind-fd`), never the path again. A
runtime that runs as root runs each command as an unprivileged uid, which must be able to read
(and, with `write`, change) the directory: `hand_over` chowns its root-owned directories and
regular files to that uid, walking by fd (each directory opened `O_NOFOLLOW` from its parent's
fd, `MAX_DEPTH` levels at most) and changing each entry through its own fd after `fstat` shows
it is still the root-owned directory, or regular file with one link (a hard link could name a
file outside), that was listed. Symlinks, devices, FIFOs and sockets are left alone; nothing is
ever given to root.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from surecall.errors import PathOutsideWorkspace

_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_DEPTH = 128  # levels handed over below the command's directory; bounds recursion and open fds


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
    """Chown the root-owned entries under the directory `dir_fd` (itself included, at most
    `MAX_DEPTH` levels down) to `uid:gid`; how many."""
    if uid == 0 or gid == 0:
        raise ValueError(f"Invalid hand-over target: expected a non-root uid and gid, got {uid}:{gid}")
    return _chown_fd(dir_fd, os.fstat(dir_fd), uid, gid) + _hand_over_entries(dir_fd, uid, gid, 1)


def _hand_over_entries(dir_fd: int, uid: int, gid: int, depth: int) -> int:
    """Recursion bounded by MAX_DEPTH (so are the open fds): a deeper tree is left as it is."""
    try:
        names = os.listdir(dir_fd)
    except OSError:
        return 0
    changed = 0
    for name in names:
        try:
            before = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(before.st_mode) and depth < MAX_DEPTH:
            changed += _hand_over_directory(dir_fd, name, before, uid, gid, depth)
        elif _is_ours_to_change(before):
            changed += _chown_entry(dir_fd, name, before, uid, gid)
    return changed


def _hand_over_directory(parent_fd: int, name: str, before: os.stat_result, uid: int, gid: int, depth: int) -> int:
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError:
        return 0  # gone, or a symlink now (ELOOP): leave it
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (before.st_dev, before.st_ino):
            return 0
        return _chown_fd(fd, now, uid, gid) + _hand_over_entries(fd, uid, gid, depth + 1)
    finally:
        os.close(fd)


def _chown_entry(dir_fd: int, name: str, before: os.stat_result, uid: int, gid: int) -> int:
    try:
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
