"""What one episode produced, and its checkpoint: the record a trainer reads and a rerun resumes.

`Trajectory` keeps the prompt ids and, per turn, the ids the engine sampled (with masked and
unmasked logprobs), the calls, the observations and the observation ids; `token_ids`,
`loss_mask` (1 on sampled ids, 0 on prompt, template and observation ids) and the logprob
arrays aligned with them are derived, never re-tokenised. `Checkpoint` appends one JSON line per
step (start, turn, observations, end) with an fsync, so a run killed at any point can be resumed
from what it had written; a torn last line is ignored. It does not generate or dispatch.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from surecall.rollout.task import TaskError


@dataclass
class Turn:
    index: int
    prompt_len: int  # len(token_ids) the engine was given at this turn
    sampled_ids: list[int]
    logprobs: list[float]  # of the masked (sampling) policy; 0.0 for a grammar-forced token
    unmasked_logprobs: list[float]  # of the model before any grammar mask
    text: str
    finish_reason: str | None
    calls: list[dict]  # {"id", "name", "arguments"}
    outcome: str = "call"  # call | answer | invalid_call | budget
    num_cached_tokens: int = 0  # prompt tokens the prefix cache already held
    observations: list[dict] | None = None  # Observation.to_dict() per call (None: not dispatched yet)
    observation_ids: list[int] = field(default_factory=list)
    timings: dict = field(default_factory=dict)  # generate_s, dispatch_s, render_s

    @property
    def is_dispatched(self) -> bool:
        return self.observations is not None


@dataclass
class Trajectory:
    id: str
    prompt_ids: list[int]
    turns: list[Turn] = field(default_factory=list)
    end_reason: str | None = None  # answer | max_turns | budget | invalid_call | error
    reward: float | None = None
    error: str | None = None
    workspace: str | None = None  # kept workspace path (None once cleaned up)
    resumed: bool = False

    @property
    def token_ids(self) -> list[int]:
        ids = list(self.prompt_ids)
        for turn in self.turns:
            ids += turn.sampled_ids + turn.observation_ids
        return ids

    @property
    def loss_mask(self) -> list[int]:
        mask = [0] * len(self.prompt_ids)
        for turn in self.turns:
            mask += [1] * len(turn.sampled_ids) + [0] * len(turn.observation_ids)
        return mask

    def _aligned(self, attr: str) -> list[float]:
        values = [0.0] * len(self.prompt_ids)
        for turn in self.turns:
            values += list(getattr(turn, attr)) + [0.0] * len(turn.observation_ids)
        return values

    @property
    def logprobs(self) -> list[float]:
        return self._aligned("logprobs")

    @property
    def unmasked_logprobs(self) -> list[float]:
        return self._aligned("unmasked_logprobs")

    @property
    def num_response_tokens(self) -> int:
        return sum(len(t.sampled_ids) + len(t.observation_ids) for t in self.turns)

    @property
    def num_calls(self) -> int:
        return sum(len(t.calls) for t in self.turns)

    @property
    def num_tool_errors(self) -> int:
        return sum(1 for t in self.turns for o in (t.observations or []) if o.get("error") is not None)

    def to_dict(self) -> dict:
        return {"id": self.id, "token_ids": self.token_ids, "loss_mask": self.loss_mask, "logprobs": self.logprobs,
                "unmasked_logprobs": self.unmasked_logprobs, "prompt_len": len(self.prompt_ids),
                "turns": [asdict(t) for t in self.turns], "end_reason": self.end_reason, "reward": self.reward,
                "error": self.error, "workspace": self.workspace, "resumed": self.resumed}


class Checkpoint:
    """One trajectory's append-only JSONL log under the run's output folder."""

    def __init__(self, path: Path, task_fingerprint: str):
        self.path = path
        self.fingerprint = task_fingerprint

    def _append(self, row: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n"
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())

    def start(self, trajectory: Trajectory, workspace: str) -> None:
        self._append({"kind": "start", "id": trajectory.id, "task": self.fingerprint,
                      "prompt_ids": trajectory.prompt_ids, "workspace": workspace})

    def turn(self, turn: Turn) -> None:
        row = asdict(turn)
        row.pop("observations"), row.pop("observation_ids")
        self._append({"kind": "turn", **row})

    def observations(self, turn: Turn) -> None:
        self._append({"kind": "observations", "index": turn.index, "observations": turn.observations,
                      "observation_ids": turn.observation_ids, "timings": turn.timings})

    def end(self, trajectory: Trajectory) -> None:
        self._append({"kind": "end", "end_reason": trajectory.end_reason, "reward": trajectory.reward,
                      "error": trajectory.error, "workspace": trajectory.workspace})

    def load(self) -> tuple[Trajectory | None, str | None, bool]:
        """(trajectory so far, its workspace, finished) from the log; (None, None, False) when absent."""
        if not self.path.exists():
            return None, None, False
        trajectory, workspace, finished = None, None, False
        for row in self._rows():
            kind = row.get("kind")
            if kind == "start":
                if row.get("task") != self.fingerprint:
                    raise TaskError(f"Invalid resume of trajectory {row.get('id')!r}: its checkpoint {self.path} was "
                                    "written for a different task; use another output folder or remove it")
                trajectory, workspace = Trajectory(row["id"], row["prompt_ids"]), row["workspace"]
            elif kind == "turn" and trajectory is not None:
                fields = {k: v for k, v in row.items() if k != "kind"}
                trajectory.turns = [t for t in trajectory.turns if t.index < fields["index"]] + [Turn(**fields)]
            elif kind == "observations" and trajectory is not None and trajectory.turns:
                turn = trajectory.turns[-1]
                if turn.index == row["index"]:
                    turn.observations, turn.observation_ids = row["observations"], row["observation_ids"]
                    turn.timings = row["timings"]
            elif kind == "end" and trajectory is not None:
                trajectory.end_reason, trajectory.reward = row["end_reason"], row["reward"]
                trajectory.error, trajectory.workspace = row["error"], row["workspace"]
                finished = True
        return trajectory, workspace, finished

    def _rows(self):
        with open(self.path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:  # a line torn by a kill mid-write: nothing after it was written
                    return
                if isinstance(row, dict):
                    yield row


def trajectory_from_dict(row: dict) -> Trajectory:
    """The inverse of `Trajectory.to_dict` (derived arrays are recomputed from the turns)."""
    turns = [Turn(**t) for t in row.get("turns", [])]
    prompt_len = row["prompt_len"]
    return Trajectory(row["id"], list(row["token_ids"][:prompt_len]), turns, row.get("end_reason"), row.get("reward"),
                      row.get("error"), row.get("workspace"), bool(row.get("resumed")))
