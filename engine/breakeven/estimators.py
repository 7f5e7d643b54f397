"""Estimates with 95% intervals for the break-even inputs, and the decision they support.

Medians (t_decode, t_mask, T_repair) and the mean L_gen get a percentile bootstrap interval;
rates (p_err, the repair success rate) a Wilson interval (Clopper-Pearson beside it, exact and
conservative). p_break's interval is propagated by resampling every input jointly in each bootstrap
replicate. The decision is "constrain" or "repair" only when the p_err and p_break intervals are
apart (p_break's cut at 0: a negative t_mask is noise), else "undecided at this precision" with the
calls that would separate them. Every interval
is a pure function of the samples and the seed, so a report can be recomputed. No measuring here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from surecall.breakeven.formulas import (
    GENERAL_FORMULA,
    SEED_FORMULA,
    constrained_s,
    expected_free_s,
    expected_rounds,
    unresolved_rate,
)

LEVEL = 0.95
UNDECIDED = "undecided at this precision"
_Z = 1.959963984540054  # two-sided 95% normal quantile


def _alpha(level: float) -> float:
    if not 0.0 < level < 1.0:
        raise ValueError(f"Invalid level: expected 0 < level < 1, got {level}")
    return 1.0 - level


def bootstrap_ci(samples, stat=np.median, num_boot: int = 2000, level: float = LEVEL, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of `stat` (median by default) over resampled `samples`."""
    x = np.asarray(samples, dtype=float)
    if x.size == 0:
        raise ValueError("Invalid samples: expected at least one value, got none")
    alpha = _alpha(level)
    idx = np.random.default_rng(seed).integers(0, x.size, size=(num_boot, x.size))
    reps = stat(x[idx], axis=1)
    return float(np.quantile(reps, alpha / 2)), float(np.quantile(reps, 1 - alpha / 2))


def wilson_ci(successes: int, trials: int, level: float = LEVEL) -> tuple[float, float]:
    """Wilson score interval of a binomial rate (95% unless told)."""
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(f"Invalid binomial counts: expected 0 <= successes <= trials >= 1, got {successes}/{trials}")
    z = _Z if level == LEVEL else _normal_quantile(1 - _alpha(level) / 2)
    p = successes / trials
    denom = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def clopper_pearson_ci(successes: int, trials: int, level: float = LEVEL) -> tuple[float, float]:
    """Exact (conservative) binomial interval, by bisection on the binomial tail probabilities."""
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(f"Invalid binomial counts: expected 0 <= successes <= trials >= 1, got {successes}/{trials}")
    alpha = _alpha(level)
    lo = 0.0 if successes == 0 else _bisect(lambda p: _upper_tail(successes, trials, p) - alpha / 2)
    hi = 1.0 if successes == trials else _bisect(lambda p: alpha / 2 - _lower_tail(successes, trials, p))
    return lo, hi


def _log_pmf(k: int, n: int, p: float) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * math.log(p) + (n - k) * math.log1p(-p)


def _lower_tail(k: int, n: int, p: float) -> float:  # P(X <= k)
    return min(1.0, sum(math.exp(_log_pmf(i, n, p)) for i in range(k + 1)))


def _upper_tail(k: int, n: int, p: float) -> float:  # P(X >= k)
    return min(1.0, sum(math.exp(_log_pmf(i, n, p)) for i in range(k, n + 1)))


def _bisect(f, lo: float = 1e-12, hi: float = 1 - 1e-12, steps: int = 60) -> float:
    """Root of an increasing f on (0, 1)."""
    for _ in range(steps):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return (lo + hi) / 2


def _normal_quantile(q: float) -> float:
    return _bisect(lambda x: 0.5 * (1 + math.erf(x / math.sqrt(2))) - q, -10.0, 10.0)


@dataclass
class RowSamples:
    """The raw measurements of one report row: everything its estimates are computed from."""

    tool: str
    call_tokens: list[int] = field(default_factory=list)  # free calls' generated tokens (L_gen)
    call_status: list[str] = field(default_factory=list)  # "ok" | "malformed" | "invalid" per free call
    step_s_free: list[float] = field(default_factory=list)  # seconds per decode step, one per pair
    step_s_constrained: list[float] = field(default_factory=list)  # the paired constrained pass
    repair_s: list[float] = field(default_factory=list)  # seconds of each repair round
    repair_ok: list[bool] = field(default_factory=list)  # did that round's call parse and validate?

    def t_mask_samples(self) -> list[float]:
        return [c - f for c, f in zip(self.step_s_constrained, self.step_s_free, strict=True)]


@dataclass(frozen=True)
class EstimatorConfig:
    num_boot: int = 2000
    level: float = LEVEL
    seed: int = 0
    max_repair_rounds: int = 2  # R: repair rounds allowed after a failed call

    def __post_init__(self):
        if self.num_boot < 100:
            raise ValueError(f"Invalid num_boot: expected >= 100, got {self.num_boot}")
        if self.max_repair_rounds < 1:
            raise ValueError(f"Invalid max_repair_rounds: expected >= 1, got {self.max_repair_rounds}")
        _alpha(self.level)


def _replicates(s: RowSamples, cfg: EstimatorConfig) -> dict[str, np.ndarray]:
    """One joint bootstrap: calls, timing pairs and repair rounds each resampled per replicate."""
    rng = np.random.default_rng(cfg.seed)
    tokens = np.asarray(s.call_tokens, dtype=float)
    bad = np.asarray([st != "ok" for st in s.call_status], dtype=float)
    diffs = np.asarray(s.t_mask_samples(), dtype=float)
    free = np.asarray(s.step_s_free, dtype=float)
    rep_s = np.asarray(s.repair_s, dtype=float)
    rep_ok = np.asarray(s.repair_ok, dtype=float)
    b = cfg.num_boot
    calls = rng.integers(0, tokens.size, size=(b, tokens.size))
    pairs = rng.integers(0, diffs.size, size=(b, diffs.size))
    rounds = rng.integers(0, rep_s.size, size=(b, rep_s.size))
    success = rep_ok[rounds].mean(axis=1)
    r = cfg.max_repair_rounds
    multiplier = np.where(success > 0, (1 - (1 - success) ** r) / np.where(success > 0, success, 1), float(r))
    out = {
        "l_gen": tokens[calls].mean(axis=1),
        "p_err": bad[calls].mean(axis=1),
        "t_mask_s": np.median(diffs[pairs], axis=1),
        "t_decode_s": np.median(free[pairs], axis=1),
        "t_repair_s": np.median(rep_s[rounds], axis=1),
        "repair_success": success,
        "repair_multiplier": multiplier,
    }
    out["p_break_seed"] = out["l_gen"] * out["t_mask_s"] / out["t_repair_s"]
    out["p_break_general"] = out["p_break_seed"] / multiplier
    return out


def _ci(values: np.ndarray, level: float) -> list[float]:
    alpha = 1 - level
    return [float(np.quantile(values, alpha / 2)), float(np.quantile(values, 1 - alpha / 2))]


def _check_samples(s: RowSamples) -> None:
    where = f"Invalid samples for row {s.tool!r}"
    if not s.call_tokens or len(s.call_tokens) != len(s.call_status):
        raise ValueError(f"{where}: expected one status per call and at least one call, got "
                         f"{len(s.call_tokens)} lengths and {len(s.call_status)} statuses")
    if not s.step_s_free or len(s.step_s_free) != len(s.step_s_constrained):
        raise ValueError(f"{where}: expected paired timing steps, got {len(s.step_s_free)} free and "
                         f"{len(s.step_s_constrained)} constrained")
    if not s.repair_s or len(s.repair_s) != len(s.repair_ok):
        raise ValueError(f"{where}: expected at least one repair round with its outcome, got "
                         f"{len(s.repair_s)} times and {len(s.repair_ok)} outcomes")


def estimate_row(s: RowSamples, cfg: EstimatorConfig) -> dict:
    """Point estimates, `<name>_ci` intervals, both formulas, the decision and calls to decide."""
    _check_samples(s)
    reps = _replicates(s, cfg)
    n = len(s.call_status)
    num_bad = sum(st != "ok" for st in s.call_status)
    num_rounds, num_repaired = len(s.repair_ok), sum(bool(x) for x in s.repair_ok)
    est = {
        "num_calls": n,
        "num_malformed": sum(st == "malformed" for st in s.call_status),
        "num_invalid": sum(st == "invalid" for st in s.call_status),
        "num_pairs": len(s.step_s_free),
        "num_repair_rounds": num_rounds,
        "num_repaired": num_repaired,
        "l_gen": float(np.mean(s.call_tokens)),
        "t_decode_s": float(np.median(s.step_s_free)),
        "t_mask_s": float(np.median(s.t_mask_samples())),
        "t_repair_s": float(np.median(s.repair_s)),
        "p_err": num_bad / n,
        "p_err_ci": list(wilson_ci(num_bad, n, cfg.level)),
        "p_err_ci_clopper_pearson": list(clopper_pearson_ci(num_bad, n, cfg.level)),
        "repair_success": num_repaired / num_rounds,
        "repair_success_ci": list(wilson_ci(num_repaired, num_rounds, cfg.level)),
        "max_repair_rounds": cfg.max_repair_rounds,
    }
    for name in ("l_gen", "t_decode_s", "t_mask_s", "t_repair_s", "repair_multiplier", "p_break_seed", "p_break_general"):
        est[f"{name}_ci"] = _ci(reps[name], cfg.level)
    est["repair_multiplier"] = expected_rounds(est["repair_success"], cfg.max_repair_rounds)
    est["p_break_seed"] = est["l_gen"] * est["t_mask_s"] / est["t_repair_s"]
    est["p_break_general"] = est["p_break_seed"] / est["repair_multiplier"]
    _add_latencies(est, reps, cfg)
    _add_decision(est)
    return est


def _add_latencies(est: dict, reps: dict, cfg: EstimatorConfig) -> None:
    r = cfg.max_repair_rounds
    est["expected_free_s"] = expected_free_s(est["l_gen"], est["t_decode_s"], est["p_err"], est["t_repair_s"], est["repair_success"], r)
    est["constrained_s"] = constrained_s(est["l_gen"], est["t_decode_s"], est["t_mask_s"])
    free = reps["l_gen"] * reps["t_decode_s"] + reps["p_err"] * reps["t_repair_s"] * reps["repair_multiplier"]
    est["expected_free_s_ci"] = _ci(free, cfg.level)
    est["constrained_s_ci"] = _ci(reps["l_gen"] * (reps["t_decode_s"] + reps["t_mask_s"]), cfg.level)
    est["unresolved_rate"] = unresolved_rate(est["p_err"], est["repair_success"], r)


def _add_decision(est: dict) -> None:
    """The general formula unless every measured repair round succeeded (then both are the seed's)."""
    general = est["repair_success"] < 1.0
    est["formula"] = "general" if general else "seed"
    est["formula_text"] = GENERAL_FORMULA if general else SEED_FORMULA
    key = "p_break_general" if general else "p_break_seed"
    est["p_break"], est["p_break_ci"] = est[key], list(est[f"{key}_ci"])
    lo, hi = est["t_mask_s_ci"]
    est["t_mask_status"] = "measured" if lo > 0 else ("noise (interval includes 0)" if hi > 0 else "noise (negative)")
    # A mask cannot cost negative time: the decision reads p_break's interval cut at 0, so a negative
    # (noise) estimate never makes constraining look free; the report keeps the signed figures.
    cut = [max(x, 0.0) for x in est["p_break_ci"]]
    est["decision"], est["calls_to_decide"] = decide_with_intervals(
        est["num_calls"], est["p_err"], est["p_err_ci"], max(est["p_break"], 0.0), cut)


def decide_with_intervals(n: int, p_err: float, p_err_ci, p_brk: float, p_brk_ci) -> tuple[str, int | None]:
    """'constrain' when p_err's interval lies above p_break's, 'repair' when below, else undecided
    with the calls that would part them if the estimates held (half-widths shrink as 1/sqrt(n))."""
    if p_err_ci[0] > p_brk_ci[1]:
        return "constrain", None
    if p_err_ci[1] < p_brk_ci[0]:
        return "repair", None
    delta = p_err - p_brk
    if delta == 0:
        return UNDECIDED, None
    width = (p_err - p_err_ci[0]) + (p_brk_ci[1] - p_brk) if delta > 0 else (p_err_ci[1] - p_err) + (p_brk - p_brk_ci[0])
    return UNDECIDED, max(n + 1, math.ceil(n * (width / abs(delta)) ** 2))


def latency_bands(s: RowSamples, cfg: EstimatorConfig, p_grid) -> dict[str, np.ndarray]:
    """E[T_free](p) and T_c with their replicate bands over an error-rate grid (for plots)."""
    reps = _replicates(s, cfg)
    p = np.asarray(p_grid, dtype=float)[None, :]
    free = (reps["l_gen"] * reps["t_decode_s"])[:, None] + p * (reps["t_repair_s"] * reps["repair_multiplier"])[:, None]
    cons = reps["l_gen"] * (reps["t_decode_s"] + reps["t_mask_s"])
    alpha = 1 - cfg.level
    return {
        "free_lo": np.quantile(free, alpha / 2, axis=0), "free_hi": np.quantile(free, 1 - alpha / 2, axis=0),
        "cons_lo": float(np.quantile(cons, alpha / 2)), "cons_hi": float(np.quantile(cons, 1 - alpha / 2)),
    }
