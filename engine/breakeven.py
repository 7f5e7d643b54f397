"""Break-even analysis: when does constraining a tool's decoding beat repairing malformed calls?

With free decoding and one repair round, E[T_free] = L_gen * t_decode + p_err * T_repair;
constrained, T_c = L_gen * (t_decode + t_mask). Constraining pays when the observed malformed
rate p_err exceeds p_break = L_gen * t_mask / T_repair. This module holds the formulas, the
report record and the plot; measuring the inputs on a model is `breakeven_run.py`'s job.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field


def p_break(l_gen: float, t_mask_s: float, t_repair_s: float) -> float:
    """Break-even malformed-call rate: L_gen * t_mask / T_repair (may exceed 1: never pays)."""
    if t_repair_s <= 0:
        raise ValueError(f"Invalid T_repair: expected > 0 seconds, got {t_repair_s}")
    if l_gen < 0:
        raise ValueError(f"Invalid L_gen: expected >= 0 tokens, got {l_gen}")
    return l_gen * t_mask_s / t_repair_s


def expected_free_s(l_gen: float, t_decode_s: float, p_err: float, t_repair_s: float) -> float:
    """E[T_free] = L_gen * t_decode + p_err * T_repair (one repair round)."""
    return l_gen * t_decode_s + p_err * t_repair_s


def constrained_s(l_gen: float, t_decode_s: float, t_mask_s: float) -> float:
    """T_c = L_gen * (t_decode + t_mask)."""
    return l_gen * (t_decode_s + t_mask_s)


def decide(p_err: float, p_break_value: float) -> str:
    """'constrain' when the observed error rate exceeds the break-even rate, else 'repair'."""
    return "constrain" if p_err > p_break_value else "repair"


def catalog_tokens(num_turns: int, tool_tokens: list[int]) -> int:
    """T_catalog = N * sum_k S_k (= N * K * S when every tool costs S tokens)."""
    if num_turns < 0:
        raise ValueError(f"Invalid turns: expected >= 0, got {num_turns}")
    return num_turns * int(sum(tool_tokens))


@dataclass
class ToolBreakeven:
    """One row of the report: a tool (or 'overall') with its measured inputs and the verdict."""

    tool: str
    num_calls: int
    l_gen: float  # mean generated tokens per call (free decoding)
    t_decode_s: float  # free decoding time per token
    t_mask_s: float  # constrained minus free time per token (may be negative: noise)
    t_mask_spread_s: float  # spread (stdev across repeats) of t_mask
    num_malformed: int  # free calls that did not parse
    num_invalid: int  # free calls that parsed but failed the schema
    t_repair_s: float  # measured time of one repair round
    repair_context_tokens: float  # tokens the repair round adds to the context (error text + bad call)
    examples: list[dict] = field(default_factory=list)

    @property
    def p_err(self) -> float:
        return (self.num_malformed + self.num_invalid) / self.num_calls if self.num_calls else 0.0

    @property
    def p_break(self) -> float:
        return p_break(self.l_gen, max(self.t_mask_s, 0.0), self.t_repair_s)

    @property
    def decision(self) -> str:
        return decide(self.p_err, self.p_break)

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(p_err=self.p_err, p_break=self.p_break, decision=self.decision)
        out["expected_free_s"] = expected_free_s(self.l_gen, self.t_decode_s, self.p_err, self.t_repair_s)
        out["constrained_s"] = constrained_s(self.l_gen, self.t_decode_s, max(self.t_mask_s, 0.0))
        return out


def format_table(rows: list[ToolBreakeven]) -> str:
    """A readable fixed-width table of the report rows."""
    header = (
        f"{'tool':<16}{'calls':>6}{'L_gen':>8}{'t_dec ms':>10}{'t_mask us':>11}{'+-us':>8}"
        f"{'malf':>6}{'inval':>6}{'p_err':>8}{'T_rep s':>9}{'rep tok':>8}{'p_break':>10}  decision"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r.tool:<16}{r.num_calls:>6}{r.l_gen:>8.1f}{r.t_decode_s * 1e3:>10.3f}{r.t_mask_s * 1e6:>11.1f}"
            f"{r.t_mask_spread_s * 1e6:>8.1f}{r.num_malformed:>6}{r.num_invalid:>6}{r.p_err:>8.2%}"
            f"{r.t_repair_s:>9.3f}{r.repair_context_tokens:>8.0f}{r.p_break:>10.3%}  {r.decision}"
        )
    return "\n".join(lines)


def plot(row: ToolBreakeven, path: str) -> None:
    """PNG of expected latency against error rate for both strategies, crossing marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    crossing = row.p_break
    p_max = max(0.05, 2.5 * max(crossing, row.p_err)) if math.isfinite(crossing) else 0.05
    p_max = min(p_max, 1.0)
    ps = [p_max * i / 200 for i in range(201)]
    t_mask = max(row.t_mask_s, 0.0)
    free = [expected_free_s(row.l_gen, row.t_decode_s, p, row.t_repair_s) * 1e3 for p in ps]
    cons = constrained_s(row.l_gen, row.t_decode_s, t_mask) * 1e3
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    ax.plot([p * 100 for p in ps], free, label="free + one repair round: L·t_dec + p·T_repair")
    ax.axhline(cons, color="tab:orange", label="constrained: L·(t_dec + t_mask)")
    if crossing <= p_max:
        ax.axvline(crossing * 100, color="grey", linestyle="--")
        ax.annotate(f"p_break = {crossing:.3%}", (crossing * 100, cons), textcoords="offset points", xytext=(6, 8))
    ax.axvline(row.p_err * 100, color="tab:red", linestyle=":", label=f"observed p_err = {row.p_err:.2%}")
    ax.set_xlabel("malformed-or-invalid call rate p_err (%)")
    ax.set_ylabel("expected latency per call (ms)")
    ax.set_title(f"Break-even for {row.tool}: decision = {row.decision}")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
