"""`RolloutRunner`: many agent episodes on one `AsyncLLM` and one idempotency store, concurrently.

Per episode: load its checkpoint (resume) or copy the seed workspace; bind the task's tools to
that workspace; attenuate the runner's capability to the workspace's path, the task's tools and
an expiry; then per turn generate from the previous ids (turn t+1's prompt is turn t's prompt +
its sampled ids + the rendered observation ids, so the prefix cache serves turn t's KV), dispatch
each call through `Runtime.dispatch` in its own thread under (trajectory id, turn, call id), and
render the results as the next segment. It ends on an answer, at max turns or when the budget is
spent; then the reward hook sees the workspace, which is removed unless kept. A rerun with the
same ids replays completed calls from the store and settles in-doubt ones by probe first. It does
not train, run Ray (`surecall.rollout.ray_pool`) or parse the CLI (`surecall.commands.rollout`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from surecall.config import SamplingParams
from surecall.dispatch.capability import Authority, Capability
from surecall.dispatch.idempotency import RecordState, derive_key
from surecall.dispatch.runtime import Observation, Runtime, Verdict
from surecall.errors import RequestError, StoreUnavailable
from surecall.rollout.render import SegmentRenderer, call_message, result_message
from surecall.rollout.task import Task, TaskError, check_unique
from surecall.rollout.trajectory import Checkpoint, Trajectory, Turn
from surecall.toolbox.catalog import coding_tools

ROOT_RIGHTS = ("read", "write", "exec", "call:*", "approve:*")
Reward = Callable[[Path, Trajectory], float]


@dataclass(frozen=True)
class RolloutConfig:
    out_dir: str  # checkpoints/, workspaces/ (and the CLI's trajectories.jsonl) go here
    keep_workspaces: bool = False
    temperature: float = 1.0
    seed: int = 0  # with the task's seed and the trajectory id, each turn's sampling seed
    tool_timeout_s: float = 300.0  # the rollout stops waiting for one dispatch after this long
    capability_ttl_s: float = 3600.0
    lease_s: float = 30.0  # idempotency lease of a running call (heartbeated while it runs)
    in_flight_wait_s: float = 120.0  # on resume, how long to wait for a call another owner held
    max_concurrency: int = 64  # episodes in flight at once
    namespace: str | None = None  # idempotency namespace; default: derived from out_dir

    def __post_init__(self) -> None:
        for name in ("tool_timeout_s", "capability_ttl_s", "lease_s", "in_flight_wait_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"Invalid {name}: expected a number of seconds > 0, got {value!r}")
        if isinstance(self.max_concurrency, bool) or not isinstance(self.max_concurrency, int) or self.max_concurrency < 1:
            raise ValueError(f"Invalid max_concurrency: expected an integer >= 1, got {self.max_concurrency!r}")

    def resolved_namespace(self) -> str:
        if self.namespace:
            return self.namespace
        digest = hashlib.sha256(os.path.realpath(self.out_dir).encode()).hexdigest()[:24]
        return f"rollout-{digest}"


@dataclass
class RolloutResult:
    trajectories: list[Trajectory]
    summary: dict = field(default_factory=dict)


class RolloutRunner:
    """Runs tasks as episodes over `engine` (an AsyncLLM), dispatching through `store`."""

    def __init__(self, engine, store, signing_key: bytes, config: RolloutConfig, *, reward: Reward | None = None,
                 tools_factory: Callable[[Path], list] = coding_tools, capability: Capability | None = None):
        self.engine, self.store, self.config = engine, store, config
        self.reward, self.tools_factory = reward, tools_factory
        self._key = signing_key
        self._authority = Authority(signing_key)
        self.out_dir = Path(config.out_dir)
        self.namespace = config.resolved_namespace()
        self._capability = capability
        llm = engine.llm
        self.tokenizer = llm.tokenizer
        self.stop_ids = frozenset(llm.vocab.stop_ids if llm.vocab is not None else llm._config_stop_ids())
        self.tool_format = llm._format(None)
        root = Path(self.out_dir, "workspaces")
        root.mkdir(parents=True, exist_ok=True)
        self.workspaces_root = root.resolve()

    # --- public ---------------------------------------------------------------------------
    def run(self, tasks: list[Task], progress: Callable[[Trajectory], None] | None = None) -> RolloutResult:
        return asyncio.run(self.run_async(tasks, progress))

    async def run_async(self, tasks: list[Task], progress: Callable[[Trajectory], None] | None = None) -> RolloutResult:
        """Run every task; trajectories come back in the tasks' order. TaskError/StoreUnavailable
        before any episode starts when a task is bad or the store does not answer."""
        self.check_tasks(tasks)  # 1. every task can run
        self.check_store()  # 2. the store answers (never a silent local fallback)
        root = self.root_capability()  # 3. the parent of every trajectory's capability
        before = self.engine.stats()
        started = time.perf_counter()
        gate = asyncio.Semaphore(self.config.max_concurrency)

        async def one(task: Task) -> Trajectory:
            async with gate:
                trajectory = await self._episode(task, root)
            if progress is not None:
                progress(trajectory)
            return trajectory

        trajectories = await asyncio.gather(*[one(t) for t in tasks])  # 4. all episodes, one engine
        summary = summarize(trajectories, time.perf_counter() - started, before, self.engine.stats())
        return RolloutResult(list(trajectories), summary)

    def check_tasks(self, tasks: list[Task]) -> None:
        check_unique(tasks)
        known = {t.name for t in self.tools_factory(self._scratch())}
        for task in tasks:
            unknown = sorted(set(task.tools) - known)
            if unknown:
                raise TaskError(f"Invalid task {task.id!r}: unknown tools {unknown}; this runner serves {sorted(known)}")
            task.check_workspace()
            self._check_budget(task)

    def check_store(self) -> None:
        probe = derive_key("surecall-rollout-probe", 0, "probe", "probe", {}, namespace=self.namespace)
        try:
            self.store.get(probe)
        except Exception as exc:
            raise StoreUnavailable(f"the idempotency store {self.store!r} does not answer ({type(exc).__name__}: "
                                   f"{exc}); no episode was started") from exc

    def root_capability(self) -> Capability:
        if self._capability is not None:
            return self._capability
        return self._authority.issue(ROOT_RIGHTS, [str(self.workspaces_root)], ttl_s=self.config.capability_ttl_s)

    # --- checks ---------------------------------------------------------------------------
    def _scratch(self) -> Path:
        path = self.workspaces_root / ".catalog"
        path.mkdir(exist_ok=True)
        return path

    def shortest_call_tokens(self, names: list[str]) -> tuple[int, str]:
        """A lower bound on the tokens of any call of these tools (empty arguments, stop token)."""
        fmt = self.tool_format
        costs = []
        for name in names:
            text = fmt.prefix + json.dumps({"name": name, fmt.args_key: {}}) + fmt.suffix
            costs.append((len(self.tokenizer.encode(text, add_special_tokens=False)) + 1, name))
        return min(costs)

    def _check_budget(self, task: Task) -> None:
        if task.tool_choice in ("auto", "none"):
            return
        names = [task.forced_tool] if task.forced_tool else list(task.tools)
        shortest, name = self.shortest_call_tokens(names)
        budget = min(task.max_tokens_per_turn, task.max_tokens)
        if budget < shortest:
            raise TaskError(f"Invalid task {task.id!r}: a budget of {budget} tokens per turn is below the shortest "
                            f"call ({shortest} tokens, {name} with no arguments); raise max_tokens_per_turn/max_tokens")

    # --- one episode ----------------------------------------------------------------------
    async def _episode(self, task: Task, root: Capability) -> Trajectory:
        checkpoint = Checkpoint(self.out_dir / "checkpoints" / f"{task.id}.jsonl", task.fingerprint())
        trajectory, workspace, finished = checkpoint.load()
        if finished:
            trajectory.resumed = True
            return trajectory
        resumed = trajectory is not None
        ws = Path(workspace) if resumed else self._make_workspace(task)
        tools = [t for t in self.tools_factory(ws) if t.name in task.tools]
        renderer = SegmentRenderer(self.tokenizer, tools)
        if not resumed:
            trajectory = Trajectory(task.id, renderer.prompt_ids(task.messages))
            checkpoint.start(trajectory, str(ws))
        trajectory.resumed = resumed
        runtime = Runtime(tools, self.store, self._key, namespace=self.namespace, lease_s=self.config.lease_s)
        capability = self._trajectory_capability(root, task, ws)
        episode = _Episode(self, task, trajectory, checkpoint, renderer, runtime, capability, tools)
        try:
            trajectory.end_reason = await episode.run()
        except Exception as exc:  # noqa: BLE001 - one failing trajectory must not end the batch
            trajectory.end_reason, trajectory.error = "error", f"{type(exc).__name__}: {exc}"
            trajectory.workspace = str(ws)  # kept, and no end line: a rerun resumes it
            return trajectory
        trajectory.reward = self._reward(ws, trajectory)
        if self.config.keep_workspaces:
            trajectory.workspace = str(ws)
        else:
            shutil.rmtree(ws, ignore_errors=True)
        checkpoint.end(trajectory)
        return trajectory

    def _make_workspace(self, task: Task) -> Path:
        ws = self.workspaces_root / task.id
        if ws.exists():  # a run killed before its checkpoint's first line: start it again
            shutil.rmtree(ws)
        seed = task.check_workspace()
        if seed is None:
            ws.mkdir(parents=True)
        else:
            shutil.copytree(seed, ws, symlinks=True)
        return ws.resolve()

    def _trajectory_capability(self, root: Capability, task: Task, ws: Path) -> Capability:
        rights = {"read", "write", "exec"} | {f"call:{n}" for n in task.tools} | {f"approve:{n}" for n in task.tools}
        expires = min(root.expires_at, time.time() + self.config.capability_ttl_s)
        return self._authority.attenuate(root, rights=rights, objects=[str(ws)], expires_at=expires)

    def _reward(self, ws: Path, trajectory: Trajectory) -> float | None:
        if self.reward is None:
            return None
        try:
            return float(self.reward(ws, trajectory))
        except Exception as exc:  # noqa: BLE001 - a broken reward is reported on its trajectory
            trajectory.error = f"reward failed: {type(exc).__name__}: {exc}"
            return None


class _Episode:
    """The turn loop of one trajectory."""

    def __init__(self, runner: RolloutRunner, task: Task, trajectory: Trajectory, checkpoint: Checkpoint,
                 renderer: SegmentRenderer, runtime: Runtime, capability: Capability, tools: list):
        self.r, self.task, self.traj, self.ckpt = runner, task, trajectory, checkpoint
        self.renderer, self.runtime, self.capability, self.tools = renderer, runtime, capability, tools
        self.history = _history(task.messages, trajectory.turns)

    async def run(self) -> str:
        """Turns until the episode ends; returns why it ended."""
        while True:
            turn = await self._next_turn()  # 1. a resumed, undispatched turn, or a fresh one
            if isinstance(turn, str):
                return turn
            await self._observe(turn)  # 2. dispatch, render, checkpoint
            if self.traj.num_response_tokens >= self.task.max_tokens:
                return "budget"

    async def _next_turn(self) -> Turn | str:
        task, traj = self.task, self.traj
        last = traj.turns[-1] if traj.turns else None
        if last is not None and last.outcome != "call":
            return last.outcome  # resumed after a final turn
        if last is not None and not last.is_dispatched:  # sampled before a crash: its calls may have run
            await self._await_previous_owner(last)
            return last
        if len(traj.turns) >= task.max_turns:
            return "max_turns"
        max_new = min(task.max_tokens_per_turn, task.max_tokens - traj.num_response_tokens)
        turn = await self._generate(max_new) if max_new >= 1 else None
        if turn is None:
            return "budget"  # what is left is below the shortest call this turn allows
        traj.turns.append(turn)
        self.ckpt.turn(turn)  # what was sampled, before any effect
        return turn if turn.outcome == "call" else turn.outcome

    # --- generate ---------------------------------------------------------------------------
    async def _generate(self, max_new: int) -> Turn | None:
        traj, index = self.traj, len(self.traj.turns)
        ids = traj.token_ids
        tools, constrained = self._decode_tools(index)
        params = SamplingParams(temperature=self.r.config.temperature, max_tokens=max_new, seed=self._seed(index),
                                logprobs=True, unmasked_logprobs=True)
        started = time.perf_counter()
        last = None
        request_id = f"{traj.id}/t{index}/{secrets.token_hex(4)}"
        try:
            async for out in self.r.engine.generate(ids, params, request_id=request_id, tools=tools,
                                                    constrained=constrained):
                last = out
        except RequestError as exc:
            if "shortest call" in str(exc):
                return None
            raise
        calls, outcome = self._calls(index, last)
        return Turn(index=index, prompt_len=len(ids), sampled_ids=list(last.token_ids), logprobs=list(last.logprobs or []),
                    unmasked_logprobs=list(last.unmasked_logprobs or []), text=last.text,
                    finish_reason=last.finish_reason, calls=calls, outcome=outcome,
                    num_cached_tokens=last.num_cached_tokens,
                    timings={"generate_s": time.perf_counter() - started, "ttft_s": last.metrics.get("ttft_s")})

    def _decode_tools(self, index: int) -> tuple[list | None, bool]:
        task = self.task
        if task.tool_choice == "none":
            return None, False
        if task.turn_tools is not None and index < len(task.turn_tools):
            tools = task.turn_tools[index]
        elif task.forced_tool:
            tools = [t for t in self.tools if t.name == task.forced_tool]
        else:
            tools = self.tools
        return tools, task.tool_choice != "auto"

    def _seed(self, index: int) -> int:
        text = json.dumps([self.r.config.seed, self.task.seed, self.traj.id, index])
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:7], "big")

    def _calls(self, index: int, out) -> tuple[list[dict], str]:
        found = out.call if isinstance(out.call, list) else ([out.call] if out.call is not None else [])
        if out.ok and found:
            return [{"id": f"call_{index}_{k}", "name": c.name, "arguments": c.arguments} for k, c in enumerate(found)], "call"
        if out.finish_reason == "length":
            return [], "budget"
        marker = (self.r.tool_format.prefix or "").strip()
        if self.task.tool_choice == "auto" and out.error_kind and marker and marker not in out.text:
            return [], "answer"  # free text without a call: the model answered
        return [], "invalid_call" if out.error_kind else "answer"

    async def _await_previous_owner(self, turn: Turn) -> None:
        """Before re-dispatching a turn a killed run had sampled, wait until no owner may still run
        its calls (the lease and the takeover margin passed); the claim then settles IN_DOUBT ones."""
        deadline = time.monotonic() + self.r.config.in_flight_wait_s
        for call in turn.calls:
            try:
                key = derive_key(self.traj.id, turn.index, call["id"], call["name"], call["arguments"],
                                 namespace=self.runtime.namespace)
            except Exception:  # noqa: BLE001 - dispatch reports a bad call itself
                continue
            while time.monotonic() < deadline:
                record = await asyncio.to_thread(self.r.store.get, key)
                if not (record.state is RecordState.IN_FLIGHT or record.owner_may_be_alive):
                    break
                await asyncio.sleep(min(0.5, self.r.config.lease_s / 4))

    # --- observe ------------------------------------------------------------------------------
    async def _observe(self, turn: Turn) -> None:
        started = time.perf_counter()
        observations = [await self._dispatch(turn, call) for call in turn.calls]
        dispatched = time.perf_counter()
        assistant = call_message(turn.calls)
        results = [result_message(c, o.to_message()) for c, o in zip(turn.calls, observations, strict=True)]
        ended_with_stop = bool(turn.sampled_ids) and turn.sampled_ids[-1] in self.r.stop_ids
        ids = self.renderer.observation_ids(self.history, assistant, results, ended_with_stop)
        self.history += [assistant, *results]
        room = self.task.max_tokens - self.traj.num_response_tokens
        turn.observations = [{**o.to_dict(), "message": m["content"]} for o, m in zip(observations, results, strict=True)]
        turn.observation_ids = ids if len(ids) <= room else []  # an observation past the budget ends the episode
        if len(ids) > room:
            turn.timings["observation_dropped"] = len(ids)
        turn.timings.update(dispatch_s=dispatched - started, render_s=time.perf_counter() - dispatched)
        self.ckpt.observations(turn)

    async def _dispatch(self, turn: Turn, call: dict) -> Observation:
        cfg = self.r.config
        deadline = time.monotonic() + cfg.in_flight_wait_s
        request = {"name": call["name"], "arguments": call["arguments"]}
        while True:
            future = _in_thread(self.runtime.dispatch, request, self.capability, self.traj.id, turn.index, call["id"])
            try:
                obs = await asyncio.wait_for(future, timeout=cfg.tool_timeout_s)
            except asyncio.TimeoutError:
                return _timed_out(call["name"], cfg.tool_timeout_s)
            # another owner (a killed run's lease) still holds the call: wait it out, then settle
            if obs.idempotency_state == "IN_FLIGHT" and obs.error and time.monotonic() < deadline:
                await asyncio.sleep(min(1.0, cfg.lease_s / 4))
                continue
            return obs


def _history(messages: list[dict], turns: list[Turn]) -> list[dict]:
    """The conversation so far as messages (what the template needs to render the next segment)."""
    history = list(messages)
    for turn in turns:
        if turn.is_dispatched:
            history.append(call_message(turn.calls))
            history += [result_message(c, o["message"]) for c, o in zip(turn.calls, turn.observations, strict=True)]
    return history


def _in_thread(fn, *args) -> asyncio.Future:
    """Run `fn` in a daemon thread (a hung tool never blocks the loop, the batch or exit)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def deliver(value, error) -> None:
        if not future.done():
            future.set_exception(error) if error is not None else future.set_result(value)

    def work() -> None:
        try:
            value, error = fn(*args), None
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            value, error = None, exc
        try:
            loop.call_soon_threadsafe(deliver, value, error)
        except RuntimeError:  # the loop is gone (the run ended while a hung tool ran on)
            pass

    threading.Thread(target=work, name="surecall-dispatch", daemon=True).start()
    return future


def _timed_out(name: str, timeout_s: float) -> Observation:
    error = (f"timed out after {timeout_s:g} s: the rollout stopped waiting; the call may still finish in the "
             "background and record its result")
    return Observation(tool=name, decision=Verdict(True, "allowed; timed out"), error=error, idempotency_state="UNRECORDED")


def summarize(trajectories: list[Trajectory], elapsed_s: float, before: dict, after: dict) -> dict:
    """Counts, token rates and the prefix-cache figures of one run."""
    turns = [t for traj in trajectories for t in traj.turns]
    sampled = sum(len(t.sampled_ids) for t in turns)
    later = [t for t in turns if t.index > 0]
    queried = after.get("prefix_queried_tokens", 0) - before.get("prefix_queried_tokens", 0)
    hits = after.get("prefix_hit_tokens", 0) - before.get("prefix_hit_tokens", 0)
    reasons: dict[str, int] = {}
    for traj in trajectories:
        reasons[traj.end_reason or "?"] = reasons.get(traj.end_reason or "?", 0) + 1
    return {
        "episodes": len(trajectories), "turns": len(turns), "calls": sum(t.num_calls for t in trajectories),
        "tool_errors": sum(t.num_tool_errors for t in trajectories), "sampled_tokens": sampled,
        "tokens": sum(len(t.token_ids) for t in trajectories), "elapsed_s": round(elapsed_s, 3),
        "tokens_per_s": round(sampled / elapsed_s, 1) if elapsed_s > 0 else 0.0,
        # engine-wide when its stats are given (one engine), else from the turns (Ray: many engines)
        "prefix_hit_rate": round(hits / queried, 4) if queried else
        round(sum(t.num_cached_tokens for t in turns) / max(1, sum(t.prompt_len for t in turns)), 4),
        "later_turn_cached_share": round(sum(t.num_cached_tokens for t in later) / max(1, sum(t.prompt_len for t in later)), 4),
        "generate_s": round(sum(t.timings.get("generate_s", 0.0) for t in turns), 3),
        "dispatch_s": round(sum(t.timings.get("dispatch_s", 0.0) for t in turns), 3),
        "end_reasons": reasons, "errors": sum(1 for t in trajectories if t.error),
        "prefix_hit_tokens": hits, "prefix_queried_tokens": queried,
    }


def write_trajectories(path: str | os.PathLike, trajectories: list[Trajectory]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for trajectory in trajectories:
            fh.write(json.dumps(trajectory.to_dict(), ensure_ascii=False) + "\n")
