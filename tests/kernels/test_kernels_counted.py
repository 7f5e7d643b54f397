"""Counters in the kernels: mask, sample and advance, Triton (interpreter) == torch == the host rule.

Rows are (state, counter, remaining) triples met on random walks through a compiled table whose
vocabulary has escapes, split UTF-8 characters and tokens that open, close or pass through a
string (an array of bounded strings, so `","` closes one body and opens the next; a pattern with
a maxLength, whose body has several character boundaries; a word count, whose counter counts the
words a token starts: ` ab ab` two). The host
rule is grammars/table.py's (TokenTable.count_allows / next_counter, walk.kept).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

import numpy as np
import pytest
import torch

from surecall.errors import KernelInputError
from surecall.grammars.compile import compile_schema
from surecall.grammars.table import TokenTable
from surecall.grammars.vocab.core import Vocab
from surecall.grammars.walk import kept
from surecall.kernels import DeviceTable, SamplingTensors, advance, apply_token_mask_inplace, sample
from surecall.kernels._triton import HAS_TRITON, INTERPRET

needs_interpreter = pytest.mark.skipif(
    not (HAS_TRITON and INTERPRET), reason="needs triton with TRITON_INTERPRET=1 set before import"
)
BACKENDS = ["torch", pytest.param("triton", marks=needs_interpreter)]
SCHEMA = {"type": "object", "properties": {
    "a": {"type": "array", "items": {"type": "string", "minLength": 2, "maxLength": 5}, "maxItems": 3},
    "b": {"type": "string", "minLength": 70, "maxLength": 75},
    "c": {"type": "string", "pattern": "^[a-z]+(-[a-z]+)*$", "maxLength": 60},
    "d": {"type": "string", "pattern": "^(?:\\S+\\s+){0,49}\\S+$"}}, "required": ["a", "b", "c", "d"]}


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SURECALL_CACHE_DIR", str(tmp_path / "cache"))


def _vocab() -> Vocab:
    pieces = [bytes([b]) for b in range(256)]
    pieces += [b'{"a": ["', b'", "', b'","', b'"xy"', b'ab', b'abcd', b'\\n', b'\\"', b'\\u00e9', b'\xc3\xa9',
               b'\xe2\x82', b'\xac"', b'\xac', b'"x', b'a"', b'"], "b": "', b'"]', b'abcdefghij', b'"}',
               b' ab ab', b'ab\\n ab', b'", "d": "']
    pieces += [b""]
    stop = len(pieces) - 1
    return Vocab(token_bytes=tuple(pieces), special_ids=frozenset({stop}), stop_ids=(stop,),
                 logits_width=len(pieces) + 9, format="test", name="counted-kernels")


@pytest.fixture(scope="module")
def compiled():
    vocab = _vocab()
    table = compile_schema(SCHEMA, vocab, use_cache=False)
    assert table.has_counts and table.count_entry_key.size
    return vocab, table


def _rows(table: TokenTable, rng, num: int):
    """(state, counter, remaining) triples met on random walks, inside and around tight budgets."""
    out = []
    while len(out) < num:
        budget = int(table.dist[0]) + int(rng.integers(0, 6))
        state, counter, used = 0, 0, 0
        while not table.accept[state] and len(out) < num:
            remaining = budget - used
            out.append((state, counter, remaining))
            toks, nexts = table.transitions(state)
            ok = np.flatnonzero(kept(table, state, counter, toks, nexts, remaining))
            i = int(rng.choice(ok))
            state, counter = int(nexts[i]), table.next_counter(state, counter, int(toks[i]))
            used += 1
    return out


def _host_allowed(table: TokenTable, state: int, counter: int, remaining: int, width: int) -> np.ndarray:
    allowed = np.zeros(width, dtype=bool)
    toks, nexts = table.transitions(state)
    allowed[toks[kept(table, state, counter, toks, nexts, remaining)]] = True
    if table.accept[state] and remaining >= 1:
        allowed[table.stop_ids] = True
    return allowed


def _tensors(rows):
    states = torch.tensor([r[0] for r in rows], dtype=torch.int32)
    counters = torch.tensor([r[1] for r in rows], dtype=torch.int32)
    remaining = torch.tensor([r[2] for r in rows], dtype=torch.int32)
    return states, counters, remaining


@pytest.mark.parametrize("backend", BACKENDS)
def test_mask_with_counters_equals_the_host_rule(compiled, backend):
    vocab, table = compiled
    rows = _rows(table, np.random.default_rng(0), 160)
    states, counters, remaining = _tensors(rows)
    dt = DeviceTable.from_table(table)
    logits = torch.randn(len(rows), vocab.logits_width + 3)
    apply_token_mask_inplace(logits, dt, states, remaining=remaining, counters=counters, backend=backend)
    for b, (s, c, rem) in enumerate(rows):
        expected = _host_allowed(table, s, c, rem, logits.shape[1])
        assert np.array_equal(torch.isfinite(logits[b]).numpy(), expected), (s, c, rem)
    # the counters bind somewhere: without them the mask is wider on some rows
    loose = torch.randn(len(rows), vocab.logits_width + 3)
    plain = DeviceTable.from_table(TokenTable(**{**table.__dict__, "count_row": None}))
    apply_token_mask_inplace(loose, plain, states, remaining=remaining, backend=backend)
    assert int(torch.isfinite(loose).sum()) > int(torch.isfinite(logits).sum())


@needs_interpreter
@pytest.mark.interpreter
@pytest.mark.parametrize("temperature", [0.0, 1.3])
def test_sample_with_counters_triton_equals_torch(compiled, temperature):
    vocab, table = compiled
    rows = _rows(table, np.random.default_rng(1), 64)
    states, counters, remaining = _tensors(rows)
    dt = DeviceTable.from_table(table)
    logits = torch.randn(len(rows), vocab.logits_width) * 3
    n = len(rows)
    params = SamplingTensors.build([temperature] * n, [0] * n, [1.0] * n, list(range(n)), [5] * n)
    a = sample(logits, dt, states, params, remaining=remaining, counters=counters, backend="triton")
    b = sample(logits, dt, states, params, remaining=remaining, counters=counters, backend="torch")
    assert torch.equal(a.tokens, b.tokens)
    assert torch.allclose(a.logprobs, b.logprobs, atol=1e-5)
    for (s, c, rem), t in zip(rows, a.tokens.tolist(), strict=True):
        assert _host_allowed(table, s, c, rem, vocab.logits_width)[t]


@pytest.mark.parametrize("backend", BACKENDS)
def test_advance_updates_counters_like_the_host(compiled, backend):
    vocab, table = compiled
    rng = np.random.default_rng(2)
    rows = _rows(table, rng, 200)
    states, counters, remaining = _tensors(rows)
    tokens = []
    for s, c, rem in rows:
        allowed = np.flatnonzero(_host_allowed(table, s, c, rem, vocab.logits_width))
        tokens.append(int(rng.choice(allowed)))
    tokens = torch.tensor(tokens, dtype=torch.int64)
    dt = DeviceTable.from_table(table)
    nxt, finished, next_counters = advance(states, tokens, dt, counters=counters, backend=backend)
    stops = set(table.stop_ids.tolist())
    for b, ((s, c, _), t) in enumerate(zip(rows, tokens.tolist(), strict=True)):
        if t in stops:
            assert bool(finished[b]) and int(nxt[b]) == s and int(next_counters[b]) == c
        else:
            assert int(nxt[b]) == table.next_state(s, t)
            assert int(next_counters[b]) == table.next_counter(s, c, t), (s, c, t)
    moved = next_counters != counters
    assert bool(moved.any()) and bool((next_counters == 0).any())


def _replay(vocab: Vocab, table: TokenTable, text: str) -> tuple[int, int]:
    """(state, counter) after `text`, one byte token at a time."""
    state, counter = 0, 0
    for byte in text.encode():
        tok = vocab.token_bytes.index(bytes([byte]))
        state, counter = table.next_state(state, tok), table.next_counter(state, counter, tok)
    return state, counter


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_word_count_binds_at_its_bound_in_every_kernel(compiled, backend):
    """"d" counts words (at most 50: 49 whitespace runs that start a word): at each count near the
    bound, in a word and after whitespace, the mask agrees with the host rule; a token that starts
    two words is refused one word before a single-word token is; advance counts both words."""
    vocab, table = compiled
    two_words, space = vocab.token_bytes.index(b" ab ab"), vocab.token_bytes.index(b" ")
    rows, where = [], {}
    for words in (47, 48, 49, 50):
        for tail in ("", " ") if words < 50 else ("",):
            text = '{"a": ["ab"], "b": "' + "a" * 70 + '", "c": "ab", "d": "' + " ".join(["ab"] * words) + tail
            state, counter = _replay(vocab, table, text)
            assert counter == words - 1 + len(tail)  # the whitespace after a word starts the next one
            where[words, tail] = len(rows)
            rows.append((state, counter, 10_000))
    states, counters, remaining = _tensors(rows)
    dt = DeviceTable.from_table(table)
    logits = torch.randn(len(rows), vocab.logits_width)
    apply_token_mask_inplace(logits, dt, states, remaining=remaining, counters=counters, backend=backend)
    for b, (s, c, rem) in enumerate(rows):
        assert np.array_equal(torch.isfinite(logits[b]).numpy(), _host_allowed(table, s, c, rem, logits.shape[1]))
    allowed = torch.isfinite(logits)
    assert bool(allowed[where[48, ""], two_words]) and not bool(allowed[where[49, ""], two_words])
    assert bool(allowed[where[49, ""], space]) and not bool(allowed[where[50, ""], space])
    tokens = torch.full((len(rows),), two_words, dtype=torch.int64)
    _, _, next_counters = advance(states, tokens, dt, counters=counters, backend=backend, check=False)
    assert int(next_counters[where[48, ""]]) == 49


@needs_interpreter
@pytest.mark.interpreter
def test_concatenated_counted_and_plain_tables_triton_equals_torch(compiled):
    vocab, table = compiled
    plain = compile_schema({"type": "array", "items": {"type": "integer"}}, vocab, use_cache=False)
    both, offsets = TokenTable.concat([plain, table])
    rows = [(s + int(offsets[1]), c, r) for s, c, r in _rows(table, np.random.default_rng(3), 60)]
    rows += [(s, 0, 50) for s in range(plain.num_states) if not plain.accept[s]]
    states, counters, remaining = _tensors(rows)
    dt = DeviceTable.from_table(both)
    logits = torch.randn(len(rows), vocab.logits_width)
    a, b = logits.clone(), logits.clone()
    apply_token_mask_inplace(a, dt, states, remaining=remaining, counters=counters, backend="triton")
    apply_token_mask_inplace(b, dt, states, remaining=remaining, counters=counters, backend="torch")
    assert torch.equal(a, b)
    tokens = torch.tensor([int(torch.argmax(x)) for x in a], dtype=torch.int64)
    ra = advance(states, tokens, dt, counters=counters, backend="triton")
    rb = advance(states, tokens, dt, counters=counters, backend="torch")
    assert all(torch.equal(x, y) for x, y in zip(ra, rb, strict=True))


def test_counted_table_without_counters_is_refused(compiled):
    vocab, table = compiled
    dt = DeviceTable.from_table(table)
    logits = torch.zeros(1, vocab.logits_width)
    states = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(KernelInputError, match="counters: expected an int32 tensor"):
        apply_token_mask_inplace(logits, dt, states)
    with pytest.raises(KernelInputError, match="counters: expected values >= 0"):
        apply_token_mask_inplace(logits, dt, states, counters=torch.full((1,), -3, dtype=torch.int32))
    with pytest.raises(KernelInputError, match="counters: expected an int32 tensor"):
        advance(states, torch.zeros(1, dtype=torch.int64), dt)


def _relayout(table: TokenTable) -> TokenTable:
    """The same grammar stored another way: one mask row per state, each state's *least* common
    next state as its default (so most transitions are exceptions)."""
    default = np.full(table.num_states, -1, dtype=np.int32)
    toks, nexts, ptr = [], [], [0]
    for s in range(table.num_states):
        tok, nxt = table.transitions(s)
        if tok.size:
            values, counts = np.unique(nxt, return_counts=True)
            default[s] = values[int(np.argmin(counts))]
        toks.append(tok[nxt != default[s]].astype(np.int32))
        nexts.append(nxt[nxt != default[s]])
        ptr.append(ptr[-1] + toks[-1].size)
    unshared = {  # one row per state (no row shared), each state's targets in slot order
        "exc_row": np.arange(table.num_states, dtype=np.int32), "exc_ptr": np.asarray(ptr, dtype=np.int32),
        "exc_tok": np.concatenate(toks)}
    targets = [np.unique(n, return_inverse=True) for n in nexts]
    unshared["exc_slot"] = np.concatenate([inv.reshape(-1) for _, inv in targets]).astype(np.int32)
    unshared["exc_targets"] = np.concatenate([t for t, _ in targets]).astype(np.int32)
    unshared["exc_base"] = np.concatenate([[0], np.cumsum([t.size for t, _ in targets])]).astype(np.int32)
    return TokenTable(**{**table.__dict__, "mask_row_blocks": table.mask_row_blocks[table.mask_row].copy(),
                         "mask_row": np.arange(table.num_states, dtype=np.int32), "trans_default": default,
                         **unshared})


@pytest.mark.parametrize("backend", BACKENDS)
def test_kernels_do_not_care_how_the_table_is_stored(compiled, backend):
    vocab, table = compiled
    other = _relayout(table)
    assert other.num_exceptions > table.num_exceptions and other.num_mask_rows > table.num_mask_rows
    rows = _rows(table, np.random.default_rng(4), 120)
    states, counters, remaining = _tensors(rows)
    logits = torch.randn(len(rows), vocab.logits_width + 3)
    masked = []
    for t in (table, other):
        x = logits.clone()
        apply_token_mask_inplace(x, DeviceTable.from_table(t), states, remaining=remaining, counters=counters,
                                 backend=backend)
        masked.append(x)
    assert torch.equal(masked[0], masked[1])
    rng = np.random.default_rng(5)
    tokens = torch.tensor([int(rng.choice(np.flatnonzero(torch.isfinite(x).numpy()))) for x in masked[0]])
    a = advance(states, tokens, DeviceTable.from_table(table), counters=counters, backend=backend)
    b = advance(states, tokens, DeviceTable.from_table(other), counters=counters, backend=backend)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    n = len(rows)
    params = SamplingTensors.build([1.3] * n, [0] * n, [1.0] * n, list(range(n)), [5] * n)
    drawn = [sample(logits[:, : vocab.logits_width].contiguous(), DeviceTable.from_table(t), states, params, remaining=remaining,
                    counters=counters, backend=backend).tokens for t in (table, other)]
    assert torch.equal(drawn[0], drawn[1])
