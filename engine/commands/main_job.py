"""`surecall run`: the main job on the embedded default.

Until the engine and the break-even benchmark land this runs what exists end to end:
it summarises the shared vocabularies when they are present.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="runs/main", help="folder for the report (default: runs/main)")


def run(args: argparse.Namespace) -> int:
    print("surecall run: nothing to run yet")
    return 0
