"""The decode step as one static-shape function: forward -> items -> mask + sample -> advance -> finish codes.

Per bucket (padded batch in BATCH_BUCKETS, key length, sampling variant, live tables) it keeps static
buffers: an int64 input block (token, position, state, counters, budget, sampling params, seed/step,
stop ids, block table per row) and an int32 output block. `device_step` maps one to the other with
no host sync and no data-dependent shape (slot maps, mask, RNG keys in the sampler kernel, stop and
budget rules all stay tensors); on CUDA it is captured once per bucket (side-stream warm-up, one
memory pool) and replayed, on CPU run eagerly on the same buffers. Padding rows (position -1) write
only the trash slot. It gathers every row's K/V each step (no dense views) and leaves prefill to the
eager step. A fresh graph's first replay is compared with the warm-up's eager outputs of the same
inputs; a difference turns graphs off with a warning. STATUS: the CUDA capture is UNVERIFIED until a GPU run; benchmarks/gpu/gpu_check_graph.sh
checks replay == eager tokens, the `-m gpu` tests, and step time eager vs graph, free vs constrained.
"""

from __future__ import annotations

import itertools
import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from surecall.core.masks import attention_mask
from surecall.kernels import DEAD_STATE, SamplingTensors, advance, sample
from surecall.kernels._triton import HAS_TRITON, INTERPRET
from surecall.kernels.items import (
    MAX_ITEM_DEPTH,
    advance_items,
    apply_item_mask_inplace,
    item_row,
    sample_remaining,
)
from surecall.kernels.stack import advance_stack, apply_stack_mask_inplace, stack_remaining

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
MIN_KEY_BUCKET = 256  # key lengths are bucketed in powers of two from here (each a captured graph)
MAX_STOP_IDS = 8  # stop ids per free row a graph checks; a row with more takes the eager step
MAX_GRAPHS = 64  # captured buckets kept (least recently used out; their memory goes back to the pool)
# padded rows x key length a bucket may gather per layer and step; past it the eager step (dense views) runs
MAX_BUCKET_KEYS = 1 << 20
# input columns (int64); float32 values travel as their int32 bits
TOKEN, POS, STATE, COUNTER, ITEM = range(5)  # ITEM: MAX_ITEM_DEPTH columns, a row's stack of item counters
STACK_DEPTH, STACK_BITS = ITEM + MAX_ITEM_DEPTH, ITEM + MAX_ITEM_DEPTH + 1  # a row's bracket stack
REMAINING, TEMP, TOP_K, TOP_P, SEED, STEP, STOPS = range(STACK_BITS + 1, STACK_BITS + 8)
TABLE = STOPS + MAX_STOP_IDS
# output columns (int32)
OUT_TOKEN, OUT_LOGPROB, OUT_UNMASKED, OUT_STATE, OUT_COUNTER, OUT_ITEM = range(6)  # OUT_ITEM: MAX_ITEM_DEPTH columns
OUT_DEPTH = OUT_ITEM + MAX_ITEM_DEPTH
OUT_BITS_LO, OUT_BITS_HI = OUT_DEPTH + 1, OUT_DEPTH + 2  # the kind bits' two 32-bit halves
OUT_STATUS = OUT_BITS_HI + 1
NUM_OUT = OUT_STATUS + 2
# finish codes in OUT_STATUS
GOES_ON, STOPPED, COMPLETE_AT_BUDGET, LENGTH, NO_TOKEN, DEAD = range(6)


@dataclass(frozen=True)
class BucketKey:
    batch: int  # padded rows
    num_keys: int  # L_cap: key positions every row attends over (a multiple of the block size)
    use_sort: bool  # top-k/top-p in the batch (the sort path)
    want_unmasked: bool
    table_id: int  # id() of the live DeviceTable (0: none); the bucket holds it, so the id stays unique
    items_id: int
    stack_id: int


class _Bucket:
    """Static buffers of one bucket, and its graph once captured."""

    def __init__(self, key: BucketKey, table, items, stack, block_size: int, device: torch.device):
        self.key, self.table, self.items, self.stack = key, table, items, stack
        pin = device.type == "cuda"
        self.inputs = torch.zeros((key.batch, TABLE + key.num_keys // block_size), dtype=torch.int64, device=device)
        self.outputs = torch.zeros((key.batch, NUM_OUT), dtype=torch.int32, device=device)
        self.host_in = torch.zeros(self.inputs.shape, dtype=torch.int64, pin_memory=pin)
        self.host_out = torch.zeros(self.outputs.shape, dtype=torch.int32, pin_memory=pin)
        kpos = torch.arange(key.num_keys, device=device)
        self.kpos, self.kblock, self.koffset = kpos[None, :], (kpos // block_size)[None, :], (kpos % block_size)[None, :]
        self.graph = None
        self.check = None  # after capture: the eager outputs of the same inputs, until the first replay


def backend_for(device: torch.device) -> str:
    """The kernels' backend inside the step: Triton on CUDA and under TRITON_INTERPRET (the code that
    is captured), else the torch paths (same tokens)."""
    return "triton" if HAS_TRITON and (device.type == "cuda" or INTERPRET) else "torch"


class GraphStep:
    """Decode-only steps of an EngineCore on static buffers; captured per bucket on CUDA."""

    def __init__(self, core, capture: bool | None = None):
        self.core = core
        self.device = core.device
        self.capture = (self.device.type == "cuda") if capture is None else capture
        self.backend = backend_for(self.device)
        self.block_size = core.blocks.block_size
        bs = self.block_size
        self.max_keys = -(-core.max_model_len // bs) * bs
        self.buckets: OrderedDict[BucketKey, _Bucket] = OrderedDict()
        self.pool = None
        self.num_captures = self.num_replays = self.num_eager = 0
        self.capture_s = 0.0

    # --- which steps it takes -----------------------------------------------------------------
    def fits(self, works) -> bool:
        """A decode-only batch this step runs (else the eager step does)."""
        if not works or len(works) > BATCH_BUCKETS[-1] or self.core.check_kernel_inputs:
            return False
        if not all(len(w.seq.payload.stop_ids) <= MAX_STOP_IDS and w.end - w.start == 1 for w in works):
            return False
        batch, keys = self._sizes(works)
        return batch * keys <= MAX_BUCKET_KEYS

    def _sizes(self, works) -> tuple[int, int]:
        """(padded rows, key length) of the bucket `works` go to."""
        batch = next(b for b in BATCH_BUCKETS if b >= len(works))
        longest = max(w.end for w in works)
        keys = MIN_KEY_BUCKET
        while keys < longest:
            keys *= 2
        return batch, min(-(-keys // self.block_size) * self.block_size, self.max_keys)

    def bucket_key(self, works, table, items, stack=None) -> BucketKey:
        batch, keys = self._sizes(works)
        states = [w.seq.payload for w in works]
        use_sort = any(st.sampling.top_k > 0 or st.sampling.top_p < 1.0 for st in states)
        want_unmasked = any(st.sampling.unmasked_logprobs for st in states)
        return BucketKey(batch, keys, use_sort, want_unmasked, id(table) if table is not None else 0,
                         id(items) if items is not None else 0, id(stack) if stack is not None else 0)

    # --- one step -----------------------------------------------------------------------------
    def step(self, works) -> list:
        """Run `works` (decode rows) through the bucket's step; the engine's StepOutputs."""
        core = self.core
        table, offsets = core.grammars.current()
        items, stack = core.grammars.item_table, core.grammars.stack_table
        bucket = self._bucket(self.bucket_key(works, table, items, stack), table, items, stack)
        pack_inputs(bucket.host_in.numpy(), works, offsets)
        bucket.inputs.copy_(bucket.host_in, non_blocking=True)
        self._run(bucket)
        bucket.host_out.copy_(bucket.outputs, non_blocking=True)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()  # the step's one sync: its tokens
        return apply_results(core, works, bucket.host_out.numpy(), offsets, table, items, bucket.key.want_unmasked,
                             stack)

    def _bucket(self, key: BucketKey, table, items, stack=None) -> _Bucket:
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = _Bucket(key, table, items, stack, self.block_size, self.device)
            self.buckets[key] = bucket
            while len(self.buckets) > MAX_GRAPHS:
                self.buckets.popitem(last=False)
        self.buckets.move_to_end(key)
        return bucket

    def _run(self, bucket: _Bucket) -> None:
        if not self.capture:
            self.num_eager += 1
            self.device_step(bucket)
            return
        if bucket.graph is None:
            try:
                self._capture(bucket)
            except Exception as exc:  # noqa: BLE001 - a model or kernel that cannot be captured still runs
                warnings.warn(f"CUDA graph capture of the decode step failed ({type(exc).__name__}: {exc}); "
                              "running the same step eagerly from now on", RuntimeWarning, stacklevel=2)
                self.capture = False
                self.buckets.clear()
                self.num_eager += 1
                self.device_step(bucket)  # the warm-up's K/V writes are this step's: running it again is safe
                return
        bucket.graph.replay()
        self.num_replays += 1
        if bucket.check is not None:
            self._check_first_replay(bucket)

    def _check_first_replay(self, bucket: _Bucket) -> None:
        """A fresh graph's first replay against the warm-up's eager outputs of the same inputs.

        Tokens, states, counters and finish codes must be equal, logprobs within 1e-4; otherwise the
        graphs go off (with a warning) and the eager result is the step's."""
        eager, bucket.check = bucket.check, None
        got = bucket.outputs
        exact = [OUT_TOKEN, OUT_STATE, OUT_COUNTER, *range(OUT_ITEM, OUT_STATUS + 1)]
        same = torch.equal(got[:, exact], eager[:, exact]) and all(
            torch.allclose(got[:, c].view(torch.float32), eager[:, c].view(torch.float32), atol=1e-4, equal_nan=True)
            for c in (OUT_LOGPROB, OUT_UNMASKED))
        if not same:
            warnings.warn("the captured decode step's first replay differs from the same step run eagerly; "
                          "running the step eagerly from now on", RuntimeWarning, stacklevel=3)
            self.capture = False
            self.buckets.clear()
            got.copy_(eager)

    def _capture(self, bucket: _Bucket) -> None:
        """Warm up on a side stream (Triton compiles, the allocator settles), then capture."""
        start = time.perf_counter()
        # The warm-up runs the real inputs: it writes the same K/V into the same slots as the replay.
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self.device_step(bucket)
        torch.cuda.current_stream(self.device).wait_stream(side)
        bucket.check = bucket.outputs.clone()  # the eager result the first replay must equal
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.device_step(bucket)
        bucket.graph = graph
        self.num_captures += 1
        self.capture_s += time.perf_counter() - start

    # --- the captured function --------------------------------------------------------------
    def device_step(self, bucket: _Bucket) -> None:
        """bucket.inputs -> bucket.outputs with device ops only (what the CUDA graph holds)."""
        logits = self._forward(bucket)  # 1-2. slot maps and mask, forward over the paged cache
        tokens, logprobs, unmasked, nxt, fin_grammar, counters, items, depth, bits = self._sample_and_advance(
            bucket, logits)
        status = self._finish_codes(bucket, tokens, nxt, fin_grammar)  # 4. stop / budget / error rules
        low, high = (bits & 0xFFFFFFFF).to(torch.int32), (bits >> 32).to(torch.int32)  # read back as one int64
        columns = (tokens.to(torch.int32), logprobs.view(torch.int32), unmasked.view(torch.int32), nxt,
                   counters, *items.unbind(1), depth, low, high, status.to(torch.int32),
                   torch.zeros_like(nxt))
        bucket.outputs.copy_(torch.stack(columns, dim=1))  # 5. one output block

    def _forward(self, bucket: _Bucket) -> torch.Tensor:
        """Logits [B, V] float32 of each row's next token (padding rows: pad keys only, trash writes)."""
        core, inp, bs = self.core, bucket.inputs, self.block_size
        pos = inp[:, POS]
        real = pos >= 0
        at = pos.clamp_min(0)
        tables = inp[:, TABLE:]
        write = torch.where(real, tables.gather(1, (at // bs)[:, None])[:, 0] * bs + at % bs, core.kv.trash_slot)
        valid = (bucket.kpos <= at[:, None]) & real[:, None]
        read = tables.gather(1, bucket.kblock.expand(bucket.key.batch, -1)) * bs + bucket.koffset
        read = torch.where(valid, read, core.kv.pad_slot)
        allowed = (valid | ((bucket.kpos == 0) & ~real[:, None]))[:, None, :]  # padding rows see one key
        qpos = torch.where(real, pos, -1)[:, None]
        mask = attention_mask(allowed, bucket.kpos, qpos, core.model.config, core.is_sdpa, core.kv.k[0].dtype)
        core.kv.bind_static(write, read)
        try:
            out = core.model(input_ids=inp[:, TOKEN:TOKEN + 1], attention_mask=mask, position_ids=at[:, None],
                             logits_to_keep=1, use_cache=True, **{core.keyword: core.kv})
        finally:
            core.kv.unbind()
        return out.logits[:, -1, :].float()

    def _sample_and_advance(self, bucket: _Bucket, logits: torch.Tensor):
        """3. item mask, mask + sample, advance: (tokens, logprobs, unmasked, next states, grammar
        finished, next counters, next item counters, stack depths, stack bits), all [B] (the item
        counters [B, MAX_ITEM_DEPTH])."""
        inp, table, items, stack, key = bucket.inputs, bucket.table, bucket.items, bucket.stack, bucket.key
        states = inp[:, STATE].to(torch.int32)
        counters = inp[:, COUNTER].to(torch.int32)
        item_counters = inp[:, ITEM : ITEM + MAX_ITEM_DEPTH].to(torch.int32).contiguous()
        counted = counters if table is not None and table.has_counts else None
        params = SamplingTensors(_floats(inp[:, TEMP]), inp[:, TOP_K].to(torch.int32), _floats(inp[:, TOP_P]),
                                 inp[:, SEED].contiguous(), inp[:, STEP].contiguous(), use_top_k_top_p=key.use_sort)
        budget = inp[:, REMAINING].to(torch.int32).clamp_min(1)
        depth = inp[:, STACK_DEPTH].to(torch.int32).contiguous()
        bits = inp[:, STACK_BITS].contiguous()
        if stack is not None and table is not None:
            need = item_row(items, states, item_counters) if items is not None else None
            apply_stack_mask_inplace(logits, table, stack, states, depth, bits, budget, need, backend=self.backend)
            budget = stack_remaining(depth, budget)
        if items is not None and table is not None:
            apply_item_mask_inplace(logits, table, items, states, item_counters, budget, counters=counted,
                                    backend=self.backend)
            budget = sample_remaining(items, states, budget)
        drawn = sample(logits, table, states if table is not None else None, params, remaining=budget,
                       return_unmasked_logprobs=key.want_unmasked, check=False, backend=self.backend,
                       counters=counted, sync_free=True)
        tokens = drawn.tokens
        unmasked = drawn.unmasked_logprobs if drawn.unmasked_logprobs is not None else drawn.logprobs
        if table is None:
            return tokens, drawn.logprobs, unmasked, states, torch.zeros_like(states, dtype=torch.bool), counters, \
                item_counters, depth, bits
        moved = advance(torch.where((states >= 0) & (tokens >= 0), states, -1), tokens.clamp_min(0), table,
                        check=False, backend=self.backend, counters=counted)
        next_counters = moved[2] if counted is not None else counters
        next_items = advance_items(items, states, tokens, item_counters) if items is not None else item_counters
        nxt = moved[0]
        if stack is not None:
            over, depth, bits, next_items = advance_stack(stack, states, tokens, depth, bits, items, next_items)
            nxt = torch.where(over != -1, over, nxt)
        return tokens, drawn.logprobs, unmasked, nxt, moved[1], next_counters, next_items, depth, bits

    def _finish_codes(self, bucket: _Bucket, tokens, nxt, fin_grammar) -> torch.Tensor:
        """Each row's finish code, in the eager step's order: no token, dead state, stop, budget."""
        inp, table = bucket.inputs, bucket.table
        is_constrained = inp[:, STATE] >= 0
        is_stop = (tokens[:, None] == inp[:, STOPS:TABLE]).any(dim=1)
        by_stop = torch.where(is_constrained, fin_grammar, is_stop)
        accepts = table.accept[nxt.clamp_min(0).long()] if table is not None else torch.zeros_like(is_constrained)
        at_budget = inp[:, REMAINING] <= 1
        status = torch.where(at_budget, torch.where(is_constrained & accepts, COMPLETE_AT_BUDGET, LENGTH), GOES_ON)
        status = torch.where(by_stop, STOPPED, status)
        status = torch.where(is_constrained & (nxt == DEAD_STATE), DEAD, status)
        return torch.where(tokens < 0, NO_TOKEN, status)


def _floats(column: torch.Tensor) -> torch.Tensor:
    """float32 values sent as their int32 bits in an int64 column."""
    return column.to(torch.int32).view(torch.float32)


def pack_inputs(host: np.ndarray, works, offsets: dict) -> None:
    """Fill the host input block [B, C] for `works`; rows past them are padding (position -1).

    Column by column from Python lists (perf: per-element numpy stores cost ~5x more at batch 512).
    """
    n = len(works)
    seqs = [w.seq for w in works]
    states = [seq.payload for seq in seqs]
    host[:] = 0
    host[n:, POS] = -1
    host[:, STATE] = -1
    host[:, REMAINING] = 1
    host[:, STOPS:TABLE] = -1
    host[:n, TOKEN] = [seq.token_ids[w.start] for seq, w in zip(seqs, works, strict=True)]
    host[:n, POS] = [w.start for w in works]
    host[:n, STATE] = [offsets[st.table_key] + st.state if st.table_key is not None else -1 for st in states]
    host[:n, COUNTER] = [st.counter for st in states]
    host[:n, ITEM : ITEM + MAX_ITEM_DEPTH] = [st.item_counter for st in states]
    host[:n, STACK_DEPTH] = [st.stack_depth for st in states]
    host[:n, STACK_BITS] = [st.stack_bits for st in states]
    host[:n, REMAINING] = [st.sampling.max_tokens - len(st.generated) for st in states]
    host[:n, TEMP] = np.array([st.sampling.temperature for st in states], dtype=np.float32).view(np.int32)
    host[:n, TOP_K] = [st.sampling.top_k for st in states]
    host[:n, TOP_P] = np.array([st.sampling.top_p for st in states], dtype=np.float32).view(np.int32)
    host[:n, SEED] = [st.seed for st in states]
    host[:n, STEP] = [len(st.generated) - len(st.forced) for st in states]
    _fill_ragged(host, STOPS, [list(st.stop_ids) for st in states])
    width = host.shape[1] - TABLE
    _fill_ragged(host, TABLE, [seq.block_table[:width] for seq in seqs])


def _fill_ragged(host: np.ndarray, column: int, rows: list[list[int]]) -> None:
    """host[b, column : column + len(rows[b])] = rows[b] for every b, in one scatter."""
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=int(lengths.sum()))
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    host[np.repeat(np.arange(len(rows)), lengths), column + np.arange(flat.shape[0]) - starts] = flat


def apply_results(core, works, out: np.ndarray, offsets: dict, table, items, want_unmasked: bool,
                  stack=None) -> list:
    """The eager step's bookkeeping from the output block: tokens appended, states moved, rows finished."""
    from surecall.core.engine import StepOutput

    logprobs = out[:, OUT_LOGPROB].view(np.float32)
    unmasked = out[:, OUT_UNMASKED].view(np.float32)
    counted = table is not None and table.has_counts
    now = time.perf_counter()
    outputs = []
    for i, work in enumerate(works):
        seq, st = work.seq, work.seq.payload
        seq.num_computed = work.end
        core.blocks.register_full(seq.block_table, seq.token_ids, seq.num_computed, seq.block_hashes)
        token, status = int(out[i, OUT_TOKEN]), int(out[i, OUT_STATUS])
        step = len(st.generated) - len(st.forced)
        if status in (NO_TOKEN, DEAD):
            st.error = (f"at step {step}, the grammar mask of state {st.state} allows no token" if status == NO_TOKEN
                        else f"at step {step}, token {token} is not allowed in grammar state {st.state}")
            core._finish(seq, "error")
            outputs.append(StepOutput(seq.request_id, [], True, st, seq))
            continue
        st.generated.append(token)
        st.logprobs.append(float(logprobs[i]))
        if want_unmasked and st.sampling.unmasked_logprobs:
            st.unmasked_logprobs.append(float(unmasked[i]))
        if st.first_token_s is None:
            st.first_token_s = now
        seq.token_ids.append(token)
        if st.table_key is not None:
            st.state = int(out[i, OUT_STATE]) - offsets[st.table_key]
            if counted:
                st.counter = int(out[i, OUT_COUNTER])
            if items is not None:
                st.item_counter = tuple(int(k) for k in out[i, OUT_ITEM : OUT_ITEM + MAX_ITEM_DEPTH])
            if stack is not None:
                st.stack_depth = int(out[i, OUT_DEPTH])
                st.stack_bits = int(out[i, OUT_BITS_LO : OUT_BITS_HI + 1].view(np.int64)[0])
        if status == STOPPED:
            st.by_stop = True
            core._finish(seq, "stop")
        elif status in (COMPLETE_AT_BUDGET, LENGTH):
            core._finish(seq, "stop" if status == COMPLETE_AT_BUDGET else "length")
        outputs.append(StepOutput(seq.request_id, [token], st.finish_reason is not None, st, seq))
    return outputs
