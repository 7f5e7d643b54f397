"""`surecall rollout`: a tasks file in, trajectories.jsonl and a summary out; bad input is one line, exit 2."""

from __future__ import annotations

import json
import re

import pytest
from helpers.rollout import SCRIPT, make_seed, needs_bwrap

from surecall.cli import main


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and len(lines) == 1, err
    return lines[0]


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@needs_bwrap
def test_rollout_writes_trajectories_and_a_summary_and_a_rerun_resumes(tmp_path, capsys):
    seed = make_seed(tmp_path)
    rows = [{"id": f"cli{i}", "messages": [{"role": "user", "content": "Fix log.txt"}], "workspace": str(seed),
             "max_turns": 2, "turn_tools": SCRIPT[:2]} for i in range(2)]
    tasks, out = _write(tmp_path / "tasks.jsonl", rows), tmp_path / "out"
    assert main(["rollout", "--tasks", str(tasks), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    summary = json.loads(printed.strip().splitlines()[-1])
    assert summary["episodes"] == 2 and summary["turns"] == 4 and summary["calls"] == 4 and summary["tool_errors"] == 0
    assert "prefix-cache hit rate" in printed and "tokens/s" in printed
    records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == ["cli0", "cli1"]
    for r in records:
        assert len(r["token_ids"]) == len(r["loss_mask"]) == len(r["logprobs"]) and len(r["turns"]) == 2
        assert r["end_reason"] == "max_turns" and r["workspace"] is None
    assert main(["rollout", "--tasks", str(tasks), "--out", str(out)]) == 0  # finished: returned as they were
    again = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert [r["token_ids"] for r in again] == [r["token_ids"] for r in records] and all(r["resumed"] for r in again)


@pytest.mark.parametrize(("row", "extra", "match"), [
    ({"id": "a", "messages": [{"role": "user", "content": "x"}], "tools": ["rm_rf"]}, [], r"unknown tools \['rm_rf'\]"),
    ({"id": "a", "messages": [{"role": "user", "content": "x"}], "workspace": "/no/such/seed"}, [], "does not exist"),
    ({"id": "a", "messages": [{"role": "user", "content": "x"}]}, ["--workers", "2"], "pass --store redis://"),
    ({"id": "a", "messages": [{"role": "user", "content": "x"}], "max_tokens_per_turn": 4}, [], "below the shortest call"),
    ({"id": "a", "messages": "hi"}, [], "messages to be a non-empty list"),
])
def test_rollout_bad_input_is_one_line_and_exit_2(tmp_path, capsys, row, extra, match):
    tasks = _write(tmp_path / "tasks.jsonl", [row])
    assert main(["rollout", "--tasks", str(tasks), "--out", str(tmp_path / "out"), *extra]) == 2
    assert re.search(match, _one_error_line(capsys))




@pytest.mark.slow
def test_rollout_with_workers_runs_on_ray_with_a_shared_redis_store(tmp_path, capsys, redis_url, monkeypatch):
    ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install ray")
    monkeypatch.setenv("RAY_memory_monitor_refresh_ms", "0")  # a shared host: no kills for others' memory
    seed = make_seed(tmp_path)
    rows = [{"id": f"w{i}", "messages": [{"role": "user", "content": "Fix log.txt"}], "workspace": str(seed),
             "max_turns": 2, "turn_tools": SCRIPT[:2]} for i in range(4)]
    tasks, out = _write(tmp_path / "tasks.jsonl", rows), tmp_path / "out"
    try:
        assert main(["rollout", "--tasks", str(tasks), "--out", str(out), "--workers", "2", "--store", redis_url]) == 0
    finally:
        ray.shutdown()
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["episodes"] == 4 and summary["calls"] == 8 and summary["tool_errors"] == 0
    records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == [f"w{i}" for i in range(4)]
