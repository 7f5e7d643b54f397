"""Shared pieces of the rollout tests: scripted turns (const-argument tools) and a seed workspace."""

from __future__ import annotations

from pathlib import Path

import pytest

from surecall.toolbox.sandbox import Sandbox

# the scripted episodes run the coding tools' bash in the bubblewrap sandbox (.ci/run installs it)
needs_bwrap = pytest.mark.skipif(not Sandbox().is_available(), reason="bubblewrap cannot run here")


def scripted(name: str, arguments: dict) -> dict:
    """A tool spec whose grammar admits exactly one call: `name` with these `arguments`."""
    props = {k: {"const": v} for k, v in arguments.items()}
    return {"name": name, "description": "scripted turn",
            "parameters": {"type": "object", "properties": props, "required": list(arguments),
                           "additionalProperties": False}}


# one call per turn, each of the four coding tools; every effect can be counted in the workspace
SCRIPT = [
    [scripted("bash_execute", {"command": "echo t0 >> effects.log"})],
    [scripted("file_edit", {"path": "log.txt", "old_str": "slot1", "new_str": "done1"})],
    [scripted("file_view", {"path": "log.txt"})],
    [scripted("grep_search", {"pattern": "done", "path": "."})],
    [scripted("bash_execute", {"command": "echo t4 >> effects.log"})],
]


def make_seed(root: Path) -> Path:
    seed = root / "seed"
    seed.mkdir(parents=True, exist_ok=True)
    (seed / "log.txt").write_text("slot1\nslot2\n")
    return seed
