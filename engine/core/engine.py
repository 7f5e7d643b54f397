"""EngineCore: a living batch. Requests join and leave at step boundaries; a step is five calls.

`add_request` queues a request (prompt ids, sampling, optionally a compiled grammar); `step`
runs one scheduling round: schedule -> forward (prefill chunks, then decodes) -> mask + sample
-> advance grammars -> finish rows, and returns what each request got. Grammars of every live
request are concatenated into one device table (rebuilt only when the set of grammars changes),
so rows with different tools share a step. A request that can never fit (prompt + max_tokens
past the model's positions or the whole block pool) is refused when added; an exception inside
a step fails that step's requests with the error and the engine goes on. It does not tokenize,
render prompts or parse calls (`surecall.llm`); decode-only steps may take `graph_step.py`. Under a
transformers version the cache adapter was not tested with (`kv_cache.paged_cache_supported`) it
warns once and runs plain: no paged cache, no prefix cache, each step recomputes every row.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from surecall.config import SamplingParams
from surecall.core.blocks import BlockManager
from surecall.core.graph_step import GraphStep
from surecall.core.kv_cache import (
    PagedKVCache,
    bytes_per_token,
    cache_keyword,
    paged_cache_supported,
)
from surecall.core.masks import attention_mask
from surecall.core.scheduler import Plan, Scheduler, Sequence, Work
from surecall.errors import RequestError
from surecall.kernels import DEAD_STATE, DeviceTable, SamplingTensors, advance, sample
from surecall.kernels.items import (
    MAX_ITEM_DEPTH,
    ItemTable,
    advance_items,
    constrain_items,
    item_row,
)
from surecall.kernels.stack import (
    StackTable,
    advance_stack,
    apply_stack_mask_inplace,
    stack_remaining,
)


@dataclass
class RequestState:
    """What the engine keeps per request besides its tokens."""

    sampling: SamplingParams
    seed: int
    stop_ids: frozenset[int]
    forced: tuple[int, ...] = ()
    table_key: str | None = None  # the request's grammar (None: free decoding)
    state: int = -1  # local state in its grammar (-1: free)
    counter: int = 0  # characters started in the current counted string (grammars/table.py)
    item_counter: tuple[int, ...] = (0,) * MAX_ITEM_DEPTH  # separators crossed in each open counted array (grammars/table.py)
    stack_depth: int = 0  # open free-form containers (grammars/stack.py)
    stack_bits: int = 0  # their kinds, bit 0 the innermost (1: an array)
    generated: list[int] = field(default_factory=list)  # forced ids first
    logprobs: list[float] = field(default_factory=list)
    unmasked_logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" | "length" | "error" | "abort"
    by_stop: bool = False  # ended by a stop id or its grammar's end (not by the budget)
    error: str | None = None
    added_s: float = field(default_factory=time.perf_counter)
    first_token_s: float | None = None
    finished_s: float | None = None


@dataclass
class StepOutput:
    request_id: str
    new_token_ids: list[int]
    finished: bool
    state: RequestState
    seq: Sequence


class Sampled:
    """The rows a step samples for, in order, and their last-position logits.

    Each forward adds its [B, keep, V] output; the rows' logits are one view of it when every row
    of the forward samples (a decode step: no copy of batch x vocabulary floats), else a gather.
    """

    def __init__(self):
        self.works: list[Work] = []
        self.forced: list[torch.Tensor | None] = []  # [keep, V] per row when forced ids need logits
        self._blocks: list[torch.Tensor] = []

    def add(self, works: list[Work], logits: torch.Tensor, keep: int) -> None:
        rows = [b for b, w in enumerate(works) if w.samples]
        if not rows:
            return
        self.works += [works[b] for b in rows]
        self.forced += [logits[b] if keep > 1 else None for b in rows]
        self._blocks.append(logits[:, -1] if len(rows) == len(works) else logits[rows, -1])

    def __len__(self) -> int:
        return len(self.works)

    def logits(self) -> torch.Tensor:
        """[N, V] float32, row i the logits of works[i]."""
        return self._blocks[0] if len(self._blocks) == 1 else torch.cat(self._blocks)


@dataclass
class _StepHost:
    """One step's sampler and advance outputs as host lists (row i of each)."""

    tokens: list[int]
    logprobs: list[float]
    unmasked: list[float] | None
    next_states: list[int]  # in the concatenated table
    finished: list[bool]  # the grammar ended (or, on a free row, unused)
    constrained: list[bool]
    counters: list[int] | None
    items: list[int] | None
    stack: tuple[list[int], list[int]] | None  # depths and kind bits
    steps: list[int]
    offsets: dict[str, int]


MAX_DEVICE_TABLES = 16  # concatenations of live grammars kept on the device (least recently used out)


class _Grammars:
    """Compiled tables by key, and the device concatenation of the live ones.

    Concatenations are kept by key set: as rows of a mixed batch finish, the live set shrinks
    back through combinations seen before, and none is rebuilt or copied to the device again.
    """

    def __init__(self, device):
        self.device = device
        self.tables: dict[str, object] = {}
        self.users: dict[str, int] = {}
        self._live_keys: tuple[str, ...] = ()
        self.device_table: DeviceTable | None = None
        self.item_table = None  # kernels.items.ItemTable of the concatenation when it has counted arrays
        self.stack_table = None  # kernels.stack.StackTable of the concatenation when it has free-form values
        self.offsets: dict[str, int] = {}
        self._built: dict[tuple[str, ...], tuple] = {}  # keys -> (device table, offsets, source tables)

    def acquire(self, key: str, table) -> None:
        self.tables.setdefault(key, table)
        self.users[key] = self.users.get(key, 0) + 1

    def release(self, key: str) -> None:
        self.users[key] -= 1
        if self.users[key] == 0:
            del self.users[key]
            del self.tables[key]

    def current(self) -> tuple[DeviceTable | None, dict[str, int]]:
        keys = tuple(sorted(self.users))
        if keys != self._live_keys:
            from surecall.grammars.table import TokenTable

            self._live_keys = keys
            if not keys:
                self.device_table, self.offsets, self.item_table, self.stack_table = None, {}, None, None
                return self.device_table, self.offsets
            tables = [self.tables[k] for k in keys]
            built = self._built.pop(keys, None)
            if built is None or any(a is not b for a, b in zip(built[2], tables, strict=True)):
                table, offsets = TokenTable.concat(tables) if len(tables) > 1 else (tables[0], [0])
                built = (DeviceTable.from_table(table, self.device),
                         {k: int(o) for k, o in zip(keys, offsets, strict=True)}, tuple(tables),
                         ItemTable.from_table(table, self.device) if table.has_items else None,
                         StackTable.from_table(table, self.device) if table.has_stack else None)
            self._built[keys] = built  # most recently used last
            while len(self._built) > MAX_DEVICE_TABLES:
                self._built.pop(next(iter(self._built)))
            self.device_table, self.offsets, self.item_table, self.stack_table = built[0], built[1], built[3], built[4]
        return self.device_table, self.offsets


class EngineCore:
    """One model, one paged KV cache, one scheduler."""

    def __init__(self, model, *, block_size: int = 16, num_blocks: int | None = None,
                 kv_cache_bytes: int | None = None, max_num_seqs: int = 256, max_num_batched_tokens: int = 4096,
                 max_model_len: int | None = None, enable_prefix_caching: bool = True, pad_id: int = 0,
                 check_kernel_inputs: bool = False, scheduling: str = "continuous", graph_step: bool | None = None):
        if max_num_batched_tokens < 2:
            raise ValueError(f"Invalid max_num_batched_tokens: expected >= 2, got {max_num_batched_tokens}")
        self.model = model
        self.device = next(model.parameters()).device
        dtype = next(model.parameters()).dtype
        self.max_model_len = int(max_model_len or getattr(model.config, "max_position_embeddings", 1 << 20))
        if num_blocks is None:
            num_blocks = self.default_num_blocks(model, block_size, self.max_model_len, kv_cache_bytes)
        self.paged = paged_cache_supported()  # False: plain recompute, no K/V pools (warned once)
        self.kv = PagedKVCache(model.config, num_blocks, block_size, self.device, dtype) if self.paged else None
        self.blocks = BlockManager(num_blocks, block_size, enable_prefix_caching and self.paged)
        self.scheduler = Scheduler(self.blocks, max_num_seqs, max_num_batched_tokens, scheduling)
        self.grammars = _Grammars(self.device)
        self.keyword = cache_keyword(model)
        self.is_sdpa = getattr(model.config, "_attn_implementation", "sdpa") == "sdpa"
        self.pad_id = pad_id
        self.check_kernel_inputs = check_kernel_inputs
        self.requests: dict[str, Sequence] = {}
        self.num_steps = 0
        self.num_preemptions = 0
        self.last_step_prefill = False  # the last step fed prompt chunks (not only one token per row)
        self.timings = {"sample_s": 0.0, "advance_s": 0.0}  # summed over steps (callers take differences)
        self._static_params: tuple[tuple[int, ...], SamplingTensors] | None = None  # (batch key, its tensors)
        # decode-only steps on static buffers, one CUDA graph per bucket (graph_step.py); default: on CUDA
        use_graph = self.paged and (self.device.type == "cuda" if graph_step is None else graph_step)
        self.graph = GraphStep(self) if use_graph else None

    @staticmethod
    def blocks_for(num_tokens: int, block_size: int) -> int:
        return -(-num_tokens // block_size)

    @classmethod
    def default_num_blocks(cls, model, block_size: int, max_model_len: int, kv_cache_bytes: int | None = None) -> int:
        """`kv_cache_bytes` of blocks, or room for 8 full-length sequences (at most 1 GiB)."""
        per_block = bytes_per_token(model.config, next(model.parameters()).dtype) * block_size
        budget = kv_cache_bytes or min(1 << 30, per_block * cls.blocks_for(max_model_len, block_size) * 8)
        return max(1, budget // per_block)

    # --- requests -------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_ids: list[int], sampling: SamplingParams, *,
                    stop_ids=(), table=None, table_key: str | None = None, forced_ids=()) -> Sequence:
        """Queue a request; RequestError when it can never run (too long, or an id in use)."""
        if request_id in self.requests:
            raise RequestError(f"Invalid request_id {request_id!r}: a request with this id is still running")
        if not prompt_ids:
            raise RequestError(f"Invalid request {request_id!r}: empty prompt")
        total = len(prompt_ids) + sampling.max_tokens
        if total > self.max_model_len:
            raise RequestError(f"Invalid request {request_id!r}: prompt ({len(prompt_ids)} tokens) + max_tokens "
                               f"({sampling.max_tokens}) exceeds the model's {self.max_model_len} positions")
        if self.blocks.blocks_for(total) > self.blocks.num_blocks:
            raise RequestError(f"Invalid request {request_id!r}: {total} tokens do not fit the KV cache "
                               f"({self.blocks.num_blocks} blocks of {self.blocks.block_size})")
        if (table is None) != (table_key is None):
            raise ValueError("Invalid grammar: pass both table and table_key, or neither")
        state = RequestState(sampling=sampling, seed=sampling.seed if sampling.seed is not None else secrets.randbits(62),
                             stop_ids=frozenset(int(s) for s in stop_ids), forced=tuple(int(t) for t in forced_ids),
                             table_key=table_key, state=0 if table is not None else -1)
        state.generated = list(state.forced)
        state.logprobs = [0.0] * len(state.forced)
        if table is not None:
            self.grammars.acquire(table_key, table)
        seq = Sequence(request_id, list(prompt_ids) + list(state.forced), len(prompt_ids), sampling.max_tokens, state)
        self.requests[request_id] = seq
        self.scheduler.add(seq)
        return seq

    def abort(self, request_id: str) -> bool:
        """Cancel a request and free its blocks; False when it is unknown or already done."""
        seq = self.requests.get(request_id)
        if seq is None:
            return False
        self._finish(seq, "abort")
        return True

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_work

    # --- the step ---------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[StepOutput]:
        plan = self.scheduler.schedule()  # 1. schedule
        self.num_steps += 1
        self.num_preemptions += len(plan.preempted)
        self.last_step_prefill = bool(plan.prefill)
        if plan.is_empty:
            return []
        try:
            if self.graph is not None and not plan.prefill and self.graph.fits(plan.decode):
                outputs = self.graph.step(plan.decode)  # 2-5. as below, one captured graph (graph_step.py)
            else:
                sampled = self._forward_all(plan)  # 2. forward
                outputs = self._sample_and_advance(sampled)  # 3-5. mask + sample, advance, finish rows
        except Exception as exc:  # noqa: BLE001 - one bad step must not take the engine down
            outputs = []
            for work in plan.decode + plan.prefill:
                state = work.seq.payload
                state.error = f"engine step failed: {type(exc).__name__}: {exc}"
                self._finish(work.seq, "error")
                outputs.append(StepOutput(work.seq.request_id, [], True, state, work.seq))
        return outputs

    def _forward_all(self, plan: Plan) -> Sampled:
        """Run the prefill chunks and the decodes; the rows that sample, with their logits."""
        sampled = Sampled()
        for group in (plan.prefill, plan.decode):
            if not group:
                continue
            keep = 1 + max((len(w.seq.payload.forced) for w in group
                            if w.samples and w.seq.payload.sampling.unmasked_logprobs
                            and w.start <= w.seq.num_tokens - 1 - len(w.seq.payload.forced)), default=0)
            if self.paged:
                if group is plan.decode:  # the order that keeps the cache's dense decode views
                    order = self.kv.decode_order([_view_key(w) for w in group], [w.start for w in group],
                                                 max(w.end for w in group))
                    group = [group[i] for i in order] if order is not None else group
                logits = self._forward(group, keep)
                for work in group:
                    work.seq.num_computed = work.end
                    self.blocks.register_full(work.seq.block_table, work.seq.token_ids, work.seq.num_computed,
                                             work.seq.block_hashes)
                sampled.add(group, logits, keep)
                continue
            for work in group:  # plain: nothing is cached, so only rows that sample run the model
                work.seq.num_computed = work.end
            rows = [w for w in group if w.samples]
            if rows:
                sampled.add(rows, self._forward_plain(rows, keep), keep)
        return sampled

    def _forward_plain(self, works: list[Work], keep: int) -> torch.Tensor:
        """Each row's whole sequence so far, left-padded, without a cache; logits [B, keep, V] float32.

        The fallback under an unknown transformers version: it uses nothing of the cache API.
        """
        length = max(w.end for w in works)
        ids = torch.full((len(works), length), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(works), length), dtype=torch.long)
        for b, w in enumerate(works):
            ids[b, length - w.end:] = torch.tensor(w.seq.token_ids[: w.end], dtype=torch.long)
            attn[b, length - w.end:] = 1
        positions = (attn.cumsum(-1) - 1).clamp_min(0)
        out = self.model(input_ids=ids.to(self.device), attention_mask=attn.to(self.device),
                         position_ids=positions.to(self.device), logits_to_keep=keep, use_cache=False)
        return out.logits[:, -keep:, :].float()

    def _forward(self, works: list[Work], keep: int) -> torch.Tensor:
        """One forward over `works` (queries left-padded to the longest); logits [B, keep, V] float32."""
        device = self.device
        ids, qpos, write, read, allowed = _step_inputs(works, self.blocks.block_size, self.pad_id,
                                                       self.kv.pad_slot, self.kv.trash_slot)
        kpos = torch.arange(read.shape[1], device=device)[None, :]
        mask = attention_mask(torch.from_numpy(allowed).to(device), kpos, torch.from_numpy(qpos).to(device),
                              self.model.config, self.is_sdpa, next(self.model.parameters()).dtype)  # causal + window
        decode = all(w.end - w.start == 1 for w in works)
        self.kv.bind(torch.from_numpy(write.reshape(-1)).to(device), torch.from_numpy(read).to(device),
                     decode_key=[_view_key(w) for w in works] if decode else None,
                     columns=[w.start for w in works] if decode else None)
        failed = True
        try:
            out = self.model(input_ids=torch.from_numpy(ids).to(device), attention_mask=mask,
                             position_ids=torch.from_numpy(np.maximum(qpos, 0)).to(device),
                             logits_to_keep=keep, use_cache=True, **{self.keyword: self.kv})
            failed = False
        finally:
            self.kv.unbind(failed)
        return out.logits[:, -keep:, :].float()

    def _sample_and_advance(self, sampled: Sampled) -> list[StepOutput]:
        if not sampled:
            return []
        seqs = [w.seq for w in sampled.works]
        states = [s.payload for s in seqs]
        logits = sampled.logits()
        dtable, offsets = self.grammars.current()
        itable, stable = self.grammars.item_table, self.grammars.stack_table
        grammar_state, remaining, counters, items, steps = self._row_tensors(states, dtable, offsets, itable)
        params = self._sampling_tensors(seqs, states, steps)
        want_unmasked = any(st.sampling.unmasked_logprobs for st in states)
        # 3. mask + sample
        mark = self._clock()
        budget = remaining.clamp_min(1)
        depth = bits = None
        if stable is not None:  # the bracket stack's tokens, then every other rule less the stack's closers
            depth = torch.tensor([st.stack_depth for st in states], dtype=torch.int32, device=self.device)
            bits = torch.tensor([st.stack_bits for st in states], dtype=torch.int64, device=self.device)
            apply_stack_mask_inplace(logits, dtable, stable, grammar_state, depth, bits, budget,
                                     item_row(itable, grammar_state, items) if itable else None)
            budget = stack_remaining(depth, budget)
        budget = constrain_items(logits, dtable, itable, grammar_state, counters, items, budget)
        out = sample(logits, dtable, grammar_state, params, remaining=budget,
                     return_unmasked_logprobs=want_unmasked, check=self.check_kernel_inputs, counters=counters)
        tokens = out.tokens
        mark = self._lap("sample_s", mark)
        # 4. advance grammars and counters
        is_constrained = grammar_state >= 0
        next_counters = next_items = next_stack = None
        if dtable is not None:
            moved = advance(torch.where(is_constrained & (tokens >= 0), grammar_state, -1), tokens.clamp_min(0),
                            dtable, check=False, counters=counters)
            nxt, fin_grammar = moved[0], moved[1]
            next_counters = moved[2].tolist() if counters is not None else None
            next_items = advance_items(itable, grammar_state, tokens, items) if itable else None
            if stable is not None:  # a token with a stack event: its outcome's state, stack and item counters
                over, depth, bits, next_items = advance_stack(stable, torch.where(is_constrained, grammar_state, -1),
                                                              tokens, depth, bits, itable, next_items)
                nxt = torch.where(over != -1, over, nxt)
                next_stack = (depth.tolist(), bits.tolist())
            next_items = next_items.tolist() if next_items is not None else None
            self._lap("advance_s", mark)
        else:
            nxt, fin_grammar = grammar_state, torch.zeros_like(is_constrained)
        # 5. finish rows (host lists: one transfer per tensor, not one per row)
        host = _StepHost(tokens.tolist(), out.logprobs.tolist(),
                         out.unmasked_logprobs.tolist() if want_unmasked else None, nxt.tolist(),
                         fin_grammar.tolist(), is_constrained.tolist(), next_counters, next_items, next_stack, steps,
                         offsets)
        now = time.perf_counter()
        return [self._commit_row(i, seq, st, sampled.forced[i], host, now)
                for i, (seq, st) in enumerate(zip(seqs, states, strict=True))]

    def _row_tensors(self, states: list[RequestState], dtable, offsets: dict[str, int], itable):
        """int32 [B] grammar states (concatenated table), remaining budgets, counters and item
        counters (None without counted strings / arrays), and each row's decode step (a list)."""
        device = self.device
        grammar_state = torch.tensor([offsets[st.table_key] + st.state if st.table_key is not None else -1
                                      for st in states], dtype=torch.int32, device=device)
        remaining = torch.tensor([st.sampling.max_tokens - len(st.generated) for st in states], dtype=torch.int32,
                                 device=device)
        counted = dtable is not None and dtable.has_counts
        counters = torch.tensor([st.counter for st in states], dtype=torch.int32, device=device) if counted else None
        items = torch.tensor([st.item_counter for st in states], dtype=torch.int32, device=device) if itable else None
        steps = [len(st.generated) - len(st.forced) for st in states]
        return grammar_state, remaining, counters, items, steps

    def _sampling_tensors(self, seqs: list[Sequence], states: list[RequestState], steps: list[int]) -> SamplingTensors:
        """The rows' sampling parameters; those fixed per request are built once per batch
        composition (a decode batch keeps it for many steps), the step counter every step."""
        key = tuple(seq.arrival for seq in seqs)  # unique per sequence; its sampling never changes
        if self._static_params is None or self._static_params[0] != key:
            self._static_params = (key, SamplingTensors.build(
                [float(st.sampling.temperature) for st in states], [st.sampling.top_k for st in states],
                [float(st.sampling.top_p) for st in states], [st.seed for st in states], steps, device=self.device))
        fixed = self._static_params[1]
        return SamplingTensors(fixed.temperature, fixed.top_k, fixed.top_p, fixed.seed,
                               torch.tensor(steps, dtype=torch.int64, device=self.device), fixed.use_top_k_top_p)

    def _commit_row(self, i: int, seq: Sequence, st: RequestState, forced_logits, host: _StepHost,
                    now: float) -> StepOutput:
        """Append row i's token (or fail the row), move its grammar state, finish it when done."""
        if st.sampling.unmasked_logprobs and st.forced and not st.unmasked_logprobs and forced_logits is not None:
            st.unmasked_logprobs = _forced_unmasked(forced_logits, st)
        token, constrained = host.tokens[i], host.constrained[i]
        if token < 0 or (constrained and host.next_states[i] == DEAD_STATE):
            st.error = (f"at step {host.steps[i]}, the grammar mask of state {st.state} allows no token" if token < 0
                        else f"at step {host.steps[i]}, token {token} is not allowed in grammar state {st.state}")
            self._finish(seq, "error")
            return StepOutput(seq.request_id, [], True, st, seq)
        st.generated.append(token)
        st.logprobs.append(host.logprobs[i])
        if host.unmasked is not None and st.sampling.unmasked_logprobs:
            st.unmasked_logprobs.append(host.unmasked[i])
        if st.first_token_s is None:
            st.first_token_s = now
        seq.token_ids.append(token)
        if constrained:
            st.state = host.next_states[i] - host.offsets[st.table_key]
            if host.counters is not None:
                st.counter = int(host.counters[i])
            if host.items is not None:
                st.item_counter = tuple(host.items[i])
            if host.stack is not None:
                st.stack_depth, st.stack_bits = int(host.stack[0][i]), int(host.stack[1][i])
            done_by_stop = bool(host.finished[i])
        else:
            done_by_stop = token in st.stop_ids
        if done_by_stop:
            st.by_stop = True
            self._finish(seq, "stop")
        elif len(st.generated) >= st.sampling.max_tokens:
            # a constrained row whose budget ends in an accepting state holds a complete call
            complete = constrained and bool(self.grammars.tables[st.table_key].accept[st.state])
            self._finish(seq, "stop" if complete else "length")
        return StepOutput(seq.request_id, [token], st.finish_reason is not None, st, seq)

    def _clock(self) -> float:
        if self.device.type == "cuda":  # the step syncs anyway (its tokens go to the host)
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _lap(self, name: str, since: float) -> float:
        now = self._clock()
        self.timings[name] += now - since
        return now

    def _finish(self, seq: Sequence, reason: str) -> None:
        st = seq.payload
        if st.finish_reason is None:
            st.finish_reason = reason
            st.finished_s = time.perf_counter()
        self.scheduler.finish(seq)
        if self.requests.pop(seq.request_id, None) is not None and st.table_key is not None:
            self.grammars.release(st.table_key)

    # --- offline ---------------------------------------------------------------------------
    def run_to_completion(self) -> None:
        while self.has_unfinished:
            self.step()

    def stats(self) -> dict:
        return {"num_steps": self.num_steps, "num_preemptions": self.num_preemptions,
                "prefix_hit_rate": self.blocks.stats.hit_rate, "prefix_hit_tokens": self.blocks.stats.hit_tokens,
                "prefix_queried_tokens": self.blocks.stats.queried_tokens, "free_blocks": self.blocks.num_free,
                "num_blocks": self.blocks.num_blocks}


def _forced_unmasked(logits: torch.Tensor, st: RequestState) -> list[float]:
    """Unmasked logprobs of the forced ids from the logits that predicted them ([keep, V])."""
    n = len(st.forced)
    temp = st.sampling.temperature or 1.0
    lp = torch.log_softmax(logits[-1 - n : -1] / temp, dim=-1)
    return [float(lp[i, t]) for i, t in enumerate(st.forced)]


def _view_key(work: Work) -> tuple:
    """Names a sequence's row in the cache's dense decode views (a recomputed one is a new row)."""
    return (work.seq.request_id, work.seq.arrival, work.seq.num_preemptions)


def _step_inputs(works: list[Work], block_size: int, pad_id: int, pad_slot: int, trash_slot: int):
    """numpy int64 (ids [B, q], query positions [B, q] (-1: padding), write slots [B, q], read
    slots [B, L]) and the bool attention mask [B, q, L] of one forward, queries left-padded.

    Built on the host in numpy: ~25 torch ops on a few rows cost more than the decode step's model.
    """
    batch, bs = len(works), block_size
    q = max(w.end - w.start for w in works)
    length = max(w.end for w in works)
    table_w = max(len(w.seq.block_table) for w in works)
    tables = np.zeros((batch, table_w), dtype=np.int64)
    for b, w in enumerate(works):
        tables[b, : len(w.seq.block_table)] = w.seq.block_table
    ends = np.fromiter((w.end for w in works), dtype=np.int64, count=batch)
    kpos = np.arange(length)
    valid_key = kpos[None, :] < ends[:, None]
    read = tables[:, np.minimum(kpos // bs, table_w - 1)] * bs + kpos % bs
    read = np.where(valid_key, read, pad_slot)
    if q == 1:  # a decode step: one real query per row, at its last position (it sees every valid key)
        ids = np.array([[w.seq.token_ids[w.start]] for w in works], dtype=np.int64)
        qpos = (ends - 1)[:, None]
        write = np.array([[w.seq.block_table[w.start // bs] * bs + w.start % bs] for w in works], dtype=np.int64)
        return ids, qpos, write, read, valid_key[:, None, :]
    ids = np.full((batch, q), pad_id, dtype=np.int64)
    qpos = np.full((batch, q), -1, dtype=np.int64)
    for b, w in enumerate(works):
        n = w.end - w.start
        ids[b, q - n:] = w.seq.token_ids[w.start:w.end]
        qpos[b, q - n:] = np.arange(w.start, w.end)
    real_q = qpos >= 0
    at = np.maximum(qpos, 0)
    write = np.where(real_q, np.take_along_axis(tables, at // bs, 1) * bs + at % bs, trash_slot)
    allowed = (kpos[None, None, :] <= qpos[:, :, None]) & valid_key[:, None, :]  # [B, q, L] causal per row
    allowed[:, :, 0] |= ~real_q  # padding queries see one key: no fully masked row (no NaN)
    return ids, qpos, write, read, allowed
