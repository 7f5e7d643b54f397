"""Per-command limits of the shell sandbox, leftovers of a killed runtime, and exit reporting.

Memory is capped per command (one memory cgroup, charging tmpfs too), /dev/shm is bounded,
cgroups leaked by a dead runtime are swept at start, a float `timeout_ms` works, and an exit
status above 128 is reported as a status unless a signal is known. Cgroup tests skip (with the
reason) where this process may not create a memory or pids cgroup.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from surecall.toolbox.bash import BashExecuteArgs, bash_execute, observe
from surecall.toolbox.cgroups import CommandCgroup, parents
from surecall.toolbox.sandbox import ExecResult, Sandbox, SandboxConfig

_DEFAULT = Sandbox()
needs_bwrap = pytest.mark.skipif(not _DEFAULT.is_available(), reason=f"bubblewrap cannot run here: {_DEFAULT._why_unavailable}")
UNSANDBOXED = Sandbox(SandboxConfig(bwrap_path="/nonexistent/bwrap", allow_unsandboxed=True))


def _can_make(controller: str) -> bool:
    cgroup = CommandCgroup.create({controller: 1 << 30})
    cgroup.remove()
    return controller in cgroup.enforced


needs_memory_cgroup = pytest.mark.skipif(not _can_make("memory"), reason="no writable memory cgroup here (v1 memory or delegated v2)")


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    return root


def run(ws, command, sandbox=_DEFAULT, timeout_ms=10_000):
    return bash_execute(BashExecuteArgs(command=command, timeout_ms=timeout_ms), ws, sandbox)


# --- memory, per command ---------------------------------------------------------------------
@needs_bwrap
@needs_memory_cgroup
@pytest.mark.skipif(not os.path.exists("/usr/bin/python3"), reason="needs /usr/bin/python3 inside the sandbox")
def test_memory_is_capped_for_the_whole_command_not_per_process(ws):
    small = Sandbox(SandboxConfig(max_memory_bytes=256 << 20))
    hold = "/usr/bin/python3 -c 'b = bytearray(100 << 20); import time; time.sleep(1); print(len(b))'"
    out = run(ws, f"for i in 1 2 3 4; do {hold} & done; wait", sandbox=small)  # each under 256 MiB, 400 MiB together
    assert out.data["stdout"].count("104857600") < 4 and out.data["oom_killed"] is True
    assert "killed by the memory limit (268435456 bytes for the whole command)" in out.error
    assert out.data["limits"]["memory_enforced_by"] == "memory cgroup (whole command)"


@needs_bwrap
@needs_memory_cgroup
def test_tmpfs_pages_count_against_the_command(ws):
    small = Sandbox(SandboxConfig(max_memory_bytes=256 << 20, max_tmp_bytes=1 << 30))
    out = run(ws, "for i in 1 2 3 4 5 6; do head -c 60M /dev/zero > /tmp/f$i; done; echo wrote all", sandbox=small)
    assert "wrote all" not in out.output and out.data["oom_killed"] is True


@needs_bwrap
def test_dev_shm_is_bounded(ws):
    small = Sandbox(SandboxConfig(max_shm_bytes=1 << 20))
    if not small.is_available() or not small.features.has_size_option:
        pytest.skip("this bubblewrap has no --size: /dev/shm is bounded by the memory cgroup only")
    out = run(ws, "head -c 5M /dev/zero > /dev/shm/fill; echo status $?; touch /dev/evil; echo dev $?", sandbox=small)
    assert "No space left on device" in out.output and "status 1" in out.output and "dev 1" in out.output


# --- leftovers of a killed runtime -------------------------------------------------------------
def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@pytest.mark.skipif(not any(parents("pids")), reason="no pids cgroup hierarchy here")
def test_cgroups_of_a_dead_runtime_are_swept_and_live_ones_kept():
    dead = parents("pids")[0] / f"surecall-{_dead_pid()}-12345-0123456789ab"
    try:
        dead.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot create a pids cgroup here: {exc}")
    straggler = subprocess.Popen(["sleep", "60"])
    (dead / "cgroup.procs").write_text(str(straggler.pid))
    live = CommandCgroup.create({"pids": 8})
    try:
        box = Sandbox()
        box.is_available()  # a sandbox's first check sweeps
        assert str(dead) in box.swept_cgroups and not dead.exists()
        assert straggler.wait(timeout=5) == -signal.SIGKILL
        assert all(path.exists() for path in live.dirs.values())
    finally:
        straggler.kill()
        live.remove()
        if dead.exists():
            dead.rmdir()


# --- timeouts and exit statuses ------------------------------------------------------------------
def test_float_timeout_is_honoured(ws):
    started = time.monotonic()
    result = UNSANDBOXED.run("sleep 7.389", ws, 1500.5)
    assert result.is_timed_out and 1.4 < time.monotonic() - started < 5
    assert result.limits["cpu_s"] == 3 and isinstance(result.limits["cpu_s"], int)
    assert BashExecuteArgs(command="true", timeout_ms=2000.0).timeout_ms == 2000


@pytest.mark.parametrize("timeout_ms", [float("nan"), float("inf"), 0, -5, True])
def test_bad_timeout_is_refused(ws, timeout_ms):
    with pytest.raises(ValueError, match="Invalid timeout_ms: expected a finite number > 0"):
        UNSANDBOXED.run("true", ws, timeout_ms)


@pytest.mark.parametrize("sandbox", [pytest.param(_DEFAULT, marks=needs_bwrap, id="sandboxed"),
                                     pytest.param(UNSANDBOXED, id="unsandboxed")])
def test_exit_status_129_is_a_status_not_sighup(ws, sandbox):
    out = run(ws, "exit 129", sandbox=sandbox)
    assert out.exit_status == 129 and out.error is None and out.data["signal"] is None


@pytest.mark.parametrize("launched_by_nohup", [False, True])
def test_a_real_signal_is_reported_as_a_signal(ws, launched_by_nohup):
    """Also when the server ignores SIGHUP (started under `nohup`): commands start with the default action."""
    import signal

    before = signal.signal(signal.SIGHUP, signal.SIG_IGN if launched_by_nohup else signal.getsignal(signal.SIGHUP))
    try:
        out = run(ws, "kill -HUP $$", sandbox=UNSANDBOXED)
    finally:
        signal.signal(signal.SIGHUP, before)
    assert out.exit_status is None and out.data["signal"] == "SIGHUP"
    assert out.error.startswith("command killed by SIGHUP: it was ended by a signal")


@needs_bwrap
def test_timeout_is_the_sandboxs_own_kill(ws):
    out = run(ws, "sleep 9.8696", timeout_ms=1000)
    assert out.exit_status is None and out.data["signal"] == "SIGKILL" and "timed out after 1000 ms" in out.error


def test_a_status_matching_a_limit_signal_gets_a_note_not_an_error():
    result = ExecResult(exit_status=153, stdout="", stderr="", is_timed_out=False, is_truncated=False,
                        duration_s=0.0, is_sandboxed=True, limits={})
    out = observe(result, 1000)
    assert out.exit_status == 153 and out.error is None
    assert out.data["note"].startswith("exit status 153 is also what a process ended by SIGXFSZ")
    plain = observe(ExecResult(130, "", "", False, False, 0.0, True, {}), 1000)
    assert "note" not in plain.data and plain.error is None


def test_observation_of_a_killed_process_names_the_limit():
    result = ExecResult(exit_status=None, stdout="", stderr="", is_timed_out=False, is_truncated=False,
                        duration_s=0.0, is_sandboxed=False, limits={}, signal=signal.SIGXCPU)
    assert observe(result, 1000).error.startswith("command killed by SIGXCPU: it used up its CPU-time limit")


def test_memory_limit_without_a_cgroup_falls_back_per_process(ws, monkeypatch):
    monkeypatch.setattr("surecall.toolbox.cgroups.parents", lambda controller: [])
    result = UNSANDBOXED.run("true", Path(ws), 2000)
    assert result.limits["memory_enforced_by"] == "RLIMIT_AS (per process)"


# --- where the cgroups go (a fake hierarchy: v2 delegated, v1 per controller) --------------------
def _fake_hierarchy(monkeypatch, tmp_path, own: dict[str, str]) -> Path:
    monkeypatch.setattr("surecall.toolbox.cgroups.CGROUP_ROOT", tmp_path)
    monkeypatch.setattr("surecall.toolbox.cgroups._own_cgroups", lambda: own)
    return tmp_path


def test_v2_puts_both_caps_in_one_delegated_cgroup(monkeypatch, tmp_path):
    root = _fake_hierarchy(monkeypatch, tmp_path, {"": "/user.slice/me"})
    mine = root / "user.slice" / "me"
    mine.mkdir(parents=True)
    (mine / "cgroup.subtree_control").write_text("cpu memory pids\n")
    cgroup = CommandCgroup.create({"pids": 16, "memory": 1 << 28})
    assert cgroup.enforced == ("memory", "pids") and cgroup.dirs["pids"] == cgroup.dirs["memory"]
    made = cgroup.dirs["pids"]
    assert made.parent == mine and (made / "pids.max").read_text() == "16"
    assert (made / "memory.max").read_text() == str(1 << 28) and (made / "memory.swap.max").read_text() == "0"


def test_v1_uses_one_cgroup_per_controller(monkeypatch, tmp_path):
    root = _fake_hierarchy(monkeypatch, tmp_path, {"pids": "/", "memory": "/job/7"})
    for sub in ("pids", "memory/job/7"):
        (root / sub).mkdir(parents=True)
    (root / "pids" / "cgroup.procs").write_text("")
    (root / "memory" / "cgroup.procs").write_text("")
    cgroup = CommandCgroup.create({"pids": 16, "memory": 1 << 28})
    assert cgroup.dirs["pids"].parent == root / "pids" and cgroup.dirs["memory"].parent == root / "memory" / "job" / "7"
    assert (cgroup.dirs["memory"] / "memory.limit_in_bytes").read_text() == str(1 << 28)
