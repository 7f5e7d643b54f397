"""Break-even formulas: when does constraining a tool's decoding beat repairing malformed calls?

Constrained, a call costs T_c = L_gen * (t_decode + t_mask). Free, it costs L_gen * t_decode plus,
with probability p_err, repair rounds of T_repair each: a round succeeds with probability s and
another follows a failed one, up to R rounds, so the expected number of rounds after a failure is
M = sum_{k<R} (1-s)^k = (1 - (1-s)^R) / s. Constraining pays when p_err exceeds
p_break = L_gen * t_mask / (T_repair * M): the seed's L_gen * t_mask / T_repair when s = 1.
Plain arithmetic on point values; intervals are `estimators.py`'s, measuring `measurement.py`'s.
"""

from __future__ import annotations

SEED_FORMULA = "p_break = L_gen * t_mask / T_repair  (every repair round succeeds)"
GENERAL_FORMULA = (
    "p_break = L_gen * t_mask / (T_repair * M),  M = (1 - (1 - s)^R) / s  "
    "(repair success rate s, at most R rounds)"
)


def _check(l_gen: float, t_repair_s: float) -> None:
    if t_repair_s <= 0:
        raise ValueError(f"Invalid T_repair: expected > 0 seconds, got {t_repair_s}")
    if l_gen < 0:
        raise ValueError(f"Invalid L_gen: expected >= 0 tokens, got {l_gen}")


def expected_rounds(success_rate: float, max_rounds: int) -> float:
    """M: expected repair rounds after a failed call, when each succeeds with `success_rate`."""
    if not 0.0 <= success_rate <= 1.0:
        raise ValueError(f"Invalid repair success rate: expected 0 <= s <= 1, got {success_rate}")
    if max_rounds < 1:
        raise ValueError(f"Invalid max repair rounds: expected >= 1, got {max_rounds}")
    if success_rate == 0.0:
        return float(max_rounds)
    return (1.0 - (1.0 - success_rate) ** max_rounds) / success_rate


def p_break(l_gen: float, t_mask_s: float, t_repair_s: float) -> float:
    """The seed's break-even malformed-call rate: L_gen * t_mask / T_repair (may exceed 1: never pays;
    negative when the measured t_mask is: noise, never a reason to call masking free)."""
    _check(l_gen, t_repair_s)
    return l_gen * t_mask_s / t_repair_s


def p_break_general(l_gen: float, t_mask_s: float, t_repair_s: float, success_rate: float, max_rounds: int) -> float:
    """Break-even rate when a repair round succeeds with `success_rate`, up to `max_rounds` rounds."""
    _check(l_gen, t_repair_s)
    return l_gen * t_mask_s / (t_repair_s * expected_rounds(success_rate, max_rounds))


def expected_free_s(
    l_gen: float, t_decode_s: float, p_err: float, t_repair_s: float, success_rate: float = 1.0, max_rounds: int = 1
) -> float:
    """E[T_free] = L_gen * t_decode + p_err * T_repair * M (the seed's one round when s = 1)."""
    return l_gen * t_decode_s + p_err * t_repair_s * expected_rounds(success_rate, max_rounds)


def unresolved_rate(p_err: float, success_rate: float, max_rounds: int) -> float:
    """Calls still unusable after every allowed repair round: p_err * (1 - s)^R."""
    return p_err * (1.0 - success_rate) ** max_rounds


def constrained_s(l_gen: float, t_decode_s: float, t_mask_s: float) -> float:
    """T_c = L_gen * (t_decode + t_mask)."""
    return l_gen * (t_decode_s + t_mask_s)


def decide(p_err: float, p_break_value: float) -> str:
    """Point decision: 'constrain' when the observed error rate exceeds the break-even rate, else
    'repair'. `estimators.decide_with_intervals` is the one reports use."""
    return "constrain" if p_err > p_break_value else "repair"


def catalog_tokens(num_turns: int, tool_tokens: list[int]) -> int:
    """T_catalog = N * sum_k S_k (= N * K * S when every tool costs S tokens)."""
    if num_turns < 0:
        raise ValueError(f"Invalid turns: expected >= 0, got {num_turns}")
    return num_turns * int(sum(tool_tokens))
