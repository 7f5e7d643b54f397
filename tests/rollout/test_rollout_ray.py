"""Ray scale-out: 2 engine actors, 16 trajectories, one actor killed mid-run, no duplicate effect."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest
from helpers.rollout import SCRIPT, make_seed

from surecall.errors import StoreUnavailable
from surecall.rollout import RolloutConfig, Task

ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install ray")

from surecall.rollout.ray_pool import RayRollout  # noqa: E402

USER = [{"role": "user", "content": "Fix log.txt"}]


@pytest.fixture(autouse=True)
def _no_ray_memory_killer(monkeypatch):
    # the host is shared: Ray's monitor kills workers when *other* processes fill memory (read by raylet at init)
    monkeypatch.setenv("RAY_memory_monitor_refresh_ms", "0")
    yield
    if ray.is_initialized():
        ray.shutdown()


def _turn_lines(path: Path) -> int:
    return path.read_text().count('"kind": "turn"') if path.exists() else 0


@pytest.mark.slow
def test_two_actors_sixteen_trajectories_survive_a_killed_actor(redis_url, tmp_path):
    seed, out = make_seed(tmp_path), tmp_path / "out"
    tasks = [Task(id=f"ray{i}", messages=USER, workspace=str(seed), max_turns=len(SCRIPT), turn_tools=SCRIPT)
             for i in range(16)]
    config = RolloutConfig(out_dir=str(out), keep_workspaces=True, lease_s=1.0, in_flight_wait_s=60)
    pool = RayRollout(2, store_url=redis_url, config=config,
                      store_options={"takeover_margin_s": 0.2, "prefix": f"ray-{uuid.uuid4().hex}:"},
                      engine_options={"num_blocks": 1024})
    victims = [t.id for t in tasks if RayRollout.owner(t.id, 2) == 0]
    assert 0 < len(victims) < 16
    result, failure = {}, {}

    def drive():
        try:
            result["value"] = pool.run(tasks)
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            failure["error"] = exc

    thread = threading.Thread(target=drive)
    thread.start()
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not any(
                _turn_lines(out / "checkpoints" / f"{v}.jsonl") >= 2 for v in victims):
            time.sleep(0.1)
        ray.kill(pool.actors[0], no_restart=True)  # mid-run: its trajectories are part-way through
        thread.join(timeout=400)
    finally:
        pool.shutdown()
        ray.shutdown()
    assert not failure, failure
    trajectories = result["value"].trajectories
    assert [t.id for t in trajectories] == [t.id for t in tasks]
    assert any(t.resumed for t in trajectories if t.id in victims)
    for traj in trajectories:
        assert traj.end_reason == "max_turns" and len(traj.turns) == len(SCRIPT), (traj.id, traj.error)
        effects = (Path(traj.workspace) / "effects.log").read_text().splitlines()
        for index, line in ((0, "t0"), (4, "t4")):
            obs = traj.turns[index].observations[0]
            in_doubt = obs["idempotency_state"] == "IN_DOUBT"  # a bash call the kill cut: never re-run
            assert effects.count(line) == (0 if in_doubt and line not in effects else 1), (traj.id, effects, obs)
        assert (Path(traj.workspace) / "log.txt").read_text() == "done1\nslot2\n"


def test_a_pool_refuses_a_local_store_and_an_unreachable_redis(tmp_path):
    from conftest import free_port

    config = RolloutConfig(out_dir=str(tmp_path))
    with pytest.raises(StoreUnavailable, match="needs a shared Redis store"):
        RayRollout(2, store_url=str(tmp_path / "idem.db"), config=config)
    with pytest.raises(StoreUnavailable, match="does not answer .*no actor or episode was started"):
        RayRollout(2, store_url=f"redis://127.0.0.1:{free_port()}/0", config=config,
                   store_options={"timeout_s": 0.5})
    assert not ray.is_initialized()
