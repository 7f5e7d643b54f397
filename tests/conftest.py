"""Shared fixtures: the shared data folder (skip with a reason when absent) and cached vocabularies."""

from __future__ import annotations

import functools

import pytest

from surecall.shared_data import shared_data_dir

try:
    import torch

    HAS_CUDA = torch.cuda.is_available()
    # The suite's models are tiny: one intra-op thread is fastest, and on a loaded 2-core machine
    # OpenMP spin-waiting across threads makes a 192-wide matmul ~100x slower.
    torch.set_num_threads(1)
except Exception:  # pragma: no cover
    HAS_CUDA = False


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def data_dir():
    path = shared_data_dir()
    if not path.exists():
        pytest.skip(f"shared data not found at {path} (set SURECALL_DATA)")
    return path


@functools.cache
def cached_vocab(name: str):
    """Load a shared vocabulary once per test session (by manifest name)."""
    from surecall.grammars.vocab_loaders import load_shared

    return load_shared(name)
