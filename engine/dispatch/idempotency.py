"""Idempotency keys and execution records: a call runs at most once, even across crashes.

`derive_key(trajectory_id, turn, call_id, tool, args, namespace=...)` names the call slot (scoped
to a namespace: one runtime, workspace or tenant, so runtimes sharing a store never see each
other's records) and fingerprints its arguments, both SHA-256 over RFC 8785 canonical JSON (the `rfc8785` package, never
`json.dumps(sort_keys=True)`). The key is `<slot>.<fingerprint>`: the store keys records by the
slot and refuses a second claim of the slot with another fingerprint (`IdempotencyConflict`).
Record states: UNSEEN -> IN_FLIGHT (leased) -> COMPLETED (stored result) | IN_DOUBT (failed or
lease expired: the effect is unknown; never re-run silently) -> settled by a probe into
COMPLETED or NOT_EXECUTED (which may be claimed again). Stores live in `stores.py`.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import rfc8785

from surecall.errors import ArgumentValidationError, IdempotencyConflict

KEY_VERSION = "k2"  # k2: the slot includes the namespace


class RecordState(str, enum.Enum):
    UNSEEN = "UNSEEN"
    IN_FLIGHT = "IN_FLIGHT"
    COMPLETED = "COMPLETED"
    IN_DOUBT = "IN_DOUBT"
    NOT_EXECUTED = "NOT_EXECUTED"


@dataclass(frozen=True)
class Record:
    """One execution record. `result` is the stored JSON result (COMPLETED), `error` the failure
    text (IN_DOUBT), `lease_expires_at` unix seconds (IN_FLIGHT), `attempts` claims granted."""

    key: str
    state: RecordState
    fingerprint: str = ""
    owner: str = ""
    lease_expires_at: float = 0.0
    result: Any = None
    error: str = ""
    attempts: int = 0
    updated_at: float = 0.0


@dataclass(frozen=True)
class Claim:
    """The answer to `store.claim`: `acquired` means the caller now holds the lease and must run
    the call, then `complete`, `fail` or `release` it with `owner`. Otherwise `record` says why:
    COMPLETED (return its result), IN_FLIGHT (someone else runs it), IN_DOUBT (settle first)."""

    acquired: bool
    record: Record

    @property
    def owner(self) -> str:
        return self.record.owner


@dataclass(frozen=True)
class ProbeOutcome:
    """What a reconciliation probe found: executed True (COMPLETED with `result`), False
    (NOT_EXECUTED) or None (cannot tell: the record stays IN_DOUBT)."""

    executed: bool | None
    result: Any = None


# A probe reads the environment for an IN_DOUBT record; it may return a ProbeOutcome or a bool/None.
ProbeFn = Callable[[Record], "ProbeOutcome | bool | None"]


def canonical_json(value: Any) -> bytes:
    """RFC 8785 (JCS) bytes of `value`; ArgumentValidationError for what JCS cannot represent."""
    try:
        return rfc8785.dumps(value)
    except rfc8785.IntegerDomainError as exc:
        raise ArgumentValidationError(f"cannot canonicalise: {exc} (integers must be within 2^53)", [("", str(exc))]) from exc
    except rfc8785.FloatDomainError as exc:
        raise ArgumentValidationError(f"cannot canonicalise: {exc}", [("", str(exc))]) from exc
    except (rfc8785.CanonicalizationError, UnicodeEncodeError, TypeError, ValueError) as exc:
        raise ArgumentValidationError(f"cannot canonicalise: {exc}", [("", str(exc))]) from exc


def fingerprint(args: Any) -> str:
    """SHA-256 hex of the canonical arguments."""
    return hashlib.sha256(canonical_json(args)).hexdigest()


def derive_key(trajectory_id: str, turn: int, call_id: str, tool: str, args: Any, *, namespace: str = "") -> str:
    """`<slot>.<fingerprint>`: slot = SHA-256(JCS([version, namespace, trajectory_id, turn,
    call_id, tool])) (a JSON array, so no separator can be forged), fingerprint = SHA-256(JCS(args)).
    `namespace` scopes the slot (`Runtime.namespace`: its workspace and catalog, or a tenant id)."""
    if not isinstance(namespace, str):
        raise ArgumentValidationError(f"Invalid namespace: expected a string, got {type(namespace).__name__}", [("", "namespace")])
    slot = hashlib.sha256(canonical_json([KEY_VERSION, namespace, trajectory_id, turn, call_id, tool])).hexdigest()
    return f"{slot}.{fingerprint(args)}"


def split_key(key: str) -> tuple[str, str]:
    """(slot, fingerprint) of a derived key; a key without '.' is a bare slot (no fingerprint)."""
    if not isinstance(key, str) or not key or len(key) > 512:
        raise IdempotencyConflict(f"Invalid idempotency key: expected a non-empty string of at most 512 characters, got {key!r}")
    slot, _, fp = key.partition(".")
    return slot, fp


def check_fingerprint(key: str, stored: str, wanted: str) -> None:
    if stored != wanted:
        raise IdempotencyConflict(
            f"idempotency key {key.partition('.')[0][:16]}... already used with different arguments "
            f"(fingerprint {stored[:12]} vs {wanted[:12]}): a call id must not be reused for another call"
        )


def as_outcome(value: Any) -> ProbeOutcome:
    if isinstance(value, ProbeOutcome):
        return value
    if value is None or isinstance(value, bool):
        return ProbeOutcome(executed=value)
    raise TypeError(f"a probe must return ProbeOutcome, bool or None, got {type(value).__name__}")


@dataclass(frozen=True)
class Execution:
    """What `execute_once` did: `ran` the function in this call, and the record afterwards."""

    ran: bool
    record: Record


def execute_once(store, key: str, fn: Callable[[], Any], *, lease_s: float = 30.0) -> Execution:
    """Claim `key`; if acquired run `fn()` and complete with its result (fail -> IN_DOUBT and
    re-raise on an exception). Not acquired: the existing record (COMPLETED, IN_FLIGHT, IN_DOUBT)."""
    claim = store.claim(key, lease_s=lease_s)
    if not claim.acquired:
        return Execution(False, claim.record)
    try:
        result = fn()
    except BaseException as exc:
        store.fail(key, claim.owner, f"{type(exc).__name__}: {exc}")
        raise
    return Execution(True, store.complete(key, claim.owner, result))
