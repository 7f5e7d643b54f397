"""Optional Triton import and backend choice, shared by the kernel files.

Triton is optional: without it (or on a platform without wheels) `HAS_TRITON` is False, the
kernel files still import (their `@triton.jit` functions become plain, never-called Python
functions) and every call runs the torch reference. `resolve_backend` turns the user's
`backend="auto"|"torch"|"triton"` into the path to run; it never syncs with the device.
`lower_bound` is the fixed-step binary search every kernel calls, `mask_words_triton` the load of
mask words through the deduplicated blocks (grammars/table.py).
"""

from __future__ import annotations

import os

import torch

from surecall.errors import KernelInputError

try:  # pragma: no cover - depends on the platform
    import triton
    import triton.language as tl

    HAS_TRITON = True
except Exception:  # pragma: no cover
    HAS_TRITON = False

    class _Shim:
        """Stands in for `triton` and `triton.language` so kernel definitions still parse."""

        @staticmethod
        def constexpr(value=None):
            return value

        float32 = float64 = int32 = int64 = uint32 = None

        @staticmethod
        def jit(fn=None, **_kwargs):
            return fn if fn is not None else (lambda f: f)

    triton = _Shim()  # type: ignore[assignment]
    tl = _Shim()  # type: ignore[assignment]

# Triton decides between compiling and interpreting when a kernel is decorated, i.e. when
# these modules are imported: TRITON_INTERPRET=1 has to be set before that.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

BACKENDS = ("auto", "torch", "triton")


def resolve_backend(backend: str, device: torch.device) -> str:
    """'torch' or 'triton' for tensors on `device`; raises KernelInputError when impossible."""
    if backend not in BACKENDS:
        raise KernelInputError(f"Invalid backend: expected one of {BACKENDS}, got {backend!r}")
    if backend == "torch":
        return "torch"
    can_triton = HAS_TRITON and (device.type == "cuda" or (device.type == "cpu" and INTERPRET))
    if backend == "triton":
        if not can_triton:
            raise KernelInputError(
                f"backend='triton' needs triton and CUDA tensors (or TRITON_INTERPRET=1 set before "
                f"import for CPU tensors); got device {device}, triton installed: {HAS_TRITON}"
            )
        return "triton"
    return "triton" if (can_triton and device.type == "cuda") else "torch"


@triton.jit
def lower_bound(keys_ptr, lo, hi, target, num_steps):
    """Fixed-step binary search, per lane: the first index in [lo, hi) whose sorted key is not
    below `target` (hi when none). `num_steps` >= bit length of the longest hi - lo; lanes whose
    range is empty stay put. The one search the kernels share (exceptions, entries)."""
    for _ in range(num_steps):
        active = lo < hi
        mid = lo + (hi - lo) // 2
        right = tl.load(keys_ptr + mid, mask=active, other=0) < target
        lo = tl.where(active & right, mid + 1, lo)
        hi = tl.where(active & (right == 0), mid, hi)
    return lo


@triton.jit
def mask_words_triton(mask_blocks_ptr, row_blocks_ptr, mrow, words, num_words, num_row_blocks, ok,
                      BW: tl.constexpr):
    """Packed words `words` of distinct mask row `mrow` (int64), 0 where not `ok` or past num_words:
    word w is mask_blocks[row_blocks[mrow, w // BW], w % BW]."""
    live = ok & (words < num_words)
    blk = tl.load(row_blocks_ptr + mrow * num_row_blocks + words // BW, mask=live, other=0).to(tl.int64)
    return tl.load(mask_blocks_ptr + blk * BW + words % BW, mask=live, other=0)


def launch_options(device: torch.device) -> dict:
    """Extra launch keywords: no FMA contraction on GPU, so float results match the torch path."""
    return {"enable_fp_fusion": False} if device.type == "cuda" else {}
