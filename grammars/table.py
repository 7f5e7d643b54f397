"""TokenTable: one compiled grammar over one vocabulary (the grammars/ <-> kernels/ contract).

Dense state ids 0..S-1, state 0 the start. `mask` rows are LSB-first bitmasks over the logits
width (the xgrammar / llguidance / outlines-core layout); stop ids are set only in accepting
rows and never appear in the CSR transitions (a stop token ends the row, it does not move it).
Every state can reach an accepting state (`dist` is finite): the compiler prunes dead states.
This module holds data and cheap checks only; building tables is `compile.py`'s job and
moving them to a device is the kernels' job.

Counters (optional, `count_row is not None`). A state inside a length-bounded string body has
`count_row[s] >= 0`; each batch row then carries one int32 counter c: the characters started
in the body so far (an escape or a multi-byte character is one). With v = count_chars[row, t]
(2 * characters token t starts there + 1 if it closes the string; -1: never), t is kept iff
v >= 0, c + v//2 <= count_hi[s] and, when it closes, c + v//2 >= count_lo[s]. After t the
counter is c + v//2 if t stays in the body, else count_entry_val at key s * logits_width + t
(0 when absent: the characters t starts in the body it opens). `dist` of a counted state
excludes its unmet minimum: the fewest tokens are dist[s] + need_s(c), need_s(c) =
ceil(max(0, count_lo[s] - c) / count_fill); a token that opens a body is charged need(0).
One counter per row suffices: a counted body holds no other counted value.

Item counters (optional, `item_hi is not None`; grammars/items.py, kernels/items.py). A state
inside a counted array has `item_hi[s] >= 0`; each batch row carries a second int32 counter
k: the item separators crossed in that array. Entries, sorted by key s * logits_width + t, hold
the tokens that cross a separator (item_inc), close the state's array (item_flag & 1) or open one
(item_flag & 2); any other token crosses none. t is kept iff k + inc <= item_hi[s] and, when it
closes, k + inc >= item_lo[s] (item_lo = max(minItems - 1, 0), item_hi = maxItems - 1). After t
the counter is item_set when >= 0, else k + inc. `dist` excludes the unmet minimum: the fewest
tokens are dist[s] + string need + item_cost[s] * max(0, item_lo[s] - k) (a token that opens an
array is charged that of its item_set). One item counter per row: arrays inside a counted
array's items are not counted.
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
    count_row: np.ndarray | None = None  # int32 [S]; row of count_chars inside a counted body, -1 elsewhere
    count_lo: np.ndarray | None = None  # int32 [S]; minLength of the state's body (0 elsewhere)
    count_hi: np.ndarray | None = None  # int32 [S]; maxLength of the state's body (0 elsewhere)
    count_chars: np.ndarray | None = None  # int8 [R, vocab_size]; 2 * chars + closes, -1 never
    count_entry_key: np.ndarray | None = None  # int64 [E] sorted; s * logits_width + t of opening tokens
    count_entry_val: np.ndarray | None = None  # int32 [E]; the counter such a token sets (non-zero only)
    count_fill: int = 1  # characters per token the counted dist assumes towards a minimum
    item_lo: np.ndarray | None = None  # int32 [S]; max(minItems - 1, 0) of the state's counted array (0 elsewhere)
    item_hi: np.ndarray | None = None  # int32 [S]; maxItems - 1 there, -1 outside counted arrays
    item_cost: np.ndarray | None = None  # int32 [S]; tokens dist assumes per unmet separator (0 outside)
    item_key: np.ndarray | None = None  # int64 [E] sorted; s * logits_width + t of tokens with an item event
    item_inc: np.ndarray | None = None  # int32 [E]; separators t crosses in s's array before it closes
    item_flag: np.ndarray | None = None  # int8 [E]; 1: closes s's array, 2: opens an array
    item_set: np.ndarray | None = None  # int32 [E]; the item counter after t, -1: counter + inc
    item_next: np.ndarray | None = None  # int32 [E]; the state t leads to

    @property
    def has_items(self) -> bool:
        return self.item_hi is not None

    @property
    def has_counts(self) -> bool:
        return self.count_row is not None

    def need(self, state: int, counter: int) -> int:
        """Tokens still needed to reach the minimum of `state`'s body (0 outside counted bodies)."""
        if not self.has_counts or self.count_row[state] < 0:
            return 0
        return -(-max(0, int(self.count_lo[state]) - counter) // self.count_fill)

    def count_allows(self, state: int, counter: int, tokens: np.ndarray) -> np.ndarray:
        """bool per token of `tokens` (allowed by the mask): whether the counter bounds keep it."""
        if not self.has_counts or self.count_row[state] < 0:
            return np.ones(tokens.shape[0], dtype=bool)
        v = self.count_chars[self.count_row[state], tokens].astype(np.int64)
        total = counter + v // 2
        closes = (v & 1) == 1
        return (v >= 0) & (total <= self.count_hi[state]) & (~closes | (total >= self.count_lo[state]))

    def next_counter(self, state: int, counter: int, token: int) -> int:
        """The counter after `token` (a transition of `state`)."""
        if not self.has_counts:
            return 0
        if self.count_row[state] >= 0:
            v = int(self.count_chars[self.count_row[state], token])
            if v >= 0 and v & 1 == 0:
                return counter + v // 2
        key = state * self.logits_width + token
        i = int(np.searchsorted(self.count_entry_key, key))
        if i < self.count_entry_key.shape[0] and int(self.count_entry_key[i]) == key:
            return int(self.count_entry_val[i])
        return 0

    @property
    def num_states(self) -> int:
        return int(self.accept.shape[0])

    @property
    def num_words(self) -> int:
        return int(self.mask.shape[1])

    @property
    def nbytes(self) -> int:
        arrays = (self.mask, self.accept, self.trans_ptr, self.trans_tok, self.trans_next, self.dist, self.stop_ids)
        counts = tuple(getattr(self, n) for n in COUNT_ARRAYS) if self.has_counts else ()
        counts += tuple(getattr(self, n) for n in ITEM_ARRAYS) if self.has_items else ()
        return int(sum(a.nbytes for a in arrays + counts))

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
        counts = _concat_counts(tables, offsets) if any(t.has_counts for t in tables) else {}
        if any(t.has_items for t in tables):
            from surecall.grammars.items import concat_items

            counts.update(concat_items(tables, offsets))
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
                meta={"concat_of": len(tables), "relaxed_reasons": [
                    why for t in tables for why in t.meta.get("relaxed_reasons", [""] * len(t.relaxed))]},
                **counts,
            ),
            offsets,
        )


COUNT_ARRAYS = ("count_row", "count_lo", "count_hi", "count_chars", "count_entry_key", "count_entry_val")
ITEM_ARRAYS = ("item_lo", "item_hi", "item_cost", "item_key", "item_inc", "item_flag", "item_set", "item_next")


def _concat_counts(tables: list[TokenTable], offsets: np.ndarray) -> dict:
    """The count_* fields of several tables stacked (tables without counters get none)."""
    rows, lo, hi, chars, keys, vals = [], [], [], [], [], []
    num_rows = 0
    width = tables[0].logits_width
    fills = {t.count_fill for t in tables if t.has_counts}
    if len(fills) > 1:  # one vocabulary gives one fill; the dists assume it
        raise ValueError(f"Invalid tables: expected one count_fill, got {sorted(fills)}")
    for t, off in zip(tables, offsets.tolist(), strict=True):
        if not t.has_counts:
            rows.append(np.full(t.num_states, -1, dtype=np.int32))
            lo.append(np.zeros(t.num_states, dtype=np.int32))
            hi.append(np.zeros(t.num_states, dtype=np.int32))
            continue
        rows.append(np.where(t.count_row >= 0, t.count_row + num_rows, -1).astype(np.int32))
        lo.append(t.count_lo)
        hi.append(t.count_hi)
        chars.append(t.count_chars)
        num_rows += t.count_chars.shape[0]
        keys.append(t.count_entry_key.astype(np.int64) + off * width)
        vals.append(t.count_entry_val)
    return {
        "count_row": np.concatenate(rows), "count_lo": np.concatenate(lo).astype(np.int32),
        "count_hi": np.concatenate(hi).astype(np.int32), "count_chars": np.concatenate(chars),
        "count_entry_key": np.concatenate(keys), "count_entry_val": np.concatenate(vals).astype(np.int32),
        "count_fill": min(fills),
    }
