"""Runtime.dispatch under attack: it fails closed in one place, the cost ceiling binds, keys are
scoped to a namespace, concurrent calls run at most once, and A3 tools compensate partial failures."""

from __future__ import annotations

import collections
import dataclasses
import math
import random
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from surecall.dispatch.idempotency import Claim, Record, RecordState, derive_key
from surecall.dispatch.runtime import Observation, Runtime
from surecall.dispatch.stores import SQLiteStore
from surecall.errors import ToolError
from surecall.toolbox.catalog import coding_tools
from surecall.toolbox.result import ToolResult
from surecall.tools import SideEffect, Tool

KEY = b"0123456789abcdef-test-signing-key"
ALL = ["call:*", "read", "write", "exec", "approve:*"]
EMPTY = {"type": "object", "properties": {}, "additionalProperties": False}
EDIT = {"name": "file_edit", "arguments": {"path": "src/app.py", "old_str": "x = 1", "new_str": "x = 2"}}


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("x = 1\n")
    return root.resolve()


@pytest.fixture(params=["sqlite", "redis"])
def store(request, tmp_path):
    if request.param == "sqlite":
        with SQLiteStore(tmp_path / "records.db") as s:
            yield s
        return
    from surecall.dispatch.stores import RedisStore

    s = RedisStore(request.getfixturevalue("redis_url"), prefix=f"surecall:hard:{request.node.name}:")
    yield s
    s.close()


def counting_tool(name="touch", level=SideEffect.A2, **extra):
    """A tool that records every execution in `tool.handler.runs`."""
    runs = []

    def handler():
        runs.append(1)
        return "done"

    handler.runs = runs
    return Tool.from_schema(name, EMPTY, level=level, handler=handler, **extra)


class GarbageStore:
    """A store that answers `claim` with whatever it was given (or raises it)."""

    def __init__(self, answer):
        self.answer = answer

    def claim(self, key, **_):
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer(key) if callable(self.answer) else self.answer


def _mutated(cap, **fields):
    for name, value in fields.items():
        object.__setattr__(cap, name, value)  # bypasses __post_init__, as a buggy caller could
    return cap


# --- 1. fail closed: each case is a denied or not-run observation, and nothing ran ----------
def _case(tmp_path, ws, name):
    """(runtime, call, capability, trajectory_id, turn, call_id, what ran) for one bad input."""
    tool = counting_tool()
    tools, store = [tool, *coding_tools(ws)], SQLiteStore(tmp_path / "r.db")
    rt = Runtime(tools, store, KEY)
    cap = rt.issue(ALL, [str(ws)])
    touch, args = {"name": "touch", "arguments": {}}, ("traj", 1, "c1")
    good = cap.to_dict()
    cases = {
        "cap-not-a-dict": lambda: (touch, 42, *args),
        "cap-empty-dict": lambda: (touch, {}, *args),
        "cap-rights-a-string": lambda: (touch, {**good, "rights": "call:*"}, *args),
        "cap-max-cost-nan": lambda: (touch, {**good, "max_cost": math.nan}, *args),
        "cap-chain-garbage": lambda: (touch, {**good, "chain": [1, 2]}, *args),
        "cap-v1-with-parent": lambda: (touch, {**good, "v": 1, "parent": good}, *args),
        "cap-fields-mutated": lambda: (touch, _mutated(rt.issue(ALL, [str(ws)]), expires_at="soon"), *args),
        "cap-objects-mutated": lambda: (EDIT, _mutated(rt.issue(ALL, [str(ws)]), objects=None), *args),
        "cap-chain-mutated": lambda: (touch, _mutated(rt.issue(ALL, [str(ws)]), chain=[None]), *args),
        "turn-nan": lambda: (touch, cap, "traj", math.nan, "c1"),
        "turn-bool": lambda: (touch, cap, "traj", True, "c1"),
        "turn-negative": lambda: (touch, cap, "traj", -1, "c1"),
        "turn-huge": lambda: (touch, cap, "traj", 2**60, "c1"),
        "call-id-surrogate": lambda: (touch, cap, "traj", 1, "\ud800"),
        "call-id-none": lambda: (touch, cap, "traj", 1, None),
        "call-id-huge": lambda: (touch, cap, "traj", 1, "c" * 100_000),
        "trajectory-surrogate": lambda: (touch, cap, "\udfff", 1, "c1"),
        "call-none": lambda: (None, cap, *args),
        "arguments-not-object": lambda: ({"name": "touch", "arguments": "rm -rf /"}, cap, *args),
        "arguments-surrogate-key": lambda: ({"name": "touch", "arguments": {"\ud800": 1}}, cap, *args),
        "path-component-300": lambda: ({"name": "file_edit", "arguments": {**EDIT["arguments"], "path": "a" * 300}}, cap, *args),
        "path-5000-chars": lambda: ({"name": "file_edit", "arguments": {**EDIT["arguments"], "path": "a/" * 2500}}, cap, *args),
        "view-path-component-300": lambda: ({"name": "file_view", "arguments": {"path": "b" * 300}}, cap, *args),
    }
    if name in cases:
        return (rt, *cases[name](), tool.handler.runs)
    # cases that need a tool or a store of their own
    if name.startswith("store-"):
        answers = {
            "store-raises": RuntimeError("disk I/O error"),
            "store-returns-string": "yes",
            "store-returns-bad-state": lambda key: Claim(True, Record(key, "IN_FLIGHT", owner="me")),
            "store-acquired-no-owner": lambda key: Claim(True, Record(key, RecordState.IN_FLIGHT)),
            "store-completed-garbage": lambda key: Claim(False, Record(key, RecordState.COMPLETED, result=[1, 2])),
            "store-completed-bad-field": lambda key: Claim(False, Record(key, RecordState.COMPLETED, result={"output": 5})),
            "store-in-flight-bad-lease": lambda key: Claim(False, Record(key, RecordState.IN_FLIGHT, lease_expires_at=None)),
        }
        rt = Runtime([tool], GarbageStore(answers[name]), KEY)
        return (rt, touch, rt.issue(ALL, []), *args, tool.handler.runs)
    if name.startswith("row-"):
        key = derive_key("traj", 1, "c1", "touch", {}, namespace=rt.namespace)
        slot, fp = key.split(".")
        state, result = {"row-bad-state": ("WHAT", None), "row-bad-json": ("COMPLETED", "{{{not json")}[name]
        with sqlite3.connect(tmp_path / "r.db") as conn:
            conn.execute("INSERT INTO surecall_records VALUES (?, ?, ?, 'x', 0, ?, '', 1, 0)", (slot, fp, state, result))
        return (rt, touch, cap, *args, tool.handler.runs)
    if name.startswith("tool-"):
        def raising(*_):
            raise RuntimeError("planner bug")

        variants = {
            "tool-cost-raises": dict(cost=raising),
            "tool-cost-nan": dict(cost=lambda a: math.nan),
            "tool-cost-inf": dict(cost=lambda a: math.inf),
            "tool-cost-negative": dict(cost=lambda a: -1),
            "tool-cost-string": dict(cost=lambda a: "5"),
        }
        if name == "tool-plan-raises":
            bad = dataclasses.replace(tool, handler=type("H", (), {"plan": raising, "runs": tool.handler.runs})())
        elif name == "tool-probe-raises":
            def flaky():
                tool.handler.runs.append(1)
                raise OSError("half written")

            bad = dataclasses.replace(tool, handler=flaky, probe=raising)
            rt = Runtime([bad], store, KEY)
            first = rt.dispatch(touch, cap, *args)
            assert first.idempotency_state == "IN_DOUBT"
            tool.handler.runs.clear()
            return (rt, touch, cap, *args, tool.handler.runs)
        else:
            bad = dataclasses.replace(tool, **variants[name])
        rt = Runtime([bad], store, KEY)
        return (rt, touch, cap, *args, tool.handler.runs)
    raise KeyError(name)


DENIED = {  # case -> the decision code (nothing approved, nothing ran)
    "cap-not-a-dict": "bad_capability", "cap-empty-dict": "bad_capability", "cap-rights-a-string": "bad_capability",
    "cap-max-cost-nan": "bad_capability", "cap-chain-garbage": "bad_capability", "cap-v1-with-parent": "bad_capability",
    "cap-fields-mutated": "bad_capability", "cap-objects-mutated": "bad_capability", "cap-chain-mutated": "bad_capability",
    "turn-nan": "bad_input", "turn-bool": "bad_input", "turn-negative": "bad_input", "turn-huge": "bad_input",
    "call-id-surrogate": "bad_input", "call-id-none": "bad_input", "call-id-huge": "bad_input",
    "trajectory-surrogate": "bad_input", "call-none": "unknown_tool", "arguments-not-object": "invalid_arguments",
    "arguments-surrogate-key": "invalid_arguments", "path-component-300": "bad_path", "path-5000-chars": "invalid_arguments",
    "view-path-component-300": "bad_path", "tool-plan-raises": "bad_input",
    "tool-cost-raises": "bad_cost", "tool-cost-nan": "bad_cost", "tool-cost-inf": "bad_cost",
    "tool-cost-negative": "bad_cost", "tool-cost-string": "bad_cost",
}
NOT_RUN = ["store-raises", "store-returns-string", "store-returns-bad-state", "store-acquired-no-owner",
           "store-completed-garbage", "store-completed-bad-field", "store-in-flight-bad-lease",
           "row-bad-state", "row-bad-json", "tool-probe-raises"]


@pytest.mark.parametrize("name", [*DENIED, *NOT_RUN])
def test_every_bad_input_is_a_refused_observation(tmp_path, ws, name):
    rt, call, cap, trajectory_id, turn, call_id, runs = _case(tmp_path, ws, name)
    before = (ws / "src" / "app.py").read_bytes()
    out = rt.dispatch(call, cap, trajectory_id, turn, call_id)
    assert isinstance(out, Observation) and not out.ok and out.error
    if name in DENIED:
        assert (out.decision.allowed, out.decision.code) == (False, DENIED[name]), out.error
        assert out.idempotency_state in ("NOT_REQUIRED", "NOT_CLAIMED")
    else:
        assert out.decision.allowed and out.error.startswith("not run:"), out.error
    assert runs == [] and (ws / "src" / "app.py").read_bytes() == before
    assert isinstance(out.to_message(), str) and isinstance(out.to_dict(), dict)


def test_an_unnameable_path_is_not_recorded_in_doubt(tmp_path, ws):
    with SQLiteStore(tmp_path / "r.db") as store:
        rt = Runtime(coding_tools(ws), store, KEY)
        edit = {"name": "file_edit", "arguments": {**EDIT["arguments"], "path": "a" * 300}}
        out = rt.dispatch(edit, rt.issue(ALL, [str(ws)]), "t", 1, "c1")
        assert out.decision.code == "bad_path" and "ENAMETOOLONG" in out.error
        key = derive_key("t", 1, "c1", "file_edit", edit["arguments"], namespace=rt.namespace)
        assert store.get(key).state is RecordState.UNSEEN


# --- 2. the cost ceiling P binds ---------------------------------------------------------------
@pytest.mark.parametrize("call,ceiling,allowed", [
    ({"name": "file_view", "arguments": {"path": "src/app.py"}}, 99.0, False),  # limit defaults to 100 lines
    ({"name": "file_view", "arguments": {"path": "src/app.py", "limit": 50}}, 99.0, True),
    ({"name": "file_edit", "arguments": {**EDIT["arguments"], "new_str": "x = 22222"}}, 8.0, False),  # 9 bytes
    ({"name": "file_edit", "arguments": EDIT["arguments"]}, 8.0, True),  # 5 bytes
    ({"name": "grep_search", "arguments": {"pattern": "x"}}, 4999.0, False),  # a 5 s time budget
    ({"name": "bash_execute", "arguments": {"command": "true"}}, 29_999.0, False),  # timeout_ms defaults to 30 s
    ({"name": "bash_execute", "arguments": {"command": "true", "timeout_ms": 1000}}, 999.0, False),
])
def test_each_tool_declares_its_cost_and_the_ceiling_binds(tmp_path, ws, call, ceiling, allowed):
    with SQLiteStore(tmp_path / "r.db") as store:
        rt = Runtime(coding_tools(ws), store, KEY)
        out = rt.dispatch(call, rt.issue(ALL, [str(ws)], max_cost=ceiling), "t", 1, "c1")
    if allowed:
        assert out.ok, out.error
    else:
        assert (out.decision.allowed, out.decision.code) == (False, "cost_exceeded") and "exceeds the ceiling" in out.error
        assert (ws / "src" / "app.py").read_text() == "x = 1\n"


def test_a_child_with_a_lower_ceiling_is_held_to_it(tmp_path, ws):
    tool = counting_tool(cost=lambda a: 10.0)
    with SQLiteStore(tmp_path / "r.db") as store:
        rt = Runtime([tool], store, KEY)
        parent = rt.issue(ALL, [], max_cost=100.0)
        child = rt.attenuate(parent, max_cost=5.0)
        assert rt.dispatch({"name": "touch"}, parent, "t", 1, "a").ok
        assert rt.dispatch({"name": "touch"}, child, "t", 1, "b").decision.code == "cost_exceeded"
    assert tool.handler.runs == [1]


# --- 5. idempotency keys are scoped to a namespace -------------------------------------------
def test_runtimes_over_other_workspaces_never_share_records(tmp_path, store):
    spaces = []
    for name in ("a", "b"):
        root = tmp_path / name
        (root / "src").mkdir(parents=True)
        (root / "src" / "app.py").write_text("x = 1\n")
        spaces.append(root.resolve())
    outs = []
    for root in spaces:
        rt = Runtime(coding_tools(root), store, KEY)
        outs.append(rt.dispatch(EDIT, rt.issue(ALL, [str(root)]), "traj", 1, "c1"))
    assert [o.replayed for o in outs] == [False, False] and outs[0].idempotency_key != outs[1].idempotency_key
    assert all((root / "src" / "app.py").read_text() == "x = 2\n" for root in spaces)


def test_an_explicit_namespace_scopes_tenants(ws, store):
    tool = counting_tool()
    tenants = [Runtime([tool], store, KEY, namespace=n) for n in ("tenant-1", "tenant-2", "tenant-1")]
    outs = [rt.dispatch({"name": "touch"}, rt.issue(ALL, []), "traj", 1, "c1") for rt in tenants]
    assert [o.replayed for o in outs] == [False, False, True] and tool.handler.runs == [1, 1]
    assert derive_key("t", 1, "c", "x", {}, namespace="a") != derive_key("t", 1, "c", "x", {}, namespace="b")
    with pytest.raises(ValueError, match="Invalid namespace"):
        Runtime([tool], store, KEY, namespace="")


# --- 6. concurrent dispatch from threads -------------------------------------------------------
def test_concurrent_distinct_and_identical_calls_each_run_at_most_once(ws, store):
    ran = collections.Counter()
    lock = threading.Lock()

    def slow(tag):
        time.sleep(0.01)
        with lock:
            ran[tag] += 1
        return f"ran {tag}"

    schema = {"type": "object", "properties": {"tag": {"type": "string", "maxLength": 8}},
              "required": ["tag"], "additionalProperties": False}
    tools = [Tool.from_schema("slow", schema, level=SideEffect.A2, handler=slow), *coding_tools(ws)]
    rt = Runtime(tools, store, KEY)
    cap = rt.issue(ALL, [str(ws)])
    jobs = [(f"c{i}", {"name": "slow", "arguments": {"tag": f"t{i}"}}) for i in range(8) for _ in range(4)]
    jobs += [(f"v{i}", {"name": "file_view", "arguments": {"path": "src/app.py"}}) for i in range(8)]
    random.Random(0).shuffle(jobs)
    with ThreadPoolExecutor(max_workers=8) as pool:
        outs = list(pool.map(lambda job: (job[0], rt.dispatch(job[1], cap, "traj", 1, job[0])), jobs))
    assert ran == {f"t{i}": 1 for i in range(8)}
    by_id = collections.defaultdict(list)
    for call_id, out in outs:
        by_id[call_id].append(out)
    for call_id, group in by_id.items():
        if call_id.startswith("v"):
            assert all(o.ok and "x = 1" in o.output for o in group)
            continue
        fresh = [o for o in group if not o.replayed and o.error is None]
        assert len(fresh) == 1 and fresh[0].output == f"ran t{call_id[1:]}"
        assert all(o.replayed or "in flight elsewhere" in o.error for o in group if o is not fresh[0])


# --- 7. A3 compensators run when an effect failed partway --------------------------------------
def _a3(tmp_path, behaviour, compensator, level=SideEffect.A3):
    marker = tmp_path / "deployed"
    undone = []

    def deploy():
        if behaviour == "refuse":
            raise ToolError("nothing to deploy")
        marker.write_text("half")
        if behaviour == "raise":
            raise RuntimeError("network dropped mid-deploy")
        return ToolResult(error="rolled out to 1 of 3 hosts", data={"partial_effect": True})

    def undo(arguments, result):
        undone.append(result["error"])
        if compensator == "raises":
            raise OSError("cannot reach the hosts")
        marker.unlink()

    tool = Tool.from_schema("deploy", EMPTY, level=level, handler=deploy, compensator=undo)
    return tool, marker, undone


@pytest.mark.parametrize("behaviour", ["raise", "partial"])
def test_a3_partial_failure_runs_the_compensator(tmp_path, store, behaviour):
    tool, marker, undone = _a3(tmp_path, behaviour, "ok")
    rt = Runtime([tool], store, KEY)
    cap = rt.issue(["call:deploy", "approve:deploy"], [])
    out = rt.dispatch({"name": "deploy"}, cap, "traj", 1, "c1")
    assert len(undone) == 1 and not marker.exists()
    assert out.data["compensation"] == {"ran": True, "undone": True, "error": None}
    assert "compensated" in out.error and out.idempotency_state == "COMPLETED"
    again = rt.dispatch({"name": "deploy"}, cap, "traj", 1, "c1")
    assert again.replayed and again.data["compensation"]["undone"] and len(undone) == 1


def test_a_failing_compensator_leaves_the_call_in_doubt(tmp_path, store):
    tool, marker, undone = _a3(tmp_path, "raise", "raises")
    rt = Runtime([tool], store, KEY)
    out = rt.dispatch({"name": "deploy"}, rt.issue(["call:*", "approve:*"], []), "traj", 1, "c1")
    assert out.idempotency_state == "IN_DOUBT" and marker.exists() and len(undone) == 1
    assert out.data["compensation"]["undone"] is False and "cannot reach the hosts" in out.error


@pytest.mark.parametrize("behaviour,level", [("refuse", SideEffect.A3), ("raise", SideEffect.A2)])
def test_no_compensation_for_refusals_or_below_a3(tmp_path, store, behaviour, level):
    tool, _, undone = _a3(tmp_path, behaviour, "ok", level=level)
    rt = Runtime([tool], store, KEY)
    out = rt.dispatch({"name": "deploy"}, rt.issue(["call:*", "approve:*"], []), "traj", 1, "c1")
    assert out.error and undone == [] and "compensation" not in out.data


def test_a_float_timeout_gets_its_lease(tmp_path, ws):
    with SQLiteStore(tmp_path / "r.db") as store:
        rt = Runtime(coding_tools(ws), store, KEY, lease_s=30.0)
        assert rt._lease_for({"timeout_ms": 90_000.0}) == 100.0  # 90 s + the 10 s margin
        assert rt._lease_for({"timeout_ms": math.nan}) == 30.0
