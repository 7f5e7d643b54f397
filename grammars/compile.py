"""Schema / tool catalog / regex -> TokenTable over one vocabulary, with the disk cache inside.

Pipeline: schema.to_regex (or formats.catalog_regex) -> regex -> byte DFA (automaton.py) -> count
marks cut out (counted.py; counted arrays: items.py) -> every state's tokens (tokenwalk.py) -> token-level pruning, dense
renumbering, `dist` (counted: Dijkstra with the unmet minimums), CSR, bitmask and count rows
(here). A grammar whose counted strings cannot be cut out is compiled again without counters. Budgets from GrammarOptions are checked between stages and before the big
allocations, so an oversized grammar stops with CompileBudgetExceeded instead of exhausting the
machine. This module does not generate regexes and does not touch devices (just past 400
lines: the pipeline, its budgets and the cache front are one concern).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections import deque

import numpy as np

from surecall.errors import CompileBudgetExceeded, UnsupportedSchema
from surecall.grammars import cache as table_cache
from surecall.grammars.automaton import (
    ByteDFA,
    bfs_order,
    coreachable,
    regex_to_dfa,
    regex_to_dfa_isolated,
)
from surecall.grammars.counted import (
    CountedCutError,
    add_counts_inplace,
    char_rows,
    check_entries,
)
from surecall.grammars.items import add_items_inplace, cut_all_marks, item_entries
from surecall.grammars.table import TokenTable
from surecall.grammars.tokenwalk import (
    GENERIC_BATCH_PAIRS,
    Row,
    lexical_regions,
    merge_rows,
    token_rows,
    vocab_index,
)

_BYTES_PER_REGEX_CHAR = 1000  # outlines-core's peak memory per regex character, rounded up (measured: > 40)
# Longer regexes get their byte DFA built in a child process that the budgets can kill: a few of
# JSONSchemaBench's take outlines-core 20 s to 8 min. Shorter ones (the seed catalog is ~2k) stay
# in process, where they take milliseconds.
_ISOLATE_REGEX_CHARS = 6000
_PROGRESS_AFTER_S = 2.0  # print a progress note on stderr when a stage ends later than this


def _options(options):
    from surecall.grammars.options import GrammarOptions

    return GrammarOptions() if options is None else options


def compile_regex(regex: str, vocab, options=None, relaxed=None, use_cache: bool | str = True, meta=None) -> TokenTable:
    """Compile a regex (over bytes of UTF-8 text) into a TokenTable over `vocab`."""
    options = _options(options)
    key = table_cache.entry_key("regex", regex, vocab, options)
    return _through_cache(key, use_cache, lambda: _compile_uncached(regex, vocab, options, list(relaxed or []), dict(meta or {})))


def compile_schema(schema: dict, vocab, options=None, use_cache: bool | str = True) -> TokenTable:
    """Compile one JSON Schema (a tool's arguments) into a TokenTable; `relaxed` lists what it does not enforce."""
    from surecall.grammars.schema.to_regex import schema_to_regex

    options = _options(options)
    key = table_cache.entry_key("schema", _canonical(schema), vocab, options)
    return _through_cache(key, use_cache, lambda: _with_fallback(
        lambda opts: schema_to_regex(schema, opts), vocab, options, {"kind": "schema"}))


def compile_catalog(tools, vocab, tool_format: str = "json", options=None, use_cache: bool | str = True) -> TokenTable:
    """Compile a tool catalog (the tagged union of its calls, in `tool_format`'s envelope)."""
    from surecall.grammars.formats import catalog_regex

    options = _options(options)
    text = _canonical({"format": tool_format, "tools": [_tool_as_data(t) for t in tools]})
    key = table_cache.entry_key("catalog", text, vocab, options)

    return _through_cache(key, use_cache, lambda: _with_fallback(
        lambda opts: catalog_regex(tools, tool_format, opts), vocab, options,
        {"kind": "catalog", "format": tool_format}))


def _through_cache(key: str, use_cache: bool | str, build) -> TokenTable:
    """use_cache: True loads a hit or builds and saves; "refresh" builds (cold) and saves; False only builds."""
    if use_cache not in (True, False, "refresh"):
        raise ValueError(f"Invalid use_cache: expected True, False or 'refresh', got {use_cache!r}")
    if use_cache is True:
        hit = table_cache.load(key)
        if hit is not None:
            return hit
    table = build()
    if use_cache:
        table_cache.save(key, table)
    return table


def _with_fallback(to_regex, vocab, options, meta: dict) -> TokenTable:
    """Compile `to_regex(options)`; if its counted strings cannot be cut out, again without counters."""
    started = time.perf_counter()
    result = to_regex(options)
    meta = {**meta, "regex_ms": (time.perf_counter() - started) * 1e3}
    try:
        return _compile_uncached(result.regex, vocab, options, _pairs(result.relaxed), _with_reasons(meta, result))
    except CountedCutError as exc:
        if not options.counted_lengths:
            raise
        plain = dataclasses.replace(options, counted_lengths=False)
        result = to_regex(plain)
        table = _compile_uncached(result.regex, vocab, plain, _pairs(result.relaxed), _with_reasons(meta, result))
        table.meta["counted_fallback"] = str(exc)
        return table


def _compile_uncached(regex: str, vocab, options, relaxed: list, meta: dict) -> TokenTable:
    clock = _Clock(options.time_budget_s)
    # 1. Regex -> pruned byte DFA (outlines-core cannot be interrupted: bound its input first).
    if len(regex) * _BYTES_PER_REGEX_CHAR > options.memory_budget_bytes:
        raise CompileBudgetExceeded(
            f"regex of {len(regex)} characters is too large to compile within the memory budget of "
            f"{options.memory_budget_bytes / 2**20:.0f} MiB (about {_BYTES_PER_REGEX_CHAR} bytes per character); "
            "lower max_ref_depth / max_any_depth / max_bounded_length or raise memory_budget_bytes"
        )
    if len(regex) > _ISOLATE_REGEX_CHARS:
        dfa = regex_to_dfa_isolated(regex, max(options.time_budget_s - clock.elapsed_s(), 0.01),
                                    options.memory_budget_bytes)
    else:
        dfa = regex_to_dfa(regex)
    clock.check("byte DFA")
    return compile_dfa(dfa, vocab, options, relaxed, {**meta, "regex_chars": len(regex)}, clock)


def compile_dfa(dfa: ByteDFA, vocab, options=None, relaxed=None, meta=None, clock=None) -> TokenTable:
    """A byte DFA (built here or composed by a caller, e.g. `tool_modes`) -> TokenTable over `vocab`."""
    options = _options(options)
    clock = clock or _Clock(options.time_budget_s)
    relaxed, meta = list(relaxed or []), dict(meta or {})
    dfa, counted, item_regions = cut_all_marks(dfa)  # count marks (schema.to_regex) become counter regions
    vi = vocab_index(vocab)
    regions = lexical_regions(dfa)
    _check_memory(dfa, vi, regions[2], vocab.logits_width, options.memory_budget_bytes)
    # 2. Every state's tokens (shared lexical-class walks, donors, one batched walk); tokens
    #    that break a length bound on their own are dropped here, the rest are the counters' job.
    rows = token_rows(dfa, vi, regions)
    counts = None
    if counted.num_regions:
        entries = check_entries(rows, dfa, counted, vi)
        counts = (counted, *char_rows(dfa, counted, vi), entries)
    items = None if item_regions is None else (item_regions, item_entries(rows, dfa, item_regions, vi))
    clock.check("token walk")
    # 3. Token-level pruning, renumbering, dist, CSR and mask.
    table = build_table(dfa, rows, vocab, counts, items)
    clock.check("table")
    table.relaxed = relaxed
    table.meta = {
        **meta,
        "dfa_states": dfa.num_states,
        "states": table.num_states,
        "nnz": int(table.trans_tok.shape[0]),
        "table_bytes": table.nbytes,
        "compile_ms": clock.elapsed_s() * 1e3 + meta.get("regex_ms", 0.0),
        "vocab": getattr(vocab, "name", ""),
    }
    return table


def build_table(dfa: ByteDFA, rows: list[Row], vocab, counts=None, items=None) -> TokenTable:
    """Token-level TokenTable from per-state rows: keep states reachable from 0 that reach acceptance.

    A row's shared class part is copied once into the CSR (its next states renumbered through
    its region's id map) and its packed mask words are copied whole; only the extras are
    packed bit by bit.
    """
    n = dfa.num_states
    succ = [_successors(row, n) for row in rows]
    order = _live_states(succ, dfa.accept)
    new_id = np.full(n + 1, -1, dtype=np.int32)
    new_id[order] = np.arange(order.size, dtype=np.int32)
    parts = [_renumbered(rows[q], new_id) for q in order.tolist()]
    sizes = np.fromiter((p[2].size + (0 if p[0] is None else p[0].tok.size) for p in parts), dtype=np.int64,
                        count=len(parts))
    trans_ptr = np.zeros(order.size + 1, dtype=np.int64)
    trans_ptr[1:] = np.cumsum(sizes)
    trans_tok = np.empty(int(trans_ptr[-1]), dtype=np.int32)
    trans_next = np.empty(int(trans_ptr[-1]), dtype=np.int32)
    layouts: dict = {}  # rows sharing a class part and their extras' tokens share one interleaving
    for (base, m, tok, nxt), lo, hi in zip(parts, trans_ptr[:-1].tolist(), trans_ptr[1:].tolist(), strict=True):
        _fill_row(base, m, tok, nxt, trans_tok[lo:hi], trans_next[lo:hi], layouts)
    accept = dfa.accept[order].copy()
    stop_ids = np.asarray(sorted({int(s) for s in vocab.stop_ids if 0 <= s < vocab.logits_width}), dtype=np.int32)
    edges = [new_id[succ[q]] for q in order.tolist()]
    table = TokenTable(
        mask=_pack_mask(parts, accept, stop_ids, vocab.logits_width),
        accept=accept,
        trans_ptr=trans_ptr.astype(np.int32),
        trans_tok=trans_tok,
        trans_next=trans_next,
        dist=np.zeros(order.size, dtype=np.int32),
        vocab_size=vocab.vocab_size,
        logits_width=vocab.logits_width,
        stop_ids=stop_ids,
    )
    if counts is None:
        table.dist = _dist([e[e >= 0] for e in edges], accept)
    else:
        add_counts_inplace(table, counts, order, new_id)
    if items is not None:  # counted arrays (grammars/items.py): item fields, dist with unmet minItems
        add_items_inplace(table, *items, order, new_id)
    return table


def _successors(row: Row, n: int) -> np.ndarray:
    """Distinct next states of one row, ascending."""
    own = _distinct(row.nxt, n)
    if row.base is None:
        return own
    return np.union1d(row.g[row.base.ends], own)


def _renumbered(row: Row, new_id: np.ndarray):
    """(shared class part or None, its region's new ids, extra tokens, their new next states).

    Tokens leading to a pruned state are dropped; a class part that would lose some is copied
    out into the extras (rare: a state of the region is dead at token level).
    """
    mapped = new_id[row.nxt]
    ok = mapped >= 0
    tok, nxt = (row.tok, mapped) if ok.all() else (row.tok[ok], mapped[ok])
    base = row.base
    if base is None:
        return None, None, tok, nxt
    m = new_id[row.g]
    if (m[base.ends] >= 0).all():
        return base, m, tok, nxt
    full = m[base.end]
    keep = full >= 0
    merged = merge_rows((base.tok[keep], full[keep]), (tok, nxt))
    return None, None, *merged


def _fill_row(base, m, tok, nxt, out_tok: np.ndarray, out_next: np.ndarray, layouts: dict) -> None:
    """Write one sorted CSR row: the class part (if any) interleaved with the extras."""
    if base is None:
        out_tok[:] = tok
        out_next[:] = nxt
        return
    if not tok.size:
        out_tok[:] = base.tok
        np.take(m, base.end, out=out_next)
        return
    key = (id(base), tok.tobytes())
    layout = layouts.get(key)
    if layout is None:
        # Where each entry of the row comes from: base entry i -> m[base.end[i]], extra j ->
        # slot len(m) + j of concat(m, nxt).
        at = np.searchsorted(base.tok, tok) + np.arange(tok.size)  # the extras' places in the row
        from_base = np.ones(out_tok.size, dtype=bool)
        from_base[at] = False
        merged_tok = np.empty(out_tok.size, dtype=np.int32)
        merged_tok[from_base] = base.tok
        merged_tok[at] = tok
        source = np.empty(out_tok.size, dtype=np.int64)
        source[from_base] = base.end
        source[at] = m.size + np.arange(tok.size)
        layout = layouts[key] = (merged_tok, source)
    out_tok[:] = layout[0]
    np.take(np.concatenate([m, nxt]), layout[1], out=out_next)


def _distinct(nexts: np.ndarray, n: int) -> np.ndarray:
    """Distinct next states of one row, ascending."""
    if not nexts.size:
        return nexts.astype(np.int64)
    if n <= 4 * nexts.size + 4096:
        return np.flatnonzero(np.bincount(nexts, minlength=n))
    return np.unique(nexts).astype(np.int64)


def _live_states(succ: list[np.ndarray], accept: np.ndarray) -> np.ndarray:
    """States reachable from 0 that reach acceptance over token transitions, in BFS order from 0."""
    succ = [targets.tolist() for targets in succ]
    live = coreachable(succ, accept)
    if not live[0]:
        raise UnsupportedSchema(
            "no token sequence of this vocabulary spells a document the grammar accepts", pointer="", keyword=None
        )
    return bfs_order(succ, 0, live)


_DENSE_ROW_FRACTION = 8  # rows holding more than 1/8 of the width are packed through a bool row


def _pack_mask(parts: list, accept: np.ndarray, stop_ids: np.ndarray, width: int) -> np.ndarray:
    """int32 [S, ceil(width/32)] LSB-first bitmask rows; stop ids only in accepting rows."""
    num_states = accept.shape[0]
    words = (width + 31) // 32
    mask = np.zeros((num_states, words), dtype=np.uint32)
    extras = []  # (row, sorted token ids) packed sparsely below
    bits = np.zeros(words * 32, dtype=bool)
    for q, (base, _, tok, _) in enumerate(parts):
        if base is not None:
            mask[q, : base.words.size] = base.words
            extras.append((q, tok))
        elif tok.size * _DENSE_ROW_FRACTION > width:
            bits[:] = False
            bits[tok] = True
            mask[q] = np.packbits(bits, bitorder="little").view(np.uint32)
        else:
            extras.append((q, tok))
    extras = [(q, tok) for q, tok in extras if tok.size]
    if extras:
        tok = np.concatenate([t for _, t in extras]).astype(np.int64)
        row = np.repeat(np.asarray([q for q, _ in extras], dtype=np.int64), [t.size for _, t in extras])
        # Rows are in state order and sorted inside, so the word keys are sorted: OR each run.
        key = row * words + (tok >> 5)
        starts = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]]))
        shifts = (tok & 31).astype(np.uint32)
        flat = mask.reshape(-1)
        flat[key[starts]] |= np.bitwise_or.reduceat(np.left_shift(np.uint32(1), shifts), starts)
    for s in stop_ids.tolist():
        mask[accept, s >> 5] |= np.uint32(1 << (s & 31))
    return mask.view(np.int32)


def _dist(succ: list[np.ndarray], accept: np.ndarray) -> np.ndarray:
    """Fewest tokens to an accepting state: BFS from the accepting states over reversed edges."""
    n = accept.shape[0]
    pred: list[list[int]] = [[] for _ in range(n)]
    for s, targets in enumerate(succ):
        for t in targets.tolist():
            pred[t].append(s)
    dist = np.full(n, -1, dtype=np.int32)
    dist[accept] = 0
    queue = deque(np.flatnonzero(accept).tolist())
    while queue:
        t = queue.popleft()
        for s in pred[t]:
            if dist[s] < 0:
                dist[s] = dist[t] + 1
                queue.append(s)
    return dist


_WALK_BYTES_PER_PAIR = 64  # the batched walk's arrays per (state, token) pair at its peak


def _check_memory(dfa: ByteDFA, vi, cyclic: np.ndarray, logits_width: int, budget_bytes: int) -> None:
    """Refuse a compile whose table and walk would not fit the memory budget (an upper bound).

    The mask, plus every (state, token) pair that can survive its first byte (then, when that
    is over budget, its first two bytes): 8 bytes each in the CSR, 8 more in the rows of states
    outside lexical classes (class states share one cached walk per shape), and one batch of
    the generic walk.
    """
    words = (logits_width + 31) // 32
    pairs = (dfa.trans >= 0).astype(np.int64) @ vi.grp_count
    estimate = _estimate(dfa, words, pairs, cyclic)
    if estimate > budget_bytes:
        pairs = _pairs_two_bytes(dfa, vi)
        estimate = _estimate(dfa, words, pairs, cyclic)
    if estimate > budget_bytes:
        raise CompileBudgetExceeded(
            f"compile needs about {estimate / 2**20:.0f} MiB ({dfa.num_states} DFA states, "
            f"{int(pairs.sum())} state-token pairs), over the memory budget of {budget_bytes / 2**20:.0f} MiB; "
            "lower max_bounded_length or raise memory_budget_bytes"
        )


def _estimate(dfa: ByteDFA, words: int, pairs: np.ndarray, cyclic: np.ndarray) -> int:
    walked = int(pairs[~cyclic].sum())
    return (dfa.num_states * words * 4 + int(pairs.sum()) * 8 + walked * 8
            + min(walked, 2 * GENERIC_BATCH_PAIRS) * _WALK_BYTES_PER_PAIR)


def _pairs_two_bytes(dfa: ByteDFA, vi) -> np.ndarray:
    """Per state, how many tokens survive their first two bytes (one-byte tokens: their first)."""
    live = dfa.trans >= 0
    groups = vi.grp2_count.reshape(256, 257).astype(np.float64)
    pairs = np.zeros(dfa.num_states, dtype=np.int64)
    for b in np.flatnonzero(live.any(axis=0)).tolist():
        states = np.flatnonzero(live[:, b])
        after = live[dfa.trans[states, b]]
        pairs[states] += np.rint(after @ groups[b, :256] + groups[b, 256]).astype(np.int64)
    return pairs


class _Clock:
    def __init__(self, budget_s: float):
        self.budget_s = budget_s
        self.started = time.perf_counter()
        self.noted = False

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started

    def check(self, stage: str) -> None:
        elapsed = self.elapsed_s()
        if elapsed > self.budget_s:
            raise CompileBudgetExceeded(
                f"compile ran {elapsed:.2f} s, past its time budget of {self.budget_s:g} s, "
                f"after stage {stage!r}; simplify the schema or raise time_budget_s"
            )
        if elapsed > _PROGRESS_AFTER_S:
            print(f"surecall: compiling... {stage} done after {elapsed:.1f} s", file=sys.stderr)


def _canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _with_reasons(meta: dict, result) -> dict:
    """meta plus "relaxed_reasons": why each relaxed (pointer, keyword) is not enforced, in its order."""
    reasons = getattr(result, "reasons", {})
    return {**meta, "relaxed_reasons": [reasons.get((str(p), str(k)), "") for p, k in result.relaxed]}


def _pairs(relaxed) -> list[tuple[str, str]]:
    return [(str(p), str(k)) for p, k in relaxed]


def _tool_as_data(tool):
    if isinstance(tool, dict):
        return tool
    return {"name": getattr(tool, "name", ""), "input_schema": getattr(tool, "input_schema", None)}
