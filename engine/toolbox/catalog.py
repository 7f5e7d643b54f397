"""The four-tool coding catalog: `coding_tools(workspace) -> list[Tool]`.

Each tool is a `surecall.tools.Tool` whose schema is exported from its pydantic model (titles
dropped, so the descriptor equals `surecall.tools.catalog.hardened_seed_tools()`) and whose handler is a
`CodingTool`: it parses the arguments, resolves every path inside the workspace and returns a
`Plan` (what the call touches and how to run it, opening exactly the approved real path, so a
symlink swapped in after the check is refused) for `surecall.dispatch.runtime`; `file_edit`
declares its reconciliation probe on the Tool (`Tool.probe(arguments) -> True/False/None`).
Side-effect levels, and why:
  bash_execute A3  a command may do anything, including deleting files: approval (the right
                   `approve:bash_execute`) and an idempotency key; no probe can tell what ran.
                   The sandbox binds its directory as the rights allow (`bind_mode`): read-write
                   with `read`+`write`, read-only with `read`, not at all without `read`.
  file_view    A0  reads only.
  file_edit    A2  a write that is not idempotent (with allow_multiple, or when new_str holds
                   old_str, a second run edits again): idempotency key plus a reconciliation probe.
  grep_search  A0  reads only.
Costs (`Tool.cost`, checked against the capability's ceiling P), each in the tool's own unit:
bash_execute its `timeout_ms`; file_edit the UTF-8 bytes of `new_str` (bytes written per
occurrence); grep_search its time budget in ms (a bound on the files it can scan); file_view
the lines it may show (`limit`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from surecall.errors import PathOutsideWorkspace
from surecall.toolbox.atomic import sweep_workspace_temps
from surecall.toolbox.bash import BashExecuteArgs, bash_execute
from surecall.toolbox.files import (
    FileEditArgs,
    FileLimits,
    FileViewArgs,
    file_edit,
    file_view,
    probe_file_edit,
)
from surecall.toolbox.paths import is_within, real_workspace, resolve_in_workspace
from surecall.toolbox.result import Access, Plan
from surecall.toolbox.sandbox import Sandbox, SandboxConfig
from surecall.toolbox.search import GrepSearchArgs, SearchLimits, grep_search
from surecall.tools import SideEffect, Tool
from surecall.tools.catalog import hardened_seed_tools

LEVELS = {
    "bash_execute": SideEffect.A3,
    "file_view": SideEffect.A0,
    "file_edit": SideEffect.A2,
    "grep_search": SideEffect.A0,
}
Planner = Callable[[Any, Path, tuple[str, ...], "frozenset[str] | None"], Plan]


def published_schema(model: type[BaseModel]) -> dict:
    """The model's JSON Schema without pydantic's `title` annotations (what the model sees)."""
    return _drop_titles(model.model_json_schema())


def _drop_titles(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _drop_titles(v) for k, v in node.items() if not (k == "title" and isinstance(v, str))}
    if isinstance(node, list):
        return [_drop_titles(v) for v in node]
    return node


@dataclass(frozen=True)
class CodingTool:
    """A toolbox tool's handler: `plan(arguments, capability_objects, capability_rights) -> Plan`.
    `capability_rights` (optional) lets bash_execute bind the workspace as the rights allow."""

    model: type[BaseModel]
    planner: Planner
    workspace: Path

    def plan(self, arguments: dict, capability_objects: tuple[str, ...] = (),
             capability_rights: frozenset[str] | None = None) -> Plan:
        args = self.model.model_validate(arguments)
        rights = None if capability_rights is None else frozenset(capability_rights)
        return self.planner(args, self.workspace, tuple(capability_objects), rights)


# --- planners: what each call touches -----------------------------------------------------
def _planner_view(limits: FileLimits) -> Planner:
    def plan(args: FileViewArgs, ws: Path, _objects: tuple[str, ...], _rights=None) -> Plan:
        real = resolve_in_workspace(ws, args.path)
        return Plan((Access("read", str(real)),), run=lambda: file_view(args, ws, approved=real, limits=limits))

    return plan


def _planner_edit(limits: FileLimits) -> Planner:
    def plan(args: FileEditArgs, ws: Path, _objects: tuple[str, ...], _rights=None) -> Plan:
        real = resolve_in_workspace(ws, args.path)
        # read too: the observation shows the edited lines, so a write-only capability must not edit
        accesses = (Access("read", str(real)), Access("write", str(real)))
        return Plan(accesses, run=lambda: file_edit(args, ws, approved=real, limits=limits))

    return plan


def _planner_grep(limits: SearchLimits) -> Planner:
    def plan(args: GrepSearchArgs, ws: Path, _objects: tuple[str, ...], _rights=None) -> Plan:
        real = resolve_in_workspace(ws, args.path)
        return Plan((Access("read", str(real)),), run=lambda: grep_search(args, ws, limits, approved=real))

    return plan


def exec_directory(ws: Path, objects: tuple[str, ...]) -> Path:
    """Where a command runs: the workspace when a capability object covers it, else the first
    object directory inside the workspace (the sandbox then binds only that directory)."""
    for obj in objects:
        if obj.startswith("/") and is_within(ws, Path(os.path.realpath(obj))):
            return ws
    for obj in objects:
        real = Path(os.path.realpath(obj)) if obj.startswith("/") else None
        if real is not None and is_within(real, ws) and real.is_dir():
            return real
    raise PathOutsideWorkspace(f"the capability names no directory in the workspace {str(ws)!r} (objects {list(objects)})")


def bind_mode(rights: frozenset[str] | None) -> str:
    """How a command sees its directory: "rw" with `read` and `write`, "ro" with `read` only,
    "none" without `read`. Unknown rights (None) mean "rw", and the plan then asks for both."""
    if rights is None:
        return "rw"
    if "read" not in rights:
        return "none"
    return "rw" if "write" in rights else "ro"


def _planner_bash(sandbox: Sandbox) -> Planner:
    def plan(args: BashExecuteArgs, ws: Path, objects: tuple[str, ...], rights: frozenset[str] | None = None) -> Plan:
        where, mode = exec_directory(ws, objects), bind_mode(rights)
        # what the bind lets the command do to `where` is approved along with `exec`
        needs = ("exec",) + (("read",) if mode != "none" else ()) + (("write",) if mode == "rw" else ())
        accesses = tuple(Access(right, str(where)) for right in needs)
        return Plan(accesses, run=lambda: bash_execute(args, where, sandbox, bind=mode))

    return plan


def _edit_probe(ws: Path) -> Callable[[dict], bool | None]:
    """file_edit's reconciliation probe over raw arguments (see `files.probe_file_edit`)."""
    return lambda arguments: probe_file_edit(FileEditArgs.model_validate(arguments), ws)


def _default(model: type[BaseModel], name: str) -> Any:
    return model.model_fields[name].default


def _costs(limits: SearchLimits) -> dict[str, Callable[[dict], float]]:
    """Each tool's cost of one call, from its (already validated) arguments."""
    return {
        "bash_execute": lambda a: float(a.get("timeout_ms", _default(BashExecuteArgs, "timeout_ms"))),
        "file_view": lambda a: float(a.get("limit", _default(FileViewArgs, "limit"))),
        "file_edit": lambda a: float(len(str(a.get("new_str", "")).encode("utf-8", errors="surrogatepass"))),
        "grep_search": lambda a: limits.time_budget_s * 1000.0,
    }


def coding_tools(
    workspace: str | os.PathLike,
    *,
    sandbox: Sandbox | SandboxConfig | None = None,
    search_limits: SearchLimits | None = None,
    file_limits: FileLimits | None = None,
) -> list[Tool]:
    """bash_execute, file_view, file_edit and grep_search, bound to `workspace`."""
    ws = real_workspace(workspace)
    sweep_workspace_temps(ws)  # temporary files a killed file_edit left behind
    shell = sandbox if isinstance(sandbox, Sandbox) else Sandbox(sandbox)
    limits = search_limits or SearchLimits()
    costs = _costs(limits)
    models_and_planners = {
        "bash_execute": (BashExecuteArgs, _planner_bash(shell)),
        "file_view": (FileViewArgs, _planner_view(file_limits or FileLimits())),
        "file_edit": (FileEditArgs, _planner_edit(file_limits or FileLimits())),
        "grep_search": (GrepSearchArgs, _planner_grep(limits)),
    }
    tools = []
    for seed in hardened_seed_tools():
        model, planner = models_and_planners[seed["name"]]
        tools.append(
            Tool(
                name=seed["name"], description=seed["description"], input_schema=published_schema(model),
                level=LEVELS[seed["name"]], handler=CodingTool(model, planner, ws), model=model,
                probe=_edit_probe(ws) if seed["name"] == "file_edit" else None, cost=costs[seed["name"]],
            )
        )
    return tools
