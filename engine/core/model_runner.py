"""ModelRunner: a Hugging Face causal LM loaded and checked, with the facts the engine needs.

Loads Llama (3.x rope scaling included), Qwen2, Qwen3 (dense and MoE) and Mistral family models
from a local directory (config.json + safetensors, never downloading) or wraps an already-built
`transformers` model, refusing other architectures with the supported list. It exposes the model,
its device and dtype, logits width and positions. It runs no forward passes: the engine core
(`engine.py`, over the paged cache in `kv_cache.py`) does, and it does not sample or mask.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from surecall.errors import ModelLoadError

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "qwen3_moe", "mistral")


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
    """One causal LM, on its device, with its config facts."""

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
        self.num_layers = int(self.config.num_hidden_layers)
        self.param_dtype = next(model.parameters()).dtype
