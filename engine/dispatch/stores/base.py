"""The interface every idempotency store implements, and the parts they share (settle, owners).

A store keeps one record per call slot (see `idempotency.derive_key`). Every transition is one
atomic store operation conditioned on the current state (compare-and-set), so concurrent
processes agree: one claim wins, an expired lease becomes IN_DOUBT exactly once, one settle
wins. A store that cannot be reached raises `StoreUnavailable` and has changed nothing; a
record that cannot be read back raises `StoreCorrupted` (see `parse_record`). Every step after
a claim checks the owner and, when given, the fencing token (`Claim.token`) in the same atomic
operation, so a stale owner is refused (`LeaseLost`). `settle` waits out `takeover_margin_s`
after a lapsed lease before it trusts a probe: the owner may only be stalled, not dead.
`purge` garbage-collects settled records past a retention window (see its docstring for what
that gives up); it never touches IN_FLIGHT or IN_DOUBT records.
"""

from __future__ import annotations

import abc
import json
import math
import time
import uuid
from collections.abc import Mapping
from typing import Any

from surecall.dispatch.idempotency import Claim, ProbeFn, Record, RecordState, as_outcome
from surecall.errors import IdempotencyConflict, LeaseLost, StoreCorrupted

DEFAULT_LEASE_S = 30.0
# How long after a lease lapsed its owner may still be running (stalled, paused, a skewed clock):
# `settle` refuses to probe before, since a probe then cannot tell "not yet" from "never".
DEFAULT_TAKEOVER_MARGIN_S = 10.0
# The states `purge` may delete: the call's outcome is known and nobody holds or needs the record.
PURGEABLE = (RecordState.COMPLETED, RecordState.NOT_EXECUTED)


class IdempotencyStore(abc.ABC):
    """claim -> (run the call) -> complete | fail | release; settle IN_DOUBT with a probe."""

    takeover_margin_s: float = DEFAULT_TAKEOVER_MARGIN_S

    @abc.abstractmethod
    def claim(self, key: str, *, lease_s: float = DEFAULT_LEASE_S, owner: str | None = None, now: float | None = None) -> Claim:
        """Atomically claim `key`. UNSEEN (or NOT_EXECUTED) -> IN_FLIGHT with a lease of `lease_s`
        held by `owner` (a fresh random id when None) and a fencing token one above the last
        (`Claim.token`): `acquired=True`. Otherwise the record as it is: COMPLETED (with its
        result), IN_FLIGHT (another owner's live lease) or IN_DOUBT (an expired lease is turned
        into IN_DOUBT here, never re-run). IdempotencyConflict when the slot was claimed with
        other arguments; ValueError for a `lease_s` outside (0, MAX_LEASE_S]."""

    @abc.abstractmethod
    def renew(self, key: str, owner: str, *, token: int | None = None, lease_s: float = DEFAULT_LEASE_S,
              now: float | None = None) -> Record:
        """Extend a live lease held by `owner` (and `token`) to `lease_s` from now; LeaseLost when
        the lease lapsed or another claim holds the record."""

    @abc.abstractmethod
    def complete(self, key: str, owner: str, result: Any, *, token: int | None = None, now: float | None = None) -> Record:
        """IN_FLIGHT (or IN_DOUBT after its own lease ran out, nobody having claimed it since)
        held by `owner` (and `token`) -> COMPLETED with `result` (JSON-serialisable). LeaseLost
        for another owner or a stale token (the stale result is not recorded); IdempotencyConflict
        for any other state."""

    @abc.abstractmethod
    def fail(self, key: str, owner: str, error: str, *, token: int | None = None, now: float | None = None) -> Record:
        """IN_FLIGHT held by `owner` (and `token`) -> IN_DOUBT: the call failed, its effect is unknown."""

    @abc.abstractmethod
    def release(self, key: str, owner: str, reason: str = "", *, token: int | None = None, now: float | None = None) -> Record:
        """IN_FLIGHT held by `owner` (and `token`) -> NOT_EXECUTED: the caller knows nothing ran."""

    @abc.abstractmethod
    def get(self, key: str, *, now: float | None = None) -> Record:
        """The record (state UNSEEN when there is none); an expired lease is reported as IN_DOUBT,
        with `owner_may_be_alive` until `takeover_margin_s` after it lapsed."""

    @abc.abstractmethod
    def _resolve(self, key: str, state: RecordState, result: Any, error: str, now: float | None) -> Record:
        """Compare-and-set IN_DOUBT -> `state` (COMPLETED or NOT_EXECUTED); returns the record after."""

    @abc.abstractmethod
    def _purge(self, cutoff: float, limit: int | None) -> int:
        """Delete up to `limit` (None: all) records in a PURGEABLE state with `updated_at < cutoff`,
        each one atomically with a re-check of state and timestamp; return how many went."""

    def purge(self, older_than_s: float, *, now: float | None = None, limit: int | None = None) -> int:
        """Delete settled records (COMPLETED, NOT_EXECUTED) last updated more than `older_than_s`
        seconds before `now` (default: this host's `time.time()`, the clock every transition
        stamps `updated_at` with, in both stores). Returns how many records were deleted; `limit`
        caps it (which eligible records go first is unspecified), so a caller can purge in slices.

        Never deletes IN_FLIGHT (live or lapsed lease) or IN_DOUBT records: their effect is unknown
        and deleting one would let a replay run the call a second time. Each record's state and
        stamp are checked in the same atomic step that deletes it, so a record claimed, or settled
        again with a fresh stamp, after purge first saw it is kept.

        Trade-off: a purged key is UNSEEN again, so a replay of that call after the purge runs it
        again. At-most-once holds only within the retention window `older_than_s`; choose it longer
        than any retry or replay can arrive (payment APIs keep idempotency keys for 24 h). A record
        without an update timestamp (none is written that way; a hand-made Redis hash) is kept."""
        older_than_s, limit = check_purge_args(older_than_s, limit)
        if now is None:
            now = time.time()
        elif not _finite_number(now):
            raise ValueError(f"Invalid now: expected a finite number of unix seconds or None, got {now!r}")
        return self._purge(float(now) - older_than_s, limit)

    def close(self) -> None:  # noqa: B027 - optional for stores holding nothing
        """Release connections (the store object must not be used afterwards)."""

    def settle(self, key: str, probe: ProbeFn, *, now: float | None = None) -> Record:
        """Reconcile an IN_DOUBT record: `probe(record)` reads the environment and says whether the
        call took effect (ProbeOutcome, bool or None). True -> COMPLETED (with the probe's result),
        False -> NOT_EXECUTED (claimable again), None -> unchanged. Settled records are returned
        as they are; an IN_FLIGHT record with a live lease, a lapsed lease within the takeover
        margin (its owner may be stalled mid-call: a probe cannot tell "not yet" from "never"),
        or no record is an IdempotencyConflict."""
        record = self.get(key, now=now)
        if record.state in (RecordState.COMPLETED, RecordState.NOT_EXECUTED):
            return record
        if record.state is RecordState.UNSEEN:
            raise IdempotencyConflict(f"cannot settle {key[:16]}...: no record (the call was never claimed)")
        if record.state is RecordState.IN_FLIGHT:
            raise IdempotencyConflict(
                f"cannot settle {key[:16]}...: IN_FLIGHT with a live lease until {record.lease_expires_at:.3f}; wait for it"
            )
        if record.owner_may_be_alive:
            raise IdempotencyConflict(
                f"cannot settle {key[:16]}...: its lease lapsed less than {self.takeover_margin_s:g} s ago and its owner "
                "may still be running it; retry after the takeover margin"
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


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_purge_args(older_than_s: Any, limit: Any) -> tuple[float, int | None]:
    """Validated (older_than_s, limit) for `purge`; ValueError naming the bad argument."""
    if not _finite_number(older_than_s) or older_than_s < 0:
        raise ValueError(f"Invalid older_than_s: expected a finite number of seconds >= 0, got {older_than_s!r}")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise ValueError(f"Invalid limit: expected None or an integer >= 1, got {limit!r}")
    return float(older_than_s), limit


def new_owner() -> str:
    return uuid.uuid4().hex


def check_margin_s(margin_s: Any) -> float:
    if not _finite_number(margin_s) or margin_s < 0:
        raise ValueError(f"Invalid takeover_margin_s: expected a finite number of seconds >= 0, got {margin_s!r}")
    return float(margin_s)


def check_token(token: Any) -> int | None:
    """The fencing token as given (None: check the owner only); ValueError unless an int >= 1."""
    if token is not None and (not isinstance(token, int) or isinstance(token, bool) or token < 1):
        raise ValueError(f"Invalid token: expected None or the claim's fencing token (an integer >= 1), got {token!r}")
    return token


def dump_result(result: Any) -> str:
    try:
        return json.dumps(result, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise IdempotencyConflict(f"cannot store the result: not JSON-serialisable ({exc})") from exc


def refuse(key: str, step: str, record: Record, owner: str, token: int | None = None, *, renewing: bool = False) -> IdempotencyConflict:
    """The error for a step the record's state, owner or token does not allow: LeaseLost when the
    caller is not (or no longer) the holder, or renews a lease that lapsed; IdempotencyConflict
    for a wrong state."""
    if record.owner != owner:
        return LeaseLost(f"cannot {step} {key[:16]}...: record is {record.state.value} (held by another owner)")
    if token is not None and record.attempts != token:
        return LeaseLost(
            f"cannot {step} {key[:16]}...: record is {record.state.value} (fenced: token {token} is stale, "
            f"the slot was claimed again with token {record.attempts})"
        )
    error = LeaseLost if renewing else IdempotencyConflict
    return error(f"cannot {step} {key[:16]}...: record is {record.state.value} (held by this owner)")


# --- reading records back: anything unexpected is StoreCorrupted, never a KeyError -------------
_TEXT_FIELDS = ("fp", "owner", "error")
_NUMBER_FIELDS = ("lease_expires", "updated")


def parse_record(where: str, slot: str, fields: Mapping[str, Any], *, owner_may_be_alive: bool = False) -> Record:
    """A Record from a store's raw fields (state, fp, owner, lease_expires, result, error,
    attempts, updated); StoreCorrupted naming the store, record and field for anything else."""
    def bad(name: str, why: str) -> StoreCorrupted:
        return StoreCorrupted(
            f"{where}: record {slot[:16]}... is corrupted: {name} {why}; nothing was changed, "
            "inspect or delete the record"
        )

    try:
        state = RecordState(fields.get("state"))
    except ValueError:
        raise bad("state", f"= {fields.get('state')!r} is not one of {[s.value for s in RecordState]}") from None
    if state is RecordState.UNSEEN:
        raise bad("state", "= 'UNSEEN' is never stored")
    for name in _TEXT_FIELDS:
        if not isinstance(fields.get(name, ""), str):
            raise bad(name, f"= {fields.get(name)!r} is not text")
    numbers = {}
    for name in (*_NUMBER_FIELDS, "attempts"):
        numbers[name] = _number(fields.get(name, 0), integral=name == "attempts")
        if numbers[name] is None:
            raise bad(name, f"= {fields.get(name)!r} is not a finite number" + (" (an integer >= 0)" if name == "attempts" else ""))
    try:
        result = load_result(fields.get("result"))
    except (ValueError, TypeError) as exc:
        raise bad("result", f"is not JSON ({exc})") from None
    return Record(
        key=slot, state=state, fingerprint=fields.get("fp", ""), owner=fields.get("owner", ""),
        lease_expires_at=numbers["lease_expires"], result=result, error=fields.get("error", ""),
        attempts=numbers["attempts"], updated_at=numbers["updated"], owner_may_be_alive=owner_may_be_alive,
    )


def _number(value: Any, *, integral: bool) -> float | int | None:
    """`value` (a number, or its text as Redis stores it) as a finite float, or an int >= 0 when
    `integral`; None when it is neither."""
    if isinstance(value, str):
        try:
            value = int(value) if integral else float(value)
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    if integral:
        return value if isinstance(value, int) and value >= 0 else None
    return float(value)


def load_result(text: str | bytes | None) -> Any:
    return None if text in (None, "", b"") else json.loads(text)
