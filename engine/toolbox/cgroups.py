"""Per-command cgroups for the shell sandbox: a process cap (`pids.max`) and a memory cap.

One throw-away cgroup per command and per hierarchy where this process may make one: cgroup v1
(`pids`; `memory` with `memory.limit_in_bytes`, plus `memory.memsw.limit_in_bytes` where swap is
accounted), or cgroup v2 under our own cgroup where it delegates the controller, else under the
v2 root where we may (`pids.max`, `memory.max`, `memory.swap.max`). The memory cap charges all
processes of the command together, and the tmpfs pages it writes (/tmp, /dev/shm) too. Names
carry the owner's pid and start time, so `sweep_leaked()` removes the cgroups of a runtime that
died, and only those (owners are looked up in this pid namespace). It does not create
hierarchies, enable controllers or touch cgroups it did not name.
"""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PREFIX = "surecall-"
_NAME = re.compile(r"^surecall-(\d+)-(\d+)-[0-9a-f]+$")


def _own_cgroups() -> dict[str, str]:
    """controller (or '' for v2) -> this process's cgroup path, from /proc/self/cgroup."""
    own = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return own
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            own[name] = path
    return own


def parents(controller: str) -> list[Path]:
    """Directories under which a child cgroup with `controller` may be made (v1 first, then v2)."""
    own, found = _own_cgroups(), []
    v1 = CGROUP_ROOT / controller
    if controller in own and (v1 / "cgroup.procs").exists():
        found.append(Path(str(v1) + own[controller].rstrip("/")))
    for mount in (CGROUP_ROOT, CGROUP_ROOT / "unified"):  # v2: our own cgroup, then the hierarchy's root
        for parent in dict.fromkeys((Path(str(mount) + own.get("", "/").rstrip("/")), mount)):
            try:
                if controller in (parent / "cgroup.subtree_control").read_text().split():
                    found.append(parent)
            except OSError:
                continue
    return found


def _start_ticks(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22: start time in clock ticks after boot


def _new_name() -> str:
    return f"{PREFIX}{os.getpid()}-{_start_ticks(os.getpid()) or 0}-{uuid.uuid4().hex[:12]}"


def _limit_files(parent: Path, controller: str, value: int) -> list[tuple[str, str, bool]]:
    """(file, value, required) to write for a cap of `value` on `controller` in a child of `parent`."""
    is_v1 = parent.is_relative_to(CGROUP_ROOT / controller)
    if controller == "pids":
        return [("pids.max", str(value), True)]
    if is_v1:  # limit_in_bytes first: memsw may never be below it
        return [("memory.limit_in_bytes", str(value), True), ("memory.memsw.limit_in_bytes", str(value), False)]
    return [("memory.max", str(value), True), ("memory.swap.max", "0", False)]


class CommandCgroup:
    """The cgroups of one command: one directory per hierarchy, each holding its caps."""

    def __init__(self, dirs: dict[str, Path]):
        self.dirs = dirs  # controller -> directory (v2: the same directory for both)

    @classmethod
    def create(cls, limits: dict[str, int]) -> CommandCgroup:
        """Make a child cgroup per controller in `limits` ({"pids": n, "memory": bytes}) where
        this process may; controllers it may not are left out (see `enforced`)."""
        name, dirs = _new_name(), {}
        for controller, value in limits.items():
            for parent in parents(controller):
                path = parent / name  # on v2 one directory holds every controller's cap
                if _make(path, _limit_files(parent, controller, value), is_new=path not in dirs.values()):
                    dirs[controller] = path
                    break
        return cls(dirs)

    @property
    def enforced(self) -> tuple[str, ...]:
        return tuple(sorted(self.dirs))

    def enter(self) -> None:
        """Called in the child before exec: move this process (and so its descendants) in."""
        for path in dict.fromkeys(self.dirs.values()):
            with open(path / "cgroup.procs", "w") as f:
                f.write(str(os.getpid()))

    def oom_kills(self) -> int:
        """How many processes the memory cap killed (0 where the kernel does not count them)."""
        path = self.dirs.get("memory")
        if path is None:
            return 0
        for events in ("memory.events", "memory.oom_control"):
            try:
                fields = dict(line.split() for line in (path / events).read_text().splitlines() if line.strip())
                return int(fields.get("oom_kill", 0))
            except (OSError, ValueError):
                continue
        return 0

    def kill_all(self) -> None:
        for path in dict.fromkeys(self.dirs.values()):
            _kill_members(path)

    def remove(self) -> None:
        for path in dict.fromkeys(self.dirs.values()):
            _remove(path)


def _make(path: Path, files: list[tuple[str, str, bool]], *, is_new: bool) -> bool:
    try:
        if is_new:
            path.mkdir()
    except OSError:
        return False
    for file, value, required in files:
        try:
            (path / file).write_text(value)
        except OSError:
            if required:
                if is_new:
                    _remove(path)
                return False
    return True


def _kill_members(path: Path) -> None:
    for _ in range(50):
        try:
            pids = [int(p) for p in (path / "cgroup.procs").read_text().split()]
        except OSError:
            return
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)


def _remove(path: Path) -> None:
    _kill_members(path)
    for _ in range(50):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)


def _is_leaked(entry: Path) -> bool:
    match = _NAME.match(entry.name)
    if match is None:  # an earlier version's name records no owner: it may be live, leave it
        return False
    pid, ticks = match.groups()
    return _start_ticks(int(pid)) != ticks  # the owner is gone (or its pid was reused)


def sweep_leaked() -> list[str]:
    """Remove (killing what is left in them) the cgroups whose owning runtime is dead; their paths."""
    swept = []
    for controller in ("pids", "memory"):
        for parent in parents(controller):
            try:
                entries = [e for e in parent.iterdir() if e.name.startswith(PREFIX) and e.is_dir()]
            except OSError:
                continue
            for entry in entries:
                if _is_leaked(entry):
                    _remove(entry)
                    swept.append(str(entry))
    return swept
