"""Backend choice and the torch-only install: surecall.kernels imports and works without triton."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from surecall.errors import KernelInputError
from surecall.kernels import _triton
from surecall.kernels.rng import fmix32_torch, gumbel_torch, row_keys


def test_resolve_backend():
    cpu = torch.device("cpu")
    assert _triton.resolve_backend("torch", cpu) == "torch"
    assert _triton.resolve_backend("auto", cpu) == "torch"  # CPU tensors: the torch reference
    with pytest.raises(KernelInputError, match="Invalid backend: expected one of"):
        _triton.resolve_backend("numba", cpu)
    with pytest.raises(KernelInputError, match="backend='triton' needs triton and CUDA tensors"):
        _triton.resolve_backend("triton", torch.device("meta"))


def test_kernels_work_without_triton():
    """A process where `import triton` fails still imports surecall.kernels and runs the torch path."""
    code = textwrap.dedent(
        """
        import sys
        sys.modules["triton"] = None  # makes `import triton` raise ImportError
        import numpy as np, torch
        sys.path.insert(0, "tests")
        from helpers.kernels_synth import random_table
        from surecall.kernels import DeviceTable, SamplingTensors, advance, apply_token_mask_inplace, sample
        from surecall.kernels._triton import HAS_TRITON
        assert not HAS_TRITON
        table = random_table(np.random.default_rng(0), num_states=5, vocab_size=64)
        dt = DeviceTable.from_table(table)
        states = torch.zeros(2, dtype=torch.int32)
        logits = torch.randn(2, 64)
        apply_token_mask_inplace(logits, dt, states)
        out = sample(logits, dt, states, SamplingTensors.build([1.0, 0.0], [0, 0], [1.0, 1.0], [1, 2], [0, 0]))
        nxt, fin = advance(states, out.tokens, dt)
        print("ok", out.tokens.tolist(), nxt.tolist())
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("ok")


def test_hash_matches_murmur3_fmix32_and_noise_is_gumbel():
    # murmur3 fmix32 reference values, computed by hand-checked uint32 arithmetic in Python
    def fmix32(h):
        h ^= h >> 16
        h = (h * 0x85EBCA6B) & 0xFFFFFFFF
        h ^= h >> 13
        h = (h * 0xC2B2AE35) & 0xFFFFFFFF
        return h ^ (h >> 16)

    values = [0, 1, 0xDEADBEEF, 0xFFFFFFFF, 123456789]
    assert fmix32_torch(torch.tensor(values)).tolist() == [fmix32(v) for v in values]
    key_a, key_b = row_keys(torch.tensor([7, -3]), torch.tensor([0, 2**40]))
    assert (
        key_a.min() >= 0 and key_a.max() < 2**32 and key_a[0] != key_a[1] and key_b[0] != key_b[1]
    )
    noise = gumbel_torch(torch.arange(200_000), key_a[:1], key_b[:1])
    assert abs(float(noise.mean()) - 0.5772) < 0.01  # Euler-Mascheroni constant
    assert abs(float(noise.std()) - 1.2825) < 0.01  # pi / sqrt(6)
    assert float(noise.max()) < 17.0  # rng.GUMBEL_MAX bounds every draw


def test_numpy_noise_has_the_int64_torch_bits():
    from surecall.kernels.rng import gumbel_int64

    key_a, key_b = row_keys(torch.tensor([7, -3, 2**62 + 5]), torch.tensor([0, 2**40, 19]))
    cols = torch.arange(0, 300_000, 7)[None, :]
    fast = gumbel_torch(cols, key_a[:, None], key_b[:, None])  # CPU: the numpy path
    slow = gumbel_int64(cols, key_a[:, None], key_b[:, None])
    assert fast.dtype == slow.dtype == torch.float32 and fast.shape == slow.shape == (3, cols.shape[1])
    assert torch.equal(fast, slow)
    rows = torch.tensor([0, 2, 2, 1])  # the sampler's gather form: one key per element
    picked = torch.tensor([5, 99_999, 0, 128_255])
    assert torch.equal(gumbel_torch(picked, key_a[rows], key_b[rows]), gumbel_int64(picked, key_a[rows], key_b[rows]))
