"""`bash_execute`: one shell command in the workspace sandbox, as an observation.

The arguments model publishes the seed schema. The observation's output holds stdout, then
stderr under a marker; `exit_status` is the command's status (128+N when killed by signal N);
`error` is set only when the sandbox ended the command: the timeout, the file-size limit
(SIGXFSZ), the CPU limit (SIGXCPU) or another signal. It does not decide whether the command may
run (the runtime checks the capability) and cannot undo what the command did.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from surecall.toolbox.result import ToolResult
from surecall.toolbox.sandbox import ExecResult, Sandbox


class BashExecuteArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    command: Annotated[str, Field(min_length=1, max_length=8192, description="The shell command to run, as one string.")]
    timeout_ms: Annotated[
        int, Field(ge=1000, le=300_000, description="Kill the command after this many milliseconds.")
    ] = 30_000


_LIMIT_SIGNALS = {
    signal.SIGXFSZ: "it wrote past the file-size limit",
    signal.SIGXCPU: "it used up its CPU-time limit",
    signal.SIGKILL: "it was killed (memory or process limit, or the sandbox)",
}


def _signal_error(exit_status: int, result: ExecResult) -> str | None:
    if exit_status <= 128 or exit_status > 128 + 64:
        return None
    signum = exit_status - 128
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    why = _LIMIT_SIGNALS.get(signum, "it was ended by a signal")
    return f"command killed by {name} (exit status {exit_status}): {why}; limits {result.limits}"


def observe(result: ExecResult, timeout_ms: int) -> ToolResult:
    """The ToolResult of one sandboxed run."""
    output = result.stdout
    if result.stderr:
        output += ("" if not output or output.endswith("\n") else "\n") + "[stderr]\n" + result.stderr
    error = None
    if result.is_timed_out:
        error = f"command timed out after {timeout_ms} ms; its whole process tree was killed"
    elif result.exit_status is not None:
        error = _signal_error(result.exit_status, result)
    data = {
        "stdout": result.stdout, "stderr": result.stderr, "timed_out": result.is_timed_out,
        "duration_s": round(result.duration_s, 4), "sandboxed": result.is_sandboxed, "limits": result.limits,
    }
    return ToolResult(output=output, error=error, exit_status=result.exit_status, truncated=result.is_truncated, data=data)


def bash_execute(args: BashExecuteArgs, workspace: Path, sandbox: Sandbox) -> ToolResult:
    """Run `args.command` in `workspace` inside `sandbox`; SandboxUnavailable if it cannot run."""
    return observe(sandbox.run(args.command, workspace, args.timeout_ms), args.timeout_ms)
