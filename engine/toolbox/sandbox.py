"""Run one shell command in a bubblewrap sandbox with limits, and report what happened.

The sandbox sees a minimal read-only system (/usr, /etc and the merged-usr links), secrets in
/etc (shadow, gshadow, ssh host keys) masked, a fresh /tmp, /proc and /dev, no network (its
own empty network namespace), its own pid namespace (everything dies with the command) and the
workspace bound read-write at its real path. Limits: wall time (the process group is killed at
`timeout_ms`), CPU seconds, file size (RLIMIT_FSIZE), address space, and process count
(RLIMIT_NPROC, which Linux does not enforce for uid 0, plus a pids cgroup with `pids.max` when
one is writable). stdout and stderr are each cut at `max_output_bytes` with a marker.
It does not filter system calls (no seccomp) and does not decide who may run what: the
runtime's capability check does. Unsandboxed execution happens only when configured, and is
best effort: the process group is killed, but a command that calls `setsid` escapes it unless a
pids cgroup holds it.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from surecall.errors import SandboxUnavailable

MASKED_FILES = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers")
MASKED_DIRS = ("/etc/ssh", "/etc/ssl/private", "/etc/sudoers.d")
SHELL = "/bin/bash"


@dataclass(frozen=True)
class SandboxConfig:
    """Limits and the system view of the shell sandbox. `allow_unsandboxed` must be set on purpose."""

    bwrap_path: str = "/usr/bin/bwrap"
    max_output_bytes: int = 64 * 1024  # per stream
    max_processes: int = 128
    max_file_bytes: int = 64 * 1024 * 1024  # RLIMIT_FSIZE: no single file written beyond this
    max_memory_bytes: int = 4 * 1024 * 1024 * 1024  # RLIMIT_AS per process
    max_tmp_bytes: int = 64 * 1024 * 1024  # size of the sandbox's private /tmp
    ro_paths: tuple[str, ...] = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc")
    env: dict[str, str] = field(
        default_factory=lambda: {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp"}
    )
    allow_unsandboxed: bool = False

    def __post_init__(self) -> None:
        for name in ("max_output_bytes", "max_processes", "max_file_bytes", "max_memory_bytes", "max_tmp_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Invalid SandboxConfig.{name}: expected a positive integer, got {value!r}")


@dataclass(frozen=True)
class ExecResult:
    exit_status: int | None  # None when killed at the timeout
    stdout: str
    stderr: str
    is_timed_out: bool
    is_truncated: bool
    duration_s: float
    is_sandboxed: bool
    limits: dict


# --- the bubblewrap command line -------------------------------------------------------------
def bwrap_argv(config: SandboxConfig, workspace: Path, *, has_size_option: bool = True) -> list[str]:
    """The bwrap arguments (before `--`) for a sandbox around `workspace`. `--size` (a bounded
    /tmp) needs bubblewrap >= 0.7; older ones get an unbounded /tmp (RLIMIT_FSIZE still holds)."""
    argv = [config.bwrap_path, "--unshare-all", "--die-with-parent", "--new-session"]
    for path in config.ro_paths:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            argv += ["--ro-bind", path, path]
    argv += [arg for path in MASKED_FILES if os.path.isfile(path) for arg in ("--ro-bind", "/dev/null", path)]
    argv += [arg for path in MASKED_DIRS if os.path.isdir(path) for arg in ("--tmpfs", path)]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += (["--size", str(config.max_tmp_bytes)] if has_size_option else []) + ["--tmpfs", "/tmp"]
    argv += ["--bind", str(workspace), str(workspace), "--chdir", str(workspace)]
    if os.geteuid() == 0:
        argv += ["--cap-drop", "ALL"]
    return argv


# --- process-count limit: a pids cgroup where one is writable ---------------------------------
class PidsCgroup:
    """A throw-away pids cgroup capping the command's process count; `None` where unavailable."""

    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def create(cls, max_processes: int) -> PidsCgroup | None:
        for parent in _pids_cgroup_parents():
            path = parent / f"surecall-{uuid.uuid4().hex[:12]}"
            try:
                path.mkdir()
                (path / "pids.max").write_text(str(max_processes))
                return cls(path)
            except OSError:
                if path.exists():
                    cls(path).remove()
        return None

    def enter(self) -> None:
        """Called in the child before exec: move this process (and so its descendants) in."""
        with open(self.path / "cgroup.procs", "w") as f:
            f.write(str(os.getpid()))

    def kill_all(self) -> None:
        for _ in range(50):
            try:
                pids = [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
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

    def remove(self) -> None:
        self.kill_all()
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.01)


def _pids_cgroup_parents():
    """Directories where a child pids cgroup may be made: cgroup v1's pids root, then our v2 cgroup."""
    if os.path.exists("/sys/fs/cgroup/pids/tasks"):
        yield Path("/sys/fs/cgroup/pids")
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return
    own = next((line[3:] for line in lines if line.startswith("0::")), None)
    for mount in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        parent = Path(mount + (own or "/").rstrip("/"))
        try:
            if "pids" in (parent / "cgroup.subtree_control").read_text().split():
                yield parent
        except OSError:
            continue


# --- running -----------------------------------------------------------------------------------
def _count_user_processes(uid: int) -> int:
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    count += 1
            except OSError:
                pass
    return count


def _preexec(config: SandboxConfig, cpu_s: int, nproc: int, cgroup: PidsCgroup | None):
    def apply_limits() -> None:
        if cgroup is not None:
            cgroup.enter()
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (config.max_file_bytes, config.max_file_bytes))
        resource.setrlimit(resource.RLIMIT_AS, (config.max_memory_bytes, config.max_memory_bytes))
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply_limits


class _Drain(threading.Thread):
    """Reads a pipe to its end, keeping the first `max_bytes` and counting the rest."""

    def __init__(self, stream, max_bytes: int):
        super().__init__(daemon=True)
        self.stream, self.max_bytes = stream, max_bytes
        self.kept, self.num_dropped = bytearray(), 0

    def run(self) -> None:
        while chunk := self.stream.read1(65536):  # read1: whatever is there, never waits for a full block
            room = self.max_bytes - len(self.kept)
            self.kept += chunk[:room]
            self.num_dropped += max(len(chunk) - room, 0)

    def text(self) -> str:
        text = self.kept.decode("utf-8", errors="replace")
        if self.num_dropped:
            text += f"\n[... truncated {self.num_dropped} bytes ...]"
        return text


class Sandbox:
    """Runs shell commands in bubblewrap (or, if configured, without it) under `config`."""

    def __init__(self, config: SandboxConfig | None = None):
        self.config = config or SandboxConfig()
        self._checked: bool | None = None
        self._why_unavailable = ""
        self._has_size_option = False

    def is_available(self) -> bool:
        """Whether bubblewrap can set up a sandbox here (checked once, with a trivial command)."""
        if self._checked is None:
            self._checked, self._why_unavailable = self._probe()
        return self._checked

    def _probe(self) -> tuple[bool, str]:
        if shutil.which(self.config.bwrap_path) is None:
            return False, f"{self.config.bwrap_path} not found (install the 'bubblewrap' package)"
        with tempfile.TemporaryDirectory(prefix="surecall-probe-") as tmp:
            try:
                usage = subprocess.run([self.config.bwrap_path, "--help"], capture_output=True, timeout=10)
                self._has_size_option = b"--size" in usage.stdout + usage.stderr
                argv = self._argv(Path(os.path.realpath(tmp))) + [SHELL, "-c", "true"]
                done = subprocess.run(argv, capture_output=True, timeout=10, env=self.config.env)
            except (OSError, subprocess.TimeoutExpired) as exc:
                return False, f"bubblewrap failed to start: {exc}"
        if done.returncode != 0:
            return False, f"bubblewrap cannot create a sandbox here: {done.stderr.decode(errors='replace').strip()}"
        return True, ""

    def run(self, command: str, workspace: Path, timeout_ms: int) -> ExecResult:
        """Run `command` with bash in `workspace`; kill everything it started at `timeout_ms`."""
        is_sandboxed = self.is_available()
        if not is_sandboxed and not self.config.allow_unsandboxed:
            raise SandboxUnavailable(
                f"bash_execute refused: {self._why_unavailable}; configure SandboxConfig(allow_unsandboxed=True) "
                "to run commands without a sandbox"
            )
        prefix = self._argv(workspace) if is_sandboxed else []
        return self._execute(prefix + [SHELL, "-c", command], workspace, timeout_ms, is_sandboxed)

    def _argv(self, workspace: Path) -> list[str]:
        return bwrap_argv(self.config, workspace, has_size_option=self._has_size_option) + ["--"]

    def _execute(self, argv: list[str], workspace: Path, timeout_ms: int, is_sandboxed: bool) -> ExecResult:
        # 1. limits: CPU a little above the wall budget, processes counted on top of the user's own
        cfg = self.config
        cpu_s = timeout_ms // 1000 + 1
        nproc = _count_user_processes(os.getuid()) + cfg.max_processes
        cgroup = PidsCgroup.create(cfg.max_processes)
        started = time.monotonic()
        # 2. run; the cgroup goes whatever happens
        try:
            proc, drains, is_timed_out = self._spawn_and_wait(argv, workspace, timeout_ms, cpu_s, nproc, cgroup)
        finally:
            if cgroup is not None:
                cgroup.remove()  # kills whatever is left in it, even a process that left the group
        limits = {"max_processes_enforced_by": _nproc_enforcer(cgroup), "cpu_s": cpu_s,
                  "max_file_bytes": cfg.max_file_bytes, "max_memory_bytes": cfg.max_memory_bytes}
        return ExecResult(
            exit_status=None if is_timed_out else proc.returncode, stdout=drains[0].text(), stderr=drains[1].text(),
            is_timed_out=is_timed_out, is_truncated=any(d.num_dropped for d in drains),
            duration_s=time.monotonic() - started, is_sandboxed=is_sandboxed, limits=limits,
        )

    def _spawn_and_wait(self, argv: list[str], workspace: Path, timeout_ms: int, cpu_s: int, nproc: int,
                        cgroup: PidsCgroup | None) -> tuple[subprocess.Popen, list[_Drain], bool]:
        """Start `argv` in a new session (its own process group), drain its pipes, and kill the
        group when it exits or at `timeout_ms`; (process, drains, timed out)."""
        cfg = self.config
        proc = subprocess.Popen(
            argv, cwd=workspace, env=cfg.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True, preexec_fn=_preexec(cfg, cpu_s, nproc, cgroup),
        )
        drains = [_Drain(proc.stdout, cfg.max_output_bytes), _Drain(proc.stderr, cfg.max_output_bytes)]
        for d in drains:
            d.start()
        is_timed_out = False
        try:
            proc.wait(timeout=timeout_ms / 1000)
        except subprocess.TimeoutExpired:
            is_timed_out = True
        _kill_group(proc.pid)  # also ends background jobs of an unsandboxed command
        if cgroup is not None:
            cgroup.kill_all()
        proc.wait()
        for d in drains:
            d.join(timeout=2)
        return proc, drains, is_timed_out


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _nproc_enforcer(cgroup: PidsCgroup | None) -> str:
    if cgroup is not None:
        return "pids cgroup"
    return "timeout only (RLIMIT_NPROC is not enforced for uid 0)" if os.getuid() == 0 else "RLIMIT_NPROC"
