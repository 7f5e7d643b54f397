"""A small end-to-end break-even run on the shipped surecall-tiny: the report is complete and consistent."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from surecall.breakeven import p_break
from surecall.cli import main
from surecall.commands.breakeven import load_prompts, measure_and_write
from surecall.errors import RequestError


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("breakeven")
    args = argparse.Namespace(
        model=None, tools="seed", prompts=None, batch=4, device="cpu", limit=4, max_tokens=160,
        temperature=1.0, repeats=2, repairs=2, seed=3, threads=1, out=str(out),
    )
    return measure_and_write(args), out


def test_every_figure_is_present_and_p_break_recomputes(report):
    result, out = report
    payload = json.loads((out / "breakeven.json").read_text())
    rows = payload["rows"]
    assert rows[-1]["tool"] == "overall"
    assert rows[-1]["num_calls"] == 4 * 2  # prompts x repeats
    assert sum(r["num_calls"] for r in rows[:-1]) == rows[-1]["num_calls"]
    for row in rows:
        for key in ("l_gen", "t_decode_s", "t_mask_s", "t_mask_spread_s", "t_repair_s", "p_err", "p_break", "decision"):
            assert row[key] is not None, key
        assert row["l_gen"] > 0 and row["t_decode_s"] > 0 and row["t_repair_s"] > 0
        assert row["p_err"] == pytest.approx((row["num_malformed"] + row["num_invalid"]) / row["num_calls"])
        assert row["p_break"] == pytest.approx(p_break(row["l_gen"], max(row["t_mask_s"], 0.0), row["t_repair_s"]))
        assert row["decision"] == ("constrain" if row["p_err"] > row["p_break"] else "repair")
    # constrained decoding always parses
    assert payload["constrained_parse_rate"] == 1.0
    assert len(payload["repairs"]) == 2 and all(r["seconds"] > 0 and r["context_tokens_added"] > 0 for r in payload["repairs"])
    assert len(payload["step_s_free"]) == len(payload["step_s_constrained"]) == 2
    assert all(math.isfinite(s) for s in payload["step_s_free"])
    assert result["plots"] and all((out / p.split("/")[-1]).read_bytes()[:4] == b"\x89PNG" for p in result["plots"])
    assert "overall" in result["table"]


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
