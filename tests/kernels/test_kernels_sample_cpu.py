"""The CPU fast paths (kernels/sample_cpu.py, advance's host path) equal the torch references.

sample_cpu must give sample_torch's tokens exactly (same seeds, same steps) and its logprobs up to
float summation order: on random tables, with budgets, counters, stop ids, greedy rows, rows that
allow few tokens (the sparse draw) or most (the dense draw), free rows and a tiny cache.
"""

from __future__ import annotations

import importlib
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

import numpy as np
import pytest
import torch
from helpers.kernels_synth import deep_table, random_states, random_table

from surecall.grammars.compile import compile_schema
from surecall.grammars.vocab.core import Vocab
from surecall.kernels import DeviceTable, SamplingTensors, sample
from surecall.kernels import sample_cpu as cpu
from surecall.kernels.advance import _advance_host, advance_torch
from surecall.kernels.budget import _exc_find_host, exc_find_torch
from surecall.kernels.sample import sample_cpu, sample_torch

sample_mod = importlib.import_module("surecall.kernels.sample")  # the package exports `sample`, the function

SPARSE_MAX = [None, 0, 10**9]  # the default split, every grammar row dense, every grammar row sparse


def _params(rng, batch, temps=(0.0, 0.7, 1.0, 1.6)):
    return SamplingTensors.build(
        rng.choice(temps, size=batch).tolist(), [0] * batch, [1.0] * batch,
        rng.integers(-(2**62), 2**62, size=batch).tolist(), rng.integers(0, 1000, size=batch).tolist(),
    )  # fmt: skip


def _same(a, b):
    assert torch.equal(a.tokens, b.tokens)
    assert torch.equal(torch.isinf(a.logprobs), torch.isinf(b.logprobs))
    torch.testing.assert_close(a.logprobs, b.logprobs, rtol=1e-5, atol=1e-5)
    if a.unmasked_logprobs is not None:
        torch.testing.assert_close(a.unmasked_logprobs, b.unmasked_logprobs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("sparse_max", SPARSE_MAX)
def test_equals_reference_on_random_tables_with_budgets(seed, sparse_max):
    rng = np.random.default_rng(seed)
    table = deep_table(rng, vocab_size=700, logits_width=736) if seed % 2 else random_table(rng, 10, 500, 512)
    dt = DeviceTable.from_table(table)
    states = torch.from_numpy(random_states(rng, 24, table.num_states))
    # around each row's dist: the budget binds, keeps only a prefix, or forbids everything (0)
    remaining = (dt.dist[states.clamp(min=0).long()] + torch.from_numpy(rng.integers(-1, 3, size=24))).clamp(min=0)
    dtype = torch.bfloat16 if seed == 3 else torch.float32
    logits = torch.from_numpy((3 * rng.normal(size=(24, dt.logits_width))).astype(np.float32)).to(dtype)
    params = _params(rng, 24)
    for rem in (None, remaining.to(torch.int32)):
        ref = sample_torch(logits, dt, states, params, rem, True)
        _same(sample_cpu(logits, dt, states, params, rem, True, sparse_max=sparse_max), ref)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rows_with_few_allowed_tokens_take_the_sparse_draw(temperature, monkeypatch):
    rng = np.random.default_rng(7)
    table = random_table(rng, num_states=8, vocab_size=8000, max_density=0.06)  # <= 6% < 1/8
    dt = DeviceTable.from_table(table)
    states = torch.from_numpy(rng.integers(0, 8, size=12).astype(np.int32))
    logits = torch.from_numpy((10 * rng.normal(size=(12, 8000))).astype(np.float32))
    params = _params(rng, 12, temps=(temperature,))
    monkeypatch.setattr(sample_mod, "draw_dense", lambda *a: pytest.fail("the dense draw was used"))
    out = sample_cpu(logits, dt, states, params)
    _same(out, sample_torch(logits, dt, states, params))
    for b, s in enumerate(states.tolist()):  # the draw is one of the state's allowed tokens
        assert int(out.tokens[b]) in set(table.allowed(s).tolist())


def test_ties_pick_the_lowest_id_on_both_paths():
    rng = np.random.default_rng(3)
    table = random_table(rng, num_states=6, vocab_size=300)
    dt = DeviceTable.from_table(table)
    states = torch.from_numpy(random_states(rng, 16, 6))
    logits = torch.zeros(16, 300)  # every allowed token ties on greedy rows
    params = _params(rng, 16, temps=(0.0,))
    ref = sample_torch(logits, dt, states, params)
    for sparse_max in SPARSE_MAX:
        _same(sample_cpu(logits, dt, states, params, sparse_max=sparse_max), ref)
    for b, s in enumerate(states.tolist()):
        allowed = table.allowed(s) if s >= 0 else np.arange(300)
        assert int(ref.tokens[b]) == (int(allowed.min()) if allowed.size else -1)


def test_empty_rows_and_stop_ids():
    rng = np.random.default_rng(11)
    table = deep_table(rng, vocab_size=400)
    dt = DeviceTable.from_table(table)
    accepting, deep = int(np.flatnonzero(table.accept)[0]), int(np.argmax(table.dist))
    states = torch.tensor([accepting] * 4 + [deep] * 4, dtype=torch.int32)
    # remaining 1: a stop id or a step into an accepting state; remaining 0 on the deep state: nothing
    remaining = torch.tensor([1, 1, 3, 9, 0, 0, 40, 9], dtype=torch.int32)
    logits = torch.from_numpy((2 * rng.normal(size=(8, 400))).astype(np.float32))
    params = _params(rng, 8)
    ref = sample_torch(logits, dt, states, params, remaining)
    for sparse_max in SPARSE_MAX:
        _same(sample_cpu(logits, dt, states, params, remaining, sparse_max=sparse_max), ref)
    nxt, finished = advance_torch(states[:2], ref.tokens[:2], dt)
    stops = set(table.stop_ids.tolist())
    for b in range(2):
        assert (int(ref.tokens[b]) in stops and bool(finished[b])) or bool(table.accept[int(nxt[b])])
    assert ref.tokens[4:6].tolist() == [-1, -1] and torch.isinf(ref.logprobs[4:6]).all()


def test_a_tiny_cache_evicts_and_still_matches():
    rng = np.random.default_rng(5)
    table = random_table(rng, num_states=12, vocab_size=900)
    dt = DeviceTable.from_table(table)
    cache = cpu.table_cache(dt, 900)
    cache.max_bytes = 1  # every new entry evicts the older ones
    for step in range(4):
        states = torch.from_numpy(random_states(rng, 10, 12))
        logits = torch.from_numpy((4 * rng.normal(size=(10, 900))).astype(np.float32))
        params = _params(rng, 10)
        _same(sample_cpu(logits, dt, states, params), sample_torch(logits, dt, states, params))
        assert len(cache.entries) <= 1, step


def _counted_vocab() -> Vocab:
    pieces = [bytes([b]) for b in range(256)]
    pieces += [b'{"s": "', b'"}', b'ab', b'abcd', b'abcdefgh', b'\\n', b'\xc3\xa9', b'"', b'a"}', b""]
    stop = len(pieces) - 1
    return Vocab(token_bytes=tuple(pieces), special_ids=frozenset({stop}), stop_ids=(stop,),
                 logits_width=len(pieces) + 5, format="test", name="sample-cpu-counted")  # fmt: skip


@pytest.fixture
def counted(tmp_path, monkeypatch):
    monkeypatch.setenv("SURECALL_CACHE_DIR", str(tmp_path / "cache"))
    schema = {"type": "object", "properties": {"s": {"type": "string", "minLength": 3, "maxLength": 9}},
              "required": ["s"]}  # fmt: skip
    vocab = _counted_vocab()
    table = compile_schema(schema, vocab, use_cache=False)
    assert table.has_counts
    return vocab, table


def test_counted_rows_on_walks_equal_the_reference(counted):
    """Walk the grammar with the fast sampler and the fast advance; at every step both equal the
    references (tokens, logprobs, next states, next counters), with budgets that bind."""
    vocab, table = counted
    dt = DeviceTable.from_table(table)
    rng = np.random.default_rng(0)
    batch = 16
    states = torch.zeros(batch, dtype=torch.int32)
    counters = torch.zeros(batch, dtype=torch.int32)
    budget = torch.from_numpy(int(table.dist[0]) + rng.integers(0, 8, size=batch)).to(torch.int32)
    seen_inside = 0
    for step in range(14):
        logits = torch.from_numpy((3 * rng.normal(size=(batch, vocab.logits_width))).astype(np.float32))
        params = _params(rng, batch)
        remaining = (budget - step).clamp(min=1)
        going = torch.where(states >= 0, states, torch.full_like(states, -1))
        ref = sample_torch(logits, dt, going, params, remaining, False, counters)
        for sparse_max in SPARSE_MAX:
            _same(sample_cpu(logits, dt, going, params, remaining, False, counters, sparse_max=sparse_max), ref)
        seen_inside += int((dt.count_row[going.clamp(min=0).long()] >= 0).logical_and(going >= 0).sum())
        host, torch_ref = _advance_host(going, ref.tokens, dt, counters), advance_torch(going, ref.tokens, dt, counters)
        for a, b in zip(host, torch_ref, strict=True):
            assert torch.equal(a, b) and a.dtype == b.dtype
        nxt, finished, counters = host
        states = torch.where(finished | (nxt < 0), torch.full_like(nxt, -1), nxt)
    assert seen_inside > batch  # the walks spent steps inside the counted body


def test_advance_host_and_exception_search_host_equal_the_tensor_forms():
    rng = np.random.default_rng(2)
    for seed in range(5):
        table = random_table(np.random.default_rng(seed), num_states=10, vocab_size=300, logits_width=320)
        dt = DeviceTable.from_table(table)
        states = torch.from_numpy(random_states(rng, 40, 10))
        tokens = torch.from_numpy(rng.integers(-2, 330, size=40)).long()
        for a, b in zip(_advance_host(states, tokens, dt), advance_torch(states, tokens, dt), strict=True):
            assert torch.equal(a, b) and a.dtype == b.dtype
        live = states.clamp(min=0).long()
        host = _exc_find_host(dt, live, tokens)
        loop = exc_find_torch(dt, live.repeat(2), tokens.repeat(2))  # > HOST_SEARCH_MAX_ROWS: the loop
        assert torch.equal(host[0], loop[0][:40])
        assert torch.equal(host[1][host[0]], loop[1][:40][loop[0][:40]])


def test_sample_routes_cpu_tensors_to_the_fast_path(monkeypatch):
    rng = np.random.default_rng(9)
    table = random_table(rng, num_states=5, vocab_size=200)
    dt = DeviceTable.from_table(table)
    states = torch.from_numpy(random_states(rng, 6, 5))
    logits = torch.randn(6, 200)
    params = _params(rng, 6)
    monkeypatch.setattr(sample_mod, "sample_cpu", lambda *a, **k: "fast")
    assert sample(logits, dt, states, params, backend="torch") == "fast"


def test_sort_path_mask_equals_the_reference_bit_for_bit(counted):
    vocab, table = counted
    dt = DeviceTable.from_table(table)
    rng = np.random.default_rng(4)
    states = torch.from_numpy(rng.integers(-1, table.num_states, size=12).astype(np.int32))
    counters = torch.from_numpy(rng.integers(0, 12, size=12).astype(np.int32))
    remaining = torch.from_numpy(rng.integers(0, 6, size=12).astype(np.int32))
    logits = torch.from_numpy((3 * rng.normal(size=(12, vocab.logits_width))).astype(np.float32))
    inv_t = torch.from_numpy(rng.uniform(0.5, 2.0, size=12).astype(np.float32))
    from surecall.kernels.sample import _masked_scaled

    ref = _masked_scaled(logits, dt, states, remaining, inv_t, "torch", counters)
    assert torch.equal(cpu.masked_scaled(logits, dt, states, remaining, counters, inv_t), ref)
    params = SamplingTensors.build([1.0] * 12, [5] * 12, [0.9] * 12, list(range(12)), [3] * 12)
    out = sample(logits, dt, states, params, remaining=remaining, counters=counters, check=False)
    assert all(t == -1 or bool(torch.isfinite(ref[b, t])) for b, t in enumerate(out.tokens.tolist()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temps", [(1.0,), (0.0, 1.0), (0.5, 1.0)])
def test_logits_are_never_written(dtype, temps):
    rng = np.random.default_rng(13)
    table = random_table(rng, num_states=6, vocab_size=800)
    dt = DeviceTable.from_table(table)
    logits = torch.from_numpy((3 * rng.normal(size=(10, 800))).astype(np.float32)).to(dtype)
    before = logits.clone()
    params = _params(rng, 10, temps=temps)
    for tab, states in ((None, None), (dt, torch.from_numpy(random_states(rng, 10, 6)))):
        for sparse_max in SPARSE_MAX:
            out = sample_cpu(logits, tab, states, params, sparse_max=sparse_max)
            assert torch.equal(logits, before)
            _same(out, sample_torch(logits, tab, states, params))


def test_row_keys_numpy_path_equals_the_int64_arithmetic():
    from surecall.kernels import rng as rng_mod

    gen = np.random.default_rng(0)
    seed = torch.from_numpy(gen.integers(-(2**63), 2**63 - 1, size=2000, dtype=np.int64))
    step = torch.from_numpy(gen.integers(0, 2**40, size=2000))
    seed[:3], step[:3] = torch.tensor([0, -1, 2**63 - 1]), torch.tensor([0, -1, 2**33 + 5])
    key_a, key_b = rng_mod.row_keys(seed, step)  # CPU: numpy uint32
    f, m = rng_mod.fmix32_torch, rng_mod.MASK32
    ref_a = f((seed & m) ^ f(((seed >> 32) & m) ^ rng_mod.SEED_SALT))
    ref_b = f(ref_a ^ (step & m) ^ f(((step >> 32) & m) ^ rng_mod.STEP_SALT))
    assert torch.equal(key_a, ref_a) and torch.equal(key_b, ref_b) and key_a.dtype == torch.int64


@pytest.mark.parametrize("rows", [1, 5, 16, 17])  # the Python-int path up to HOST_KEY_ROWS, numpy above
def test_row_keys_host_equals_the_numpy_path(rows):
    from surecall.kernels import rng as rng_mod

    gen = np.random.default_rng(rows)
    seed = gen.integers(-(2**63), 2**63 - 1, size=rows, dtype=np.int64)
    step = gen.integers(0, 2**40, size=rows)
    seed[0], step[0] = -1, 2**33 + 5  # both halves of the int64s matter
    host, ref = rng_mod.row_keys_host(seed, step), rng_mod.row_keys_numpy(seed, step)
    for a, b in zip(host, ref, strict=True):
        assert a.dtype == np.uint32 and np.array_equal(a, b)


def test_gumbel_numpy_equals_the_int64_form():
    from surecall.kernels.rng import gumbel_int64, gumbel_numpy, row_keys

    gen = np.random.default_rng(1)
    key_a, key_b = row_keys(torch.from_numpy(gen.integers(-(2**62), 2**62, size=6)), torch.arange(6))
    tokens = torch.from_numpy(gen.integers(0, 2**31 - 1, size=(6, 3000)))
    tokens[0, :3] = torch.tensor([0, 1, 2**31 - 1])
    fast = torch.from_numpy(gumbel_numpy(tokens.numpy(), key_a[:, None].numpy(), key_b[:, None].numpy()))
    assert torch.equal(fast, gumbel_int64(tokens, key_a[:, None], key_b[:, None]))


def test_a_dropped_table_takes_its_cache_with_it():
    import gc

    rng = np.random.default_rng(6)
    dt = DeviceTable.from_table(random_table(rng, num_states=4, vocab_size=100))
    params = _params(rng, 3)
    sample_cpu(torch.randn(3, 100), dt, torch.zeros(3, dtype=torch.int32), params)
    key = (id(dt), 100)
    assert key in cpu._CACHES
    del dt
    gc.collect()
    assert key not in cpu._CACHES


@pytest.mark.parametrize("scale", [1.0, 10.0])  # flat rows: noise everywhere; peaked: noise near the top
def test_dense_draw_both_noise_forms_equal_the_reference(scale, monkeypatch):
    rng = np.random.default_rng(21)
    table = random_table(rng, num_states=6, vocab_size=6000)
    dt = DeviceTable.from_table(table)
    logits = torch.from_numpy((scale * rng.normal(size=(8, 6000))).astype(np.float32))
    params = _params(rng, 8, temps=(0.0, 1.0))
    gathered = []
    real = cpu._segment_argmax
    monkeypatch.setattr(cpu, "_segment_argmax", lambda *a: gathered.append(1) or real(*a))
    _same(sample_cpu(logits, None, None, params), sample_torch(logits, None, None, params))
    assert bool(gathered) == (scale == 10.0)  # free rows: all of a flat row is near its top
    states = torch.from_numpy(random_states(rng, 8, 6))
    _same(sample_cpu(logits, dt, states, params, sparse_max=0), sample_torch(logits, dt, states, params))
