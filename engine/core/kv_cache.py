"""The paged KV cache the model writes and reads, behind the one object transformers sees.

Per layer, K and V live in a pool of `num_blocks * block_size` token slots ([kv_heads, slots,
head_dim]: a gathered row is then contiguous per head, as attention wants it) plus two spare slots: PAD_SLOT (never written, read where a row is shorter than the
batch) and TRASH_SLOT (written by padding queries, never read). Before a forward the engine
`bind`s the step's slot maps; the model's attention then calls `update` per layer, which writes
the new K/V into their slots and returns each row's whole K/V gathered by its block table. This
is the only module that meets transformers' cache API (a duck-typed `update`, so versions that
pass `cache_kwargs=` or `kwargs=` both work). `paged_cache_supported` says whether the running
transformers is one this adapter was tested with; outside that range it warns once and the engine
runs its plain (cache-free) path instead of failing. It does not decide which tokens go where
(`scheduler.py`) or build masks (`engine.py`).
"""

from __future__ import annotations

import inspect
import re
import warnings

import torch

# (major, minor) range of transformers the adapter was tested with: the GPU image has 5.17, these machines 5.24
TESTED_TRANSFORMERS = ((5, 17), (5, 24))
_warned_versions: set[str] = set()


def _major_minor(version: str) -> tuple[int, int] | None:
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found.group(1)), int(found.group(2))) if found else None


def paged_cache_supported(version: str | None = None) -> bool:
    """True when transformers `version` (default: the installed one) is in TESTED_TRANSFORMERS.

    Otherwise warn (once per version) and return False: the engine then runs without the paged
    cache and the prefix cache, recomputing each row every step (slow, but no cache API is used).
    """
    if version is None:
        import transformers

        version = str(transformers.__version__)
    parsed = _major_minor(version)
    low, high = TESTED_TRANSFORMERS
    if parsed is not None and low <= parsed <= high:
        return True
    if version not in _warned_versions:
        _warned_versions.add(version)
        warnings.warn(
            f"transformers {version} is outside the versions surecall's paged KV cache was tested with "
            f"({low[0]}.{low[1]} to {high[0]}.{high[1]}); falling back to plain decoding without a KV cache "
            "or prefix caching (slower, same tokens)", RuntimeWarning, stacklevel=3)
    return False


def cache_keyword(model) -> str:
    """The forward keyword this transformers version uses for the cache (`cache` from 5.24)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def kv_shape(config) -> tuple[int, int, int]:
    """(layers, kv heads, head dim) of a decoder config."""
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    return int(config.num_hidden_layers), kv_heads, head_dim


def bytes_per_token(config, dtype: torch.dtype) -> int:
    layers, kv_heads, head_dim = kv_shape(config)
    return 2 * layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


class PagedKVCache:
    """K/V pools for every layer, and the slot maps of the forward in flight."""

    is_compileable = False  # transformers asks; we never torch.compile through it

    def __init__(self, config, num_blocks: int, block_size: int, device, dtype: torch.dtype):
        self.num_layers, self.kv_heads, self.head_dim = kv_shape(config)
        self.block_size = block_size
        self.num_slots = num_blocks * block_size
        self.pad_slot, self.trash_slot = self.num_slots, self.num_slots + 1
        shape = (self.kv_heads, self.num_slots + 2, self.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(self.num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(self.num_layers)]
        self._write: torch.Tensor | None = None  # [B * q] slot of each query token
        self._read: torch.Tensor | None = None  # [B, L] slot of each key position

    def bind(self, write_slots: torch.Tensor, read_slots: torch.Tensor) -> None:
        self._write, self._read = write_slots, read_slots

    def unbind(self) -> None:
        self._write = self._read = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Write this step's K/V ([B, kv_heads, q, D]) and return every row's K/V ([B, kv_heads, L, D])."""
        if self._write is None:
            raise RuntimeError("PagedKVCache.update outside a bound forward")  # an engine bug
        b, h, q, d = key_states.shape
        k_pool, v_pool = self.k[layer_idx], self.v[layer_idx]
        k_pool[:, self._write] = key_states.permute(1, 0, 2, 3).reshape(h, b * q, d).to(k_pool.dtype)
        v_pool[:, self._write] = value_states.permute(1, 0, 2, 3).reshape(h, b * q, d).to(v_pool.dtype)
        rows, length = self._read.shape
        flat = self._read.reshape(-1)
        keys = k_pool.index_select(1, flat).view(h, rows, length, d).permute(1, 0, 2, 3)
        values = v_pool.index_select(1, flat).view(h, rows, length, d).permute(1, 0, 2, 3)
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:  # only asked when no position ids are given
        return 0

    def slots(self, table: list[int], start: int, end: int) -> list[int]:
        """Slot ids of token positions [start, end) of a sequence with block table `table`."""
        bs = self.block_size
        return [table[p // bs] * bs + p % bs for p in range(start, end)]
