"""DeviceTable: a TokenTable's arrays as torch tensors on one device, plus derived per-state facts.

`from_table` copies the CSR, mask, accept and dist arrays once and derives what the kernels
need so that no launch has to look at the host: the widest/narrowest `dist` one step ahead of
each state (the budget mask only does work on rows where the budget binds), whether each state
allows anything, and the number of binary-search steps over the longest CSR row. It does not
compile or validate grammars (grammars/ does) and holds no per-request state.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from surecall.errors import KernelInputError
from surecall.grammars.table import TokenTable

NO_NEXT = 1 << 30  # min_next_dist of a state without transitions: larger than any budget


@dataclass(frozen=True)
class DeviceTable:
    mask: torch.Tensor  # int32 [S, W]
    accept: torch.Tensor  # bool [S]
    accept_i8: torch.Tensor  # int8 [S]: accept as bytes for the kernels
    trans_ptr: torch.Tensor  # int32 [S + 1]
    trans_tok: torch.Tensor  # int32 [max(nnz, 1)] (one dummy entry when empty, never read)
    trans_next: torch.Tensor  # int32 [max(nnz, 1)]
    dist: torch.Tensor  # int32 [S]
    stop_ids: torch.Tensor  # int64 [k]
    is_stop: torch.Tensor  # int8 [W * 32]: 1 where the id is a stop id
    max_next_dist: torch.Tensor  # int32 [S]: max dist over the state's transitions (-1 if none)
    min_next_dist: (
        torch.Tensor
    )  # int32 [S]: min dist over the state's transitions (NO_NEXT if none)
    has_allowed: torch.Tensor  # bool [S]: the mask row allows at least one token
    has_stop: torch.Tensor  # bool [S]: accepting and the mask row allows a stop id
    num_search_steps: int  # binary-search iterations that cover the longest CSR row
    vocab_size: int
    logits_width: int

    @property
    def num_states(self) -> int:
        return int(self.accept.shape[0])

    @property
    def num_words(self) -> int:
        return int(self.mask.shape[1])

    @property
    def device(self) -> torch.device:
        return self.mask.device

    @property
    def nbytes(self) -> int:
        return sum(
            int(t.numel() * t.element_size())
            for t in self.__dict__.values()
            if isinstance(t, torch.Tensor)
        )

    @classmethod
    def from_table(cls, table: TokenTable, device: torch.device | str = "cpu") -> DeviceTable:
        """Copy `table` to `device` and derive the per-state facts the kernels read."""
        _check_table(table)
        dev = torch.device(device)
        num_states = table.num_states
        row_lens = np.diff(table.trans_ptr.astype(np.int64))
        next_dist = table.dist[table.trans_next].astype(np.int64)
        owner = np.repeat(np.arange(num_states), row_lens)
        max_next = np.full(num_states, -1, dtype=np.int64)
        min_next = np.full(num_states, NO_NEXT, dtype=np.int64)
        np.maximum.at(max_next, owner, next_dist)
        np.minimum.at(min_next, owner, next_dist)
        is_stop = np.zeros(table.num_words * 32, dtype=np.int8)
        is_stop[table.stop_ids.astype(np.int64)] = 1
        stop_bits = _bits(table.mask, table.stop_ids.astype(np.int64))
        has_stop = table.accept.astype(bool) & stop_bits.any(axis=1)
        max_row = int(row_lens.max()) if num_states else 0
        nnz_pad = max(int(table.trans_tok.shape[0]), 1)

        def put(a: np.ndarray, dtype: torch.dtype, size: int | None = None) -> torch.Tensor:
            a = np.ascontiguousarray(a)
            if not a.flags.writeable:  # a memory-mapped cache entry: torch wants a writable buffer
                a = a.copy()
            t = torch.from_numpy(a).to(dtype)
            if size is not None and t.numel() < size:
                t = torch.cat([t, torch.zeros(size - t.numel(), dtype=dtype)])
            return t.to(dev)

        return cls(
            mask=put(table.mask, torch.int32),
            accept=put(table.accept.astype(bool), torch.bool),
            accept_i8=put(table.accept.astype(np.int8), torch.int8),
            trans_ptr=put(table.trans_ptr, torch.int32),
            trans_tok=put(table.trans_tok, torch.int32, nnz_pad),
            trans_next=put(table.trans_next, torch.int32, nnz_pad),
            dist=put(table.dist, torch.int32),
            stop_ids=put(table.stop_ids, torch.int64),
            is_stop=put(is_stop, torch.int8),
            max_next_dist=put(max_next, torch.int32),
            min_next_dist=put(min_next, torch.int32),
            has_allowed=put((table.mask != 0).any(axis=1), torch.bool),
            has_stop=put(has_stop, torch.bool),
            num_search_steps=max(1, max_row.bit_length()),
            vocab_size=int(table.vocab_size),
            logits_width=int(table.logits_width),
        )


def _bits(mask: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """bool [S, len(ids)]: whether each state's mask row allows each id."""
    words = mask[:, ids // 32].view(np.uint32)
    return ((words >> (ids % 32).astype(np.uint32)) & 1).astype(bool)


def _check_table(table: TokenTable) -> None:
    """Cheap shape checks, so a malformed table fails here and not inside a kernel."""
    num_states = table.num_states
    expected_words = (table.logits_width + 31) // 32
    problems = []
    if table.mask.ndim != 2 or table.mask.shape != (num_states, expected_words):
        problems.append(f"mask shape {table.mask.shape}, expected ({num_states}, {expected_words})")
    if table.trans_ptr.shape != (num_states + 1,):
        problems.append(f"trans_ptr shape {table.trans_ptr.shape}, expected ({num_states + 1},)")
    elif (
        table.trans_ptr[-1] != table.trans_tok.shape[0]
        or table.trans_tok.shape != table.trans_next.shape
    ):
        problems.append("trans_ptr[-1], trans_tok and trans_next disagree on nnz")
    if table.dist.shape != (num_states,):
        problems.append(f"dist shape {table.dist.shape}, expected ({num_states},)")
    if num_states == 0:
        problems.append("no states")
    if problems:
        raise KernelInputError(
            "Invalid TokenTable for DeviceTable.from_table: " + "; ".join(problems)
        )
