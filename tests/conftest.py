"""Shared fixtures: the shared data folder (skip with a reason when absent) and cached vocabularies."""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import subprocess
import time

import pytest

from surecall.grammars.vocab.shared import shared_data_dir

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"

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


def bench_records(data_dir, subset: str) -> list[dict]:
    """The JSONSchemaBench rows of `subset` (skips when its file is absent)."""
    path = data_dir / "jsonschemabench" / f"{subset}.jsonl"
    if not path.exists():
        pytest.skip(f"{path} not found")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def bench_schema(data_dir, subset: str, name: str) -> dict:
    """The schema of JSONSchemaBench row `<subset>---<name>` (skips when it is absent)."""
    for record in bench_records(data_dir, subset):
        if record["id"] == f"{subset}---{name}":
            return record["schema"]
    pytest.skip(f"{subset}---{name} not in the shared data")


@functools.cache
def cached_vocab(name: str):
    """Load a shared vocabulary once per test session (by manifest name)."""
    from surecall.grammars.vocab.loaders import load_shared

    return load_shared(name)


# --- a throwaway redis-server for the Redis store (skips when it is not installed) ---------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    if not os.path.exists(REDIS_SERVER):
        pytest.skip(f"redis-server not installed ({REDIS_SERVER}); `.ci/run` installs it")
    workdir = tmp_path_factory.mktemp("redis")
    port = free_port()
    proc = subprocess.Popen(
        # durable, as RedisStore requires by default: AOF on (fsync every second), never evict
        [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes",
         "--appendfsync", "everysec", "--maxmemory-policy", "noeviction", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    import redis

    client = redis.Redis.from_url(url)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    else:
        proc.kill()
        pytest.skip("redis-server did not start")
    yield url
    client.close()
    proc.terminate()
    proc.wait(timeout=10)
