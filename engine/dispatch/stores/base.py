"""The interface every idempotency store implements, and the parts they share (settle, owners).

A store keeps one record per call slot (see `idempotency.derive_key`). Every transition is one
atomic store operation conditioned on the current state (compare-and-set), so concurrent
processes agree: one claim wins, an expired lease becomes IN_DOUBT exactly once, one settle
wins. A store that cannot be reached raises `StoreUnavailable` and has changed nothing.
"""

from __future__ import annotations

import abc
import json
import uuid
from typing import Any

from surecall.dispatch.idempotency import Claim, ProbeFn, Record, RecordState, as_outcome
from surecall.errors import IdempotencyConflict

DEFAULT_LEASE_S = 30.0


class IdempotencyStore(abc.ABC):
    """claim -> (run the call) -> complete | fail | release; settle IN_DOUBT with a probe."""

    @abc.abstractmethod
    def claim(self, key: str, *, lease_s: float = DEFAULT_LEASE_S, owner: str | None = None, now: float | None = None) -> Claim:
        """Atomically claim `key`. UNSEEN (or NOT_EXECUTED) -> IN_FLIGHT with a lease of `lease_s`
        held by `owner` (a fresh token when None): `acquired=True`. Otherwise the record as it is:
        COMPLETED (with its result), IN_FLIGHT (another owner's live lease) or IN_DOUBT (an
        expired lease is turned into IN_DOUBT here, never re-run). IdempotencyConflict when the
        slot was claimed with other arguments."""

    @abc.abstractmethod
    def renew(self, key: str, owner: str, *, lease_s: float = DEFAULT_LEASE_S, now: float | None = None) -> Record:
        """Extend a live lease held by `owner` (long-running tools); IdempotencyConflict if it is not held."""

    @abc.abstractmethod
    def complete(self, key: str, owner: str, result: Any, *, now: float | None = None) -> Record:
        """IN_FLIGHT (or IN_DOUBT after its own lease ran out) held by `owner` -> COMPLETED with
        `result` (JSON-serialisable). IdempotencyConflict for any other state or owner."""

    @abc.abstractmethod
    def fail(self, key: str, owner: str, error: str, *, now: float | None = None) -> Record:
        """IN_FLIGHT held by `owner` -> IN_DOUBT: the call failed and its effect is unknown."""

    @abc.abstractmethod
    def release(self, key: str, owner: str, reason: str = "", *, now: float | None = None) -> Record:
        """IN_FLIGHT held by `owner` -> NOT_EXECUTED: the caller knows nothing ran (e.g. denied)."""

    @abc.abstractmethod
    def get(self, key: str, *, now: float | None = None) -> Record:
        """The record (state UNSEEN when there is none); an expired lease is reported as IN_DOUBT."""

    @abc.abstractmethod
    def _resolve(self, key: str, state: RecordState, result: Any, error: str, now: float | None) -> Record:
        """Compare-and-set IN_DOUBT -> `state` (COMPLETED or NOT_EXECUTED); returns the record after."""

    def close(self) -> None:  # noqa: B027 - optional for stores holding nothing
        """Release connections (the store object must not be used afterwards)."""

    def settle(self, key: str, probe: ProbeFn, *, now: float | None = None) -> Record:
        """Reconcile an IN_DOUBT record: `probe(record)` reads the environment and says whether the
        call took effect (ProbeOutcome, bool or None). True -> COMPLETED (with the probe's result),
        False -> NOT_EXECUTED (claimable again), None -> unchanged. Settled records are returned
        as they are; an IN_FLIGHT record with a live lease or no record is an IdempotencyConflict."""
        record = self.get(key, now=now)
        if record.state in (RecordState.COMPLETED, RecordState.NOT_EXECUTED):
            return record
        if record.state is RecordState.UNSEEN:
            raise IdempotencyConflict(f"cannot settle {key[:16]}...: no record (the call was never claimed)")
        if record.state is RecordState.IN_FLIGHT:
            raise IdempotencyConflict(
                f"cannot settle {key[:16]}...: IN_FLIGHT with a live lease until {record.lease_expires_at:.3f}; wait for it"
            )
        outcome = as_outcome(probe(record))
        if outcome.executed is None:
            return record
        state = RecordState.COMPLETED if outcome.executed else RecordState.NOT_EXECUTED
        return self._resolve(key, state, outcome.result, "settled by probe", now)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def new_owner() -> str:
    return uuid.uuid4().hex


def dump_result(result: Any) -> str:
    try:
        return json.dumps(result, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise IdempotencyConflict(f"cannot store the result: not JSON-serialisable ({exc})") from exc


def load_result(text: str | bytes | None) -> Any:
    return None if text in (None, "", b"") else json.loads(text)


def refuse(key: str, step: str, record: Record, owner: str) -> IdempotencyConflict:
    held = "held by another owner" if record.owner != owner else "held by this owner"
    return IdempotencyConflict(f"cannot {step} {key[:16]}...: record is {record.state.value} ({held})")
