"""The break-even report without a model: the JSON recomputes, the table and figure render, and the
main job's workspace holds what the prompts name."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from surecall.breakeven import BreakevenConfig, EstimatorConfig, Prompt, RowSamples, estimate_row
from surecall.breakeven.measurement import BreakevenMeasurement, pairs_per_batch, tool_batches
from surecall.breakeven.report import format_table, payload, plot
from surecall.breakeven.workspace import grounded_tools, matches_request, seed_workspace
from surecall.tools.catalog import hardened_seed_tools as seed_tools

RECOMPUTED = ("l_gen", "t_decode_s", "t_mask_s", "t_repair_s", "p_err", "repair_success", "p_break_seed",
              "p_break_general", "p_break", "expected_free_s", "constrained_s")


def recompute_row(row: dict, sample: dict, estimator: dict) -> None:
    """Every figure of a row from the samples and settings stored beside it in breakeven.json."""
    diffs = [c - f for c, f in zip(sample["step_s_constrained"], sample["step_s_free"])]
    s, r = sum(sample["repair_ok"]) / len(sample["repair_ok"]), estimator["max_repair_rounds"]
    m = (1 - (1 - s) ** r) / s if s > 0 else r
    by_hand = {
        "l_gen": float(np.mean(sample["call_tokens"])), "t_decode_s": float(np.median(sample["step_s_free"])),
        "t_mask_s": float(np.median(diffs)), "t_repair_s": float(np.median(sample["repair_s"])),
        "p_err": sum(st != "ok" for st in sample["call_status"]) / len(sample["call_status"]), "repair_success": s,
    }
    by_hand["p_break_seed"] = by_hand["l_gen"] * by_hand["t_mask_s"] / by_hand["t_repair_s"]
    by_hand["p_break_general"] = by_hand["p_break_seed"] / m
    by_hand["p_break"] = by_hand["p_break_general" if s < 1 else "p_break_seed"]
    by_hand["expected_free_s"] = by_hand["l_gen"] * by_hand["t_decode_s"] + by_hand["p_err"] * by_hand["t_repair_s"] * m
    by_hand["constrained_s"] = by_hand["l_gen"] * (by_hand["t_decode_s"] + by_hand["t_mask_s"])
    for key in RECOMPUTED:
        assert row[key] == pytest.approx(by_hand[key], rel=1e-9, abs=1e-15), key
    # the intervals too: the same estimator on the stored samples and seed gives the same numbers
    again = estimate_row(RowSamples(**sample), EstimatorConfig(**estimator))
    for key in [k for k in row if k.endswith("_ci")]:
        assert row[key] == pytest.approx(again[key]), key
        assert row[key][0] <= row[key][1], key
    assert row["decision"] == again["decision"]


def _fake_measurement() -> tuple[BreakevenMeasurement, BreakevenConfig]:
    rng = np.random.default_rng(1)
    cfg = BreakevenConfig(num_boot=500)
    samples = []
    for name, bad, ok_rounds in (("file_edit", 9, 1), ("file_view", 2, 3)):
        free = [float(x) for x in rng.normal(12e-3, 1e-3, 8)]
        samples.append(RowSamples(name, [int(t) for t in rng.poisson(60, 30)], ["invalid"] * bad + ["ok"] * (30 - bad), free,
                                  [f + 6e-4 for f in free], [float(x) for x in rng.lognormal(-1, 0.2, 4)],
                                  [True] * ok_rounds + [False] * (4 - ok_rounds)))
    overall = RowSamples("overall")
    for s in samples:
        for key in ("call_tokens", "call_status", "step_s_free", "step_s_constrained", "repair_s", "repair_ok"):
            getattr(overall, key).extend(getattr(s, key))
    samples.append(overall)
    rows = [{**estimate_row(s, cfg.estimator()), "tool": s.tool} for s in samples]
    return BreakevenMeasurement(rows=rows, samples=samples, num_rounds=1, stop_reason="test"), cfg


def test_json_recomputes_every_figure(tmp_path):
    measurement, cfg = _fake_measurement()
    env = {"device": "cpu", "dtype": "torch.float32", "model": "m", "batch_size": 8, "torch": "x", "triton": None,
           "load_average": [1.0, 1.0, 1.0], "cpu_count": 2}
    path = tmp_path / "breakeven.json"
    path.write_text(json.dumps(payload(measurement, cfg, env)))
    record = json.loads(path.read_text())
    assert record["environment"] == env and record["config"]["seed"] == cfg.seed
    assert [r["tool"] for r in record["rows"]] == ["file_edit", "file_view", "overall"]
    for row, sample in zip(record["rows"], record["samples"], strict=True):
        assert row["tool"] == sample["tool"]
        recompute_row(row, sample, record["estimator"])
    table = format_table(record["rows"])
    assert "file_edit" in table and "general formula" in table and "used: general" in table


def test_one_figure_with_a_panel_per_row(tmp_path):
    measurement, cfg = _fake_measurement()
    out = tmp_path / "breakeven.png"
    plot(measurement.rows, measurement.samples, cfg.estimator(), str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_batches_are_tool_homogeneous_and_interleaved():
    prompts = [Prompt([{"role": "user", "content": str(i)}], tool=t) for i, t in enumerate("aabababbbc")]
    batches = tool_batches(prompts, 2)
    assert all(len({prompts[i].tool for i in b}) == 1 and t == prompts[b[0]].tool for t, b in batches)
    assert [t for t, _ in batches][:3] == ["a", "b", "c"]  # one batch per tool before any second one
    assert sorted(i for _, b in batches for i in b) == list(range(10))


@pytest.mark.parametrize("bad, match", [({"max_rounds": 1, "min_rounds": 2}, "Invalid max_rounds"),
                                        ({"precision": 0}, "Invalid precision"),
                                        ({"timing_quantile": 1.0}, "Invalid timing_quantile"),
                                        ({"time_budget_s": -1}, "Invalid time_budget_s")])
def test_config_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        BreakevenConfig(**bad)


def _prompt(tool, **arguments):
    return Prompt([{"role": "user", "content": "x"}], tool=tool, arguments=arguments)


def test_workspace_holds_what_the_prompts_name(tmp_path):
    prompts = [_prompt("file_edit", path="lib/a.py", old_str="count = 3", new_str="count = 4"),
               _prompt("file_edit", path="docs/b.md", old_str="buf", new_str="total_", allow_multiple=True),
               _prompt("file_view", path="src/c.go", offset=900, limit=50),
               _prompt("file_view", path="../escape.txt"),
               _prompt("grep_search", pattern="TODO", path="pkg")]
    ws = seed_workspace(tmp_path, prompts)
    assert (tmp_path / "lib/a.py").read_text().count("count = 3") == 1
    assert (tmp_path / "docs/b.md").read_text().count("buf") == 2  # "replace all" implies several
    assert len((tmp_path / "src/c.go").read_text().splitlines()) >= 949  # the asked window exists
    assert not (tmp_path.parent / "escape.txt").exists() and "../escape.txt" not in ws.files
    assert (tmp_path / "pkg").is_dir() and ws.dirs == ["pkg"]
    tools = {t["name"]: t["parameters"] for t in grounded_tools(seed_tools(), ws)}
    assert tools["file_view"]["properties"]["path"]["enum"] == ["docs/b.md", "lib/a.py", "src/c.go"]
    branches = {b["properties"]["path"]["const"]: b["properties"]["old_str"]["enum"] for b in tools["file_edit"]["anyOf"]}
    assert branches == {"docs/b.md": ["buf"], "lib/a.py": ["count = 3"]}
    assert "pkg" in tools["grep_search"]["properties"]["path"]["enum"]
    (tmp_path / "lib/a.py").write_text("edited")
    ws.restore()
    assert (tmp_path / "lib/a.py").read_text().count("count = 3") == 1


def test_matches_request_fills_schema_defaults():
    prompt = _prompt("file_view", path="a.py")
    call = SimpleNamespace(name="file_view", arguments={"path": "a.py", "offset": 1, "limit": 100})
    assert matches_request(call, prompt, seed_tools())
    assert not matches_request(SimpleNamespace(name="file_view", arguments={"path": "b.py"}), prompt, seed_tools())
    assert not matches_request(None, prompt, seed_tools())


def test_a_tool_with_few_batches_gets_more_pairs_each():
    prompts = [Prompt([{"role": "user", "content": str(i)}], tool=t) for i, t in enumerate("aaaaaaaab")]
    per_batch = pairs_per_batch(tool_batches(prompts, 2), BreakevenConfig(pairs_per_batch=2, min_pairs_per_tool=5))
    assert per_batch == {"a": 2, "b": 6}  # a: 4 batches x 2 >= 5; b: one batch, 5 rounded up to even
