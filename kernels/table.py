"""DeviceTable: a TokenTable's arrays as torch tensors on one device, plus derived per-state facts.

`from_table` copies the compact layout (grammars/table.py: mask rows as deduplicated blocks,
`mask_blocks` + `mask_row_blocks` + `mask_row`, default next state + sorted exceptions in shared rows) once, and derives what the kernels need so that
no launch has to look at the host: the widest/narrowest `dist` one step ahead of each state
(the budget mask only does work on rows where the budget binds), whether each state allows
anything, each state's exception span (exc_lo, exc_hi: its shared row's, one load each) and the
number of binary-search steps over the longest exception row. A kernel's next state for an
allowed non-stop token t of state s: exc_targets[exc_base[s] + exc_slot[i]] if t is exception i
of s's row, else trans_default[s]. It does not compile or validate grammars (grammars/ does) and holds
no per-request state. Word w of state s's mask row is mask_blocks[mask_row_blocks[mask_row[s],
w // block_words], w % block_words] in every kernel (`_triton.mask_words_triton`) and reference (`mask_word`).
Counters (grammars/table.py): `count_*` are the table's count arrays (placeholders when it has
none: count_row all -1), `dist_entry` = dist + need(0) of the state's body, the dist a token
that does not stay in a body is charged; `max_next_dist` is over dist_entry (an upper bound of
what the budget charges), `min_next_dist` over dist (a lower bound).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from surecall.errors import KernelInputError
from surecall.grammars.table import TokenTable

NO_NEXT = 1 << 30  # min_next_dist of a state without transitions: larger than any budget



def entries_on(a, dtype: torch.dtype, device: torch.device, pad=0) -> torch.Tensor:
    """A sparse-entry array on `device` (copied: cached tables are read-only), one `pad` element
    when it is empty (kernels index it unconditionally)."""
    a = np.asarray(a)
    if a.shape[0] == 0:
        a = np.full(1, pad)
    return torch.as_tensor(np.array(a, copy=True)).to(device=device, dtype=dtype)

@dataclass(frozen=True)
class DeviceTable:
    mask_blocks: torch.Tensor  # int32 [K, BW] distinct blocks of packed words (block 0 all zero)
    mask_row_blocks: torch.Tensor  # int32 [U, NB] the blocks of each distinct mask row
    mask_row: torch.Tensor  # int32 [S]: state s's distinct mask row
    accept: torch.Tensor  # bool [S]
    accept_i8: torch.Tensor  # int8 [S]: accept as bytes for the kernels
    trans_default: torch.Tensor  # int32 [S]: next state of an allowed non-stop token that is no exception
    exc_lo: torch.Tensor  # int32 [S]: state s's exceptions are exc_tok[exc_lo[s]:exc_hi[s]] (its shared row)
    exc_hi: torch.Tensor  # int32 [S]
    exc_tok: torch.Tensor  # int32 [max(E, 1)] sorted exception tokens per row (one dummy entry when empty, never read)
    exc_slot: torch.Tensor  # int32 [max(E, 1)] each token's slot among its state's targets
    exc_base: torch.Tensor  # int32 [S] state s's first target in exc_targets
    exc_targets: torch.Tensor  # int32 [max(T, 1)]: exception i of state s leads to exc_targets[exc_base[s] + exc_slot[i]]
    dist: torch.Tensor  # int32 [S]
    stop_ids: torch.Tensor  # int64 [k]
    is_stop: torch.Tensor  # int8 [W * 32]: 1 where the id is a stop id
    max_next_dist: torch.Tensor  # int32 [S]: max dist over the state's transitions (-1 if none)
    min_next_dist: (
        torch.Tensor
    )  # int32 [S]: min dist over the state's transitions (NO_NEXT if none)
    has_allowed: torch.Tensor  # bool [S]: the mask row allows at least one token
    has_stop: torch.Tensor  # bool [S]: accepting and the mask row allows a stop id
    num_search_steps: int  # binary-search iterations that cover the longest exception row
    vocab_size: int
    logits_width: int
    count_row: torch.Tensor  # int32 [S]: row of count_chars inside a counted body, -1 elsewhere
    count_lo: torch.Tensor  # int32 [S]
    count_hi: torch.Tensor  # int32 [S]
    count_chars: torch.Tensor  # int8 [max(R, 1), count_cols]: 2 * chars + closes, -1 never
    count_entry_key: torch.Tensor  # int64 [max(E, 1)] sorted s * logits_width + t (padding: -1, never read)
    count_entry_val: torch.Tensor  # int32 [max(E, 1)]
    dist_entry: torch.Tensor  # int32 [S]: dist + need(0)
    count_cols: int  # columns of count_chars (the vocabulary size)
    count_fill: int  # characters per token towards a minimum (table.count_fill)
    num_entries: int  # E
    num_entry_steps: int  # binary-search iterations over count_entry_key
    has_counts: bool
    num_words: int  # W: packed words per mask row (ceil(logits_width / 32))

    @property
    def num_states(self) -> int:
        return int(self.accept.shape[0])

    @property
    def block_words(self) -> int:
        """BW: packed words per mask block (a power of two)."""
        return int(self.mask_blocks.shape[1])

    @property
    def num_row_blocks(self) -> int:
        """NB: blocks per mask row."""
        return int(self.mask_row_blocks.shape[1])

    @property
    def device(self) -> torch.device:
        return self.mask_blocks.device

    def mask_rows(self, states: torch.Tensor) -> torch.Tensor:
        """int32 [R, W]: the packed mask rows of `states` (all >= 0), gathered through the blocks."""
        ids = self.mask_row_blocks[self.mask_row[states.long()].long()].long()  # [R, NB]
        return self.mask_blocks[ids].reshape(ids.shape[0], self.num_row_blocks * self.block_words)[:, : self.num_words]

    def mask_word(self, states: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
        """int64 per i in [0, 2**32): packed word words[i] (< W) of state states[i]'s mask row."""
        bw = self.block_words
        w = words.long()
        blk = self.mask_row_blocks[self.mask_row[states.long()].long(), w // bw].long()
        return self.mask_blocks[blk, w % bw].long() & 0xFFFFFFFF

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
        row_lens = np.diff(table.exc_ptr.astype(np.int64))
        counts = _count_arrays(table)
        owner, targets = table.state_targets()  # each state's distinct exception targets
        has_default = table.trans_default >= 0
        default = np.maximum(table.trans_default, 0)
        max_next = np.where(has_default, counts["dist_entry"][default], -1).astype(np.int64)
        min_next = np.where(has_default, table.dist[default], NO_NEXT).astype(np.int64)
        np.maximum.at(max_next, owner, counts["dist_entry"][targets].astype(np.int64))
        np.minimum.at(min_next, owner, table.dist[targets].astype(np.int64))  # a lower bound
        is_stop = np.zeros(table.num_words * 32, dtype=np.int8)
        is_stop[table.stop_ids.astype(np.int64)] = 1
        stop_bits = table.mask_bits(table.stop_ids)[table.mask_row]
        has_stop = table.accept.astype(bool) & stop_bits.any(axis=1)
        max_row = int(row_lens.max()) if row_lens.size else 0
        nnz_pad = max(table.num_exceptions, 1)
        row = table.exc_row.astype(np.int64)

        def put(a: np.ndarray, dtype: torch.dtype, size: int | None = None) -> torch.Tensor:
            a = np.ascontiguousarray(a)
            if not a.flags.writeable:  # a memory-mapped cache entry: torch wants a writable buffer
                a = a.copy()
            t = torch.from_numpy(a).to(dtype)
            if size is not None and t.numel() < size:
                t = torch.cat([t, torch.zeros(size - t.numel(), dtype=dtype)])
            return t.to(dev)

        return cls(
            mask_blocks=put(table.mask_blocks, torch.int32),
            mask_row_blocks=put(table.mask_row_blocks, torch.int32),
            mask_row=put(table.mask_row, torch.int32),
            accept=put(table.accept.astype(bool), torch.bool),
            accept_i8=put(table.accept.astype(np.int8), torch.int8),
            trans_default=put(table.trans_default, torch.int32),
            exc_lo=put(table.exc_ptr[row], torch.int32),
            exc_hi=put(table.exc_ptr[row + 1], torch.int32),
            exc_tok=put(table.exc_tok, torch.int32, nnz_pad),
            exc_slot=put(table.exc_slot.astype(np.int32), torch.int32, nnz_pad),
            exc_base=put(table.exc_base[:-1], torch.int32),
            exc_targets=put(table.exc_targets, torch.int32, max(table.exc_targets.size, 1)),
            dist=put(table.dist, torch.int32),
            stop_ids=put(table.stop_ids, torch.int64),
            is_stop=put(is_stop, torch.int8),
            max_next_dist=put(max_next, torch.int32),
            min_next_dist=put(min_next, torch.int32),
            has_allowed=put((table.mask_row_blocks != 0).any(axis=1)[table.mask_row], torch.bool),  # block 0: the zero block
            has_stop=put(has_stop, torch.bool),
            num_search_steps=max(1, max_row.bit_length()),
            vocab_size=int(table.vocab_size),
            logits_width=int(table.logits_width),
            count_row=put(counts["count_row"], torch.int32),
            count_lo=put(counts["count_lo"], torch.int32),
            count_hi=put(counts["count_hi"], torch.int32),
            count_chars=put(counts["count_chars"], torch.int8),
            count_entry_key=put(counts["count_entry_key"], torch.int64),
            count_entry_val=put(counts["count_entry_val"], torch.int32),
            dist_entry=put(counts["dist_entry"], torch.int32),
            count_cols=int(counts["count_chars"].shape[1]),
            count_fill=int(table.count_fill) if table.has_counts else 1,
            num_entries=int(counts["num_entries"]),
            num_entry_steps=max(1, int(counts["num_entries"]).bit_length()),
            has_counts=bool(table.has_counts),
            num_words=table.num_words,
        )


def _count_arrays(table: TokenTable) -> dict:
    """The count arrays the kernels read, with placeholders for a table without counters."""
    n = table.num_states
    if not table.has_counts:
        return {"count_row": np.full(n, -1, np.int32), "count_lo": np.zeros(n, np.int32),
                "count_hi": np.zeros(n, np.int32), "count_chars": np.full((1, 1), -1, np.int8),
                "count_entry_key": np.full(1, -1, np.int64), "count_entry_val": np.zeros(1, np.int32),
                "dist_entry": table.dist, "num_entries": 0}
    inside = table.count_row >= 0
    need0 = np.where(inside, -(-table.count_lo.astype(np.int64) // table.count_fill), 0)
    chars = table.count_chars if table.count_chars.shape[0] else np.full((1, table.vocab_size), -1, np.int8)
    num_entries = int(table.count_entry_key.shape[0])
    return {"count_row": table.count_row, "count_lo": table.count_lo, "count_hi": table.count_hi,
            "count_chars": chars,
            "count_entry_key": table.count_entry_key if num_entries else np.full(1, -1, np.int64),
            "count_entry_val": table.count_entry_val if num_entries else np.zeros(1, np.int32),
            "dist_entry": (table.dist + need0).astype(np.int32), "num_entries": num_entries}


def _check_table(table: TokenTable) -> None:
    """Cheap shape checks, so a malformed table fails here and not inside a kernel."""
    num_states = table.num_states
    problems = []  # the block layout itself is checked by TokenTable (grammars/table.py)
    if table.mask_row.shape != (num_states,):
        problems.append(f"mask_row shape {table.mask_row.shape}, expected ({num_states},)")
    elif num_states and not 0 <= int(table.mask_row.min()) <= int(table.mask_row.max()) < table.num_mask_rows:
        problems.append(f"mask_row outside the {table.num_mask_rows} mask rows")
    if table.trans_default.shape != (num_states,):
        problems.append(f"trans_default shape {table.trans_default.shape}, expected ({num_states},)")
    problems += _exception_problems(table)
    if table.dist.shape != (num_states,):
        problems.append(f"dist shape {table.dist.shape}, expected ({num_states},)")
    if num_states == 0:
        problems.append("no states")
    if problems:
        raise KernelInputError(
            "Invalid TokenTable for DeviceTable.from_table: " + "; ".join(problems)
        )


def _exception_problems(table: TokenTable) -> list[str]:
    """What is wrong with the shared exception rows (exc_*), if anything: shapes, pointers, and
    every slot of a state's row within that state's targets."""
    n, rows = table.num_states, table.exc_ptr.shape[0] - 1
    if table.exc_row.shape != (n,) or table.exc_base.shape != (n + 1,) or rows < 1:
        return [f"exc_row shape {table.exc_row.shape}, exc_base shape {table.exc_base.shape} and {rows} exception "
                f"rows, expected ({n},), ({n + 1},) and at least one"]
    if table.exc_ptr[-1] != table.exc_tok.shape[0] or table.exc_tok.shape != table.exc_slot.shape:
        return ["exc_ptr[-1], exc_tok and exc_slot disagree on the number of exceptions"]
    if table.exc_base[-1] != table.exc_targets.shape[0] or (np.diff(table.exc_base.astype(np.int64)) < 0).any():
        return ["exc_base does not point into exc_targets"]
    if n and not 0 <= int(table.exc_row.min()) <= int(table.exc_row.max()) < rows:
        return [f"exc_row outside the {rows} exception rows"]
    lens = np.diff(table.exc_ptr.astype(np.int64))
    if (lens < 0).any():
        return ["exc_ptr is not ascending"]
    most = np.full(rows, -1, dtype=np.int64)  # each row's largest slot
    full = np.flatnonzero(lens)
    if full.size:
        most[full] = np.maximum.reduceat(table.exc_slot.astype(np.int64), table.exc_ptr[full].astype(np.int64))
    if (most[table.exc_row] >= np.diff(table.exc_base.astype(np.int64))).any():
        return ["an exception slot points past its state's targets"]
    return []
