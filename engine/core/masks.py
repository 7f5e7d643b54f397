"""Attention masks of the paged forward: causal per row, with the model's sliding window.

The engine core hands the model a 4D mask it built itself (transformers then uses it as-is), so
a windowed model has to be windowed here: `window_of` reads the config (Mistral's
`sliding_window`; Qwen2/Qwen3's with `use_sliding_window`), and `attention_mask` turns a causal
`allowed` [B, q, L] into the model's mask: one tensor, or, for models whose `layer_types` mix
full and sliding layers, the dict {"full_attention", "sliding_attention"} those models accept.
HF's rule is kept: a key k is in the window of query q when q - window < k <= q. It builds no
slot maps (`engine.py`, `graph_step.py`) and does not run the model.
"""

from __future__ import annotations

import torch


def window_of(config) -> int | None:
    """The sliding window (in tokens) the model's attention uses, or None when it attends fully."""
    window = getattr(config, "sliding_window", None)
    if window is None or not getattr(config, "use_sliding_window", True):
        return None
    return int(window)


def has_layer_types(config) -> bool:
    """True when the model picks each layer's mask by `config.layer_types` (full or sliding)."""
    return "sliding_attention" in (getattr(config, "layer_types", None) or ())


def attention_mask(
    allowed: torch.Tensor,  # bool [B, q, L]: key L allowed for query q (causal, valid keys)
    kpos: torch.Tensor,  # int64 [B or 1, L]: each key's position
    qpos: torch.Tensor,  # int64 [B, q]: each query's position (-1 for padding queries)
    config,
    is_sdpa: bool,
    dtype: torch.dtype,  # the model's dtype (additive masks for eager attention)
):
    """The model's attention mask ([B, 1, q, L], or a dict of two for mixed-layer models)."""
    window = window_of(config)
    full = _as_mask(allowed, is_sdpa, dtype)
    if window is None:
        return full
    # padding queries (qpos -1) keep key 0: k > -1 - window always holds, so no row is fully masked
    windowed = _as_mask(allowed & (kpos[:, None, :] > qpos[:, :, None] - window), is_sdpa, dtype)
    if has_layer_types(config):
        return {"full_attention": full, "sliding_attention": windowed}
    return windowed


def _as_mask(allowed: torch.Tensor, is_sdpa: bool, dtype: torch.dtype) -> torch.Tensor:
    mask = allowed[:, None]
    if is_sdpa:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)
