"""`grep_search`: a regular-expression search over workspace files, with structured results.

Results are (path, line, text) records, capped by `max_matches` and `max_output_bytes` with a
`truncated` flag. The pattern runs on the `regex` package (Python `re` syntax) with a timeout,
so a catastrophically backtracking pattern ends with a clear error after `time_budget_s`
instead of pinning a core. No shell and no subprocess: files are walked in Python, symlinks
are not followed out of the searched path, `.git` is skipped, and binary or huge files are skipped
(and counted). It does not honour .gitignore.
"""

from __future__ import annotations

import fnmatch
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import regex
from pydantic import BaseModel, ConfigDict, Field

from surecall.errors import ToolError
from surecall.toolbox.paths import display_path, is_within, real_workspace, resolve_in_workspace
from surecall.toolbox.result import ToolResult

SKIP_DIRS = frozenset({".git"})


class GrepSearchArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pattern: Annotated[str, Field(min_length=1, max_length=512, description="A regular expression (Python re syntax).")]
    path: Annotated[
        str, Field(min_length=1, max_length=4096, description="File or directory to search, relative to the workspace.")
    ] = "."
    glob: Annotated[
        str, Field(min_length=1, max_length=256, description="Only search files whose name matches this glob, e.g. *.py.")
    ] = "*"


@dataclass(frozen=True)
class SearchLimits:
    max_matches: int = 200
    max_output_bytes: int = 64 * 1024
    max_line_chars: int = 300
    max_file_bytes: int = 4 * 1024 * 1024
    time_budget_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("max_matches", "max_output_bytes", "max_line_chars", "max_file_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Invalid SearchLimits.{name}: expected a positive integer, got {value!r}")
        if not self.time_budget_s > 0:
            raise ValueError(f"Invalid SearchLimits.time_budget_s: expected > 0, got {self.time_budget_s!r}")


def _matches_glob(rel_path: str, glob: str | None) -> bool:
    if glob is None:
        return True
    target = rel_path if "/" in glob else os.path.basename(rel_path)
    return fnmatch.fnmatchcase(target, glob)


def _candidate_files(start: Path):
    """Regular files under `start` (or `start` itself). A symlink whose target leaves `start`
    is skipped, so the search never reads past the path the capability approved."""
    if start.is_file():
        yield start
        return
    for dirpath, dirnames, filenames in os.walk(start, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            path = Path(dirpath) / name
            real = Path(os.path.realpath(path))
            if is_within(real, start) and real.is_file():
                yield path


def _read_text(path: Path, limits: SearchLimits) -> str | None:
    """The file's text, or None for binary, huge or unreadable files."""
    try:
        if path.stat().st_size > limits.max_file_bytes:
            return None
        raw = path.read_bytes()
    except OSError:
        return None
    if b"\x00" in raw[:8192]:
        return None
    return raw.decode("utf-8", errors="replace")


def compile_pattern(pattern: str) -> regex.Pattern:
    try:
        return regex.compile(pattern, flags=regex.VERSION0 | regex.MULTILINE)
    except regex.error as exc:
        raise ToolError(f"invalid regular expression {pattern!r}: {exc}") from None


def grep_search(args: GrepSearchArgs, workspace: Path, limits: SearchLimits = SearchLimits()) -> ToolResult:
    """Every line matching `pattern` under `path`, as {path, line, text} records."""
    root = real_workspace(workspace)
    start = resolve_in_workspace(root, args.path)
    if not start.exists():
        raise ToolError(f"path {args.path!r} does not exist")
    compiled = compile_pattern(args.pattern)
    deadline = time.monotonic() + limits.time_budget_s
    matches, num_bytes, num_files, num_skipped, truncated, timed_out = [], 0, 0, 0, False, False
    for path in _candidate_files(start):
        if time.monotonic() > deadline:  # a huge tree: stop walking, say so
            truncated, timed_out = True, True
            break
        rel = display_path(path, root)
        if not _matches_glob(rel, args.glob):
            continue
        text = _read_text(path, limits)
        if text is None:
            num_skipped += 1
            continue
        num_files += 1
        for line_no, line in _matching_lines(compiled, text, deadline, args.pattern):
            record = {"path": rel, "line": line_no, "text": line[: limits.max_line_chars]}
            num_bytes += len(rel) + len(record["text"]) + 16
            if len(matches) >= limits.max_matches or num_bytes > limits.max_output_bytes:
                truncated = True
                break
            matches.append(record)
        if truncated:
            break
    return _result(matches, truncated, timed_out, num_files, num_skipped, limits)


def _matching_lines(compiled: regex.Pattern, text: str, deadline: float, pattern: str):
    """(line number, line) of each line holding a match; ToolError past the deadline."""
    lines = text.splitlines()
    for line_no, line in enumerate(lines, start=1):
        remaining = deadline - time.monotonic()
        try:
            if remaining <= 0:
                raise TimeoutError
            found = compiled.search(line, timeout=remaining)
        except TimeoutError:
            raise ToolError(
                f"regular expression {pattern!r} ran past the search time limit "
                "(catastrophic backtracking?); simplify it or narrow the path"
            ) from None
        if found is not None:
            yield line_no, line


def _result(
    matches: list[dict], truncated: bool, timed_out: bool, num_files: int, num_skipped: int, limits: SearchLimits
) -> ToolResult:
    lines = [f"{m['path']}:{m['line']}: {m['text']}" for m in matches]
    summary = f"[{len(matches)} match(es) in {num_files} file(s) searched"
    if num_skipped:
        summary += f", {num_skipped} binary or huge file(s) skipped"
    if timed_out:
        summary += f"; stopped after {limits.time_budget_s} s of searching, narrow the path"
    elif truncated:
        summary += f"; truncated at {limits.max_matches} matches / {limits.max_output_bytes} bytes, narrow the search"
    lines.append(summary + "]")
    data = {"matches": matches, "truncated": truncated, "num_files_searched": num_files, "num_files_skipped": num_skipped}
    return ToolResult(output="\n".join(lines), truncated=truncated, data=data)
