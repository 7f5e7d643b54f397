"""Break-even formulas against hand-computed values, and the report record's consistency."""

from __future__ import annotations

import math

import pytest

from surecall.breakeven import (
    ToolBreakeven,
    catalog_tokens,
    constrained_s,
    decide,
    expected_free_s,
    format_table,
    p_break,
    plot,
)


def test_seed_worked_example():
    # 80 tokens, 0.5 ms of masking per token, a 1.8 s repair round -> 80 * 0.0005 / 1.8 = 2.22%
    assert p_break(80, 0.5e-3, 1.8) == pytest.approx(0.0222, abs=5e-5)
    assert f"{p_break(80, 0.5e-3, 1.8):.1%}" == "2.2%"


def test_latency_formulas_cross_at_p_break():
    l_gen, t_dec, t_mask, t_rep = 120, 4e-3, 30e-6, 0.9
    crossing = p_break(l_gen, t_mask, t_rep)
    # at the crossing both strategies cost the same
    assert expected_free_s(l_gen, t_dec, crossing, t_rep) == pytest.approx(constrained_s(l_gen, t_dec, t_mask))
    assert expected_free_s(l_gen, t_dec, 0.0, t_rep) == pytest.approx(l_gen * t_dec)
    assert constrained_s(l_gen, t_dec, t_mask) == pytest.approx(120 * (4e-3 + 30e-6))
    assert decide(crossing * 1.01, crossing) == "constrain"
    assert decide(crossing * 0.99, crossing) == "repair"


def test_catalog_tokens():
    # N * K * S: 10 turns, 4 tools of 150 tokens
    assert catalog_tokens(10, [150] * 4) == 6000
    assert catalog_tokens(3, [100, 200]) == 900


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: p_break(80, 1e-3, 0.0), "Invalid T_repair"),
        (lambda: p_break(-1, 1e-3, 1.0), "Invalid L_gen"),
        (lambda: catalog_tokens(-2, [1]), "Invalid turns"),
    ],
)
def test_bad_inputs(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_report_row_is_recomputable(tmp_path):
    row = ToolBreakeven(
        tool="file_edit", num_calls=50, l_gen=90.0, t_decode_s=2e-3, t_mask_s=40e-6, t_mask_spread_s=5e-6,
        num_malformed=2, num_invalid=1, t_repair_s=0.6, repair_context_tokens=140.0,
    )
    d = row.to_dict()
    assert d["p_err"] == pytest.approx(3 / 50)
    assert d["p_break"] == pytest.approx(90 * 40e-6 / 0.6)
    assert d["decision"] == ("constrain" if 3 / 50 > 90 * 40e-6 / 0.6 else "repair")
    assert "file_edit" in format_table([row])
    out = tmp_path / "plot.png"
    plot(row, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_negative_t_mask_counts_as_free_masking():
    row = ToolBreakeven("x", 10, 50, 1e-3, -3e-6, 4e-6, 0, 0, 1.0, 10)
    assert row.p_break == 0.0 and not math.isnan(row.p_break)
