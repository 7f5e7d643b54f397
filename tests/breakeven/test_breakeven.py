"""Break-even formulas against hand-computed values; estimators' coverage in simulation; the decision."""

from __future__ import annotations

import math

import numpy as np
import pytest

from surecall.breakeven import (
    UNDECIDED,
    EstimatorConfig,
    RowSamples,
    bootstrap_ci,
    catalog_tokens,
    clopper_pearson_ci,
    constrained_s,
    decide,
    decide_with_intervals,
    estimate_row,
    expected_free_s,
    expected_rounds,
    p_break,
    p_break_general,
    unresolved_rate,
    wilson_ci,
)


def test_seed_worked_example():
    # 80 tokens, 0.5 ms of masking per token, a 1.8 s repair round -> 80 * 0.0005 / 1.8 = 2.22%
    assert p_break(80, 0.5e-3, 1.8) == pytest.approx(0.0222, abs=5e-5)
    assert f"{p_break(80, 0.5e-3, 1.8):.1%}" == "2.2%"


@pytest.mark.parametrize("max_rounds", [1, 2, 5])
def test_general_formula_reduces_to_the_seeds_when_repair_always_succeeds(max_rounds):
    assert expected_rounds(1.0, max_rounds) == 1.0
    assert p_break_general(80, 0.5e-3, 1.8, 1.0, max_rounds) == pytest.approx(p_break(80, 0.5e-3, 1.8))
    assert expected_free_s(80, 4e-3, 0.1, 1.8, 1.0, max_rounds) == pytest.approx(expected_free_s(80, 4e-3, 0.1, 1.8))


def test_general_formula_by_hand():
    # s = 0.5, R = 2: M = 1 + 0.5 = 1.5 rounds after a failure; s = 0: every allowed round runs
    assert expected_rounds(0.5, 2) == pytest.approx(1.5)
    assert expected_rounds(0.0, 3) == 3.0
    assert expected_rounds(0.25, 1) == 1.0  # one round allowed: it always runs
    assert p_break_general(80, 0.5e-3, 1.8, 0.5, 2) == pytest.approx(80 * 0.5e-3 / (1.8 * 1.5))
    assert unresolved_rate(0.2, 0.5, 2) == pytest.approx(0.2 * 0.25)


def test_latency_formulas_cross_at_p_break():
    l_gen, t_dec, t_mask, t_rep, s, r = 120, 4e-3, 30e-6, 0.9, 0.4, 3
    for crossing, free in ((p_break(l_gen, t_mask, t_rep), lambda p: expected_free_s(l_gen, t_dec, p, t_rep)),
                           (p_break_general(l_gen, t_mask, t_rep, s, r), lambda p: expected_free_s(l_gen, t_dec, p, t_rep, s, r))):
        assert free(crossing) == pytest.approx(constrained_s(l_gen, t_dec, t_mask))
    assert constrained_s(l_gen, t_dec, t_mask) == pytest.approx(120 * (4e-3 + 30e-6))
    crossing = p_break(l_gen, t_mask, t_rep)
    assert decide(crossing * 1.01, crossing) == "constrain"
    assert decide(crossing * 0.99, crossing) == "repair"


def test_catalog_tokens():
    assert catalog_tokens(10, [150] * 4) == 6000  # N * K * S
    assert catalog_tokens(3, [100, 200]) == 900


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: p_break(80, 1e-3, 0.0), "Invalid T_repair"),
        (lambda: p_break(-1, 1e-3, 1.0), "Invalid L_gen"),
        (lambda: catalog_tokens(-2, [1]), "Invalid turns"),
        (lambda: expected_rounds(1.5, 2), "Invalid repair success rate"),
        (lambda: expected_rounds(0.5, 0), "Invalid max repair rounds"),
        (lambda: wilson_ci(3, 2), "Invalid binomial counts"),
        (lambda: clopper_pearson_ci(0, 0), "Invalid binomial counts"),
        (lambda: bootstrap_ci([]), "Invalid samples"),
        (lambda: EstimatorConfig(num_boot=10), "Invalid num_boot"),
        (lambda: estimate_row(RowSamples("x", [3], ["ok", "ok"], [1.0], [1.0], [1.0], [True]), EstimatorConfig()),
         "Invalid samples for row 'x'"),
        (lambda: estimate_row(RowSamples("x", [3], ["ok"], [1.0], [1.0], [], []), EstimatorConfig()),
         "at least one repair round"),
    ],
)
def test_bad_inputs(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# --- coverage in simulation: 400 seeded draws each --------------------------------------------
def test_bootstrap_median_interval_covers_at_its_nominal_rate():
    rng = np.random.default_rng(7)
    true_median = 1.0  # lognormal(0, 0.5) has median e^0 = 1
    hits = sum(lo <= true_median <= hi for lo, hi in
               (bootstrap_ci(rng.lognormal(0.0, 0.5, 40), num_boot=1000, seed=i) for i in range(400)))
    assert 0.93 <= hits / 400 <= 0.97


def test_binomial_intervals_cover_at_their_nominal_rate():
    rng = np.random.default_rng(11)
    n, p = 128, 0.42
    draws = [int(k) for k in rng.binomial(n, p, 400)]
    wilson = sum(lo <= p <= hi for lo, hi in (wilson_ci(k, n) for k in draws)) / 400
    exact = sum(lo <= p <= hi for lo, hi in (clopper_pearson_ci(k, n) for k in draws)) / 400
    assert 0.93 <= wilson <= 0.97
    assert 0.95 <= exact <= 0.99  # Clopper-Pearson is conservative: at least nominal
    # and against the exact binomial distribution, not only the draws
    pmf = [math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)]
    assert sum(w for k, w in enumerate(pmf) if clopper_pearson_ci(k, n)[0] <= p <= clopper_pearson_ci(k, n)[1]) >= 0.95


def test_clopper_pearson_edges_by_hand():
    # 0 of n: upper bound 1 - (alpha/2)^(1/n); n of n: lower bound (alpha/2)^(1/n)
    assert clopper_pearson_ci(0, 20) == (0.0, pytest.approx(1 - 0.025 ** (1 / 20), abs=1e-9))
    assert clopper_pearson_ci(20, 20) == (pytest.approx(0.025 ** (1 / 20), abs=1e-9), 1.0)


def _samples(rng, n_calls=60, n_bad=0, n_pairs=30, t_mask=0.5e-3, n_rounds=30, success=1.0, name="x") -> RowSamples:
    free = list(rng.normal(16e-3, 1e-3, n_pairs))
    return RowSamples(
        name, call_tokens=[int(t) for t in rng.poisson(50, n_calls)],
        call_status=["malformed"] * n_bad + ["ok"] * (n_calls - n_bad),
        step_s_free=free, step_s_constrained=[f + d for f, d in zip(free, rng.normal(t_mask, 1e-3, n_pairs))],
        repair_s=list(rng.lognormal(np.log(0.4), 0.3, n_rounds)),
        repair_ok=[i < round(success * n_rounds) for i in range(n_rounds)],
    )


def test_propagated_p_break_interval_covers_the_true_value():
    rng = np.random.default_rng(3)
    true = 50 * 0.5e-3 / 0.4  # mean L_gen 50, median t_mask 0.5 ms, median T_repair 0.4 s, repair always works
    hits = 0
    for i in range(400):
        est = estimate_row(_samples(rng), EstimatorConfig(num_boot=1000, seed=i))
        hits += est["p_break_ci"][0] <= true <= est["p_break_ci"][1]
    assert 0.92 <= hits / 400 <= 0.98


# --- the decision -----------------------------------------------------------------------------
def test_decision_flips_at_p_break():
    brk = 0.05
    assert decide_with_intervals(100, 0.0501, [0.0501, 0.0501], brk, [brk, brk]) == ("constrain", None)
    assert decide_with_intervals(100, 0.0499, [0.0499, 0.0499], brk, [brk, brk]) == ("repair", None)
    decision, calls = decide_with_intervals(100, 0.08, [0.04, 0.12], brk, [0.04, 0.06])
    # the intervals overlap; half-widths 0.04 + 0.01 against a gap of 0.03 -> 100 * (0.05/0.03)^2 calls
    assert decision == UNDECIDED and calls == math.ceil(100 * (0.05 / 0.03) ** 2)


def test_estimated_decision_follows_the_error_rate():
    rng = np.random.default_rng(5)
    cfg = EstimatorConfig(num_boot=1000)
    # p_break ~ 50 * 0.5 ms / 0.4 s = 6.25%; 2000 calls pin p_err down
    low = estimate_row(_samples(rng, n_calls=2000, n_bad=20, n_pairs=200, n_rounds=200), cfg)
    high = estimate_row(_samples(rng, n_calls=2000, n_bad=400, n_pairs=200, n_rounds=200), cfg)
    near = estimate_row(_samples(rng, n_calls=40, n_bad=3, n_pairs=10, n_rounds=10), cfg)
    assert (low["decision"], high["decision"]) == ("repair", "constrain")
    assert low["p_err_ci"][1] < low["p_break_ci"][0] and high["p_err_ci"][0] > high["p_break_ci"][1]
    assert near["decision"] == UNDECIDED and near["calls_to_decide"] > 40
    assert low["formula"] == "seed" and low["p_break"] == low["p_break_seed"]


def test_failed_repairs_switch_to_the_general_formula():
    est = estimate_row(_samples(np.random.default_rng(2), success=0.5), EstimatorConfig(max_repair_rounds=2))
    assert est["formula"] == "general" and est["repair_success"] == 0.5
    assert est["repair_multiplier"] == pytest.approx(1.5)
    assert est["p_break"] == pytest.approx(est["p_break_seed"] / 1.5)
    assert est["unresolved_rate"] == pytest.approx(est["p_err"] * 0.25)


def test_negative_t_mask_is_noise_never_free():
    rng = np.random.default_rng(9)
    est = estimate_row(_samples(rng, n_bad=0, t_mask=-2e-3), EstimatorConfig())
    assert est["t_mask_s"] < 0 and est["t_mask_status"].startswith("noise")
    assert est["p_break"] < 0  # reported as measured, signed
    # no error seen and no measurable mask cost: neither strategy is shown to win
    assert est["decision"] == UNDECIDED
