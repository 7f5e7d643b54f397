"""File tools under a concurrent path swap: a workspace directory or file exchanged for a symlink out.

A separate process (the kind of thing a `bash_execute` command can run) loops
`renameat2(RENAME_EXCHANGE)` between the directory `ws/d` and a symlink `ws/swap -> outside`
(or between the file `ws/d/f.txt` and a symlink to the outside file), while this process calls
file_view, file_edit and grep_search on `d/f.txt`. Every call must see the inside file or refuse;
none may read or write the outside one. Counts are printed (run with `-s`) so the figure can be
quoted; `SURECALL_RACE_CALLS` changes the number of calls.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from surecall.errors import ToolError
from surecall.toolbox.files import FileEditArgs, FileViewArgs, file_edit, file_view
from surecall.toolbox.search import GrepSearchArgs, grep_search

NUM_CALLS = int(os.environ.get("SURECALL_RACE_CALLS", "1000"))

SWAPPER = textwrap.dedent(
    """
    import ctypes, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    a, b = (os.fsencode(p) for p in sys.argv[1:3])
    AT_FDCWD, RENAME_EXCHANGE = -100, 2
    print("ready", flush=True)
    while True:
        if libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) != 0:
            sys.exit(f"renameat2 failed: {os.strerror(ctypes.get_errno())}")
    """
)


@pytest.fixture(params=["directory", "file"])
def swapped(request, tmp_path):
    """(workspace, outside file): `ws/d` and the symlink `ws/swap -> outside` trade places
    nonstop (or, for "file", `ws/d/f.txt` and the symlink `ws/d/flink -> outside/f.txt`)."""
    if sys.platform != "linux":
        pytest.skip("renameat2(RENAME_EXCHANGE) is Linux-only")
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    (ws / "d").mkdir(parents=True)
    outside.mkdir()
    (ws / "d" / "f.txt").write_text("inside ping\n")
    (outside / "f.txt").write_text("SECRET ping\n")
    if request.param == "directory":
        (ws / "swap").symlink_to(outside)
        pair = (ws / "d", ws / "swap")
    else:
        (ws / "d" / "flink").symlink_to(outside / "f.txt")
        pair = (ws / "d" / "f.txt", ws / "d" / "flink")
    proc = subprocess.Popen(
        [sys.executable, "-c", SWAPPER, *map(str, pair)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    if proc.stdout.readline().strip() != "ready":
        pytest.fail(f"the swapper did not start: {proc.stderr.read()}")
    time.sleep(0.05)
    yield ws, outside / "f.txt"
    proc.kill()
    proc.wait()
    if proc.returncode not in (-9, None):
        pytest.fail(f"the swapper stopped early: {proc.stderr.read()}")


def _outside_state(path):
    st = os.stat(path)
    return st.st_ino, st.st_mtime_ns, path.read_bytes()


def test_file_view_never_returns_the_outside_file_during_a_swap(swapped):
    ws, _secret = swapped
    num_calls = 3 * NUM_CALLS  # views are cheap, and each one has a narrow window
    num_leaks = num_refused = num_raw_errors = 0
    for _ in range(num_calls):
        try:
            num_leaks += "SECRET" in file_view(FileViewArgs(path="d/f.txt"), ws).output
        except ToolError:
            num_refused += 1
        except OSError:
            num_raw_errors += 1
    print(f"\nfile_view under swap: {num_leaks}/{num_calls} leaked, {num_refused} refused, {num_raw_errors} raw OSError")
    assert (num_leaks, num_raw_errors) == (0, 0)
    assert num_refused < num_calls  # the inside file was still read most of the time


def test_file_edit_never_writes_the_outside_file_during_a_swap(swapped):
    ws, secret = swapped
    before = _outside_state(secret)
    num_calls = 2 * NUM_CALLS
    num_outside_writes = num_applied = num_raw_errors = 0
    words = ["ping", "pong"]
    for _ in range(num_calls):
        try:
            file_edit(FileEditArgs(path="d/f.txt", old_str=words[0], new_str=words[1]), ws)
            num_applied += 1
            words.reverse()
        except ToolError as exc:
            if "not found" in str(exc):  # the inside file holds the other word
                words.reverse()
        except OSError:
            num_raw_errors += 1
        now = _outside_state(secret)
        if now != before:
            num_outside_writes, before = num_outside_writes + 1, now
    print(
        f"\nfile_edit under swap: {num_outside_writes}/{num_calls} wrote outside, {num_applied} applied, "
        f"{num_raw_errors} raw OSError"
    )
    assert (num_outside_writes, num_raw_errors) == (0, 0)
    assert secret.read_text() == "SECRET ping\n"
    assert num_applied > 0


def test_grep_search_never_reads_the_outside_file_during_a_swap(swapped):
    ws, _secret = swapped
    num_calls = NUM_CALLS
    num_leaks = num_raw_errors = 0
    for _ in range(num_calls):
        try:
            matches = grep_search(GrepSearchArgs(pattern="ping"), ws).data["matches"]
        except ToolError:
            continue
        except OSError:
            num_raw_errors += 1
            continue
        num_leaks += any("SECRET" in m["text"] for m in matches)
    print(f"\ngrep_search under swap: {num_leaks}/{num_calls} leaked, {num_raw_errors} raw OSError")
    assert (num_leaks, num_raw_errors) == (0, 0)
