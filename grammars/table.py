"""TokenTable: one compiled grammar over one vocabulary (the grammars/ <-> kernels/ contract).

Dense state ids 0..S-1, state 0 the start. `mask` rows are LSB-first bitmasks over the logits
width (the xgrammar / llguidance / outlines-core layout); stop ids are set only in accepting
rows and never appear in the CSR transitions (a stop token ends the row, it does not move it).
Every state can reach an accepting state (`dist` is finite): the compiler prunes dead states.
This module holds data and cheap checks only; building tables is `compile.py`'s job and
moving them to a device is the kernels' job.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class TokenTable:
    mask: np.ndarray  # int32 [S, W], W = ceil(logits_width / 32); bit j of word w allows token 32*w + j
    accept: np.ndarray  # bool [S]; stop ids are allowed exactly in these rows
    trans_ptr: np.ndarray  # int32 [S + 1]; CSR row pointers
    trans_tok: np.ndarray  # int32 [nnz]; allowed non-stop tokens of each state, sorted
    trans_next: np.ndarray  # int32 [nnz]; the state each of those tokens leads to
    dist: np.ndarray  # int32 [S]; fewest tokens from this state to an accepting state (0 if accepting)
    vocab_size: int  # the tokenizer's number of ids (ids >= this are never allowed)
    logits_width: int  # V: the model's logits width (>= vocab_size)
    stop_ids: np.ndarray  # int32 [k]; ids that end a row in an accepting state
    relaxed: list[tuple[str, str]] = field(default_factory=list)  # (JSON pointer, keyword) not enforced
    meta: dict = field(default_factory=dict)  # free-form: grammar kind, regex size, compile ms, ...

    @property
    def num_states(self) -> int:
        return int(self.accept.shape[0])

    @property
    def num_words(self) -> int:
        return int(self.mask.shape[1])

    @property
    def nbytes(self) -> int:
        arrays = (self.mask, self.accept, self.trans_ptr, self.trans_tok, self.trans_next, self.dist, self.stop_ids)
        return int(sum(a.nbytes for a in arrays))

    def allowed(self, state: int) -> np.ndarray:
        """Sorted token ids the mask allows in `state` (stop ids included where accepting)."""
        bits = np.unpackbits(self.mask[state].view(np.uint8), bitorder="little")
        return np.flatnonzero(bits[: self.logits_width]).astype(np.int64)

    def next_state(self, state: int, token: int) -> int | None:
        """The state `token` leads to from `state`, or None when the token is not a transition."""
        lo, hi = int(self.trans_ptr[state]), int(self.trans_ptr[state + 1])
        row = self.trans_tok[lo:hi]
        i = int(np.searchsorted(row, token))
        if i < row.shape[0] and int(row[i]) == token:
            return int(self.trans_next[lo + i])
        return None

    @staticmethod
    def concat(tables: list[TokenTable]) -> tuple[TokenTable, np.ndarray]:
        """Stack several grammars over one vocabulary into one table; returns it and the state offsets.

        A batch row then carries one global state id: `offsets[g] + local_state`.
        """
        if not tables:
            raise ValueError("Invalid tables: expected at least one TokenTable, got none")
        first = tables[0]
        for t in tables[1:]:
            if t.logits_width != first.logits_width or t.vocab_size != first.vocab_size:
                raise ValueError(
                    f"Invalid tables: expected one vocabulary, got logits widths {first.logits_width} and {t.logits_width}"
                )
        sizes = np.array([t.num_states for t in tables], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int32)
        nnz = np.array([t.trans_tok.shape[0] for t in tables], dtype=np.int64)
        nnz_offsets = np.concatenate([[0], np.cumsum(nnz)[:-1]])
        trans_ptr = np.concatenate(
            [t.trans_ptr[:-1].astype(np.int64) + o for t, o in zip(tables, nnz_offsets)] + [[int(nnz.sum())]]
        ).astype(np.int32)
        stop_ids = np.unique(np.concatenate([t.stop_ids for t in tables])).astype(np.int32)
        return (
            TokenTable(
                mask=np.concatenate([t.mask for t in tables]),
                accept=np.concatenate([t.accept for t in tables]),
                trans_ptr=trans_ptr,
                trans_tok=np.concatenate([t.trans_tok for t in tables]).astype(np.int32),
                trans_next=np.concatenate([t.trans_next + o for t, o in zip(tables, offsets)]).astype(np.int32),
                dist=np.concatenate([t.dist for t in tables]).astype(np.int32),
                vocab_size=first.vocab_size,
                logits_width=first.logits_width,
                stop_ids=stop_ids,
                relaxed=[r for t in tables for r in t.relaxed],
                meta={"concat_of": len(tables)},
            ),
            offsets,
        )
