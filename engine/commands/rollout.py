"""`surecall rollout --tasks FILE.jsonl [--model DIR] [--workers N] --out DIR`: agent episodes for RL.

Reads task rows (`id`, `messages`, optional `tools`, `workspace`, `max_turns`, ...), runs them as
multi-turn episodes (generate, dispatch, observe) and writes one record per trajectory to
`DIR/trajectories.jsonl` (id, token_ids, loss_mask, logprobs, turns, ...) and `DIR/summary.json`,
with a progress bar on stderr and a summary table on stdout. One process by default (SQLite
idempotency store in DIR); `--workers N` runs N engine actors on a local Ray cluster and needs a
shared `--store redis://...`. Rerunning into the same DIR resumes unfinished trajectories.
"""

from __future__ import annotations

import argparse
import json
import secrets
from pathlib import Path

from surecall.commands.args import (
    input_file,
    non_negative_float,
    non_negative_int,
    output_dir,
    positive_int,
)
from surecall.errors import RequestError
from surecall.rollout.task import TaskError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tasks", required=True, type=input_file, metavar="FILE.jsonl", help="one task per line")
    parser.add_argument("--out", required=True, type=output_dir, metavar="DIR", help="output folder (resumable)")
    parser.add_argument("--model", default=None, metavar="DIR", help="model folder (default: the shipped tiny model)")
    parser.add_argument("--workers", type=positive_int, default=None, metavar="N",
                        help="run N engine actors on a local Ray cluster (needs --store redis://...)")
    parser.add_argument("--store", default=None, metavar="URL",
                        help="idempotency store: redis://host:port/db or a SQLite path (default: DIR/idempotency.db)")
    parser.add_argument("--temperature", type=non_negative_float, default=1.0, help="sampling temperature (default 1)")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="base sampling seed (default 0)")
    parser.add_argument("--tool-timeout", type=non_negative_float, default=300.0, metavar="S",
                        help="stop waiting for one tool call after S seconds (default 300)")
    parser.add_argument("--max-concurrency", type=positive_int, default=64, metavar="K",
                        help="episodes in flight per engine (default 64)")
    parser.add_argument("--keep-workspaces", action="store_true", help="keep each trajectory's workspace in DIR")


def run(args: argparse.Namespace) -> int:
    from surecall.rollout import CODING_TOOLS, RolloutConfig, load_tasks, write_trajectories

    tasks = load_tasks(args.tasks)
    for task in tasks:  # 1. what needs no model: tool names, seeds, the store choice
        unknown = sorted(set(task.tools) - set(CODING_TOOLS))
        if unknown:
            raise TaskError(f"Invalid task {task.id!r}: unknown tools {unknown}; expected names from {list(CODING_TOOLS)}")
        task.check_workspace()
    if args.tool_timeout <= 0:
        raise RequestError("Invalid --tool-timeout: expected a number of seconds > 0, got 0")
    if args.workers and not (args.store or "").startswith(("redis://", "rediss://", "unix://")):
        raise RequestError("Invalid --workers: N engine actors share one idempotency store; pass --store redis://HOST:PORT/DB")
    config = RolloutConfig(out_dir=args.out, keep_workspaces=args.keep_workspaces, temperature=args.temperature,
                           seed=args.seed, tool_timeout_s=args.tool_timeout, max_concurrency=args.max_concurrency)
    _quiet_loading()
    result = _run_ray(args, tasks, config) if args.workers else _run_local(args, tasks, config)  # 2. episodes
    out = Path(args.out)  # 3. records and summary
    write_trajectories(out / "trajectories.jsonl", result.trajectories)
    (out / "summary.json").write_text(json.dumps(result.summary, indent=2) + "\n")
    _print_summary(result.summary, out)
    return 0


def _run_local(args, tasks, config):
    from surecall import AsyncLLM
    from surecall.dispatch.stores import open_store
    from surecall.rollout import RolloutRunner

    store = open_store(args.store or str(Path(args.out) / "idempotency.db"))
    engine = AsyncLLM(args.model)
    try:
        runner = RolloutRunner(engine, store, secrets.token_bytes(32), config)
        runner.check_tasks(tasks)  # budgets need the tokenizer; refused before the bar starts
        runner.check_store()
        with _progress(len(tasks)) as bar:
            return runner.run(tasks, progress=lambda _traj: bar.update(1))
    finally:
        engine.shutdown()


def _run_ray(args, tasks, config):
    from surecall.rollout.ray_pool import RayRollout

    pool = RayRollout(args.workers, model=args.model, store_url=args.store, config=config)
    try:
        with _progress(len(tasks)) as bar:
            return pool.run(tasks, progress=lambda _traj: bar.update(1))
    finally:
        pool.shutdown()


def _quiet_loading() -> None:
    """No weight-loading bar: stderr carries the rollout's own bar, or one error line."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover - transformers is a dependency
        pass


def _progress(total: int):
    from tqdm import tqdm

    return tqdm(total=total, unit="episode", desc="rollout", dynamic_ncols=True)


def _print_summary(summary: dict, out: Path) -> None:
    rows = [("episodes", summary["episodes"]), ("turns", summary["turns"]), ("calls", summary["calls"]),
            ("tool errors", summary["tool_errors"]), ("tokens", summary["tokens"]),
            ("sampled tokens", summary["sampled_tokens"]), ("tokens/s (sampled)", summary["tokens_per_s"]),
            ("prefix-cache hit rate", f"{summary['prefix_hit_rate']:.1%}"),
            ("end reasons", ", ".join(f"{k} {v}" for k, v in sorted(summary["end_reasons"].items())))]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    print(f"wrote {out / 'trajectories.jsonl'}")
    print(json.dumps(summary, sort_keys=True))
