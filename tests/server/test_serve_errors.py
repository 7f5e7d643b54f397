"""`surecall serve` on bad input: OpenAI-shaped errors with the right status, and the server goes on."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from helpers.serve_util import (  # noqa: E402
    KEY,
    MODEL,
    TOOLS,
    check_tool_calls,
    client,
    running,
    user,
    wait_idle,
    wait_released,
)

from surecall import AsyncLLM  # noqa: E402
from surecall.server import ServerSettings, build_app  # noqa: E402


@pytest.fixture(scope="module")
def engine():
    eng = AsyncLLM(num_blocks=512, max_num_seqs=8)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def app(engine):
    return build_app(engine, ServerSettings(model_name=MODEL, api_key=KEY))


@pytest.fixture(scope="module")
def base(app):
    with running(app) as url:
        yield url


LOREM = "lorem ipsum dolor sit amet "


def _fixed(repeats: int) -> dict:
    """A response_format whose only answer is a long constant: a request that takes a known while."""
    schema = {"type": "object", "properties": {"a": {"const": LOREM * repeats}}, "required": ["a"]}
    return {"type": "json_schema", "json_schema": {"name": "fixed", "schema": schema}}


def _post(base: str, body: bytes, key: str | None = KEY) -> tuple[int, dict, dict]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(f"{base}/v1/chat/completions", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.load(r), dict(r.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), dict(exc.headers)


def _shape(body: dict) -> dict:
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def test_malformed_json_is_a_400(base):
    status, body, _ = _post(base, b'{"model": "surecall-tiny", "messages": [')
    assert status == 400 and "Malformed JSON" in _shape(body)["message"]
    status, body, _ = _post(base, b"[1, 2]")
    assert status == 400 and "expected a JSON object" in _shape(body)["message"]


def test_unknown_fields_are_named(base):
    oa = client(base)
    with pytest.raises(openai.BadRequestError, match="bogus") as info:
        oa.chat.completions.create(model=MODEL, messages=user("hi"), extra_body={"bogus": 1})
    assert info.value.body["param"] == "bogus" and info.value.body["code"] == "unknown_parameter"
    with pytest.raises(openai.BadRequestError, match="messages.0.colour") as info:
        oa.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi", "colour": "red"}])
    assert info.value.body["param"] == "messages.0.colour"
    with pytest.raises(openai.BadRequestError, match="Missing required parameter: messages"):
        oa.chat.completions.create(model=MODEL, messages=openai.NOT_GIVEN)
    with pytest.raises(openai.BadRequestError, match="temperature") as info:
        oa.chat.completions.create(model=MODEL, messages=user("hi"), temperature=7)
    assert info.value.body["param"] == "temperature"


def test_a_tool_schema_that_fails_to_compile_names_tool_and_pointer(base):
    bad = {"type": "function", "function": {"name": "broken_tool", "parameters": {
        "type": "object", "properties": {"when": {"$ref": "#/$defs/missing"}}}}}
    with pytest.raises(openai.BadRequestError, match=r"broken_tool.*#/properties/when") as info:
        client(base).chat.completions.create(model=MODEL, messages=user("hi"), tools=TOOLS + [bad], max_tokens=64)
    assert info.value.body["param"] == "tools"


def test_bad_tool_choice_and_budget(base):
    oa = client(base)
    with pytest.raises(openai.BadRequestError, match="'nope' is not in tools") as info:
        oa.chat.completions.create(model=MODEL, messages=user("hi"), tools=TOOLS,
                                   tool_choice={"type": "function", "function": {"name": "nope"}})
    assert info.value.body["param"] == "tool_choice"
    with pytest.raises(openai.BadRequestError, match="shortest call") as info:
        oa.chat.completions.create(model=MODEL, messages=user("hi"), tools=TOOLS, tool_choice="required", max_tokens=2)
    assert info.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError, match="frequency_penalty"):
        oa.chat.completions.create(model=MODEL, messages=user("hi"), frequency_penalty=0.5)


def test_prompt_past_the_context_is_a_400(base):
    long = " ".join(["word"] * 4000)
    with pytest.raises(openai.BadRequestError, match="maximum context length") as info:
        client(base).chat.completions.create(model=MODEL, messages=user(long))
    assert info.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError, match="exceeds|maximum context") as info:
        client(base).chat.completions.create(model=MODEL, messages=user("hi"), max_tokens=100000)
    assert info.value.body["code"] == "context_length_exceeded"


def test_api_key_wrong_or_missing_is_a_401(base):
    with pytest.raises(openai.AuthenticationError, match="Incorrect API key"):
        client(base, key="wrong").chat.completions.create(model=MODEL, messages=user("hi"))
    status, body, _ = _post(base, json.dumps({"model": MODEL, "messages": user("hi")}).encode(), key=None)
    assert status == 401 and _shape(body)["code"] == "invalid_api_key" and "Missing API key" in body["error"]["message"]
    with pytest.raises(openai.AuthenticationError):
        client(base, key="wrong").models.list()


def test_unknown_model_is_a_404(base):
    with pytest.raises(openai.NotFoundError, match="gpt-4o") as info:
        client(base).chat.completions.create(model="gpt-4o", messages=user("hi"))
    assert info.value.body["code"] == "model_not_found" and info.value.body["param"] == "model"


def test_queue_full_is_a_429_with_retry_after(engine):
    app = build_app(engine, ServerSettings(model_name=MODEL, max_in_flight=1))
    with running(app) as url:
        aoa = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)

        long_answer = _fixed(12)  # about 250 tokens, however the model samples

        async def main():
            slow = asyncio.create_task(aoa.chat.completions.create(
                model=MODEL, messages=user("hi"), max_tokens=600, response_format=long_answer))
            for _ in range(200):  # bounded: until the slow request holds the one slot
                if app.state.handlers.active == 1:
                    break
                await asyncio.sleep(0.05)
            try:
                with pytest.raises(openai.RateLimitError, match="capacity") as info:
                    await aoa.chat.completions.create(model=MODEL, messages=user("hi"), max_tokens=8)
            finally:
                done = await slow
                await aoa.close()
            return info.value, done

        exc, done = asyncio.run(main())
        assert exc.response.headers["retry-after"] == "1" and exc.body["code"] == "queue_full"
        assert json.loads(done.choices[0].message.content) == {"a": LOREM * 12}


def test_client_disconnect_mid_stream_aborts_and_frees(base, engine, app):
    oa = client(base)
    stream = oa.chat.completions.create(model=MODEL, messages=user("hi"), max_tokens=1300,
                                        response_format=_fixed(40), stream=True)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    assert engine.stats()["num_running"] + engine.stats()["num_waiting"] == 1
    stream.close()
    stats = wait_idle(engine)
    assert stats["num_running"] == 0 and stats["free_blocks"] == stats["num_blocks"]
    deadline = time.monotonic() + 10  # the handler's finally runs after the engine let go (bounded wait)
    while app.state.handlers.active and time.monotonic() < deadline:
        time.sleep(0.05)
    assert wait_released(app.state.handlers) == 0  # its admission slot was given back


def test_bad_requests_never_disturb_good_ones(base):
    aoa = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0, timeout=120)

    async def good(i):
        resp = await aoa.chat.completions.create(model=MODEL, messages=user(f"show src/x{i}.py"), tools=TOOLS,
                                                 tool_choice="required", max_tokens=80, seed=i)
        return check_tool_calls(resp.choices[0].message.tool_calls)

    async def bad(i):
        try:
            await aoa.chat.completions.create(model=MODEL, messages=user("hi"), tools=TOOLS, tool_choice="required",
                                              max_tokens=1)
        except openai.BadRequestError:
            return "400"
        return "accepted"

    async def main():
        try:
            return await asyncio.gather(*[good(i) if i % 2 else bad(i) for i in range(12)])
        finally:
            await aoa.close()

    out = asyncio.run(main())
    assert out[0::2] == ["400"] * 6 and all(out[1::2])
    with urllib.request.urlopen(f"{base}/health", timeout=5) as r:
        assert r.status == 200


def test_client_that_leaves_a_plain_request_aborts_it(base, engine, app):
    body = json.dumps({"model": MODEL, "messages": user("hi"), "max_tokens": 1500,
                       "response_format": _fixed(60)}).encode()
    req = urllib.request.Request(f"{base}/v1/chat/completions", data=body, method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    with pytest.raises(OSError):  # the client gives up long before ~1200 tokens are generated
        urllib.request.urlopen(req, timeout=1.5)
    stats = wait_idle(engine, timeout_s=5)
    assert stats["num_running"] == 0 and stats["free_blocks"] == stats["num_blocks"]
    assert wait_released(app.state.handlers) == 0
