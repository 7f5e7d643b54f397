"""grep_search: structured matches, glob, caps with a truncation flag, pathological regexes, refusals."""

from __future__ import annotations

import time

import pytest

from surecall.errors import PathOutsideWorkspace, ToolError
from surecall.toolbox.search import GrepSearchArgs, SearchLimits, grep_search


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


def test_catastrophic_backtracking_ends_with_a_clear_error_in_time(ws):
    (ws / "evil.txt").write_text("a" * 5000 + "!\n")
    started = time.perf_counter()
    with pytest.raises(ToolError, match="ran past the search time limit"):
        grep(ws, SearchLimits(time_budget_s=0.3), pattern=r"(a|aa)+$")
    assert time.perf_counter() - started < 3


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
