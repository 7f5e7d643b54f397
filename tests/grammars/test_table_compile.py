"""The table compiler: regex -> byte DFA -> TokenTable, checked against slow references.

Fast cases use a small synthetic vocabulary (every byte plus multi-byte tokens that cross JSON
token boundaries) and the seed tool schemas over Llama-3 (loaded once per module). The corpus
sweeps live in test_grammar_fuzz.py.
"""

from __future__ import annotations

import json
import os
import random
from collections import deque

import numpy as np
import pytest

from surecall.errors import CompileBudgetExceeded, RequestError
from surecall.grammars import cache as table_cache
from surecall.grammars import tokenwalk
from surecall.grammars.automaton import regex_to_dfa
from surecall.grammars.compile import build_table, compile_regex, compile_schema
from surecall.grammars.options import GrammarOptions
from surecall.grammars.table import TABLE_ARRAYS
from surecall.grammars.tokenwalk import VocabIndex, token_rows
from surecall.grammars.vocab.core import Vocab
from surecall.grammars.walk import accepts, decode, random_walk

JSONISH = r'\{ ?"a" ?: ?(?:"(?:[^"\\\x00-\x1f]|\\["\\nt])*"|-?(?:0|[1-9][0-9]*)|true) ?(?:, ?"b" ?: ?\[(?:(?:0|[1-9][0-9]*)(?:,(?:0|[1-9][0-9]*))*)?\])? ?\}'


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SURECALL_CACHE_DIR", str(tmp_path / "cache"))


def synthetic_vocab() -> Vocab:
    pieces = [bytes([b]) for b in range(256)]
    pieces += [b'{"', b'{"a', b'":', b'": "', b'"}', b'",', b', "', b'"b', b'12', b'0,', b'[1', b'],',
               b'true', b' }', b'\\n', b'\\"', b'ab', b'\xc3\xa9t\xc3\xa9', b'\xe2\x82', b'\xac"', b'"a":1}']
    pieces += [b"", b""]  # two specials: a stop id and a control token
    stop, control = len(pieces) - 2, len(pieces) - 1
    return Vocab(token_bytes=tuple(pieces), special_ids=frozenset({stop, control}), stop_ids=(stop,),
                 logits_width=len(pieces) + 7, format="test", name="synthetic")


def reference_rows(dfa, vocab):
    """Every (state, token) walked byte by byte in Python."""
    rows = []
    for q in range(dfa.num_states):
        row = {}
        for t, piece in enumerate(vocab.token_bytes):
            if not piece or t in vocab.special_ids:
                continue
            s = q
            for b in piece:
                s = int(dfa.trans[s, b])
                if s < 0:
                    break
            if s >= 0:
                row[t] = s
        rows.append(row)
    return rows


def reference_table(dfa, rows, vocab) -> dict:
    """The TokenTable arrays built the slow, obvious way from materialised rows (dicts and loops)."""
    succ = [sorted(set(nxt.tolist())) for _, nxt in rows]
    pred = [[] for _ in rows]
    for s, targets in enumerate(succ):
        for t in targets:
            pred[t].append(s)
    live, queue = set(np.flatnonzero(dfa.accept).tolist()), deque(np.flatnonzero(dfa.accept).tolist())
    while queue:
        for s in pred[queue.popleft()]:
            if s not in live:
                live.add(s)
                queue.append(s)
    order, queue = [0], deque([0])
    while queue:
        for t in succ[queue.popleft()]:
            if t in live and t not in order:
                order.append(t)
                queue.append(t)
    new_id = {old: new for new, old in enumerate(order)}
    words = (vocab.logits_width + 31) // 32
    mask = np.zeros((len(order), words * 32), dtype=bool)
    ptr, toks, nexts = [0], [], []
    for i, q in enumerate(order):
        for t, n in zip(*rows[q], strict=True):
            if int(n) in new_id:
                toks.append(int(t))
                nexts.append(new_id[int(n)])
                mask[i, int(t)] = True
        ptr.append(len(toks))
    accept = dfa.accept[order]
    for s in vocab.stop_ids:
        mask[accept, s] = True
    packed = np.packbits(mask, axis=1, bitorder="little").view(np.uint32).view(np.int32)
    return {"mask": packed, "accept": accept, "trans_ptr": np.asarray(ptr, np.int32),
            "trans_tok": np.asarray(toks, np.int32), "trans_next": np.asarray(nexts, np.int32)}


def dense_view(table) -> dict:
    """The table as one mask row per state and full CSR rows (the layout before issue 15)."""
    rows = [table.transitions(s) for s in range(table.num_states)]
    ptr = np.concatenate([[0], np.cumsum([t.size for t, _ in rows])]).astype(np.int32)
    return {"mask": table.mask_dense(table.mask_row), "accept": table.accept, "trans_ptr": ptr,
            "trans_tok": np.concatenate([t for t, _ in rows]).astype(np.int32),
            "trans_next": np.concatenate([n for _, n in rows]).astype(np.int32)}


def reference_dist(table) -> np.ndarray:
    out = np.full(table.num_states, -1)
    for s0 in range(table.num_states):
        seen, queue = {s0: 0}, deque([s0])
        while queue:
            s = queue.popleft()
            if table.accept[s]:
                out[s0] = seen[s]
                break
            for n in table.transitions(s)[1].tolist():
                if n not in seen:
                    seen[n] = seen[s] + 1
                    queue.append(n)
    return out


def counted_dist_is_consistent(table) -> bool:
    """With counters dist is the shortest path under table.py's rule; positive weights make the
    Bellman equations' solution unique, so checking them once per state is exact."""
    inside = table.count_row >= 0
    need0 = np.where(inside, -(-table.count_lo.astype(np.int64) // table.count_fill), 0)
    for s in range(table.num_states):
        tok, nxt = table.transitions(s)
        nxt = nxt.astype(np.int64)
        opens = np.ones(tok.size, dtype=bool)
        if inside[s]:
            v = table.count_chars[table.count_row[s], tok]
            usable = (v == 0) | (v == 1)  # tokens that start no character
            nxt, opens = nxt[usable], (v == 1)[usable]
        cost = 1 + table.dist[nxt] + np.where(opens & inside[nxt], need0[nxt], 0)
        expected = 0 if table.accept[s] else int(cost.min(initial=1 << 40))
        if int(table.dist[s]) != expected:
            return False
    return True


def check_table_invariants(table, vocab) -> None:
    dense = table.mask_dense()
    assert dense.dtype == np.int32 and dense.shape[1] == (vocab.logits_width + 31) // 32
    assert len({r.tobytes() for r in dense}) == dense.shape[0], "a mask row is stored twice"
    assert len({b.tobytes() for b in table.mask_blocks}) == table.mask_blocks.shape[0], "a mask block is stored twice"
    assert table.mask_row.shape == (table.num_states,) and int(table.mask_row.max()) < table.num_mask_rows
    assert np.all(np.diff(table.exc_ptr) >= 0) and table.exc_ptr[-1] == table.exc_tok.size == table.exc_slot.size
    assert table.exc_row.shape == (table.num_states,) and int(table.exc_row.max()) < table.exc_ptr.size - 1
    assert table.exc_base.shape == (table.num_states + 1,) and table.exc_base[-1] == table.exc_targets.size
    rows = {}  # shared rows: no two rows alike (tokens and slots)
    for r in range(table.exc_ptr.size - 1):
        a, b = table.exc_ptr[r], table.exc_ptr[r + 1]
        key = table.exc_tok[a:b].tobytes() + table.exc_slot[a:b].astype(np.int64).tobytes()
        assert key not in rows, "an exception row is stored twice"
        rows[key] = r
    stops = set(vocab.stop_ids)
    never = set(vocab.special_ids) - stops
    for s in range(table.num_states):
        lo, hi = table.exc_span(s)
        assert np.all(np.diff(table.exc_tok[lo:hi]) > 0), "exception row not sorted"
        exc_next = table.exc_next_of(s, slice(lo, hi))
        assert not (exc_next == table.trans_default[s]).any(), "an exception equals the default"
        targets = table.exc_targets[table.exc_base[s]:table.exc_base[s + 1]]
        assert len(set(targets.tolist())) == targets.size and set(exc_next.tolist()) == set(targets.tolist())
        row, nexts = table.transitions(s)
        assert set(table.exc_tok[lo:hi].tolist()) <= set(row.tolist()), "an exception the mask forbids"
        assert (table.trans_default[s] >= 0) == (row.size > 0)
        assert all(table.next_state(s, int(t)) == int(n) for t, n in zip(row[:50], nexts[:50], strict=True))
        expected = set(row.tolist()) | (stops if table.accept[s] else set())
        assert set(table.allowed(s).tolist()) == expected, f"mask and transitions disagree in state {s}"
        assert not (set(row.tolist()) & (stops | never)), "a special id is a transition"
        assert int(row.max(initial=-1)) < vocab.vocab_size
    if table.has_counts:
        assert counted_dist_is_consistent(table)
    else:
        assert np.array_equal(table.dist, reference_dist(table))
    assert np.all(table.dist >= 0) and np.all((table.dist == 0) == table.accept)


# --- synthetic vocabulary: exact agreement with the byte-level reference ------------------
def test_rows_equal_bytewise_reference():
    vocab = synthetic_vocab()
    dfa = regex_to_dfa(JSONISH)
    rows = [r.materialize() for r in token_rows(dfa, VocabIndex.build(vocab))]
    for q, (ref, (tok, nxt)) in enumerate(zip(reference_rows(dfa, vocab), rows, strict=True)):
        got = {int(t): int(n) for t, n in zip(tok, nxt, strict=True) if n >= 0}
        assert got == ref, f"state {q}"


def wide_synthetic_vocab(num_tokens: int = 5000, seed: int = 0) -> Vocab:
    """Every byte plus random JSON-ish pieces: enough tokens for the donor path (>= 1024 per row)."""
    rng = random.Random(seed)
    alphabet = [b"a", b"b", b"z", b"1", b"0", b"5", b"7", b"2", b"9", b"3", b" ", b'"', b",", b":", b"{", b"}", b"[", b"]", b"\\", b"n",
                b"-", b".", b"e", "\u00e9".encode(), b"\xe2\x82"]
    pieces = {bytes([b]) for b in range(256)}
    while len(pieces) < 256 + num_tokens:
        pieces.add(b"".join(rng.choice(alphabet) for _ in range(rng.randint(2, 5))))
    ordered = sorted(pieces, key=lambda p: (len(p), p))
    return Vocab(token_bytes=tuple(ordered) + (b"",), special_ids=frozenset({len(ordered)}), stop_ids=(len(ordered),),
                 logits_width=len(ordered) + 1, format="test", name="wide-synthetic")


KEY_TRIE = r'\{(?:"abc" ?: ?1|"abd" ?: ?2|"[^"\\]*" ?: ?3)\}'
WIDE_REGEXES = [
    JSONISH,
    r'\{"s":"(?:[^"\\\x00-\x1f]|\\["\\nt])+"(?:,"n":(?:0|[1-9][0-9]*))?,"t":\[(?:-?[0-9]+(?:\.[0-9]+)?(?:, ?[0-9]+)*)?\]\}',
    r'\{ ?"k" ?: ?(?:[1-9][0-9]{0,3}|"[a-z ]{1,6}") ?(?:, ?"m" ?: ?"[^"]*")? ?\}',
    # After "5" the state is acyclic but shares its "." edge with the digit loop, which leaves
    # its region on "." (a donor must not lend bytes it walks later).
    r'\{"a":(?:5|[1-9][0-9]*\.[0-9]+)(?:, ?"b":"[a-z]*")?\}',
    # A key that is a declared name or any other (an open object's keys, each with its own value):
    # the states along "ab" share the string body's row but for their next letters.
    KEY_TRIE,
]


# Two string bodies with the same class part and the same extra tokens (their nexts differ):
# their exceptions come from one cached class part, their mask rows are stored once.
SHARED_LAYOUT = r'\[(?:"[a-z]*",){2}1\]'


@pytest.mark.parametrize("regex", [JSONISH, *WIDE_REGEXES, SHARED_LAYOUT])
def test_build_table_equals_slow_reference(regex):
    for vocab in (synthetic_vocab(), wide_synthetic_vocab()):
        dfa = regex_to_dfa(regex)
        rows = token_rows(dfa, VocabIndex.build(vocab))
        table = build_table(dfa, rows, vocab)
        dense = dense_view(table)
        for name, expected in reference_table(dfa, [r.materialize() for r in rows], vocab).items():
            got = dense[name]
            assert got.dtype == expected.dtype and np.array_equal(got, expected), name
        assert any(r.base is not None for r in rows), "no shared class rows: the fast path went untested"
        check_table_invariants(table, vocab)


@pytest.mark.parametrize("regex", WIDE_REGEXES)
def test_rows_equal_reference_with_donors(regex):
    vocab = wide_synthetic_vocab()
    dfa = regex_to_dfa(regex)
    rows = [r.materialize() for r in token_rows(dfa, VocabIndex.build(vocab))]
    for q, (ref, (tok, nxt)) in enumerate(zip(reference_rows(dfa, vocab), rows, strict=True)):
        got = {int(t): int(n) for t, n in zip(tok, nxt, strict=True) if n >= 0}
        assert got == ref, f"state {q}: {len(got)} vs {len(ref)} tokens"


def test_donated_rows_share_one_part_per_pattern_of_bytes():
    """States along a declared key's prefix take the body's class walk less their next letters: one
    part per pattern (tokenwalk._donated), shared, not one copy per state; equal to the reference."""
    vocab = wide_synthetic_vocab()
    vi = VocabIndex.build(vocab)
    dfa = regex_to_dfa(KEY_TRIE)
    rows = token_rows(dfa, vi)
    cached = {id(cw) for cw in vi.classes.values()}
    parts = [r.base for r in rows if r.base is not None and id(r.base) not in cached]
    assert parts, "no state took a part of a class walk"
    assert all(not p.leave_tok.size for p in parts)
    for q, (ref, (tok, nxt)) in enumerate(zip(reference_rows(dfa, vocab), (r.materialize() for r in rows), strict=True)):
        assert {int(t): int(n) for t, n in zip(tok, nxt, strict=True) if n >= 0} == ref, f"state {q}"


# Two bounded-digit numbers (acyclic chains, as schema.to_regex writes JSON numbers): one shape.
DIGIT_CHAINS = r'\{"a":-?(?:0|[1-9][0-9]{0,6})(?:\.[0-9]+)?,"b":-?(?:0|[1-9][0-9]{0,6})(?:\.[0-9]+)?,"c":"x"\}'


def test_digit_chains_walked_once_per_shape_and_equal_reference():
    vocab = wide_synthetic_vocab()
    dfa = regex_to_dfa(DIGIT_CHAINS)
    succ, comp, cyclic = tokenwalk.lexical_regions(dfa)
    comp, roots, in_chain = tokenwalk._chain_regions(dfa, succ, comp, cyclic)
    sigs = [tokenwalk._region_shape(dfa, succ, comp, r)[2] for r in roots]
    assert len(roots) >= 2 and len(set(sigs)) < len(sigs), "the two numbers' chains share no shape"
    assert not (in_chain & cyclic).any()
    vi = VocabIndex.build(vocab)
    rows = token_rows(dfa, vi)
    chained = np.flatnonzero(in_chain)
    assert all(rows[q].base is not None for q in chained), "chain rows keep their shared class part"
    assert len({id(rows[q].base) for q in chained}) < chained.size, "the two numbers' chain rows share no walk"
    for q, (ref, row) in enumerate(zip(reference_rows(dfa, vocab), rows, strict=True)):
        tok, nxt = row.materialize()
        assert {int(t): int(n) for t, n in zip(tok, nxt, strict=True)} == ref, f"state {q}"
    table = build_table(dfa, rows, vocab)
    for name, expected in reference_table(dfa, [r.materialize() for r in rows], vocab).items():
        assert np.array_equal(dense_view(table)[name], expected), name


@pytest.mark.parametrize("regex", [DIGIT_CHAINS, WIDE_REGEXES[1]])
def test_rows_walked_in_small_batches_equal_the_reference(regex, monkeypatch):
    """Class exits and the generic walk, each split into batches of a few pairs (their memory
    bound), give the reference rows and the table one batch gives."""
    vocab = wide_synthetic_vocab()
    dfa = regex_to_dfa(regex)
    whole = build_table(dfa, token_rows(dfa, VocabIndex.build(vocab)), vocab)
    calls = []
    real_walk = tokenwalk.walk_whole
    monkeypatch.setattr(tokenwalk, "walk_whole", lambda *a, **k: calls.append(a[2].size) or real_walk(*a, **k))
    monkeypatch.setattr(tokenwalk, "GENERIC_BATCH_PAIRS", 16)
    rows = token_rows(dfa, VocabIndex.build(vocab))
    assert len(calls) > 4 and max(calls) < 16 + vocab.vocab_size, calls  # whole jobs (one state's tokens) per batch
    for q, (ref, row) in enumerate(zip(reference_rows(dfa, vocab), rows, strict=True)):
        tok, nxt = row.materialize()
        assert {int(t): int(n) for t, n in zip(tok, nxt, strict=True)} == ref, f"state {q}"
    table = build_table(dfa, rows, vocab)
    for name in TABLE_ARRAYS:
        assert np.array_equal(getattr(table, name), getattr(whole, name)), name


def test_synthetic_table_invariants_and_walks():
    vocab = synthetic_vocab()
    table = compile_regex(JSONISH, vocab, GrammarOptions())
    check_table_invariants(table, vocab)
    assert table.logits_width > table.vocab_size
    padded = np.unpackbits(table.mask_dense().view(np.uint8), axis=1, bitorder="little")[:, vocab.vocab_size :]
    assert not padded.any(), "ids past the tokenizer are allowed"
    rng = np.random.default_rng(0)
    for _ in range(50):
        ids = random_walk(table, vocab, rng, max_tokens=30)
        assert accepts(table, ids) and len(ids) <= 30
        json.loads(decode(vocab, ids))


def test_walk_honours_tight_budget():
    vocab = synthetic_vocab()
    table = compile_regex(JSONISH, vocab, GrammarOptions())
    rng = np.random.default_rng(1)
    budget = int(table.dist[0])
    for _ in range(20):
        ids = random_walk(table, vocab, rng, max_tokens=budget)
        assert len(ids) <= budget and accepts(table, ids)
    with pytest.raises(RequestError, match="below the .* tokens the shortest document needs"):
        random_walk(table, vocab, rng, max_tokens=budget - 1)


# --- budgets -------------------------------------------------------------------------------
def test_time_budget_exceeded():
    vocab = synthetic_vocab()
    with pytest.raises(CompileBudgetExceeded, match="past its time budget of 1e-09 s"):
        compile_regex(JSONISH, vocab, GrammarOptions(time_budget_s=1e-9), use_cache=False)


def test_warm_up_once_per_vocab_and_options_and_never_raises(monkeypatch):
    from surecall.errors import UnsupportedSchema
    from surecall.grammars import compile as compile_mod

    monkeypatch.setattr(compile_mod, "_WARMED", set())
    vocab = synthetic_vocab()
    assert compile_mod.warm_up(vocab) > 0
    assert compile_mod.warm_up(vocab) == 0.0  # done for this vocabulary and these options
    assert compile_mod.warm_up(vocab, GrammarOptions(whitespace="none")) > 0  # other options: other shapes
    assert table_cache.cache_bytes() == 0  # nothing stored
    # a vocabulary that cannot spell the small schema: no error, nothing marked, and the first
    # real compile reports that vocabulary's own error
    few = Vocab(token_bytes=tuple(bytes([b]) for b in b'{}":,ab'), special_ids=frozenset(), stop_ids=(),
                logits_width=7, format="test", name="few")
    compile_mod.warm_up(few)
    assert (few.fingerprint, GrammarOptions().cache_key()) not in compile_mod._WARMED
    with pytest.raises(UnsupportedSchema, match="no token sequence"):
        compile_schema({"const": "zz"}, few, use_cache=False)


def test_progress_notes_name_each_stage_once_then_at_most_every_few_seconds(monkeypatch, capsys):
    """A long compile notes each new stage; a repeated one (a splice's many pieces) is not a line per piece."""
    from surecall.grammars import compile as compile_mod

    now = [100.0]
    monkeypatch.setattr(compile_mod.time, "perf_counter", lambda: now[0])
    clock = compile_mod._Clock(budget_s=1000.0)
    now[0] += 1.0
    clock.check("byte DFA")  # before _PROGRESS_AFTER_S: silent
    for _ in range(20):  # 20 pieces in 4 s, two stage names in turn
        now[0] += 0.1
        clock.check("byte DFA")
        now[0] += 0.1
        clock.check("byte DFA (splice)")
    clock.check("token walk")
    now[0] += compile_mod._PROGRESS_EVERY_S
    clock.check("byte DFA")
    lines = capsys.readouterr().err.splitlines()
    assert [line.split("... ")[1].split(" done")[0] for line in lines] == [
        "byte DFA", "byte DFA (splice)", "token walk", "byte DFA"]
    assert lines[0] == "surecall: compiling... byte DFA done after 2.1 s"


def test_memory_budget_exceeded():
    pieces = tuple(bytes([b]) for b in range(256)) + tuple(f"tok{i}".encode() for i in range(40000))
    vocab = Vocab(token_bytes=pieces, special_ids=frozenset(), stop_ids=(), logits_width=len(pieces),
                  format="test", name="wide")
    with pytest.raises(CompileBudgetExceeded, match="over the memory budget of 1 MiB"):
        compile_regex('"[a-z]{0,40}"', vocab, GrammarOptions(memory_budget_bytes=1 << 20), use_cache=False)


def test_isolated_byte_dfa_matches_and_is_killed_past_budget(monkeypatch):
    import surecall.grammars.compile as compile_module
    from surecall.grammars.automaton import _WORKER

    vocab = synthetic_vocab()
    inline = compile_regex(JSONISH, vocab, GrammarOptions(), use_cache=False)
    monkeypatch.setattr(compile_module, "_ISOLATE_REGEX_CHARS", 0)
    isolated = compile_regex(JSONISH, vocab, GrammarOptions(), use_cache=False)
    a, b = dense_view(inline), dense_view(isolated)
    assert np.array_equal(a["trans_next"], b["trans_next"]) and np.array_equal(a["mask"], b["mask"])
    pid = _WORKER.proc.pid
    compile_regex(r'"[a-z]{1,3}"', vocab, GrammarOptions(), use_cache=False)
    assert _WORKER.proc.pid == pid, "the byte-DFA child was not reused"
    # 2^15 subset states: outlines-core needs seconds; the child is killed, a fresh one answers next.
    with pytest.raises(CompileBudgetExceeded, match="byte DFA of a .*-character regex took longer than the time budget"):
        compile_regex(r"[a-z]*a[a-z]{14}", vocab, GrammarOptions(time_budget_s=0.3), use_cache=False)
    assert _WORKER.proc is None
    again = compile_regex(JSONISH, vocab, GrammarOptions(), use_cache=False)
    assert np.array_equal(again.mask_dense(), inline.mask_dense())


def test_a_long_regex_takes_shared_string_bodies_and_its_own_dfa_still_comes_from_the_child(monkeypatch):
    """Past _ISOLATE_REGEX_CHARS the regex's string bodies are laid from the per-process DFA
    (string_bodies.py), not built again by outlines-core; what outlines-core does build (the
    regex with placeholders) goes to the child process even when the placeholders made it short.
    The table is the one the regex builds in process, array for array."""
    import surecall.grammars.compile as compile_module
    from surecall.grammars import automaton
    from surecall.grammars.schema.json_lex import STRING

    schema = {"type": "object", "properties": {f"field_{i}": {"type": "string"} for i in range(4)},
              "required": [f"field_{i}" for i in range(4)]}
    vocab = synthetic_vocab()
    inline = compile_schema(schema, vocab, GrammarOptions(), use_cache=False)
    seen = []
    real = automaton._WORKER.build

    def spy(regex, *args):
        seen.append(regex)
        return real(regex, *args)

    monkeypatch.setattr(automaton._WORKER, "build", spy)
    monkeypatch.setattr(compile_module, "_ISOLATE_REGEX_CHARS", 200)
    isolated = compile_schema(schema, vocab, GrammarOptions(), use_cache=False)
    assert seen and all(STRING[1:-1] not in regex for regex in seen), "a string body went to outlines-core"
    assert any(len(regex) <= 200 for regex in seen), "the short regex with placeholders was built in process"
    a, b = dense_view(inline), dense_view(isolated)
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_warm_up_prestarts_the_byte_dfa_child_which_the_next_large_regex_uses():
    import surecall.grammars.compile as compile_mod
    from surecall.grammars.automaton import _WORKER, regex_to_dfa_isolated

    _WORKER.stop()
    compile_mod._WARMED.clear()
    compile_mod.warm_up(synthetic_vocab(), GrammarOptions(memory_budget_bytes=1 << 30))
    assert _WORKER.proc is not None and _WORKER.budget == 1 << 30  # started, maybe not ready yet
    started = _WORKER.proc.pid
    assert regex_to_dfa_isolated('"ab"', 30.0, 1 << 30).num_states == 5
    assert _WORKER.proc.pid == started and _WORKER.ready  # the prestarted child answered
    _WORKER.prestart(1 << 30)  # running for that budget: kept
    assert _WORKER.proc.pid == started
    _WORKER.prestart(1 << 29)  # another budget: a child of its own
    assert _WORKER.proc.pid != started and not _WORKER.ready
    assert regex_to_dfa_isolated('"a"', 30.0, 1 << 29).num_states == 4


def test_isolated_byte_dfa_reports_a_bad_regex():
    from surecall.errors import SchemaError
    from surecall.grammars.automaton import regex_to_dfa_isolated

    with pytest.raises(SchemaError, match="regex does not compile"):
        regex_to_dfa_isolated("(unclosed", 30.0, 1 << 30)
    assert regex_to_dfa_isolated('"a"', 30.0, 1 << 30).num_states == 4


# --- disk cache ----------------------------------------------------------------------------
def _entry(regex, vocab):
    return table_cache.entry_path(table_cache.entry_key("regex", regex, vocab, GrammarOptions()))


def test_cache_warm_load_is_mapped_and_equal():
    vocab = synthetic_vocab()
    cold = compile_regex(JSONISH, vocab, GrammarOptions())
    warm = compile_regex(JSONISH, vocab, GrammarOptions())
    assert isinstance(warm.mask_blocks, np.memmap) and not isinstance(cold.mask_blocks, np.memmap)
    for name in TABLE_ARRAYS:
        assert np.array_equal(getattr(cold, name), getattr(warm, name)), name
    assert warm.meta["states"] == cold.meta["states"]


@pytest.mark.parametrize("damage", ["truncate", "flip", "header"])
def test_corrupt_cache_entry_is_rebuilt(damage):
    vocab = synthetic_vocab()
    good = compile_regex(JSONISH, vocab, GrammarOptions())
    entry = _entry(JSONISH, vocab)
    if damage == "truncate":
        data = (entry / "mask_blocks.npy").read_bytes()
        (entry / "mask_blocks.npy").write_bytes(data[: len(data) - 8])
    elif damage == "flip":
        data = bytearray((entry / "dist.npy").read_bytes())
        data[-1] ^= 0x01
        (entry / "dist.npy").write_bytes(bytes(data))
    else:
        (entry / "header.json").write_text("{not json")
    key = table_cache.entry_key("regex", JSONISH, vocab, GrammarOptions())
    assert table_cache.load(key) is None and not entry.exists(), "a damaged entry was trusted"
    rebuilt = compile_regex(JSONISH, vocab, GrammarOptions())
    assert np.array_equal(rebuilt.dist, good.dist) and entry.exists()


def test_cache_is_bounded_least_recently_used_first(monkeypatch):
    vocab = synthetic_vocab()
    regexes = [JSONISH, r'\{ ?"a" ?: ?true ?\}', r'\[(?:0|1)(?:,(?:0|1))*\]']
    for regex in regexes:
        compile_regex(regex, vocab, GrammarOptions())
    entries = [_entry(r, vocab) for r in regexes]
    assert all(e.exists() for e in entries)
    sizes = [sum(f.stat().st_size for f in e.iterdir()) for e in entries]
    for i, e in enumerate(entries):  # explicit use times: JSONISH oldest, then the array regex, then `true`
        os.utime(e / "header.json", (1000 + i, 1000 + i))
    os.utime(entries[1] / "header.json", (3000, 3000))
    freed = table_cache.evict(max_bytes=sizes[1] + sizes[2])
    assert freed == sizes[0] and not entries[0].exists() and entries[1].exists() and entries[2].exists()
    monkeypatch.setenv("SURECALL_CACHE_MAX_BYTES", "0")
    compile_regex(JSONISH, vocab, GrammarOptions())  # a save evicts everything but itself
    assert _entry(JSONISH, vocab).exists() and not entries[1].exists() and not entries[2].exists()
    assert table_cache.cache_bytes() == sum(f.stat().st_size for f in _entry(JSONISH, vocab).iterdir())
    monkeypatch.setenv("SURECALL_CACHE_MAX_BYTES", "lots")
    with pytest.raises(ValueError, match="Invalid SURECALL_CACHE_MAX_BYTES"):
        table_cache.max_cache_bytes()


def test_refresh_compiles_once_and_stores(monkeypatch):
    from surecall.grammars import compile as compile_module

    vocab = synthetic_vocab()
    calls = []
    real = compile_module._compile_uncached
    monkeypatch.setattr(compile_module, "_compile_uncached", lambda *a, **k: calls.append(1) or real(*a, **k))
    compile_regex(JSONISH, vocab, GrammarOptions(), use_cache="refresh")
    compile_regex(JSONISH, vocab, GrammarOptions(), use_cache="refresh")  # refresh never reads the cache
    assert len(calls) == 2 and _entry(JSONISH, vocab).exists()
    compile_regex(JSONISH, vocab, GrammarOptions())
    assert len(calls) == 2  # the stored entry was loaded
    with pytest.raises(ValueError, match="Invalid use_cache"):
        compile_regex(JSONISH, vocab, GrammarOptions(), use_cache="sometimes")


# --- Llama-3: the seed tools ----------------------------------------------------------------
@pytest.fixture(scope="module")
def llama3(data_dir):
    from conftest import cached_vocab

    return cached_vocab("llama3")


@pytest.fixture(scope="module")
def seed_tables(llama3):
    from surecall.tools.catalog import hardened_seed_tools as seed_tools

    return {t["name"]: (t["parameters"], compile_schema(t["parameters"], llama3, use_cache=False))
            for t in seed_tools()}


def test_seed_tool_tables_invariants(seed_tables, llama3):
    _, table = seed_tables["file_edit"]
    check_table_invariants(table, llama3)
    assert table.meta["states"] == table.num_states and table.meta["compile_ms"] > 0


def test_seed_tool_rows_match_reference_on_token_sample(llama3):
    from surecall.grammars.schema.to_regex import schema_to_regex
    from surecall.grammars.tokenwalk import vocab_index
    from surecall.tools.catalog import hardened_seed_tools as seed_tools

    schema = seed_tools()[1]["parameters"]  # file_view: strings and integer ranges
    dfa = regex_to_dfa(schema_to_regex(schema, GrammarOptions()).regex)
    rows = [r.materialize() for r in token_rows(dfa, vocab_index(llama3))]
    rng = np.random.default_rng(0)
    sample = rng.choice(llama3.vocab_size, 1500, replace=False).tolist()
    sample += [i for i, b in enumerate(llama3.token_bytes) if b[:1] in (b'"', b",", b"1", b" ")][:1500]
    for q in range(dfa.num_states):
        tok, nxt = rows[q]
        got = dict(zip(tok.tolist(), nxt.tolist(), strict=True))
        for t in sample:
            piece = llama3.token_bytes[t]
            if not piece or t in llama3.special_ids:
                assert got.get(t, -1) < 0
                continue
            s = q
            for b in piece:
                s = int(dfa.trans[s, b])
                if s < 0:
                    break
            assert got.get(t, -1) == s, f"state {q} token {t} {piece!r}"


def test_seed_tool_walks_validate(seed_tables, llama3):
    from surecall.grammars.walk import schema_violations

    rng = np.random.default_rng(7)
    for name, (schema, table) in seed_tables.items():
        for i in range(8):
            budget = int(table.dist[0]) + 2 if i % 2 else 200
            ids = random_walk(table, llama3, rng, max_tokens=budget)
            doc = json.loads(decode(llama3, ids))
            bad, _ = schema_violations(schema, doc, table.relaxed)
            assert not bad, f"{name}: {bad}"


# --- DFA minimisation: the same language, token tables equivalent state for state ------------
def tables_equivalent(a, b) -> str | None:
    """Product BFS from both starts: same mask, CSR tokens, acceptance and dist in every paired state."""
    seen, queue = {(0, 0)}, deque([(0, 0)])
    while queue:
        x, y = queue.popleft()
        if a.accept[x] != b.accept[y] or a.dist[x] != b.dist[y] or not np.array_equal(a.mask_words(x), b.mask_words(y)):
            return f"states {x}/{y} differ"
        (ta, na), (tb, nb) = a.transitions(x), b.transitions(y)
        if not np.array_equal(ta, tb):
            return f"transition rows of {x}/{y} differ"
        for pair in set(zip(na.tolist(), nb.tolist(), strict=True)) - seen:
            seen.add(pair)
            queue.append(pair)
    return None


def dfas_equivalent(a, b) -> bool:
    seen, queue = {(0, 0)}, deque([(0, 0)])
    while queue:
        x, y = queue.popleft()
        if a.accept[x] != b.accept[y] or not np.array_equal(a.trans[x] >= 0, b.trans[y] >= 0):
            return False
        for byte in np.flatnonzero(a.trans[x] >= 0).tolist():
            pair = (int(a.trans[x, byte]), int(b.trans[y, byte]))
            if pair not in seen:
                seen.add(pair)
                queue.append(pair)
    return True


# After "a" and after "b" the subset construction keeps apart states with the same future.
REDUNDANT = r'\{"(?:a":(?:[0-9]+|"[a-z]*")|b":(?:[0-9]+|"[a-z]*"))\}'


@pytest.mark.parametrize("regex", [*WIDE_REGEXES, REDUNDANT])
def test_minimal_dfa_same_language_and_equivalent_table(regex):
    from surecall.grammars.automaton import minimize

    full = regex_to_dfa(regex, minimal=False)
    small = regex_to_dfa(regex)
    assert small.num_states <= full.num_states and dfas_equivalent(full, small)
    assert minimize(small).num_states == small.num_states, "minimising twice merged more states"
    vocab = wide_synthetic_vocab()
    vi = VocabIndex.build(vocab)
    tables = [build_table(d, token_rows(d, vi), vocab) for d in (full, small)]
    assert tables_equivalent(*tables) is None
    check_table_invariants(tables[1], vocab)


def test_minimal_dfa_merges_redundant_branches():
    assert regex_to_dfa(REDUNDANT).num_states < regex_to_dfa(REDUNDANT, minimal=False).num_states


def test_dfas_equivalent_detects_a_difference():
    assert not dfas_equivalent(regex_to_dfa(r'"[a-z]*"'), regex_to_dfa(r'"[a-y]*"'))
    vocab = wide_synthetic_vocab()
    vi = VocabIndex.build(vocab)
    a, b = (build_table(d, token_rows(d, vi), vocab) for d in (regex_to_dfa(r'"[a-z]*"'), regex_to_dfa(r'"[a-y]*"')))
    assert tables_equivalent(a, b) is not None


def test_seed_catalog_minimal_table_equivalent(llama3):
    from surecall.grammars.formats import catalog_regex
    from surecall.grammars.tokenwalk import vocab_index
    from surecall.tools.catalog import hardened_seed_tools as seed_tools

    regex = catalog_regex(seed_tools(), "hermes", GrammarOptions()).regex
    dfas = [regex_to_dfa(regex, minimal=False), regex_to_dfa(regex)]
    assert dfas[1].num_states < dfas[0].num_states
    tables = [build_table(d, token_rows(d, vocab_index(llama3)), llama3) for d in dfas]
    assert tables_equivalent(*tables) is None


def test_quotient_refuses_a_partition_that_is_not_a_congruence():
    from surecall.grammars.automaton import quotient_by

    dfa = regex_to_dfa(r'"[a-z]{2}"', minimal=False)
    assert quotient_by(dfa, np.arange(dfa.num_states)) is not None
    merged = np.zeros(dfa.num_states, dtype=np.int64)  # one block: accepting and not together
    assert quotient_by(dfa, merged) is None


def test_generic_walk_in_small_batches_equals_reference(monkeypatch):
    import surecall.grammars.tokenwalk as tokenwalk

    monkeypatch.setattr(tokenwalk, "GENERIC_BATCH_PAIRS", 7)
    vocab = synthetic_vocab()
    dfa = regex_to_dfa(WIDE_REGEXES[2])
    rows = [r.materialize() for r in token_rows(dfa, VocabIndex.build(vocab))]
    for q, (ref, (tok, nxt)) in enumerate(zip(reference_rows(dfa, vocab), rows, strict=True)):
        assert dict(zip(tok.tolist(), nxt.tolist(), strict=True)) == ref, f"state {q}"


def test_isolated_byte_dfa_past_memory_budget(monkeypatch):
    import surecall.grammars.compile as compile_module

    monkeypatch.setattr(compile_module, "_ISOLATE_REGEX_CHARS", 0)
    with pytest.raises(CompileBudgetExceeded, match="ran past the memory budget of 1 MiB|did not start"):
        compile_regex(r"[a-z]*a[a-z]{16}", synthetic_vocab(), GrammarOptions(memory_budget_bytes=1 << 20),
                      use_cache=False)


def test_the_table_is_refused_before_its_peak_when_its_exceptions_pass_the_budget(monkeypatch):
    """The walk's counts are checked again before the table is built: past the budget at
    _EXC_BYTES an exception, the compile stops before share_exception_rows (the table's peak)."""
    import surecall.grammars.compile as compile_module

    vocab = wide_synthetic_vocab()
    table = compile_regex(WIDE_REGEXES[1], vocab, GrammarOptions(memory_budget_bytes=1 << 20), use_cache=False)
    assert table.num_exceptions > 0
    monkeypatch.setattr(compile_module, "_EXC_BYTES", (1 << 20) // table.num_exceptions + 1)

    def peak(*args, **kwargs):
        raise AssertionError("share_exception_rows ran past the memory check")

    monkeypatch.setattr(compile_module, "share_exception_rows", peak)
    with pytest.raises(CompileBudgetExceeded, match=r"to build its table \(.* exceptions\), over the memory budget of 1 MiB"):
        compile_regex(WIDE_REGEXES[1], vocab, GrammarOptions(memory_budget_bytes=1 << 20), use_cache=False)


def test_memory_estimate_counts_tokens_that_survive_two_bytes():
    # 40k tokens start with a live "a" but die on "#": the one-byte bound is over 1 MiB, the two-byte one is not.
    pieces = tuple(bytes([b]) for b in range(256)) + tuple(f"a#{i}".encode() for i in range(40000))
    vocab = Vocab(token_bytes=pieces, special_ids=frozenset(), stop_ids=(), logits_width=len(pieces),
                  format="test", name="wide-dead")
    table = compile_regex('"a{0,5}"', vocab, GrammarOptions(memory_budget_bytes=1 << 20), use_cache=False)
    assert table.num_states == 8 and table.num_transitions < 300


def test_isolated_byte_dfa_after_fork_uses_its_own_child():
    import os

    from surecall.grammars.automaton import _WORKER, regex_to_dfa_isolated

    regex_to_dfa_isolated('"a"', 30.0, 1 << 30)
    parent_child = _WORKER.proc.pid
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the forked copy must not talk to (or kill) the parent's child
        try:
            ok = regex_to_dfa_isolated('"ab"', 30.0, 1 << 30).num_states == 5 and _WORKER.proc.pid != parent_child
            _WORKER.stop()
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1"
    assert _WORKER.proc is not None and _WORKER.proc.pid == parent_child and _WORKER.proc.poll() is None
    assert regex_to_dfa_isolated('"abc"', 30.0, 1 << 30).num_states == 6


def test_seed_catalog_table_equals_slow_reference(llama3):
    from surecall.grammars.formats import catalog_regex
    from surecall.grammars.tokenwalk import vocab_index
    from surecall.tools.catalog import hardened_seed_tools as seed_tools

    dfa = regex_to_dfa(catalog_regex(seed_tools(), "json", GrammarOptions()).regex)
    rows = token_rows(dfa, vocab_index(llama3))
    table = build_table(dfa, rows, llama3)
    dense = dense_view(table)
    for name, expected in reference_table(dfa, [r.materialize() for r in rows], llama3).items():
        assert np.array_equal(dense[name], expected), name


_TREE = {"$defs": {"node": {"type": "object", "required": ["v"], "properties": {
    "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
    "$ref": "#/$defs/node"}


def _tree(depth: int) -> dict:
    return {"v": 1} if depth == 0 else {"v": 1, "kids": [_tree(depth - 1)]}


def _spell(vocab: Vocab, value) -> list[int]:
    return list(json.dumps(value, separators=(", ", ": ")).encode())  # byte vocabulary: id = byte


def test_a_recursive_schema_past_the_memory_budget_is_compiled_again_with_a_lower_ref_depth():
    import jsonschema
    from helpers.grammar_checks import byte_vocab

    vocab = byte_vocab("recursive-fallback")
    full = compile_schema(_TREE, vocab, GrammarOptions(memory_budget_bytes=4 << 20), use_cache=False)
    assert "ref_depth_fallback" not in full.meta and accepts(full, _spell(vocab, _tree(3)))
    [(pointer, keyword, why)] = full.meta["narrowed"]  # the default cut is listed too
    assert (pointer, keyword) == ("/$defs/node/properties/kids/items", "$ref") and "max_ref_depth=3" in why
    # at 1 MiB the depth-3 regex is too large: depth 2 is the deepest that fits
    table = compile_schema(_TREE, vocab, GrammarOptions(memory_budget_bytes=1 << 20), use_cache=False)
    fallback = table.meta["ref_depth_fallback"]
    assert (fallback["from"], fallback["max_ref_depth"]) == (3, 2) and "memory budget" in fallback["why"]
    assert "lowered from 3" in table.meta["narrowed"][0][2]
    assert accepts(table, _spell(vocab, _tree(2))) and not accepts(table, _spell(vocab, _tree(3)))
    rng = np.random.default_rng(0)
    for _ in range(20):  # stricter, never looser: every output still validates
        jsonschema.validate(json.loads(decode(vocab, random_walk(table, vocab, rng))), _TREE)


def test_a_long_compile_says_when_it_starts_again_at_a_lower_ref_depth(monkeypatch, capsys):
    from helpers.grammar_checks import byte_vocab

    from surecall.grammars import compile as compile_mod

    vocab = byte_vocab("recursive-fallback-note")
    compile_schema(_TREE, vocab, GrammarOptions(memory_budget_bytes=1 << 20), use_cache=False)
    assert "compiling again" not in capsys.readouterr().err  # a quick fallback: silent
    monkeypatch.setattr(compile_mod, "_PROGRESS_AFTER_S", -1.0)  # as if it had run long
    compile_schema(_TREE, vocab, GrammarOptions(memory_budget_bytes=1 << 20), use_cache=False)
    notes = [line for line in capsys.readouterr().err.splitlines() if "compiling again" in line]
    assert notes == ["surecall: compiling... the grammar at max_ref_depth=3 passed the memory budget; compiling "
                     "again at max_ref_depth=2 (stricter: deeper recursion is not written)"]


def test_lowering_ref_depth_is_only_tried_for_a_cut_recursion():
    from helpers.grammar_checks import byte_vocab

    flat = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(40)}, "required": ["p0"]}
    with pytest.raises(CompileBudgetExceeded, match="memory budget"):
        compile_schema(flat, byte_vocab("flat-over-budget"), GrammarOptions(memory_budget_bytes=1 << 20),
                       use_cache=False)


def test_the_token_walk_checks_the_time_budget_while_it_runs():
    """A walk over many states stops at its budget, not only after it (`((c1d3g3).{4,8}){6,6}` ran
    37 s past a 5 s budget before)."""
    from surecall.grammars.compile import _Clock, compile_dfa

    dfa = regex_to_dfa('"[a-z]{1,40}"')
    with pytest.raises(CompileBudgetExceeded, match="during stage 'token walk'"):
        compile_dfa(dfa, synthetic_vocab(), GrammarOptions(), clock=_Clock(1e-9))
    assert compile_dfa(dfa, synthetic_vocab(), GrammarOptions()).num_states == dfa.num_states


def test_conversion_and_the_later_stages_share_one_time_budget(monkeypatch):
    """schema -> regex and the DFA, walk and table stages count from one start: a slow conversion
    followed by a slow walk used to get time_budget_s each (up to twice the budget in all)."""
    from surecall.grammars import compile as compile_mod
    from surecall.grammars.options import budget_started, one_time_budget
    from surecall.grammars.schema import to_regex

    now = [1000.0]
    monkeypatch.setattr(compile_mod.time, "perf_counter", lambda: now[0])  # the one `time` module: every stage's clock
    real_convert, real_rows = to_regex.schema_to_regex, compile_mod.token_rows
    depth = [0]

    def slow_convert(*args, **kwargs):  # the conversion may call itself for parts: charge the outermost call
        depth[0] += 1
        try:
            return real_convert(*args, **kwargs)
        finally:
            depth[0] -= 1
            now[0] += 0.6 if depth[0] == 0 else 0.0  # conversion: 0.6 s of a 1 s budget

    def slow_rows(*args, **kwargs):
        now[0] += 0.6  # the walk: another 0.6 s, each within 1 s on its own
        return real_rows(*args, **kwargs)

    monkeypatch.setattr(to_regex, "schema_to_regex", slow_convert)
    monkeypatch.setattr(compile_mod, "token_rows", slow_rows)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    with pytest.raises(CompileBudgetExceeded, match=r"compile ran 1\.20 s, past its time budget of 1 s"):
        compile_schema(schema, synthetic_vocab(), GrammarOptions(time_budget_s=1.0), use_cache=False)
    assert compile_schema(schema, synthetic_vocab(), GrammarOptions(time_budget_s=2.0), use_cache=False).num_states
    # outside a compile, the budget starts now; nested windows keep the outer start
    assert budget_started() == now[0]
    with one_time_budget():
        start = now[0]
        now[0] += 5
        with one_time_budget():
            assert budget_started() == start
    assert budget_started() == now[0]


def _sorted_byte_classes(trans: np.ndarray) -> np.ndarray:
    """The representative of each byte by comparing whole columns (the reference)."""
    rep = np.arange(trans.shape[1])
    for b in range(trans.shape[1]):
        rep[b] = next(a for a in range(b + 1) if np.array_equal(trans[:, a], trans[:, b]))
    return rep


@pytest.mark.parametrize("num_states", [1, 700, 1024, 5000, 9000])
def test_byte_classes_hashed_or_sorted_equal_the_reference(num_states, monkeypatch):
    from surecall.grammars import automaton

    rng = np.random.default_rng(num_states)
    trans = rng.integers(-1, 4, size=(num_states, 256)).astype(np.int32)
    trans[:, 10:60] = trans[:, 7:8]  # classes of equal columns, some not adjacent
    trans[:, 200:] = trans[:, 100:156]
    assert np.array_equal(automaton.byte_classes(trans), _sorted_byte_classes(trans))
    if num_states >= automaton._HASHED_COLUMNS_FROM:  # two different columns made to hash alike: still exact
        trans[:, :3] = 0
        trans[0, 1] = trans[1, 2] = 1
        weights = automaton._column_weights(num_states).copy()
        weights[1] = weights[0]
        monkeypatch.setattr(automaton, "_column_weights", lambda n: weights[:n])
        got = automaton.byte_classes(trans)
        assert got[1] == 1 and got[2] == 2
        assert np.array_equal(got, _sorted_byte_classes(trans))
        # the same in the last rows, which the check confirms in its last block of rows
        trans[:, :3] = 0
        trans[-2, 1] = trans[-1, 2] = 1
        weights[-1] = weights[-2]
        got = automaton.byte_classes(trans)
        assert got[1] == 1 and got[2] == 2
        assert np.array_equal(got, _sorted_byte_classes(trans))


@pytest.mark.parametrize("dense", [True, False])
def test_most_votes_takes_the_heaviest_target_and_the_smallest_on_a_tie(dense, monkeypatch):
    """_exceptions_based's vote, counted densely or through the distinct keys: per row the target
    with the most weight (votes for one target add up), the smallest on a tie, -1 without votes."""
    from surecall.grammars import compile as compile_module

    monkeypatch.setattr(compile_module, "_DENSE_COUNTS", 1 << 30 if dense else 0)
    rng = np.random.default_rng(5)
    k, num_states = 30, 12
    owner = rng.integers(0, k - 3, size=400)  # the last three rows get no vote
    target = rng.integers(0, num_states, size=owner.size)
    weight = rng.integers(1, 4, size=owner.size).astype(np.float64)
    got = compile_module._most_votes(owner, target, weight, k, num_states)
    for row in range(k):
        totals = np.bincount(target[owner == row], weights=weight[owner == row], minlength=num_states)
        expected = int(np.argmax(totals)) if totals.any() else -1
        assert got[row] == expected, row
    ties = compile_module._most_votes(np.array([0, 0, 0]), np.array([7, 2, 9]), np.array([1.0, 1.0, 1.0]), 1, num_states)
    assert ties.tolist() == [2]


def _moore_groups(trans: np.ndarray, accept: np.ndarray) -> list:
    """Moore's rounds, plainly (dead -1 its own class): each state's group as its smallest member."""
    block = accept.astype(np.int64)
    while True:
        padded = np.append(block, -1)
        sig = {(int(block[s]), *padded[trans[s]].tolist()) for s in range(trans.shape[0])}
        ids = {key: i for i, key in enumerate(sorted(sig))}
        new = np.asarray([ids[(int(block[s]), *padded[trans[s]].tolist())] for s in range(trans.shape[0])])
        if len(ids) == len(set(block.tolist())):
            break
        block = new
    first = {}
    return [first.setdefault(int(b), s) for s, b in enumerate(new)]


@pytest.mark.parametrize("use_scipy", [True, False])
def test_refine_from_invariants_gives_moores_partition(use_scipy, monkeypatch):
    """automaton._refine starts from (acceptance, live byte classes, fewest bytes to accept): on
    random byte DFAs with dead edges, long chains and states that cannot accept, it ends at Moore's
    partition, with the distances (scipy) and without them."""
    from surecall.grammars import automaton

    monkeypatch.setattr(automaton, "USE_SCIPY", use_scipy)
    monkeypatch.setattr(automaton, "_INVARIANTS_FROM", 0)  # every size starts from them here
    rng = np.random.default_rng(17)
    for case in range(30):
        n = int(rng.integers(2, 40))
        trans = np.full((n, 256), -1, dtype=np.int32)
        for s in range(n):
            for b in rng.choice(4, size=int(rng.integers(0, 4)), replace=False):
                trans[s, b] = int(rng.integers(0, n)) if case % 3 else min(s + 1, n - 1)  # every third: a chain
        accept = rng.random(n) < 0.2
        block = automaton._refine(trans, accept)
        first = {}
        got = [first.setdefault(int(b), s) for s, b in enumerate(block)]
        assert got == _moore_groups(trans, accept), case


def test_walk_figures_kept_with_the_walk_give_the_fresh_table():
    """What _exceptions_based derives from a class walk (tokens per end, the most common end,
    the tokens not ending at a default) is kept with the walk, which the vocabulary caches: a
    second grammar with the same classes reuses it and builds the table a fresh index builds."""
    vocab = wide_synthetic_vocab()
    first, second = DIGIT_CHAINS, r'\{"z":-?(?:0|[1-9][0-9]{0,6})(?:\.[0-9]+)?,"y":"[a-c]*x"\}'
    vi = VocabIndex.build(vocab)
    build_table(regex_to_dfa(first), token_rows(regex_to_dfa(first), vi), vocab)
    walks = [walk for walk in vi.classes.values() if isinstance(walk, tokenwalk.ClassWalk)]
    derived = [walk.derived for walk in walks if walk.derived]
    assert any(key[0] == "not_ending_at" for d in derived for key in d if isinstance(key, tuple)), "nothing kept"
    kept = {id(walk) for walk in walks if walk.derived}
    dfa = regex_to_dfa(second)
    rows = token_rows(dfa, vi)
    assert {id(row.base) for row in rows if row.base is not None} & kept, "the second grammar shares no walk"
    reused = build_table(dfa, rows, vocab)
    fresh = build_table(dfa, token_rows(dfa, VocabIndex.build(vocab)), vocab)
    for name in TABLE_ARRAYS:
        assert np.array_equal(getattr(reused, name), getattr(fresh, name)), name


@pytest.mark.parametrize(("lengths", "long_rows"), [((3, 1, 5), {False}), ((40, 2, 60, 1), {False, True}),
                                                    ((50, 70), {True})])
def test_sorted_rows_groups_short_and_long_rows_alike(lengths, long_rows):
    """The generic walk's rows: (state, token, end) triples with states non-decreasing and tokens in
    any order become per-state rows sorted by token, whether a row is sorted with the others (short)
    or through a vocabulary-wide buffer (long: over 1/16 of the vocabulary), all short, all long or mixed."""
    rng = np.random.default_rng(sum(lengths))
    vocab_size = 640
    state, tok, end = [], [], []
    for q, n in enumerate(lengths):
        ids = rng.choice(vocab_size, size=n, replace=False)
        state += [2 * q + 1] * n
        tok += ids.tolist()
        end += rng.integers(0, 9, size=n).tolist()
    state, tok, end = (np.asarray(x, dtype=np.int32) for x in (state, tok, end))
    rows = tokenwalk._sorted_rows(vocab_size, state, tok, end)
    assert sorted(rows) == [2 * q + 1 for q in range(len(lengths))]
    for q in rows:
        at = state == q
        order = np.argsort(tok[at])
        assert np.array_equal(rows[q][0], tok[at][order]) and np.array_equal(rows[q][1], end[at][order])
        assert rows[q][0].dtype == np.int32 and rows[q][1].dtype == np.int32
    assert {n * tokenwalk._DENSE_SORT_FRACTION >= vocab_size for n in lengths} == long_rows  # the paths the case takes
