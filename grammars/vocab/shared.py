"""Where the external test and benchmark data lives (`../shared/data` beside the checkout).

Used by `shared:NAME` tokenizer specs and by the tests. Override with the SURECALL_DATA environment variable. Nothing in the package needs this data
at run time; tests and benchmarks skip with a clear reason when it is absent.
"""

from __future__ import annotations

import os
from pathlib import Path

_REPO_ROOT = Path(__file__).resolve().parents[2]


def shared_data_dir() -> Path:
    """The shared data folder (may not exist: callers check and skip)."""
    override = os.environ.get("SURECALL_DATA")
    if override:
        return Path(override).expanduser().resolve()
    return (_REPO_ROOT / ".." / "shared" / "data").resolve()


def require_shared(relative: str) -> Path:
    """Path under the shared data folder; FileNotFoundError naming it and the override if absent."""
    path = shared_data_dir() / relative
    if not path.exists():
        raise FileNotFoundError(
            f"shared data not found: {path} (set SURECALL_DATA to the folder holding tokenizers/, jsonschemabench/, ...)"
        )
    return path
