"""The static-shape decode step: a preallocated KV cache per batch bucket, captured in a CUDA graph.

A bucket is a (padded batch, cache length) pair. It owns a transformers cache of plain
`StaticLayer`s (K/V tensors at fixed addresses), a token, position and 4D attention-mask buffer,
and on CUDA one `torch.cuda.CUDAGraph` of the model's one-token forward. A decode step copies the
new tokens in, opens one mask column, replays the graph and returns a view of its logits: a few
hundred kernel launches become one. Buckets are reused across `generate` calls (the cache is
reset, never reallocated, so the captured addresses stay valid). On CPU the same bucket runs
the forward eagerly, which is how the tests check it against the dynamic cache.
It does not sample or mask (that stays outside the graph, in `decode.py`, because each batch
brings its own grammar table), and it does not decide eligibility: `ModelRunner` does.
"""

# Adapted from the CUDA-graph decode idea in https://pytorch.org/blog/accelerating-generative-ai-2/
# (static KV cache + graph replay); the code is ours.

from __future__ import annotations

import time
from collections import OrderedDict

import torch

# Powers of two with a step between each from 8 on: a batch of 8+ rows is padded by less than half.
BATCH_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
CACHE_LEN_STEP = 256  # cache lengths are rounded up to a multiple of this (fewer distinct graphs)
MAX_BUCKETS = 4  # buckets kept alive (each holds a full KV cache); least recently used is dropped


def batch_bucket(batch: int) -> int:
    """The smallest bucket holding `batch` rows (the batch itself above the largest bucket)."""
    return next((size for size in BATCH_BUCKETS if size >= batch), batch)


def cache_bucket(needed: int, max_positions: int) -> int:
    """`needed` rounded up to a multiple of CACHE_LEN_STEP, without passing the model's positions."""
    rounded = -(-needed // CACHE_LEN_STEP) * CACHE_LEN_STEP
    return max(needed, min(rounded, max_positions))


def dynamic_cache(model):
    """A transformers cache that grows per step (the prefix pass here, the runner's dynamic path)."""
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)
    except TypeError:  # older transformers: no config argument
        return DynamicCache()


def static_layers(num_layers: int, max_cache_len: int):
    """A transformers cache of plain static layers (full attention, tensor write counter)."""
    from transformers.cache_utils import Cache, StaticLayer

    return Cache(layers=[StaticLayer(max_cache_len=max_cache_len) for _ in range(num_layers)])


class StaticBucket:
    """One (batch, cache length) bucket: preallocated cache and buffers, optionally a CUDA graph."""

    def __init__(self, runner, batch: int, cache_len: int):
        self.runner = runner
        self.batch, self.cache_len = batch, cache_len
        device = runner.device
        self.cache = static_layers(runner.num_layers, cache_len)
        self.kwarg = runner.cache_keyword  # the forward's name for the cache argument
        self.tokens = torch.zeros((batch, 1), dtype=torch.long, device=device)
        self.positions = torch.zeros((batch, 1), dtype=torch.long, device=device)
        self.bool_mask = runner.attn_is_sdpa
        dtype = torch.bool if self.bool_mask else runner.param_dtype
        self.mask = torch.zeros((batch, 1, 1, cache_len), dtype=dtype, device=device)
        self.graph = None
        self.use_graph = False  # replay the graph (set per run by the runner) or run the forward eagerly
        self.graph_error: str | None = None  # why capture failed (the bucket then runs eagerly)
        self.logits: torch.Tensor | None = None  # the graph's output buffer
        self.column = 0  # next cache column to open in the mask

    # --- per run ---------------------------------------------------------------------------
    def prefill(self, input_ids, attention_mask, num_last: int, shared_prefix: int = 0) -> torch.Tensor:
        """Reset the cache, run the prompt through it, set up the decode buffers.

        `shared_prefix` > 0: the first tokens of every row's prompt are the same (a system prompt
        with the tools, say); they are run once, for one row, and copied into every row's cache,
        and only the rest of each prompt is prefilled per row. The cache layout is then
        [shared prefix][left padding][row's own tokens], positions counting real tokens only.
        """
        rows, length = input_ids.shape
        device = self.runner.device
        self.cache.reset()
        if shared_prefix > 0:  # every row keeps its last `num_last` tokens in the per-row pass
            shared_prefix = min(shared_prefix, int(attention_mask.sum(-1).min()) - num_last)
        if shared_prefix > 0:
            ids, attn, offset = self._prefill_shared(input_ids, attention_mask, shared_prefix)
        else:
            ids = torch.zeros((self.batch, length), dtype=torch.long, device=device)
            attn = torch.zeros((self.batch, length), dtype=torch.long, device=device)
            ids[:rows], attn[:rows] = input_ids, attention_mask
            offset = 0
        attn[rows:, -1] = 1  # padding rows hold one real token, so no query row is fully masked
        positions = offset + (attn[:, offset:].cumsum(-1) - 1).clamp_min(0)
        out = self.runner.model(input_ids=ids[:, offset:], attention_mask=attn, position_ids=positions,
                                logits_to_keep=num_last, use_cache=True, **{self.kwarg: self.cache})
        self._set_mask(attn.bool())
        self.positions.copy_(positions[:, -1:] + 1)
        self.column = attn.shape[1]
        return out.logits[:rows, -num_last:, :].float()

    def _prefill_shared(self, input_ids, attention_mask, shared: int):
        """Run the shared prefix once and copy its K/V into every row; the per-row part's inputs."""
        rows, length = input_ids.shape
        device = self.runner.device
        lengths = attention_mask.sum(-1)
        first = int(length - lengths[0])  # row 0's first real column
        prefix = input_ids[:1, first : first + shared]
        scratch = dynamic_cache(self.runner.model)
        self.runner.model(input_ids=prefix, position_ids=torch.arange(shared, device=device)[None],
                          use_cache=True, **{self.kwarg: scratch})
        for mine, theirs in zip(self.cache.layers, scratch.layers, strict=True):
            _ensure_initialized(mine, theirs.keys, theirs.values, self.batch)
            mine.keys[:, :, :shared] = theirs.keys
            mine.values[:, :, :shared] = theirs.values
            mine.cumulative_length.fill_(shared)
        own = length - shared - int(length - lengths.max())  # the widest row's own part
        ids = torch.zeros((self.batch, shared + own), dtype=torch.long, device=device)
        attn = torch.zeros((self.batch, shared + own), dtype=torch.long, device=device)
        attn[:, :shared] = 1
        ids[:rows, shared:] = input_ids[:, length - own :]
        mine_cols = torch.arange(own, device=device)[None, :] >= (own - (lengths - shared))[:, None]
        attn[:rows, shared:] = mine_cols.long()
        return ids, attn, shared

    def adopt(self, source: StaticBucket, rows: torch.Tensor) -> None:
        """Take over `rows` of another bucket of the same cache length (batch compaction).

        Rows past len(rows) become padding: one visible column each, so no query is fully masked.
        """
        n = rows.numel()
        for mine, theirs in zip(self.cache.layers, source.cache.layers, strict=True):
            _ensure_initialized(mine, theirs.keys, theirs.values, self.batch)
            mine.keys[:n] = theirs.keys[rows]
            mine.values[:n] = theirs.values[rows]
            mine.cumulative_length.copy_(theirs.cumulative_length)
        self._set_mask(torch.zeros((self.batch, 1), dtype=torch.bool, device=self.mask.device).fill_(True))
        self.mask[:n] = source.mask[rows]
        self.positions.zero_()
        self.positions[:n] = source.positions[rows]
        self.column = source.column

    def _set_mask(self, keep: torch.Tensor) -> None:
        if self.bool_mask:
            self.mask.zero_()
            self.mask[:, 0, 0, : keep.shape[1]] = keep
        else:
            low = torch.finfo(self.mask.dtype).min
            self.mask.fill_(low)
            self.mask[:, 0, 0, : keep.shape[1]].masked_fill_(keep, 0.0)

    def _open_column(self) -> None:
        self.mask[:, 0, 0, self.column] = True if self.bool_mask else 0.0
        self.column += 1

    def _forward(self) -> torch.Tensor:
        out = self.runner.model(input_ids=self.tokens, attention_mask=self.mask, position_ids=self.positions,
                                use_cache=True, **{self.kwarg: self.cache})
        return out.logits[:, -1, :].float()

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:  # tokens [rows] -> logits [rows, V] (a view)
        if self.column >= self.cache_len:
            raise RuntimeError(f"static cache of {self.cache_len} columns is full")  # the runner sizes it: a bug
        rows = tokens.shape[0]
        self.tokens[:rows, 0] = tokens
        self._open_column()
        if self.use_graph and self.graph is not None:
            self.graph.replay()
            logits = self.logits
        else:
            logits = self._forward()
        self.positions.add_(1)
        return logits[:rows]

    # --- capture -----------------------------------------------------------------------------
    def capture(self, warmup: int = 2) -> float:
        """Capture the one-token forward (CUDA only); returns the seconds it took.

        Warm-up runs write K/V at the next cache column and advance the layers' write counters;
        both are undone (counters restored, the column is rewritten by the first real step).
        """
        start = time.perf_counter()
        counters = [layer.cumulative_length.clone() for layer in self.cache.layers]
        mask_before = self.mask.clone()
        self.mask[:, 0, 0, self.column] = True if self.bool_mask else 0.0
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(warmup):
                    self._forward()
                    self._restore(counters)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):  # its own memory pool: buckets never share intermediates
                self.logits = self._forward()
            self.graph = graph
        except RuntimeError as exc:  # capture is best effort: the bucket keeps running eagerly
            self.graph, self.logits = None, None
            self.graph_error = f"{type(exc).__name__}: {exc}"
        finally:
            self._restore(counters)
            self.mask.copy_(mask_before)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    def _restore(self, counters) -> None:
        for layer, saved in zip(self.cache.layers, counters, strict=True):
            layer.cumulative_length.copy_(saved)


def _ensure_initialized(layer, keys: torch.Tensor, values: torch.Tensor, batch: int) -> None:
    """Allocate a static layer's K/V for `batch` rows shaped like `keys`/`values` (heads, head dim)."""
    if not layer.is_initialized:
        layer.lazy_initialization(keys.new_empty((batch, keys.shape[1], 1, keys.shape[-1])),
                                  values.new_empty((batch, values.shape[1], 1, values.shape[-1])))


class BucketPool:
    """The live buckets of one runner, least recently used first out."""

    def __init__(self, limit: int = MAX_BUCKETS):
        self.limit = limit
        self.buckets: OrderedDict[tuple[int, int], StaticBucket] = OrderedDict()

    def get(self, runner, batch: int, cache_len: int) -> StaticBucket:
        """The bucket for (batch, cache_len), created on first use."""
        key = (batch, cache_len)
        if key in self.buckets:
            self.buckets.move_to_end(key)
            return self.buckets[key]
        while len(self.buckets) >= self.limit:
            self.buckets.popitem(last=False)
        bucket = StaticBucket(runner, batch, cache_len)
        self.buckets[key] = bucket
        return bucket

    def clear(self) -> None:
        self.buckets.clear()
