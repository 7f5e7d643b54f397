"""Give the sandbox's unprivileged uid the root-owned entries of a workspace, safely.

A runtime that runs as root runs each command as an unprivileged uid, which must be able to
read (and, with `write`, change) the workspace: `hand_over` chowns the root-owned directories and
regular files under a directory to that uid. The command may be rewriting the tree at the same
time, so nothing is followed by name: directories are walked by fd (`os.fwalk`, no symlinks),
each entry is opened `O_NOFOLLOW` and changed through its fd (`fchown`) after `fstat` shows it is
still a root-owned directory or a regular file with one link (a hard link could name a file
outside). Symlinks, devices, FIFOs and sockets are left alone. It never grants anything to root.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def hand_over(directory: Path, uid: int, gid: int) -> int:
    """Chown the root-owned entries under `directory` (itself included) to `uid:gid`; how many."""
    if uid == 0 or gid == 0:
        raise ValueError(f"Invalid hand-over target: expected a non-root uid and gid, got {uid}:{gid}")
    changed = _chown_entry(os.fspath(directory.parent), directory.name, uid, gid, dir_fd=None)
    for _root, dirs, files, dir_fd in os.fwalk(directory, follow_symlinks=False):
        for name in dirs + files:
            changed += _chown_entry(None, name, uid, gid, dir_fd=dir_fd)
    return changed


def _chown_entry(parent: str | None, name: str, uid: int, gid: int, *, dir_fd: int | None) -> int:
    path = name if parent is None else os.path.join(parent, name)
    try:
        before = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
        if not _is_ours_to_change(before):
            return 0
        fd = os.open(path, _OPEN_FLAGS, dir_fd=dir_fd)
    except OSError:
        return 0  # gone, a symlink now (ELOOP), or unopenable: leave it
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (before.st_dev, before.st_ino) or not _is_ours_to_change(now):
            return 0
        os.fchown(fd, uid, gid)  # also clears any setuid/setgid bit of a regular file
        return 1
    finally:
        os.close(fd)


def _is_ours_to_change(st: os.stat_result) -> bool:
    if st.st_uid != 0:
        return False
    return stat.S_ISDIR(st.st_mode) or (stat.S_ISREG(st.st_mode) and st.st_nlink == 1)
