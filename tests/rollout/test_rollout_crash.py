"""Crash and replay: SIGKILL the rollout process mid-episode, rerun, count every effect once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.rollout import SCRIPT, make_seed, needs_bwrap

from surecall import AsyncLLM
from surecall.dispatch.stores import SQLiteStore
from surecall.rollout import RolloutConfig, RolloutRunner, load_tasks

KEY = b"rollout-test-key-0123456789abcdef"
ROOT = Path(__file__).resolve().parents[2]

# The child runs the same rollout; its store SIGKILLs the process at one chosen moment of one call.
CHILD = textwrap.dedent('''
    import os, signal, sys
    import torch
    torch.set_num_threads(1)
    from surecall import AsyncLLM
    from surecall.dispatch.stores import SQLiteStore
    from surecall.rollout import RolloutConfig, RolloutRunner, load_tasks

    tasks_path, out_dir, db, mode = sys.argv[1:5]

    class KillingStore(SQLiteStore):
        def complete(self, key, owner, result, **kw):
            output = result.get("output", "") if isinstance(result, dict) else ""
            if mode == "before_record" and output.startswith("Edited log.txt"):
                os.kill(os.getpid(), signal.SIGKILL)  # file_edit ran; its record stays IN_FLIGHT
            record = super().complete(key, owner, result, **kw)
            if mode == "after_record" and result.get("exit_status") == 0 and "effects.log" not in output:
                os.kill(os.getpid(), signal.SIGKILL)  # bash ran and was recorded; the checkpoint lacks it
            return record

    engine = AsyncLLM(num_blocks=1024)
    config = RolloutConfig(out_dir=out_dir, keep_workspaces=True, lease_s=1.0)
    RolloutRunner(engine, KillingStore(db, takeover_margin_s=0.2), KEY, config).run(load_tasks(tasks_path))
    print("finished without being killed")
''').replace("KEY", repr(KEY))


@pytest.fixture(scope="module")
def engine():
    eng = AsyncLLM(num_blocks=1024)
    yield eng
    eng.shutdown()


def _tasks_file(tmp_path: Path) -> Path:
    seed = make_seed(tmp_path)
    path = tmp_path / "tasks.jsonl"
    rows = [{"id": f"ep{i}", "messages": [{"role": "user", "content": "Fix log.txt"}], "workspace": str(seed),
             "max_turns": len(SCRIPT), "turn_tools": SCRIPT} for i in range(2)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@needs_bwrap
@pytest.mark.parametrize("mode", ["before_record", "after_record"])
def test_sigkill_mid_episode_then_rerun_runs_every_effect_exactly_once(engine, tmp_path, mode):
    tasks_path, out, db = _tasks_file(tmp_path), tmp_path / "out", tmp_path / "idem.db"
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(child), str(tasks_path), str(out), str(db), mode], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr[-2000:]
    # 1. the kill left both trajectories unfinished on disk
    checkpoints = sorted((out / "checkpoints").glob("*.jsonl"))
    assert len(checkpoints) == 2 and not any('"kind": "end"' in p.read_text() for p in checkpoints)
    # 2. rerun the same tasks with the same ids and store
    store = SQLiteStore(db, takeover_margin_s=0.2)
    config = RolloutConfig(out_dir=str(out), keep_workspaces=True, lease_s=1.0, in_flight_wait_s=30)
    result = RolloutRunner(engine, store, KEY, config).run(load_tasks(tasks_path))
    # 3. every trajectory completed; no effect ran twice, and each ran once unless it was left in doubt
    for traj in result.trajectories:
        assert traj.resumed and traj.end_reason == "max_turns" and traj.error is None and len(traj.turns) == 5
        effects = (Path(traj.workspace) / "effects.log").read_text().splitlines()
        for index, line in ((0, "t0"), (4, "t4")):
            obs = traj.turns[index].observations[0]
            in_doubt = obs["idempotency_state"] == "IN_DOUBT"  # a concurrent bash call the kill cut: never re-run
            assert effects.count(line) == (0 if in_doubt and line not in effects else 1), (line, effects, obs)
            assert in_doubt or obs["error"] is None, obs
        assert (Path(traj.workspace) / "log.txt").read_text() == "done1\nslot2\n"
    observations = [t.observations[0] for traj in result.trajectories for t in traj.turns]
    if mode == "before_record":  # the in-doubt edits were settled by their probes, never re-run
        settled = [o for o in observations if o["data"].get("settled_by_probe")]
        # the kill cuts the first edit that completes; the other episode's edit may have run by then too
        assert 1 <= len(settled) <= len(result.trajectories), settled
        assert all(o["tool"] == "file_edit" and o["replayed"] for o in settled), settled
    else:  # the recorded bash call was replayed from the store, not run again
        replayed = [o for o in observations if o["replayed"]]
        assert len(replayed) >= 1 and {o["tool"] for o in replayed} == {"bash_execute"}
