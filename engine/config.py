"""Engine and sampling configuration: one validated dataclass per concern.

`EngineConfig` is how the engine runs (batch limit, sequence limit, grammar options, kernel
checks); `SamplingParams` is what one request asks for (temperature, top-k/p, budget, seed,
logprobs). Both check their values in `__post_init__` and raise
`ValueError("Invalid X: expected Y, got Z")`. Neither holds tensors or touches a model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

_MAX_SEED = 2**63 - 1


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    max_tokens: int = 256  # generated tokens per row, stop token included
    seed: int | None = None  # None: a fresh random seed per row
    logprobs: bool = True  # per-token logprobs of the (masked) sampling policy
    unmasked_logprobs: bool = False  # also the logprobs the model gave before the grammar mask

    def __post_init__(self):
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"Invalid temperature: expected a finite number >= 0, got {t!r}")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise ValueError(f"Invalid top_k: expected an integer >= 0 (0 = off), got {self.top_k!r}")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not (0.0 < p <= 1.0):
            raise ValueError(f"Invalid top_p: expected a number in (0, 1], got {p!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"Invalid max_tokens: expected an integer >= 1, got {self.max_tokens!r}")
        if self.seed is not None and (not _is_int(self.seed) or not (0 <= self.seed <= _MAX_SEED)):
            raise ValueError(f"Invalid seed: expected None or an integer in [0, 2**63), got {self.seed!r}")
        for name in ("logprobs", "unmasked_logprobs"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Invalid {name}: expected a bool, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class EngineConfig:
    max_batch_size: int = 256  # rows the engine core runs at once (its max_num_seqs); more wait their turn
    max_seq_len: int | None = None  # prompt + generation limit; None = the model's max positions
    grammar_options: Any = None  # surecall.grammars.options.GrammarOptions or None for defaults
    check_kernel_inputs: bool = False  # validate kernel inputs every step (host syncs: debugging only)
    attn_implementation: str | None = None  # passed to transformers when loading from a directory
    # decode-only steps on static buffers, one CUDA graph per batch bucket (core/graph_step.py);
    # None: on for CUDA, off for CPU (there it runs the same function eagerly: slower than the eager step)
    graph_step: bool | None = None

    def __post_init__(self):
        if not _is_int(self.max_batch_size) or self.max_batch_size < 1:
            raise ValueError(f"Invalid max_batch_size: expected an integer >= 1, got {self.max_batch_size!r}")
        if self.max_seq_len is not None and (not _is_int(self.max_seq_len) or self.max_seq_len < 2):
            raise ValueError(f"Invalid max_seq_len: expected None or an integer >= 2, got {self.max_seq_len!r}")
        if self.graph_step is not None and not isinstance(self.graph_step, bool):
            raise ValueError(f"Invalid graph_step: expected None or a bool, got {self.graph_step!r}")
        if not isinstance(self.check_kernel_inputs, bool):
            raise ValueError(
                f"Invalid check_kernel_inputs: expected a bool, got {self.check_kernel_inputs!r}"
            )
