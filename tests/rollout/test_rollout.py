"""Rollouts on the shipped model: scripted multi-turn episodes, token accounting, faults."""

from __future__ import annotations

import json
import threading

import pytest
import torch
from helpers.rollout import SCRIPT, make_seed, needs_bwrap, scripted

from surecall import AsyncLLM
from surecall.dispatch.stores import SQLiteStore
from surecall.errors import StoreUnavailable
from surecall.rollout import RolloutConfig, RolloutRunner, Task, TaskError, load_tasks
from surecall.toolbox.catalog import coding_tools
from surecall.tools import Tool

KEY = b"rollout-test-key-0123456789abcdef"
USER = [{"role": "user", "content": "Fix log.txt and record what you did in effects.log"}]


class Spy:
    """The engine, recording the prompt ids each request was given and the ids the engine reported."""

    def __init__(self, engine):
        self.engine, self.llm, self.seen = engine, engine.llm, []

    def stats(self):
        return self.engine.stats()

    async def generate(self, prompt, params, **kw):
        last = None
        async for out in self.engine.generate(prompt, params, **kw):
            last = out
            yield out
        self.seen.append((kw["request_id"].split("/")[0], list(prompt), list(last.prompt_token_ids)))


@pytest.fixture(scope="module")
def engine():
    eng = AsyncLLM(num_blocks=1024)
    yield eng
    eng.shutdown()


def _runner(engine, tmp_path, **config):
    store = SQLiteStore(tmp_path / "idem.db")
    return RolloutRunner(engine, store, KEY, RolloutConfig(out_dir=str(tmp_path / "out"), **config))


def _task(seed, i=0, **kw):
    kw.setdefault("turn_tools", SCRIPT)
    kw.setdefault("max_turns", len(SCRIPT))
    return Task(id=f"ep{i}", messages=USER, workspace=str(seed), **kw)


@pytest.fixture(scope="module")
def scripted_run(engine, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("scripted")
    spy = Spy(engine)
    runner = _runner(spy, tmp, keep_workspaces=True)
    result = runner.run([_task(make_seed(tmp), i) for i in range(3)])
    return result, spy


@needs_bwrap
def test_scripted_episode_runs_the_four_coding_tools_end_to_end(scripted_run):
    result, _ = scripted_run
    assert result.summary["episodes"] == 3 and result.summary["calls"] == 15 and result.summary["tool_errors"] == 0
    for traj in result.trajectories:
        assert traj.end_reason == "max_turns" and [t.calls[0]["name"] for t in traj.turns] == [
            "bash_execute", "file_edit", "file_view", "grep_search", "bash_execute"]
        assert all(o["decision"]["allowed"] and o["error"] is None for t in traj.turns for o in t.observations)
        ws = traj.workspace
        assert open(f"{ws}/effects.log").read() == "t0\nt4\n" and open(f"{ws}/log.txt").read() == "done1\nslot2\n"
        assert "done1" in traj.turns[2].observations[0]["output"]  # file_view saw the edit of turn 1
        assert "log.txt:1: done1" in traj.turns[3].observations[0]["output"]


def test_each_turn_prompt_is_the_previous_prompt_plus_sampled_plus_observation_ids(scripted_run):
    result, spy = scripted_run
    for traj in result.trajectories:
        prompts = [given for tid, given, reported in spy.seen if tid == traj.id]
        assert len(prompts) == len(traj.turns)
        assert all(given == reported for tid, given, reported in spy.seen if tid == traj.id)
        assert prompts[0] == traj.prompt_ids
        for turn, now, nxt in zip(traj.turns, prompts, prompts[1:]):
            assert nxt[: len(now)] == now and nxt == now + turn.sampled_ids + turn.observation_ids
        last = traj.turns[-1]
        assert traj.token_ids == prompts[-1] + last.sampled_ids + last.observation_ids


def test_loss_mask_and_logprobs_align_with_the_token_ids(scripted_run):
    result, _ = scripted_run
    for traj in result.trajectories:
        ids, mask = traj.token_ids, traj.loss_mask
        assert len(mask) == len(ids) == len(traj.logprobs) == len(traj.unmasked_logprobs)
        assert sum(mask) == sum(len(t.sampled_ids) for t in traj.turns)
        assert mask[: len(traj.prompt_ids)] == [0] * len(traj.prompt_ids)
        pos = len(traj.prompt_ids)
        for turn in traj.turns:
            assert mask[pos: pos + len(turn.sampled_ids)] == [1] * len(turn.sampled_ids)
            pos += len(turn.sampled_ids)
            assert mask[pos: pos + len(turn.observation_ids)] == [0] * len(turn.observation_ids)
            pos += len(turn.observation_ids)
        assert all(lp == 0.0 for lp, m in zip(traj.logprobs, mask) if m == 0)


def test_sampled_logprobs_match_a_reference_forward_pass(engine, scripted_run):
    result, _ = scripted_run
    traj = result.trajectories[0]
    ids = torch.tensor([traj.token_ids])
    with torch.inference_mode():
        logits = engine.llm.runner.model(input_ids=ids).logits[0].float()
    ref = torch.log_softmax(logits, dim=-1)  # temperature 1.0: the unmasked policy
    positions = [i for i, m in enumerate(traj.loss_mask) if m]
    expected = torch.tensor([float(ref[i - 1, traj.token_ids[i]]) for i in positions])
    got = torch.tensor([traj.unmasked_logprobs[i] for i in positions])
    assert torch.allclose(got, expected, atol=1e-4), float((got - expected).abs().max())
    masked = torch.tensor([traj.logprobs[i] for i in positions])
    assert bool((masked >= got - 1e-5).all())  # the grammar renormalises over fewer tokens


def test_later_turns_reuse_the_previous_turns_kv_through_the_prefix_cache(scripted_run):
    result, _ = scripted_run
    block = 16
    for traj in result.trajectories:
        for prev, turn in zip(traj.turns, traj.turns[1:]):
            assert turn.num_cached_tokens >= (prev.prompt_len // block) * block
    assert result.summary["later_turn_cached_share"] > 0.8 and result.summary["prefix_hit_rate"] > 0.5


def test_workspaces_are_removed_unless_kept_and_each_capability_is_narrowed(engine, tmp_path):
    runner = _runner(engine, tmp_path)
    seed = make_seed(tmp_path)
    task = _task(seed, turn_tools=SCRIPT[:1], max_turns=1)
    root = runner.root_capability()
    cap = runner._trajectory_capability(root, task, runner.workspaces_root / task.id)
    assert cap.objects == (str(runner.workspaces_root / task.id),) and cap.expires_at <= root.expires_at
    assert "call:bash_execute" in cap.rights and "call:*" not in cap.rights
    [traj] = runner.run([task]).trajectories
    assert traj.end_reason == "max_turns" and traj.workspace is None
    assert not (runner.workspaces_root / task.id).exists()


@needs_bwrap
def test_a_rerun_of_finished_trajectories_returns_them_without_running_again(engine, tmp_path):
    runner = _runner(engine, tmp_path, keep_workspaces=True)
    task = _task(make_seed(tmp_path), turn_tools=SCRIPT[:1], max_turns=1)
    [first] = runner.run([task]).trajectories
    [again] = runner.run([task]).trajectories
    assert again.resumed and again.token_ids == first.token_ids
    assert open(f"{first.workspace}/effects.log").read() == "t0\n"


@needs_bwrap
def test_a_hung_tool_times_out_and_the_episode_goes_on(engine, tmp_path):
    release = threading.Event()
    hang = Tool(name="hang", description="never returns", input_schema={"type": "object", "properties": {}},
                level=0, handler=lambda: release.wait(60) and "late")

    def tools(ws):
        return coding_tools(ws) + [hang]

    runner = RolloutRunner(engine, SQLiteStore(tmp_path / "idem.db"), KEY,
                           RolloutConfig(out_dir=str(tmp_path / "out"), tool_timeout_s=2.5), tools_factory=tools)
    sleepy = scripted("bash_execute", {"command": "sleep 20", "timeout_ms": 1000})
    task = Task(id="hangs", messages=USER, tools=("hang", "bash_execute", "file_view"), max_turns=3,
                turn_tools=[[scripted("hang", {})], [sleepy], [scripted("file_view", {"path": "."})]])
    try:
        [traj] = runner.run([task]).trajectories
    finally:
        release.set()
    assert traj.end_reason == "max_turns" and len(traj.turns) == 3
    assert "timed out after 2.5 s" in traj.turns[0].observations[0]["error"]
    bash = traj.turns[1].observations[0]
    assert bash["data"]["timed_out"] and bash["exit_status"] != 0  # the tool's own timeout ended it
    assert traj.turns[2].observations[0]["decision"]["allowed"]


@needs_bwrap
def test_reward_hook_sees_the_final_workspace_and_transcript(engine, tmp_path):
    seen = {}

    def reward(ws, traj):
        seen["log"] = (ws / "effects.log").read_text()
        return float(len(traj.turns))

    runner = RolloutRunner(engine, SQLiteStore(tmp_path / "idem.db"), KEY, RolloutConfig(out_dir=str(tmp_path / "o")),
                           reward=reward)
    [traj] = runner.run([_task(make_seed(tmp_path), turn_tools=SCRIPT[:1], max_turns=1)]).trajectories
    assert traj.reward == 1.0 and seen["log"] == "t0\n"


def test_tool_choice_none_answers_in_one_turn_and_budget_ends_an_episode(engine, tmp_path):
    runner = _runner(engine, tmp_path)
    answer = Task(id="answer", messages=USER, tool_choice="none", max_tokens_per_turn=8)
    budget = Task(id="budget", messages=USER, turn_tools=SCRIPT, max_turns=5, max_tokens=60)
    a, b = runner.run([answer, budget]).trajectories
    assert a.end_reason in ("answer", "budget") and len(a.turns) == 1 and not a.turns[0].calls
    assert b.end_reason == "budget" and b.num_response_tokens <= 60
    # the first call's results do not fit what is left: recorded, but no ids appended, and no next turn
    assert len(b.turns) == 1 and b.turns[0].observations and b.turns[0].observation_ids == []


# --- bad input and faults: each refused before any episode starts ---------------------------------
@pytest.mark.parametrize(("kw", "match"), [
    ({"tools": ("file_view", "teleport")}, r"unknown tools \['teleport'\]"),
    ({"workspace": "/nonexistent/seed"}, r"workspace seed '/nonexistent/seed' does not exist"),
    ({"max_tokens_per_turn": 5}, r"budget of 5 tokens per turn is below the shortest call"),
])
def test_bad_tasks_are_refused_before_any_episode(engine, tmp_path, kw, match):
    runner = _runner(engine, tmp_path)
    task = Task(id="bad", messages=USER, **kw)
    with pytest.raises(TaskError, match=match):
        runner.run([_task(make_seed(tmp_path), 1, turn_tools=SCRIPT[:1], max_turns=1), task])
    assert not (tmp_path / "out" / "checkpoints").exists()


@pytest.mark.parametrize(("row", "match"), [
    ({"id": "a", "messages": [], "max_turns": 1}, "non-empty list"),
    ({"id": "a", "messages": USER, "tool_choice": "sometimes"}, "tool_choice"),
    ({"id": "a", "messages": USER, "tool_choice": {"type": "function", "function": {"name": "x"}}}, "names 'x'"),
    ({"id": "a/b", "messages": USER}, "Invalid task id"),
    ({"id": "a", "messages": USER, "max_turn": 3}, r"unknown keys \['max_turn'\]"),
    ({"id": "a", "messages": USER, "max_turns": 0}, "max_turns to be an integer >= 1"),
])
def test_bad_task_rows_name_what_is_wrong(tmp_path, row, match):
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(TaskError, match=match):
        load_tasks(path)


def test_duplicate_ids_and_torn_json_are_refused(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({"id": "a", "messages": USER}) + "\n" + json.dumps({"id": "a", "messages": USER}) + "\n")
    with pytest.raises(TaskError, match="id 'a' appears twice"):
        load_tasks(path)
    path.write_text('{"id": "a", "messages"\n')
    with pytest.raises(TaskError, match=r"tasks.jsonl:1: not JSON"):
        load_tasks(path)


def test_an_unreachable_redis_store_is_a_clear_error_before_any_episode(engine, tmp_path):
    pytest.importorskip("redis")
    from conftest import free_port

    from surecall.dispatch.stores import RedisStore

    store = RedisStore(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.5)
    runner = RolloutRunner(engine, store, KEY, RolloutConfig(out_dir=str(tmp_path / "out")))
    with pytest.raises(StoreUnavailable, match="does not answer .*no episode was started"):
        runner.run([_task(make_seed(tmp_path), turn_tools=SCRIPT[:1], max_turns=1)])
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_tool_choice_auto_decodes_freely_and_dispatches_only_calls_that_parse(engine, tmp_path):
    runner = _runner(engine, tmp_path)
    task = Task(id="auto", messages=[{"role": "user", "content": "Show the first 20 lines of log.txt"}],
                workspace=str(make_seed(tmp_path)), tool_choice="auto", max_turns=3, seed=7)
    [traj] = runner.run([task]).trajectories
    assert traj.end_reason in ("max_turns", "answer", "invalid_call", "budget") and traj.error is None
    for turn in traj.turns:
        assert (turn.outcome == "call") == bool(turn.calls) == turn.is_dispatched
        if turn.outcome == "invalid_call":
            assert "<tool_call>" in turn.text


def test_a_checkpoint_of_another_task_under_the_same_id_is_refused_before_any_episode(engine, tmp_path):
    runner = _runner(engine, tmp_path)
    seed = make_seed(tmp_path)
    runner.run([_task(seed, turn_tools=SCRIPT[:1], max_turns=1)])
    changed = _task(seed, turn_tools=SCRIPT[:1], max_turns=2)
    with pytest.raises(TaskError, match="checkpoint .* was written for a different task"):
        runner.run([changed])


def test_a_slow_tool_does_not_stall_the_other_episodes(engine, tmp_path):
    import time

    returned = {}

    def slow():
        time.sleep(4.0)
        returned["at"] = time.monotonic()
        return "slow done"

    tool = Tool(name="slow", description="takes a while", input_schema={"type": "object", "properties": {}},
                level=0, handler=slow)
    runner = RolloutRunner(engine, SQLiteStore(tmp_path / "idem.db"), KEY, RolloutConfig(out_dir=str(tmp_path / "o")),
                           tools_factory=lambda ws: coding_tools(ws) + [tool])
    view = [scripted("file_view", {"path": "log.txt"})]
    tasks = [Task(id="slow", messages=USER, tools=("slow",), workspace=str(make_seed(tmp_path)), max_turns=1,
                  turn_tools=[[scripted("slow", {})]]),
             Task(id="fast", messages=USER, tools=("file_view",), workspace=str(make_seed(tmp_path)), max_turns=2,
                  turn_tools=[view, view])]
    finished = {}
    result = runner.run(tasks, progress=lambda traj: finished.setdefault(traj.id, time.monotonic()))
    assert [t.end_reason for t in result.trajectories] == ["max_turns", "max_turns"]
    assert finished["fast"] < returned["at"] <= finished["slow"]  # two turns ran while the slow call was running
