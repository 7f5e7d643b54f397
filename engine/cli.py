"""The `surecall` command line: one subcommand per module, imported only when it runs.

Each subcommand module exposes `add_arguments(parser)` and `run(args) -> int`. Keeping the
registry as data (name, module, one-line help) means `surecall --help` never imports torch or
compiles anything. `main` is the one place errors become exit statuses, always as one line on
stderr: a bad flag or a typed surecall error exits 2, a closed stdout (`| head`) exits 141
quietly, Ctrl-C 130, and anything unexpected prints its type with "please report" and exits 1
(SURECALL_DEBUG=1 re-raises it with the traceback instead).
"""

from __future__ import annotations

import argparse
import importlib
import os
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
    ("rollout", "surecall.commands.rollout", "multi-turn agent episodes for RL: token ids, loss masks, logprobs, resumable"),
    ("serve", "surecall.commands.serve", "an OpenAI-compatible server (chat completions with tool calls that always parse)"),
]


DEBUG_ENV = "SURECALL_DEBUG"
EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 2, 1, 130, 141


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (`surecall sample: error: argument --n: ...`)."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {_one_line(message)} (see `{self.prog} --help`)\n")


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = OneLineParser(
        prog="surecall",
        description="Constrained decoding for LLM tool calls: calls that always parse, masks that cost microseconds.",
        epilog="environment: SURECALL_MAX_INPUT_BYTES caps every input file (default 64 MiB); "
               f"{DEBUG_ENV}=1 shows the traceback of an internal error; SURECALL_DATA locates shared:NAME vocabularies.",
    )
    parser.add_argument("--version", action="version", version=f"surecall {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers = {}
    for name, _module, help_text in COMMANDS:
        subparsers[name] = sub.add_parser(name, help=help_text, description=help_text)
    return parser, subparsers


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; returns its exit status (never raises, unless SURECALL_DEBUG=1)."""
    argv = sys.argv[1:] if argv is None else argv
    chosen = next((a for a in argv if not a.startswith("-")), None)
    prog = f"surecall {chosen}" if chosen in _MODULES else "surecall"
    try:
        status = _parse_and_run(argv, chosen)
        sys.stdout.flush()  # a closed pipe surfaces here, inside the handler, not at exit
        return status
    except SystemExit as exc:  # argparse: --help, --version, a usage error (already printed)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except SurecallError as exc:
        return _fail(prog, str(exc), EXIT_USAGE)
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        return _fail(prog, "interrupted", EXIT_INTERRUPTED)
    except Exception as exc:
        if os.environ.get(DEBUG_ENV) == "1":
            raise
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return _fail(prog, f"internal error ({detail}); please report it "
                           f"with the command line, or rerun with {DEBUG_ENV}=1 for the traceback", EXIT_INTERNAL)


_MODULES = {name: module for name, module, _ in COMMANDS}


def _parse_and_run(argv: list[str], chosen: str | None) -> int:
    parser, subparsers = build_parser()
    # Only the chosen subcommand's module is imported, so its arguments are added late.
    command_module = None
    if chosen in _MODULES:
        command_module = importlib.import_module(_MODULES[chosen])
        command_module.add_arguments(subparsers[chosen])
    args = parser.parse_args(argv)
    if command_module is None:
        parser.print_help()
        return 0 if not argv else EXIT_USAGE
    return int(command_module.run(args) or 0)


def _fail(prog: str, message: str, status: int) -> int:
    try:
        print(f"{prog}: error: {_one_line(message)}", file=sys.stderr, flush=True)
    except (BrokenPipeError, ValueError):  # stderr closed too: the status still says it
        pass
    return status


def _one_line(message: str) -> str:
    return " ".join(part.strip() for part in message.splitlines() if part.strip()) or "(no message)"


def _silence_stdout() -> None:
    """After EPIPE, point stdout at /dev/null so the interpreter's final flush cannot fail again."""
    # Adapted from https://docs.python.org/3/library/signal.html#note-on-sigpipe
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a real file (pytest capture): nothing to flush
        pass


if __name__ == "__main__":
    sys.exit(main())
