"""A rollout task: what one episode starts from, checked before any episode runs.

`Task` holds the messages, the tool names (default: the four coding tools), a workspace seed
folder, the turn limit, token budgets (per turn: sampled tokens; per trajectory: everything after
the prompt, sampled and observation tokens) and the tool choice. `turn_tools` optionally narrows
the decoding grammar per turn (a script: turn t may only produce calls matching its tool specs,
e.g. `const` arguments), while the prompt and the runtime keep the task's tools. `load_tasks`
reads a JSONL file of task rows. It does not run, render or dispatch anything.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from surecall.errors import SurecallError

CODING_TOOLS = ("bash_execute", "file_view", "file_edit", "grep_search")
TOOL_CHOICES = ("auto", "required", "none")
MAX_ID_CHARS = 200
_ROW_KEYS = {"id", "messages", "tools", "workspace", "max_turns", "max_tokens_per_turn", "max_tokens",
             "tool_choice", "turn_tools", "seed"}


class TaskError(SurecallError, ValueError):
    """A task that cannot run (it names the task and what to change)."""


@dataclass(frozen=True)
class Task:
    id: str  # also the trajectory id: the idempotency keys and the checkpoint are derived from it
    messages: list[dict]
    tools: tuple[str, ...] = CODING_TOOLS
    workspace: str | None = None  # a folder copied into the trajectory's workspace (None: start empty)
    max_turns: int = 8
    max_tokens_per_turn: int = 256
    max_tokens: int = 4096  # tokens after the prompt: sampled and observation tokens
    tool_choice: Any = "required"  # "auto" | "required" | "none" | {"type": "function", "function": {"name": N}}
    turn_tools: list[list[dict]] | None = None  # per-turn grammar tools (a script); later turns use `tools`
    seed: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not 0 < len(self.id) <= MAX_ID_CHARS or "/" in self.id or self.id in (".", ".."):
            raise TaskError(f"Invalid task id: expected 1..{MAX_ID_CHARS} characters without '/', got {self.id!r:.80}")
        where = f"Invalid task {self.id!r}"
        if not isinstance(self.messages, list) or not self.messages or not all(isinstance(m, dict) for m in self.messages):
            raise TaskError(f"{where}: expected messages to be a non-empty list of objects")
        if isinstance(self.tools, str) or not all(isinstance(t, str) for t in self.tools):
            raise TaskError(f"{where}: expected tools to be a list of tool names, got {self.tools!r:.80}")
        object.__setattr__(self, "tools", tuple(self.tools))  # names are checked by the runner's catalog
        for name in ("max_turns", "max_tokens_per_turn", "max_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TaskError(f"{where}: expected {name} to be an integer >= 1, got {value!r}")
        if self.workspace is not None and not isinstance(self.workspace, (str, os.PathLike)):
            raise TaskError(f"{where}: expected workspace to be a folder path, got {self.workspace!r:.80}")
        self._check_tool_choice(where)
        if self.turn_tools is not None and not (isinstance(self.turn_tools, list)
                                                and all(isinstance(t, list) and t for t in self.turn_tools)):
            raise TaskError(f"{where}: expected turn_tools to be a list of non-empty tool lists")

    def _check_tool_choice(self, where: str) -> None:
        choice = self.tool_choice
        if isinstance(choice, str):
            if choice not in TOOL_CHOICES:
                raise TaskError(f"{where}: expected tool_choice in {list(TOOL_CHOICES)} or a named function, got {choice!r}")
            return
        name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
        if name not in self.tools:
            raise TaskError(f"{where}: tool_choice names {name!r}, which is not one of the task's tools {list(self.tools)}")

    @property
    def forced_tool(self) -> str | None:
        """The tool a named tool_choice forces, else None."""
        return self.tool_choice["function"]["name"] if isinstance(self.tool_choice, dict) else None

    def check_workspace(self) -> Path | None:
        """The seed folder as a real path; TaskError when it is given but is not a folder."""
        if self.workspace is None:
            return None
        path = Path(self.workspace).expanduser()
        if not path.is_dir():
            raise TaskError(f"Invalid task {self.id!r}: workspace seed {str(path)!r} does not exist or is not a folder")
        return path.resolve()

    def to_dict(self) -> dict:
        row = asdict(self)
        row["tools"] = list(self.tools)
        if row["workspace"] is not None:
            row["workspace"] = os.fspath(row["workspace"])
        return row

    def fingerprint(self) -> str:
        """What a checkpoint was written for: a resumed trajectory must have the same task."""
        text = json.dumps(self.to_dict(), sort_keys=True, ensure_ascii=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @classmethod
    def from_dict(cls, row: Any, where: str = "task") -> Task:
        if not isinstance(row, dict):
            raise TaskError(f"Invalid {where}: expected a JSON object, got {type(row).__name__}")
        unknown = sorted(set(row) - _ROW_KEYS)
        if unknown:
            raise TaskError(f"Invalid {where}: unknown keys {unknown}; expected some of {sorted(_ROW_KEYS)}")
        if "id" not in row or "messages" not in row:
            raise TaskError(f"Invalid {where}: a task needs 'id' and 'messages'")
        try:
            return cls(**{k: (tuple(v) if k == "tools" and isinstance(v, list) else v) for k, v in row.items()})
        except TypeError as exc:
            raise TaskError(f"Invalid {where}: {exc}") from None


def load_tasks(path: str | os.PathLike) -> list[Task]:
    """Tasks from a JSONL file (one object per line; blank lines skipped); ids must be unique."""
    tasks = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TaskError(f"Invalid task at {path}:{number}: not JSON ({exc.msg})") from None
            tasks.append(Task.from_dict(row, where=f"task at {path}:{number}"))
    check_unique(tasks)
    return tasks


def check_unique(tasks: list[Task]) -> None:
    seen: set[str] = set()
    for task in tasks:
        if task.id in seen:
            raise TaskError(f"Invalid tasks: id {task.id!r} appears twice (it is the trajectory id)")
        seen.add(task.id)
