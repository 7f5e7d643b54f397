"""The main job's scratch workspace: the files the prompts name, and a catalog grounded in them.

`seed_workspace` writes every file a held-out request names (numbered lines, long enough for the
window it asks for, with the `old_str` it wants replaced planted once, or twice for "replace
all"), and the directories searches name. `grounded_tools` narrows the seed catalog to that
workspace: `path` may only name a seeded file, and a file_edit's `old_str` only text planted in
the chosen file. The prompt still shows the model the plain seed catalog; only the grammar narrows.
`restore` puts the files back between calls, so each request is its own task on the same snapshot.
`matches_request` says whether a call is the one the request asked for (schema defaults filled).
It runs no tool; dispatch is `main_job.py`'s.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

MIN_FILE_LINES = 600
MAX_FILE_LINES = 5000  # a request for a window past this (e.g. offset 10,000,000) gets "past the end"
FILE_TOOLS = ("file_view", "file_edit")


@dataclass
class Workspace:
    root: Path
    files: dict[str, list[str]] = field(default_factory=dict)  # path as the prompt spells it -> planted old_strs
    dirs: list[str] = field(default_factory=list)  # directories the searches name
    texts: dict[str, str] = field(default_factory=dict)  # seeded content per file, for `restore`

    def restore(self) -> None:
        """Every seeded file back to its seeded text: each request is its own task on the same snapshot."""
        for rel, text in self.texts.items():
            target = self.root / rel
            if target.is_file() and target.read_text(encoding="utf-8") != text:
                target.write_text(text, encoding="utf-8")


def _safe_relative(rel) -> bool:
    if not isinstance(rel, str) or not rel or len(rel) > 200:
        return False
    path = PurePosixPath(rel.replace("\\", "/"))
    return not path.is_absolute() and ".." not in path.parts


def _filler(num_lines: int) -> list[str]:
    return [f"# filler line {n:05d}" for n in range(1, num_lines + 1)]


def seed_workspace(root: Path, prompts) -> Workspace:
    """Write the files and directories the prompts name under `root`; return what was written."""
    ws = Workspace(Path(root))
    plans: dict[str, dict] = {}
    for p in prompts:
        args = p.arguments or {}
        rel = args.get("path")
        if not _safe_relative(rel):
            continue
        if p.tool == "grep_search":
            ws.dirs.append(rel)
            continue
        if p.tool not in FILE_TOOLS:
            continue
        plan = plans.setdefault(rel, {"lines": MIN_FILE_LINES, "plant": []})
        want = int(args.get("offset", 1)) + int(args.get("limit", 100)) - 1
        plan["lines"] = min(max(plan["lines"], want), MAX_FILE_LINES)
        old = args.get("old_str")
        if isinstance(old, str) and old:
            plan["plant"].append((old, 2 if args.get("allow_multiple") else 1))
    for rel, plan in sorted(plans.items()):
        ws.files[rel] = _write_file(ws.root / rel, plan["lines"], plan["plant"])
        if (ws.root / rel).is_file():
            ws.texts[rel] = (ws.root / rel).read_text(encoding="utf-8")
    for rel in sorted(set(ws.dirs)):
        _write_dir(ws.root / rel)
    ws.dirs = sorted(set(ws.dirs))
    return ws


def _write_file(target: Path, num_lines: int, plant: list[tuple[str, int]]) -> list[str]:
    """Numbered filler with each old_str planted `times` times, spread out; returns what was planted."""
    body = _filler(num_lines)
    step = max(1, num_lines // (sum(t for _, t in plant) + 1))
    at, planted = step, []
    for old, times in plant:
        for _ in range(times):
            body.insert(min(at, len(body)), old)
            at += step + 1
    text = "\n".join(body) + "\n"
    for old, times in plant:
        if text.count(old) == times:  # an old_str that is also a substring elsewhere is not offered
            planted.append(old)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_dir():
        return []
    target.write_text(text, encoding="utf-8")
    return sorted(set(planted))


def _write_dir(target: Path) -> None:
    if target.exists() and not target.is_dir():
        return
    target.mkdir(parents=True, exist_ok=True)
    (target / "example.py").write_text("# TODO: handle errors\nclass Example:\n    pass\nprint('hello')\n", encoding="utf-8")


def grounded_tools(tools: list[dict], ws: Workspace) -> list[dict]:
    """The catalog with `path` limited to seeded files (searches: seeded directories, files or '.')
    and file_edit's old_str to the text planted in the chosen file."""
    out = copy.deepcopy(tools)
    files = sorted(ws.files)
    for tool in out:
        props = tool["parameters"].get("properties", {})
        if tool["name"] == "file_view" and files:
            props["path"] = {"type": "string", "enum": files}
        elif tool["name"] == "grep_search":
            props["path"] = {"type": "string", "enum": sorted({".", *ws.dirs, *files})}
        elif tool["name"] == "file_edit" and any(ws.files.values()):
            tool["parameters"] = _edit_branches(tool["parameters"], ws)
    return out


def _edit_branches(params: dict, ws: Workspace) -> dict:
    branches = []
    for rel, olds in sorted(ws.files.items()):
        if not olds:
            continue
        branch = copy.deepcopy(params)
        branch["properties"]["path"] = {"const": rel}
        branch["properties"]["old_str"] = {"enum": olds}
        branches.append(branch)
    return {"anyOf": branches}


def _with_defaults(arguments: dict, schema: dict) -> dict:
    props = schema.get("properties", {})
    filled = {k: v["default"] for k, v in props.items() if isinstance(v, dict) and "default" in v}
    filled.update(arguments)
    return filled


def matches_request(call, prompt, tools: list[dict]) -> bool:
    """The call names the requested tool with the requested arguments (schema defaults filled)."""
    if call is None or prompt.tool is None or call.name != prompt.tool:
        return False
    schema = next((t["parameters"] for t in tools if t["name"] == call.name), {})
    got = _with_defaults(dict(call.arguments), schema)
    want = _with_defaults(dict(prompt.arguments or {}), schema)
    return json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)
