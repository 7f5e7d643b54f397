"""The fused sampler derives each row's RNG keys inside the kernel: the bits equal rng.row_keys."""

from __future__ import annotations

import pytest
import torch

from surecall.kernels._triton import HAS_TRITON, INTERPRET, tl, triton
from surecall.kernels.rng import row_keys, row_keys_triton

pytestmark = pytest.mark.interpreter


@triton.jit
def _keys_kernel(seed_ptr, step_ptr, key_a_ptr, key_b_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    ok = i < n
    key_a, key_b = row_keys_triton(tl.load(seed_ptr + i, mask=ok, other=0), tl.load(step_ptr + i, mask=ok, other=0))
    tl.store(key_a_ptr + i, key_a.to(tl.int64), mask=ok)
    tl.store(key_b_ptr + i, key_b.to(tl.int64), mask=ok)


def _kernel_keys(seed: torch.Tensor, step: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    key_a, key_b = torch.empty_like(seed), torch.empty_like(seed)
    _keys_kernel[(1,)](seed, step, key_a, key_b, seed.numel(), BLOCK=triton.next_power_of_2(seed.numel()))
    return key_a, key_b


def _cases(device) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    seed = torch.cat([torch.tensor([0, 7, -3, 2**62 + 5, 2**63 - 1, -(2**63)]),
                      torch.randint(-(2**62), 2**62, (58,), generator=gen)])
    step = torch.cat([torch.tensor([0, 2**40, 19, 1, 2**63 - 1, 5]), torch.randint(0, 2**40, (58,), generator=gen)])
    return seed.to(device), step.to(device)


@pytest.mark.skipif(not (HAS_TRITON and INTERPRET), reason="needs TRITON_INTERPRET=1")
def test_in_kernel_row_keys_equal_the_torch_keys_bit_for_bit():
    seed, step = _cases("cpu")
    got_a, got_b = _kernel_keys(seed, step)
    ref_a, ref_b = row_keys(seed, step)
    assert torch.equal(got_a, ref_a) and torch.equal(got_b, ref_b)
    assert len(set(got_b.tolist())) == seed.numel()  # distinct rows get distinct keys


@pytest.mark.gpu
def test_in_kernel_row_keys_equal_the_torch_keys_on_gpu():
    seed, step = _cases("cuda")
    got_a, got_b = _kernel_keys(seed, step)
    ref_a, ref_b = row_keys(seed, step)
    assert torch.equal(got_a, ref_a) and torch.equal(got_b, ref_b)


@pytest.mark.parametrize("top_k", [0, 5])
def test_sync_free_sampling_draws_the_same_tokens(top_k):
    from surecall.kernels import SamplingTensors, sample

    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 3000, generator=gen) * 4
    logits[1] = 0.0  # a flat row: every column near the top
    params = SamplingTensors.build([1.0, 0.7, 0.0, 1.3, 1.0, 0.5], [top_k] * 6, [1.0, 1.0, 1.0, 0.9, 1.0, 1.0],
                                   [3, 4, 5, 6, 2**62 + 1, 0], [0, 1, 2, 3, 4, 2**40])
    ref = sample(logits, None, None, params, backend="torch")
    free = sample(logits, None, None, params, backend="torch", sync_free=True)
    assert torch.equal(ref.tokens, free.tokens)
    assert torch.allclose(ref.logprobs, free.logprobs, atol=1e-5)
