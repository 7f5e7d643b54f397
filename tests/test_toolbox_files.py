"""file_view and file_edit: windows, notes, refusals, byte-for-byte unchanged files, atomic writes, probe."""

from __future__ import annotations

import os
import stat

import pytest

from surecall.errors import PathOutsideWorkspace, ToolError
from surecall.toolbox.files import (
    MAX_FILE_BYTES,
    FileEditArgs,
    FileViewArgs,
    file_edit,
    file_view,
    probe_file_edit,
)
from surecall.toolbox.paths import resolve_in_workspace


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.txt").write_text("".join(f"line {i}\n" for i in range(1, 21)))
    return root


def view(ws, **kw):
    return file_view(FileViewArgs(**kw), ws)


def edit(ws, **kw):
    return file_edit(FileEditArgs(**kw), ws)


# --- file_view ---------------------------------------------------------------------------
def test_view_window_is_one_indexed_with_line_numbers_and_next_offset(ws):
    out = view(ws, path="a.txt", offset=3, limit=2)
    assert out.output.splitlines()[:2] == ["     3\tline 3", "     4\tline 4"]
    assert "[lines 3-4 of 20; next offset 5]" in out.output
    assert (out.data["first_line"], out.data["last_line"], out.data["num_lines"]) == (3, 4, 20)


def test_view_notes_when_the_window_passes_the_end(ws):
    out = view(ws, path="a.txt", offset=18, limit=10)
    assert out.output.splitlines()[-2] == "    20\tline 20"
    assert out.output.endswith("[end of file: lines 18-20 of 20]")


def test_view_of_an_empty_file_says_so(ws):
    (ws / "empty.txt").write_text("")
    assert view(ws, path="empty.txt").output == "[empty file: 0 lines]"


def test_view_offset_past_the_end_is_an_error(ws):
    with pytest.raises(ToolError, match="offset 21 is past the end of 'a.txt', which has 20 lines"):
        view(ws, path="a.txt", offset=21)


def test_view_limit_above_500_is_rejected_by_the_model(ws):
    with pytest.raises(ValueError, match="less than or equal to 500"):
        FileViewArgs(path="a.txt", limit=501)


def test_view_cuts_very_long_lines(ws):
    (ws / "min.js").write_text("x" * 5000 + "\n")
    out = view(ws, path="min.js")
    assert out.truncated and "[... line cut at 2000 chars]" in out.output


def test_view_refuses_binary_and_huge_files(ws):
    (ws / "bin.dat").write_bytes(b"\x7fELF\x00\x01\x02")
    with pytest.raises(ToolError, match="looks binary"):
        view(ws, path="bin.dat")
    (ws / "latin1.txt").write_bytes(b"caf\xe9\n")
    with pytest.raises(ToolError, match="not valid UTF-8"):
        view(ws, path="latin1.txt")
    with open(ws / "huge.txt", "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: no real disk use
    with pytest.raises(ToolError, match="over the .*-byte limit"):
        view(ws, path="huge.txt")


def test_view_missing_file_and_directory(ws):
    with pytest.raises(ToolError, match="does not exist"):
        view(ws, path="nope.txt")
    (ws / "sub").mkdir()
    with pytest.raises(ToolError, match="is not a regular file"):
        view(ws, path="sub")


# --- paths -------------------------------------------------------------------------------
def test_paths_outside_the_workspace_are_denied(ws, tmp_path):
    (tmp_path / "secret.txt").write_text("secret")
    (tmp_path / "ws_evil").mkdir()
    (ws / "link_out").symlink_to(tmp_path / "secret.txt")
    for path in ("../secret.txt", str(tmp_path / "secret.txt"), "link_out", "/etc/passwd", str(tmp_path / "ws_evil")):
        with pytest.raises(PathOutsideWorkspace, match="outside the workspace"):
            view(ws, path=path)


def test_absolute_path_and_symlink_inside_are_allowed(ws):
    (ws / "inner").symlink_to(ws / "a.txt")
    assert resolve_in_workspace(ws, str(ws / "a.txt")) == ws / "a.txt"
    assert "line 1" in view(ws, path="inner").output


# --- file_edit ---------------------------------------------------------------------------
def test_edit_replaces_exactly_once_and_shows_a_snippet(ws):
    out = edit(ws, path="a.txt", old_str="line 7\n", new_str="LINE SEVEN\n")
    text = (ws / "a.txt").read_text()
    assert "LINE SEVEN\nline 8" in text and "line 7\n" not in text
    assert out.data == {"path": "a.txt", "num_replacements": 1, "line": 7}
    assert "     7\tLINE SEVEN" in out.output


@pytest.mark.parametrize(
    ("old", "multiple", "message"),
    [
        ("no such text", False, r"not found in 'a.txt' \(0 matches\); the file is unchanged"),
        ("line 1", False, r"occurs 11 times in 'a.txt'.*allow_multiple=true; the file is unchanged"),
        ("line 1", True, None),
    ],
)
def test_failed_edits_leave_the_file_byte_for_byte_unchanged(ws, old, multiple, message):
    before = (ws / "a.txt").read_bytes()
    mtime = os.stat(ws / "a.txt").st_mtime_ns
    if message is None:
        out = edit(ws, path="a.txt", old_str=old, new_str="L1", allow_multiple=multiple)
        assert out.data["num_replacements"] == 11  # line 1, line 10..19
        assert (ws / "a.txt").read_bytes() == before.replace(b"line 1", b"L1")
        return
    with pytest.raises(ToolError, match=message):
        edit(ws, path="a.txt", old_str=old, new_str="X", allow_multiple=multiple)
    assert (ws / "a.txt").read_bytes() == before
    assert os.stat(ws / "a.txt").st_mtime_ns == mtime


def test_edit_refuses_identical_strings_binary_and_outside(ws, tmp_path):
    with pytest.raises(ToolError, match="identical"):
        edit(ws, path="a.txt", old_str="line 3\n", new_str="line 3\n")
    (ws / "b.bin").write_bytes(b"ab\x00cd")
    with pytest.raises(ToolError, match="looks binary"):
        edit(ws, path="b.bin", old_str="ab", new_str="x")
    assert (ws / "b.bin").read_bytes() == b"ab\x00cd"
    (tmp_path / "outside.txt").write_text("keep")
    with pytest.raises(PathOutsideWorkspace):
        edit(ws, path="../outside.txt", old_str="keep", new_str="lost")
    assert (tmp_path / "outside.txt").read_text() == "keep"


def test_edit_keeps_mode_crlf_and_leaves_no_temp_file(ws):
    path = ws / "script.sh"
    path.write_bytes(b"#!/bin/sh\r\necho old\r\n")
    path.chmod(0o751)
    edit(ws, path="script.sh", old_str="old", new_str="new")
    assert path.read_bytes() == b"#!/bin/sh\r\necho new\r\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o751
    assert sorted(p.name for p in ws.iterdir()) == ["a.txt", "script.sh"]


def test_edit_is_atomic_when_the_write_fails(ws, monkeypatch):
    before = (ws / "a.txt").read_bytes()

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="No space left"):
        edit(ws, path="a.txt", old_str="line 2\n", new_str="two\n")
    assert (ws / "a.txt").read_bytes() == before
    assert sorted(p.name for p in ws.iterdir()) == ["a.txt"]  # the temporary file was removed


# --- reconciliation probe ----------------------------------------------------------------
def test_probe_tells_applied_from_not_applied(ws):
    args = FileEditArgs(path="a.txt", old_str="line 5\n", new_str="five\n")
    assert probe_file_edit(args, ws) is False
    file_edit(args, ws)
    assert probe_file_edit(args, ws) is True
    deletion = FileEditArgs(path="a.txt", old_str="line 6\n", new_str="")
    assert probe_file_edit(deletion, ws) is False
    file_edit(deletion, ws)
    assert probe_file_edit(deletion, ws) is True


def test_probe_cannot_tell_when_new_contains_old_or_file_is_gone(ws):
    assert probe_file_edit(FileEditArgs(path="a.txt", old_str="line 5", new_str="line 5 and more"), ws) is None
    assert probe_file_edit(FileEditArgs(path="gone.txt", old_str="a", new_str="b"), ws) is None
