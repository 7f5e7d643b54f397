"""Runtime.dispatch end to end: the four tools under capabilities that allow and deny, replays,
crashes settled by the reconciliation probe, and bad calls that come back as observations."""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from surecall.dispatch.capability import Capability
from surecall.dispatch.idempotency import RecordState, derive_key
from surecall.dispatch.runtime import Observation, Runtime
from surecall.dispatch.stores import SQLiteStore
from surecall.errors import IdempotencyConflict, ToolDefinitionError
from surecall.toolbox.catalog import coding_tools
from surecall.toolbox.result import Plan
from surecall.toolbox.sandbox import Sandbox, SandboxConfig
from surecall.toolbox.search import SearchLimits
from surecall.tools import SideEffect, Tool

KEY = b"0123456789abcdef-test-signing-key"
ALL = ["call:*", "read", "write", "exec", "approve:bash_execute"]
needs_bwrap = pytest.mark.skipif(not Sandbox().is_available(), reason="bubblewrap cannot run here")


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("x = 1\ny = 'a'\n")
    return root.resolve()


@pytest.fixture(params=["sqlite", "redis"])
def store(request, tmp_path):
    """Every runtime test runs against both idempotency stores (Redis skips when not installed)."""
    if request.param == "sqlite":
        with SQLiteStore(tmp_path / "records.db") as s:
            yield s
        return
    from surecall.dispatch.stores import RedisStore

    s = RedisStore(request.getfixturevalue("redis_url"), prefix=f"surecall:test:{request.node.name}:")
    yield s
    s.close()


def make_runtime(ws, store, tools=None, **kw):
    return Runtime(tools if tools is not None else coding_tools(ws), store, KEY, **kw)


def call(name, **arguments):
    return {"name": name, "arguments": arguments}


def dispatch(rt, cap, c, call_id="c1", turn=1) -> Observation:
    return rt.dispatch(c, cap, "traj-1", turn, call_id)


# --- the four tools, allowed --------------------------------------------------------------
@needs_bwrap
def test_all_four_tools_allowed(ws, store):
    rt = make_runtime(ws, store)
    cap = rt.issue(ALL, [str(ws)])
    view = dispatch(rt, cap, call("file_view", path="src/app.py"), "v")
    assert view.ok and "     1\tx = 1" in view.output and view.idempotency_state == "NOT_REQUIRED"
    edit = dispatch(rt, cap, call("file_edit", path="src/app.py", old_str="x = 1", new_str="x = 2"), "e")
    assert edit.ok and edit.idempotency_state == "COMPLETED" and not edit.replayed
    assert (ws / "src" / "app.py").read_text() == "x = 2\ny = 'a'\n"
    grep = dispatch(rt, cap, call("grep_search", pattern=r"x = \d"), "g")
    assert grep.data["matches"] == [{"path": "src/app.py", "line": 1, "text": "x = 2"}]
    bash = dispatch(rt, cap, call("bash_execute", command="cat src/app.py | wc -l"), "b")
    assert bash.ok and bash.output.strip() == "2" and bash.exit_status == 0
    failing = dispatch(rt, cap, call("bash_execute", command="echo no >&2; exit 4"), "b2")
    assert failing.to_message() == "[stderr]\nno\n\n[exit status 4]"
    assert bash.idempotency_state == "COMPLETED" and bash.decision.allowed
    assert all(o.tool == n for o, n in [(view, "file_view"), (edit, "file_edit"), (grep, "grep_search"), (bash, "bash_execute")])


# --- the four tools, denied ---------------------------------------------------------------
def test_file_tools_denied_without_the_right_or_outside_the_objects(ws, store):
    rt = make_runtime(ws, store)
    read_only = rt.issue(["call:*", "read"], [str(ws)])
    before = (ws / "src" / "app.py").read_bytes()
    edit = dispatch(rt, read_only, call("file_edit", path="src/app.py", old_str="x = 1", new_str="x = 9"))
    assert not edit.decision.allowed and edit.decision.code == "right_missing"
    assert edit.idempotency_state == "NOT_CLAIMED" and "'write'" in edit.error
    assert (ws / "src" / "app.py").read_bytes() == before
    write_only = rt.issue(["call:*", "write"], [str(ws)])  # file_edit shows the edited lines: needs read too
    assert dispatch(rt, write_only, call("file_edit", path="src/app.py", old_str="x = 1", new_str="x = 9")).decision.code == "right_missing"
    assert (ws / "src" / "app.py").read_bytes() == before
    (ws / "docs").mkdir()
    (ws / "docs" / "notes.md").write_text("x = 7\n")
    src_only = rt.issue(["call:*", "read"], [str(ws / "src")])
    view = dispatch(rt, src_only, call("file_view", path="docs/notes.md"))
    assert view.decision.code == "object_outside" and view.output == ""
    grep = dispatch(rt, src_only, call("grep_search", pattern="x"))
    assert grep.decision.code == "object_outside"
    assert dispatch(rt, src_only, call("grep_search", pattern="x", path="src")).ok


def test_call_right_is_per_tool(ws, store):
    rt = make_runtime(ws, store)
    cap = rt.issue(["call:file_view", "read", "write"], [str(ws)])
    assert dispatch(rt, cap, call("file_view", path="src/app.py")).ok
    denied = dispatch(rt, cap, call("file_edit", path="src/app.py", old_str="x", new_str="z"))
    assert denied.decision.code == "right_missing" and "call:file_edit" in denied.decision.reason


def test_bash_needs_approval_and_exec(ws, store):
    rt = make_runtime(ws, store)
    no_approval = rt.issue(["call:*", "exec"], [str(ws)])
    out = dispatch(rt, no_approval, call("bash_execute", command="touch pwned"))
    assert out.decision.code == "right_missing" and "approve:bash_execute" in out.error
    no_exec = rt.issue(["call:*", "approve:bash_execute", "read", "write"], [str(ws)])
    out = dispatch(rt, no_exec, call("bash_execute", command="touch pwned"), "c2")
    assert out.decision.code == "right_missing" and "'exec'" in out.error
    elsewhere = rt.issue(ALL, ["/nonexistent-surecall"])
    out = dispatch(rt, elsewhere, call("bash_execute", command="touch pwned"), "c3")
    assert out.decision.code == "outside_workspace"
    assert not (ws / "pwned").exists()


@needs_bwrap
def test_bash_runs_in_the_directory_the_capability_names(ws, store):
    rt = make_runtime(ws, store)
    cap = rt.issue(ALL, [str(ws / "src")])
    out = dispatch(rt, cap, call("bash_execute", command="pwd; ls ..; touch ../escaped"))
    assert out.data["stdout"].splitlines()[0] == str(ws / "src")
    assert not (ws / "escaped").exists()


def test_tampered_and_expired_capabilities_are_denied(ws, store):
    now = [1_000_000.0]
    rt = make_runtime(ws, store, clock=lambda: now[0])
    cap = rt.issue(["call:*", "read"], [str(ws)], ttl_s=60)
    widened = dataclasses.replace(cap, objects=("/",))
    assert dispatch(rt, widened, call("file_view", path="src/app.py")).decision.code == "bad_signature"
    now[0] += 60 + 31  # past the expiry and the 30 s skew allowance
    assert dispatch(rt, cap, call("file_view", path="src/app.py")).decision.code == "expired"
    assert dispatch(rt, "not a capability", call("file_view", path="src/app.py")).decision.code == "bad_capability"


def test_paths_outside_the_workspace_are_denied_observations(ws, store, tmp_path):
    (tmp_path / "secret.txt").write_text("s")
    (ws / "link").symlink_to(tmp_path / "secret.txt")
    rt = make_runtime(ws, store)
    cap = rt.issue(ALL, ["/"])  # even a capability for everything cannot leave the tool's workspace
    for path in ("../secret.txt", str(tmp_path / "secret.txt"), "link"):
        out = dispatch(rt, cap, call("file_view", path=path))
        assert out.decision.code == "outside_workspace" and "outside the workspace" in out.error


# --- bad calls ----------------------------------------------------------------------------
def test_unknown_tool_and_invalid_arguments_are_observations(ws, store):
    rt = make_runtime(ws, store)
    cap = rt.issue(ALL, [str(ws)])
    unknown = dispatch(rt, cap, call("rm_rf", path="/"))
    assert unknown.decision.code == "unknown_tool" and "unknown tool 'rm_rf'" in unknown.error
    assert unknown.to_message().startswith("[denied: unknown tool")
    bad = dispatch(rt, cap, call("file_view", path="src/app.py", limit=501, colour="red"))
    assert bad.decision.code == "invalid_arguments"
    assert {pointer for pointer, _ in bad.data["errors"]} == {"", "/limit"}


def test_tool_refusal_is_recorded_and_replayed(ws, store):
    rt = make_runtime(ws, store)
    cap = rt.issue(ALL, [str(ws)])
    miss = call("file_edit", path="src/app.py", old_str="nope", new_str="z")
    first = dispatch(rt, cap, miss)
    assert first.decision.allowed and "0 matches" in first.error and first.idempotency_state == "COMPLETED"
    again = dispatch(rt, cap, miss)
    assert again.replayed and again.error == first.error


# --- at most once -------------------------------------------------------------------------
def test_replay_returns_the_stored_result_without_running_again(ws, store):
    rt = make_runtime(ws, store)
    cap = rt.issue(ALL, [str(ws)])
    grow = call("file_edit", path="src/app.py", old_str="a", new_str="aa", allow_multiple=True)
    first = dispatch(rt, cap, grow)
    second = make_runtime(ws, store).dispatch(grow, cap, "traj-1", 1, "c1")  # another runtime, same store
    assert (ws / "src" / "app.py").read_text() == "x = 1\ny = 'aa'\n"
    assert second.replayed and second.output == first.output and second.idempotency_key == first.idempotency_key
    third = dispatch(rt, cap, grow, call_id="c2")  # a new call id is a new call
    assert not third.replayed and (ws / "src" / "app.py").read_text() == "x = 1\ny = 'aaaa'\n"


def test_same_call_id_with_other_arguments_is_refused(ws, store):
    rt = make_runtime(ws, store)
    cap = rt.issue(ALL, [str(ws)])
    dispatch(rt, cap, call("file_edit", path="src/app.py", old_str="x = 1", new_str="x = 2"))
    out = dispatch(rt, cap, call("file_edit", path="src/app.py", old_str="x = 2", new_str="x = 3"))
    assert out.error.startswith("not run:") and "different arguments" in out.error
    assert (ws / "src" / "app.py").read_text() == "x = 2\ny = 'a'\n"


@dataclasses.dataclass(frozen=True)
class CrashAfter:
    """A handler that runs the real plan (or not) and then dies with SIGKILL: a crashed worker."""

    inner: object
    apply_first: bool

    def plan(self, arguments, objects):
        real = self.inner.plan(arguments, objects)

        def run():
            if self.apply_first:
                real.run()
            os.kill(os.getpid(), signal.SIGKILL)

        return Plan(real.accesses, run)


@pytest.mark.parametrize("applied_before_crash", [True, False], ids=["crash-after-write", "crash-before-write"])
def test_call_replayed_after_a_crash_is_applied_once(ws, tmp_path, applied_before_crash):
    db = tmp_path / "crash.db"
    edit = call("file_edit", path="src/app.py", old_str="y = 'a'", new_str="y = 'b'")
    tools = [dataclasses.replace(t, handler=CrashAfter(t.handler, applied_before_crash)) if t.name == "file_edit" else t
             for t in coding_tools(ws)]
    pid = os.fork()
    if pid == 0:  # the worker: claims the key, (maybe) writes, dies before recording
        try:
            rt = Runtime(tools, SQLiteStore(db), KEY)
            rt.dispatch(edit, rt.issue(ALL, [str(ws)]), "traj-1", 1, "c1")
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    with SQLiteStore(db) as store:
        later = make_runtime(ws, store, clock=lambda: time.time() + 120)  # past the 30 s lease
        key = derive_key("traj-1", 1, "c1", "file_edit", edit["arguments"], namespace=later.namespace)
        assert store.get(key).state is RecordState.IN_FLIGHT  # the lease still runs
        cap = later.issue(ALL, [str(ws)])
        out = later.dispatch(edit, cap, "traj-1", 1, "c1")
        again = later.dispatch(edit, cap, "traj-1", 1, "c1")
    assert (ws / "src" / "app.py").read_text() == "x = 1\ny = 'b'\n"
    assert out.ok and out.idempotency_state == "COMPLETED" and again.replayed
    if applied_before_crash:  # the probe found the edit: the stored result says so, nothing re-ran
        assert out.replayed and out.data == {"settled_by_probe": True}
    else:  # the probe found no edit: NOT_EXECUTED, claimed again and run once
        assert not out.replayed and "replaced 1 occurrence" in out.output


def test_failure_mid_call_is_in_doubt_until_settled(ws, store):
    effects = []

    def flaky(**_):
        effects.append(1)
        raise RuntimeError("disk on fire")

    schema = {"type": "object", "properties": {}, "additionalProperties": False}
    flaky_tool = Tool.from_schema("flaky", schema, level=SideEffect.A2, handler=flaky)
    rt = make_runtime(ws, store, tools=[flaky_tool])
    cap = rt.issue(["call:*"], [str(ws)])
    first = dispatch(rt, cap, call("flaky"))
    assert first.idempotency_state == "IN_DOUBT" and "disk on fire" in first.error
    second = dispatch(rt, cap, call("flaky"))
    assert second.idempotency_state == "IN_DOUBT" and "settle it" in second.error and effects == [1]
    with pytest.raises(IdempotencyConflict, match="declares no reconciliation probe"):
        rt.settle(first.idempotency_key)
    probed = make_runtime(ws, store, tools=[dataclasses.replace(flaky_tool, probe=lambda args: False)])
    assert probed.settle(first.idempotency_key, call("flaky")).state is RecordState.NOT_EXECUTED
    with pytest.raises(IdempotencyConflict, match="not the ones the key was derived from"):
        probed.settle(first.idempotency_key, call("flaky", extra=1))


def test_sandbox_unavailable_releases_the_key(ws, store):
    tools = coding_tools(ws, sandbox=SandboxConfig(bwrap_path="/nonexistent/bwrap"))
    rt = make_runtime(ws, store, tools=tools)
    cap = rt.issue(ALL, [str(ws)])
    out = dispatch(rt, cap, call("bash_execute", command="echo hi"))
    assert "bwrap not found" in out.error and out.idempotency_state == "NOT_EXECUTED"
    assert store.get(out.idempotency_key).state is RecordState.NOT_EXECUTED


def test_plain_callable_tools_and_catalog_errors(ws, store):
    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["a"], "additionalProperties": False}
    double = Tool.from_schema("double", schema, level=SideEffect.A0, handler=lambda a: {"doubled": 2 * a})
    rt = make_runtime(ws, store, tools=[double])
    out = dispatch(rt, rt.issue(["call:double"], []), call("double", a=4))
    assert out.ok and out.data == {"value": {"doubled": 8}} and out.output == '{"doubled": 8}'
    with pytest.raises(ToolDefinitionError, match="duplicate tool name 'double'"):
        make_runtime(ws, store, tools=[double, double])
    with pytest.raises(ToolDefinitionError, match="has no handler"):
        make_runtime(ws, store, tools=[Tool.from_schema("bare", schema)])
    with pytest.raises(ValueError, match="Invalid lease_s"):
        make_runtime(ws, store, tools=[double], lease_s=0)
    assert isinstance(rt.issue(["read"], [str(ws)]), Capability)


def test_concurrent_identical_calls_run_once(ws, store):
    rt = make_runtime(ws, store)
    cap = rt.issue(ALL, [str(ws)])
    grow = call("file_edit", path="src/app.py", old_str="a", new_str="aa", allow_multiple=True)
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda _: dispatch(rt, cap, grow), range(16)))
    assert (ws / "src" / "app.py").read_text() == "x = 1\ny = 'aa'\n"
    ran = [o for o in results if not o.replayed and o.error is None]
    assert len(ran) == 1
    assert all(o.replayed or "in flight elsewhere" in (o.error or "") for o in results if o is not ran[0])


@needs_bwrap
def test_bad_input_ends_in_clear_observations_and_the_runtime_keeps_serving(ws, store):
    (ws / "evil.txt").write_text("a" * 3000 + "!\n")
    (ws / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    tools = coding_tools(ws, search_limits=SearchLimits(time_budget_s=0.3))
    rt = make_runtime(ws, store, tools=tools)
    cap = rt.issue(ALL, [str(ws)])
    sleeper = dispatch(rt, cap, call("bash_execute", command="sleep 60", timeout_ms=1000), "s")
    assert sleeper.decision.allowed and "timed out after 1000 ms" in sleeper.error and sleeper.exit_status is None
    regex = dispatch(rt, cap, call("grep_search", pattern=r"(a|aa)+$"), "r")
    assert regex.ok and regex.truncated and "stopped after the 0.3 s time budget" in regex.output
    binary = dispatch(rt, cap, call("file_view", path="image.png"), "v")
    assert "looks binary" in binary.error
    assert dispatch(rt, cap, call("file_view", path="src/app.py"), "ok").ok
