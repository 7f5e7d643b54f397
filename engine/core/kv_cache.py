"""The paged KV cache the model writes and reads, behind the one object transformers sees.

Per layer, K and V live in a pool of `num_blocks * block_size` token slots ([kv_heads, slots,
head_dim]: a gathered row is then contiguous per head, as attention wants it) plus two spare slots: PAD_SLOT (never written, read where a row is shorter than the
batch) and TRASH_SLOT (written by padding queries, never read). Before a forward the engine
`bind`s the step's slot maps; the model's attention then calls `update` per layer, which writes
the new K/V into their slots and returns each row's whole K/V gathered by its block table. This
is the only module that meets transformers' cache API (a duck-typed `update`, so versions that
pass `cache_kwargs=` or `kwargs=` both work). `paged_cache_supported` says whether the running
transformers is one this adapter was tested with; outside that range it warns once and the engine
runs its plain (cache-free) path instead of failing. The captured decode step binds slot maps
it computed on the device (`bind_static`: no dense views, every step one gather). It does not
decide which tokens go where (`scheduler.py`) or build masks (`masks.py`).
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


DENSE_HEADROOM = 64  # decode steps a dense view grows by before it is rebuilt larger


class PagedKVCache:
    """K/V pools for every layer, and the slot maps of the forward in flight.

    Decode steps (one token per row) also keep a dense view per layer, [B, kv_heads, L, D]: the
    rows' K/V gathered once, then only each step's new column written into it. The view is kept
    while the decode batch goes on (each row one column further; rows that left are dropped by
    moving others into their places); a newcomer, a recomputed row or a full view rebuilds it with
    one gather. The engine runs a decode batch in the order `decode_order` gives.
    """

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
        self._columns: torch.Tensor | None = None  # [B] decode steps: the column of each row's new token
        self._dense_key = None  # what the dense views hold (the decode batch), None: nothing
        self._dense_cols: list[int] = []  # each row's new-token column at the last decode step
        self._dense: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * self.num_layers
        self._stale = [True] * self.num_layers
        self._planned = None  # (keys in order, row moves, rows) from decode_order, applied by bind
        self.num_dense_rebuilds = 0

    def decode_order(self, keys: list, columns: list[int], length: int) -> list[int] | None:
        """The order (indices into `keys`) to run a decode batch in so the dense views are kept, or
        None when they must be rebuilt (a newcomer, a row that did not move one column on, or full).

        Rows that left are dropped by moving rows from the end of the views into their places
        (one row's copy per departure, not the whole batch), then cutting the views short.
        """
        self._planned = None
        if self._dense_key is None or any(view is None for view in self._dense):
            return None
        if length > self._dense[0][0].shape[2]:
            return None
        where = {k: i for i, k in enumerate(self._dense_key)}
        rows = [where.get(k) for k in keys]
        if None in rows or any(c != self._dense_cols[r] + 1 for r, c in zip(rows, columns, strict=True)):
            return None
        n = len(rows)
        live = set(rows)
        holes = [r for r in range(n) if r not in live]
        movers = [r for r in sorted(live) if r >= n]
        moves = dict(zip(movers, holes, strict=True))
        final = [moves.get(r, r) for r in rows]  # each key's row in the kept views
        order = sorted(range(n), key=final.__getitem__)
        self._planned = (tuple(keys[j] for j in order), sorted(moves.items()), n)
        return order

    def bind(self, write_slots: torch.Tensor, read_slots: torch.Tensor, decode_key=None,
             columns: list[int] | None = None) -> None:
        """The next forward's slot maps; a decode step also gives its rows' keys (`decode_key`, in
        batch order) and the key position (`columns`) of each row's new token."""
        self._write, self._read = write_slots, read_slots
        self._columns = None
        if decode_key is None:
            return
        planned, self._planned = self._planned, None
        if planned is not None and planned[0] == tuple(decode_key):
            _, moves, n = planned
            if moves:
                src = torch.tensor([a for a, _ in moves], dtype=torch.long, device=write_slots.device)
                dst = torch.tensor([b for _, b in moves], dtype=torch.long, device=write_slots.device)
                for k, v in self._dense:
                    k[dst] = k[src]
                    v[dst] = v[src]
            self._dense = [(k[:n], v[:n]) for k, v in self._dense]
        else:
            self._stale = [True] * self.num_layers
            self.num_dense_rebuilds += 1
        self._dense_key, self._dense_cols = tuple(decode_key), list(columns)
        self._columns = torch.tensor(columns, dtype=torch.long, device=write_slots.device)

    def bind_static(self, write_slots: torch.Tensor, read_slots: torch.Tensor) -> None:
        """Slot maps computed on the device (the captured decode step, graph_step.py). Its K/V go
        to the pools only, so the dense decode views are dropped: the next eager decode rebuilds."""
        self._write, self._read, self._columns = write_slots, read_slots, None
        self._dense_key, self._dense, self._planned = None, [None] * self.num_layers, None

    def unbind(self, failed: bool = False) -> None:
        self._write = self._read = self._columns = None
        if failed:  # a forward that stopped part way leaves the views half written
            self._dense_key, self._dense = None, [None] * self.num_layers

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Write this step's K/V ([B, kv_heads, q, D]) and return every row's K/V ([B, kv_heads, L, D])."""
        if self._write is None:
            raise RuntimeError("PagedKVCache.update outside a bound forward")  # an engine bug
        b, h, q, d = key_states.shape
        k_pool, v_pool = self.k[layer_idx], self.v[layer_idx]
        k_pool[:, self._write] = key_states.permute(1, 0, 2, 3).reshape(h, b * q, d).to(k_pool.dtype)
        v_pool[:, self._write] = value_states.permute(1, 0, 2, 3).reshape(h, b * q, d).to(v_pool.dtype)
        if self._columns is not None:
            return self._dense_update(key_states, value_states, layer_idx)
        keys, values = self._gather(layer_idx)
        return keys.permute(1, 0, 2, 3), values.permute(1, 0, 2, 3)

    def _gather(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Every row's K/V from the pools by the bound read slots, [kv_heads, B, L, D]."""
        rows, length = self._read.shape
        flat = self._read.reshape(-1)
        h, d = self.kv_heads, self.head_dim
        keys = self.k[layer_idx].index_select(1, flat).view(h, rows, length, d)
        values = self.v[layer_idx].index_select(1, flat).view(h, rows, length, d)
        return keys, values

    def _dense_update(self, key_states, value_states, layer_idx: int):
        length = self._read.shape[1]
        if self._stale[layer_idx]:  # one gather (this step's token included: the pools have it)
            keys, values = self._gather(layer_idx)
            rows, h, d = keys.shape[1], self.kv_heads, self.head_dim
            dense_k = keys.new_empty((rows, h, length + DENSE_HEADROOM, d))
            dense_v = values.new_empty((rows, h, length + DENSE_HEADROOM, d))
            dense_k[:, :, :length] = keys.permute(1, 0, 2, 3)
            dense_v[:, :, :length] = values.permute(1, 0, 2, 3)
            dense_k[:, :, length:] = 0  # columns not written yet are masked, and zeros are never NaN
            dense_v[:, :, length:] = 0
            self._dense[layer_idx] = (dense_k, dense_v)
            self._stale[layer_idx] = False
        else:
            dense_k, dense_v = self._dense[layer_idx]
            rows = torch.arange(dense_k.shape[0], device=dense_k.device)
            dense_k[rows, :, self._columns] = key_states[:, :, 0].to(dense_k.dtype)
            dense_v[rows, :, self._columns] = value_states[:, :, 0].to(dense_v.dtype)
        return dense_k[:, :, :length], dense_v[:, :, :length]

    def get_seq_length(self, layer_idx: int = 0) -> int:  # only asked when no position ids are given
        return 0

    def slots(self, table: list[int], start: int, end: int) -> list[int]:
        """Slot ids of token positions [start, end) of a sequence with block table `table`."""
        bs = self.block_size
        return [table[p // bs] * bs + p % bs for p in range(start, end)]
