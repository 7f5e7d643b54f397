"""What a toolbox tool returns: one small record, the same for every tool.

`ToolResult` is the tool-level half of an observation (the runtime adds the decision and the
idempotency state). `error` is set when the tool refused or failed; the tool then guarantees
it changed nothing, except `bash_execute`, whose command may have done anything before it
failed or was killed. It is JSON-serialisable so that the idempotency store can keep it.
`Plan` and `Access` are how a tool tells the runtime what a call touches before it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolResult:
    output: str = ""
    error: str | None = None
    exit_status: int | None = None
    truncated: bool = False
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, payload: dict[str, Any]) -> ToolResult:
        known = {k: payload[k] for k in ("output", "error", "exit_status", "truncated", "data") if k in payload}
        return cls(**known)


def truncate_text(text: str, max_bytes: int) -> tuple[str, bool]:
    """`text` cut to at most `max_bytes` UTF-8 bytes plus a marker; (text, was_truncated)."""
    raw = text.encode("utf-8", errors="surrogatepass")
    if len(raw) <= max_bytes:
        return text, False
    kept = raw[:max_bytes].decode("utf-8", errors="ignore")
    return f"{kept}\n[... truncated {len(raw) - max_bytes} bytes ...]", True


@dataclass(frozen=True)
class Access:
    """One thing a call touches: a capability right (`read`, `write`, `exec`) on a real path."""

    right: str
    path: str


@dataclass(frozen=True)
class Plan:
    """A call bound to its arguments: what it touches (approved before it runs), how to run it."""

    accesses: tuple[Access, ...]
    run: Callable[[], ToolResult]
