"""grep_search: structured matches, glob, caps with a truncation flag, bounded regexes, timeouts, refusals."""

from __future__ import annotations

import os
import time

import pytest

from surecall.errors import PathOutsideWorkspace, ToolError
from surecall.toolbox.paths import resolve_in_workspace
from surecall.toolbox.pattern import repeat_expansion
from surecall.toolbox.search import GrepSearchArgs, SearchLimits, compile_pattern, grep_search


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "src" / "a.py").write_text("import os\n\ndef main():\n    return os.getcwd()\n")
    (root / "src" / "b.txt").write_text("main course\n")
    (root / "README.md").write_text("# main\n")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("main = yes\n")
    (root / "blob.bin").write_bytes(b"main\x00\x01")
    return root


def grep(ws, limits=SearchLimits(), **kw):
    return grep_search(GrepSearchArgs(**kw), ws, limits)


def test_structured_matches_sorted_and_skipping_git_and_binary(ws):
    out = grep(ws, pattern=r"\bmain\b")
    assert out.data["matches"] == [
        {"path": "README.md", "line": 1, "text": "# main"},
        {"path": "src/a.py", "line": 3, "text": "def main():"},
        {"path": "src/b.txt", "line": 1, "text": "main course"},
    ]
    assert out.data["num_files_skipped"] == 1 and out.data["truncated"] is False and not out.truncated
    assert "src/a.py:3: def main():" in out.output


def test_glob_and_path_narrow_the_search(ws):
    assert [m["path"] for m in grep(ws, pattern="main", glob="*.py").data["matches"]] == ["src/a.py"]
    assert [m["path"] for m in grep(ws, pattern="main", path="src/b.txt").data["matches"]] == ["src/b.txt"]
    assert [m["path"] for m in grep(ws, pattern="main", glob="src/*.txt").data["matches"]] == ["src/b.txt"]


def test_caps_on_matches_and_bytes_set_the_truncated_flag(ws):
    (ws / "many.txt").write_text("hit\n" * 1000)
    out = grep(ws, SearchLimits(max_matches=10), pattern="hit")
    assert len(out.data["matches"]) == 10 and out.truncated and out.data["truncated"]
    assert "truncated at 10 matches" in out.output
    out = grep(ws, SearchLimits(max_output_bytes=200), pattern="hit")
    assert 0 < len(out.data["matches"]) < 10 and out.truncated


def test_catastrophic_backtracking_returns_the_matches_so_far_in_time(ws):
    (ws / "a_hits.txt").write_text("aaaa\n" * 3)
    (ws / "evil.txt").write_text("a" * 5000 + "!\n")
    started = time.perf_counter()
    out = grep(ws, SearchLimits(time_budget_s=0.3), pattern=r"(a|aa)+$")
    assert time.perf_counter() - started < 3
    assert [(m["path"], m["line"]) for m in out.data["matches"]] == [("a_hits.txt", 1), ("a_hits.txt", 2), ("a_hits.txt", 3)]
    assert out.truncated and out.data["truncated"] and out.data["timed_out"] and out.error is None
    assert "stopped after the 0.3 s time budget (a slow pattern or a large tree): the matches so far are shown" in out.output


@pytest.mark.parametrize(
    ("pattern", "expansion"),
    [
        ("x{100000000}", 100000000),
        ("((a{100}){100}){100}", 1000000),
        ("(?x)(a{1000}) # a comment hides nothing\n{1000}", 1000000),
        ("[{]{200}a{1000}", 200000),
    ],
)
def test_patterns_whose_counted_repeats_would_compile_for_minutes_are_refused_at_once(ws, pattern, expansion):
    started = time.perf_counter()
    with pytest.raises(ToolError, match=rf"repeats up to {expansion} times .* over the limit of 100000"):
        grep(ws, pattern=pattern)
    assert time.perf_counter() - started < 1


@pytest.mark.parametrize(
    "pattern",
    [r"\d{4}-\d{2}-\d{2}", r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", r"a{2,}", r"x{,3}",
     r"\{\d+\}", "{}", r"[}{]+", r"\p{L}{3}"],
)
def test_ordinary_counted_repeats_and_literal_braces_still_compile(pattern):
    assert compile_pattern(pattern) is not None


def test_pattern_length_is_bounded_by_the_limits(ws):
    with pytest.raises(ToolError, match="regular expression is 11 characters, over the limit of 10"):
        grep(ws, SearchLimits(max_pattern_chars=10), pattern="a" * 11)
    with pytest.raises(ValueError, match="Invalid SearchLimits.max_regex_repeat"):
        SearchLimits(max_regex_repeat=0)


def test_repeat_expansion_is_an_upper_bound_per_group():
    assert repeat_expansion("abc") == 1
    assert repeat_expansion(r"a{3}(b{5}){2}") == 10
    assert repeat_expansion(r"a{100}b{100}") == 10_000  # pessimistic: a repeat multiplies its group's largest
    assert repeat_expansion(r"(a{10}|b{20}){3}") == 600
    assert repeat_expansion(r"\{9999\}[a{9999}]") == 1


def test_walking_past_the_time_budget_stops_with_the_flag(ws):
    out = grep(ws, SearchLimits(time_budget_s=1e-9), pattern="main")
    assert out.truncated and out.data["matches"] == [] and "stopped after" in out.output


def test_bad_regex_missing_path_and_outside_path(ws):
    with pytest.raises(ToolError, match="invalid regular expression"):
        grep(ws, pattern="(unclosed")
    with pytest.raises(ToolError, match="does not exist"):
        grep(ws, pattern="x", path="nope")
    with pytest.raises(PathOutsideWorkspace):
        grep(ws, pattern="x", path="..")


def test_symlinked_file_out_of_the_workspace_is_not_searched(ws, tmp_path):
    (tmp_path / "secret.txt").write_text("main secret\n")
    (ws / "src" / "leak.txt").symlink_to(tmp_path / "secret.txt")
    assert all(m["path"] != "src/leak.txt" for m in grep(ws, pattern="secret").data["matches"])
    assert grep(ws, pattern="secret").data["matches"] == []


def test_symlink_leaving_the_searched_directory_is_skipped(ws):
    (ws / "src" / "readme_link.md").symlink_to(ws / "README.md")
    assert [m["path"] for m in grep(ws, pattern="# main", path="src").data["matches"]] == []
    assert [m["path"] for m in grep(ws, pattern="# main").data["matches"]] == ["README.md", "src/readme_link.md"]


def test_limits_are_validated():
    with pytest.raises(ValueError, match="Invalid SearchLimits.max_matches"):
        SearchLimits(max_matches=0)
    with pytest.raises(ValueError, match="Invalid SearchLimits.time_budget_s"):
        SearchLimits(time_budget_s=0)


def test_glob_schema_has_no_null(ws):
    with pytest.raises(ValueError, match="string"):
        GrepSearchArgs(pattern="x", glob=None)


def test_a_symlink_swapped_in_after_approval_is_refused_even_inside_the_workspace(ws):
    (ws / "private").mkdir()
    (ws / "private" / "p.txt").write_text("main private\n")
    approved = resolve_in_workspace(ws, "src")
    (ws / "src").rename(ws / "src_old")
    (ws / "src").symlink_to(ws / "private")
    with pytest.raises(ToolError, match=r"changed while the tool ran \('src' is now a symbolic link\)"):
        grep_search(GrepSearchArgs(pattern="main", path="src"), ws, approved=approved)


def test_a_directory_symlink_is_not_entered_and_a_fifo_does_not_hang(ws, tmp_path):
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "o.txt").write_text("main outside\n")
    (ws / "src" / "out_dir").symlink_to(tmp_path / "outside")
    os.mkfifo(ws / "src" / "pipe")
    paths = [m["path"] for m in grep(ws, pattern="main").data["matches"]]
    assert paths == ["README.md", "src/a.py", "src/b.txt"]
