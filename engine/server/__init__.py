"""`surecall serve`: an OpenAI-compatible HTTP server on `AsyncLLM` (issue 18).

`app` (routes, auth, errors), `protocol` (the wire format as pydantic models), `handlers`
(chat and text completions on the engine), `streaming` (engine outputs -> deltas, SSE),
`metrics` (Prometheus text). `build_app(engine, settings)` is the entry point; the CLI
(`surecall.commands.serve`) binds it with uvicorn and handles SIGTERM.
"""

from surecall.server.app import build_app
from surecall.server.handlers import ServerSettings

__all__ = ["build_app", "ServerSettings"]
