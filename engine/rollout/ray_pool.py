"""`RayRollout`: N engine actors on a (local by default) Ray cluster, one shared Redis store.

Each actor holds an `AsyncLLM` and a `RolloutRunner` over a `RedisStore` at `store_url`; tasks
are spread by trajectory id (a stable hash), each actor runs its share concurrently, and the
trajectories come back in the tasks' order. Checkpoints live in the shared output folder and
the idempotency records in Redis, so when an actor dies mid-run its tasks are resubmitted to a
live actor, which resumes them: completed calls replay, in-doubt ones are settled by probe.
Ray is optional (`pip install ray`); importing this module without it is fine, using it raises.
It does not start Redis, and it never falls back to a local store.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict

from surecall.errors import StoreUnavailable, SurecallError
from surecall.rollout.runner import Reward, RolloutConfig, RolloutResult, summarize
from surecall.rollout.task import Task, check_unique
from surecall.rollout.trajectory import Trajectory, trajectory_from_dict


class RayUnavailable(SurecallError):
    """Ray is not installed or the cluster cannot be reached."""


def _ray():
    try:
        import ray
    except ImportError as exc:
        raise RayUnavailable("surecall rollout --workers needs Ray: pip install 'surecall[ray]' (or pip install ray)") from exc
    return ray


class _Worker:
    """One engine actor: an AsyncLLM, a Redis store, a RolloutRunner."""

    def __init__(self, model, store_url: str, signing_key: bytes, config: dict, store_options: dict,
                 engine_options: dict, reward: Reward | None):
        import torch

        from surecall import AsyncLLM
        from surecall.dispatch.stores import open_store
        from surecall.rollout.runner import RolloutRunner

        torch.set_num_threads(1)  # actors share the host's cores
        self.engine = AsyncLLM(model, **engine_options)
        store = open_store(store_url, **store_options)
        self.runner = RolloutRunner(self.engine, store, signing_key, RolloutConfig(**config), reward=reward)

    def ready(self) -> bool:
        return True

    def run(self, rows: list[dict]) -> list[dict]:
        result = self.runner.run([Task.from_dict(r) for r in rows])
        return [t.to_dict() for t in result.trajectories]


class RayRollout:
    """N engine actors; `run(tasks)` spreads them by trajectory and resumes a dead actor's share."""

    def __init__(self, workers: int, *, model=None, store_url: str, config: RolloutConfig,
                 signing_key: bytes | None = None, store_options: dict | None = None,
                 engine_options: dict | None = None, reward: Reward | None = None, ray_address: str | None = None,
                 cpus_per_actor: float = 1.0, start_timeout_s: float = 300.0):
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"Invalid workers: expected an integer >= 1, got {workers!r}")
        if not store_url.startswith(("redis://", "rediss://", "unix://")):
            raise StoreUnavailable(f"RayRollout needs a shared Redis store (redis://...), got {store_url!r}; "
                                   "a per-actor local store could run a call twice")
        self.ray = _ray()
        self.store_url, self.store_options, self.config = store_url, dict(store_options or {}), config
        self._check_store()  # before any actor starts
        if not self.ray.is_initialized():
            self.ray.init(address=ray_address, num_cpus=None if ray_address else max(2, int(workers * cpus_per_actor)),
                          include_dashboard=False, log_to_driver=False, configure_logging=False)
        key = signing_key or secrets.token_bytes(32)
        actor = self.ray.remote(num_cpus=cpus_per_actor, max_restarts=0)(_Worker)
        self.actors = [actor.remote(model, store_url, key, asdict(config), self.store_options,
                                    dict(engine_options or {}), reward) for _ in range(workers)]
        try:
            self.ray.get([a.ready.remote() for a in self.actors], timeout=start_timeout_s)
        except self.ray.exceptions.GetTimeoutError:
            self.shutdown()
            raise RayUnavailable(f"{workers} rollout actor(s) did not start within {start_timeout_s:g} s "
                                 "(see the Ray logs under /tmp/ray/session_latest/logs)") from None

    def _check_store(self) -> None:
        from surecall.dispatch.idempotency import derive_key
        from surecall.dispatch.stores import open_store

        store = open_store(self.store_url, **self.store_options)
        try:
            store.get(derive_key("surecall-rollout-probe", 0, "probe", "probe", {}, namespace="probe"))
        except Exception as exc:
            raise StoreUnavailable(f"the idempotency store {self.store_url} does not answer ({type(exc).__name__}: "
                                   f"{exc}); no actor or episode was started") from exc
        finally:
            store.close()

    @staticmethod
    def owner(task_id: str, workers: int) -> int:
        """Which actor runs a trajectory (stable across runs, so a rerun lands where it was)."""
        return int.from_bytes(hashlib.sha256(task_id.encode()).digest()[:8], "big") % workers

    def run(self, tasks: list[Task], progress: Callable[[Trajectory], None] | None = None) -> RolloutResult:
        check_unique(tasks)
        started = time.perf_counter()
        shares: dict[int, list[Task]] = {}
        for task in tasks:
            shares.setdefault(self.owner(task.id, len(self.actors)), []).append(task)
        live = set(range(len(self.actors)))
        pending = {self.actors[i].run.remote([t.to_dict() for t in share]): (i, share) for i, share in shares.items()}
        done: dict[str, Trajectory] = {}
        while pending:
            [ref], _ = self.ray.wait(list(pending), num_returns=1)
            index, share = pending.pop(ref)
            try:
                rows = self.ray.get(ref)
            except self.ray.exceptions.RayActorError:  # the actor died: resume its share elsewhere
                live.discard(index)
                if not live:
                    raise RayUnavailable("every rollout actor died; rerun to resume from the checkpoints") from None
                heir = min(live, key=lambda i: sum(1 for j, _ in pending.values() if j == i))
                pending[self.actors[heir].run.remote([t.to_dict() for t in share])] = (heir, share)
                continue
            for row in rows:
                done[row["id"]] = trajectory_from_dict(row)
                if progress is not None:
                    progress(done[row["id"]])
        trajectories = [done[t.id] for t in tasks]
        return RolloutResult(trajectories, summarize(trajectories, time.perf_counter() - started, {}, {}))

    def shutdown(self) -> None:
        for actor in self.actors:
            try:
                self.ray.kill(actor)
            except Exception:  # noqa: BLE001 - already dead
                pass
        self.actors = []
