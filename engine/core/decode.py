"""The batched decode loop: prefill, then one masked, sampled, advanced token per row per step.

Rows finish independently (a finished row keeps feeding a pad token and is ignored); the host
looks at the finished flags only every `stop_check_interval` steps, so a step launches work
without waiting for the device. Constrained rows carry a global state id in one concatenated
TokenTable (mixed tools in one batch), a counter for counted string lengths, and a remaining
budget, so the mask only keeps tokens that can still reach acceptance: a constrained row never
ends mid-call. Forced prefix ids (a
control token such as Mistral's `[TOOL_CALLS]`) are appended to the prompt and reported as
generated tokens with masked logprob 0. Masking, sampling and advancing are `surecall.kernels`;
a row whose mask allows nothing, or whose token the grammar refuses, ends with finish_reason
"error" and a message (a table or kernel bug, never a silent success). This module does not
tokenize, parse or validate.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field, fields

import torch

from surecall.config import EngineConfig, SamplingParams
from surecall.kernels import DEAD_STATE, SamplingTensors, advance, sample
from surecall.kernels.items import advance_items, constrain_items

EMPTY_MASK, REFUSED_TOKEN = 1, 2  # why a row failed (fail codes inside the loop)


@dataclass
class DecodeRow:
    prompt_ids: list[int]
    sampling: SamplingParams
    state: int = -1  # global start state in the batch table; -1 = free (unconstrained) row
    forced_ids: tuple[int, ...] = ()  # emitted before the grammar starts (already in no grammar)


@dataclass
class RowOutput:
    token_ids: list[int]
    logprobs: list[float] | None
    unmasked_logprobs: list[float] | None
    finish_reason: str  # "stop" (a stop id ended it) | "length" (max_tokens reached) | "error"
    error: str | None = None  # why the row failed (finish_reason "error")
    num_steps: int = 0  # decode steps the row took (its forced ids are not steps)
    finish_s: float = 0.0  # seconds from the batch's start (prefill included) to the end of its last step


@dataclass
class DecodeOutput:
    rows: list[RowOutput]
    # The batch's: prefill_s, decode_s, sample_s (the sampling kernels, grammar mask fused in),
    # advance_s (grammar state advance), num_steps, step_mode, graph_capture_s, compactions
    timings: dict = field(default_factory=dict)


class _Clock:
    """Sums device time of named sections and marks the end of each step, without syncing inside
    the loop (CUDA events on GPU); its origin is its creation, before the prefill."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.pending: dict[str, list] = {}
        self.totals: dict[str, float] = {}
        self.origin = self.start("origin")[1]
        self.step_ends: list = []  # one event (GPU) or perf_counter time (CPU) per decode step

    def start(self, name: str):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return (name, event)
        return (name, time.perf_counter())

    def stop(self, token) -> None:
        name, begin = token
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.pending.setdefault(name, []).append((begin, end))
        else:
            self.totals[name] = self.totals.get(name, 0.0) + time.perf_counter() - begin

    def end_step(self) -> None:
        self.step_ends.append(self.start("step")[1])

    def result(self) -> dict[str, float]:
        if self.cuda:
            torch.cuda.synchronize()
            for name, pairs in self.pending.items():
                self.totals[name] = self.totals.get(name, 0.0) + sum(b.elapsed_time(e) for b, e in pairs) / 1e3
        return dict(self.totals)

    def step_end_s(self) -> list[float]:
        """Seconds from the origin to the end of each step (call after `result`, which syncs)."""
        if self.cuda:
            return [self.origin.elapsed_time(e) / 1e3 for e in self.step_ends]
        return [t - self.origin for t in self.step_ends]


def _left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    length = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), length), dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, length - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[r, length - len(p) :] = 1
    return ids, mask


MIN_SHARED_PREFIX = 16  # shorter common prompt beginnings are not worth a separate prefill pass


def _shared_prefix(prompts: list[list[int]], keep_last: int) -> int:
    """Leading tokens every prompt shares, leaving each row at least `keep_last` of its own (0 if short)."""
    if len(prompts) < 2:
        return 0
    limit = min(len(p) for p in prompts) - keep_last
    first = prompts[0]
    n = 0
    while n < limit and all(p[n] == first[n] for p in prompts):
        n += 1
    return n if n >= MIN_SHARED_PREFIX else 0


def _row_seed(sampling: SamplingParams) -> int:
    return sampling.seed if sampling.seed is not None else secrets.randbits(62)


def _forced_unmasked(logits_last: torch.Tensor, rows: list[DecodeRow]) -> list[list[float]]:
    """Unmasked logprobs of each row's forced ids, from the prefill logits that predicted them."""
    out = []
    k = logits_last.shape[1]
    for b, row in enumerate(rows):
        n = len(row.forced_ids)
        if n == 0:
            out.append([])
            continue
        temp = row.sampling.temperature or 1.0
        lp = torch.log_softmax(logits_last[b, k - 1 - n : k - 1] / temp, dim=-1)
        out.append([float(lp[i, t]) for i, t in enumerate(row.forced_ids)])
    return out


def _record(fail, fail_at, rows, code: int, step: int, state, tok) -> None:
    """Mark `rows` (bool [B]) failed with `code` at this step, keeping the state and token (no sync)."""
    fail.copy_(torch.where(rows, code, fail))
    here = torch.stack([torch.full_like(tok, step), state.to(torch.int64), tok.to(torch.int64)], dim=1)
    fail_at.copy_(torch.where(rows.view(-1, 1), here, fail_at))


def _fail_messages(codes: list[int], where: list[list[int]]) -> list[str | None]:
    out: list[str | None] = []
    for code, (step, state, tok) in zip(codes, where, strict=True):
        if code == EMPTY_MASK:
            out.append(f"at step {step}, the grammar mask of state {state} allows no token")
        elif code == REFUSED_TOKEN:
            out.append(f"at step {step}, token {tok} is not allowed in grammar state {state}")
        else:
            out.append(None)
    return out


@dataclass
class _Live:
    """The per-row tensors of the rows still in the batch (all [n] on the device)."""

    idx: torch.Tensor  # int64: each row's index in the request
    state: torch.Tensor
    counter: torch.Tensor  # int32: characters started in the row's counted string (grammars/table.py)
    item_counter: torch.Tensor  # int32: item separators crossed in the row's counted array
    is_constrained: torch.Tensor
    budget: torch.Tensor
    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    seed: torch.Tensor
    pad: torch.Tensor
    done: torch.Tensor
    by_stop: torch.Tensor
    length: torch.Tensor
    fail: torch.Tensor  # 0 | EMPTY_MASK | REFUSED_TOKEN
    fail_at: torch.Tensor  # [n, 3]: step, state, token

    @classmethod
    def build(cls, rows: list[DecodeRow], budgets: list[int], pad_id: int, device) -> _Live:
        n = len(rows)
        state = torch.tensor([r.state for r in rows], dtype=torch.int32, device=device)

        def vec(values, dtype):
            return torch.tensor(values, dtype=dtype, device=device)

        return cls(
            idx=torch.arange(n, device=device), state=state, counter=torch.zeros_like(state),
            item_counter=torch.zeros_like(state),
            is_constrained=state >= 0,
            budget=vec(budgets, torch.int32),
            temperature=vec([float(r.sampling.temperature) for r in rows], torch.float32),
            top_k=vec([r.sampling.top_k for r in rows], torch.int32),
            top_p=vec([float(r.sampling.top_p) for r in rows], torch.float32),
            seed=vec([_row_seed(r.sampling) for r in rows], torch.int64),
            pad=torch.full((n,), pad_id, dtype=torch.int64, device=device),
            done=torch.zeros(n, dtype=torch.bool, device=device),
            by_stop=torch.zeros(n, dtype=torch.bool, device=device),
            length=torch.zeros(n, dtype=torch.int64, device=device),
            fail=torch.zeros(n, dtype=torch.int32, device=device),
            fail_at=torch.zeros((n, 3), dtype=torch.int64, device=device),
        )

    def take(self, keep: torch.Tensor) -> _Live:
        return _Live(**{f.name: getattr(self, f.name)[keep] for f in fields(self)})


class _Final:
    """Each request row's outcome, filled in as rows leave the batch (and at the end)."""

    def __init__(self, n: int, device):
        self.length = torch.zeros(n, dtype=torch.int64, device=device)
        self.by_stop = torch.zeros(n, dtype=torch.bool, device=device)
        self.fail = torch.zeros(n, dtype=torch.int32, device=device)
        self.fail_at = torch.zeros((n, 3), dtype=torch.int64, device=device)

    def store(self, live: _Live) -> None:
        for name in ("length", "by_stop", "fail", "fail_at"):
            getattr(self, name)[live.idx] = getattr(live, name)


class Decoder:
    """Runs one batch (at most the runner's batch limit) from prompts to finished rows."""

    def __init__(self, runner, config: EngineConfig | None = None):
        self.runner = runner
        self.config = config or EngineConfig()

    @torch.inference_mode()
    def run(
        self,
        rows: list[DecodeRow],
        stop_ids: list[int],  # ids that end a free row (constrained rows: the table's stop ids)
        table=None,  # the batch's concatenated table as a kernels DeviceTable on the runner's device, or None
        pad_id: int = 0,
        items=None,  # kernels.items.ItemTable of the same table when it has counted arrays, or None
    ) -> DecodeOutput:
        device = self.runner.device
        clock = _Clock(device)
        batch = len(rows)
        budgets = [r.sampling.max_tokens - len(r.forced_ids) for r in rows]
        max_steps = max(budgets)
        # 1. prefill (forced ids ride at the end of the prompt)
        t0 = time.perf_counter()
        ids, attn = _left_pad([list(r.prompt_ids) + list(r.forced_ids) for r in rows], pad_id)
        num_last = 1 + max(len(r.forced_ids) for r in rows)
        want_unmasked = any(r.sampling.unmasked_logprobs for r in rows)
        keep = num_last if want_unmasked else 1
        shared = _shared_prefix([list(r.prompt_ids) + list(r.forced_ids) for r in rows], keep)
        logits_last = self.runner.prefill(ids, attn, max_steps, num_last=keep, cuda_graphs=self.config.cuda_graphs,
                                          shared_prefix=shared)
        forced_unmasked = _forced_unmasked(logits_last, rows) if want_unmasked else [[] for _ in rows]
        logits = logits_last[:, -1, :]
        if device.type == "cuda":
            torch.cuda.synchronize()
        prefill_s = time.perf_counter() - t0
        # 2. per-row tensors (compacted as rows finish: `live.idx` maps them back to `rows`)
        t1 = time.perf_counter()
        dtable = table
        live = _Live.build(rows, budgets, pad_id, device)
        final = _Final(batch, device)
        stops = torch.tensor(sorted(set(stop_ids)), dtype=torch.int64, device=device)
        out_tok = torch.full((batch, max_steps), pad_id, dtype=torch.int64, device=device)
        out_lp = torch.zeros((batch, max_steps), dtype=torch.float32, device=device)
        out_raw = torch.zeros((batch, max_steps), dtype=torch.float32, device=device) if want_unmasked else None
        use_sort = any(r.sampling.top_k > 0 or r.sampling.top_p < 1.0 for r in rows)
        counted = dtable is not None and dtable.has_counts
        num_steps = compactions = 0
        # 3. the step loop
        for step in range(max_steps):
            num_steps = step + 1
            rw = live
            remaining = (rw.budget - step).clamp_min(1)
            step_t = torch.full_like(rw.seed, step)
            params = SamplingTensors(rw.temperature, rw.top_k, rw.top_p, rw.seed, step_t, use_top_k_top_p=use_sort)
            mark = clock.start("sample_s")  # constrained rows: the mask is fused into the sampler
            grammar = torch.where(rw.done, -1, rw.state)
            remaining = constrain_items(logits, dtable, items, grammar, rw.counter if counted else None,
                                        rw.item_counter, remaining)
            out = sample(logits, dtable, grammar, params, remaining=remaining,
                         return_unmasked_logprobs=want_unmasked, check=self.config.check_kernel_inputs,
                         counters=rw.counter if counted else None)
            clock.stop(mark)
            tok = out.tokens
            empty = ~rw.done & (tok < 0)  # the mask allowed nothing: end the row as an error, never embed -1
            _record(rw.fail, rw.fail_at, empty, EMPTY_MASK, step, rw.state, tok)
            rw.length = torch.where(empty, step, rw.length)
            rw.done |= empty
            tok = torch.where(rw.done, rw.pad, tok)
            out_tok[rw.idx, step] = tok
            out_lp[rw.idx, step] = out.logprobs
            if want_unmasked:
                out_raw[rw.idx, step] = out.unmasked_logprobs
            # 4. advance grammars; decide which rows finished with this token
            finished = torch.isin(tok, stops)
            if dtable is not None:
                mark = clock.start("advance_s")
                going = rw.is_constrained & ~rw.done
                moved = advance(torch.where(going, rw.state, -1), tok, dtable, check=False,
                                counters=rw.counter if counted else None)
                next_state, fin_grammar = moved[0], moved[1]
                refused = going & (next_state == DEAD_STATE)  # the grammar does not allow the token
                _record(rw.fail, rw.fail_at, refused, REFUSED_TOKEN, step, rw.state, tok)
                if items is not None:  # from the state before the token
                    stepped = advance_items(items, torch.where(going, rw.state, -1), tok, rw.item_counter)
                    rw.item_counter = torch.where(going & ~refused, stepped, rw.item_counter)
                rw.state = torch.where(going & ~refused, next_state, rw.state)
                if counted:
                    rw.counter = torch.where(going & ~refused, moved[2], rw.counter)
                finished = torch.where(rw.is_constrained, fin_grammar, finished)
                clock.stop(mark)
            newly = ~rw.done & (finished | (step + 1 >= rw.budget))
            rw.by_stop |= newly & finished & (rw.fail == 0)
            rw.length = torch.where(newly, step + 1, rw.length)
            rw.done |= newly
            clock.end_step()
            if (step + 1) % self.config.stop_check_interval == 0:
                going_on = int((~rw.done).sum())  # the one host sync, every few steps
                if going_on == 0:
                    break
                if self.config.compact_batches and self.runner.batch_size_after(going_on) <= self.runner.batch_size // 2:
                    keep = torch.nonzero(~rw.done).flatten()
                    final.store(rw)
                    live, tok = rw.take(keep), tok[keep]
                    self.runner.compact(keep)
                    compactions += 1
            if step + 1 < max_steps:
                logits = self.runner.decode(tok)
        final.store(live)
        length, by_stop, fail, fail_at = final.length, final.by_stop, final.fail, final.fail_at
        # 5. gather results on the host once
        lengths, stopped = length.tolist(), by_stop.tolist()
        codes, where = fail.tolist(), fail_at.tolist()
        errors = _fail_messages(codes, where)
        tok_host, lp_host = out_tok.tolist(), out_lp.tolist()
        raw_host = out_raw.tolist() if want_unmasked else None
        decode_s = time.perf_counter() - t1
        timings = {"prefill_s": prefill_s, "decode_s": decode_s, "sample_s": 0.0, "advance_s": 0.0, "num_steps": num_steps,
                   "step_mode": self.runner.last_mode, "graph_capture_s": self.runner.last_capture_s,
                   "compactions": compactions}
        timings.update(clock.result())
        ends = _row_ends(lengths, codes, where, clock.step_end_s())
        self.runner.release()
        return DecodeOutput(
            [self._row_output(r, lengths[b], stopped[b], tok_host[b], lp_host[b],
                              raw_host[b] if raw_host else None, forced_unmasked[b], errors[b], ends[b])
             for b, r in enumerate(rows)],
            timings,
        )

    @staticmethod
    def _row_output(row, n, stopped, toks, lps, raws, forced_raw, error, end) -> RowOutput:
        forced = list(row.forced_ids)
        s = row.sampling
        return RowOutput(
            token_ids=forced + toks[:n],
            logprobs=[0.0] * len(forced) + lps[:n] if s.logprobs else None,
            unmasked_logprobs=forced_raw + raws[:n] if s.unmasked_logprobs and raws is not None else None,
            finish_reason="error" if error else ("stop" if stopped else "length"),
            error=error,
            num_steps=end[0],
            finish_s=end[1],
        )


def _row_ends(lengths: list[int], codes: list[int], where: list[list[int]],
              step_end_s: list[float]) -> list[tuple[int, float]]:
    """(decode steps taken, seconds to the end of the last one) per row.

    A row ends at the step that wrote its last token (length - 1), or at the step a failure was
    recorded (an empty mask writes no token).
    """
    out = []
    for n, code, (fail_step, _, _) in zip(lengths, codes, where, strict=True):
        last = fail_step if code else n - 1
        last = min(max(last, 0), len(step_end_s) - 1)
        out.append((last + 1, step_end_s[last] if step_end_s else 0.0))
    return out
