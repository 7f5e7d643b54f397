"""file_view and file_edit: windows, notes, refusals, unchanged files, atomic and locked writes, orphans, probe."""

from __future__ import annotations

import fcntl
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from surecall.errors import PathOutsideWorkspace, ToolError
from surecall.toolbox.atomic import TEMP_PREFIX, sweep_workspace_temps
from surecall.toolbox.files import (
    MAX_FILE_BYTES,
    FileEditArgs,
    FileLimits,
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


# --- concurrent edits --------------------------------------------------------------------
NUM_SLOTS = 160


def _slot_file(ws):
    (ws / "shared.txt").write_text("".join(f"slot {i:03d}: old\n" for i in range(NUM_SLOTS)))


def _edit_slots(ws, slots):
    done = []
    for i in slots:
        try:
            edit(ws, path="shared.txt", old_str=f"slot {i:03d}: old", new_str=f"slot {i:03d}: new")
            done.append(i)
        except ToolError:
            pass
    return done


def _lost(ws, done):
    text = (ws / "shared.txt").read_text()
    return [i for i in done if f"slot {i:03d}: new" not in text]


def test_concurrent_edits_from_threads_lose_no_reported_update(ws):
    _slot_file(ws)
    with ThreadPoolExecutor(8) as pool:
        done = sorted(i for part in pool.map(lambda k: _edit_slots(ws, range(k, NUM_SLOTS, 8)), range(8)) for i in part)
    assert _lost(ws, done) == []
    assert done == list(range(NUM_SLOTS))  # the lock serialises them: none is refused


def test_concurrent_edits_from_processes_lose_no_reported_update(ws):
    _slot_file(ws)
    script = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        from surecall.errors import ToolError
        from surecall.toolbox.files import FileEditArgs, file_edit
        ws, k = Path(sys.argv[1]), int(sys.argv[2])
        for i in range(k, 160, 4):
            try:
                file_edit(FileEditArgs(path="shared.txt", old_str=f"slot {i:03d}: old", new_str=f"slot {i:03d}: new"), ws)
                print(i, flush=True)
            except ToolError:
                pass
        """
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(ws), str(k)], stdout=subprocess.PIPE, text=True)
        for k in range(4)
    ]
    done = sorted(int(line) for p in procs for line in p.communicate(timeout=120)[0].split())
    assert [p.returncode for p in procs] == [0, 0, 0, 0]
    assert _lost(ws, done) == []
    assert done == list(range(NUM_SLOTS))


def test_an_edit_waiting_on_a_held_lock_times_out_and_changes_nothing(ws):
    before = (ws / "a.txt").read_bytes()
    with open(ws / "a.txt", "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(ToolError, match=r"'a.txt' stayed locked by another edit for 0.2 s; the file is unchanged"):
            file_edit(FileEditArgs(path="a.txt", old_str="line 2\n", new_str="two\n"), ws, limits=FileLimits(lock_timeout_s=0.2))
    assert (ws / "a.txt").read_bytes() == before


def test_an_edit_refuses_when_another_writer_replaced_the_file_meanwhile(ws, monkeypatch):
    import surecall.toolbox.atomic as atomic

    real_write_temp = atomic._write_temp

    def write_temp_then_rewrite(dir_fd, payload, st, name):
        tmp = real_write_temp(dir_fd, payload, st, name)
        (ws / "a.txt").write_text("rewritten by a shell\n")  # not a file_edit: it takes no lock
        return tmp

    monkeypatch.setattr(atomic, "_write_temp", write_temp_then_rewrite)
    with pytest.raises(ToolError, match="'a.txt' was changed by another writer during the edit; the edit was not applied"):
        edit(ws, path="a.txt", old_str="line 2\n", new_str="two\n")
    assert (ws / "a.txt").read_text() == "rewritten by a shell\n"
    assert sorted(p.name for p in ws.iterdir()) == ["a.txt"]


# --- size of the result ------------------------------------------------------------------
def test_an_edit_whose_result_would_be_huge_is_refused_before_it_is_built(ws):
    (ws / "small.txt").write_bytes(b"a" * 4096)
    with pytest.raises(ToolError, match=r"would make 'small.txt' 268435456 bytes \(4096 replacement\(s\) by 65536 bytes\), "
                       r"over the 8388608-byte limit of file_edit; the file is unchanged"):
        edit(ws, path="small.txt", old_str="a", new_str="b" * 65536, allow_multiple=True)
    assert (ws / "small.txt").read_bytes() == b"a" * 4096


def test_the_result_limit_is_configurable_and_validated(ws):
    args = FileEditArgs(path="a.txt", old_str="line 2\n", new_str="two\n" * 50)
    with pytest.raises(ToolError, match="over the 100-byte limit of file_edit"):
        file_edit(args, ws, limits=FileLimits(max_result_bytes=100))
    assert file_edit(args, ws, limits=FileLimits(max_result_bytes=10_000)).data["num_replacements"] == 1
    with pytest.raises(ValueError, match="Invalid FileLimits.max_result_bytes: expected a positive integer, got 0"):
        FileLimits(max_result_bytes=0)
    with pytest.raises(ValueError, match="Invalid FileLimits.lock_timeout_s"):
        FileLimits(lock_timeout_s=float("nan"))


# --- temporary files orphaned by a kill ----------------------------------------------------
KILLED_EDIT = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from surecall.toolbox.files import FileEditArgs, file_edit
    os.rename = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)  # die between fsync and rename
    file_edit(FileEditArgs(path="a.txt", old_str="line 3\\n", new_str="three\\n"), Path(sys.argv[1]))
    """
)


def _temps(directory):
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(TEMP_PREFIX))


def _kill_mid_edit(ws):
    proc = subprocess.run([sys.executable, "-c", KILLED_EDIT, str(ws)], capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert len(_temps(ws)) == 1  # the orphan


def test_a_temp_file_orphaned_by_sigkill_is_swept_by_the_next_edit(ws):
    before = (ws / "a.txt").read_bytes()
    _kill_mid_edit(ws)
    assert (ws / "a.txt").read_bytes() == before
    (ws / "b.txt").write_text("bee\n")
    edit(ws, path="b.txt", old_str="bee", new_str="wasp")
    assert _temps(ws) == []


def test_orphans_are_swept_across_the_workspace_and_live_temps_are_kept(ws):
    (ws / "sub").mkdir()
    (ws / "sub" / "a.txt").write_text("line 3\n")
    _kill_mid_edit(ws / "sub")
    live = ws / f"{TEMP_PREFIX}{os.getpid()}.{'0' * 16}.a.txt"  # a running edit of this process
    live.write_text("in progress")
    assert sweep_workspace_temps(ws) == 1
    assert _temps(ws / "sub") == [] and _temps(ws) == [live.name]
    old = time.time() - 3600  # no edit runs for an hour: an orphan whatever its pid
    os.utime(live, (old, old))
    assert sweep_workspace_temps(ws) == 1 and _temps(ws) == []


# --- the approved path is the one opened ---------------------------------------------------
def test_a_symlink_swapped_in_after_approval_is_refused_even_inside_the_workspace(ws):
    (ws / "granted").mkdir()
    (ws / "granted" / "x.txt").write_text("granted\n")
    (ws / "private").mkdir()
    (ws / "private" / "x.txt").write_text("private\n")
    approved = resolve_in_workspace(ws, "granted/x.txt")
    (ws / "granted").rename(ws / "granted_old")
    (ws / "granted").symlink_to(ws / "private")
    with pytest.raises(ToolError, match=r"changed while the tool ran \('granted' is now a symbolic link\); nothing was done"):
        file_view(FileViewArgs(path="granted/x.txt"), ws, approved=approved)
    with pytest.raises(ToolError, match="is now a symbolic link"):
        file_edit(FileEditArgs(path="granted/x.txt", old_str="private", new_str="owned"), ws, approved=approved)
    assert (ws / "private" / "x.txt").read_text() == "private\n"


def test_a_fifo_is_refused_without_hanging(ws):
    os.mkfifo(ws / "pipe")
    with pytest.raises(ToolError, match="is not a regular file"):
        view(ws, path="pipe")


def test_coding_tools_sweep_orphans_at_start_and_pass_the_file_limits_on(ws):
    from surecall.toolbox.catalog import coding_tools

    _kill_mid_edit(ws)
    tools = {t.name: t for t in coding_tools(ws, file_limits=FileLimits(max_result_bytes=100))}
    assert _temps(ws) == []
    plan = tools["file_edit"].handler.plan({"path": "a.txt", "old_str": "line 2\n", "new_str": "two\n" * 50})
    assert [a.path for a in plan.accesses] == [str(ws / "a.txt")] * 2
    with pytest.raises(ToolError, match="over the 100-byte limit of file_edit"):
        plan.run()


def test_an_edit_gives_up_when_the_file_keeps_being_replaced(ws, monkeypatch):
    import surecall.toolbox.atomic as atomic

    monkeypatch.setattr(atomic, "_current", lambda dir_fd, name: None)  # as if replaced after every lock
    with pytest.raises(ToolError, match="'a.txt' kept being replaced for 0.1 s; the file is unchanged"):
        file_edit(FileEditArgs(path="a.txt", old_str="line 2\n", new_str="two\n"), ws, limits=FileLimits(lock_timeout_s=0.1))


def test_the_file_tools_run_concurrently_from_threads_on_one_workspace(ws):
    from surecall.toolbox.search import GrepSearchArgs, grep_search

    for k in range(8):
        (ws / f"t{k}.txt").write_text(f"thread {k} round 0\n")

    def rounds(k):
        for r in range(15):
            edit(ws, path=f"t{k}.txt", old_str=f"round {r}\n", new_str=f"round {r + 1}\n")
            assert view(ws, path=f"t{k}.txt").output.startswith(f"     1\tthread {k} round {r + 1}")
            found = grep_search(GrepSearchArgs(pattern=rf"^thread {k} round {r + 1}$"), ws).data["matches"]
            assert [m["path"] for m in found] == [f"t{k}.txt"]
        return k

    with ThreadPoolExecutor(8) as pool:
        assert sorted(pool.map(rounds, range(8))) == list(range(8))
