"""The compact TokenTable layout (grammars/table.py): distinct mask rows, default next + exceptions.

Exception rows are shared between states whose rows split the tokens alike (up to their targets).

A dense table (one mask row per state, full CSR rows) and its compact form must describe the
same transitions; mask rows split into blocks expand back to the same words, each block stored
once; `concat` stores mask rows and blocks shared between grammars once; the disk cache does
not read an entry of an older format.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from surecall.grammars import cache as table_cache
from surecall.grammars.compile import compile_regex
from surecall.grammars.options import GrammarOptions
from surecall.grammars.table import (
    MASK_BLOCK_WORDS,
    TokenTable,
    share_exception_rows,
    split_blocks,
    unique_rows,
)
from surecall.grammars.vocab.core import Vocab


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SURECALL_CACHE_DIR", str(tmp_path / "cache"))


def _dense(rng, num_states=7, vocab_size=90, width=100):
    """Random dense rows: a few repeated, next states skewed so a default exists; state 6 has none."""
    stop = vocab_size - 1
    rows = []
    for s in range(num_states):
        if s == num_states - 1:
            rows.append(({}, True))
            continue
        if s % 3 == 2:  # a repeat of the previous state's row (its mask row is stored once)
            rows.append(rows[-1])
            continue
        toks = np.flatnonzero(rng.random(vocab_size - 1) < 0.4)
        nexts = np.where(rng.random(toks.size) < 0.8, (s + 1) % num_states, rng.integers(0, num_states, toks.size))
        rows.append((dict(zip(toks.tolist(), nexts.tolist(), strict=True)), s == 4))
    bits = np.zeros((num_states, (width + 31) // 32 * 32), dtype=bool)
    ptr, tok, nxt = [0], [], []
    for s, (row, accepting) in enumerate(rows):
        items = sorted(row.items())
        tok += [t for t, _ in items]
        nxt += [n for _, n in items]
        ptr.append(len(tok))
        bits[s, [t for t, _ in items]] = True
        bits[s, stop] = accepting
    mask = np.ascontiguousarray(np.packbits(bits, axis=1, bitorder="little").view(np.int32))
    accept = np.array([a for _, a in rows])
    fields = {"accept": accept, "dist": np.where(accept, 0, 1).astype(np.int32), "vocab_size": vocab_size,
              "logits_width": width, "stop_ids": np.array([stop], dtype=np.int32)}
    return mask, np.array(ptr, np.int32), np.array(tok, np.int32), np.array(nxt, np.int32), fields


def test_from_dense_keeps_every_transition_and_stores_less():
    mask, ptr, tok, nxt, fields = _dense(np.random.default_rng(0))
    table = TokenTable.from_dense(mask, ptr, tok, nxt, **fields)
    assert table.num_mask_rows < mask.shape[0] and table.num_exceptions < tok.size
    assert table.num_transitions == tok.size
    for s in range(table.num_states):
        toks, nexts = table.transitions(s)
        assert np.array_equal(toks, tok[ptr[s] : ptr[s + 1]]) and np.array_equal(nexts, nxt[ptr[s] : ptr[s + 1]])
        assert np.array_equal(table.mask_words(s), mask[s])
        probe = np.arange(-1, table.logits_width + 2)
        expected = [table.next_state(s, int(t)) for t in probe]
        assert table.next_states(s, probe).tolist() == [-1 if e is None else e for e in expected]
        assert table.next_state(s, int(fields["stop_ids"][0])) is None, "a stop id is never a transition"
    assert table.trans_default[table.num_states - 1] == -1 and table.trans_default[0] == 1


def test_next_states_many_is_next_states_over_pairs():
    mask, ptr, tok, nxt, fields = _dense(np.random.default_rng(3))
    table = TokenTable.from_dense(mask, ptr, tok, nxt, **fields)
    probe = np.arange(-1, table.logits_width + 2)
    states = np.repeat(np.arange(table.num_states), probe.size)
    tokens = np.tile(probe, table.num_states)
    expected = np.concatenate([table.next_states(s, probe) for s in range(table.num_states)])
    got = table.next_states_many(states, tokens)
    assert got.dtype == np.int32 and np.array_equal(got, expected)
    assert (got >= 0).sum() == table.num_transitions
    shuffled = np.random.default_rng(4).permutation(states.size)  # pairs in any order
    assert np.array_equal(table.next_states_many(states[shuffled], tokens[shuffled]), expected[shuffled])


def test_from_dense_refuses_a_mask_of_the_wrong_height():
    mask, ptr, tok, nxt, fields = _dense(np.random.default_rng(1))
    with pytest.raises(ValueError, match="Invalid mask: expected 7 rows"):
        TokenTable.from_dense(mask[:-1], ptr, tok, nxt, **fields)


def test_concat_stores_shared_mask_rows_once():
    mask, ptr, tok, nxt, fields = _dense(np.random.default_rng(2))
    a = TokenTable.from_dense(mask, ptr, tok, nxt, **fields)
    both, offsets = TokenTable.concat([a, a])
    assert both.num_mask_rows == a.num_mask_rows and both.num_states == 2 * a.num_states
    for s in range(a.num_states):
        toks, nexts = both.transitions(int(offsets[1]) + s)
        mine = a.transitions(s)
        assert np.array_equal(toks, mine[0]) and np.array_equal(nexts, mine[1] + offsets[1])
    assert np.all(both.trans_default[offsets[1] :][a.trans_default < 0] == -1)


def test_unique_rows_merges_equal_rows_only_in_order_of_first_appearance():
    # [1, 2] and [2, 1] share their sum and xor: they must stay apart all the same.
    rows = np.array([[1, 2], [5, 5], [2, 1], [1, 2], [7, 0], [2, 1]], dtype=np.int32)
    distinct, index = unique_rows(rows)
    assert distinct.tolist() == [[1, 2], [5, 5], [2, 1], [7, 0]]
    assert index.tolist() == [0, 1, 2, 0, 3, 2]


def test_unique_short_rows_hashes_few_bit_blocks_apart(monkeypatch):
    """Mask blocks of a few set bits at shifted places (a Kubernetes schema's blocks 0x80 at one
    lane vs 0x200 and 0x80 at two others shared a key under a near-linear hash, and every compile
    fell back to unique_rows): the hash alone tells them apart, in first-appearance order."""
    import surecall.grammars.table as table_module

    rng = np.random.default_rng(3)
    blocks = np.zeros((4000, 32), dtype=np.int32)
    for row in blocks:
        for lane in rng.choice(32, size=rng.integers(1, 4), replace=False):
            row[lane] = 1 << int(rng.integers(0, 12))
    wide = blocks.view(np.uint64)
    wide[0, :], wide[1, :] = 0, 0
    wide[0, 12], wide[1, 0], wide[1, 10] = 0x80, 0x200, 0x80  # the pair that collided
    expected = unique_rows(blocks)

    def refuse(_):
        raise AssertionError("unique_short_rows fell back to unique_rows")

    monkeypatch.setattr(table_module, "unique_rows", refuse)
    distinct, index = table_module.unique_short_rows(blocks)
    assert np.array_equal(distinct, expected[0]) and np.array_equal(index, expected[1])


def _vocab() -> Vocab:
    pieces = tuple(bytes([b]) for b in range(256)) + (b'"ab', b"cd", b'e"', b"")
    return Vocab(token_bytes=pieces, special_ids=frozenset({len(pieces) - 1}), stop_ids=(len(pieces) - 1,),
                 logits_width=len(pieces) + 5, format="test", name="layout")


def test_string_body_rows_are_stored_once_and_mostly_defaults():
    table = compile_regex(r'\["[a-e]{0,6}"(?:,"[a-e]*")*\]', _vocab(), GrammarOptions(), use_cache=False)
    assert table.num_mask_rows < table.num_states
    assert table.num_exceptions < table.num_transitions // 2
    assert table.meta["exceptions"] == table.num_exceptions and table.meta["mask_rows"] == table.num_mask_rows


def test_cache_entry_of_an_older_format_is_not_read():
    vocab = _vocab()
    regex = r'"[a-e]{1,4}"'
    compile_regex(regex, vocab, GrammarOptions())
    key = table_cache.entry_key("regex", regex, vocab, GrammarOptions())
    entry = table_cache.entry_path(key)
    header = json.loads((entry / "header.json").read_text())
    assert header["format"] == table_cache.CACHE_FORMAT and "exc_tok" in header["arrays"]
    header["format"] = 2
    (entry / "header.json").write_text(json.dumps(header))
    assert table_cache.load(key) is None and not entry.exists()


def test_dense_transitions_is_the_full_csr():
    mask, ptr, tok, nxt, fields = _dense(np.random.default_rng(3))
    table = TokenTable.from_dense(mask, ptr, tok, nxt, **fields)
    got_ptr, got_tok, got_next = table.dense_transitions()
    assert np.array_equal(got_ptr, ptr) and np.array_equal(got_tok, tok) and np.array_equal(got_next, nxt)


def _shared_block_rows(rng, num_rows=9, words=70, bw=4):
    """Dense rows assembled block by block from three random blocks or zeros: blocks repeat across rows."""
    palette = rng.integers(-(2**31), 2**31, size=(3, bw), dtype=np.int64).astype(np.int32)
    nb = -(-words // bw)
    picks = rng.integers(-1, 3, size=(num_rows, nb))
    rows = np.zeros((num_rows, nb * bw), dtype=np.int32)
    for r, c in zip(*np.nonzero(picks >= 0), strict=True):
        rows[r, c * bw : (c + 1) * bw] = palette[picks[r, c]]
    return rows[:, :words]


@pytest.mark.parametrize("bw", [1, 4, 32])
def test_split_blocks_round_trips_and_stores_each_block_once(bw):
    rows = _shared_block_rows(np.random.default_rng(bw), bw=max(bw, 4))
    blocks, ids = split_blocks(rows, bw)
    assert blocks.dtype == np.int32 and blocks.shape[1] == bw and ids.shape == (rows.shape[0], -(-70 // bw))
    assert not blocks[0].any() and blocks[1:].any(axis=1).all()
    assert len({b.tobytes() for b in blocks}) == blocks.shape[0], "a block is stored twice"
    assert blocks.shape[0] < ids.size // 2, "shared blocks were not merged"
    dense = blocks[ids].reshape(rows.shape[0], -1)
    assert np.array_equal(dense[:, :70], rows) and not dense[:, 70:].any()


def test_a_table_of_shared_blocks_reads_like_its_dense_rows():
    rng = np.random.default_rng(5)
    mask = _shared_block_rows(rng, num_rows=6, words=70)  # 3 blocks of 32 words per row, the last partial
    width = 70 * 32
    toks = [np.flatnonzero(np.unpackbits(r.view(np.uint8), bitorder="little")) for r in mask]
    ptr = np.concatenate([[0], np.cumsum([t.size for t in toks])]).astype(np.int32)
    tok = np.concatenate(toks).astype(np.int32)
    nxt = rng.integers(0, 6, size=tok.size).astype(np.int32)
    table = TokenTable.from_dense(mask, ptr, tok, nxt, accept=np.ones(6, bool), dist=np.zeros(6, np.int32),
                                  vocab_size=width, logits_width=width, stop_ids=np.zeros(0, np.int32))
    assert table.block_words == MASK_BLOCK_WORDS and table.mask_row_blocks.shape[1] == 3
    assert np.array_equal(table.mask_dense(table.mask_row), mask)
    for s in range(6):
        assert np.array_equal(table.mask_words(s), mask[s])
        assert np.array_equal(table.allowed(s), toks[s])
        probe = np.arange(-1, width + 1)
        assert np.array_equal(table.next_states(s, probe) >= 0, np.isin(probe, toks[s]))
    assert table.num_transitions == tok.size
    ptr_d, tok_d, next_d = table.dense_transitions()
    assert np.array_equal(ptr_d, ptr) and np.array_equal(tok_d, tok) and np.array_equal(next_d, nxt)


def test_concat_merges_the_blocks_of_different_tables():
    tables, dense = [], []
    for seed in (2, 3):
        mask, ptr, tok, nxt, fields = _dense(np.random.default_rng(seed), width=3000)
        tables.append(TokenTable.from_dense(mask, ptr, tok, nxt, **fields))
        dense.append(mask)
    both, _ = TokenTable.concat(tables)
    assert np.array_equal(both.mask_dense(both.mask_row), np.concatenate(dense))
    assert both.mask_blocks.shape[0] <= sum(t.mask_blocks.shape[0] for t in tables) - 1  # one zero block
    assert len({b.tobytes() for b in both.mask_blocks}) == both.mask_blocks.shape[0]
    again, _ = TokenTable.concat([tables[0], tables[0]])
    assert np.array_equal(again.mask_blocks, tables[0].mask_blocks)


@pytest.mark.parametrize(("change", "match"), [
    (lambda t: {"mask_blocks": t.mask_blocks.astype(np.int64)}, "Invalid mask_blocks: expected int32"),
    (lambda t: {"mask_blocks": t.mask_blocks[:, :3].copy()}, "expected a power-of-two block width, got 3"),
    (lambda t: {"mask_blocks": t.mask_blocks[::-1].copy()}, "expected block 0 all zero"),
    (lambda t: {"mask_row_blocks": t.mask_row_blocks[:, :1].copy()}, r"Invalid mask_row_blocks: expected int32 \[U, 3\]"),
    (lambda t: {"mask_row_blocks": t.mask_row_blocks + 99}, r"expected block ids in \[0, \d+\)"),
])
def test_a_malformed_block_layout_is_refused(change, match):
    mask, ptr, tok, nxt, fields = _dense(np.random.default_rng(0), width=3000)
    table = TokenTable.from_dense(mask, ptr, tok, nxt, **fields)
    with pytest.raises(ValueError, match=match):
        TokenTable(**{**table.__dict__, **change(table)})


def _state_rows(rng, num_states=40, vocab=300):
    """Per-state exception rows as one CSR: a few token sets and target patterns reused with other
    targets (one body followed by other text), some rows empty."""
    shapes = [np.sort(rng.choice(vocab, size=k, replace=False)).astype(np.int32) for k in (0, 5, 17, 60)]
    ptr, toks, nexts = [0], [], []
    for _ in range(num_states):
        tok = shapes[int(rng.integers(len(shapes)))]
        pattern = rng.integers(0, 3, size=tok.size)
        targets = rng.choice(num_states, size=3, replace=False)
        toks.append(tok)
        nexts.append(targets[pattern].astype(np.int32))
        ptr.append(ptr[-1] + tok.size)
    return np.asarray(ptr), np.concatenate(toks), np.concatenate(nexts)


def test_shared_exception_rows_expand_back_to_every_state_row():
    rng = np.random.default_rng(11)
    ptr, tok, nxt = _state_rows(rng)
    shared = share_exception_rows(ptr, tok, nxt)
    rows = shared["exc_ptr"].size - 1
    assert rows < ptr.size - 1 and shared["exc_tok"].size < tok.size  # alike rows are stored once
    assert shared["exc_slot"].dtype == np.uint8
    table = TokenTable(mask_blocks=np.zeros((1, 4), np.int32), mask_row_blocks=np.zeros((1, 3), np.int32),
                       mask_row=np.zeros(ptr.size - 1, np.int32), accept=np.zeros(ptr.size - 1, bool),
                       trans_default=np.zeros(ptr.size - 1, np.int32), dist=np.zeros(ptr.size - 1, np.int32),
                       vocab_size=300, logits_width=300, stop_ids=np.zeros(0, np.int32), **shared)
    owner, got_tok, got_next = table.state_exceptions()
    assert np.array_equal(owner, np.repeat(np.arange(ptr.size - 1), np.diff(ptr)))
    assert np.array_equal(got_tok, tok) and np.array_equal(got_next, nxt)
    for s in range(ptr.size - 1):
        lo, hi = table.exc_span(s)
        assert np.array_equal(table.exc_next_of(s, slice(lo, hi)), nxt[ptr[s]:ptr[s + 1]])
        targets = table.exc_targets[table.exc_base[s]:table.exc_base[s + 1]]
        assert np.array_equal(targets, np.unique(nxt[ptr[s]:ptr[s + 1]]))  # each distinct target once, ascending
    sub = np.asarray([5, 0, 17])
    owner, got_tok, got_next = table.state_exceptions(sub)
    assert np.array_equal(got_tok, np.concatenate([tok[ptr[s]:ptr[s + 1]] for s in sub]))
    assert np.array_equal(got_next, np.concatenate([nxt[ptr[s]:ptr[s + 1]] for s in sub]))


@pytest.mark.parametrize("seed", [3, 11, 29])
def test_shared_exception_rows_bitmap_and_sort_agree(seed, monkeypatch):
    """share_exception_rows marks (state, target) pairs in a bitmap when that is small and sorts
    them otherwise: both give every field alike."""
    import surecall.grammars.table as table_module

    ptr, tok, nxt = _state_rows(np.random.default_rng(seed))
    monkeypatch.setattr(table_module, "_DENSE_PAIRS", 0)
    by_sort = share_exception_rows(ptr, tok, nxt)
    monkeypatch.setattr(table_module, "_DENSE_PAIRS", 1 << 30)
    assert (ptr.size - 1) * (int(nxt.max()) + 1) <= table_module._DENSE_PER_EXCEPTION * tok.size, \
        "the case does not take the bitmap"
    by_bitmap = share_exception_rows(ptr, tok, nxt)
    for name, array in by_sort.items():
        assert array.dtype == by_bitmap[name].dtype and np.array_equal(array, by_bitmap[name]), name


def test_a_schema_with_one_body_at_several_places_shares_its_rows(tmp_path):
    """The same string body under several properties: each copy's states send the tokens alike,
    followed by other text; their rows are stored once, and every transition reads the same."""
    vocab = _vocab()
    pattern = "^[a-z]+(?:-[a-z0-9]+)*$"
    schema = {"type": "object", "properties": {k: {"type": "string", "pattern": pattern} for k in "abcdef"},
              "required": list("abcdef"), "additionalProperties": False}
    from surecall.grammars.compile import compile_schema

    table = compile_schema(schema, vocab, use_cache=False)
    assert table.exc_ptr.size - 1 < table.num_states
    assert table.num_exceptions < table.num_state_exceptions
    for s in range(table.num_states):
        toks, nexts = table.transitions(s)
        assert np.array_equal(table.next_states(s, toks), nexts)
