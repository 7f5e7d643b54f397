"""Schema / tool catalog / regex -> TokenTable over one vocabulary, with the disk cache inside.

Pipeline: schema.to_regex (or formats.catalog_regex) -> regex -> byte DFA (automaton.py; a schema's
large values as sub-automata spliced in, splice.py) -> count
marks cut out (counted.py; counted arrays: items.py) -> every state's tokens (tokenwalk.py) -> token-level pruning, dense
renumbering, `dist` (counted: Dijkstra with the unmet minimums), the compact layout (distinct
bitmask rows, default next + exceptions) and count rows (here). A grammar whose counted strings cannot be cut out is compiled again without counters. Budgets from GrammarOptions are checked between stages and before the big
allocations, so an oversized grammar stops with CompileBudgetExceeded instead of exhausting the
machine. This module does not generate regexes and does not touch devices (just past 400
lines: the pipeline, its budgets and the cache front are one concern).
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import sys
import time
from contextlib import contextmanager

import numpy as np

from surecall.errors import CompileBudgetExceeded, SchemaError, UnsupportedSchema
from surecall.grammars import cache as table_cache
from surecall.grammars.automaton import (
    ByteDFA,
    Digraph,
    bfs_order,
    coreachable,
    prestart_isolated,
    range_indices,
    regex_to_dfa,
    regex_to_dfa_isolated,
)
from surecall.grammars.calls import (
    CallMarks,
    CallsUnusable,
    call_entries,
    check_call_dist,
    cut_call_marks,
    frame_levels,
)
from surecall.grammars.counted import (
    CountedCutError,
    add_counts_inplace,
    char_rows,
    check_entries,
    dist_to_accept,
)
from surecall.grammars.items import add_items_inplace, cut_all_marks, item_entries
from surecall.grammars.options import budget_started, one_time_budget
from surecall.grammars.schema.to_regex import free_value_depth
from surecall.grammars.splice import BYTES_PER_STATE as SPLICE_BYTES_PER_STATE
from surecall.grammars.splice import build_spliced, flat_states_estimate
from surecall.grammars.stack import (
    CTX_NONE,
    MAX_STACK_DEPTH,
    StackCutError,
    add_item_charges_inplace,
    add_pop_tokens,
    add_stack_inplace,
    check_stack_dist,
    counted_edges,
    cut_stack_marks,
    dist_edges,
    drop_pairs,
    merge_entries,
    stack_entries,
    stack_value_regex,
)
from surecall.grammars.string_bodies import build_with_shared_bodies
from surecall.grammars.table import (
    MASK_BLOCK_WORDS,
    TokenTable,
    share_exception_rows,
    split_blocks,
    unique_short_rows,
)
from surecall.grammars.tokenwalk import (
    GENERIC_BATCH_PAIRS,
    Row,
    donor_cover,
    lexical_regions,
    merge_rows,
    sort_by_state_token,
    token_rows,
    vocab_index,
)

# "auto" calls pieces (grammars/calls.py) once the splice's copies pass this many states: a
# flat DFA that large compiles in tens of seconds, its called form in a few (Github_ultra o38670).
_CALLS_FROM = 65_536


def _pieces_holding(pieces, text: str) -> bool:
    """Whether some piece holds the piece `text` (directly or through others; pieces hold earlier ones)."""
    from surecall.grammars.splice import placeholders_in

    target = pieces.index(text)
    holders: set[int] = set()
    for i, regex in enumerate(pieces):
        uses = placeholders_in(regex)
        if target in uses or uses & holders:
            holders.add(i)
    return bool(holders)


class UnrollForCalls(Exception):
    """The grammar's copies are too large and its free-form values keep its pieces from being
    called: compile_schema converts again with them unrolled (free_form_stack=False) and calls."""


_BYTES_PER_REGEX_CHAR = 1000  # outlines-core's peak memory per regex character, rounded up (measured: > 40)
# Longer regexes get their byte DFA built in a child process that the budgets can kill: a few of
# JSONSchemaBench's take outlines-core 20 s to 8 min. Shorter ones (the seed catalog is ~2k) stay
# in process, where they take milliseconds.
_ISOLATE_REGEX_CHARS = 6000
_PROGRESS_AFTER_S = 2.0  # print a progress note on stderr when a stage ends later than this
_PROGRESS_EVERY_S = 5.0  # a stage already named (a splice's pieces repeat one) again at most this often


def _options(options):
    from surecall.grammars.options import GrammarOptions

    return GrammarOptions() if options is None else options


# Per-process, per-vocabulary state that the first compile would otherwise pay for (Llama-3, this
# 2-core CPU: ~0.3 s of the seed catalog's first compile of 0.37 s; the next ones take ~35 ms): the
# vocabulary's index (tokenwalk.vocab_index), the graph searches' import (scipy.sparse.csgraph), the
# shared string-body DFA (string_bodies.py) and the token walks of the lexical classes nearly every
# schema has, which are cached by shape. A free-form value is left out: it would add ~0.17 s here
# for the few schemas that have one.
_WARM_UP_SCHEMA = {
    "type": "object",
    "properties": {"s": {"type": "string"}, "b": {"type": "string", "maxLength": 5}, "i": {"type": "integer"},
                   "n": {"type": "number"}, "t": {"type": "boolean"}, "a": {"type": "array", "items": {"type": "string"}}},
    "required": ["s"],
}
_WARMED: set[tuple[str, str]] = set()  # (vocabulary fingerprint, options) warmed in this process


def warm_up(vocab, options=None) -> float:
    """Build the per-process state compiles over `vocab` share (see _WARM_UP_SCHEMA), so that the
    first real compile costs what later ones do; milliseconds taken (0 when already done here).
    It also starts the child process that builds large regexes' DFAs. Nothing is written to the disk cache. A vocabulary or options under which the small schema
    does not compile (budgets, a vocabulary that cannot spell it) leave the set-up to the first
    real compile, which then reports its own error: warming up never raises for them."""
    from surecall.grammars import tokenwalk

    options = _options(options)
    key = (vocab.fingerprint, options.cache_key())
    if key in _WARMED and vocab.fingerprint in tokenwalk._INDEXES:
        return 0.0
    started = time.perf_counter()
    # the child that builds large regexes' DFAs starts its interpreter (~0.5 s) beside this
    prestart_isolated(options.memory_budget_bytes)
    try:
        compile_schema(_WARM_UP_SCHEMA, vocab, options, use_cache=False)
    except (SchemaError, CompileBudgetExceeded):
        return (time.perf_counter() - started) * 1e3
    _WARMED.add(key)
    return (time.perf_counter() - started) * 1e3


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
        lambda opts: schema_to_regex(schema, opts, splice=True), vocab, options, {"kind": "schema"}))


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
    """Compile `to_regex(options)`; past the memory budget, again with conditionals relaxed
    (_with_conditionals_fallback), then, where a recursive `$ref` was cut, with max_ref_depth
    lowered one level at a time down to 0, within what is left of the time budget. Each lower
    depth is stricter (deeper nesting is never written; `narrowed` lists the reference), never
    looser: a recursive schema whose unrolled automaton is too large still gets a grammar whose
    every output validates. The table's meta says which depth it was built with and why."""
    results: dict = {}

    def converted(opts):  # a conversion that raised raises again at once (not after its budget again)
        if opts not in results:
            try:
                results[opts] = to_regex(opts)
            except CompileBudgetExceeded as exc:
                results[opts] = exc
        if isinstance(results[opts], CompileBudgetExceeded):
            raise results[opts]
        return results[opts]

    with one_time_budget(), _one_piece_memo():  # conversion, DFA, walk, table and every fallback share
        return _with_fallbacks_timed(converted, vocab, options, meta)  # time_budget_s, and the pieces' DFAs


# The byte DFAs of a compile's piece regexes, kept across its fallbacks: a fallback converts the
# schema again and most pieces come back as they were (Github_ultra o38670: 29 of 37 the same,
# 0.3 s); and, under ("copies", regex, pieces), the flat splice's finished pieces (build_spliced's
# `resume`). Set by _one_piece_memo for one compile_* call; None outside one.
_PIECE_DFAS: contextvars.ContextVar[dict | None] = contextvars.ContextVar("surecall_piece_dfas", default=None)


@contextmanager
def _one_piece_memo():
    if _PIECE_DFAS.get() is not None:
        yield
        return
    token = _PIECE_DFAS.set({})
    try:
        yield
    finally:
        _PIECE_DFAS.reset(token)


def _with_fallbacks_timed(converted, vocab, options, meta: dict) -> TokenTable:
    started, first_exc = budget_started(), None
    opts = options
    while True:
        try:
            table = _with_conditionals_fallback(converted, vocab, opts, meta)
        except CompileBudgetExceeded as exc:
            left_s = options.time_budget_s - (time.perf_counter() - started)
            if (opts.max_ref_depth == 0 or "memory" not in str(exc) or left_s <= 0
                    or not getattr(converted(opts), "recursion_cut", False)):
                raise
            first_exc = first_exc or exc
            opts = dataclasses.replace(opts, max_ref_depth=opts.max_ref_depth - 1)
            _note_fallback(started, f"the grammar at max_ref_depth={opts.max_ref_depth + 1} passed the memory "
                           f"budget; compiling again at max_ref_depth={opts.max_ref_depth} (stricter: deeper "
                           "recursion is not written)")
            continue
        if first_exc is not None:
            table.meta["narrowed"] = [[p, k, f"{why} (lowered from {options.max_ref_depth}: the deeper grammar "
                                       "passed the memory budget)" if k == "$ref" else why]
                                      for p, k, why in table.meta.get("narrowed", [])]
            table.meta["ref_depth_fallback"] = {"max_ref_depth": opts.max_ref_depth, "from": options.max_ref_depth,
                                                "why": str(first_exc)}
        return table


def _with_conditionals_fallback(converted, vocab, options, meta: dict) -> TokenTable:
    """Compile `converted(options)`; if its table passes the memory budget with conditionals written
    in (schema/conditionals.py), again with them relaxed."""
    relaxed = dataclasses.replace(options, rewrite_conditionals=False)
    try:
        return _with_counted_fallback(converted, vocab, options, meta)
    except CompileBudgetExceeded as exc:
        if not options.rewrite_conditionals or "memory" not in str(exc):
            raise  # (before converting again: a time error would only be followed by another)
        first, second = converted(options), converted(relaxed)
        if (first.regex, _pieces(first)) == (second.regex, _pieces(second)):
            raise
        _note_fallback(budget_started(), "the grammar with if/then/else, `not` and oneOf written in passed the "
                       "memory budget; compiling again with them relaxed (left to the validator)")
        table = _with_counted_fallback(converted, vocab, relaxed, meta)
        table.meta["conditionals_fallback"] = str(exc)
        return table


def _note_fallback(started: float, what: str) -> None:
    """A note on stderr that a long compile starts again (silent in its first _PROGRESS_AFTER_S,
    like the progress notes: a quick fallback needs no comment)."""
    if time.perf_counter() - started > _PROGRESS_AFTER_S:
        print(f"surecall: compiling... {what}", file=sys.stderr)


def _with_counted_fallback(to_regex, vocab, options, meta: dict) -> TokenTable:
    """Compile `to_regex(options)`; if its counted strings cannot be cut out, again without counters."""
    started = time.perf_counter()
    result = to_regex(options)
    meta = {**meta, "regex_ms": (time.perf_counter() - started) * 1e3}
    try:
        return _compile_uncached(result.regex, vocab, options, _pairs(result.relaxed), _with_reasons(meta, result),
                                 _pieces(result))
    except StackCutError as exc:
        if not options.free_form_stack:
            raise
        table = _with_counted_fallback(to_regex, vocab, dataclasses.replace(options, free_form_stack=False), meta)
        table.meta["stack_fallback"] = str(exc)
        return table
    except UnrollForCalls as exc:
        # free-form values unrolled (max_any_depth levels, listed as narrowed) so that every large
        # object can be called; where even that fails, the grammar as it was, copied in full
        try:
            table = _with_counted_fallback(to_regex, vocab, dataclasses.replace(
                options, free_form_stack=False, call_pieces="always"), meta)
        except CompileBudgetExceeded:
            table = None
        if table is None or "calls" not in table.meta:
            return _with_counted_fallback(to_regex, vocab, dataclasses.replace(options, call_pieces="never"), meta)
        table.meta["calls_fallback"] = (f"free-form values unrolled {options.max_any_depth} levels deep so that the "
                                        f"pieces holding them are called ({exc})")
        return table
    except CountedCutError as exc:
        if not options.counted_lengths:
            raise
        # through this function again: the plain grammar may still need its own fallbacks (its large
        # values called with free-form values unrolled: Github_hard o9917)
        table = _with_counted_fallback(to_regex, vocab, dataclasses.replace(options, counted_lengths=False), meta)
        table.meta["counted_fallback"] = str(exc)
        return table


def _compile_uncached(regex: str, vocab, options, relaxed: list, meta: dict, pieces=()) -> TokenTable:
    clock = _Clock(options.time_budget_s)
    # 1. Regex -> pruned byte DFA; with pieces (placeholders in the regex), one DFA per piece,
    #    spliced into the parent's (splice.py).
    #    Either way the string bodies, free numbers and formats come from one per-process DFA each
    #    (string_bodies.py). A long regex's own DFA (the rest, with placeholders) is built in the
    #    child process even where the placeholders make it short: its length decides, as before.
    def build(r: str) -> ByteDFA:
        isolate = len(r) > _ISOLATE_REGEX_CHARS
        return build_with_shared_bodies(r, lambda text: _regex_dfa(text, options, clock, isolate=isolate),
                                        lambda text: _regex_dfa(text, options, clock, pruned=False, isolate=isolate))

    chars = len(regex) + sum(map(len, pieces))
    if pieces:
        memo = _PIECE_DFAS.get()  # each piece's own DFA, built once for every attempt below and every fallback
        parents: dict[str, ByteDFA] = {} if memo is None else memo

        def built(r: str) -> ByteDFA:
            if r not in parents:
                parents[r] = _read_only(build(r))
            return parents[r]

        levels = _FreeValueLevels(pieces, options.whitespace_regex())
        # the flat splice's finished pieces, kept for its retry within the whole budget (after calls
        # failed, in this attempt or in the fallback that copies: Github_ultra o65432, 2.4 s)
        copies: dict = {} if memo is None else memo.setdefault(("copies", regex, tuple(pieces)), {})

        def spliced(calls: bool, budget: int) -> ByteDFA:
            return build_spliced(regex, pieces, built, budget, lambda: clock.check("byte DFA (splice)"),
                                 levels.shared, calls=calls, resume=copies)

        free_value = stack_value_regex(options.whitespace_regex())
        holds_stack = options.free_form_stack and free_value in pieces
        stack_inside = holds_stack and _pieces_holding(pieces, free_value)

        def called() -> TokenTable:
            dfa = spliced(True, options.memory_budget_bytes)
            clock.check("byte DFA")
            if options.call_pieces == "auto" and holds_stack and dfa.num_states > _CALLS_FROM:
                raise CallsUnusable(f"{dfa.num_states} states with pieces called, their free-form values copied")
            return compile_dfa(dfa, vocab, options, relaxed, {**meta, "regex_chars": chars}, clock, is_pruned=True,
                               calls=True)

        meta = {**meta, "pieces": len(pieces)}
        full = options.memory_budget_bytes
        if options.call_pieces == "always":
            try:
                return called()
            except CallsUnusable as exc:  # copied, as under "never"
                meta = {**meta, "calls_unusable": str(exc)}
        # "auto": copies past _CALLS_FROM states (or the memory budget) are called instead
        cap = min(full, _CALLS_FROM * SPLICE_BYTES_PER_STATE) if options.call_pieces == "auto" else full
        try:
            if cap < full:  # copies estimated far past the cap are not made first (o38670: 3.3 s saved)
                _refuse_flat_past(regex, pieces, built, cap // SPLICE_BYTES_PER_STATE, levels.shared)
            dfa = spliced(False, cap)
        except CompileBudgetExceeded as exc:
            if options.call_pieces != "auto" or "splicing sub-automata" not in str(exc):
                raise
            if stack_inside:  # a piece holds a free-form value: on the stack it could not be called
                raise UnrollForCalls(str(exc)) from None
            try:
                return called()
            except (CallsUnusable, CompileBudgetExceeded) as again:
                if isinstance(again, CompileBudgetExceeded) and "splicing sub-automata" not in str(again) \
                        and "memory budget" not in str(again):
                    raise
                if holds_stack:
                    raise UnrollForCalls(str(again)) from None  # bodies holding a free-form value are not called
                if cap >= full:
                    raise exc from None
                dfa = spliced(False, full)  # as before calls: copied within the whole budget
    else:
        dfa = build(regex)
    clock.check("byte DFA")
    return compile_dfa(dfa, vocab, options, relaxed, {**meta, "regex_chars": chars}, clock, is_pruned=True)


def _refuse_flat_past(regex: str, pieces, built, cap_states: int, shared) -> None:
    """Raise the splice's CompileBudgetExceeded at once when flat_states_estimate puts the copies
    past `cap_states` however alternatives share (low) and past twice it if they share nothing
    (high): both bounds held on every flat splice measured, so such copies would pass the cap
    after seconds of copying; "auto" then calls the pieces instead."""
    guess = flat_states_estimate(regex, pieces, built, 2 * cap_states, shared)
    if guess is not None and guess[0] > cap_states and guess[1] > 2 * cap_states:
        raise CompileBudgetExceeded(
            f"splicing sub-automata needs more than {cap_states} states (estimated before copying: "
            f"{guess[0]:,} to {guess[1]:,})")


# The levels of a free-form value (`{}` / `{"type": "object"}` values: to_regex's any_value(d),
# every level a splice piece) are the same in every schema that has one (52 of the benchmark's 186
# compiled schemas): each level's spliced DFA (137 states at level 1, ~10 ms; ~500 at level 2, ~20
# ms) is built once per process, whitespace style and level, and shared read-only.
_FREE_VALUE_DFAS: dict[tuple[str, int | str], ByteDFA] = {}


class _FreeValueLevels:
    """build_spliced's `shared`: the pieces of one regex that are free-form levels use _FREE_VALUE_DFAS."""

    def __init__(self, pieces, ws: str):
        self.pieces, self.ws = pieces, ws
        self.depth: dict[int, int] = {}

    def depth_of(self, index: int) -> int:
        if index not in self.depth:
            self.depth[index] = 0 if not 0 <= index < len(self.pieces) else free_value_depth(
                self.pieces[index], self.ws, self.depth_of)
        return self.depth[index]

    def shared(self, index: int):
        if 0 <= index < len(self.pieces) and self.pieces[index] == stack_value_regex(self.ws):
            key = (self.ws, "stack")
            dfa = _FREE_VALUE_DFAS.get(key)
            return (dfa, None) if dfa is not None else (None, lambda built: _FREE_VALUE_DFAS.setdefault(key, _read_only(built)))
        level = self.depth_of(index)
        if not level:
            return None, None
        key = (self.ws, level)
        dfa = _FREE_VALUE_DFAS.get(key)
        return (dfa, None) if dfa is not None else (None, lambda built: _FREE_VALUE_DFAS.setdefault(key, _read_only(built)))


def _read_only(dfa: ByteDFA) -> ByteDFA:
    """`dfa` with its arrays made read-only: a DFA shared between compiles must not be edited."""
    dfa.trans.flags.writeable = False
    dfa.accept.flags.writeable = False
    return dfa


def _regex_dfa(regex: str, options, clock: _Clock, pruned: bool = True, isolate: bool = False) -> ByteDFA:
    """One regex's pruned byte DFA (outlines-core cannot be interrupted: its input is bounded first);
    `pruned=False` as in regex_to_dfa (a regex built in the child process comes back pruned). It is
    built in the child process when it is long, or when `isolate` says so (the regex it stands for is)."""
    if len(regex) * _BYTES_PER_REGEX_CHAR > options.memory_budget_bytes:
        raise CompileBudgetExceeded(
            f"regex of {len(regex)} characters is too large to compile within the memory budget of "
            f"{options.memory_budget_bytes / 2**20:.0f} MiB (about {_BYTES_PER_REGEX_CHAR} bytes per character); "
            "lower max_ref_depth / max_any_depth / max_bounded_length or raise memory_budget_bytes"
        )
    clock.check("byte DFA")
    if isolate or len(regex) > _ISOLATE_REGEX_CHARS:
        return regex_to_dfa_isolated(regex, max(options.time_budget_s - clock.elapsed_s(), 0.01),
                                     options.memory_budget_bytes)
    return regex_to_dfa(regex, pruned=pruned)


def compile_dfa(dfa: ByteDFA, vocab, options=None, relaxed=None, meta=None, clock=None,
                is_pruned: bool = False, calls: bool = False) -> TokenTable:
    """A byte DFA (built here or composed by a caller, e.g. `tool_modes`) -> TokenTable over `vocab`;
    `is_pruned`: `dfa` is automaton.prune's output (its re-prune is skipped where no mark is cut);
    `calls`: it holds calls.join_calls' marks (bytes no JSON text holds, but free text may)."""
    options = _options(options)
    clock = clock or _Clock(options.time_budget_s)
    relaxed, meta = list(relaxed or []), dict(meta or {})
    dfa, counted, item_regions = cut_all_marks(dfa, is_pruned)  # count marks (schema.to_regex) become counter regions
    marks = cut_stack_marks(dfa)  # free-form values on the bracket stack (grammars/stack.py)
    if marks is not None:
        dfa, marks = marks
    calls = cut_call_marks(dfa) if calls else None  # called pieces' frames on the same stack (grammars/calls.py)
    if calls is not None:
        dfa, calls = calls
        if marks is not None and (marks.ctx[calls.body >= 0] != CTX_NONE).any():
            raise CallsUnusable("a free-form value inside a called body")  # bodies hold none (calls.body_shape)
        if item_regions is not None:
            at = np.concatenate([np.nonzero(calls.push >= 0)[0], calls.site_target])
            if (item_regions.region[at] >= 0).any():
                raise CallsUnusable("a call inside a counted array")
        frame_levels(dfa, calls, MAX_STACK_DEPTH, marks)
        meta = {**meta, "calls": {"pieces": int(calls.code_bits.size), "places": int((calls.push >= 0).sum()),
                                  "sites": int(calls.site_piece.size), "max_frame": int(calls.levels.max())}}
    vi = vocab_index(vocab)
    regions = lexical_regions(dfa)
    _check_memory(dfa, vi, regions[2], vocab.logits_width, options.memory_budget_bytes, regions[1])
    # 2. Every state's tokens (shared lexical-class walks, donors, one batched walk); tokens
    #    that break a length bound on their own are dropped here, the rest are the counters' job.
    rows = token_rows(dfa, vi, regions, check=lambda: clock.within("token walk"))
    stack = None
    string_edges = counted_edges(dfa, counted)
    if marks is not None:  # tokens that cross a bracket of a free-form value: outcomes per row stack
        beside = string_edges
        if calls is not None:  # a token that crosses a call as well is not kept (nor in the call walk)
            beside = (calls.push >= 0) if beside is None else beside | (calls.push >= 0)
        entries, drop = stack_entries(dfa, marks, vi, beside, item_regions, ws=options.whitespace_regex())
        drop_pairs(rows, drop)
        stack = (marks, entries)
    if calls is not None:  # tokens that cross a call or a body's end: outcomes per row stack
        beside = string_edges
        if marks is not None:
            beside = (marks.push > 0) if beside is None else beside | (marks.push > 0)
        entries, drop = call_entries(dfa, calls, vi, beside, item_regions)
        drop_pairs(rows, drop)
        stack = (calls, entries) if stack is None else ((stack[0], calls), merge_entries(stack[1], entries))
    counts = None
    if counted.num_regions:
        entries = check_entries(rows, dfa, counted, vi)
        counts = (counted, *char_rows(dfa, counted, vi), entries)
    items = None if item_regions is None else (item_regions, item_entries(rows, dfa, item_regions, vi))
    clock.check("token walk")
    # 3. Token-level pruning, renumbering, dist, CSR and mask.
    table = build_table(dfa, rows, vocab, counts, items, options.memory_budget_bytes, stack)
    clock.check("table")
    table.relaxed = relaxed
    table.meta = {
        **meta,
        "dfa_states": dfa.num_states,
        "states": table.num_states,
        "nnz": table.num_transitions,
        "exceptions": table.num_exceptions,
        "exception_rows": int(table.exc_ptr.size - 1),
        "mask_rows": table.num_mask_rows,
        "mask_blocks": int(table.mask_blocks.shape[0]),
        "table_bytes": table.nbytes,
        "compile_ms": clock.elapsed_s() * 1e3 + meta.get("regex_ms", 0.0),
        "vocab": getattr(vocab, "name", ""),
    }
    return table


def build_table(dfa: ByteDFA, rows: list[Row], vocab, counts=None, items=None,
                memory_budget_bytes: int | None = None, stack=None) -> TokenTable:
    """Token-level TokenTable from per-state rows: keep states reachable from 0 that reach acceptance.

    Builds the compact layout (table.py) directly: a row's shared class part contributes its
    end-state counts and its exceptions once per (class walk, local default), cached, so no
    full CSR is materialised; mask rows are packed once per distinct (class part, extras, accept).
    """
    n = dfa.num_states
    stop_ids = np.asarray(sorted({int(s) for s in vocab.stop_ids if 0 <= s < vocab.logits_width}), dtype=np.int32)
    if stack is not None:  # one more state, last: where every token that pops leads in the plain table
        add_pop_tokens(rows, stack[1], n)
        dfa = ByteDFA(np.vstack([dfa.trans, np.full((1, 256), -1, dtype=dfa.trans.dtype)]), np.append(dfa.accept, False))
        counts, items = _with_sentinel(counts, items)
        n += 1
    _drop_stop_tokens_inplace(rows, _spelled(stop_ids, vocab))
    own = _Extras(rows)
    edge_src, edge_dst = _edges(rows, own, n)
    if stack is None:
        order = _live_states(Digraph(n, edge_src, edge_dst), dfa.accept)
    else:  # the sentinel leads on to every outcome of the tokens that pop, and stays last
        e = stack[1]
        popping = np.repeat(~e.edge, np.diff(e.ptr))
        outs = np.unique(e.next[popping]).astype(np.int64)
        order = _live_states(Digraph(n, np.concatenate([edge_src, np.full(outs.size, n - 1)]),
                                     np.concatenate([edge_dst, outs])), dfa.accept)
        order = np.append(order[order != n - 1], n - 1)
    new_id = np.full(n + 1, -1, dtype=np.int32)
    new_id[order] = np.arange(order.size, dtype=np.int32)
    parts = _renumbered_all(rows, own, order, new_id)
    accept = dfa.accept[order].copy()
    words, own_pairs = (vocab.logits_width + 31) // 32, sum(int(part[2].size) for part in parts)
    batched = sum(int(part[2].size) for part in parts if _batched_plain(part))
    _check_table_memory(order.size, words, own_pairs, batched, None, memory_budget_bytes)
    default, exc_ptr, exc_tok, exc_next = _exceptions(parts)
    _check_table_memory(order.size, words, own_pairs, batched, int(exc_ptr[-1]), memory_budget_bytes)
    mask_blocks, mask_row_blocks, mask_row = _pack_mask(parts, accept, stop_ids, vocab.logits_width)
    table = TokenTable(
        mask_blocks=mask_blocks,
        mask_row_blocks=mask_row_blocks,
        mask_row=mask_row,
        accept=accept,
        trans_default=default,
        **share_exception_rows(exc_ptr, exc_tok, exc_next),
        dist=np.zeros(order.size, dtype=np.int32),
        vocab_size=vocab.vocab_size,
        logits_width=vocab.logits_width,
        stop_ids=stop_ids,
    )
    if stack is not None:
        add_stack_inplace(table, stack[1], new_id)
    if counts is None:
        src, dst = new_id[edge_src], new_id[edge_dst]
        live = (src >= 0) & (dst >= 0)
        table.dist = dist_to_accept(order.size, accept, *dist_edges(
            table, src[live], dst[live], np.ones(int(live.sum()), dtype=np.int64), order.size - 1))
    else:
        add_counts_inplace(table, counts, order, new_id)
    if items is not None:  # counted arrays (grammars/items.py): item fields, dist with unmet minItems
        add_items_inplace(table, *items, order, new_id)
    if stack is not None:
        add_item_charges_inplace(table)
        for kind in stack[0] if isinstance(stack[0], tuple) else (stack[0],):
            if isinstance(kind, CallMarks):
                check_call_dist(table, kind, new_id)
            else:
                check_stack_dist(table, kind, new_id)
    return table


def _with_sentinel(counts, items):
    """The counted regions and counted arrays with one more state, in none of them (the stack's sentinel)."""
    if counts is not None:
        regions, row_of, *rest = counts
        regions = dataclasses.replace(regions, region=np.append(regions.region, -1),
                                      phase=np.append(regions.phase, -1), rest=np.append(regions.rest, 0))
        counts = (regions, np.append(row_of, -1).astype(row_of.dtype), *rest)
    if items is not None:
        regions, entries = items
        regions = dataclasses.replace(
            regions, region=np.append(regions.region, -1),
            events=np.vstack([regions.events, np.zeros((1, 256), regions.events.dtype)]),
            levels=np.vstack([regions.levels, np.full((1, regions.levels.shape[1]), -1, regions.levels.dtype)]))
        items = (regions, entries)
    return counts, items


def _spelled(ids: np.ndarray, vocab) -> np.ndarray:
    """The ids among `ids` the token walk can take (normal tokens with bytes; specials never are)."""
    special = set(vocab.special_ids)
    keep = [i for i in ids.tolist() if i < vocab.vocab_size and i not in special and vocab.token_bytes[i]]
    return np.asarray(keep, dtype=np.int32)


def _drop_stop_tokens_inplace(rows: list[Row], stop_ids: np.ndarray) -> None:
    """A stop id is never a transition (table.py): drop one a vocabulary spells as text."""
    if not stop_ids.size:
        return
    bases: dict[int, bool] = {}
    for row in rows:
        hit_base = row.base is not None and bases.setdefault(id(row.base), bool(np.isin(stop_ids, row.base.tok).any()))
        if hit_base:
            row.tok, row.nxt = row.materialize()
            row.base, row.g = None, None
        if row.tok.size and np.isin(stop_ids, row.tok).any():
            keep = ~np.isin(row.tok, stop_ids)
            row.tok, row.nxt = row.tok[keep], row.nxt[keep]


def _exceptions(parts: list) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(trans_default, exc_ptr, exc_tok, exc_next): each state's most common next state and the rest.

    Rows without a class part are done together (one sort over all their tokens); rows with
    one reuse its per-walk counts and exceptions (cached by walk), one state at a time.
    """
    num_states = len(parts)
    plain = [q for q, part in enumerate(parts) if _batched_plain(part)]
    big = [q for q, part in enumerate(parts) if part[0] is None and part[2].size > _BIG_ROW]
    based = [q for q, part in enumerate(parts) if part[0] is not None]
    default = np.full(num_states, -1, dtype=np.int32)
    runs = []  # (owner, tokens, next states): exceptions grouped by state, sorted inside
    for q in big:  # one by one: a bincount per row
        _, _, tok, nxt = parts[q]
        default[q] = d = int(np.argmax(np.bincount(nxt)))
        exc = nxt != d
        runs.append((np.full(int(exc.sum()), q, dtype=np.int64), tok[exc], nxt[exc]))
    if plain:
        own = [parts[q] for q in plain]
        owner = np.repeat(np.asarray(plain, dtype=np.int64), [p[2].size for p in own])
        tok = np.concatenate([p[2] for p in own])
        nxt = np.concatenate([p[3] for p in own]).astype(np.int64)
        default[plain] = _most_common(owner, nxt, num_states)
        exc = nxt != default[owner]
        runs.append((owner[exc], tok[exc], nxt[exc]))
    if based:
        based_default, (owner, tok, nxt) = _exceptions_based([parts[q] for q in based], num_states)
        default[based] = based_default
        runs.append((np.asarray(based, dtype=np.int64)[owner], tok, nxt))
    ptr = np.zeros(num_states + 1, dtype=np.int64)
    for owner, _, _ in runs:
        ptr[1:] += np.bincount(owner, minlength=num_states)
    ptr = np.cumsum(ptr)
    tok = np.empty(int(ptr[-1]), dtype=np.int32)
    nxt = np.empty(int(ptr[-1]), dtype=np.int32)
    for owner, t, x in runs:  # each entry at its state's offset plus its rank in its run (no sort)
        if owner.size:
            starts = np.flatnonzero(np.concatenate([[True], owner[1:] != owner[:-1]]))
            at = ptr[owner] + np.arange(owner.size) - np.repeat(starts, np.diff(np.append(starts, owner.size)))
            tok[at], nxt[at] = t, x
    return default, ptr.astype(np.int32), tok, nxt


_DENSE_COUNTS = 1 << 20  # (owners x states) count matrices up to this size are counted densely


def _most_common(owner: np.ndarray, nxt: np.ndarray, num_states: int) -> np.ndarray:
    """Per distinct owner (ascending), its most common next state, the smallest on a tie."""
    starts = np.flatnonzero(np.concatenate([[True], owner[1:] != owner[:-1]]))  # owner is grouped
    rank = np.repeat(np.arange(starts.size, dtype=np.int64), np.diff(np.append(starts, owner.size)))
    return _most_votes(rank, nxt, None, starts.size, num_states)


def _exceptions_based(parts: list, num_states: int) -> tuple[np.ndarray, tuple]:
    """(defaults, (owner, tokens, next states)) of rows that have a class part: owner indexes
    `parts`, the entries grouped by owner, tokens ascending inside.

    A class part alone defaults to its most common local end state (the smallest on a tie). The
    other rows' defaults are voted all at once: a row's own tokens count one each, its class
    part's tokens per local end state; the most votes win, the smallest state on a tie. A row's
    exceptions are its class part's tokens that do not end at the default and its own that do not
    lead there, merged in one sort. A walk's counts and exceptions per local default are kept
    with the walk (ClassWalk.derived), so the next grammar with that class reuses them.
    """
    k = len(parts)
    rows = np.arange(k, dtype=np.int64)
    if not k:
        return np.zeros(0, dtype=np.int32), (rows, _NO_TOKENS, _NO_TOKENS)
    own_sizes = np.fromiter((p[2].size for p in parts), dtype=np.int64, count=k)
    own_owner = np.repeat(rows, own_sizes)
    own_tok = np.concatenate([p[2] for p in parts]).astype(np.int32)
    own_next = np.concatenate([p[3] for p in parts]).astype(np.int64)
    defaults = np.full(k, -1, dtype=np.int32)
    local_default = np.full(k, -1, dtype=np.int64)
    # 1. Votes of the rows with own tokens: (row, next state) with weights; a class part's carry
    #    their local state (its end states map to distinct states).
    voting = np.flatnonzero(own_sizes).tolist()
    if voting:
        end_sizes = np.fromiter((parts[i][0].ends.size for i in voting), dtype=np.int64, count=len(voting))
        end_owner = np.repeat(np.asarray(voting, dtype=np.int64), end_sizes)
        end_local = np.concatenate([parts[i][0].ends for i in voting]).astype(np.int64)
        end_target = np.concatenate([parts[i][1][parts[i][0].ends] for i in voting]).astype(np.int64)
        owner = np.concatenate([own_owner, end_owner])
        weight = np.concatenate([np.ones(own_owner.size), *(parts[i][0].end_counts() for i in voting)])
        defaults[:] = _most_votes(owner, np.concatenate([own_next, end_target]), weight, k, num_states)
        hit = end_target == defaults[end_owner]
        local_default[end_owner[hit]] = end_local[hit]
    # 2. The exceptions: class parts' (kept with the walk per local default, mapped through the
    #    row's region ids) and own, merged in one sort by (row, token).
    offsets: dict[int, int] = {}  # id(region ids) -> its offset in `maps`
    maps, map_at, part_tok, part_end = [], np.empty(k, dtype=np.int64), [], []
    at = 0
    for i, (base, m, tok, _) in enumerate(parts):
        if tok.size:
            ld = int(local_default[i])
        else:
            ld = base.most_common_end()
            if ld >= 0:
                defaults[i], local_default[i] = m[ld], ld
        part = base.not_ending_at(ld)
        part_tok.append(part[0])
        part_end.append(part[1])
        offset = offsets.get(id(m))
        if offset is None:
            offset = offsets[id(m)] = at
            maps.append(m)
            at += m.size
        map_at[i] = offset
    part_sizes = np.fromiter((t.size for t in part_tok), dtype=np.int64, count=k)
    base_next = np.concatenate(maps)[np.concatenate(part_end).astype(np.int64) + np.repeat(map_at, part_sizes)]
    exc = own_next != defaults[own_owner]
    owner = np.concatenate([np.repeat(rows, part_sizes), own_owner[exc]])
    tok = np.concatenate([*part_tok, own_tok[exc]]).astype(np.int32)
    nxt = np.concatenate([base_next, own_next[exc]]).astype(np.int32)
    return defaults, sort_by_state_token(owner, tok, nxt, int(tok.max()) + 1 if tok.size else 1)


def _most_votes(owner: np.ndarray, target: np.ndarray, weight: np.ndarray | None, k: int, num_states: int) -> np.ndarray:
    """Per row 0..k-1 the target with the most weight (one each without `weight`) among its
    (owner, target) votes (a pair may repeat), the smallest on a tie; -1 for a row without votes."""
    out = np.full(k, -1, dtype=np.int32)
    keys = owner * num_states + target
    if k * num_states <= _DENSE_COUNTS:
        counts = np.bincount(keys, weights=weight, minlength=k * num_states).reshape(k, num_states)
        best = counts.argmax(axis=1)  # the first maximum: the smallest state
        voted = counts[np.arange(k), best] > 0
        out[voted] = best[voted]
        return out
    # numpy's unique without counts takes a hash table, then sorts only the distinct keys (a few
    # per owner): 1.8x faster than sorting every key (3.6M on GeoJSON's table) for the counts.
    key = np.unique(keys)
    total = np.bincount(np.searchsorted(key, keys), weights=weight, minlength=key.size)
    who, state = np.divmod(key, num_states)
    best = np.lexsort((state, -total, who))
    first = np.ones(best.size, dtype=bool)
    first[1:] = who[best][1:] != who[best][:-1]
    out[who[best[first]]] = state[best[first]]
    return out


_NO_TOKENS = np.zeros(0, dtype=np.int32)


_BIG_ROW = 4096  # rows with more extra tokens are handled one by one (batching them only copies)


def _batched_plain(part) -> bool:
    """A row without a class part that _exceptions takes with the others in one batch."""
    return part[0] is None and 0 < part[2].size <= _BIG_ROW


class _Extras:
    """The own (extra) tokens of every row up to _BIG_ROW of them, as one CSR over the DFA's states."""

    def __init__(self, rows: list[Row]):
        sizes = np.fromiter((row.tok.size for row in rows), dtype=np.int64, count=len(rows))
        self.big = np.flatnonzero(sizes > _BIG_ROW).tolist()
        sizes[self.big] = 0
        self.ptr = np.zeros(len(rows) + 1, dtype=np.int64)
        self.ptr[1:] = np.cumsum(sizes)
        self.owner = np.repeat(np.arange(len(rows), dtype=np.int64), sizes)
        small = [row.tok for row, size in zip(rows, sizes.tolist(), strict=True) if size]
        self.tok = np.concatenate(small).astype(np.int32) if small else _NO_TOKENS
        small = [row.nxt for row, size in zip(rows, sizes.tolist(), strict=True) if size]
        self.nxt = np.concatenate(small).astype(np.int64) if small else _NO_TOKENS.astype(np.int64)


def _edges(rows: list[Row], own: _Extras, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct token edges (source, target) of the DFA states, sorted by source then target."""
    based = [q for q, row in enumerate(rows) if row.base is not None]
    ends = [rows[q].g[rows[q].base.ends] for q in based] + [_distinct(rows[q].nxt, n) for q in own.big]
    owners = np.asarray(based + own.big, dtype=np.int64)
    src = np.concatenate([own.owner, np.repeat(owners, [e.size for e in ends])])
    dst = np.concatenate([own.nxt, *ends]).astype(np.int64) if ends else own.nxt
    if n * n <= _DENSE_COUNTS * 8:  # a bitmap over all (source, target) pairs: no sort
        seen = np.zeros(n * n, dtype=bool)
        seen[src * n + dst] = True
        key = np.flatnonzero(seen)
    else:
        key = np.unique(src * n + dst)
    return key // n, key % n


def _distinct(nexts: np.ndarray, n: int) -> np.ndarray:
    """Distinct next states of one row, ascending."""
    if not nexts.size:
        return nexts.astype(np.int64)
    if n <= 4 * nexts.size + 4096:
        return np.flatnonzero(np.bincount(nexts, minlength=n))
    return np.unique(nexts).astype(np.int64)


def _renumbered_all(rows: list[Row], own: _Extras, order: np.ndarray, new_id: np.ndarray) -> list:
    """Per state of `order` (the new ids): (shared class part or None, its region's new ids,
    extra tokens, their new next states).

    Tokens leading to a pruned state are dropped; a class part that would lose some is copied
    out into the extras (rare: a state of the region is dead at token level).
    """
    lo, hi = own.ptr[order], own.ptr[order + 1]
    sizes = hi - lo
    take = range_indices(lo, sizes)
    mapped = new_id[own.nxt[take]]
    ok = mapped >= 0
    tok, nxt = own.tok[take][ok], mapped[ok]
    kept = np.zeros(order.size + 1, dtype=np.int64)
    kept[1:] = np.cumsum(np.bincount(np.repeat(np.arange(order.size), sizes)[ok], minlength=order.size))
    bounds = kept.tolist()
    parts = []
    maps: dict[int, tuple] = {}  # id(region map) -> (its new ids, whether all are kept), once per region
    big = set(own.big)
    for i, q in enumerate(order.tolist()):
        row = rows[q]
        t, x = tok[bounds[i] : bounds[i + 1]], nxt[bounds[i] : bounds[i + 1]]
        if q in big:
            mapped = new_id[row.nxt]
            ok = mapped >= 0
            t, x = (row.tok, mapped) if ok.all() else (row.tok[ok], mapped[ok])
        base = row.base
        if base is None:
            parts.append((None, None, t, x))
            continue
        hit = maps.get(id(row.g))
        if hit is None:
            m = new_id[row.g]
            hit = maps[id(row.g)] = (m, bool((m >= 0).all()))
        m, whole = hit
        if whole or (m[base.ends] >= 0).all():
            parts.append((base, m, t, x))
            continue
        full = m[base.end]
        keep = full >= 0
        parts.append((None, None, *merge_rows((base.tok[keep], full[keep]), (t, x))))
    return parts


def _live_states(graph: Digraph, accept: np.ndarray) -> np.ndarray:
    """States reachable from 0 that reach acceptance over token transitions, in BFS order from 0."""
    live = coreachable(graph, accept)
    if not live[0]:
        raise UnsupportedSchema(
            "no token sequence of this vocabulary spells a document the grammar accepts", pointer="", keyword=None
        )
    return bfs_order(graph, 0, live)


_DENSE_ROW_FRACTION = 8  # rows holding more than 1/8 of the width are packed through a bool row


def _pack_mask(parts: list, accept: np.ndarray, stop_ids: np.ndarray, width: int) -> tuple:
    """(mask_blocks, mask_row_blocks, mask_row) of the LSB-first bitmask rows over `width` (table.py);
    stop ids only in accepting rows. A row is packed once per distinct (class part, extra tokens,
    accepting), split into blocks stored once each, then rows equal block for block are merged."""
    words = (width + 31) // 32
    keys: dict[tuple, int] = {}
    key_of = np.empty(len(parts), dtype=np.int64)
    firsts = []
    for q, (base, _, tok, _) in enumerate(parts):
        key = (None if base is None else id(base), tok.tobytes(), bool(accept[q]))
        k = keys.get(key)
        if k is None:
            k = keys[key] = len(firsts)
            firsts.append(q)
        key_of[q] = k
    padded = -(-words // MASK_BLOCK_WORDS) * MASK_BLOCK_WORDS  # whole blocks: split_blocks needs no copy
    mask = np.zeros((len(firsts), padded), dtype=np.uint32)
    extras = []  # (row, sorted token ids) packed sparsely below
    bits = np.zeros(words * 32, dtype=bool)
    for r, q in enumerate(firsts):
        base, _, tok, _ = parts[q]
        if base is not None:
            mask[r, : base.words.size] = base.words
            extras.append((r, tok))
        elif tok.size * _DENSE_ROW_FRACTION > width:
            bits[:] = False
            bits[tok] = True
            mask[r, :words] = np.packbits(bits, bitorder="little").view(np.uint32)
        else:
            extras.append((r, tok))
    extras = [(r, tok) for r, tok in extras if tok.size]
    if extras:
        tok = np.concatenate([t for _, t in extras]).astype(np.int64)
        row = np.repeat(np.asarray([r for r, _ in extras], dtype=np.int64), [t.size for _, t in extras])
        # Rows are in order and sorted inside, so the word keys are sorted: OR each run.
        key = row * padded + (tok >> 5)
        starts = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]]))
        shifts = (tok & 31).astype(np.uint32)
        flat = mask.reshape(-1)
        flat[key[starts]] |= np.bitwise_or.reduceat(np.left_shift(np.uint32(1), shifts), starts)
    accepting = accept[np.asarray(firsts, dtype=np.int64)]
    for s in stop_ids.tolist():
        mask[accepting, s >> 5] |= np.uint32(1 << (s & 31))
    blocks, row_blocks = split_blocks(mask.view(np.int32))
    row_blocks, index = unique_short_rows(row_blocks)
    return blocks, row_blocks, index[key_of].astype(np.int32)


# Memory per unit of a compile past its byte DFA, measured (peak RSS growth after the check,
# 2026-12-06, benchmarks/results/compile_history.md, "memory estimate") on the schemas the old
# bound refused or underestimated; each bound is 1.2-2x their largest measured use:
_WALK_BYTES_PER_PAIR = 64  # the batched walk's arrays per (state, token) pair at its peak
_STATE_BYTES = 2048  # per DFA state: its byte rows in the walk's copies, walk flags, Row, table arrays
_KEPT_BYTES_PER_PAIR = 16  # a state's own (token, next) pair, kept from the walk until the table is built
_PLAIN_BYTES_PER_PAIR = 24  # a pair of a short plain row while _exceptions counts them all in one batch
_EXC_BYTES = 88  # an exception while equal exception rows are found and shared (share_exception_rows)


def _state_bytes(words: int) -> int:
    """Per DFA state: _STATE_BYTES plus half a mask row (mask rows are packed once per distinct row,
    and states of one class share theirs; measured use stays under half a row per state)."""
    return _STATE_BYTES + words * 2


def _check_memory(dfa: ByteDFA, vi, cyclic: np.ndarray, logits_width: int, budget_bytes: int,
                  comp: np.ndarray | None = None) -> None:
    """Refuse, before the token walk, a compile whose walk cannot fit the memory budget.

    Per state its fixed share, plus every (state, token) pair of a state outside the lexical
    classes that survives its first byte (then, when that is over budget, its first two bytes),
    kept until the table is built, plus one batch of the generic walk. Class states share one
    cached walk per shape: their pairs cost nothing per state; with the regions' ids (`comp`),
    nor do the pairs a donor's class part is expected to cover (tokenwalk.donor_cover), whose
    parts are counted instead. build_table checks again with the pairs and exceptions the walk
    found (_check_table_memory), before the table's own peak.
    """
    estimate, walked = walk_estimate(dfa, vi, cyclic, logits_width, budget_bytes, comp)
    if estimate > budget_bytes:
        raise CompileBudgetExceeded(
            f"compile needs about {estimate / 2**20:.0f} MiB ({dfa.num_states} DFA states, "
            f"{walked} state-token pairs to walk), over the memory budget of "
            f"{budget_bytes / 2**20:.0f} MiB; lower max_bounded_length or raise memory_budget_bytes"
        )


def walk_estimate(dfa: ByteDFA, vi, cyclic: np.ndarray, logits_width: int, budget_bytes: int,
                  comp: np.ndarray | None = None) -> tuple[int, int]:
    """(_check_memory's estimate in bytes, the pairs to walk it counts): pairs that survive their
    first byte, or their first two where the first bound passes `budget_bytes`; with `comp`, less
    the pairs donors are expected to cover, plus the class-walk parts made for them."""
    words = (logits_width + 31) // 32
    covered, parts = (None, 0) if comp is None else donor_cover(dfa, vi, comp, cyclic)
    live = dfa.trans >= 0
    if covered is not None:
        live &= ~covered
    pairs = live.astype(np.int64) @ vi.grp_count
    estimate = _estimate(dfa, words, pairs, cyclic) + parts
    if estimate > budget_bytes:
        pairs = _pairs_two_bytes(dfa, vi, covered)
        estimate = _estimate(dfa, words, pairs, cyclic) + parts
    return estimate, int(pairs[~cyclic].sum())


def _estimate(dfa: ByteDFA, words: int, pairs: np.ndarray, cyclic: np.ndarray) -> int:
    walked = int(pairs[~cyclic].sum())
    return (dfa.num_states * _state_bytes(words) + walked * _KEPT_BYTES_PER_PAIR
            + min(walked, 2 * GENERIC_BATCH_PAIRS) * _WALK_BYTES_PER_PAIR)


def _check_table_memory(num_states: int, words: int, own_pairs: int, batched: int, exceptions: int | None,
                        budget_bytes: int | None) -> None:
    """Refuse to build a table the memory budget cannot hold, from what the walk found: `own_pairs`
    (pairs outside shared class parts), `batched` (those of the plain rows _exceptions takes in one
    batch, not one row at a time) and, once counted, the `exceptions` (None: not yet)."""
    if budget_bytes is None:
        return
    kept = num_states * _state_bytes(words) + own_pairs * _KEPT_BYTES_PER_PAIR
    if exceptions is None:
        estimate, what = kept + batched * _PLAIN_BYTES_PER_PAIR, f"{own_pairs} own token pairs"
    else:
        estimate, what = kept + exceptions * _EXC_BYTES, f"{own_pairs} own token pairs, {exceptions} exceptions"
    if estimate > budget_bytes:
        raise CompileBudgetExceeded(
            f"compile needs about {estimate / 2**20:.0f} MiB to build its table ({num_states} states, {what}), "
            f"over the memory budget of {budget_bytes / 2**20:.0f} MiB; simplify the schema or raise "
            "memory_budget_bytes"
        )


def _pairs_two_bytes(dfa: ByteDFA, vi, exclude: np.ndarray | None = None) -> np.ndarray:
    """Per state, how many tokens survive their first two bytes (one-byte tokens: their first).

    after[t, b]: the tokens starting with byte b whose second byte state t takes (plus those that
    are b alone), one matmul per block of states (counts are integers below 2^24: exact in
    float32); then each state sums it over its edges (but those `exclude` [S, 256] holds).
    """
    groups = vi.grp2_count.reshape(256, 257)
    second = groups[:, :256].T.astype(np.float32)
    after = np.empty(dfa.trans.shape, dtype=np.int32)
    for lo in range(0, dfa.num_states, _PAIRS_BLOCK):
        live = (dfa.trans[lo : lo + _PAIRS_BLOCK] >= 0).astype(np.float32)
        after[lo : lo + live.shape[0]] = np.rint(live @ second).astype(np.int32) + groups[:, 256]
    pairs = np.zeros(dfa.num_states, dtype=np.int64)
    columns = np.arange(256)
    for lo in range(0, dfa.num_states, _PAIRS_BLOCK):
        trans = dfa.trans[lo : lo + _PAIRS_BLOCK]
        live = trans >= 0
        if exclude is not None:
            live &= ~exclude[lo : lo + _PAIRS_BLOCK]
        pairs[lo : lo + trans.shape[0]] = np.where(live, after[trans, columns], 0).sum(axis=1, dtype=np.int64)
    return pairs


_PAIRS_BLOCK = 4096  # states per block of _pairs_two_bytes' matmul and gather ([block, 256])


class _Clock:
    def __init__(self, budget_s: float):
        self.budget_s = budget_s
        self.started = budget_started()  # the budget is the whole compile's (options.one_time_budget)
        self.noted: set[str] = set()  # the stages a progress note has named
        self.noted_at = 0.0  # elapsed seconds at the last note

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started

    def within(self, stage: str, when: str = "during") -> float:
        """Raise past the budget while `stage` runs (no progress note: the stage is not done);
        the seconds elapsed otherwise."""
        elapsed = self.elapsed_s()
        if elapsed > self.budget_s:
            raise CompileBudgetExceeded(
                f"compile ran {elapsed:.2f} s, past its time budget of {self.budget_s:g} s, "
                f"{when} stage {stage!r}; simplify the schema or raise time_budget_s"
            )
        return elapsed

    def check(self, stage: str) -> None:
        elapsed = self.within(stage, "after")
        if elapsed > _PROGRESS_AFTER_S and (stage not in self.noted or elapsed - self.noted_at >= _PROGRESS_EVERY_S):
            print(f"surecall: compiling... {stage} done after {elapsed:.1f} s", file=sys.stderr)
            self.noted.add(stage)
            self.noted_at = elapsed


def _canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _with_reasons(meta: dict, result) -> dict:
    """meta plus "relaxed_reasons": why each relaxed (pointer, keyword) is not enforced, in its order;
    "narrowed": [pointer, keyword, why] where the grammar is stricter than the schema (absent: nowhere);
    "notes": how the schema was read where it was not as usual (schema_to_regex's notes; absent: none)."""
    reasons = getattr(result, "reasons", {})
    narrowed = [[p or "/", k, why] for (p, k), why in getattr(result, "narrowed", {}).items()]
    notes = list(getattr(result, "notes", None) or [])
    return {**meta, "relaxed_reasons": [reasons.get((str(p), str(k)), "") for p, k in result.relaxed],
            **({"narrowed": narrowed} if narrowed else {}), **({"notes": notes} if notes else {})}


def _pieces(result) -> list[str]:
    return list(getattr(result, "pieces", None) or [])


def _pairs(relaxed) -> list[tuple[str, str]]:
    return [(str(p), str(k)) for p, k in relaxed]


def _tool_as_data(tool):
    if isinstance(tool, dict):
        return tool
    return {"name": getattr(tool, "name", ""), "input_schema": getattr(tool, "input_schema", None)}
