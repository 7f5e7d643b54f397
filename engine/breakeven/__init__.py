"""Break-even analysis in one room: should a tool's decoding be constrained, or its errors repaired?

`formulas` (p_break, seed and general; expected latencies), `estimators` (bootstrap and binomial
intervals, the decision), `measurement` (paired free/constrained passes per tool, real repair
rounds), `report` (table, JSON, one figure), `catalog_cost` (what a catalog costs in context),
`workspace` and `main_job` (`run_breakeven`, `run_main_job`: what `surecall run` does).
"""

from surecall.breakeven.estimators import (
    UNDECIDED,
    EstimatorConfig,
    RowSamples,
    bootstrap_ci,
    clopper_pearson_ci,
    decide_with_intervals,
    estimate_row,
    wilson_ci,
)
from surecall.breakeven.formulas import (
    catalog_tokens,
    constrained_s,
    decide,
    expected_free_s,
    expected_rounds,
    p_break,
    p_break_general,
    unresolved_rate,
)
from surecall.breakeven.measurement import BreakevenConfig, Prompt, measure
from surecall.breakeven.report import format_table, plot

__all__ = [
    "UNDECIDED", "BreakevenConfig", "EstimatorConfig", "Prompt", "RowSamples", "bootstrap_ci", "catalog_tokens",
    "clopper_pearson_ci", "constrained_s", "decide", "decide_with_intervals", "estimate_row", "expected_free_s",
    "expected_rounds", "format_table", "measure", "p_break", "p_break_general", "plot", "unresolved_rate", "wilson_ci",
]
