"""Measuring the break-even inputs on a real model: L_gen, t_decode, t_mask, p_err, T_repair.

One run, same model, same prompts: free decoding (the floor, and the malformed/invalid counts),
constrained decoding (t_mask = constrained minus free time per decode step, over several paired
repeats so its spread is known), and a real repair round for failed calls (the context plus the
bad call plus the error message re-sent, the call regenerated). The formulas and the plot are
`breakeven.py`'s; this module only measures.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field

from surecall.breakeven import ToolBreakeven

REPAIR_TEMPLATE = (
    "Your previous tool call could not be used: {error}. "
    "Reply with one corrected tool call and nothing else."
)


@dataclass
class Prompt:
    messages: list[dict]  # chat messages (the user's request)
    tool: str | None = None  # the tool the request is meant for (grouping; optional)
    arguments: dict | None = None  # the expected arguments (optional; accuracy)


@dataclass
class BreakevenConfig:
    batch_size: int = 16
    max_tokens: int = 256
    temperature: float = 1.0
    num_repeats: int = 3  # paired free/constrained timing repeats for t_mask's spread
    max_repairs: int = 16  # repair rounds actually run (each is one timed generate at batch 1)
    seed: int = 0

    def __post_init__(self):
        for name in ("batch_size", "max_tokens", "num_repeats", "max_repairs"):
            if getattr(self, name) < 1:
                raise ValueError(f"Invalid {name}: expected >= 1, got {getattr(self, name)}")
        if self.temperature < 0:
            raise ValueError(f"Invalid temperature: expected >= 0, got {self.temperature}")


@dataclass
class RowOutcome:
    tool: str
    num_tokens: int
    status: str  # "ok" | "malformed" | "invalid"
    error: str | None
    text: str
    prompt_index: int


@dataclass
class BreakevenMeasurement:
    rows: list[ToolBreakeven]  # per tool, then "overall" last
    step_s_free: list[float] = field(default_factory=list)
    step_s_constrained: list[float] = field(default_factory=list)
    repairs: list[dict] = field(default_factory=list)
    constrained_parse_rate: float = 0.0
    constrained_valid_rate: float = 0.0


def classify(result) -> tuple[str, str | None]:
    """'ok', 'malformed' (does not parse) or 'invalid' (parses, fails the schema) for one result."""
    if result.call is not None and not result.error:
        return "ok", None
    kind = getattr(result, "error_kind", None)
    if kind in ("malformed", "invalid"):
        return kind, result.error
    return ("invalid" if result.call is not None else "malformed"), result.error


def _step_time(results) -> float:
    """Seconds per decode step for one batch (every row advances one token per step)."""
    timed = [r for r in results if r.batch_timings.get("num_steps")]
    if not timed:
        return float("nan")
    return max(r.batch_timings["decode_s"] for r in timed) / max(r.batch_timings["num_steps"] for r in timed)


def measure(llm, tools: list, prompts: list[Prompt], cfg: BreakevenConfig, progress=None) -> BreakevenMeasurement:
    """Run the free, constrained and repair passes and assemble the per-tool report rows."""
    from surecall.config import SamplingParams

    batches = [list(range(i, min(i + cfg.batch_size, len(prompts)))) for i in range(0, len(prompts), cfg.batch_size)]
    total = len(batches) * cfg.num_repeats * 2 + cfg.max_repairs
    tick = progress.update if progress is not None else (lambda n=1: None)
    if progress is not None:
        progress.total = total

    # 0. warm-up: the first generate pays one-time costs (grammar compile, allocator, lazy init)
    warm = [prompts[i].messages for i in batches[0]]
    warm_sampling = [SamplingParams(temperature=cfg.temperature, max_tokens=min(cfg.max_tokens, 32), seed=cfg.seed)] * len(warm)
    llm.generate(warm, tools=tools, sampling=warm_sampling, constrained=False)
    llm.generate(warm, tools=tools, sampling=warm_sampling, constrained=True)

    # 1. free and constrained passes, paired per batch and repeat (same prompts, same seeds)
    outcomes: list[RowOutcome] = []
    free_steps, cons_steps = [], []
    cons_ok = cons_total = cons_valid = 0
    for repeat in range(cfg.num_repeats):
        for batch in batches:
            msgs = [prompts[i].messages for i in batch]
            sampling = [SamplingParams(temperature=cfg.temperature, max_tokens=cfg.max_tokens, seed=cfg.seed + i + 7919 * repeat) for i in batch]
            free = llm.generate(msgs, tools=tools, sampling=sampling, constrained=False)
            tick()
            cons = llm.generate(msgs, tools=tools, sampling=sampling, constrained=True)
            tick()
            free_steps.append(_step_time(free))
            cons_steps.append(_step_time(cons))
            for r in cons:
                cons_total += 1
                cons_ok += r.call is not None
                cons_valid += r.call is not None and not r.error
            for i, r in zip(batch, free):
                status, error = classify(r)
                tool = prompts[i].tool or (r.call.name if r.call is not None else "?")
                outcomes.append(RowOutcome(tool, r.num_tokens, status, error, r.text, i))

    # 2. repair rounds for failed free calls (or, when none failed, for a sample with a real error message)
    repairs = _repair_rounds(llm, tools, prompts, outcomes, cfg, tick)

    # 3. per-tool rows and the overall row
    diffs = [c - f for c, f in zip(cons_steps, free_steps)]
    t_decode = statistics.median(free_steps)
    t_mask = statistics.median(diffs)
    spread = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
    t_repair = statistics.median([r["seconds"] for r in repairs]) if repairs else float("nan")
    repair_tokens = statistics.mean([r["context_tokens_added"] for r in repairs]) if repairs else 0.0
    by_tool: dict[str, list[RowOutcome]] = defaultdict(list)
    for o in outcomes:
        by_tool[o.tool].append(o)
    rows = [_row(name, rows, t_decode, t_mask, spread, t_repair, repair_tokens) for name, rows in sorted(by_tool.items())]
    rows.append(_row("overall", outcomes, t_decode, t_mask, spread, t_repair, repair_tokens))
    return BreakevenMeasurement(
        rows=rows,
        step_s_free=free_steps,
        step_s_constrained=cons_steps,
        repairs=repairs,
        constrained_parse_rate=cons_ok / cons_total if cons_total else 0.0,
        constrained_valid_rate=cons_valid / cons_total if cons_total else 0.0,
    )


def _row(name, outcomes, t_decode, t_mask, spread, t_repair, repair_tokens) -> ToolBreakeven:
    bad = [o for o in outcomes if o.status != "ok"]
    return ToolBreakeven(
        tool=name,
        num_calls=len(outcomes),
        l_gen=statistics.mean(o.num_tokens for o in outcomes) if outcomes else 0.0,
        t_decode_s=t_decode,
        t_mask_s=t_mask,
        t_mask_spread_s=spread,
        num_malformed=sum(o.status == "malformed" for o in outcomes),
        num_invalid=sum(o.status == "invalid" for o in outcomes),
        t_repair_s=t_repair,
        repair_context_tokens=repair_tokens,
        examples=[{"status": o.status, "error": o.error, "text": o.text[:300]} for o in bad[:3]],
    )


def _repair_rounds(llm, tools, prompts, outcomes, cfg, tick) -> list[dict]:
    from surecall.config import SamplingParams

    failed = [o for o in outcomes if o.status != "ok"]
    synthetic = not failed
    # With no observed failure the repair round is still real: a truncated call and the parser's own message.
    pool = failed or outcomes
    repairs = []
    for k, o in enumerate(pool[: cfg.max_repairs]):
        text = o.text if not synthetic else o.text[: max(1, len(o.text) // 2)]
        error = o.error if not synthetic else "the call is truncated and does not parse as JSON"
        feedback = REPAIR_TEMPLATE.format(error=error)
        messages = prompts[o.prompt_index].messages + [
            {"role": "assistant", "content": text},
            {"role": "user", "content": feedback},
        ]
        sampling = SamplingParams(temperature=cfg.temperature, max_tokens=cfg.max_tokens, seed=cfg.seed + 104729 + k)
        start = time.perf_counter()
        result = llm.generate([messages], tools=tools, sampling=[sampling], constrained=False)[0]
        seconds = time.perf_counter() - start
        added = len(llm.count_tokens(text)) + len(llm.count_tokens(feedback)) if hasattr(llm, "count_tokens") else 0
        status, _ = classify(result)
        repairs.append(
            {"tool": o.tool, "seconds": seconds, "context_tokens_added": added, "repaired": status == "ok", "synthetic": synthetic}
        )
        tick()
    return repairs
