"""`surecall serve` as a process: it binds loopback, serves, and on SIGTERM finishes or aborts
in-flight requests within the grace period and exits 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from helpers.serve_util import MODEL, free_port, user  # noqa: E402

from surecall.cli import main  # noqa: E402

LOREM = "lorem ipsum dolor sit amet "


def _fixed(repeats: int) -> dict:
    schema = {"type": "object", "properties": {"a": {"const": LOREM * repeats}}, "required": ["a"]}
    return {"type": "json_schema", "json_schema": {"name": "fixed", "schema": schema}}


def _start(*flags: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "surecall", "serve", "--port", str(port), *flags],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"surecall serve exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                if json.load(r)["status"] == "ok":
                    return proc, base
        except OSError:
            time.sleep(0.2)
    _stop(proc)
    raise RuntimeError("surecall serve did not become healthy within 90 s")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture
def served(request):
    proc, base = _start(*request.param)
    try:
        yield proc, base
    finally:
        _stop(proc)
        proc.stderr.close()


@pytest.mark.parametrize("served", [("--api-key", "k1", "--grace-s", "20")], indirect=True)
def test_sigterm_finishes_in_flight_requests_and_exits_0(served):
    proc, base = served
    oa = openai.OpenAI(base_url=f"{base}/v1", api_key="k1", max_retries=0, timeout=60)
    stream = oa.chat.completions.create(model=MODEL, messages=user("hi"), max_tokens=400,
                                        response_format=_fixed(8), stream=True)
    chunks = []
    for chunk in stream:
        chunks.append(chunk)
        if len(chunks) == 3:
            proc.send_signal(signal.SIGTERM)  # mid-stream
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert json.loads(text) == {"a": LOREM * 8}  # the in-flight request finished within the grace
    assert proc.wait(timeout=30) == 0
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{base}/health", timeout=2)


@pytest.mark.parametrize("served", [("--grace-s", "0.5")], indirect=True)
def test_sigterm_aborts_what_outlives_the_grace_and_exits_0(served):
    proc, base = served
    oa = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=60)
    got: list = []

    def consume():
        try:
            for chunk in oa.chat.completions.create(model=MODEL, messages=user("hi"), max_tokens=1500,
                                                    response_format=_fixed(40), stream=True):
                got.append(chunk)
        except Exception as exc:  # noqa: BLE001 - the server cut the stream: expected here
            got.append(exc)

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    deadline = time.monotonic() + 30
    while len(got) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert time.monotonic() - started < 20  # well before the ~800-token answer could have finished
    reader.join(timeout=10)
    assert not reader.is_alive()
    text = "".join(c.choices[0].delta.content or "" for c in got if not isinstance(c, Exception) and c.choices)
    assert 0 < len(text) < len(LOREM * 40)  # it was cut: aborted, not waited for


def test_serve_flags_are_checked_before_loading(capsys):
    assert main(["serve", "--port", "-1"]) == 2
    assert "--port" in capsys.readouterr().err
    assert main(["serve", "--model", "/nonexistent/model"]) == 2
    assert "Invalid --model" in capsys.readouterr().err
