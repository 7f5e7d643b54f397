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
from surecall.kernels.items import MAX_ITEM_DEPTH, ItemTable, advance_items, constrain_items


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
                self.device_table, self.offsets, self.item_table = None, {}, None
                return self.device_table, self.offsets
            tables = [self.tables[k] for k in keys]
            built = self._built.pop(keys, None)
            if built is None or any(a is not b for a, b in zip(built[2], tables, strict=True)):
                table, offsets = TokenTable.concat(tables) if len(tables) > 1 else (tables[0], [0])
                built = (DeviceTable.from_table(table, self.device),
                         {k: int(o) for k, o in zip(keys, offsets, strict=True)}, tuple(tables),
                         ItemTable.from_table(table, self.device) if table.has_items else None)
            self._built[keys] = built  # most recently used last
            while len(self._built) > MAX_DEVICE_TABLES:
                self._built.pop(next(iter(self._built)))
            self.device_table, self.offsets, self.item_table = built[0], built[1], built[3]
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

    def _forward_all(self, plan: Plan) -> list[tuple[Work, torch.Tensor, torch.Tensor | None]]:
        """Run the prefill chunks and the decodes; (work, last logits [V], forced-id logits or None) per sampling row."""
        sampled = []
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
                for b, work in enumerate(group):
                    work.seq.num_computed = work.end
                    self.blocks.register_full(work.seq.block_table, work.seq.token_ids, work.seq.num_computed,
                                             work.seq.block_hashes)
                    if work.samples:
                        sampled.append((work, logits[b, -1], logits[b] if keep > 1 else None))
                continue
            for work in group:  # plain: nothing is cached, so only rows that sample run the model
                work.seq.num_computed = work.end
            rows = [w for w in group if w.samples]
            if rows:
                logits = self._forward_plain(rows, keep)
                sampled += [(w, logits[b, -1], logits[b] if keep > 1 else None) for b, w in enumerate(rows)]
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
        device, bs = self.device, self.blocks.block_size
        q = max(w.end - w.start for w in works)
        length = max(w.end for w in works)
        batch = len(works)
        ids = torch.full((batch, q), self.pad_id, dtype=torch.long)
        qpos = torch.full((batch, q), -1, dtype=torch.long)
        table_w = max(len(w.seq.block_table) for w in works)
        tables = torch.zeros((batch, table_w), dtype=torch.long)
        ends = torch.tensor([w.end for w in works], dtype=torch.long)
        for b, w in enumerate(works):
            n = w.end - w.start
            ids[b, q - n:] = torch.tensor(w.seq.token_ids[w.start:w.end], dtype=torch.long)
            qpos[b, q - n:] = torch.arange(w.start, w.end)
            tables[b, : len(w.seq.block_table)] = torch.tensor(w.seq.block_table, dtype=torch.long)
        kpos = torch.arange(length)[None, :].expand(batch, length)
        valid_key = kpos < ends[:, None]
        read = torch.gather(tables, 1, (kpos // bs).clamp(max=table_w - 1)) * bs + kpos % bs
        read = torch.where(valid_key, read, self.kv.pad_slot)
        real_q = qpos >= 0
        write = torch.gather(tables, 1, (qpos.clamp_min(0) // bs)) * bs + qpos.clamp_min(0) % bs
        write = torch.where(real_q, write, self.kv.trash_slot)
        allowed = (kpos[:, None, :] <= qpos[:, :, None]) & valid_key[:, None, :]  # [B, q, L] causal per row
        allowed[:, :, 0] |= ~real_q  # padding queries see one key: no fully masked row (no NaN)
        mask = attention_mask(allowed.to(device), kpos.to(device), qpos.to(device), self.model.config, self.is_sdpa,
                              next(self.model.parameters()).dtype)  # causal, and the model's sliding window
        decode = all(w.end - w.start == 1 for w in works)
        self.kv.bind(write.reshape(-1).to(device), read.to(device),
                     decode_key=[_view_key(w) for w in works] if decode else None,
                     columns=[w.start for w in works] if decode else None)
        failed = True
        try:
            out = self.model(input_ids=ids.to(device), attention_mask=mask, position_ids=qpos.clamp_min(0).to(device),
                             logits_to_keep=keep, use_cache=True, **{self.keyword: self.kv})
            failed = False
        finally:
            self.kv.unbind(failed)
        return out.logits[:, -keep:, :].float()

    def _sample_and_advance(self, sampled) -> list[StepOutput]:
        if not sampled:
            return []
        device = self.device
        seqs = [w.seq for w, _, _ in sampled]
        states = [s.payload for s in seqs]
        logits = torch.stack([lg for _, lg, _ in sampled])
        dtable, offsets = self.grammars.current()
        grammar_state = torch.tensor([offsets[st.table_key] + st.state if st.table_key is not None else -1
                                      for st in states], dtype=torch.int32, device=device)
        steps = [len(st.generated) - len(st.forced) for st in states]
        remaining = torch.tensor([st.sampling.max_tokens - len(st.generated) for st in states], dtype=torch.int32,
                                 device=device)
        params = SamplingTensors.build([float(st.sampling.temperature) for st in states],
                                       [st.sampling.top_k for st in states], [float(st.sampling.top_p) for st in states],
                                       [st.seed for st in states], steps, device=device)
        want_unmasked = any(st.sampling.unmasked_logprobs for st in states)
        counted = dtable is not None and dtable.has_counts
        counters = torch.tensor([st.counter for st in states], dtype=torch.int32, device=device) if counted else None
        itable = self.grammars.item_table
        items = torch.tensor([st.item_counter for st in states], dtype=torch.int32, device=device) if itable else None
        mark = self._clock()
        budget = constrain_items(logits, dtable, itable, grammar_state, counters, items, remaining.clamp_min(1))
        out = sample(logits, dtable, grammar_state, params, remaining=budget,
                     return_unmasked_logprobs=want_unmasked, check=self.check_kernel_inputs, counters=counters)
        tokens = out.tokens
        mark = self._lap("sample_s", mark)
        is_constrained = grammar_state >= 0
        next_counters = next_items = None
        if dtable is not None:
            moved = advance(torch.where(is_constrained & (tokens >= 0), grammar_state, -1), tokens.clamp_min(0),
                            dtable, check=False, counters=counters)
            nxt, fin_grammar = moved[0], moved[1]
            next_counters = moved[2].tolist() if counted else None
            next_items = advance_items(itable, grammar_state, tokens, items).tolist() if itable else None
            self._lap("advance_s", mark)
        else:
            nxt, fin_grammar = grammar_state, torch.zeros_like(is_constrained)
        tok_h, lp_h = tokens.tolist(), out.logprobs.tolist()
        raw_h = out.unmasked_logprobs.tolist() if want_unmasked else None
        nxt_h, fin_h, cons_h = nxt.tolist(), fin_grammar.tolist(), is_constrained.tolist()
        now = time.perf_counter()
        outputs = []
        for i, (seq, st) in enumerate(zip(seqs, states, strict=True)):
            work, _, forced_logits = sampled[i]
            if st.sampling.unmasked_logprobs and st.forced and not st.unmasked_logprobs and forced_logits is not None:
                st.unmasked_logprobs = _forced_unmasked(forced_logits, st)
            token = tok_h[i]
            if token < 0:
                st.error = f"at step {steps[i]}, the grammar mask of state {st.state} allows no token"
                self._finish(seq, "error")
                outputs.append(StepOutput(seq.request_id, [], True, st, seq))
                continue
            if cons_h[i] and nxt_h[i] == DEAD_STATE:
                st.error = f"at step {steps[i]}, token {token} is not allowed in grammar state {st.state}"
                self._finish(seq, "error")
                outputs.append(StepOutput(seq.request_id, [], True, st, seq))
                continue
            st.generated.append(token)
            st.logprobs.append(lp_h[i])
            if raw_h is not None and st.sampling.unmasked_logprobs:
                st.unmasked_logprobs.append(raw_h[i])
            if st.first_token_s is None:
                st.first_token_s = now
            seq.token_ids.append(token)
            if cons_h[i]:
                st.state = nxt_h[i] - offsets[st.table_key]
                if next_counters is not None:
                    st.counter = int(next_counters[i])
                if next_items is not None:
                    st.item_counter = tuple(next_items[i])
                done_by_stop = bool(fin_h[i])
            else:
                done_by_stop = token in st.stop_ids
            if done_by_stop:
                st.by_stop = True
                self._finish(seq, "stop")
            elif len(st.generated) >= st.sampling.max_tokens:
                # a constrained row whose budget ends in an accepting state holds a complete call
                complete = cons_h[i] and bool(self.grammars.tables[st.table_key].accept[st.state])
                self._finish(seq, "stop" if complete else "length")
            outputs.append(StepOutput(seq.request_id, [token], st.finish_reason is not None, st, seq))
        return outputs

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
