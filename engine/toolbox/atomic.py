"""Atomic, locked replacement of one workspace file through its directory fd.

`locked_file` opens the file under an exclusive `flock` and retries until the lock is held on
the inode the name still points to (an edit that waited while another replaced the file must
read the new one, or it would undo it). `replace_file` writes a temporary file in the same
directory, fsyncs it, checks that nobody replaced or rewrote the target meanwhile, and renames
it over the target, all against the directory fd. Temporary names carry a prefix and the
writer's pid, so `sweep_stale_temps` can remove the ones a SIGKILL left behind. The lock is
advisory: it orders file_edit calls (threads or processes), not a shell writing the same file.
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from surecall.errors import ToolError
from surecall.toolbox.paths import DIR_FLAGS, open_regular_file, walk_tree

TEMP_PREFIX = ".surecall-tmp."
TEMP_NAME = re.compile(r"\.surecall-tmp\.(\d{1,10})\.[0-9a-f]{16}\.")
STALE_TEMP_S = 600.0  # no edit takes this long: an older temporary file is an orphan whatever its pid
MAX_SWEEP_ENTRIES = 100_000  # the workspace-wide sweep stops after this many directory entries


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _current(dir_fd: int, name: str) -> tuple[int, int, int, int] | None:
    try:
        return _identity(os.stat(name, dir_fd=dir_fd, follow_symlinks=False))
    except FileNotFoundError:
        return None


def _flock(fd: int, deadline: float, shown: str, timeout_s: float) -> None:
    delay = 0.0005
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise ToolError(
                    f"file {shown!r} stayed locked by another edit for {timeout_s} s; the file is unchanged"
                ) from None
            time.sleep(delay)
            delay = min(delay * 2, 0.01)


@contextmanager
def locked_file(dir_fd: int, name: str, shown: str, timeout_s: float) -> Iterator[tuple[int, os.stat_result]]:
    """(fd, stat) of the regular file `name`, exclusively locked, the inode its name points to."""
    deadline = time.monotonic() + timeout_s
    while True:
        fd = open_regular_file(dir_fd, name, shown)
        try:
            _flock(fd, deadline, shown, timeout_s)
            st = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        if _current(dir_fd, name) == _identity(st):
            break
        os.close(fd)  # replaced while we waited for the lock: lock the new file instead
        if time.monotonic() > deadline:
            raise ToolError(f"file {shown!r} kept being replaced for {timeout_s} s; the file is unchanged")
    try:
        yield fd, st
    finally:
        os.close(fd)  # releases the lock, after the rename


def _temp_name(name: str) -> str:
    return f"{TEMP_PREFIX}{os.getpid()}.{secrets.token_hex(8)}.{name[:40]}"


def _unlink_quietly(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def _write_temp(dir_fd: int, payload: bytes, st: os.stat_result, name: str) -> str:
    tmp = _temp_name(name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            if os.geteuid() == 0:
                os.fchown(f.fileno(), st.st_uid, st.st_gid)  # before fchmod: chown clears setuid bits
            os.fchmod(f.fileno(), st.st_mode & 0o7777)
            os.fsync(f.fileno())
    except BaseException:
        _unlink_quietly(dir_fd, tmp)
        raise
    return tmp


def replace_file(dir_fd: int, name: str, st: os.stat_result, payload: bytes, shown: str) -> None:
    """Replace `name` (locked, last seen as `st`) by `payload`: the old or the new file, never half."""
    tmp = _write_temp(dir_fd, payload, st, name)
    try:
        if _current(dir_fd, name) != _identity(st):
            raise ToolError(f"file {shown!r} was changed by another writer during the edit; the edit was not applied")
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        _unlink_quietly(dir_fd, tmp)
        raise
    os.fsync(dir_fd)  # the rename itself survives a power cut


# --- orphans ------------------------------------------------------------------------------
def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def _is_orphan(entry: os.DirEntry, now: float) -> bool:
    match = TEMP_NAME.match(entry.name)
    try:
        if match is None or not entry.is_file(follow_symlinks=False):
            return False
        return not _pid_alive(int(match[1])) or now - entry.stat(follow_symlinks=False).st_mtime > STALE_TEMP_S
    except FileNotFoundError:
        return False  # renamed into place meanwhile by its (live) writer


def sweep_stale_temps(dir_fd: int) -> int:
    """Remove the orphaned temporary files of dead writers in one directory; how many."""
    num_removed, now = 0, time.time()
    try:
        with os.scandir(dir_fd) as entries:
            orphans = [entry.name for entry in entries if _is_orphan(entry, now)]
    except OSError:
        return 0  # an unlistable directory: sweeping is best effort, the edit goes on
    for name in orphans:
        _unlink_quietly(dir_fd, name)
        num_removed += 1
    return num_removed


def sweep_workspace_temps(workspace: Path, skip_dirs: frozenset[str] = frozenset({".git"})) -> int:
    """`sweep_stale_temps` over the workspace tree (symlinks not followed, bounded); how many."""
    num_removed = num_entries = 0
    root_fd = os.open(workspace, DIR_FLAGS)
    try:
        for _rel, dir_fd, files in walk_tree(root_fd, skip_dirs=skip_dirs):
            num_entries += len(files) + 1
            if any(name.startswith(TEMP_PREFIX) for name, _ in files):
                num_removed += sweep_stale_temps(dir_fd)
            if num_entries > MAX_SWEEP_ENTRIES:
                break
    finally:
        os.close(root_fd)
    return num_removed
