"""Counter-based random numbers for sampling: one Gumbel variate per (seed, step, token id).

The noise for token t of a row is a pure function of (seed, step, t), so a row's draw never
depends on the batch around it, the launch grid or the backend. The hash is murmur3's 32-bit
finaliser (fmix32) applied twice; the torch version does the same uint32 arithmetic in int64
with explicit masking. The uniform has 24 bits, and -log(-log(u)) is computed in float64 and
rounded to float32, so the CPU path, the Triton interpreter and the GPU agree bit for bit
(float32 `log` differs by an ulp between numpy, torch and CUDA on ~20% of inputs; float64
then rounding to float32 was identical on 4M inputs). `row_keys_triton` derives a row's keys
inside a kernel from its (seed, step) (the fused sampler loads those, not precomputed keys: no
~40 small torch ops per step before the launch). This module does no sampling itself.
"""

from __future__ import annotations

import numpy as np
import torch

from surecall.kernels._triton import tl, triton

MASK32 = 0xFFFFFFFF
GOLDEN = 0x9E3779B1  # odd constant spreading consecutive token ids over the 32-bit space
C1, C2 = 0x85EBCA6B, 0xC2B2AE35  # murmur3 fmix32 multipliers
SEED_SALT, STEP_SALT = 0x6A09E667, 0xBB67AE85
# Largest Gumbel value the 24-bit uniform can produce is 16.64; a block whose best logit plus
# this bound is below the running best cannot win (used to skip noise work, never changes a draw).
GUMBEL_MAX_VALUE = 17.0
GUMBEL_MAX = tl.constexpr(GUMBEL_MAX_VALUE)
# Smallest Gumbel value it can produce is -2.81: no token more than GUMBEL_MAX + 2.81 below a
# row's best logit can win, so the CPU path draws noise only for tokens within PRUNE_MARGIN.
PRUNE_MARGIN = GUMBEL_MAX_VALUE + 3.0


# ---- torch (int64 holding uint32) --------------------------------------------------------
def _mul32(a: torch.Tensor, c: int) -> torch.Tensor:
    """(a * c) mod 2**32 without int64 overflow: multiply by the two 16-bit halves of c."""
    lo, hi = c & 0xFFFF, c >> 16
    return (a * lo + (((a * hi) & 0xFFFF) << 16)) & MASK32


def fmix32_torch(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = _mul32(h, C1)
    h = h ^ (h >> 13)
    h = _mul32(h, C2)
    return h ^ (h >> 16)


def row_keys(seed: torch.Tensor, step: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two uint32 keys (as int64 [B]) per row from int64 seed and step; device-side, no sync.

    CPU tensors take the numpy uint32 path (same bits; ~20 tensor ops on a few rows cost more
    than the rest of a small sampling step).
    """
    seed = seed.to(torch.int64)
    step = step.to(torch.int64)
    if seed.device.type == "cpu" and step.device.type == "cpu":
        key_a, key_b = row_keys_numpy(seed.numpy(), step.numpy())
        return torch.from_numpy(key_a.astype(np.int64)), torch.from_numpy(key_b.astype(np.int64))
    return row_keys_int64(seed, step)


def row_keys_int64(seed: torch.Tensor, step: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """row_keys in device-agnostic torch arithmetic (never leaves the tensors' device)."""
    seed = seed.to(torch.int64)
    step = step.to(torch.int64)
    key_a = fmix32_torch((seed & MASK32) ^ fmix32_torch(((seed >> 32) & MASK32) ^ SEED_SALT))
    key_b = fmix32_torch(
        key_a ^ (step & MASK32) ^ fmix32_torch(((step >> 32) & MASK32) ^ STEP_SALT)
    )
    return key_a, key_b


def gumbel_torch(tokens: torch.Tensor, key_a: torch.Tensor, key_b: torch.Tensor) -> torch.Tensor:
    """float32 Gumbel noise for `tokens` (int64, broadcastable against the [B, 1] keys).

    CPU tensors take the numpy uint32 path (same bits, ~40x faster than int64 torch arithmetic).
    """
    if tokens.device.type == "cpu" and key_a.device.type == "cpu" and key_b.device.type == "cpu":
        return torch.from_numpy(gumbel_numpy(tokens.numpy(), key_a.numpy(), key_b.numpy()))
    return gumbel_int64(tokens, key_a, key_b)


def gumbel_int64(tokens: torch.Tensor, key_a: torch.Tensor, key_b: torch.Tensor) -> torch.Tensor:
    """The device-agnostic torch form of the noise: uint32 arithmetic held in int64."""
    h = fmix32_torch(_mul32(tokens.to(torch.int64) & MASK32, GOLDEN) ^ key_b)
    h = fmix32_torch(h ^ key_a)
    u = ((h >> 8) | 1).to(torch.float64) * 2.0**-24  # odd 24-bit numerator: u in (0, 1), exact
    return (-torch.log(-torch.log(u))).to(torch.float32)


# ---- numpy (native uint32 wrap-around) ---------------------------------------------------------
def _fmix32_numpy(h: np.ndarray) -> np.ndarray:
    h ^= h >> np.uint32(16)
    h *= np.uint32(C1)
    h ^= h >> np.uint32(13)
    h *= np.uint32(C2)
    h ^= h >> np.uint32(16)
    return h


def row_keys_numpy(seed: np.ndarray, step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """row_keys's bits with numpy uint32: the low and high halves of the int64 seed and step."""
    seed, step = np.asarray(seed, dtype=np.int64).view(np.uint64), np.asarray(step, dtype=np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        high = _fmix32_numpy((seed >> np.uint64(32)).astype(np.uint32) ^ np.uint32(SEED_SALT))
        key_a = _fmix32_numpy(seed.astype(np.uint32) ^ high)  # astype keeps the low 32 bits
        high = _fmix32_numpy((step >> np.uint64(32)).astype(np.uint32) ^ np.uint32(STEP_SALT))
        key_b = _fmix32_numpy(key_a ^ step.astype(np.uint32) ^ high)
    return key_a, key_b


HOST_KEY_ROWS = 16  # up to this many rows, Python ints beat ~12 numpy calls on tiny arrays


def _fmix32_int(h: int) -> int:
    h ^= h >> 16
    h = (h * C1) & MASK32
    h ^= h >> 13
    h = (h * C2) & MASK32
    return h ^ (h >> 16)


def row_keys_host(seed: np.ndarray, step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """row_keys_numpy's uint32 keys; a few rows in Python ints (the per-step sampler's case)."""
    if len(seed) > HOST_KEY_ROWS:
        return row_keys_numpy(seed, step)
    mask64 = (1 << 64) - 1
    key_a, key_b = [], []
    for s, t in zip(np.asarray(seed).tolist(), np.asarray(step).tolist(), strict=True):
        s, t = s & mask64, t & mask64  # the int64's bits, as the numpy path's uint64 view
        a = _fmix32_int((s & MASK32) ^ _fmix32_int((s >> 32) ^ SEED_SALT))
        key_a.append(a)
        key_b.append(_fmix32_int(a ^ (t & MASK32) ^ _fmix32_int((t >> 32) ^ STEP_SALT)))
    return np.array(key_a, dtype=np.uint32), np.array(key_b, dtype=np.uint32)


def gumbel_numpy(tokens: np.ndarray, key_a: np.ndarray, key_b: np.ndarray) -> np.ndarray:
    """gumbel_int64's bits with numpy uint32 (multiplication wraps mod 2**32 natively).

    In place after the first broadcast (a few full-size temporaries fewer: ~2.5x faster on 1M ids).
    """
    with np.errstate(over="ignore"):
        h = np.asarray(tokens).astype(np.uint32)  # the cast keeps the low 32 bits (tokens & MASK32)
        h *= np.uint32(GOLDEN)
        h = h ^ np.asarray(key_b).astype(np.uint32)  # not in place: it broadcasts to the full shape
        h = _fmix32_numpy(h)
        h ^= np.asarray(key_a).astype(np.uint32)
        h = _fmix32_numpy(h)
    h >>= np.uint32(8)
    h |= np.uint32(1)
    u = h.astype(np.float64)
    u *= 2.0**-24  # odd 24-bit numerator: u in (0, 1), exact
    np.log(u, out=u)
    np.negative(u, out=u)
    np.log(u, out=u)
    np.negative(u, out=u)
    return u.astype(np.float32)


# ---- triton -------------------------------------------------------------------------------
@triton.jit
def gumbel_triton(
    tokens,  # int32 tensor of token ids (any shape)
    key_a,  # uint32 scalar: the row's first key (row_keys)
    key_b,  # uint32 scalar: the row's second key
):
    # fmix32 is written out twice rather than called: nested jit calls are slow in the interpreter.
    h = (tokens.to(tl.uint32) * 0x9E3779B1) ^ key_b
    h = h ^ (h >> 16)
    h = h * 0x85EBCA6B
    h = h ^ (h >> 13)
    h = h * 0xC2B2AE35
    h = h ^ (h >> 16) ^ key_a
    h = h ^ (h >> 16)
    h = h * 0x85EBCA6B
    h = h ^ (h >> 13)
    h = h * 0xC2B2AE35
    h = h ^ (h >> 16)
    u = ((h >> 8) | 1).to(tl.float64) * 5.9604644775390625e-08  # 2**-24
    return (-tl.log(-tl.log(u))).to(tl.float32)


@triton.jit
def _fmix32_triton(h):
    h = h ^ (h >> 16)
    h = h * 0x85EBCA6B
    h = h ^ (h >> 13)
    h = h * 0xC2B2AE35
    return h ^ (h >> 16)


@triton.jit
def row_keys_triton(
    seed,  # int64 scalar: the row's seed
    step,  # int64 scalar: the row's decode step
):
    # row_keys's bits: the int64 -> uint32 casts keep the low 32 bits, `>> 32` then cast the high ones.
    # Once per row, so the nested jit call costs nothing that matters (unlike gumbel_triton, per token).
    key_a = _fmix32_triton(seed.to(tl.uint32) ^ _fmix32_triton((seed >> 32).to(tl.uint32) ^ 0x6A09E667))  # SEED_SALT
    key_b = _fmix32_triton(key_a ^ step.to(tl.uint32) ^ _fmix32_triton((step >> 32).to(tl.uint32) ^ 0xBB67AE85))
    return key_a, key_b
