"""`surecall run` (what `make run` does): the main job on the embedded default, surecall-tiny.

Argument parsing only: the job is `surecall.breakeven.main_job.run_main_job` (dispatch of
grounded constrained calls into a seeded workspace, the break-even report, the catalog cost).
Everything lands in --out (report.json, report.md, breakeven.json, breakeven.png).
"""

from __future__ import annotations

import argparse
import sys

from surecall.commands.args import output_dir, positive_int
from surecall.commands.breakeven import add_measurement_arguments, breakeven_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="runs/main", type=output_dir, help="report folder (default runs/main)")
    parser.add_argument("--limit", type=positive_int, default=64, help="held-out prompts to use (default 64)")
    parser.add_argument("--threads", type=positive_int, default=1, help="CPU intra-op threads (default 1: fastest for the tiny model)")
    parser.add_argument("--no-ground", dest="ground", action="store_false",
                        help="decode the dispatched calls under the plain catalog, not narrowed to the workspace's files")
    add_measurement_arguments(parser, batch=16, max_rounds=4)


def run(args: argparse.Namespace) -> int:
    from surecall.breakeven.main_job import MainJobConfig, run_main_job

    try:
        cfg = MainJobConfig(limit=args.limit, device=args.device, threads=args.threads, out=args.out, ground=args.ground,
                            breakeven=breakeven_config(args, "run"))
    except ValueError as exc:
        print(f"surecall run: error: {exc}", file=sys.stderr)
        return 2
    run_main_job(cfg)
    return 0
