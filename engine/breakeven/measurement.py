"""Measuring the break-even inputs on a model: L_gen, t_decode, t_mask, p_err, T_repair, repair success.

Prompts are grouped by tool and batched within a tool, so each tool's row has its own figures.
Each round runs, per batch, a free pass at the full token budget (the calls: L_gen, p_err, the
failures to repair) and a timing pair: a free and a constrained pass over the same batch (same
prompts, seeds, positions) for the same number of steps (the tool's first-quartile call length, so
most rows are still going), in alternating order to cancel drift; a pair whose passes ran different
step counts (or compacted the batch) is kept out of t_mask and counted. Rounds
run until every row is decided or each p_break interval is within the stated precision (between
min_rounds and max_rounds, or a time budget). Repair rounds are real: the bad call and the error
go back to the model, the reply is parsed and validated, a failed round is followed by another up
to the limit. Estimates are `estimators.py`'s, the report `report.py`'s.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

from surecall.breakeven.estimators import UNDECIDED, EstimatorConfig, RowSamples, estimate_row

REPAIR_TEMPLATE = (
    "Your previous tool call could not be used: {error}. "
    "Reply with one corrected tool call and nothing else."
)
SYNTHETIC_ERROR = "the call is truncated and does not parse as JSON"
OVERALL = "overall"


@dataclass
class Prompt:
    messages: list[dict]  # chat messages (the user's request)
    tool: str | None = None  # the tool the request is meant for (grouping; optional)
    arguments: dict | None = None  # the expected arguments (optional; accuracy)


@dataclass
class BreakevenConfig:
    batch_size: int = 8
    max_tokens: int = 256
    timing_quantile: float = 0.25  # timed passes run this quantile of the tool's call lengths (>= shortest call)
    temperature: float = 1.0
    pairs_per_batch: int = 2  # timing pairs per batch and round (even: each order as often)
    min_pairs_per_tool: int = 4  # per round: a tool with few batches gets more pairs on each
    min_rounds: int = 2  # rounds (calls + timing pairs per batch) before the stopping rule applies
    max_rounds: int = 6
    precision: float = 0.02  # stop once every p_break interval is within +- this (absolute rate)
    time_budget_s: float | None = None  # stop adding rounds after this many seconds (None: no limit)
    repairs_per_tool: int = 4  # failed calls per tool sent back for repair
    max_repair_rounds: int = 2  # R: rounds per failed call (a failed round is followed by another)
    num_boot: int = 2000
    seed: int = 0

    def __post_init__(self):
        for name in ("batch_size", "max_tokens", "pairs_per_batch", "min_pairs_per_tool", "min_rounds", "max_rounds", "repairs_per_tool", "max_repair_rounds"):
            if getattr(self, name) < 1:
                raise ValueError(f"Invalid {name}: expected >= 1, got {getattr(self, name)}")
        if self.max_rounds < self.min_rounds:
            raise ValueError(f"Invalid max_rounds: expected >= min_rounds ({self.min_rounds}), got {self.max_rounds}")
        if self.temperature < 0:
            raise ValueError(f"Invalid temperature: expected >= 0, got {self.temperature}")
        if not 0 < self.timing_quantile < 1:
            raise ValueError(f"Invalid timing_quantile: expected 0 < q < 1, got {self.timing_quantile}")
        if not 0 < self.precision < 1:
            raise ValueError(f"Invalid precision: expected 0 < precision < 1, got {self.precision}")
        if self.time_budget_s is not None and self.time_budget_s <= 0:
            raise ValueError(f"Invalid time_budget_s: expected > 0 or None, got {self.time_budget_s}")

    def estimator(self) -> EstimatorConfig:
        return EstimatorConfig(num_boot=self.num_boot, seed=self.seed, max_repair_rounds=self.max_repair_rounds)


@dataclass
class BreakevenMeasurement:
    rows: list[dict]  # estimates per tool, then "overall" last
    samples: list[RowSamples]  # the raw measurements behind each row, same order
    passes: list[dict] = field(default_factory=list)  # every timing pair (tool, round, order, steps, seconds)
    repairs: list[dict] = field(default_factory=list)  # every repair round
    num_rounds: int = 0
    clock: str = "perf_counter"  # what every figure was timed with (see pick_clock)
    num_pairs_unequal: int = 0  # pairs left out of t_mask: their passes ran different step counts
    timing_tokens: dict = field(default_factory=dict)  # steps of the timed passes, per tool
    stop_reason: str = ""


@dataclass
class _Outcome:
    tool: str
    num_tokens: int
    status: str  # "ok" | "malformed" | "invalid"
    error: str | None
    text: str
    prompt_index: int


def classify(result) -> tuple[str, str | None]:
    """'ok', 'malformed' (does not parse) or 'invalid' (parses, fails the schema) for one result."""
    if result.call is not None and not result.error:
        return "ok", None
    kind = getattr(result, "error_kind", None)
    if kind in ("malformed", "invalid"):
        return kind, result.error
    return ("invalid" if result.call is not None else "malformed"), result.error


def pick_clock(llm) -> tuple[str, object]:
    """CPU time on a one-thread CPU run (a shared machine's descheduled time is not the model's
    cost), else wall time (a GPU, or several threads whose CPU time would add up)."""
    import torch

    device = getattr(getattr(llm, "runner", None), "device", None)
    if getattr(device, "type", "cpu") == "cpu" and torch.get_num_threads() == 1:
        return "process_time", time.process_time
    return "perf_counter", time.perf_counter


def _step_time(results, clock_s: float, wall_s: float) -> tuple[float, int, int]:
    """(seconds per decode step, steps, compactions) for one batch: every row advances one token per
    step. The engine's decode wall time is scaled by the pass's clock/wall ratio (1 on the wall clock)."""
    timed = [r for r in results if r.batch_timings.get("num_steps")]  # the batch's figures (one dict per batch)
    if not timed or wall_s <= 0:
        return float("nan"), 0, 0
    steps = max(r.batch_timings["num_steps"] for r in timed)
    compactions = max(int(r.batch_timings.get("compactions", 0)) for r in timed)
    return max(r.batch_timings["decode_s"] for r in timed) * (clock_s / wall_s) / steps, steps, compactions


def tool_batches(prompts: list[Prompt], batch_size: int) -> list[tuple[str, list[int]]]:
    """Tool-homogeneous batches (prompts without a tool form one 'untagged' group), interleaved
    across tools so drift over the run spreads over every tool."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, p in enumerate(prompts):
        groups[p.tool or "untagged"].append(i)
    per_tool = {t: [idx[k : k + batch_size] for k in range(0, len(idx), batch_size)] for t, idx in sorted(groups.items())}
    out = []
    for k in range(max(len(b) for b in per_tool.values())):
        out += [(t, b[k]) for t, b in per_tool.items() if k < len(b)]
    return out


def pairs_per_batch(batches: list[tuple[str, list[int]]], cfg: BreakevenConfig) -> dict[str, int]:
    """Timing pairs per batch for each tool: at least min_pairs_per_tool a round, rounded up to even."""
    counts: dict[str, int] = defaultdict(int)
    for tool, _ in batches:
        counts[tool] += 1
    out = {}
    for tool, n in counts.items():
        k = max(cfg.pairs_per_batch, -(-cfg.min_pairs_per_tool // n))
        out[tool] = k + (k % 2)
    return out


class _Run:
    """State of one measurement: outcomes, timed passes and repairs as they accumulate."""

    def __init__(self, llm, tools, prompts, cfg: BreakevenConfig, tick):
        self.llm, self.tools, self.prompts, self.cfg, self.tick = llm, tools, prompts, cfg, tick
        self.batches = tool_batches(prompts, cfg.batch_size)
        self.outcomes: list[_Outcome] = []
        self.passes: list[dict] = []
        self.repairs: list[dict] = []
        self.min_tokens = llm.min_tokens(tools) if hasattr(llm, "min_tokens") else 1
        self.clock_name, self.clock = pick_clock(llm)
        self.timing_tokens: dict[str, int] = {}

    def sampling(self, batch, round_index, max_tokens=None):
        from surecall.config import SamplingParams

        return [SamplingParams(temperature=self.cfg.temperature, max_tokens=max_tokens or self.cfg.max_tokens,
                               seed=self.cfg.seed + i + 7919 * round_index) for i in batch]

    def warm_up(self) -> None:
        """The first generates pay one-time costs (grammar compile, allocator, lazy init)."""
        _, batch = self.batches[0]
        msgs = [self.prompts[i].messages for i in batch]
        sampling = self.sampling(batch, 0, max_tokens=min(self.cfg.max_tokens, 32))
        for constrained in (False, True):
            self.llm.generate(msgs, tools=self.tools, sampling=sampling, constrained=constrained)

    def calls(self, tool: str, batch: list[int], round_index: int) -> None:
        """The free pass at the full budget: each row's call, classified."""
        msgs = [self.prompts[i].messages for i in batch]
        results = self.llm.generate(msgs, tools=self.tools, sampling=self.sampling(batch, round_index), constrained=False)
        self.tick()
        for i, r in zip(batch, results, strict=True):
            status, error = classify(r)
            self.outcomes.append(_Outcome(tool, r.num_tokens, status, error, r.text, i))

    def steps_for(self, tool: str) -> int:
        """The timed passes' budget for a tool, fixed at its first pair from the calls seen so far."""
        if tool not in self.timing_tokens:
            lengths = [o.num_tokens for o in self.outcomes if o.tool == tool and o.status == "ok"]
            lengths = lengths or [o.num_tokens for o in self.outcomes if o.tool == tool] or [self.min_tokens]
            q = sorted(lengths)[int(self.cfg.timing_quantile * (len(lengths) - 1))]
            self.timing_tokens[tool] = min(max(q, self.min_tokens), self.cfg.max_tokens)
        return self.timing_tokens[tool]

    def settle(self, tool: str, batch: list[int], round_index: int) -> None:
        """One untimed pass at the timing shape: the static step sizes its KV cache by prompt plus
        max_tokens, so the first timed pass after the full-budget calls pass would pay to re-size it."""
        msgs = [self.prompts[i].messages for i in batch]
        sampling = self.sampling(batch, round_index, max_tokens=self.steps_for(tool))
        self.llm.generate(msgs, tools=self.tools, sampling=sampling, constrained=False)

    def pair(self, tool: str, batch: list[int], round_index: int, pair_index: int) -> None:
        """A free and a constrained pass over the same batch for the same steps, order alternating."""
        msgs = [self.prompts[i].messages for i in batch]
        sampling = self.sampling(batch, round_index, max_tokens=self.steps_for(tool))
        order = (False, True) if pair_index % 2 == 0 else (True, False)
        timed = {}
        for constrained in order:
            wall0, clock0 = time.perf_counter(), self.clock()
            results = self.llm.generate(msgs, tools=self.tools, sampling=sampling, constrained=constrained)
            timed[constrained] = _step_time(results, self.clock() - clock0, time.perf_counter() - wall0)
            self.tick()
        (free_s, free_steps, free_comp), (cons_s, cons_steps, cons_comp) = timed[False], timed[True]
        self.passes.append({"tool": tool, "round": round_index, "pair": pair_index, "prompts": batch,
                            "order": "free-first" if order[0] is False else "constrained-first",
                            "step_s_free": free_s, "num_steps_free": free_steps, "compactions_free": free_comp,
                            "step_s_constrained": cons_s, "num_steps_constrained": cons_steps,
                            "compactions_constrained": cons_comp,
                            "equal_steps": free_steps == cons_steps and free_comp == cons_comp == 0})

    def repair_all(self) -> None:
        """Up to repairs_per_tool failed calls per tool (a truncated good call where none failed)."""
        by_tool: dict[str, list[_Outcome]] = defaultdict(list)
        for o in self.outcomes:
            by_tool[o.tool].append(o)
        for tool, outs in sorted(by_tool.items()):
            failed = [o for o in outs if o.status != "ok"]
            synthetic = not failed
            for k, o in enumerate((failed or outs)[: self.cfg.repairs_per_tool]):
                text = o.text[: max(1, len(o.text) // 2)] if synthetic else o.text
                self.repair_chain(tool, o.prompt_index, text, SYNTHETIC_ERROR if synthetic else (o.error or "invalid call"),
                                  synthetic, chain=k)

    def repair_chain(self, tool: str, prompt_index: int, text: str, error: str, synthetic: bool, chain: int) -> None:
        """Repair rounds for one failed call until one parses and validates or the limit is hit."""
        from surecall.config import SamplingParams

        messages = list(self.prompts[prompt_index].messages)
        for rnd in range(self.cfg.max_repair_rounds):
            feedback = REPAIR_TEMPLATE.format(error=error)
            messages = messages + [{"role": "assistant", "content": text}, {"role": "user", "content": feedback}]
            sampling = SamplingParams(temperature=self.cfg.temperature, max_tokens=self.cfg.max_tokens,
                                      seed=self.cfg.seed + 104729 + 31 * chain + rnd)
            start, wall0 = self.clock(), time.perf_counter()
            result = self.llm.generate([messages], tools=self.tools, sampling=[sampling], constrained=False)[0]
            seconds, wall_s = self.clock() - start, time.perf_counter() - wall0
            status, new_error = classify(result)
            added = len(self.llm.count_tokens(text)) + len(self.llm.count_tokens(feedback)) if hasattr(self.llm, "count_tokens") else 0
            self.repairs.append({"tool": tool, "chain": chain, "round": rnd + 1, "seconds": seconds, "ok": status == "ok",
                                 "wall_s": wall_s, "status": status, "context_tokens_added": added, "synthetic": synthetic,
                                 "prompt": prompt_index})
            self.tick()
            if status == "ok":
                return
            text, error = result.text, new_error or "invalid call"

    def samples(self) -> list[RowSamples]:
        """Per-tool samples, then the overall row (every call, pair and repair round)."""
        rows: dict[str, RowSamples] = {}
        for o in self.outcomes:
            row = rows.setdefault(o.tool, RowSamples(o.tool))
            row.call_tokens.append(o.num_tokens)
            row.call_status.append(o.status)
        for tool in rows:
            # pairs at equal step counts only; a tool with none keeps all its pairs (counted in the report)
            pairs = [p for p in self.passes if p["tool"] == tool]
            for p in [p for p in pairs if p["equal_steps"]] or pairs:
                rows[tool].step_s_free.append(p["step_s_free"])
                rows[tool].step_s_constrained.append(p["step_s_constrained"])
        for r in self.repairs:
            rows[r["tool"]].repair_s.append(r["seconds"])
            rows[r["tool"]].repair_ok.append(r["ok"])
        out = [rows[t] for t in sorted(rows)]
        overall = RowSamples(OVERALL)
        for row in out:
            for name in ("call_tokens", "call_status", "step_s_free", "step_s_constrained", "repair_s", "repair_ok"):
                getattr(overall, name).extend(getattr(row, name))
        return out + [overall]


def _stop_reason(rows: list[dict], cfg: BreakevenConfig) -> str | None:
    if all(r["decision"] != UNDECIDED for r in rows):
        return "every row decided"
    if all((r["p_break_ci"][1] - r["p_break_ci"][0]) / 2 <= cfg.precision for r in rows):
        return f"every p_break interval within +-{cfg.precision:.1%}"
    return None


def measure(llm, tools: list, prompts: list[Prompt], cfg: BreakevenConfig, progress=None) -> BreakevenMeasurement:
    """Warm up, run rounds of paired passes with repairs after the first, estimate, stop by the rule."""
    tick = progress.update if progress is not None else (lambda n=1: None)
    run = _Run(llm, tools, prompts, cfg, tick)
    per_batch = pairs_per_batch(run.batches, cfg)
    if progress is not None:
        progress.total = sum(1 + 2 * per_batch[t] for t, _ in run.batches) * cfg.max_rounds
    started = time.perf_counter()
    # 1. warm-up, outside every timed figure
    run.warm_up()
    rows, reason, num_pairs = [], "max_rounds reached", 0
    for round_index in range(cfg.max_rounds):
        # 2. one round: per tool-homogeneous batch, the calls and a timing pair
        for tool, batch in run.batches:
            run.calls(tool, batch, round_index)
            run.settle(tool, batch, round_index)
            for _ in range(per_batch[tool]):
                run.pair(tool, batch, round_index, num_pairs)
                num_pairs += 1
        # 3. repair rounds for the failures of the first round
        if round_index == 0:
            run.repair_all()
        # 4. estimates; stop when the rule says so
        rows = [estimate_row(s, cfg.estimator()) for s in run.samples()]
        if round_index + 1 >= cfg.min_rounds:
            stop = _stop_reason(rows, cfg)
            if stop is None and cfg.time_budget_s is not None and time.perf_counter() - started > cfg.time_budget_s:
                stop = f"time budget of {cfg.time_budget_s:.0f} s spent"
            if stop is not None:
                reason = stop
                break
    for row, s in zip(rows, run.samples(), strict=True):
        row["tool"] = s.tool
        # repairs of a truncated good call, where the tool had no failure to repair
        row["num_repair_rounds_synthetic"] = sum(r["synthetic"] for r in run.repairs if s.tool in (r["tool"], OVERALL))
        row["examples"] = [{"status": o.status, "error": o.error, "text": o.text[:300]}
                           for o in run.outcomes if o.status != "ok" and (s.tool in (o.tool, OVERALL))][:3]
    return BreakevenMeasurement(
        rows=rows, samples=run.samples(), passes=run.passes, repairs=run.repairs, num_rounds=round_index + 1,
        stop_reason=reason, clock=run.clock_name, num_pairs_unequal=sum(not p["equal_steps"] for p in run.passes),
        timing_tokens=run.timing_tokens,
    )


