"""The HTTP app: routes, the API key, JSON parsing and validation, errors in OpenAI's shape.

`build_app(engine, settings)` returns a Starlette app over an `AsyncLLM`: POST
/v1/chat/completions and /v1/completions, GET /v1/models, /health and /metrics. Bodies are
parsed here and validated by the pydantic models in `protocol`, so a malformed body or an
unknown field is a 400 naming the field; every failure, expected or not, leaves as
`{"error": {...}}` with its status, and no request can take the server down. /health and
/metrics need no key; /v1/* needs `Authorization: Bearer KEY` when a key is set.
It does not bind sockets or handle signals (`surecall.commands.serve`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from surecall.server import protocol as wire
from surecall.server.handlers import ApiError, Handlers, ServerSettings
from surecall.server.metrics import Metrics

log = logging.getLogger("surecall.server")
MAX_BODY_BYTES = 8 << 20


def build_app(engine, settings: ServerSettings | None = None, *, owns_engine: bool = False) -> Starlette:
    """The app; with `owns_engine` its shutdown also shuts the engine down."""
    settings = settings or ServerSettings()
    metrics = Metrics()
    handlers = Handlers(engine, settings, metrics)

    async def chat(request: Request) -> Response:
        return await _serve(request, "chat", wire.ChatCompletionRequest, handlers.chat)

    async def completions(request: Request) -> Response:
        return await _serve(request, "completions", wire.CompletionRequest, handlers.completion)

    async def _serve(request: Request, endpoint: str, model, handle) -> Response:
        started = time.perf_counter()
        try:
            _authorize(request, settings.api_key)
            req = model.model_validate(await _json_body(request))
            result = await _unless_client_leaves(request, handle(req))
            if result is None:
                metrics.num_aborted += 1
                return Response(status_code=499)  # nobody is listening; the requests were aborted
            response = JSONResponse(result) if isinstance(result, dict) else \
                StreamingResponse(result, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        except ValidationError as exc:
            response = _error(_validation_error(exc))
        except ApiError as exc:
            response = _error(exc)
        except Exception as exc:  # noqa: BLE001 - the server never dies from a request
            log.exception("request failed")
            response = _error(ApiError(500, f"internal error: {type(exc).__name__}: {exc}", "server_error"))
        metrics.count_request(endpoint, response.status_code)
        log.debug("%s %s %.3fs", endpoint, response.status_code, time.perf_counter() - started)
        return response

    async def models(request: Request) -> Response:
        try:
            _authorize(request, settings.api_key)
        except ApiError as exc:
            return _error(exc)
        card = {"id": settings.model_name, "object": "model", "created": 0, "owned_by": "surecall",
                "max_model_len": engine.core.max_model_len}
        return JSONResponse({"object": "list", "data": [card]})

    async def health(request: Request) -> Response:
        if engine.is_closed:
            return JSONResponse({"status": "shutting down"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def prometheus(request: Request) -> Response:
        stats = engine.stats()
        grammar = {"compiles": engine.num_compiles, "hits": engine.num_grammar_lookups - engine.num_compiles,
                   "compile_s": engine.compile_s}
        return PlainTextResponse(metrics.render(stats, grammar, handlers.active),
                                 media_type="text/plain; version=0.0.4")

    async def not_found(request: Request, exc) -> Response:
        return _error(ApiError(404, f"Unknown route {request.method} {request.url.path}", code="not_found"))

    async def method_not_allowed(request: Request, exc) -> Response:
        return _error(ApiError(405, f"Method {request.method} is not allowed on {request.url.path}"))

    async def crashed(request: Request, exc) -> Response:
        return _error(ApiError(500, f"internal error: {type(exc).__name__}", "server_error"))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        if owns_engine:  # after uvicorn's grace period: what still runs ends with "abort"
            await asyncio.to_thread(engine.shutdown)

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={404: not_found, 405: method_not_allowed, 500: crashed})
    app.state.handlers, app.state.metrics, app.state.engine = handlers, metrics, engine
    return app


async def _unless_client_leaves(request: Request, work, poll_s: float = 0.25):
    """`work`'s result, or None once the client has disconnected (the work is cancelled: its
    engine requests are aborted and their KV blocks freed)."""
    task = asyncio.ensure_future(work)
    while True:
        done, _ = await asyncio.wait({task}, timeout=poll_s)
        if done:
            return task.result()
        if await request.is_disconnected():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return None


def _authorize(request: Request, key: str | None) -> None:
    if key is None:
        return
    header = request.headers.get("authorization", "")
    given = header[7:] if header.lower().startswith("bearer ") else ""
    if not given:
        raise ApiError(401, "Missing API key: send 'Authorization: Bearer KEY'", code="invalid_api_key")
    if not hmac.compare_digest(given.encode(), key.encode()):
        raise ApiError(401, "Incorrect API key provided", code="invalid_api_key")


async def _json_body(request: Request):
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        raise ApiError(413, f"Request body of {len(body)} bytes exceeds the {MAX_BODY_BYTES}-byte limit")
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"Malformed JSON body: {exc}", code="invalid_json") from exc
    if not isinstance(data, dict):
        raise ApiError(400, f"Invalid body: expected a JSON object, got {type(data).__name__}")
    return data


def _validation_error(exc: ValidationError) -> ApiError:
    """The first pydantic error as a 400 naming its field (dotted path, as OpenAI's `param`)."""
    err = exc.errors()[0]
    loc = [str(p) for p in err["loc"] if not str(p).startswith(("function-", "literal[", "list[", "str", "dict["))]
    param = ".".join(loc) or None
    if err["type"] == "extra_forbidden":
        return ApiError(400, f"Unrecognized request argument supplied: {param}", param=param,
                        code="unknown_parameter")
    if err["type"] == "missing":
        return ApiError(400, f"Missing required parameter: {param}", param=param, code="missing_required_parameter")
    return ApiError(400, f"Invalid value for {param}: {err['msg']}", param=param, code="invalid_value")


def _error(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)
