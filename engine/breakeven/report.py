"""The break-even report: a table to read, `breakeven.json` to recompute from, one figure to glance at.

The table prints each estimate with its 95% interval, the formula used and the decision (with the
calls that would decide an undecided row). The JSON holds every row's estimates and `_ci` pairs,
the raw samples and the bootstrap settings behind them, and where it ran (device, dtype, model,
batch, torch/triton versions, load average, cpu count). The figure has one panel per row on shared
axes. It measures nothing; `measurement.py` does.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import asdict

from surecall.breakeven.estimators import UNDECIDED, EstimatorConfig, RowSamples, latency_bands
from surecall.breakeven.formulas import GENERAL_FORMULA, SEED_FORMULA


def _ci(lo_hi, scale: float, fmt: str) -> str:
    return f"[{lo_hi[0] * scale:{fmt}}, {lo_hi[1] * scale:{fmt}}]"


def format_table(rows: list[dict]) -> str:
    """A fixed-width table: estimates with intervals, both p_break formulas, the one used, the decision."""
    header = (f"{'tool':<13}{'calls':>6}{'pairs':>6}{'L_gen':>7}{'t_dec ms':>9}  {'t_mask us [95% CI]':<22}"
              f"{'p_err [95% CI]':<22}{'T_rep s':>7}{'rep ok':>7}  {'p_break seed [CI]':<24}"
              f"{'p_break general [CI]':<24}{'used':<8}decision")
    lines = [header, "-" * len(header)]
    for r in rows:
        t_mask = f"{r['t_mask_s'] * 1e6:.0f} {_ci(r['t_mask_s_ci'], 1e6, '.0f')}"
        p_err = f"{r['p_err']:.1%} {_ci(r['p_err_ci'], 100, '.1f')}"
        seed = f"{r['p_break_seed']:.2%} {_ci(r['p_break_seed_ci'], 100, '.1f')}"
        general = f"{r['p_break_general']:.2%} {_ci(r['p_break_general_ci'], 100, '.1f')}"
        rep = f"{r['num_repaired']}/{r['num_repair_rounds']}"
        decision = r["decision"]
        if decision == UNDECIDED and r.get("calls_to_decide"):
            decision += f" (~{r['calls_to_decide']} calls would decide)"
        lines.append(f"{r['tool']:<13}{r['num_calls']:>6}{r['num_pairs']:>6}{r['l_gen']:>7.1f}{r['t_decode_s'] * 1e3:>9.2f}  "
                     f"{t_mask:<22}{p_err:<22}{r['t_repair_s']:>7.3f}{rep:>7}  {seed:<24}{general:<24}{r['formula']:<8}{decision}")
    lines.append("")
    lines += [f"seed formula:    {SEED_FORMULA}", f"general formula: {GENERAL_FORMULA}"]
    used = sorted({r["formula"] for r in rows})
    lines.append(f"used: {' and '.join(used)} (general wherever a measured repair round failed; R = "
                 f"{rows[0]['max_repair_rounds']} rounds)" if rows else "")
    noisy = [r["tool"] for r in rows if r["t_mask_status"] != "measured"]
    if noisy:
        lines.append(f"t_mask is noise at this precision for: {', '.join(noisy)} (interval includes or lies below 0; "
                     "not a sign that masking is free)")
    lines.append("decision: constrain/repair only when the p_err and p_break 95% intervals do not overlap")
    return "\n".join(lines)


def environment(llm, model: str, batch_size: int) -> dict:
    """Where the measurement ran, so a result can be compared with another."""
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    runner = getattr(llm, "runner", None)
    device = getattr(runner, "device", None)
    model_obj = getattr(runner, "model", None)
    dtype = next(model_obj.parameters()).dtype if model_obj is not None else None
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"device": str(device), "gpu": gpu, "dtype": str(dtype), "model": model, "batch_size": batch_size,
            "torch": torch.__version__, "triton": triton_version, "torch_threads": torch.get_num_threads(),
            "load_average": list(load) if load else None, "cpu_count": os.cpu_count(),
            "machine": platform.machine(), "python": platform.python_version(),
            "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def payload(measurement, cfg, env: dict, extra: dict | None = None) -> dict:
    """The JSON record: rows (estimates, `_ci` pairs, decision), raw samples, settings, environment."""
    est = cfg.estimator()
    return {
        **(extra or {}),
        "environment": env,
        "config": asdict(cfg),
        "estimator": asdict(est),
        "formulas": {"seed": SEED_FORMULA, "general": GENERAL_FORMULA},
        "num_rounds": measurement.num_rounds,
        "stop_reason": measurement.stop_reason,
        "rows": measurement.rows,
        "samples": [asdict(s) for s in measurement.samples],
        "passes": measurement.passes,
        "repairs": measurement.repairs,
        "clock": measurement.clock,
        "num_pairs_unequal": measurement.num_pairs_unequal,
        "timing_tokens": measurement.timing_tokens,
    }


def plot(rows: list[dict], samples: list[RowSamples], est: EstimatorConfig, path: str) -> None:
    """One PNG, a panel per row on shared axes: expected latency per call vs error rate for both
    strategies with 95% bands, the crossing p_break (with its interval), the observed p_err (with its)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    p_max = min(1.0, max(0.05, 1.15 * max(max(r["p_err_ci"][1], r["p_break_ci"][1]) for r in rows)))
    grid = np.linspace(0.0, p_max, 101)
    cols = min(3, len(rows))
    nrows = -(-len(rows) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.6 * cols, 3.4 * nrows), dpi=110, sharex=True, sharey=True, squeeze=False)
    for ax, row, s in zip(axes.flat, rows, samples, strict=False):
        _panel(ax, row, latency_bands(s, est, grid), grid)
    for ax in list(axes.flat)[len(rows):]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=7, loc="upper left")
    fig.supxlabel("malformed-or-invalid call rate p_err (%)")
    fig.supylabel("expected latency per call (ms)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _panel(ax, row: dict, bands: dict, grid) -> None:
    x = grid * 100
    r = row["max_repair_rounds"]
    free = [1e3 * (row["l_gen"] * row["t_decode_s"] + p * row["t_repair_s"] * row["repair_multiplier"]) for p in grid]
    ax.plot(x, free, color="tab:blue", label="free + repair rounds (95% band)")
    ax.fill_between(x, bands["free_lo"] * 1e3, bands["free_hi"] * 1e3, color="tab:blue", alpha=0.18)
    ax.axhline(row["constrained_s"] * 1e3, color="tab:orange", label="constrained (95% band)")
    ax.axhspan(bands["cons_lo"] * 1e3, bands["cons_hi"] * 1e3, color="tab:orange", alpha=0.18)
    lo, hi = row["p_break_ci"]
    ax.axvspan(max(lo, 0) * 100, max(hi, 0) * 100, color="grey", alpha=0.15)
    ax.axvline(max(row["p_break"], 0) * 100, color="grey", linestyle="--", label="p_break: the crossing (95% CI)")
    ax.axvspan(row["p_err_ci"][0] * 100, row["p_err_ci"][1] * 100, color="tab:red", alpha=0.12)
    ax.axvline(row["p_err"] * 100, color="tab:red", linestyle=":", label="observed p_err (95% CI)")
    ax.set_title(f"{row['tool']}: {row['decision']}\np_err {row['p_err']:.1%}, p_break {row['p_break']:.2%} "
                 f"[{lo:.2%}, {hi:.2%}]; repair s={row['repair_success']:.0%}, R={r}", fontsize=8)
    ax.grid(alpha=0.3)
