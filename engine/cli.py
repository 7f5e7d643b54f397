"""The `surecall` command line: one subcommand per module, imported only when it runs.

Each subcommand module exposes `add_arguments(parser)` and `run(args) -> int`. Keeping the
registry as data (name, module, one-line help) means `surecall --help` never imports torch or
compiles anything. Typed surecall errors become a one-line message and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from surecall import __version__
from surecall.errors import SurecallError

# (subcommand, module, help)
COMMANDS: list[tuple[str, str, str]] = [
    ("run", "surecall.commands.main_job", "the main job on the embedded default model (what `make run` does)"),
    ("vocab", "surecall.commands.vocab", "summarise a tokenizer vocabulary (format, sizes, special/stop ids, fingerprint)"),
    ("compile", "surecall.commands.compile", "compile a schema or tool catalog into a token-mask table"),
    ("sample", "surecall.commands.sample", "random walks through a compiled table: fuzz a grammar without a model"),
    ("lint", "surecall.commands.lint", "lint tool schemas against the five rules and the anti-pattern table"),
    ("breakeven", "surecall.commands.breakeven", "measure t_mask, p_err, T_repair and the break-even malformed-call rate"),
    ("catalog-cost", "surecall.commands.catalog_cost", "count what a tool catalog costs in context tokens"),
]


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(
        prog="surecall",
        description="Constrained decoding for LLM tool calls: calls that always parse, masks that cost microseconds.",
    )
    parser.add_argument("--version", action="version", version=f"surecall {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers = {}
    for name, _module, help_text in COMMANDS:
        subparsers[name] = sub.add_parser(name, help=help_text, description=help_text)
    return parser, subparsers


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser, subparsers = build_parser()
    # Only the chosen subcommand's module is imported, so its arguments are added late.
    chosen = next((a for a in argv if not a.startswith("-")), None)
    modules = {name: module for name, module, _ in COMMANDS}
    command_module = None
    if chosen in modules:
        command_module = importlib.import_module(modules[chosen])
        command_module.add_arguments(subparsers[chosen])
    args = parser.parse_args(argv)
    if command_module is None:
        parser.print_help()
        return 0 if not argv else 2
    try:
        return int(command_module.run(args) or 0)
    except SurecallError as exc:
        print(f"surecall {chosen}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
