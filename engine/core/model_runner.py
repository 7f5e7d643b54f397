"""ModelRunner: a Hugging Face causal LM behind two calls, `prefill` and `decode`.

Loads Llama (3.x rope scaling included), Qwen2, Qwen3 (dense and MoE) and Mistral family models
from a local directory (config.json + safetensors, never downloading) or wraps an already-built
`transformers` model. Prefill takes
left-padded prompts with an attention mask and explicit position ids; decode feeds one token
per row against the KV cache. Every line that touches the cache object lives in `_KVCache`, so
a transformers API change (`past_key_values=` -> `cache=` in 5.24) is fixed in one place.
By default decode runs through a static-shape bucket (`static_step.py`): preallocated cache
written in place (no per-step concatenation), one CUDA graph replay per step on CUDA; the runner
decides when a model allows it (full attention within the cache length, a static rotary embedding, sdpa or
eager attention) and falls back to the dynamic cache, with a warning when it was asked for.
It does not sample, mask or know about grammars; that is `decode.py` and the kernels.
"""

from __future__ import annotations

import inspect
import json
import warnings
from pathlib import Path

import torch

from surecall.core.static_step import (
    BucketPool,
    StaticBucket,
    batch_bucket,
    cache_bucket,
    dynamic_cache,
)
from surecall.errors import ModelLoadError

_DYNAMIC_ROPE = ("dynamic", "longrope")  # rotary types that rescale from the sequence length (host logic)

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "qwen3_moe", "mistral")


def _cache_keyword(model) -> str:
    """The forward keyword this transformers version prefers for the KV cache."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class _KVCache:
    """The one place that creates and passes the transformers cache object."""

    def __init__(self, model):
        self.obj = dynamic_cache(model)
        self.keyword = _cache_keyword(model)

    def kwargs(self) -> dict:
        return {self.keyword: self.obj, "use_cache": True}

    def select(self, rows: torch.Tensor) -> None:
        """Keep only `rows` (int64, on the cache's device) in the batch dimension."""
        for layer in self.obj.layers:
            layer.batch_select_indices(rows)


def _read_config(path: Path) -> dict:
    config_file = path / "config.json"
    if not path.is_dir():
        raise ModelLoadError(f"Model directory not found: {path}")
    if not config_file.is_file():
        raise ModelLoadError(f"Model directory {path} has no config.json")
    try:
        return json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"Model config {config_file} is not readable JSON: {exc}") from exc


def load_model(path: str | Path, dtype: torch.dtype | None = None, attn_implementation: str | None = None):
    """Load a supported causal LM from a local directory; ModelLoadError naming the problem."""
    path = Path(path).expanduser()
    config = _read_config(path)
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelLoadError(
            f"Unsupported model architecture {model_type!r} in {path / 'config.json'}: "
            f"expected one of {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    if not any(path.glob("*.safetensors")):
        raise ModelLoadError(f"Model directory {path} has no *.safetensors weights")
    from transformers import AutoModelForCausalLM

    kwargs = {"local_files_only": True}
    if dtype is not None:
        kwargs["dtype"] = dtype
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    try:
        return AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ModelLoadError(f"Could not load the model in {path}: {exc}") from exc


class ModelRunner:
    """Batched prefill + one-token decode over a KV cache for one causal LM."""

    def __init__(self, model, device=None, dtype=None, attn_implementation: str | None = None):
        if isinstance(model, (str, Path)):
            self.source = str(model)
            model = load_model(model, dtype=dtype, attn_implementation=attn_implementation)
        else:
            self.source = type(model).__name__
            if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
                raise ModelLoadError(
                    f"Invalid model: expected a local directory or a transformers model, got {type(model).__name__}"
                )
            model_type = getattr(model.config, "model_type", None)
            if model_type not in SUPPORTED_MODEL_TYPES:
                raise ModelLoadError(
                    f"Unsupported model architecture {model_type!r}: expected one of {', '.join(SUPPORTED_MODEL_TYPES)}"
                )
        if device is not None:
            model = model.to(device)
        if dtype is not None:
            model = model.to(dtype)
        self.model = model.eval()
        self.config = model.config
        self.model_type = self.config.model_type
        self.device = next(model.parameters()).device
        self.logits_width = int(model.get_output_embeddings().weight.shape[0])
        self.max_positions = int(getattr(self.config, "max_position_embeddings", 1 << 30))
        self._cache: _KVCache | None = None
        self._attn: torch.Tensor | None = None  # [B, 1, 1, max_len] decode mask (see _decode_mask)
        self._length = 0  # columns of _attn filled so far
        self._next_pos: torch.Tensor | None = None  # [B] position id of the next token
        self.num_layers = int(self.config.num_hidden_layers)
        self.cache_keyword = _cache_keyword(model)
        self.param_dtype = next(model.parameters()).dtype
        self.attn_is_sdpa = getattr(self.config, "_attn_implementation", "sdpa") == "sdpa"
        self._buckets = BucketPool()
        self._static: StaticBucket | None = None  # this run's bucket when decoding with static shapes
        self._warned: set[str] = set()
        self.last_mode = "dynamic"  # how the last prefill set up decoding: dynamic | static | graph
        self.last_capture_s = 0.0  # CUDA-graph capture time paid by the last prefill (0 when reused)
        self.capture_graphs = True  # False: static shapes on CUDA without capture (tests compare the two)

    def static_reason(self, cache_len: int) -> str | None:
        """None when the static-shape step fits this model at `cache_len`, else why not."""
        config = self.config
        window = getattr(config, "sliding_window", None)
        layer_types = getattr(config, "layer_types", None)
        sliding = layer_types is None or "sliding_attention" in layer_types
        if isinstance(window, int) and sliding and window < cache_len:
            return f"sliding-window attention ({window} tokens) shorter than the cache ({cache_len} tokens)"
        rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
        rope_type = rope.get("rope_type", rope.get("type")) if isinstance(rope, dict) else None
        if rope_type in _DYNAMIC_ROPE:
            return f"rotary embedding type {rope_type!r} depends on the sequence length"
        impl = getattr(config, "_attn_implementation", "sdpa")
        if impl not in ("sdpa", "eager"):
            return f"attention implementation {impl!r} (static decoding needs sdpa or eager)"
        return None

    def _plan(self, batch: int, needed: int, cuda_graphs: bool | None) -> tuple[str, int, int]:
        """('dynamic'|'static'|'graph', padded batch, cache length) for one run."""
        if cuda_graphs is False:
            return "dynamic", batch, needed
        cache_len = cache_bucket(needed, self.max_positions)
        reason = self.static_reason(cache_len)
        if reason is not None:
            if cuda_graphs and reason not in self._warned:
                self._warned.add(reason)
                warnings.warn(f"static decode step (CUDA graphs) off for this model: {reason}; using the dynamic cache",
                              stacklevel=4)
            return "dynamic", batch, needed
        mode = "graph" if self.device.type == "cuda" and self.capture_graphs else "static"
        return mode, batch_bucket(batch), cache_len

    @torch.inference_mode()
    def prefill(
        self,
        input_ids: torch.Tensor,  # [B, T] long, left-padded
        attention_mask: torch.Tensor,  # [B, T] long, 0 on padding
        max_new_tokens: int,
        num_last: int = 1,
        cuda_graphs: bool | None = None,  # None/True: static step (graphs on CUDA) when the model allows; False: dynamic
        shared_prefix: int = 0,  # leading real tokens all rows share: prefilled once (static step only)
    ) -> torch.Tensor:  # [B, num_last, V] float32 logits of the last positions
        batch, length = input_ids.shape
        input_ids = input_ids.to(self.device)
        attention_mask = attention_mask.to(self.device, dtype=torch.long)
        mode, padded, cache_len = self._plan(batch, length + max_new_tokens, cuda_graphs)
        self.last_mode, self.last_capture_s = mode, 0.0
        if mode != "dynamic":
            return self._static_prefill(input_ids, attention_mask, num_last, padded, cache_len, mode == "graph",
                                        shared_prefix)
        self._static = None
        self._cache = _KVCache(self.model)
        self._attn = self._decode_mask(attention_mask, max_new_tokens)
        self._length = length
        # Left padding: positions count real tokens only, so row r's first real token is position 0.
        positions = (attention_mask.cumsum(-1) - 1).clamp_min(0)
        self._next_pos = positions[:, -1] + 1
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=positions,
            logits_to_keep=num_last,
            **self._cache.kwargs(),
        )
        return out.logits[:, -num_last:, :].float()

    def _static_prefill(self, input_ids, attention_mask, num_last, padded, cache_len, use_graph,
                        shared_prefix) -> torch.Tensor:
        bucket = self._buckets.get(self, padded, cache_len)
        self._static, self._cache = bucket, None
        logits = bucket.prefill(input_ids, attention_mask, num_last, shared_prefix)
        bucket.use_graph = use_graph
        if use_graph and bucket.graph is None and bucket.graph_error is None:  # first use of this bucket
            self.last_capture_s = bucket.capture()
            if bucket.graph_error and bucket.graph_error not in self._warned:
                self._warned.add(bucket.graph_error)
                warnings.warn(f"CUDA graph capture failed, decoding runs eagerly: {bucket.graph_error}",
                              stacklevel=3)
        if not use_graph or bucket.graph is None:
            self.last_mode = "static"
        return logits

    def _decode_mask(self, attention_mask: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        """[B, 1, 1, T + new] mask in the form the attention implementation adds or selects with.

        A ready 4D mask makes transformers skip its mask building, whose padding check
        (`padding_mask.all()`) is a host sync on every decode step.
        """
        keep = torch.ones((attention_mask.shape[0], attention_mask.shape[1] + max_new_tokens), dtype=torch.bool,
                          device=self.device)
        keep[:, : attention_mask.shape[1]] = attention_mask.bool()
        keep = keep[:, None, None, :]
        if getattr(self.config, "_attn_implementation", "sdpa") == "sdpa":
            return keep
        dtype = next(self.model.parameters()).dtype
        return torch.zeros(keep.shape, dtype=dtype, device=self.device).masked_fill_(~keep, torch.finfo(dtype).min)

    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor) -> torch.Tensor:  # tokens [B] long -> logits [B, V] float32
        if self._static is not None:
            return self._static.decode(tokens)
        self._length += 1
        out = self.model(
            input_ids=tokens.view(-1, 1),
            attention_mask=self._attn[..., : self._length],
            position_ids=self._next_pos.view(-1, 1),
            **self._cache.kwargs(),
        )
        self._next_pos = self._next_pos + 1
        return out.logits[:, -1, :].float()

    def batch_size_after(self, live: int) -> int:
        """The batch a `compact` to `live` rows would decode with (a bucket size on the static path)."""
        return batch_bucket(live) if self._static is not None else live

    @property
    def batch_size(self) -> int:
        """Rows the next decode step computes (padding rows of a bucket included)."""
        if self._static is not None:
            return self._static.batch
        return int(self._next_pos.shape[0]) if self._next_pos is not None else 0

    @torch.inference_mode()
    def compact(self, rows: torch.Tensor) -> None:
        """Keep only `rows` (int64 indices of the current batch, in order) for the next decode steps.

        Dynamic cache: the cache, mask and positions are indexed. Static path: the rows move into
        the smaller bucket (its graph captured on first use), which then serves the decode steps.
        """
        if self._static is None:
            self._cache.select(rows)
            self._attn = self._attn[rows]
            self._next_pos = self._next_pos[rows]
            return
        source = self._static
        bucket = self._buckets.get(self, batch_bucket(rows.numel()), source.cache_len)
        if bucket is source:
            return
        bucket.adopt(source, rows)
        bucket.use_graph = source.use_graph
        if bucket.use_graph and bucket.graph is None and bucket.graph_error is None:
            self.last_capture_s += bucket.capture()
        self._static = bucket

    def release(self) -> None:
        """Drop the dynamic KV cache (frees memory between generate calls); static buckets stay for reuse."""
        self._cache = None
        self._static = None
        self._attn = None
        self._next_pos = None

    def release_buckets(self) -> None:
        """Free the static caches and CUDA graphs too."""
        self.release()
        self._buckets.clear()
