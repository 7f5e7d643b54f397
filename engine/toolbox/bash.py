"""`bash_execute`: one shell command in the workspace sandbox, as an observation.

The arguments model publishes the seed schema. The observation's output holds stdout, then
stderr under a marker. `exit_status` is the status the command exited with (129 from `exit 129`
is 129, never "SIGHUP"); `data["signal"]` names the signal that ended it where that is known (the
sandbox's kill at the timeout, or the process we started being signalled: exit_status is then
None). A status of 128+N passed on by the sandbox is reported as a status, with a note of the
limit signal it matches. `error` is set only when the sandbox ended the command: the timeout,
the memory cgroup, or a known signal. It does not decide whether the command may run (the
runtime checks the capability) and cannot undo what the command did.
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


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _error(result: ExecResult, timeout_ms: int) -> str | None:
    if result.is_timed_out:
        return f"command timed out after {timeout_ms} ms; its whole process tree was killed"
    if result.is_oom_killed:
        return (f"a process of the command was killed by the memory limit ({result.limits.get('max_memory_bytes')} "
                f"bytes for the whole command); exit status {result.exit_status}")
    if result.signal is not None:
        why = _LIMIT_SIGNALS.get(result.signal, "it was ended by a signal")
        return f"command killed by {_signal_name(result.signal)}: {why}; limits {result.limits}"
    return None


def _status_note(result: ExecResult) -> str | None:
    """For a status 128+N that matches a limit signal: say so, without claiming the signal."""
    status = result.exit_status
    if status is None or not 128 < status <= 128 + 64 or (status - 128) not in _LIMIT_SIGNALS:
        return None
    signum = status - 128
    return (f"exit status {status} is also what a process ended by {_signal_name(signum)} ({_LIMIT_SIGNALS[signum]}) "
            "reports; the command may have returned it itself")


def observe(result: ExecResult, timeout_ms: int) -> ToolResult:
    """The ToolResult of one sandboxed run."""
    output = result.stdout
    if result.stderr:
        output += ("" if not output or output.endswith("\n") else "\n") + "[stderr]\n" + result.stderr
    data = {
        "stdout": result.stdout, "stderr": result.stderr, "timed_out": result.is_timed_out,
        "signal": None if result.signal is None else _signal_name(result.signal), "oom_killed": result.is_oom_killed,
        "duration_s": round(result.duration_s, 4), "sandboxed": result.is_sandboxed, "limits": result.limits,
    }
    if note := _status_note(result):
        data["note"] = note
    return ToolResult(output=output, error=_error(result, timeout_ms), exit_status=result.exit_status,
                      truncated=result.is_truncated, data=data)


def bash_execute(args: BashExecuteArgs, workspace: Path, sandbox: Sandbox, *, bind: str = "rw") -> ToolResult:
    """Run `args.command` in `workspace` (bound as `bind`) inside `sandbox`; SandboxUnavailable if it cannot run."""
    return observe(sandbox.run(args.command, workspace, args.timeout_ms, bind=bind), args.timeout_ms)
