"""The CLI boundary: every bad input is one line on stderr naming what and where, and exit 2.

Each case runs `surecall.cli.main` with argv (or a subprocess where the case is about the
process: a closed pipe, a FIFO that would block). "One line" means stderr has exactly one
non-empty line and no traceback.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from surecall.cli import main
from surecall.commands import resolve
from surecall.errors import ToolDefinitionError

TINY_SCHEMA = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"],
               "additionalProperties": False}


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def schema(tmp_path):
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(TINY_SCHEMA))
    return path


@pytest.fixture
def deep(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    return path


# --- flags checked before anything loads ------------------------------------------------------
@pytest.mark.parametrize("argv, match", [
    (["compile", "S", "--tokenizer", "shared:gpt2", "--format", "xml"], "argument --format: expected one of .*got 'xml'"),
    (["sample", "S", "--tokenizer", "shared:gpt2", "--n", "-3"], "argument --n: expected an integer >= 0, got -3"),
    (["sample", "S", "--tokenizer", "shared:gpt2", "--seed", "-5"], "argument --seed: expected an integer >= 0, got -5"),
    (["sample", "S", "--tokenizer", "shared:gpt2", "--max-tokens", "0"], "argument --max-tokens: expected an integer >= 1"),
    (["breakeven", "--prompts", "missing.jsonl"], "argument --prompts: cannot read missing.jsonl: No such file"),
    (["breakeven", "--device", "tpu"], "argument --device: expected cpu, cuda or cuda:N, got 'tpu'"),
    (["breakeven", "--batch", "0"], "argument --batch: expected an integer >= 1, got 0"),
    (["breakeven", "--temperature", "-1"], "argument --temperature: expected a finite number >= 0, got -1"),
    (["breakeven", "--temperature", "nan"], "argument --temperature: expected a finite number >= 0, got nan"),
    (["run", "--out", "/proc/nope"], "argument --out: cannot create output folder /proc/nope"),
    (["run", "--batch", "x"], "argument --batch: expected an integer >= 1, got 'x'"),
    (["catalog-cost", "--tokenizer", "shared:gpt2", "--tools", "seed", "--turns", "-1"],
     "argument --turns: expected an integer >= 0, got -1"),
    (["vocab", "shared:gpt2", "--logits-width", "0"], "argument --logits-width: expected an integer >= 1"),
    (["no-such-command"], "invalid choice: 'no-such-command'"),
])
def test_bad_flags_are_one_line_and_exit_2(argv, match, capsys, schema):
    argv = [str(schema) if a == "S" else a for a in argv]
    assert main(argv) == 2
    line = one_error_line(capsys)
    assert line.startswith("surecall")
    assert re.search(match, line), line


def test_cuda_without_a_gpu(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: the no-GPU refusal cannot be exercised")
    assert main(["breakeven", "--device", "cuda"]) == 2
    assert "no CUDA GPU is visible to torch; use --device cpu" in one_error_line(capsys)
    assert main(["run", "--device", "cuda:0"]) == 2
    assert "no CUDA GPU is visible" in one_error_line(capsys)


def test_cuda_index_past_the_visible_devices(capsys):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    assert main(["breakeven", "--device", f"cuda:{torch.cuda.device_count()}"]) == 2
    assert "CUDA device(s) visible" in one_error_line(capsys)


def test_out_that_is_a_file(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["breakeven", "--out", str(blocker / "sub")]) == 2
    assert "cannot create output folder" in one_error_line(capsys)


# --- input files: refused before they are read ----------------------------------------------------
@pytest.mark.parametrize("command", ["lint", "compile", "sample"])
def test_200k_deep_json(command, deep, capsys):
    argv = [command, str(deep)] + ([] if command == "lint" else ["--tokenizer", "shared:gpt2"])
    assert main(argv) == 2
    assert f"{deep}: JSON nested too deeply to parse" in one_error_line(capsys)


def test_json_deeper_than_the_walkers_allow(tmp_path, capsys):
    path = tmp_path / "deep.json"
    nested = {"type": "object"}
    for _ in range(resolve.MAX_JSON_DEPTH):
        nested = {"type": "object", "properties": {"x": nested}}
    path.write_text(json.dumps(nested))
    assert main(["lint", str(path)]) == 2
    assert f"over the limit of {resolve.MAX_JSON_DEPTH}" in one_error_line(capsys)


def test_device_file(capsys):
    assert main(["lint", "/dev/zero"]) == 2
    assert "refusing to read /dev/zero: it is a character device" in one_error_line(capsys)
    assert main(["vocab", "/dev/zero"]) == 2
    assert "refusing to read /dev/zero: it is a character device" in one_error_line(capsys)


def test_directory_as_a_schema_file(tmp_path, capsys):
    assert main(["lint", str(tmp_path)]) == 2
    assert "it is a directory, expected a regular file" in one_error_line(capsys)


def test_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for argv in (["lint", str(fifo)], ["compile", str(fifo), "--tokenizer", "shared:gpt2"],
                 ["catalog-cost", "--tokenizer", str(fifo), "--tools", "seed"],
                 ["breakeven", "--prompts", str(fifo)]):
        proc = subprocess.run([sys.executable, "-m", "surecall", *argv], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
        assert "it is a FIFO, expected a regular file" in proc.stderr


def test_empty_file(tmp_path, capsys):
    empty, blank, nothing = tmp_path / "empty.json", tmp_path / "blank.jsonl", tmp_path / "list.json"
    empty.write_text("")
    blank.write_text("\n  \n")
    nothing.write_text("[]")
    assert main(["lint", str(empty)]) == 2
    assert f"{empty} is empty" in one_error_line(capsys)
    assert main(["lint", str(blank)]) == 2
    assert f"{blank} is empty" in one_error_line(capsys)
    assert main(["lint", str(nothing)]) == 2
    assert "holds no tool definitions or schemas" in one_error_line(capsys)
    with pytest.raises(ToolDefinitionError, match="holds no tool definitions"):
        resolve.load_tools(str(nothing))
    assert main(["compile", str(nothing), "--tokenizer", "x"]) == 2
    assert "got an empty list" in one_error_line(capsys)


def test_oversized_file(tmp_path, capsys, monkeypatch):
    path = tmp_path / "big.json"
    path.write_text(json.dumps(TINY_SCHEMA))
    monkeypatch.setenv(resolve.MAX_INPUT_BYTES_ENV, "10")
    assert main(["lint", str(path)]) == 2
    line = one_error_line(capsys)
    assert f"over the 10-byte input limit (set {resolve.MAX_INPUT_BYTES_ENV} to raise it)" in line
    monkeypatch.setenv(resolve.MAX_INPUT_BYTES_ENV, "lots")
    assert main(["lint", str(path)]) == 2
    assert f"Invalid {resolve.MAX_INPUT_BYTES_ENV}: expected a positive integer" in one_error_line(capsys)
    assert main(["breakeven", "--prompts", str(path)]) == 2
    assert f"Invalid {resolve.MAX_INPUT_BYTES_ENV}" in one_error_line(capsys)


def test_not_utf8(tmp_path, capsys):
    path = tmp_path / "latin1.json"
    path.write_bytes(b'{"description": "caf\xe9"}')
    assert main(["lint", str(path)]) == 2
    assert "not UTF-8 text (byte 20)" in one_error_line(capsys)


def test_catalog_cost_missing_tools_file(capsys):
    assert main(["catalog-cost", "--tokenizer", "x", "--tools", "/no/such/tools.json"]) == 2
    assert "tools file not found: /no/such/tools.json" in one_error_line(capsys)


# --- the boundary itself ------------------------------------------------------------------------
def test_unexpected_exception_is_one_line_exit_1(monkeypatch, capsys, schema):
    import surecall.commands.lint as lint_command

    def explode(args):
        raise KeyError("boom\nsecond line")

    monkeypatch.setattr(lint_command, "run", explode)
    monkeypatch.delenv("SURECALL_DEBUG", raising=False)
    assert main(["lint", str(schema)]) == 1
    line = one_error_line(capsys)
    assert line.startswith("surecall lint: error: internal error (KeyError: ")
    assert "please report it" in line and "SURECALL_DEBUG=1" in line
    monkeypatch.setenv("SURECALL_DEBUG", "1")
    with pytest.raises(KeyError, match="boom"):
        main(["lint", str(schema)])


def test_keyboard_interrupt_exits_130(monkeypatch, capsys, schema):
    import surecall.commands.lint as lint_command

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(lint_command, "run", interrupted)
    assert main(["lint", str(schema)]) == 130
    assert one_error_line(capsys) == "surecall lint: error: interrupted"


def test_help_and_version_still_exit_0(capsys):
    assert main(["--version"]) == 0
    assert main(["lint", "--help"]) == 0
    assert main([]) == 0
    assert "usage" in capsys.readouterr().out


def test_broken_pipe_exits_quietly():
    """`surecall vocab --json | head -c1`: the reader is gone before the write; no traceback."""
    from surecall.models import default_model_dir

    proc = subprocess.Popen([sys.executable, "-m", "surecall", "vocab", str(default_model_dir()), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # like `head -c1` gone before the first write: every write gets EPIPE
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert err == "", err
