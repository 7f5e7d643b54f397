"""Typed user-facing errors, shared by every layer.

Each error names where (a file, a JSON pointer, a tool, a row) and what to do. This module
imports nothing of ours, so any layer may raise these. The server maps them to 4xx responses
with the same message.
"""

from __future__ import annotations


class SurecallError(Exception):
    """Base class of every error surecall raises on bad input."""


# --- vocabularies and models -------------------------------------------------------------
class VocabError(SurecallError):
    """A tokenizer file is missing, unreadable, of an unknown format, or corrupt."""


class ModelLoadError(SurecallError):
    """A model directory is missing, of an unknown architecture, or does not match its tokenizer."""


# --- grammars ----------------------------------------------------------------------------
class SchemaError(SurecallError):
    """A schema is not valid JSON Schema 2020-12 (carries the JSON pointer and keyword)."""

    def __init__(self, message: str, pointer: str = "", keyword: str | None = None):
        self.reason = message  # without the pointer and keyword the full message appends
        self.pointer = pointer
        self.keyword = keyword
        where = f" at {pointer or '/'}" if pointer is not None else ""
        kw = f" (keyword {keyword!r})" if keyword else ""
        super().__init__(f"{message}{where}{kw}")


class UnsupportedSchema(SchemaError):
    """A valid schema uses something the grammar compiler cannot enforce or relax safely."""


class CompileBudgetExceeded(SurecallError):
    """A grammar compile ran past its configured time or memory budget."""


class MalformedCall(SurecallError):
    """A model's tool-call text does not parse in its tool format (the message says why)."""


# --- kernels and decoding ----------------------------------------------------------------
class KernelInputError(SurecallError, ValueError):
    """Mismatched shapes, dtypes or devices, an out-of-range state, or a row that allows nothing."""


class RequestError(SurecallError, ValueError):
    """A generate request is malformed (empty prompt, budget too small for any call, ...)."""


# --- dispatch ----------------------------------------------------------------------------
class ToolDefinitionError(SurecallError):
    """A tool definition is malformed (bad schema, missing name, unknown side-effect level)."""


class UnknownToolError(SurecallError):
    """A call names a tool that is not in the catalog."""


class ArgumentValidationError(SurecallError):
    """A call's arguments fail the tool's schema; `.errors` lists every failure with its path."""

    def __init__(self, message: str, errors: list[tuple[str, str]] | None = None):
        self.errors = list(errors or [])
        super().__init__(message)


class CapabilityError(SurecallError):
    """A capability is tampered, expired, or wider than its parent."""


class IdempotencyConflict(SurecallError):
    """One idempotency key arrived with different arguments, or a record is not in a state that allows the step."""


class StoreUnavailable(SurecallError):
    """The idempotency store cannot be reached; nothing was claimed."""


class LeaseLost(IdempotencyConflict):
    """The caller no longer holds the call's lease: it lapsed, or a newer claim (a higher
    fencing token) took the record over. A stale owner must not run or record the call."""


class StoreCorrupted(StoreUnavailable):
    """A stored record cannot be read back (garbage JSON, an unknown state, a missing or
    non-numeric field, a key of the wrong type): nothing was changed; inspect or delete it."""


class StoreNotDurable(StoreUnavailable):
    """The Redis server may lose records (no AOF, or an eviction policy): refused at connect."""


class SandboxUnavailable(SurecallError):
    """The shell sandbox (bubblewrap) cannot run and unsandboxed execution was not allowed."""


class ToolError(SurecallError):
    """A tool refused its input (binary or huge file, ambiguous edit, bad regex); nothing was changed."""


class PathOutsideWorkspace(ToolError):
    """A path resolves outside the workspace (`..`, an absolute path elsewhere, a symlink out)."""
