"""`grep_search`: a regular-expression search over workspace files, with structured results.

Results are (path, line, text) records, capped by `max_matches` and `max_output_bytes` with a
`truncated` flag. The pattern runs on the `regex` package (Python `re` syntax). Compiling cannot
be interrupted, so a pattern is refused before it compiles when it is too long or its counted
repeats nest past `max_regex_repeat` (`x{100000000}` would take minutes); matching runs with a
timeout, and when `time_budget_s` runs out (a slow pattern or a huge tree) the matches found so
far come back with `truncated=True` and a note. No shell and no subprocess: files are walked from
directory fds (`paths.walk_tree`), so a directory swapped for a symlink is never entered; a
symlinked file is searched only when it resolves under the searched path; `.git` is skipped, and
binary or huge files are skipped (and counted). It does not honour .gitignore.
"""

from __future__ import annotations

import fnmatch
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import regex
from pydantic import BaseModel, ConfigDict, Field

from surecall.errors import ToolError
from surecall.toolbox.paths import (
    FILE_FLAGS,
    display_path,
    is_within,
    open_path,
    read_fd,
    real_workspace,
    resolve_in_workspace,
    walk_tree,
)
from surecall.toolbox.pattern import repeat_expansion
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
    max_pattern_chars: int = 512
    max_regex_repeat: int = 100_000  # bound of `pattern.repeat_expansion`; compiles in ~50 ms

    def __post_init__(self) -> None:
        names = ("max_matches", "max_output_bytes", "max_line_chars", "max_file_bytes", "max_pattern_chars", "max_regex_repeat")
        for name in names:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Invalid SearchLimits.{name}: expected a positive integer, got {value!r}")
        if not (isinstance(self.time_budget_s, (int, float)) and 0 < self.time_budget_s < float("inf")):
            raise ValueError(f"Invalid SearchLimits.time_budget_s: expected a finite number > 0, got {self.time_budget_s!r}")


def _matches_glob(rel_path: str, glob: str | None) -> bool:
    if glob is None:
        return True
    target = rel_path if "/" in glob else os.path.basename(rel_path)
    return fnmatch.fnmatchcase(target, glob)


class _BudgetSpent(Exception):
    """The time budget ran out mid-scan: stop and return what was found."""


def _regular_fd(root: Path, real: Path) -> int | None:
    """A new fd of the regular file `real`, or None when it is anything else or cannot be opened."""
    try:
        with open_path(root, real, str(real)) as fd:
            return os.dup(fd) if stat.S_ISREG(os.fstat(fd).st_mode) else None
    except (OSError, ToolError):
        return None


def _open_entry(dir_fd: int, name: str, is_link: bool, link_path: Path, start: Path, root: Path) -> int | None:
    """An fd of the regular file `name` in `dir_fd`; a symlink only when it resolves under `start`."""
    if is_link:
        try:
            real = Path(os.path.realpath(link_path))
        except OSError:
            return None
        return _regular_fd(root, real) if is_within(real, start) else None
    try:
        fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None  # gone, or swapped for a symlink since the directory was listed
    if stat.S_ISREG(os.fstat(fd).st_mode):
        return fd
    os.close(fd)
    return None


def _candidate_files(root: Path, start: Path, shown: str, glob: str, deadline: float) -> Iterator[tuple[str, int]]:
    """(path shown, open fd) of each regular file under `start` (or `start` itself) matching
    `glob`, sorted by path; _BudgetSpent past the deadline (a huge tree)."""
    base = display_path(start, root)
    with open_path(root, start, shown) as top_fd:
        mode = os.fstat(top_fd).st_mode
        if stat.S_ISREG(mode) and _matches_glob(base, glob):
            yield base, top_fd
        if not stat.S_ISDIR(mode):
            return
        for rel_dir, dir_fd, files in walk_tree(top_fd, skip_dirs=SKIP_DIRS):
            for name, is_link in files:
                if time.monotonic() > deadline:
                    raise _BudgetSpent
                rel = os.path.normpath(os.path.join(base, rel_dir, name))
                if not _matches_glob(rel, glob):
                    continue
                fd = _open_entry(dir_fd, name, is_link, start / rel_dir / name, start, root)
                if fd is None:
                    continue
                try:
                    yield rel, fd
                finally:
                    os.close(fd)


def _read_text(fd: int, limits: SearchLimits) -> str | None:
    """The file's text, or None for binary, huge or unreadable files."""
    try:
        raw = read_fd(fd, limits.max_file_bytes) if os.fstat(fd).st_size <= limits.max_file_bytes else None
    except OSError:
        return None
    if raw is None or b"\x00" in raw[:8192]:
        return None
    return raw.decode("utf-8", errors="replace")


def compile_pattern(pattern: str, limits: SearchLimits = SearchLimits()) -> regex.Pattern:
    """The compiled pattern, or ToolError for one that is invalid or too costly to compile."""
    if len(pattern) > limits.max_pattern_chars:
        raise ToolError(f"regular expression is {len(pattern)} characters, over the limit of {limits.max_pattern_chars}")
    expansion = repeat_expansion(pattern)
    if expansion > limits.max_regex_repeat:
        raise ToolError(
            f"regular expression {pattern!r} repeats up to {expansion} times with nested counted repeats "
            f"({{n}}, {{n,m}}), over the limit of {limits.max_regex_repeat}; use smaller counts or + and *"
        )
    try:
        return regex.compile(pattern, flags=regex.VERSION0 | regex.MULTILINE)
    except (regex.error, OverflowError, RecursionError) as exc:
        raise ToolError(f"invalid regular expression {pattern!r}: {exc}") from None


@dataclass
class _Scan:
    """What one search found so far."""

    matches: list[dict] = field(default_factory=list)
    num_bytes: int = 0
    num_files: int = 0
    num_skipped: int = 0
    truncated: bool = False
    timed_out: bool = False

    def search_file(self, rel: str, fd: int, compiled: regex.Pattern, deadline: float, limits: SearchLimits) -> None:
        text = _read_text(fd, limits)
        if text is None:
            self.num_skipped += 1
            return
        self.num_files += 1
        for line_no, line in _matching_lines(compiled, text, deadline):
            record = {"path": rel, "line": line_no, "text": line[: limits.max_line_chars]}
            self.num_bytes += len(rel) + len(record["text"]) + 16
            if len(self.matches) >= limits.max_matches or self.num_bytes > limits.max_output_bytes:
                self.truncated = True
                return
            self.matches.append(record)


def grep_search(
    args: GrepSearchArgs, workspace: Path, limits: SearchLimits = SearchLimits(), *, approved: Path | None = None
) -> ToolResult:
    """Every line matching `pattern` under `path`, as {path, line, text} records.

    `approved` is the real path a capability was checked against: searched as is, and a symlink
    met on the way to it (the path changed since the check) is refused."""
    root = real_workspace(workspace)
    start = approved if approved is not None else resolve_in_workspace(root, args.path)
    compiled = compile_pattern(args.pattern, limits)
    deadline = time.monotonic() + limits.time_budget_s
    scan = _Scan()
    try:
        for rel, fd in _candidate_files(root, start, args.path, args.glob, deadline):
            scan.search_file(rel, fd, compiled, deadline, limits)
            if scan.truncated:
                break
    except _BudgetSpent:
        scan.truncated = scan.timed_out = True
    return _result(scan, limits)


def _matching_lines(compiled: regex.Pattern, text: str, deadline: float) -> Iterator[tuple[int, str]]:
    """(line number, line) of each line holding a match; _BudgetSpent past the deadline."""
    for line_no, line in enumerate(text.splitlines(), start=1):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _BudgetSpent
        try:
            # `regex` checks its clock only every so many steps and overshoots a timeout by ~50% (more
            # under load): give one line half of what is left, so the scan still ends inside its budget
            found = compiled.search(line, timeout=max(0.01, remaining / 2))
        except TimeoutError:
            raise _BudgetSpent from None
        if found is not None:
            yield line_no, line


def _result(scan: _Scan, limits: SearchLimits) -> ToolResult:
    lines = [f"{m['path']}:{m['line']}: {m['text']}" for m in scan.matches]
    summary = f"[{len(scan.matches)} match(es) in {scan.num_files} file(s) searched"
    if scan.num_skipped:
        summary += f", {scan.num_skipped} binary or huge file(s) skipped"
    if scan.timed_out:
        summary += (
            f"; stopped after the {limits.time_budget_s} s time budget (a slow pattern or a large tree): "
            "the matches so far are shown; simplify the pattern or narrow the path"
        )
    elif scan.truncated:
        summary += f"; truncated at {limits.max_matches} matches / {limits.max_output_bytes} bytes, narrow the search"
    lines.append(summary + "]")
    data = {
        "matches": scan.matches, "truncated": scan.truncated, "timed_out": scan.timed_out,
        "num_files_searched": scan.num_files, "num_files_skipped": scan.num_skipped,
    }
    return ToolResult(output="\n".join(lines), truncated=scan.truncated, data=data)
