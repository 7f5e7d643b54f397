"""Small break-even and main-job runs on the shipped surecall-tiny: the reports are complete, every
figure recomputes from breakeven.json, and the main job's file calls do real work."""

from __future__ import annotations

import json

import pytest
from test_breakeven_report import recompute_row

from surecall.breakeven import BreakevenConfig
from surecall.breakeven.main_job import (
    MainJobConfig,
    load_llm,
    load_prompts,
    run_breakeven,
    run_main_job,
)
from surecall.cli import main
from surecall.errors import RequestError
from surecall.models import default_heldout_path, default_model_dir
from surecall.tools.catalog import hardened_seed_tools as seed_tools

ENV_KEYS = ("device", "dtype", "model", "batch_size", "torch", "triton", "load_average", "cpu_count")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("breakeven")
    cfg = BreakevenConfig(batch_size=4, max_tokens=160, min_rounds=1, max_rounds=1, repairs_per_tool=1,
                          max_repair_rounds=2, num_boot=300, seed=3)
    prompts = load_prompts(default_heldout_path(), 8)
    llm = load_llm(default_model_dir(), "cpu")
    return run_breakeven(llm, seed_tools(), prompts, cfg, out, "surecall_tiny"), out, prompts


def test_every_figure_recomputes_from_the_json(report):
    result, out, prompts = report
    record = json.loads((out / "breakeven.json").read_text())
    rows = record["rows"]
    assert rows[-1]["tool"] == "overall" and rows[-1]["num_calls"] == len(prompts)
    assert sum(r["num_calls"] for r in rows[:-1]) == rows[-1]["num_calls"]
    assert {r["tool"] for r in rows[:-1]} == {p.tool for p in prompts}
    for row, sample in zip(rows, record["samples"], strict=True):
        recompute_row(row, sample, record["estimator"])
        assert row["decision"] in ("constrain", "repair", "undecided at this precision")
        assert row["t_decode_s"] > 0 and row["t_repair_s"] > 0 and row["l_gen"] > 0
    assert all(record["environment"].get(k) is not None for k in ENV_KEYS if k != "triton")
    assert record["config"]["seed"] == 3 and record["stop_reason"]
    assert (out / "breakeven.png").read_bytes()[:4] == b"\x89PNG"
    assert "overall" in result["table"] and "used:" in result["table"]


def test_pairs_are_tool_homogeneous_alternated_and_equal_length(report):
    _, out, prompts = report
    record = json.loads((out / "breakeven.json").read_text())
    passes = record["passes"]
    assert all({prompts[i].tool for i in p["prompts"]} == {p["tool"]} for p in passes)
    assert [p["order"] for p in passes[:2]] == ["free-first", "constrained-first"]
    assert all(p["num_steps_free"] == record["timing_tokens"][p["tool"]] for p in passes if p["equal_steps"])
    # repair rounds are measured, each round's outcome recorded, rounds chained up to the limit
    reps = record["repairs"]
    assert reps and all(r["seconds"] > 0 and isinstance(r["ok"], bool) and 1 <= r["round"] <= 2 for r in reps)
    assert all(r["round"] == 2 for i, r in enumerate(reps) if i and reps[i - 1]["chain"] == r["chain"]
               and reps[i - 1]["tool"] == r["tool"])


def test_main_job_file_calls_do_real_work(tmp_path):
    cfg = MainJobConfig(limit=12, device="cpu", out=str(tmp_path),
                        breakeven=BreakevenConfig(batch_size=6, max_tokens=160, min_rounds=1, max_rounds=1,
                                                  pairs_per_batch=2, repairs_per_tool=1, max_repair_rounds=1,
                                                  num_boot=200, seed=1))
    lines = []
    report = run_main_job(cfg, echo=lines.append)
    rows = report["dispatch"]["rows"]
    files = [r for r in rows if r["tool"] in ("file_view", "file_edit")]
    assert files and sum(bool(r.get("ok")) for r in files) >= len(files) / 2
    assert not any("does not exist" in (r.get("tool_error") or "") for r in files)
    assert all(r["did_what_was_asked"] == bool(r["matches_request"] and r.get("ok")) for r in rows)
    assert {"report.json", "report.md", "breakeven.json", "breakeven.png"} <= {p.name for p in tmp_path.iterdir()}
    assert report["breakeven"]["rows"][-1]["num_calls"] == 12
    assert any("did what was asked" in line for line in lines)


def test_prompt_file_errors(tmp_path, capsys):
    bad = tmp_path / "prompts.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}]}\nnot json\n')
    with pytest.raises(RequestError, match=r"prompts.jsonl:2: not JSON"):
        load_prompts(bad)
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"tool": "file_view"}\n')
    with pytest.raises(RequestError, match="expected 'messages' or 'prompt'"):
        load_prompts(empty)
    assert main(["breakeven", "--prompts", str(bad), "--out", str(tmp_path / "out")]) == 2
    assert "not JSON" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["run", "breakeven"])
def test_cli_takes_seed_and_refuses_bad_settings(command, tmp_path, capsys):
    assert main([command, "--seed", "5", "--precision", "2", "--out", str(tmp_path)]) == 2
    assert f"surecall {command}: error: Invalid precision" in capsys.readouterr().err


def test_run_refuses_a_bad_limit(capsys):
    assert main(["run", "--limit", "0"]) == 2
    assert "surecall run: error: argument --limit: expected an integer >= 1, got 0" in capsys.readouterr().err
