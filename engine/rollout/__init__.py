"""surecall.rollout: multi-turn agent episodes for RL, token in and token out.

`Task` (messages, tools, workspace seed, turn and token budgets, tool choice), `RolloutRunner`
(episodes concurrently over one `AsyncLLM` and a `Runtime` per trajectory, checkpointed and
resumable), `Trajectory` (token ids, loss mask, logprobs, turns) and, with Ray installed,
`surecall.rollout.ray_pool.RayRollout` (N engine actors sharing a Redis idempotency store).
"""

from surecall.rollout.runner import (
           RolloutConfig,
           RolloutResult,
           RolloutRunner,
           summarize,
           write_trajectories,
)
from surecall.rollout.task import CODING_TOOLS, Task, TaskError, load_tasks
from surecall.rollout.trajectory import Trajectory, Turn

__all__ = ["CODING_TOOLS", "RolloutConfig", "RolloutResult", "RolloutRunner", "Task", "TaskError", "Trajectory",
           "Turn", "load_tasks", "summarize", "write_trajectories"]
