"""Run one shell command in a bubblewrap sandbox with limits, and report what happened.

Who runs it: never host root. A runtime running as root starts bwrap as root (for its mounts),
and `setpriv` drops the command to `SandboxConfig.sandbox_uid:sandbox_gid` (65534 by default)
with no capabilities, no supplementary groups and `no_new_privs`; the root-owned entries of the
bound directory are first handed over to that uid (`handover`). A runtime running as another
user runs bwrap unprivileged in its own user namespace (further namespaces disabled), as itself.
What it sees: a read-only system (/usr, /etc, ...; /etc/shadow, ssh and TLS keys masked), its
own /proc with /proc/sys and /proc/sysrq-trigger bound read-only, a read-only /dev with a
bounded /dev/shm, a bounded private /tmp, no network, its own pid/ipc/uts namespaces, and the
directory the capability allows bound nosuid at its real path, opened without symlinks and
bound by fd (`handover.open_directory`): read-write (`bind="rw"`), read-only (`"ro"`) or not at
all (`"none"`). Limits per command: wall time (everything is killed at `timeout_ms`), a memory
cgroup (`memory.max` over all its processes and tmpfs pages) and a pids cgroup where writable
(`cgroups`), else RLIMIT_AS per process and RLIMIT_NPROC; CPU seconds; RLIMIT_FSIZE per file.
stdout and stderr are each cut at `max_output_bytes`.
It does not filter system calls (no seccomp), does not cap the workspace's total size (no
quota: see `SandboxConfig`) and does not decide who may run what: the capability check does.
Unsandboxed execution happens only when configured (then still as the unprivileged uid, with
the process group killed at the end: a `setsid` escapes it unless a pids cgroup holds it).
"""

from __future__ import annotations

import math
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from surecall.errors import SandboxUnavailable
from surecall.toolbox.cgroups import CommandCgroup, sweep_leaked
from surecall.toolbox.handover import hand_over, open_directory

MASKED_FILES = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers")
MASKED_DIRS = ("/etc/ssh", "/etc/ssl/private", "/etc/sudoers.d")
READ_ONLY_PROC = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus")
SHELL = "/bin/bash"
NOBODY = 65534
BIND_MODES = ("rw", "ro", "none")
# what bwrap (as root) keeps for its last steps (chdir into a 0700 directory of the sandbox uid) and
# for setpriv, which drops to the unprivileged uid and clears them all before the command runs
_SETPRIV_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_DAC_READ_SEARCH")


@dataclass(frozen=True)
class SandboxConfig:
    """Limits, identity and system view of the shell sandbox. `allow_unsandboxed` must be set on
    purpose. No workspace quota: that needs project quotas on the workspace's filesystem
    (ext4/xfs `prjquota`); RLIMIT_FSIZE bounds each file and the memory cgroup each tmpfs."""

    bwrap_path: str = "/usr/bin/bwrap"
    setpriv_path: str = "/usr/bin/setpriv"  # inside the sandbox (under ro_paths): drops root to sandbox_uid
    max_output_bytes: int = 64 * 1024  # per stream
    max_processes: int = 128
    max_file_bytes: int = 64 * 1024 * 1024  # RLIMIT_FSIZE: no single file written beyond this
    max_memory_bytes: int = 4 * 1024 * 1024 * 1024  # the whole command (memory cgroup); RLIMIT_AS per process
    max_tmp_bytes: int = 64 * 1024 * 1024  # size of the sandbox's private /tmp
    max_shm_bytes: int = 64 * 1024 * 1024  # size of its /dev/shm
    sandbox_uid: int = NOBODY  # host uid of commands when the runtime is root (a dedicated uid is better)
    sandbox_gid: int = NOBODY
    ro_paths: tuple[str, ...] = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc")
    env: dict[str, str] = field(
        default_factory=lambda: {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp"}
    )
    allow_unsandboxed: bool = False

    def __post_init__(self) -> None:
        for name in ("max_output_bytes", "max_processes", "max_file_bytes", "max_memory_bytes", "max_tmp_bytes",
                     "max_shm_bytes", "sandbox_uid", "sandbox_gid"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                what = "a non-root id (>= 1)" if name.startswith("sandbox_") else "a positive integer"
                raise ValueError(f"Invalid SandboxConfig.{name}: expected {what}, got {value!r}")


@dataclass(frozen=True)
class ExecResult:
    exit_status: int | None  # the status the command exited with; None when a signal ended it
    stdout: str
    stderr: str
    is_timed_out: bool
    is_truncated: bool
    duration_s: float
    is_sandboxed: bool
    limits: dict
    signal: int | None = None  # the signal that ended the command, where known (see `_outcome`)
    is_oom_killed: bool = False  # the memory cgroup killed one of its processes


@dataclass(frozen=True)
class BwrapFeatures:
    """What the installed bubblewrap supports (found once by `Sandbox` from `--help`)."""

    has_size_option: bool = True  # --size (bounded tmpfs): bubblewrap >= 0.7
    has_disable_userns: bool = False  # --disable-userns: bubblewrap >= 0.8


# --- the bubblewrap command line -------------------------------------------------------------
def bwrap_argv(config: SandboxConfig, workspace: Path, *, bind: str = "rw",
               features: BwrapFeatures = BwrapFeatures(), dir_fd: int | None = None) -> list[str]:
    """The bwrap arguments (before `--`) for a sandbox around `workspace` bound as `bind`: the
    directory open as `dir_fd` (bwrap checks the mount is that fd and closes it) or, without
    one, the path."""
    is_root = os.geteuid() == 0
    argv = [config.bwrap_path, *_namespaces(is_root, features), "--die-with-parent", "--new-session"]
    argv += _system_view(config)
    argv += ["--proc", "/proc"] + [a for p in READ_ONLY_PROC for a in ("--ro-bind-try", p, p)]
    argv += ["--dev", "/dev", "--perms", "1777", *_sized(config.max_shm_bytes, features), "--tmpfs", "/dev/shm",
             "--remount-ro", "/dev"]
    argv += ["--perms", "1777", *_sized(config.max_tmp_bytes, features), "--tmpfs", "/tmp"]
    argv += _workspace(workspace, bind, config, dir_fd)
    if is_root:
        argv += ["--cap-drop", "ALL"] + [a for cap in _SETPRIV_CAPS for a in ("--cap-add", cap)]
    return argv


def _namespaces(is_root: bool, features: BwrapFeatures) -> list[str]:
    if is_root:  # no user namespace: it would map the command to host root; setpriv drops instead
        return ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    return ["--unshare-all"] + (["--unshare-user", "--disable-userns"] if features.has_disable_userns else [])


def _system_view(config: SandboxConfig) -> list[str]:
    argv = []
    for path in config.ro_paths:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            argv += ["--ro-bind", path, path]
    argv += [arg for path in MASKED_FILES if os.path.isfile(path) for arg in ("--ro-bind", "/dev/null", path)]
    argv += [arg for path in MASKED_DIRS if os.path.isdir(path) for arg in ("--tmpfs", path)]
    return argv


def _sized(num_bytes: int, features: BwrapFeatures) -> list[str]:
    return ["--size", str(num_bytes)] if features.has_size_option else []


def _workspace(workspace: Path, bind: str, config: SandboxConfig, dir_fd: int | None) -> list[str]:
    """The bind (bwrap makes every bind mount nosuid and nodev), after its ancestors made 0755:
    bwrap would make them 0700 root, which the unprivileged uid could not pass."""
    if bind == "none":
        return ["--chdir", "/tmp"]
    system = [Path(p) for p in config.ro_paths]
    ancestors = [p for p in reversed(workspace.parents) if p not in (Path("/"), Path("/tmp"))
                 and not any(p.is_relative_to(s) for s in system)]
    argv = [a for p in ancestors for a in ("--perms", "0755", "--dir", str(p))]
    option = ("--bind" if bind == "rw" else "--ro-bind") + ("-fd" if dir_fd is not None else "")
    source = str(workspace) if dir_fd is None else str(dir_fd)
    return argv + [option, source, str(workspace), "--chdir", str(workspace)]


def setpriv_argv(config: SandboxConfig) -> list[str]:
    """The prefix that turns the (root) sandbox's command into `sandbox_uid` with nothing left."""
    return [config.setpriv_path, f"--reuid={config.sandbox_uid}", f"--regid={config.sandbox_gid}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]


def command_ids(config: SandboxConfig) -> tuple[int, int]:
    """The host uid and gid a command runs as: the sandbox's when we are root, else our own."""
    if os.geteuid() == 0:
        return config.sandbox_uid, config.sandbox_gid
    return os.getuid(), os.getgid()


# --- running -----------------------------------------------------------------------------------
def _timeout_s(timeout_ms: float) -> float:
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)) or not math.isfinite(timeout_ms) \
            or timeout_ms <= 0:
        raise ValueError(f"Invalid timeout_ms: expected a finite number > 0, got {timeout_ms!r}")
    return timeout_ms / 1000


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


# Signals a command starts with at their default action, however the server was started (`nohup`
# leaves SIGHUP ignored, and an ignored signal stays ignored across exec: `kill -HUP $$` would do nothing).
_DEFAULT_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2,
                    signal.SIGALRM)


def _preexec(config: SandboxConfig, cpu_s: int, nproc: int, cgroup: CommandCgroup,
             drop_to: tuple[int, int] | None, chdir_fd: int | None):
    def apply_limits() -> None:
        for signum in _DEFAULT_SIGNALS:  # an ignore inherited from the launcher (nohup, a service manager) survives exec
            signal.signal(signum, signal.SIG_DFL)
        cgroup.enter()
        if chdir_fd is not None:  # unsandboxed: run in the directory opened without symlinks
            os.fchdir(chdir_fd)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (config.max_file_bytes, config.max_file_bytes))
        resource.setrlimit(resource.RLIMIT_AS, (config.max_memory_bytes, config.max_memory_bytes))
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if drop_to is not None:  # unsandboxed as root: become the unprivileged uid before exec
            os.setgroups([])
            os.setresgid(drop_to[1], drop_to[1], drop_to[1])
            os.setresuid(drop_to[0], drop_to[0], drop_to[0])

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
        self.features = BwrapFeatures(has_size_option=False)
        self.swept_cgroups: list[str] = []

    @property
    def _has_size_option(self) -> bool:
        return self.features.has_size_option

    def is_available(self) -> bool:
        """Whether bubblewrap can set up a sandbox here, as an unprivileged uid (checked once,
        with `id -u`); the first check also sweeps cgroups leaked by a killed runtime."""
        if self._checked is None:
            self.swept_cgroups = sweep_leaked()
            self._checked, self._why_unavailable = self._probe()
        return self._checked

    def _probe(self) -> tuple[bool, str]:
        """Run `id -u` the way every command runs (a handed-over directory bound by fd)."""
        if shutil.which(self.config.bwrap_path) is None:
            return False, f"{self.config.bwrap_path} not found (install the 'bubblewrap' package)"
        uid = command_ids(self.config)[0]
        with tempfile.TemporaryDirectory(prefix="surecall-probe-") as tmp:
            dir_fd = open_directory(Path(os.path.realpath(tmp)))
            try:
                usage = subprocess.run([self.config.bwrap_path, "--help"], capture_output=True, timeout=10)
                text = usage.stdout + usage.stderr
                self.features = BwrapFeatures(b"--size" in text, b"--disable-userns" in text)
                if os.geteuid() == 0:
                    hand_over(dir_fd, *command_ids(self.config))
                argv = self._argv(Path(os.path.realpath(tmp)), "rw", dir_fd) + [SHELL, "-c", "id -u"]
                done = subprocess.run(argv, capture_output=True, timeout=10, env=self.config.env, cwd="/",
                                      pass_fds=(dir_fd,))
            except (OSError, subprocess.TimeoutExpired) as exc:
                return False, f"bubblewrap failed to start: {exc}"
            finally:
                os.close(dir_fd)
        if done.returncode != 0:
            return False, f"bubblewrap cannot create a sandbox here: {done.stderr.decode(errors='replace').strip()}"
        seen = done.stdout.decode(errors="replace").strip()
        if seen != str(uid) or uid == 0:
            return False, f"the sandboxed command would run as uid {seen!r}, not the unprivileged {uid}"
        return True, ""

    def run(self, command: str, workspace: Path, timeout_ms: float, *, bind: str = "rw") -> ExecResult:
        """Run `command` with bash in `workspace` (bound as `bind`: "rw", "ro" or "none"); kill
        everything it started at `timeout_ms`."""
        timeout_s = _timeout_s(timeout_ms)
        if bind not in BIND_MODES:
            raise ValueError(f"Invalid bind: expected one of {BIND_MODES}, got {bind!r}")
        is_sandboxed = self.is_available()
        if not is_sandboxed:
            self._refuse_unsandboxed(bind)
        dir_fd = None if bind == "none" else open_directory(workspace)  # the path is never followed again
        try:
            if os.geteuid() == 0 and dir_fd is not None:
                hand_over(dir_fd, *command_ids(self.config))
            prefix = self._argv(workspace, bind, dir_fd) if is_sandboxed else []
            return self._execute(prefix + [SHELL, "-c", command], dir_fd, timeout_s, is_sandboxed, bind)
        finally:
            if dir_fd is not None:
                os.close(dir_fd)

    def _refuse_unsandboxed(self, bind: str) -> None:
        if not self.config.allow_unsandboxed:
            raise SandboxUnavailable(
                f"bash_execute refused: {self._why_unavailable}; configure SandboxConfig(allow_unsandboxed=True) "
                "to run commands without a sandbox"
            )
        if bind != "rw":
            raise SandboxUnavailable(
                f"bash_execute refused: the capability allows the workspace only {'read-only' if bind == 'ro' else 'not at all'}, "
                f"which only a sandbox can hold ({self._why_unavailable})"
            )

    def _argv(self, workspace: Path, bind: str, dir_fd: int | None = None) -> list[str]:
        argv = bwrap_argv(self.config, workspace, bind=bind, features=self.features, dir_fd=dir_fd) + ["--"]
        return argv + (setpriv_argv(self.config) if os.geteuid() == 0 else [])

    def _execute(self, argv: list[str], dir_fd: int | None, timeout_s: float, is_sandboxed: bool, bind: str) -> ExecResult:
        # 1. limits: CPU a little above the wall budget, processes counted on top of the uid's own
        cfg = self.config
        uid, gid = command_ids(cfg)
        cpu_s = math.ceil(timeout_s) + 1
        nproc = _count_user_processes(uid) + cfg.max_processes
        cgroup = CommandCgroup.create({"pids": cfg.max_processes, "memory": cfg.max_memory_bytes})
        drop_to = (uid, gid) if os.geteuid() == 0 and not is_sandboxed else None
        started = time.monotonic()
        # 2. run; the cgroups go whatever happens
        try:
            preexec = _preexec(cfg, cpu_s, nproc, cgroup, drop_to, None if is_sandboxed else dir_fd)
            pass_fds = (dir_fd,) if is_sandboxed and dir_fd is not None else ()
            proc, drains, is_timed_out = self._spawn_and_wait(argv, pass_fds, timeout_s, preexec, cgroup)
            num_oom_kills = cgroup.oom_kills()
        finally:
            cgroup.remove()  # kills whatever is left in it, even a process that left the group
        # 3. what happened
        limits = {"uid": uid, "gid": gid, "workspace": bind, "cpu_s": cpu_s, "max_file_bytes": cfg.max_file_bytes,
                  "max_memory_bytes": cfg.max_memory_bytes, "memory_enforced_by": _memory_enforcer(cgroup),
                  "max_processes_enforced_by": _nproc_enforcer(cgroup, uid)}
        exit_status, signum = _outcome(proc.returncode, is_timed_out)
        return ExecResult(
            exit_status=exit_status, stdout=drains[0].text(), stderr=drains[1].text(), is_timed_out=is_timed_out,
            is_truncated=any(d.num_dropped for d in drains), duration_s=time.monotonic() - started,
            is_sandboxed=is_sandboxed, limits=limits, signal=signum, is_oom_killed=num_oom_kills > 0,
        )

    def _spawn_and_wait(self, argv: list[str], pass_fds: tuple[int, ...], timeout_s: float, preexec,
                        cgroup: CommandCgroup) -> tuple[subprocess.Popen, list[_Drain], bool]:
        """Start `argv` in a new session (its own process group), drain its pipes, and kill the
        group when it exits or at the timeout; (process, drains, timed out)."""
        cfg = self.config
        proc = subprocess.Popen(
            argv, cwd="/", env=cfg.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True, preexec_fn=preexec, pass_fds=pass_fds,
        )
        drains = [_Drain(proc.stdout, cfg.max_output_bytes), _Drain(proc.stderr, cfg.max_output_bytes)]
        for d in drains:
            d.start()
        is_timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            is_timed_out = True
        _kill_group(proc.pid)  # also ends background jobs of an unsandboxed command
        cgroup.kill_all()
        proc.wait()
        for d in drains:
            d.join(timeout=2)
        return proc, drains, is_timed_out


def _outcome(returncode: int, is_timed_out: bool) -> tuple[int | None, int | None]:
    """(exit status, signal). A signal is reported only where it is known: the sandbox's own kill
    at the timeout, or a negative return code (the process we started was signalled). A status
    above 128 that bwrap or bash passes on stays an exit status: 129 may be `exit 129`."""
    if is_timed_out:
        return None, signal.SIGKILL
    if returncode < 0:
        return None, -returncode
    return returncode, None


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _memory_enforcer(cgroup: CommandCgroup) -> str:
    return "memory cgroup (whole command)" if "memory" in cgroup.enforced else "RLIMIT_AS (per process)"


def _nproc_enforcer(cgroup: CommandCgroup, uid: int) -> str:
    if "pids" in cgroup.enforced:
        return "pids cgroup"
    return "RLIMIT_NPROC" if uid != 0 else "timeout only (RLIMIT_NPROC is not enforced for uid 0)"
