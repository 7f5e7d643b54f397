"""The seed's four-tool coding catalog as data (`data/seed_tools.json`).

The appendix that first listed these schemas is not in this repository; the bounds are the
ones the project's issues name (command maxLength 8192, pattern maxLength 512, old_str
minLength 1, timeout_ms 1000..300000, limit 1..500), plus bounds on every other string so
that the catalog passes its own lint. `surecall.toolbox` defines the same schemas as pydantic
models and a test keeps the two equal.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources


@lru_cache(maxsize=1)
def _load() -> str:
    return resources.files("surecall").joinpath("data/seed_tools.json").read_text()


def seed_tools() -> list[dict]:
    """A fresh copy of the four tool definitions: [{name, description, parameters}]."""
    return json.loads(_load())
