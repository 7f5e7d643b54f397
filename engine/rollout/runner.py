"""`RolloutRunner`: many agent episodes on one `AsyncLLM` and one idempotency store, concurrently.

Before any episode: every task is checked (tool names, workspace seed, budget against the
shortest call) and the store must answer. Per episode: load its checkpoint (resume) or copy the
seed workspace; bind the task's tools to that workspace; attenuate the runner's capability to
the workspace's path, the task's tools and an expiry; run the turn loop (`surecall.rollout.
episode`); then the reward hook sees the workspace, which is removed unless kept. Episodes share
the engine's continuous batch and its prefix cache. It does not train, run Ray
(`surecall.rollout.ray_pool`) or parse the CLI (`surecall.commands.rollout`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from surecall.dispatch.capability import Authority, Capability
from surecall.dispatch.idempotency import derive_key
from surecall.dispatch.runtime import Runtime
from surecall.errors import StoreUnavailable
from surecall.rollout.episode import Episode
from surecall.rollout.render import SegmentRenderer
from surecall.rollout.task import Task, TaskError, check_unique
from surecall.rollout.trajectory import Checkpoint, Trajectory
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
        scratch = self.workspaces_root / ".catalog"
        scratch.mkdir(exist_ok=True)
        try:
            known = {t.name for t in self.tools_factory(scratch)}
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        for task in tasks:
            unknown = sorted(set(task.tools) - known)
            if unknown:
                raise TaskError(f"Invalid task {task.id!r}: unknown tools {unknown}; this runner serves {sorted(known)}")
            task.check_workspace()
            self._check_budget(task)
            self._checkpoint(task).load()  # a checkpoint written for another task under this id is refused

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
    def _checkpoint(self, task: Task) -> Checkpoint:
        return Checkpoint(self.out_dir / "checkpoints" / f"{task.id}.jsonl", task.fingerprint())

    async def _episode(self, task: Task, root: Capability) -> Trajectory:
        checkpoint = self._checkpoint(task)
        trajectory, workspace, finished = checkpoint.load()
        if finished:  # 1. a finished trajectory is returned as it was recorded
            trajectory.resumed = True
            return trajectory
        resumed = trajectory is not None
        trajectory = trajectory or Trajectory(task.id, [])
        trajectory.resumed = resumed
        ws = Path(workspace) if resumed else None
        try:
            ws = ws or self._make_workspace(task)  # 2. its workspace, tools, runtime and capability
            episode = self._prepare(task, root, checkpoint, trajectory, ws, resumed)
            trajectory.end_reason = await episode.run()  # 3. the turns
        except Exception as exc:  # noqa: BLE001 - one failing trajectory must not end the batch
            trajectory.end_reason, trajectory.error = "error", f"{type(exc).__name__}: {exc}"
            trajectory.workspace = str(ws) if ws else None  # kept, and no end line: a rerun resumes it
            return trajectory
        trajectory.reward = self._reward(ws, trajectory)  # 4. reward, cleanup, the end line
        if self.config.keep_workspaces:
            trajectory.workspace = str(ws)
        else:
            shutil.rmtree(ws, ignore_errors=True)
        checkpoint.end(trajectory)
        return trajectory

    def _prepare(self, task: Task, root: Capability, checkpoint: Checkpoint, trajectory: Trajectory, ws: Path,
                 resumed: bool) -> Episode:
        tools = [t for t in self.tools_factory(ws) if t.name in task.tools]
        renderer = SegmentRenderer(self.tokenizer, tools)
        if not resumed:
            trajectory.prompt_ids = renderer.prompt_ids(task.messages)
            checkpoint.start(trajectory, str(ws))
        runtime = Runtime(tools, self.store, self._key, namespace=self.namespace, lease_s=self.config.lease_s)
        capability = self._trajectory_capability(root, task, ws)
        return Episode(self, task, trajectory, checkpoint, renderer, runtime, capability, tools)

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
