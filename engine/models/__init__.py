"""The models shipped inside the package: surecall-tiny, the embedded default.

`default_model_dir()` returns the folder of surecall-tiny (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json with its chat template, generation_config.json, the
held-out single-call prompts heldout.jsonl and multi-turn episodes heldout_episodes.jsonl), loadable offline with transformers' `from_pretrained`. How
the model was trained lives in `surecall.models.training`; this module only locates the files.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from surecall.errors import ModelLoadError

DEFAULT_MODEL_NAME = "surecall_tiny"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                  "generation_config.json")


def default_model_dir() -> Path:
    """The shipped surecall-tiny folder; ModelLoadError names the missing files if any."""
    return model_dir(DEFAULT_MODEL_NAME)


def model_dir(name: str) -> Path:
    """The folder of a shipped model by name (only "surecall_tiny" ships today)."""
    path = Path(str(resources.files("surecall.models").joinpath(name)))
    missing = [f for f in REQUIRED_FILES if not (path / f).is_file()]
    if missing:
        raise ModelLoadError(
            f"shipped model {name!r} at {path} lacks {', '.join(missing)}: reinstall surecall, "
            f"or retrain it with `python -m surecall.models.training.train` and copy a checkpoint there")
    return path


def default_heldout_path() -> Path:
    """The held-out prompts of surecall-tiny (JSON lines: messages, tool, arguments)."""
    path = default_model_dir() / "heldout.jsonl"
    if not path.is_file():
        raise ModelLoadError(f"held-out prompts missing at {path}: reinstall surecall")
    return path


def default_heldout_episodes_path() -> Path:
    """The held-out multi-turn episodes of surecall-tiny (JSON lines: kind, messages)."""
    path = default_model_dir() / "heldout_episodes.jsonl"
    if not path.is_file():
        raise ModelLoadError(f"held-out episodes missing at {path}: reinstall surecall")
    return path


heldout_path = default_heldout_path
