"""sample: Triton (interpreter) == torch reference, distribution (chi-square), seeds, greedy, logprobs."""

from __future__ import annotations

import math
import os

os.environ.setdefault(
    "TRITON_INTERPRET", "1"
)  # before anything imports triton (make test sets it too)

import numpy as np
import pytest
import torch
from helpers.kernels_synth import deep_table, random_states, random_table

from surecall.errors import KernelInputError
from surecall.kernels import DeviceTable, SamplingTensors, sample
from surecall.kernels._triton import HAS_TRITON, INTERPRET
from surecall.kernels.mask import allowed_columns

needs_interpreter = pytest.mark.skipif(
    not (HAS_TRITON and INTERPRET), reason="needs triton with TRITON_INTERPRET=1 set before import"
)
BACKENDS = ["torch", pytest.param("triton", marks=needs_interpreter)]


def _params(batch, rng=None, temperature=None, seed=None, step=None, top_k=None, top_p=None):
    rng = rng or np.random.default_rng(0)
    temps = (
        temperature
        if temperature is not None
        else rng.choice([0.0, 0.6, 1.0, 1.7], size=batch).tolist()
    )
    return SamplingTensors.build(
        temps,
        top_k if top_k is not None else [0] * batch,
        top_p if top_p is not None else [1.0] * batch,
        seed if seed is not None else rng.integers(-(2**62), 2**62, size=batch).tolist(),
        step if step is not None else rng.integers(0, 10_000, size=batch).tolist(),
    )


def _case(seed, batch, vocab, width, logits_width=None, scale=3.0):
    rng = np.random.default_rng(seed)
    table = random_table(rng, num_states=10, vocab_size=vocab, logits_width=logits_width)
    states = torch.from_numpy(random_states(rng, batch, 10))
    logits = torch.from_numpy((scale * rng.normal(size=(batch, width))).astype(np.float32))
    return rng, table, DeviceTable.from_table(table), states, logits


def _masked_reference(logits, dt, states, temperature):
    """float32 masked, tempered logits computed independently of the kernels (T = 1 for greedy)."""
    x = logits.float().clone()
    rows = torch.nonzero(states >= 0).flatten()
    keep = allowed_columns(dt, states[rows], x.shape[1])
    x[rows] = x[rows].masked_fill(~keep, float("-inf"))
    inv_t = torch.where(
        temperature > 0, 1 / temperature.clamp(min=1e-30), torch.ones_like(temperature)
    )
    return x * inv_t[:, None], logits.float() * inv_t[:, None]


@needs_interpreter
@pytest.mark.interpreter
@pytest.mark.parametrize(
    "batch,vocab,logits_width,width,dtype",
    [
        (1, 100, None, 100, torch.float32),
        (9, 1000, 1024, 1030, torch.bfloat16),
        (64, 5000, 5024, 5024, torch.float16),
        (300, 48, 64, 64, torch.float32),
    ],
)
def test_triton_equals_torch(batch, vocab, logits_width, width, dtype):
    rng, _, dt, states, logits = _case(batch + vocab, batch, vocab, width, logits_width)
    logits = logits.to(dtype)
    params = _params(batch, rng)
    a = sample(logits, dt, states, params, return_unmasked_logprobs=True, backend="triton")
    b = sample(logits, dt, states, params, return_unmasked_logprobs=True, backend="torch")
    assert torch.equal(a.tokens, b.tokens)
    torch.testing.assert_close(a.logprobs, b.logprobs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a.unmasked_logprobs, b.unmasked_logprobs, rtol=1e-5, atol=1e-5)


@needs_interpreter
@pytest.mark.interpreter
def test_triton_equals_torch_with_budget_and_without_table():
    rng = np.random.default_rng(31)
    table = deep_table(rng, vocab_size=1500, logits_width=1536)
    dt = DeviceTable.from_table(table)
    states = torch.from_numpy(random_states(rng, 24, table.num_states))
    remaining = (
        dt.dist[states.clamp(min=0).long()].clamp(min=1)
        + torch.from_numpy(rng.integers(0, 3, size=24))
    ).to(torch.int32)
    logits = torch.from_numpy((3 * rng.normal(size=(24, 1536))).astype(np.float32))
    params = _params(24, rng)
    for tab in (dt, None):
        a = sample(
            logits, tab, states, params, remaining=remaining, backend="triton", split_size=512
        )
        b = sample(logits, tab, states, params, remaining=remaining, backend="torch")
        assert torch.equal(a.tokens, b.tokens)
        torch.testing.assert_close(a.logprobs, b.logprobs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_row_draw_does_not_depend_on_the_batch(backend):
    rng, _, dt, states, logits = _case(5, 17, 700, 704, 704)
    params = _params(17, rng, temperature=[1.0] * 17)
    full = sample(logits, dt, states, params, backend=backend).tokens
    for r in (0, 8, 16):
        one = SamplingTensors(
            *(
                getattr(params, f)[r : r + 1]
                for f in ("temperature", "top_k", "top_p", "seed", "step")
            )
        )
        alone = sample(logits[r : r + 1], dt, states[r : r + 1], one, backend=backend).tokens
        assert int(alone[0]) == int(full[r])
    perm = torch.from_numpy(rng.permutation(17))
    shuffled = SamplingTensors(
        *(getattr(params, f)[perm] for f in ("temperature", "top_k", "top_p", "seed", "step"))
    )
    assert torch.equal(
        sample(logits[perm], dt, states[perm], shuffled, backend=backend).tokens, full[perm]
    )


@needs_interpreter
@pytest.mark.interpreter
def test_split_size_does_not_change_tokens():
    rng, _, dt, states, logits = _case(6, 6, 3000, 3000, 3008)
    params = _params(6, rng)
    tokens = [
        sample(logits, dt, states, params, backend="triton", split_size=s).tokens
        for s in (128, 1024, 4096)
    ]
    assert torch.equal(tokens[0], tokens[1]) and torch.equal(tokens[0], tokens[2])


@pytest.mark.parametrize("backend", BACKENDS)
def test_seed_and_step_change_the_draw(backend):
    rng, _, dt, _, logits = _case(7, 1, 64, 64)
    row = (
        logits.repeat(24, 1) * 0.1
    )  # a flat distribution, so different noise gives different tokens
    states = torch.full((24,), -1, dtype=torch.int32)
    same = sample(
        row, dt, states, _params(24, rng, [1.0] * 24, [5] * 24, [3] * 24), backend=backend
    ).tokens
    assert (same == same[0]).all()
    steps = sample(
        row, dt, states, _params(24, rng, [1.0] * 24, [5] * 24, list(range(24))), backend=backend
    ).tokens
    seeds = sample(
        row, dt, states, _params(24, rng, [1.0] * 24, list(range(24)), [3] * 24), backend=backend
    ).tokens
    assert len(set(steps.tolist())) > 8 and len(set(seeds.tolist())) > 8


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_is_argmax_of_masked_logits_and_logprobs_match_reference(backend):
    rng, _, dt, states, logits = _case(9, 20, 400, 416, 416)
    params = _params(20, rng)
    out = sample(logits, dt, states, params, return_unmasked_logprobs=True, backend=backend)
    masked, unmasked = _masked_reference(logits, dt, states, params.temperature)
    greedy = params.temperature == 0
    assert greedy.any() and (~greedy).any()
    assert torch.equal(out.tokens[greedy], masked[greedy].argmax(dim=1))
    assert torch.isfinite(masked.gather(1, out.tokens[:, None])).all()  # never a forbidden token
    expected = torch.log_softmax(masked, dim=1).gather(1, out.tokens[:, None])[:, 0]
    expected_unmasked = torch.log_softmax(unmasked, dim=1).gather(1, out.tokens[:, None])[:, 0]
    torch.testing.assert_close(out.logprobs, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.unmasked_logprobs, expected_unmasked, rtol=1e-5, atol=1e-5)
    free = states < 0
    torch.testing.assert_close(out.logprobs[free], out.unmasked_logprobs[free])
    assert (out.logprobs[~free] >= out.unmasked_logprobs[~free] - 1e-6).all()


def _chi_square_critical(dof: int, z: float = 3.719) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (z = 3.719: p = 1e-4)."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def _chi_square(counts: np.ndarray, probs: np.ndarray, num: int) -> tuple[float, int]:
    expected = probs * num
    big = expected >= 5
    observed = np.append(counts[big], counts[~big].sum())
    expected = np.append(expected[big], expected[~big].sum())
    if expected[-1] < 5:
        observed, expected = observed[:-1], expected[:-1]
    return float(((observed - expected) ** 2 / expected).sum()), len(expected) - 1


@pytest.mark.parametrize("temperature,top_k", [(1.0, 0), (0.7, 0), (1.3, 4)])
def test_chi_square_frequencies_match_masked_softmax(temperature, top_k):
    rng = np.random.default_rng(12)
    table = random_table(rng, num_states=6, vocab_size=96, max_density=0.4)
    dt = DeviceTable.from_table(table)
    state = int(np.argmax([table.allowed(s).size for s in range(table.num_states)]))
    num = 20_000
    logits = torch.from_numpy(rng.normal(size=(1, 96)).astype(np.float32)).repeat(num, 1)
    states = torch.full((num,), state, dtype=torch.int32)
    params = _params(
        num, rng, [temperature] * num, [77] * num, list(range(num)), top_k=[top_k] * num
    )
    tokens = sample(logits, dt, states, params, backend="torch").tokens.numpy()
    allowed = table.allowed(state)
    assert set(tokens.tolist()) <= set(allowed.tolist())
    scaled = logits[0, allowed].double() / temperature
    if top_k:
        scaled[scaled < scaled.topk(top_k).values[-1]] = float("-inf")
    probs = torch.softmax(scaled, 0).numpy()
    counts = np.array([(tokens == t).sum() for t in allowed])
    stat, dof = _chi_square(counts, probs, num)
    assert dof >= 3
    assert stat < _chi_square_critical(dof), (stat, dof)


@pytest.mark.parametrize("backend", BACKENDS)
def test_top_p_keeps_the_nucleus_and_sort_path_matches_fused(backend):
    rng, _, dt, states, logits = _case(13, 30, 300, 320, 320)
    params = _params(30, rng, [1.0] * 30, top_p=[0.5] * 30)
    out = sample(logits, dt, states, params, backend=backend)
    masked, _ = _masked_reference(logits, dt, states, params.temperature)
    probs = torch.softmax(masked, dim=1)
    sorted_probs, order = probs.sort(dim=1, descending=True)
    for b in range(30):
        nucleus = order[b, : int((sorted_probs[b].cumsum(0) < 0.5).sum()) + 1]
        assert int(out.tokens[b]) in nucleus.tolist()
    plain = _params(30, rng, [1.0] * 30)
    forced = SamplingTensors(
        plain.temperature, plain.top_k, plain.top_p, plain.seed, plain.step, use_top_k_top_p=True
    )
    a, b = (
        sample(logits, dt, states, plain, backend=backend),
        sample(logits, dt, states, forced, backend=backend),
    )
    assert torch.equal(a.tokens, b.tokens)
    torch.testing.assert_close(a.logprobs, b.logprobs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_row_without_check_gives_minus_one(backend):
    rng = np.random.default_rng(4)
    table = deep_table(rng)
    dt = DeviceTable.from_table(table)
    far = int(np.argmax(table.dist))
    states = torch.tensor([far, far], dtype=torch.int32)
    remaining = torch.tensor([int(table.dist[far]) - 1, int(table.dist[far])], dtype=torch.int32)
    logits = torch.zeros(2, table.logits_width)
    out = sample(
        logits,
        dt,
        states,
        _params(2, rng, [1.0, 1.0]),
        remaining=remaining,
        check=False,
        backend=backend,
    )
    assert (
        int(out.tokens[0]) == -1
        and math.isinf(float(out.logprobs[0]))
        and float(out.logprobs[0]) < 0
    )
    assert int(out.tokens[1]) >= 0
    with pytest.raises(KernelInputError, match="row 0: state .* allows no token"):
        sample(logits, dt, states, _params(2, rng, [1.0, 1.0]), remaining=remaining)


def test_errors():
    rng, _, dt, states, logits = _case(2, 4, 100, 100)
    good = _params(4, rng)
    with pytest.raises(KernelInputError, match="params.temperature: expected finite values >= 0"):
        sample(logits, dt, states, _params(4, rng, [1.0, -1.0, 1.0, 1.0]))
    with pytest.raises(KernelInputError, match=r"params.top_p: expected values in \(0, 1\]"):
        sample(logits, dt, states, _params(4, rng, top_p=[0.0, 1.0, 1.0, 1.0]))
    with pytest.raises(KernelInputError, match="params.top_k: expected values >= 0"):
        sample(logits, dt, states, _params(4, rng, top_k=[-1, 0, 0, 0]))
    with pytest.raises(KernelInputError, match="params: expected SamplingTensors"):
        sample(logits, dt, states, {"temperature": 1.0})
    with pytest.raises(KernelInputError, match=r"params.seed: expected shape \[4\]"):
        sample(
            logits,
            dt,
            states,
            SamplingTensors(good.temperature, good.top_k, good.top_p, good.seed[:2], good.step),
        )
    with pytest.raises(KernelInputError, match="params.temperature: expected dtype torch.float32"):
        sample(
            logits,
            dt,
            states,
            SamplingTensors(
                good.temperature.double(), good.top_k, good.top_p, good.seed, good.step
            ),
        )
    with pytest.raises(KernelInputError, match="states: expected an int32 tensor"):
        sample(logits, dt, None, good)
    with pytest.raises(KernelInputError, match="states: row 0 has state 50, out of range"):
        sample(logits, dt, torch.full((4,), 50, dtype=torch.int32), good)
    with pytest.raises(KernelInputError, match=r"remaining: expected shape \[4\]"):
        sample(logits, dt, states, good, remaining=torch.ones(3, dtype=torch.int32))
    with pytest.raises(KernelInputError, match="backend='triton' needs triton and CUDA tensors"):
        if HAS_TRITON and INTERPRET:
            from surecall.kernels import _triton

            _triton.resolve_backend("triton", torch.device("meta"))
        else:
            sample(logits, dt, states, good, backend="triton")


@pytest.mark.parametrize("backend", BACKENDS)
def test_noise_skipping_keeps_draws_exact(backend):
    """Peaked logits make the kernel skip noise for blocks that cannot win (and the CPU path prune
    columns); the draw must equal plain Gumbel-max over every column."""
    from surecall.kernels.rng import gumbel_torch, row_keys

    rng, table, dt, states, logits = _case(17, 16, 2000, 2048, 2048, scale=1.0)
    for b, s in enumerate(states.tolist()):  # a few allowed tokens far above the rest
        allowed = table.allowed(s) if s >= 0 else np.arange(2000)
        logits[b, torch.from_numpy(rng.choice(allowed, size=4))] = torch.tensor(
            [25.0, 25.5, 26.0, 26.5]
        )
    params = _params(16, rng, [1.0] * 16)
    if backend == "triton":  # 256-column blocks, 4 per slice: later blocks get skipped
        from surecall.kernels.sample import _launch

        out = _launch(logits, dt, states, params, None, False, split_size=1024, block_words=8)
    else:
        out = sample(logits, dt, states, params, backend=backend)
    masked, _ = _masked_reference(logits, dt, states, params.temperature)
    key_a, key_b = row_keys(params.seed, params.step)
    noise = gumbel_torch(torch.arange(2048)[None, :], key_a[:, None], key_b[:, None])
    assert torch.equal(out.tokens, (masked + noise).argmax(dim=1))
