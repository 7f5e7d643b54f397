"""TokenTable: one compiled grammar over one vocabulary (the grammars/ <-> kernels/ contract).

Dense state ids 0..S-1, state 0 the start. Compact layout (issue 15): a mask row is W =
ceil(logits_width / 32) LSB-first packed words over the logits width (bit j of word w allows
token 32*w + j: the xgrammar / llguidance / outlines-core row layout), stored once per distinct
row and deduplicated in blocks of BW = MASK_BLOCK_WORDS words: `mask_blocks` [K, BW] are the
distinct blocks (block 0 the all-zero block, and no other block is zero), `mask_row_blocks`
[U, NB] (NB = ceil(W / BW)) the blocks of each distinct row, `mask_row` [S] each state's row, so
word w of state s is mask_blocks[mask_row_blocks[mask_row[s], w // BW], w % BW] (the words
of the last block past W are zero). BW is the table's (`block_words`, any power of two; the
kernels read it and must give the same results for every one); `mask_dense(rows)` expands
rows for CPU tools. A state's transitions are a default next state plus sorted exceptions: a non-stop token t
allowed by s's mask row leads to exc_targets[exc_base[s] + exc_slot[i]] if t == exc_tok[i] for some
i in exc_ptr[r]:exc_ptr[r+1] with r = exc_row[s], else to trans_default[s] (-1 only when s allows no
non-stop token). Exception rows are shared: a row holds tokens and slots, the state its own
targets (exc_targets[exc_base[s]:exc_base[s+1]], each slot a distinct next state, ascending),
so states whose exceptions split the tokens alike (the same string
body or pattern at several places of a schema, each followed by other text) store them once
(`share_exception_rows`; JsonSchemaStore config_schema: 9.0M exceptions in 2,680 rows of 5,670
states, 72.6 MB -> see benchmarks/results/table_bytes.md).
Stop ids are set only in accepting rows and are never transitions (a stop token ends the row,
it does not move it). Every state can reach an accepting state (`dist` is finite): the
compiler prunes dead states. The compiler picks each state's most common next state as its
default, but any choice is valid and the kernels must give the same results for every one.
`transitions(s)` gives a state's full (tokens, next states) and `next_states(s, tokens)` looks
many up, for CPU tools; `from_dense` builds the layout from full CSR rows (tests). This
module holds data and cheap checks only; compiling is `compile.py`'s job and moving tables
to a device is the kernels' job.

Counters (optional, `count_row is not None`). A state inside a length-bounded string body has
`count_row[s] >= 0`; each batch row then carries one int32 counter c: the characters started
in the body so far (an escape or a multi-byte character is one) plus the fewest characters the
body still needs before its closing quote from the row's state (0 for a `char*` body; a body
written by a `pattern` or `format` may need more: grammars/counted.py), so c never decreases
and a row under its maximum can always close. With v = count_chars[row, t] (2 * what token t
adds to c there + 1 if it closes the string; -1: never), t is kept iff v >= 0, c + v//2 <=
count_hi[s] and, when it closes, c + v//2 >= count_lo[s]. After t the counter is c + v//2 if t
stays in the body, else count_entry_val at key s * logits_width + t (0 when absent). `dist` of
a counted state excludes its unmet minimum: the fewest tokens are dist[s] + need_s(c),
need_s(c) = ceil(max(0, count_lo[s] - c) / count_fill); a token that opens a body is charged
need(0). One counter per row suffices: a counted body holds no other counted value. A counted
repetition inside a pattern (a word count, `^(?:\\S+\\s+){0,99}\\S+$`) is such a body whose unit is
an iteration instead of a character: its count_chars rows hold the iterations a token starts
(the same fields and rule; the kernels cannot tell them apart).

Item counters (optional, `item_hi is not None`; grammars/items.py, kernels/items.py). A state
inside a counted array (or a counted object: min/maxProperties over undeclared keys, its members
counted as items, `{` and `}` for `[` and `]`) has `item_hi[s] >= 0` and item_depth[s] >= 1 arrays open (at most
items.MAX_ITEM_DEPTH); each batch row carries a stack of that many int32 counters, outermost
first: the item separators crossed in each open array; the innermost is k = stack[depth - 1].
Entries, sorted by key s * logits_width + t, hold the tokens that cross a separator of the
innermost array (item_inc), close it (item_flag & 1) or leave a new array open (item_flag & 2);
any other token crosses none. t is kept iff k + inc <= item_hi[s] and, when it closes,
k + inc >= item_lo[s] (item_lo = max(minItems - 1, 0), item_hi = maxItems - 1 of the innermost
array). After t the innermost counter is k + inc, or is popped when t closes it; when t leaves an
array open, item_set is pushed (depth after = depth - closes + opens). `dist` excludes the unmet
minimums: the fewest tokens are dist[s] + string need + item_cost[s] * max(0, item_lo[s] - k)
+ sum over the open arrays below, j < depth - 1, of item_below_cost[s, j] * max(0,
item_below_lo[s, j] - stack[j]) (zeros past the depth; a token that opens an array is charged
that of its item_set).

Bracket stack (optional, `stack_key is not None`; grammars/stack.py, kernels/stack.py). Free-form
values of any depth: each batch row carries a stack of its open free-form containers, a depth d
and int64 kind bits (bit 0 the innermost; 1 an array), d <= stack.MAX_STACK_DEPTH. Entries,
sorted by key s * logits_width + t, hold the tokens that open or close such a container; each
has outcomes stack_ptr[e]..stack_ptr[e + 1] - 1, at most one of which holds for a row: the row's
innermost stack_cond_len kinds equal stack_cond_bits and its depth equals stack_cond_depth (or,
when that is -1, is at least stack_cond_len). The row then pops stack_pops levels, pushes
stack_push_len (bits stack_push_bits) and goes to stack_next, crossing stack_item_inc item
separators of its innermost counted array (stack_item_flag, stack_item_set: as an item entry's).
A token with no outcome for the row, or one that passes MAX_STACK_DEPTH, is refused. An entry
with stack_edge 1 only pushes: its DFA edge goes to the same state (the item and string rules
see it as any token); any other entry's token leads, in the plain table, to a state with no
tokens of its own and dist 0 (the last of its table) and its outcome is the only way on. `dist` counts the innermost
container only: the fewest tokens are dist[s] + max(d - 1, 0) (one closer per further level) +
the counters' needs, so the other rules run with the budget less max(d - 1, 0), and an entry's
outcome is kept iff dist[next] + max(d_after - 1, 0) + the row's unmet minItems + stack_item_charge
<= remaining - 1 (an entry that only pushes one level from d = 0 is left to the other rules).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class TokenTable:
    mask_blocks: np.ndarray  # int32 [K, BW] distinct blocks of BW packed words; block 0 all zero
    mask_row_blocks: np.ndarray  # int32 [U, NB] the block of each BW words of each distinct mask row
    mask_row: np.ndarray  # int32 [S]; state s's distinct mask row
    accept: np.ndarray  # bool [S]; stop ids are allowed exactly in these rows
    trans_default: np.ndarray  # int32 [S]; next state of an allowed non-stop token that is no exception (-1: none)
    exc_row: np.ndarray  # int32 [S]; state s's exception row (shared between states)
    exc_ptr: np.ndarray  # int32 [R + 1]; CSR pointers of the exception rows
    exc_tok: np.ndarray  # int32 [E]; each row's tokens whose next state is not the default, sorted
    exc_slot: np.ndarray  # uint8 / uint16 / int32 [E]; each token's slot among its state's targets
    exc_base: np.ndarray  # int32 [S + 1]; CSR pointers of each state's targets in exc_targets
    exc_targets: np.ndarray  # int32 [T]; the next states: slot k of state s leads to exc_targets[exc_base[s] + k]
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
    item_flag: np.ndarray | None = None  # int8 [E]; 1: closes s's innermost array, 2: leaves one open
    item_set: np.ndarray | None = None  # int32 [E]; the counter of the array t leaves open (-1: none)
    item_next: np.ndarray | None = None  # int32 [E]; the state t leads to
    item_depth: np.ndarray | None = None  # int32 [S]; counted arrays open in s (0 outside)
    item_below_lo: np.ndarray | None = None  # int32 [S, D - 1]; item_lo of each open array below the innermost
    item_below_cost: np.ndarray | None = None  # int32 [S, D - 1]; its item_cost (0 past the depth)
    stack_key: np.ndarray | None = None  # int64 [E] sorted; s * logits_width + t of tokens with a stack event
    stack_ptr: np.ndarray | None = None  # int32 [E + 1]; each entry's outcomes
    stack_edge: np.ndarray | None = None  # int8 [E]; 1: the token only pushes (a plain edge to the same next state)
    stack_cond_len: np.ndarray | None = None  # int8 [O]; innermost levels the outcome reads
    stack_cond_bits: np.ndarray | None = None  # int64 [O]; their kinds (bit 0 the innermost; 1: array)
    stack_cond_depth: np.ndarray | None = None  # int32 [O]; the row's depth exactly, or -1: at least cond_len
    stack_pops: np.ndarray | None = None  # int8 [O]; levels popped
    stack_push_len: np.ndarray | None = None  # int8 [O]; levels pushed after
    stack_push_bits: np.ndarray | None = None  # int64 [O]; their kinds (bit 0 the new innermost)
    stack_next: np.ndarray | None = None  # int32 [O]; the state the token leads to
    stack_weight: np.ndarray | None = None  # int8 [O]; its weight as an edge of dist (0: none)
    stack_item_inc: np.ndarray | None = None  # int32 [O]; separators it crosses in the innermost counted array
    stack_item_flag: np.ndarray | None = None  # int8 [O]; 1: it closes that array, 2: it leaves one open
    stack_item_set: np.ndarray | None = None  # int32 [O]; the counter of the array it leaves open (-1: none)
    stack_item_charge: np.ndarray | None = None  # int32 [O]; the unmet minimum of a counted array it opens (tokens)

    def __post_init__(self) -> None:
        _check_mask_layout(self)

    @property
    def has_items(self) -> bool:
        return self.item_hi is not None

    @property
    def has_stack(self) -> bool:
        return self.stack_key is not None

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
        """W: packed words per mask row."""
        return (self.logits_width + 31) // 32

    @property
    def block_words(self) -> int:
        """BW: packed words per mask block."""
        return int(self.mask_blocks.shape[1])

    @property
    def num_mask_rows(self) -> int:
        """U: distinct mask rows."""
        return int(self.mask_row_blocks.shape[0])

    @property
    def num_exceptions(self) -> int:
        """Exception entries stored (shared rows once)."""
        return int(self.exc_tok.shape[0])

    @property
    def num_state_exceptions(self) -> int:
        """Exceptions summed over the states (each shared row counted for every state that uses it)."""
        return int(np.diff(self.exc_ptr.astype(np.int64))[self.exc_row].sum())

    def exc_span(self, state: int) -> tuple[int, int]:
        """(lo, hi): `state`'s exceptions are exc_tok[lo:hi] (its shared row)."""
        r = int(self.exc_row[state])
        return int(self.exc_ptr[r]), int(self.exc_ptr[r + 1])

    def exc_next_of(self, state: int, at) -> np.ndarray:
        """int32 next states of the exceptions exc_tok[at] of `state`'s row (`at`: indices or a slice)."""
        return self.exc_targets[int(self.exc_base[state]) + self.exc_slot[at].astype(np.int64)]

    def state_exceptions(self, states: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(owner int64, tok int32, next int32): the exceptions of `states` (default: all, ascending)
        with the shared rows expanded, grouped by state in the order given (host tools;
        O(exceptions summed over those states) memory)."""
        states = np.arange(self.num_states, dtype=np.int64) if states is None else np.asarray(states, dtype=np.int64)
        lo = self.exc_ptr[self.exc_row[states]].astype(np.int64)
        lens = self.exc_ptr[self.exc_row[states] + 1].astype(np.int64) - lo
        starts = np.cumsum(lens) - lens
        idx = np.repeat(lo - starts, lens) + np.arange(int(lens.sum()), dtype=np.int64)
        owner = np.repeat(states, lens)
        nxt = self.exc_targets[self.exc_base[owner].astype(np.int64) + self.exc_slot[idx].astype(np.int64)]
        return owner, self.exc_tok[idx], nxt.astype(np.int32)

    def state_targets(self) -> tuple[np.ndarray, np.ndarray]:
        """(owner int64, target int32): each state's distinct exception targets (its slots)."""
        owner = np.repeat(np.arange(self.num_states, dtype=np.int64), np.diff(self.exc_base.astype(np.int64)))
        return owner, self.exc_targets

    @property
    def num_transitions(self) -> int:
        """Allowed (state, non-stop token) pairs: what a full CSR would hold."""
        return int(self.row_transition_counts()[self.mask_row].sum())

    def row_transition_counts(self) -> np.ndarray:
        """int64 [U]: the non-stop tokens each distinct mask row allows (popcounts of its blocks)."""
        per_block = np.bitwise_count(self.mask_blocks.view(np.uint32)).sum(axis=1, dtype=np.int64)
        return per_block[self.mask_row_blocks].sum(axis=1) - self.mask_bits(self.stop_ids).sum(axis=1)

    @property
    def nbytes(self) -> int:
        arrays = tuple(getattr(self, n) for n in TABLE_ARRAYS)
        counts = tuple(getattr(self, n) for n in COUNT_ARRAYS) if self.has_counts else ()
        counts += tuple(getattr(self, n) for n in ITEM_ARRAYS) if self.has_items else ()
        counts += tuple(getattr(self, n) for n in STACK_ARRAYS) if self.has_stack else ()
        return int(sum(a.nbytes for a in arrays + counts))

    def mask_dense(self, rows: np.ndarray | None = None) -> np.ndarray:
        """int32 [len(rows), W]: distinct mask rows `rows` (default: all U) expanded to packed words.

        For CPU tools and tests; O(len(rows) * W) memory, so nothing on a hot path calls it.
        """
        ids = self.mask_row_blocks if rows is None else self.mask_row_blocks[np.asarray(rows, dtype=np.int64)]
        words = self.mask_blocks[ids].reshape(ids.shape[0], ids.shape[1] * self.block_words)
        return np.ascontiguousarray(words[:, : self.num_words])

    @property
    def mask(self) -> np.ndarray:
        """int32 [U, W]: every distinct mask row, dense (mask_dense(); expanded on each access)."""
        return self.mask_dense()

    def mask_word_at(self, rows: np.ndarray, words: np.ndarray) -> np.ndarray:
        """uint32 per i: packed word words[i] (< W) of distinct mask row rows[i], through the blocks."""
        bw = self.block_words
        blk = self.mask_row_blocks[rows, words // bw]
        return self.mask_blocks.view(np.uint32)[blk, words % bw]

    def mask_bits(self, ids: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """bool [len(rows), len(ids)]: whether each distinct mask row (default: all) allows each id."""
        ids = np.asarray(ids, dtype=np.int64)
        rows = np.arange(self.num_mask_rows) if rows is None else np.asarray(rows, dtype=np.int64)
        words = self.mask_word_at(rows[:, None], (ids // 32)[None, :])
        return ((words >> (ids % 32).astype(np.uint32)) & 1).astype(bool)

    def row_tokens(self, row: int) -> np.ndarray:
        """Sorted token ids (int64, < logits_width) distinct mask row `row` allows: its non-zero blocks only."""
        ids = self.mask_row_blocks[row]
        at = np.flatnonzero(ids)
        if at.size == 0:
            return np.zeros(0, dtype=np.int64)
        bits = np.unpackbits(np.ascontiguousarray(self.mask_blocks[ids[at]]).view(np.uint8), axis=1,
                             bitorder="little")
        block, bit = np.nonzero(bits)
        toks = at[block].astype(np.int64) * (32 * self.block_words) + bit
        return toks[toks < self.logits_width]

    def mask_words(self, state: int) -> np.ndarray:
        """int32 [W]: the packed mask row of `state`."""
        return self.mask_dense(self.mask_row[state : state + 1])[0]

    def allowed(self, state: int) -> np.ndarray:
        """Sorted token ids the mask allows in `state` (stop ids included where accepting)."""
        return self.row_tokens(int(self.mask_row[state]))

    def transitions(self, state: int) -> tuple[np.ndarray, np.ndarray]:
        """(sorted non-stop token ids int64, their next states int32) of `state`: the full row."""
        toks = self.allowed(state)
        if self.stop_ids.size and self.accept[state]:
            toks = toks[~np.isin(toks, self.stop_ids)]
        nexts = np.full(toks.shape[0], self.trans_default[state], dtype=np.int32)
        lo, hi = self.exc_span(state)
        if hi > lo:
            nexts[np.searchsorted(toks, self.exc_tok[lo:hi])] = self.exc_next_of(state, slice(lo, hi))
        return toks, nexts

    def dense_transitions(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ptr int64 [S + 1], tok int32 [T], next int32 [T]): every transition as one full CSR.

        For host code that keys data by (state, token) pair; O(transitions) memory (the seed
        catalog: 1.08M entries), each distinct mask row unpacked once.
        """
        stops = np.zeros(32 * self.num_words, dtype=bool)
        stops[self.stop_ids] = True
        row_toks = []
        for r in range(self.num_mask_rows):
            toks = self.row_tokens(r)
            row_toks.append(toks[~stops[toks]].astype(np.int32))
        sizes = np.array([row_toks[r].size for r in self.mask_row.tolist()], dtype=np.int64)
        ptr = np.zeros(self.num_states + 1, dtype=np.int64)
        ptr[1:] = np.cumsum(sizes)
        tok = np.concatenate([row_toks[r] for r in self.mask_row.tolist()] or [np.zeros(0, np.int32)])
        nxt = np.repeat(self.trans_default.astype(np.int32), sizes)
        # Each exception's place: its state's first entry + its rank among that state's tokens.
        for s in np.flatnonzero(np.diff(self.exc_ptr.astype(np.int64))[self.exc_row]).tolist():
            lo, hi = self.exc_span(s)
            at = ptr[s] + np.searchsorted(tok[ptr[s] : ptr[s + 1]], self.exc_tok[lo:hi])
            nxt[at] = self.exc_next_of(s, slice(lo, hi))
        return ptr, tok, nxt

    def next_states(self, state: int, tokens: np.ndarray) -> np.ndarray:
        """int32 per token of `tokens`: the state it leads to from `state`, -1 where it is no transition."""
        tokens = np.asarray(tokens, dtype=np.int64)
        ok = (tokens >= 0) & (tokens < 32 * self.num_words)
        safe = np.where(ok, tokens, 0)
        words = self.mask_word_at(np.full(safe.shape, int(self.mask_row[state])), safe >> 5)
        ok &= ((words >> (safe & 31).astype(np.uint32)) & 1).astype(bool)
        if self.stop_ids.size:
            ok &= ~np.isin(tokens, self.stop_ids)
        out = np.where(ok, self.trans_default[state], -1).astype(np.int32)
        lo, hi = self.exc_span(state)
        if hi > lo:
            row = self.exc_tok[lo:hi]
            at = np.minimum(np.searchsorted(row, tokens), row.shape[0] - 1)
            hit = ok & (row[at] == tokens)
            out[hit] = self.exc_next_of(state, lo + at[hit])
        return out

    def next_states_many(self, states: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """int32 per (states[i], tokens[i]) pair: `next_states` vectorised over pairs of states too."""
        states = np.asarray(states, dtype=np.int64)
        tokens = np.asarray(tokens, dtype=np.int64)
        width = 32 * self.num_words
        ok = (tokens >= 0) & (tokens < width)
        safe = np.where(ok, tokens, 0)
        words = self.mask_word_at(self.mask_row[states], safe >> 5)
        ok &= ((words >> (safe & 31).astype(np.uint32)) & 1).astype(bool)
        for stop in self.stop_ids.tolist():
            ok &= tokens != stop
        out = np.where(ok, self.trans_default[states], -1).astype(np.int32)
        if self.exc_tok.size and states.size:
            rows = self.exc_row[states].astype(np.int64)
            owner = np.repeat(np.arange(self.exc_ptr.size - 1, dtype=np.int64), np.diff(self.exc_ptr.astype(np.int64)))
            exc_key = owner * width + self.exc_tok  # sorted: rows ascending, tokens sorted inside
            key = rows * width + safe
            at = np.minimum(np.searchsorted(exc_key, key), exc_key.size - 1)
            hit = ok & (exc_key[at] == key)
            out[hit] = self.exc_targets[self.exc_base[states[hit]].astype(np.int64) + self.exc_slot[at[hit]]]
        return out

    def next_state(self, state: int, token: int) -> int | None:
        """The state `token` leads to from `state`, or None when the token is not a transition."""
        if not 0 <= token < self.logits_width or bool((self.stop_ids == token).any()):
            return None
        if not (int(self.mask_word_at(self.mask_row[state], token >> 5)) >> (token & 31)) & 1:
            return None
        lo, hi = self.exc_span(state)
        row = self.exc_tok[lo:hi]
        i = int(np.searchsorted(row, token))
        if i < row.shape[0] and int(row[i]) == token:
            return int(self.exc_targets[int(self.exc_base[state]) + int(self.exc_slot[lo + i])])
        return int(self.trans_default[state])

    @staticmethod
    def from_dense(mask: np.ndarray, trans_ptr: np.ndarray, trans_tok: np.ndarray, trans_next: np.ndarray,
                   **fields) -> TokenTable:
        """A TokenTable from one mask row per state and full CSR transition rows (tests, synthetic tables).

        `fields` are the other dataclass fields (accept, dist, vocab_size, ...). Each state's
        default is its most common next state (the smallest id on a tie).
        """
        num_states = int(trans_ptr.shape[0]) - 1
        if mask.ndim != 2 or mask.shape[0] != num_states:
            raise ValueError(f"Invalid mask: expected {num_states} rows (one per state), got shape {mask.shape}")
        rows, mask_row = unique_rows(np.asarray(mask, dtype=np.int32))
        blocks, row_blocks = split_blocks(rows)
        default = np.full(num_states, -1, dtype=np.int32)
        keep = np.ones(trans_tok.shape[0], dtype=bool)
        for s in range(num_states):
            lo, hi = int(trans_ptr[s]), int(trans_ptr[s + 1])
            if hi > lo:
                default[s] = int(np.argmax(np.bincount(trans_next[lo:hi])))
                keep[lo:hi] = trans_next[lo:hi] != default[s]
        owner = np.repeat(np.arange(num_states), np.diff(trans_ptr.astype(np.int64)))
        ptr = np.zeros(num_states + 1, dtype=np.int64)
        ptr[1:] = np.cumsum(np.bincount(owner[keep], minlength=num_states))
        shared = share_exception_rows(ptr, np.asarray(trans_tok[keep], dtype=np.int32),
                                      np.asarray(trans_next[keep], dtype=np.int32))
        return TokenTable(mask_blocks=blocks, mask_row_blocks=row_blocks, mask_row=mask_row,
                          trans_default=default, **shared, **fields)

    @staticmethod
    def concat(tables: list[TokenTable]) -> tuple[TokenTable, np.ndarray]:
        """Stack several grammars over one vocabulary into one table; returns it and the state offsets.

        A batch row then carries one global state id: `offsets[g] + local_state`. Mask rows
        shared between the tables are stored once.
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
        exceptions = _concat_exceptions(tables, offsets)
        if len({t.block_words for t in tables}) > 1:
            raise ValueError(f"Invalid tables: expected one block_words, got {sorted({t.block_words for t in tables})}")
        blocks, row_blocks = _concat_blocks(tables)
        row_offsets = np.concatenate([[0], np.cumsum([t.num_mask_rows for t in tables])[:-1]])
        row_blocks, remap = unique_rows(row_blocks)
        mask_row = remap[np.concatenate([t.mask_row.astype(np.int64) + o for t, o in zip(tables, row_offsets)])]
        stop_ids = np.unique(np.concatenate([t.stop_ids for t in tables])).astype(np.int32)
        counts = _concat_counts(tables, offsets) if any(t.has_counts for t in tables) else {}
        if any(t.has_items for t in tables):
            from surecall.grammars.items import concat_items

            counts.update(concat_items(tables, offsets))
        if any(t.has_stack for t in tables):
            from surecall.grammars.stack import concat_stack

            counts.update(concat_stack(tables, offsets))
        return (
            TokenTable(
                mask_blocks=blocks,
                mask_row_blocks=row_blocks,
                mask_row=mask_row.astype(np.int32),
                accept=np.concatenate([t.accept for t in tables]),
                trans_default=np.concatenate(
                    [np.where(t.trans_default >= 0, t.trans_default + o, -1) for t, o in zip(tables, offsets)]
                ).astype(np.int32),
                **exceptions,
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


# BW: packed words (1024 token ids, 128 bytes) per deduplicated mask block. Measured (Llama-3, mask
# bytes at BW 16/32/64): seed catalog 318k/292k/322k, Github_ultra o21378 4.59M/2.82M/2.52M, o62059
# 1.93M/1.28M/1.24M (dense: 2.77M, 67.2M, 26.7M).
MASK_BLOCK_WORDS = 32
TABLE_ARRAYS = ("mask_blocks", "mask_row_blocks", "mask_row", "accept", "trans_default", "exc_row", "exc_ptr",
                "exc_tok", "exc_slot", "exc_base", "exc_targets", "dist", "stop_ids")


_DENSE_PAIRS = 1 << 23  # (states x targets) up to this are marked in a bitmap, past it sorted
# ... and up to this many per exception: a bitmap pair costs ~3 ns (set, count, scan), an exception
# sorted and searched ~50 (the seed catalog's 24k exceptions over 445 x 445 pairs: 1.5 -> 0.9 ms)
_DENSE_PER_EXCEPTION = 16


def share_exception_rows(ptr: np.ndarray, tok: np.ndarray, nxt: np.ndarray) -> dict:
    """The shared exception layout (TokenTable's exc_* fields) of per-state rows given as one CSR
    (`ptr` [S + 1], `tok` sorted inside each row, `nxt` their next states).

    Each state's distinct targets, ascending, are its slots, so two states whose rows send the
    same tokens to the same slots (the same body followed by other text: its copies are numbered
    alike) share one row of (token, slot) pairs and keep only their few targets. numpy's unique
    without an index or inverse hashes: 0.6 s, where the sort behind first-appearance slots took
    4.3 s on JsonSchemaStore config_schema's 9.0M exceptions (the same rows shared either way).
    """
    ptr = np.asarray(ptr, dtype=np.int64)
    n = ptr.size - 1
    lens = np.diff(ptr)
    owner = np.repeat(np.arange(n, dtype=np.int64), lens)
    nxt = np.asarray(nxt, dtype=np.int64)
    width = int(nxt.max()) + 1 if nxt.size else 1
    keys = owner * width + nxt
    if n * width <= min(_DENSE_PAIRS, _DENSE_PER_EXCEPTION * keys.size):  # a bitmap over every (state, target): no sort, no search
        seen = np.zeros(n * width, dtype=bool)
        seen[keys] = True
        pairs = np.flatnonzero(seen)  # (state, target), sorted: grouped by state, targets ascending
        rank = np.cumsum(seen, dtype=np.int32 if n * width < 2**31 else np.int64)[keys] - 1
    else:
        pairs = np.unique(keys)
        rank = np.searchsorted(pairs, keys)
    pair_owner = pairs // width
    base = np.zeros(n + 1, dtype=np.int64)
    base[1:] = np.cumsum(np.bincount(pair_owner, minlength=n))
    most = int(np.diff(base).max()) if n else 0
    slot = (rank - base[owner]).astype(np.uint8 if most <= 256 else np.uint16 if most <= 65536 else np.int32)
    tok = np.asarray(tok, dtype=np.int32)
    exc_row, kept = _equal_rows(ptr, tok, slot)
    row_ptr = np.zeros(kept.size + 1, dtype=np.int64)
    row_ptr[1:] = np.cumsum(lens[kept])
    idx = np.repeat(ptr[kept] - row_ptr[:-1], lens[kept]) + np.arange(int(row_ptr[-1]), dtype=np.int64)
    return {"exc_row": exc_row, "exc_ptr": row_ptr.astype(np.int32), "exc_tok": tok[idx], "exc_slot": slot[idx],
            "exc_base": base.astype(np.int32), "exc_targets": (pairs % width).astype(np.int32)}


def _equal_rows(ptr: np.ndarray, tok: np.ndarray, slot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row of each state, the state that holds each row): states whose (token, slot) rows are
    equal share a row, numbered by first appearance. Rows are grouped by a 64-bit fingerprint,
    then each state is compared with its group's first state element by element; were two
    different rows ever to share a fingerprint, every row is keyed by its bytes instead."""
    n, lens = ptr.size - 1, np.diff(ptr)
    pos = np.arange(tok.size, dtype=np.uint64) - np.repeat(ptr[:-1], lens).astype(np.uint64)
    with np.errstate(over="ignore"):
        mix = ((tok.astype(np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)) ^ (
            (slot.astype(np.uint64) + np.uint64(7)) * np.uint64(0xC2B2AE3D27D4EB4F) + pos * np.uint64(0x165667B19E3779F9))
        mix ^= mix >> np.uint64(29)
        fingerprint = lens.astype(np.uint64) * np.uint64(0xD6E8FEB86659FD93)
        full = np.flatnonzero(lens)
        if full.size:
            fingerprint[full] += np.add.reduceat(mix, ptr[full])
    _, first, group = np.unique(fingerprint, return_index=True, return_inverse=True)
    group = group.reshape(-1)
    rep = first[group]  # each state's group's first state
    dup = np.flatnonzero(rep != np.arange(n))
    if dup.size:  # check the fingerprint's verdict element by element
        k = lens[dup]
        at = np.repeat(ptr[dup] - np.cumsum(k) + k, k) + np.arange(int(k.sum()))
        other = at - np.repeat(ptr[dup], k) + np.repeat(ptr[rep[dup]], k)
        same = (tok[at] == tok[other]) & (slot[at] == slot[other])
        if not same.all():
            return _equal_rows_by_bytes(ptr, tok, slot)
    order = np.sort(first)  # the groups by first appearance
    row_of_group = np.searchsorted(order, first).astype(np.int32)
    return row_of_group[group], order.astype(np.int64)


def _equal_rows_by_bytes(ptr: np.ndarray, tok: np.ndarray, slot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """_equal_rows keyed by each row's bytes (exact, slower)."""
    rows: dict[bytes, int] = {}
    exc_row = np.empty(ptr.size - 1, dtype=np.int32)
    kept = []
    for s, (a, b) in enumerate(zip(ptr[:-1].tolist(), ptr[1:].tolist(), strict=True)):
        key = tok[a:b].tobytes() + slot[a:b].tobytes()  # equal keys: equal lengths, tokens and slots
        r = rows.get(key)
        if r is None:
            r = rows[key] = len(kept)
            kept.append(s)
        exc_row[s] = r
    return exc_row, np.asarray(kept, dtype=np.int64)


def _concat_exceptions(tables: list[TokenTable], offsets: np.ndarray) -> dict:
    """The exc_* fields of `tables` stacked: rows, entries and targets offset, targets moved to the global ids."""
    rows = np.cumsum([0] + [t.exc_ptr.size - 1 for t in tables])
    entries = np.cumsum([0] + [t.num_exceptions for t in tables])
    targets = np.cumsum([0] + [t.exc_targets.size for t in tables])
    wide = max(t.exc_slot.dtype.itemsize for t in tables)
    slot_type = next(t.exc_slot.dtype for t in tables if t.exc_slot.dtype.itemsize == wide)
    return {
        "exc_row": np.concatenate([t.exc_row.astype(np.int64) + r for t, r in zip(tables, rows)]).astype(np.int32),
        "exc_ptr": np.concatenate([t.exc_ptr[:-1].astype(np.int64) + e for t, e in zip(tables, entries)]
                                  + [[int(entries[-1])]]).astype(np.int32),
        "exc_tok": np.concatenate([t.exc_tok for t in tables]).astype(np.int32),
        "exc_slot": np.concatenate([t.exc_slot.astype(slot_type) for t in tables]),
        "exc_base": np.concatenate([t.exc_base[:-1].astype(np.int64) + b for t, b in zip(tables, targets)]
                                   + [[int(targets[-1])]]).astype(np.int32),
        "exc_targets": np.concatenate([t.exc_targets.astype(np.int64) + o
                                       for t, o in zip(tables, offsets)]).astype(np.int32),
    }


def unique_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct rows in order of first appearance, int32 index of each input row among them)."""
    if rows.shape[0] == 0:
        return rows.copy(), np.zeros(0, dtype=np.int32)
    flat = np.ascontiguousarray(rows)
    lone = _lone_rows(flat)
    first: dict = {}
    index = np.empty(rows.shape[0], dtype=np.int32)
    picks = []
    for i, alone in enumerate(lone.tolist()):
        key = i if alone else flat[i].tobytes()  # a row no other row can equal needs no bytes key
        j = first.get(key)
        if j is None:
            j = first[key] = len(picks)
            picks.append(i)
        index[i] = j
    return flat[picks], index


def _lone_rows(flat: np.ndarray) -> np.ndarray:
    """bool per row: no other row has its (sum, xor) of elements, so no other row equals it."""
    if flat.ndim != 2 or flat.dtype.kind not in "iu" or flat.shape[0] < 2:
        return np.zeros(flat.shape[0], dtype=bool)
    key = np.empty((flat.shape[0], 2), dtype=np.int64)
    key[:, 0] = flat.sum(axis=1, dtype=np.int64)
    key[:, 1] = np.bitwise_xor.reduce(flat, axis=1)
    _, inverse, count = np.unique(key, axis=0, return_inverse=True, return_counts=True)
    return count[inverse.reshape(-1)] == 1


def split_blocks(rows: np.ndarray, block_words: int = MASK_BLOCK_WORDS) -> tuple[np.ndarray, np.ndarray]:
    """(int32 [K, BW] distinct blocks, block 0 all zero; int32 [U, NB] each row's blocks) of dense
    packed rows `rows` [U, W]: rows split into BW-word blocks (the last zero-padded), each stored once."""
    rows = np.asarray(rows)
    num_rows, width = rows.shape
    num_blocks = -(-width // block_words)
    if width % block_words == 0 and rows.dtype.itemsize == 4:  # whole blocks: no copy
        padded = np.ascontiguousarray(rows).view(np.int32)
    else:
        padded = np.zeros((num_rows, num_blocks * block_words), dtype=np.int32)
        padded[:, :width] = rows.view(np.int32) if rows.dtype.itemsize == 4 else rows
    flat = padded.reshape(-1, block_words)
    wide = flat.view(np.uint64) if block_words % 2 == 0 else flat  # half the elements to reduce
    live = np.flatnonzero(np.bitwise_or.reduce(wide, axis=1))  # (faster than any() along a short axis)
    distinct, index = unique_short_rows(flat[live])
    ids = np.zeros(flat.shape[0], dtype=np.int32)
    ids[live] = index + 1
    blocks = np.concatenate([np.zeros((1, block_words), dtype=np.int32), distinct])
    return blocks, ids.reshape(num_rows, num_blocks)


# Adapted from https://prng.di.unimi.it/splitmix64.c (its finaliser's constants and shifts)
_MIX_A, _MIX_B = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def unique_short_rows(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """unique_rows by a 64-bit hash per row, sorted once, then checked exactly (every row equal
    to the representative of its hash); on a collision, unique_rows. For many short rows (mask
    blocks) and for a table's rows of block ids (3x faster than unique_rows' bytes keys there)."""
    if blocks.shape[0] == 0:
        return blocks.copy(), np.zeros(0, dtype=np.int32)
    blocks = np.ascontiguousarray(blocks)
    x = blocks.view(np.uint64) if blocks.shape[1] % 2 == 0 else blocks.view(np.uint32).astype(np.uint64)
    # each 64-bit lane through splitmix64's finaliser, then weighted by a random odd constant per
    # position: with a multiply and one shift per lane and weights in arithmetic progression, the
    # hash stayed near linear on the few-bit words of mask blocks (1,552 distinct blocks of a
    # Kubernetes schema shared 1,551 keys, and every compile fell back to unique_rows)
    x = x ^ (x >> np.uint64(30))
    x *= _MIX_A
    x ^= x >> np.uint64(27)
    x *= _MIX_B
    x ^= x >> np.uint64(31)
    from surecall.grammars.automaton import _column_weights  # random odd weights, seeded, kept

    key = (x * _column_weights(x.shape[1]).view(np.uint64)).sum(axis=1, dtype=np.uint64)
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    if not np.array_equal(blocks[first[inverse]], blocks):  # two distinct blocks share a hash
        return unique_rows(blocks)
    order = np.argsort(first, kind="stable")  # number the blocks in order of first appearance
    rank = np.empty(order.size, dtype=np.int32)
    rank[order] = np.arange(order.size, dtype=np.int32)
    return blocks[first[order]], rank[inverse]


def _concat_blocks(tables: list[TokenTable]) -> tuple[np.ndarray, np.ndarray]:
    """(distinct blocks of all `tables`, their mask_row_blocks stacked and renumbered into them)."""
    live = [t.mask_blocks[1:] for t in tables]
    distinct, index = unique_short_rows(np.concatenate(live))
    blocks = np.concatenate([np.zeros((1, tables[0].block_words), dtype=np.int32), distinct])
    out, at = [], 0
    for t, part in zip(tables, live, strict=True):
        remap = np.concatenate([[0], index[at : at + part.shape[0]] + 1]).astype(np.int32)
        out.append(remap[t.mask_row_blocks])
        at += part.shape[0]
    return blocks, np.concatenate(out)


def _check_mask_layout(t: TokenTable) -> None:
    """The block layout's invariants (module docstring), cheap: O(K * BW + U * NB)."""
    blocks, ids = t.mask_blocks, t.mask_row_blocks
    if not isinstance(blocks, np.ndarray) or blocks.dtype != np.int32 or blocks.ndim != 2 or blocks.shape[0] < 1:
        raise ValueError(f"Invalid mask_blocks: expected int32 [K >= 1, BW], got {_describe(blocks)}")
    bw = blocks.shape[1]
    if bw < 1 or bw & (bw - 1):
        raise ValueError(f"Invalid mask_blocks: expected a power-of-two block width, got {bw}")
    if blocks[0].any() or not blocks[1:].any(axis=1).all():
        raise ValueError("Invalid mask_blocks: expected block 0 all zero and every other block non-zero")
    num_blocks = -(-t.num_words // bw)
    if not isinstance(ids, np.ndarray) or ids.dtype != np.int32 or ids.ndim != 2 or ids.shape[1] != num_blocks:
        raise ValueError(f"Invalid mask_row_blocks: expected int32 [U, {num_blocks}], got {_describe(ids)}")
    if ids.size and not 0 <= int(ids.min()) <= int(ids.max()) < blocks.shape[0]:
        raise ValueError(f"Invalid mask_row_blocks: expected block ids in [0, {blocks.shape[0]}), "
                         f"got [{int(ids.min())}, {int(ids.max())}]")
    tail = t.num_words - (num_blocks - 1) * bw  # words of the last block inside the row
    if ids.size and blocks[np.unique(ids[:, -1]), tail:].any():
        raise ValueError(f"Invalid mask_blocks: expected zero words past the row width {t.num_words}")


def _describe(a) -> str:
    return f"{a.dtype} {list(a.shape)}" if isinstance(a, np.ndarray) else type(a).__name__


COUNT_ARRAYS = ("count_row", "count_lo", "count_hi", "count_chars", "count_entry_key", "count_entry_val")
ITEM_ARRAYS = ("item_lo", "item_hi", "item_cost", "item_key", "item_inc", "item_flag", "item_set", "item_next",
               "item_depth", "item_below_lo", "item_below_cost")
STACK_ARRAYS = ("stack_key", "stack_ptr", "stack_edge", "stack_cond_len", "stack_cond_bits", "stack_cond_depth", "stack_pops",
                "stack_push_len", "stack_push_bits", "stack_next", "stack_weight", "stack_item_inc",
                "stack_item_flag", "stack_item_set", "stack_item_charge")


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
