"""The sandbox never yields host root, and binds the workspace only as the capability allows.

Run as root (as in CI) and, through `setpriv`, as the unprivileged uid 65534 on a workspace it
owns; each check looks at the host side (st_uid, st_mode) after the command. Skipped with the
reason where bubblewrap cannot run or the runtime is not root (then setpriv cannot switch).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from surecall.dispatch.runtime import Runtime
from surecall.dispatch.stores import SQLiteStore
from surecall.errors import PathOutsideWorkspace, SandboxUnavailable
from surecall.toolbox.bash import BashExecuteArgs, bash_execute
from surecall.toolbox.catalog import bind_mode, coding_tools
from surecall.toolbox.handover import MAX_DEPTH, hand_over, open_directory
from surecall.toolbox.sandbox import NOBODY, Sandbox, SandboxConfig

_DEFAULT = Sandbox()
needs_bwrap = pytest.mark.skipif(not _DEFAULT.is_available(), reason=f"bubblewrap cannot run here: {_DEFAULT._why_unavailable}")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the runtime is not root here: the root-side checks do not apply")
ENGINE = Path(__file__).resolve().parents[2] / "engine"
ESCAPES = (
    "id -u; test -w /proc/sys/kernel/core_pattern && echo CORE_PATTERN_WRITABLE; "
    "echo '|/tmp/pwn' > /proc/sys/kernel/core_pattern && echo CORE_PATTERN_WRITTEN; "
    "test -w /proc/sysrq-trigger && echo SYSRQ_WRITABLE; "
    "cp /bin/bash suid-bash; chmod 4755 suid-bash; touch made.txt; echo done"
)


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    (root / "hello.txt").write_text("hello\n")
    return root


def run(ws, command, sandbox=_DEFAULT, bind="rw", timeout_ms=5000):
    return bash_execute(BashExecuteArgs(command=command, timeout_ms=timeout_ms), ws, sandbox, bind=bind)


def _assert_no_root_escape(ws: Path, stdout: str, expected_uid: int) -> None:
    assert stdout.splitlines()[0] == str(expected_uid) and expected_uid != 0
    assert "CORE_PATTERN" not in stdout and "SYSRQ" not in stdout, stdout
    assert Path("/proc/sys/kernel/core_pattern").read_text().strip() != "|/tmp/pwn"
    made, copy = (ws / "made.txt").stat(), (ws / "suid-bash").stat()
    assert made.st_uid == expected_uid and copy.st_uid == expected_uid
    assert not (copy.st_uid == 0 and copy.st_mode & stat.S_ISUID), "a setuid-root file appeared on the host"


# --- as root ---------------------------------------------------------------------------------
@needs_bwrap
@needs_root
def test_as_root_the_command_is_unprivileged_on_the_host(ws):
    out = run(ws, ESCAPES)
    assert out.data["stdout"].endswith("done\n"), out.output
    _assert_no_root_escape(ws, out.data["stdout"], NOBODY)
    assert out.data["limits"]["uid"] == NOBODY


@needs_bwrap
def test_the_command_holds_no_capability_and_no_new_privileges(ws):
    os.chmod(ws, 0o700)  # like a mkdtemp workspace: the sandbox must still enter it
    out = run(ws, "grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs):' /proc/self/status; touch made.txt")
    fields = dict(line.split(":\t") for line in out.data["stdout"].splitlines())
    assert {k: v for k, v in fields.items() if k.startswith("Cap")} == dict.fromkeys(
        ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"], "0000000000000000"), out.output
    assert fields["NoNewPrivs"] == "1" and (ws / "made.txt").exists()


@needs_bwrap
def test_workspace_and_proc_sys_are_mounted_as_promised(ws):
    out = run(ws, "cat /proc/self/mountinfo")
    mounts = {line.split()[4]: line.split()[5] for line in out.data["stdout"].splitlines()}
    assert "nosuid" in mounts[str(ws)].split(",") and "rw" in mounts[str(ws)].split(",")
    assert "ro" in mounts["/proc/sys"].split(",")
    assert "ro" in mounts["/dev"].split(",") and "rw" in mounts["/dev/shm"].split(",")


@needs_bwrap
@needs_root
def test_root_owned_private_files_are_handed_over_but_nothing_outside(ws, tmp_path):
    secret = tmp_path / "outside-secret"
    secret.write_text("TOP SECRET\n")
    os.chmod(secret, 0o600)
    (ws / "private.txt").write_text("mine\n")
    os.chmod(ws / "private.txt", 0o600)
    (ws / "link").symlink_to(secret)
    os.link(ws / "private.txt", ws / "private-again.txt")  # two links: not handed over
    out = run(ws, "cat private.txt; cat link")
    assert "TOP SECRET" not in out.output
    assert secret.stat().st_uid == 0 and (ws / "private.txt").stat().st_uid == 0
    os.unlink(ws / "private-again.txt")
    out = run(ws, "cat private.txt")
    assert out.output == "mine\n" and (ws / "private.txt").stat().st_uid == NOBODY


def test_hand_over_refuses_root_as_the_target(tmp_path):
    fd = open_directory(tmp_path)
    try:
        with pytest.raises(ValueError, match="Invalid hand-over target: expected a non-root uid"):
            hand_over(fd, 0, 0)
    finally:
        os.close(fd)


@needs_root
def test_hand_over_of_a_very_deep_tree_is_bounded_not_an_error(ws):
    fd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(MAX_DEPTH + 200):  # deeper than PATH_MAX allows by name, and than recursion would
        os.mkdir("d", dir_fd=fd)
        fd_next = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = fd_next
    deepest = os.fstat(fd)
    os.close(fd)
    top = open_directory(ws)
    try:
        assert hand_over(top, NOBODY, NOBODY) == MAX_DEPTH + 2  # ws, hello.txt and MAX_DEPTH levels of d
    finally:
        os.close(top)
    assert (ws / "d" / "d").stat().st_uid == NOBODY and deepest.st_uid == 0


@needs_bwrap
def test_a_directory_swapped_for_a_symlink_after_planning_is_refused(ws, tmp_path):
    outside = tmp_path / "outside" / "etc"
    outside.mkdir(parents=True)
    (outside / "passwd").write_text("root:x:0:0\n")
    (ws / "a" / "etc").mkdir(parents=True)
    bash = next(t for t in coding_tools(ws) if t.name == "bash_execute")
    plan = bash.handler.plan({"command": "touch pwned; cat passwd"}, (str(ws / "a" / "etc"),))
    (ws / "a").rename(ws / "a.old")
    (ws / "a").symlink_to(tmp_path / "outside")  # what a concurrent command can do
    with pytest.raises(PathOutsideWorkspace, match="not a directory reached without symlinks now"):
        plan.run()
    assert not (outside / "pwned").exists() and (outside / "passwd").stat().st_uid == os.geteuid()


@needs_bwrap
def test_the_bound_directory_fd_does_not_reach_the_command(ws):
    out = run(ws, "for f in /proc/self/fd/*; do readlink $f; done", bind="ro")
    assert str(ws) not in out.data["stdout"], out.output


def test_sandbox_uid_cannot_be_root():
    with pytest.raises(ValueError, match=r"Invalid SandboxConfig.sandbox_uid: expected a non-root id \(>= 1\), got 0"):
        SandboxConfig(sandbox_uid=0)


# --- as an unprivileged user -----------------------------------------------------------------
_AS_NOBODY = """
import json, sys, types
from pathlib import Path
pkg = types.ModuleType("surecall"); pkg.__path__ = [sys.argv[1]]; sys.modules["surecall"] = pkg
from surecall.toolbox.sandbox import Sandbox
box = Sandbox()
if not box.is_available():
    print(json.dumps({"unavailable": box._why_unavailable})); sys.exit(0)
r = box.run(sys.argv[3], Path(sys.argv[2]), 5000)
ro = box.run("echo x > ro.txt", Path(sys.argv[2]), 5000, bind="ro")
print(json.dumps({"stdout": r.stdout, "stderr": r.stderr, "uid": r.limits["uid"], "ro_stderr": ro.stderr}))
"""


def _run_unprivileged(ws: Path, command: str) -> dict:
    """The command run by a runtime that is not root: this one, or one started as 65534."""
    if os.geteuid() != 0:
        result, ro = _DEFAULT.run(command, ws, 5000), _DEFAULT.run("echo x > ro.txt", ws, 5000, bind="ro")
        return {"stdout": result.stdout, "stderr": result.stderr, "uid": result.limits["uid"], "ro_stderr": ro.stderr}
    python = "/usr/bin/python3"
    if shutil.which("setpriv") is None or not os.path.exists(python):
        pytest.skip("needs setpriv and /usr/bin/python3 to start a process as uid 65534")
    os.chown(ws, NOBODY, NOBODY)
    argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", python, "-c", _AS_NOBODY,
            str(ENGINE), str(ws), command]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd="/", env={"PATH": "/usr/bin:/bin"})
    if done.returncode != 0:
        pytest.skip(f"uid 65534 cannot import the engine from {ENGINE}: {done.stderr.strip()[-300:]}")
    report = json.loads(done.stdout)
    if "unavailable" in report:
        pytest.skip(f"bubblewrap cannot run unprivileged here: {report['unavailable']}")
    return report


@needs_bwrap
def test_as_an_unprivileged_user_the_command_stays_that_user():
    ws = Path(tempfile.mkdtemp(prefix="surecall-unprivileged-", dir="/tmp"))
    uid = NOBODY if os.geteuid() == 0 else os.geteuid()
    try:
        report = _run_unprivileged(ws, ESCAPES + "; unshare -U true && echo NESTED_USERNS")
        assert report["uid"] == uid
        _assert_no_root_escape(ws, report["stdout"], uid)
        assert "NESTED_USERNS" not in report["stdout"]
        assert "Read-only file system" in report["ro_stderr"] and not (ws / "ro.txt").exists()
    finally:
        shutil.rmtree(ws, ignore_errors=True)


# --- bind modes from the capability's rights ---------------------------------------------------
def test_bind_mode_follows_the_rights():
    assert bind_mode(frozenset({"exec", "read", "write"})) == "rw"
    assert bind_mode(frozenset({"exec", "read"})) == "ro"
    assert bind_mode(frozenset({"exec", "write"})) == "none"
    assert bind_mode(None) == "rw"


@needs_bwrap
def test_read_only_bind_reads_but_cannot_write(ws):
    out = run(ws, "cat hello.txt; echo x > new.txt; rm hello.txt; echo end", bind="ro")
    assert out.data["stdout"] == "hello\nend\n" and "Read-only file system" in out.data["stderr"]
    assert (ws / "hello.txt").exists() and not (ws / "new.txt").exists()


@needs_bwrap
def test_no_bind_sees_no_workspace(ws):
    out = run(ws, f"pwd; cat {ws}/hello.txt; echo x > {ws}/new.txt; echo end", bind="none")
    assert out.data["stdout"] == "/tmp\nend\n" and "No such file or directory" in out.data["stderr"]
    assert not (ws / "new.txt").exists()


def test_unsandboxed_mode_refuses_what_only_a_sandbox_can_hold(ws):
    unsandboxed = Sandbox(SandboxConfig(bwrap_path="/nonexistent/bwrap", allow_unsandboxed=True))
    with pytest.raises(SandboxUnavailable, match="allows the workspace only read-only, which only a sandbox can hold"):
        run(ws, "touch x", sandbox=unsandboxed, bind="ro")


@needs_bwrap
def test_planner_binds_by_the_rights_it_is_given(ws):
    bash = next(t for t in coding_tools(ws) if t.name == "bash_execute")
    arguments = {"command": "cat hello.txt && echo y > new.txt; echo end"}
    read_only = bash.handler.plan(arguments, (str(ws),), frozenset({"exec", "read"}))
    assert [a.right for a in read_only.accesses] == ["exec", "read"]
    assert read_only.run().data["stdout"] == "hello\nend\n" and not (ws / "new.txt").exists()
    nothing = bash.handler.plan(arguments, (str(ws),), frozenset({"exec"}))
    assert [a.right for a in nothing.accesses] == ["exec"]
    assert nothing.run().data["stdout"] == "end\n" and not (ws / "new.txt").exists()


@needs_bwrap
def test_runtime_exec_without_read_and_write_cannot_touch_the_workspace(ws, tmp_path):
    with SQLiteStore(tmp_path / "records.db") as store:
        rt = Runtime(coding_tools(ws), store, b"0123456789abcdef-test-signing-key")
        cap = rt.issue(["call:*", "exec", "approve:bash_execute"], [str(ws)])
        out = rt.dispatch({"name": "bash_execute", "arguments": {"command": "cat hello.txt; touch pwned"}},
                          cap, "traj", 1, "c1")
    # the runtime passes the capability's rights: it ran, without the workspace bound
    assert out.decision.allowed, out.decision.reason
    assert "hello\n" not in (out.output or "") and not (ws / "pwned").exists()


@needs_bwrap
def test_runtime_exec_with_read_only_reads_but_cannot_write(ws, tmp_path):
    with SQLiteStore(tmp_path / "records.db") as store:
        rt = Runtime(coding_tools(ws), store, b"0123456789abcdef-test-signing-key")
        cap = rt.issue(["call:*", "exec", "read", "approve:bash_execute"], [str(ws)])
        out = rt.dispatch({"name": "bash_execute", "arguments": {"command": "cat hello.txt; touch pwned; echo end"}},
                          cap, "traj", 1, "c1")
    assert out.decision.allowed, out.decision.reason
    assert "hello" in out.output and not (ws / "pwned").exists()
