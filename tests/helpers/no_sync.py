"""A guard that raises on host syncs and data-dependent shapes, for code meant to be captured in a CUDA graph.

`NoHostSync` is a TorchFunctionMode (Python-level calls: item, tolist, cpu, numpy, bool(tensor),
boolean indexing, nonzero, ...) plus a TorchDispatchMode (the same at the aten level, so calls
made inside C++ or library code are caught too). Triton's interpreter moves kernel arguments to
numpy by design (on a GPU that is one kernel launch), so calls made from inside triton's own
modules are allowed. `.to(device)` is not flagged: on CPU tensors a copy to the host cannot be
told from the no-op `.to(x.device)` models do (the GPU test runs under cuda's sync debug mode).
"""

from __future__ import annotations

import sys

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

_T = torch.Tensor
FORBIDDEN_FUNCTIONS = {
    _T.item, _T.tolist, _T.cpu, _T.numpy, _T.__bool__, _T.__int__, _T.__float__, _T.__index__,
    _T.nonzero, torch.nonzero, _T.masked_select, torch.masked_select, torch.unique, _T.unique,
    torch.unique_consecutive, torch.argwhere, _T.argwhere, torch.bincount, _T.bincount,
    torch.repeat_interleave, _T.repeat_interleave,
}  # fmt: skip
FORBIDDEN_ATEN = ("_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique", "argwhere",
                  "bincount", "repeat_interleave", "item", "_assert_async", "equal")


class HostSyncError(AssertionError):
    pass


def _inside_triton() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if "/triton/" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def _has_bool_index(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


class _FunctionGuard(TorchFunctionMode):
    def __init__(self, log: list):
        super().__init__()
        self.log = log

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        bad = func in FORBIDDEN_FUNCTIONS
        if func in (_T.__getitem__, _T.__setitem__) and len(args) > 1 and _has_bool_index(args[1]):
            bad = True
        if func is torch.where and len(args) + len(kwargs) == 1:
            bad = True
        if bad and not _inside_triton():
            self.log.append(getattr(func, "__qualname__", str(func)))
            raise HostSyncError(f"host sync or data-dependent shape: {self.log[-1]}")
        return func(*args, **kwargs)


class _DispatchGuard(TorchDispatchMode):
    def __init__(self, log: list):
        super().__init__()
        self.log = log

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.split("::")[-1]
        if name in FORBIDDEN_ATEN and not _inside_triton():
            self.log.append(name)
            raise HostSyncError(f"host sync or data-dependent shape (aten): {name}")
        return func(*args, **(kwargs or {}))


class NoHostSync:
    """`with NoHostSync() as guard:` raises HostSyncError at the first forbidden call; guard.log names it."""

    def __init__(self):
        self.log: list[str] = []
        self._modes = (_FunctionGuard(self.log), _DispatchGuard(self.log))

    def __enter__(self):
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc):
        for mode in reversed(self._modes):
            mode.__exit__(*exc)
        return False
