"""Argument types shared by the subcommands: each turns one flag's text into a checked value.

A bad value raises `argparse.ArgumentTypeError`, which the parser reports as one line naming the
flag (`surecall sample: error: argument --n: expected an integer >= 0, got -3`) and exit status 2,
before any model, tokenizer or table is loaded. They check the value's shape and, where cheap,
the environment it needs (`--device cuda` needs a visible GPU; `--out` must be creatable); what a
command does with the value is the command's business.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path


def int_at_least(low: int):
    """An argparse type: an integer >= `low`."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


non_negative_int = int_at_least(0)
positive_int = int_at_least(1)


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text}")
    return value


def device(text: str) -> str:
    """`cpu`, `cuda` or `cuda:N`; a CUDA device must be visible (checked by importing torch)."""
    kind, _, index = text.partition(":")
    if kind not in ("cpu", "cuda") or (index and (kind == "cpu" or not index.isdigit())):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")
    if kind == "cuda":
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise argparse.ArgumentTypeError(f"{text}: no CUDA GPU is visible to torch; use --device cpu")
        if index and int(index) >= count:
            raise argparse.ArgumentTypeError(f"{text}: only {count} CUDA device(s) visible (cuda:0..cuda:{count - 1})")
    return text


def output_dir(text: str) -> str:
    """A directory the command may write into, created now so a bad path fails before any work."""
    path = Path(text).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot create output folder {text}: {exc.strerror or exc}") from None
    if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"output folder {text} is not a writable directory")
    return text


def input_file(text: str) -> str:
    """A regular, non-empty file within the input size limit (checked, not read)."""
    from surecall.commands.resolve import max_input_bytes, read_check
    from surecall.errors import RequestError

    try:
        limit = max_input_bytes()
    except RequestError as exc:  # a bad SURECALL_MAX_INPUT_BYTES
        raise argparse.ArgumentTypeError(str(exc)) from None
    read_check(Path(text), argparse.ArgumentTypeError, limit)
    return text


def tool_format(text: str) -> str:
    """A tool-call format name known to `surecall.grammars.formats` (or one of its aliases)."""
    from surecall.grammars.formats import ALIASES, FORMATS

    if text not in FORMATS and text not in ALIASES:
        raise argparse.ArgumentTypeError(f"expected one of {sorted([*FORMATS, *ALIASES])}, got {text!r}")
    return text
