"""The kernel equality checks again on CUDA (Triton compiled for the GPU), plus CUDA-graph capture.

Skipped without a CUDA device (tests/conftest.py). SURECALL_KERNEL_TEST_DEVICE=cpu runs the
same tests through the Triton interpreter on small shapes, which is how this file is checked on
machines without a GPU: `SURECALL_KERNEL_TEST_DEVICE=cpu TRITON_INTERPRET=1 pytest tests/test_kernels_gpu.py`.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from helpers.kernels_synth import deep_table, random_states, random_table

from surecall.kernels import DeviceTable, SamplingTensors, advance, apply_token_mask_inplace, sample

DEVICE = torch.device(os.environ.get("SURECALL_KERNEL_TEST_DEVICE", "cuda"))
ON_GPU = DEVICE.type == "cuda"
# (batch, vocab_size, logits_width): real vocabulary widths on the GPU, small ones interpreted
SHAPES = (
    [(1, 32000, 32000), (64, 128000, 128256), (300, 151643, 151936)]
    if ON_GPU
    else [(1, 300, 320), (20, 900, 928)]
)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# Marked gpu (skipped without CUDA) unless the file is pointed at the interpreter on purpose.
pytestmark = (
    [pytest.mark.gpu]
    if ON_GPU
    else [
        pytest.mark.interpreter,
        pytest.mark.skipif(
            os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1"
        ),
    ]
)


def _case(seed, batch, vocab, width, dtype=torch.float32, num_states=12):
    rng = np.random.default_rng(seed)
    table = random_table(
        rng, num_states=num_states, vocab_size=vocab, logits_width=width, max_density=0.3
    )
    states = torch.from_numpy(random_states(rng, batch, num_states)).to(DEVICE)
    logits = (
        (3 * torch.randn(batch, width, generator=torch.Generator().manual_seed(seed)))
        .to(dtype)
        .to(DEVICE)
    )
    return rng, table, DeviceTable.from_table(table, DEVICE), states, logits


def _params(batch, rng):
    return SamplingTensors.build(
        rng.choice([0.0, 0.7, 1.0], size=batch).tolist(),
        [0] * batch,
        [1.0] * batch,
        rng.integers(0, 2**62, size=batch).tolist(),
        rng.integers(0, 1000, size=batch).tolist(),
        DEVICE,
    )


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_mask_triton_equals_torch_and_xgrammar(shape, dtype):
    batch, vocab, width = shape
    rng, _, dt, states, logits = _case(batch, batch, vocab, width, dtype)
    rows = torch.from_numpy(np.sort(rng.choice(batch, size=max(1, batch // 3), replace=False))).to(
        DEVICE
    )
    for subset in (None, rows):
        a, b = logits.clone(), logits.clone()
        apply_token_mask_inplace(a, dt, states, rows=subset, backend="triton")
        apply_token_mask_inplace(b, dt, states, rows=subset, backend="torch")
        assert torch.equal(a, b)
    try:
        import xgrammar
    except ImportError:
        return
    full = states.clamp(min=0)
    ours, theirs = logits.clone(), logits.clone()
    apply_token_mask_inplace(ours, dt, full, backend="triton")
    xgrammar.apply_token_bitmask_inplace(theirs, dt.mask_rows(full).contiguous())
    assert torch.equal(ours, theirs)


def test_mask_with_budget_triton_equals_torch():
    rng = np.random.default_rng(1)
    table = deep_table(
        rng, vocab_size=5000 if ON_GPU else 400, logits_width=5120 if ON_GPU else 416
    )
    dt = DeviceTable.from_table(table, DEVICE)
    batch = 128 if ON_GPU else 16
    states = torch.from_numpy(random_states(rng, batch, table.num_states)).to(DEVICE)
    slack = torch.from_numpy(rng.integers(0, 3, size=batch)).to(DEVICE)
    remaining = (dt.dist[states.clamp(min=0).long()].clamp(min=1) + slack).to(torch.int32)
    logits = torch.randn(batch, table.logits_width, device=DEVICE)
    a, b = logits.clone(), logits.clone()
    apply_token_mask_inplace(a, dt, states, remaining=remaining, backend="triton")
    apply_token_mask_inplace(b, dt, states, remaining=remaining, backend="torch")
    assert torch.equal(a, b)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sample_triton_equals_torch_and_cpu(shape, dtype):
    batch, vocab, width = shape
    rng, table, dt, states, logits = _case(batch + 1, batch, vocab, width, dtype)
    params = _params(batch, rng)
    a = sample(logits, dt, states, params, return_unmasked_logprobs=True, backend="triton")
    b = sample(logits, dt, states, params, return_unmasked_logprobs=True, backend="torch")
    assert torch.equal(a.tokens, b.tokens)
    torch.testing.assert_close(a.logprobs, b.logprobs, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(a.unmasked_logprobs, b.unmasked_logprobs, rtol=1e-4, atol=1e-4)
    # Same seeds on the CPU torch path: the same tokens (float64 noise, no FMA contraction).
    cpu_params = SamplingTensors(
        *(getattr(params, f).cpu() for f in ("temperature", "top_k", "top_p", "seed", "step"))
    )
    c = sample(
        logits.cpu(), DeviceTable.from_table(table), states.cpu(), cpu_params, backend="torch"
    )
    assert torch.equal(a.tokens.cpu(), c.tokens)


def test_advance_triton_equals_torch():
    rng, table, dt, states, _ = _case(3, 4096 if ON_GPU else 64, 2000, 2048)
    tokens = []
    for s in states.tolist():
        allowed = table.allowed(s) if s >= 0 else np.arange(table.vocab_size)
        tokens.append(
            int(rng.choice(allowed)) if rng.random() < 0.9 else int(rng.integers(-1, 2048))
        )
    tokens = torch.tensor(tokens, device=DEVICE)
    a = advance(states, tokens, dt, check=False, backend="triton")
    b = advance(states, tokens, dt, check=False, backend="torch")
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_chi_square_on_device():
    num = 20_000 if ON_GPU else 400
    rng = np.random.default_rng(12)
    table = random_table(rng, num_states=6, vocab_size=96, max_density=0.4)
    dt = DeviceTable.from_table(table, DEVICE)
    state = int(np.argmax([table.allowed(s).size for s in range(table.num_states)]))
    logits = torch.from_numpy(rng.normal(size=(1, 96)).astype(np.float32)).repeat(num, 1).to(DEVICE)
    states = torch.full((num,), state, dtype=torch.int32, device=DEVICE)
    params = SamplingTensors.build(
        [1.0] * num, [0] * num, [1.0] * num, [77] * num, list(range(num)), DEVICE
    )
    tokens = sample(logits, dt, states, params, backend="triton").tokens.cpu().numpy()
    allowed = table.allowed(state)
    assert set(tokens.tolist()) <= set(allowed.tolist())
    probs = torch.softmax(logits[0, allowed].double().cpu(), 0).numpy()
    expected = probs * num
    big = expected >= 5
    observed = np.append(np.array([(tokens == t).sum() for t in allowed])[big], 0)
    observed[-1] = num - observed[:-1].sum()
    expected = np.append(expected[big], num - expected[big].sum())
    keep = expected > 0
    stat = float(((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    dof = int(keep.sum()) - 1
    critical = dof * (1 - 2 / (9 * dof) + 3.719 * (2 / (9 * dof)) ** 0.5) ** 3  # p = 1e-4
    assert stat < critical, (stat, dof)


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_decode_step_is_cuda_graph_capturable():
    """mask + sample + advance with check=False have no host sync: the step captures and replays."""
    batch = 32
    rng, table, dt, states, logits = _case(7, batch, 32000, 32000)
    states = states.clamp(min=0)
    params = _params(batch, rng)
    remaining = (dt.dist[states.long()] + 4).to(torch.int32)

    def step():
        work = logits.clone()
        apply_token_mask_inplace(work, dt, states, remaining=remaining, check=False)
        out = sample(
            logits,
            dt,
            states,
            params,
            remaining=remaining,
            return_unmasked_logprobs=True,
            check=False,
        )
        nxt, finished = advance(states, out.tokens, dt, check=False)
        return work, out.tokens, out.logprobs, nxt, finished

    eager = step()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm-up (compiles) outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    for e, c in zip(eager, captured):
        assert torch.equal(e, c)
