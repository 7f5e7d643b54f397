"""Idempotency keys and execution records: a call runs at most once, even across crashes.

`derive_key(trajectory_id, turn, call_id, tool, args, namespace=...)` names the call slot (scoped
to a namespace: one runtime, workspace or tenant, so runtimes sharing a store never see each
other's records) and fingerprints its arguments, both SHA-256 over RFC 8785 canonical JSON (the `rfc8785` package, never
`json.dumps(sort_keys=True)`). The key is `<slot>.<fingerprint>`: the store keys records by the
slot and refuses a second claim of the slot with another fingerprint (`IdempotencyConflict`).
Record states: UNSEEN -> IN_FLIGHT (leased) -> COMPLETED (stored result) | IN_DOUBT (failed or
lease expired: the effect is unknown; never re-run silently) -> settled by a probe into
COMPLETED or NOT_EXECUTED (which may be claimed again). Stores live in `stores/`.
Leases: a claim carries an owner id and a fencing token (`Claim.token`, rising per slot); the
owner holds the lease with `hold_lease` (a heartbeat every lease/3) and records the outcome
with both, so a stale owner is refused. What no protocol stops: an owner stalled *inside* its
side effect that wakes after a takeover (the token lets the resource itself refuse it).
"""

from __future__ import annotations

import enum
import hashlib
import heapq
import itertools
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import rfc8785

from surecall.errors import (
    ArgumentValidationError,
    IdempotencyConflict,
    LeaseLost,
    StoreUnavailable,
)

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
    text (IN_DOUBT), `lease_expires_at` unix seconds while an owner holds the call (0 once it
    reported back), `attempts` claims granted (also the fencing token of the latest claim), and
    `owner_may_be_alive` whether a lapsed owner may still be running (within the takeover margin)."""

    key: str
    state: RecordState
    fingerprint: str = ""
    owner: str = ""
    lease_expires_at: float = 0.0
    result: Any = None
    error: str = ""
    attempts: int = 0
    updated_at: float = 0.0
    owner_may_be_alive: bool = False


@dataclass(frozen=True)
class Claim:
    """The answer to `store.claim`: `acquired` means the caller now holds the lease and must run
    the call (under `hold_lease`), then `complete`, `fail` or `release` it with `owner` and
    `token=token`. Otherwise `record` says why: COMPLETED (return its result), IN_FLIGHT
    (someone else runs it), IN_DOUBT (settle first)."""

    acquired: bool
    record: Record

    @property
    def owner(self) -> str:
        return self.record.owner

    @property
    def token(self) -> int:
        """The fencing token: the slot's claim counter at this claim (1, 2, ... per slot). A later
        claim of the slot has a higher one; hand it to any resource that can reject stale writers."""
        return self.record.attempts


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


# --- leases: how long, and kept alive while the call runs -------------------------------------
MAX_LEASE_S = 7 * 24 * 3600.0  # a bound stores can express (Redis PX) and a human can reason about
LEASE_MARGIN_S = 10.0  # a lease outlives a tool's own timeout_ms by this much


def lease_for(timeout_ms: Any, default_s: float, *, margin_s: float = LEASE_MARGIN_S) -> float:
    """The lease for a call that may run `timeout_ms` milliseconds (int or float): timeout plus
    `margin_s` seconds, never below `default_s` nor above MAX_LEASE_S. A missing, non-numeric,
    non-finite or non-positive timeout gets `default_s`."""
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)):
        return default_s
    if not math.isfinite(timeout_ms) or timeout_ms <= 0:
        return default_s
    return min(MAX_LEASE_S, max(default_s, timeout_ms / 1000.0 + margin_s))


def check_lease_s(lease_s: Any) -> float:
    """`lease_s` as a float; ValueError unless a finite number of seconds in (0, MAX_LEASE_S]."""
    if isinstance(lease_s, bool) or not isinstance(lease_s, (int, float)) or not math.isfinite(lease_s) \
            or not 0 < lease_s <= MAX_LEASE_S:
        raise ValueError(f"Invalid lease_s: expected a finite number of seconds in (0, {MAX_LEASE_S:.0f}], got {lease_s!r}")
    return float(lease_s)


class LeaseKeeper:
    """One claim's heartbeat: renewed by the process's `Heartbeats` thread every `lease_s / 3`
    until `stop()`. A renewal refused by the store (lease lapsed, record fenced by a newer claim)
    ends it and sets `lost`; an unreachable store is retried at the next beat (the lease may
    lapse meanwhile, and the next renewal is then refused)."""

    def __init__(self, store, key: str, claim: Claim, *, lease_s: float, clock: Callable[[], float] = time.time):
        self.store, self.key, self.owner, self.token = store, key, claim.owner, claim.token
        self.lease_s, self.clock = check_lease_s(lease_s), clock
        self.interval_s = self.lease_s / 3
        self.num_renewals = 0
        self.lost: str | None = None  # why the lease was lost, once it was
        self.is_stopped = False
        self._lock = threading.Lock()  # a renewal and stop() never overlap

    def renew(self) -> None:
        """One renewal now; LeaseLost (and `lost` set) when the store refuses it."""
        try:
            self.store.renew(self.key, self.owner, token=self.token, lease_s=self.lease_s, now=self.clock())
        except IdempotencyConflict as exc:
            self.lost = str(exc)
            raise LeaseLost(f"lease on {self.key[:16]}... lost (token {self.token}): {exc}") from exc
        self.num_renewals += 1

    def check(self) -> None:
        """LeaseLost if a renewal was refused: call it before a side effect that can still be skipped."""
        if self.lost is not None:
            raise LeaseLost(f"lease on {self.key[:16]}... lost (token {self.token}): {self.lost}")

    def beat(self) -> bool:
        """One heartbeat (from the Heartbeats thread); False once the keeper needs no more."""
        with self._lock:
            if self.is_stopped or self.lost is not None:
                return False
            try:
                self.renew()
            except LeaseLost:
                return False
            except StoreUnavailable:
                pass  # transient: the next beat retries; a lapsed lease is then refused
            except Exception as exc:  # never die silently: a dead heartbeat looks like a live one
                self.lost = f"heartbeat failed: {type(exc).__name__}: {exc}"
                return False
            return True

    def stop(self) -> None:
        """No renewal runs after this returns (one in progress is waited for)."""
        with self._lock:
            self.is_stopped = True


class Heartbeats:
    """One daemon thread per process that renews every held lease when due (a heap by due
    time), so holding a lease costs a heap push, not a thread per call. Renewals run one after
    another: a store slow to answer delays the others (each has 2/3 of its lease as slack).
    Started on first use, and again in a forked child (threads do not survive fork)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._due: list[tuple[float, int, LeaseKeeper]] = []
        self._seq = itertools.count()  # ties on the due time never compare keepers
        self._thread: threading.Thread | None = None
        os.register_at_fork(after_in_child=self._forget)  # a child starts its own thread, unlocked

    def _forget(self) -> None:
        self._cond, self._due, self._thread = threading.Condition(), [], None

    def add(self, keeper: LeaseKeeper) -> None:
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="surecall-heartbeats", daemon=True)
                self._thread.start()
            self._push(keeper)
            self._cond.notify()

    def _push(self, keeper: LeaseKeeper) -> None:
        heapq.heappush(self._due, (time.monotonic() + keeper.interval_s, next(self._seq), keeper))

    def _next_due(self) -> LeaseKeeper:
        with self._cond:
            while True:
                delay = self._due[0][0] - time.monotonic() if self._due else None
                if delay is not None and delay <= 0:
                    return heapq.heappop(self._due)[2]
                self._cond.wait(delay)

    def _run(self) -> None:
        while True:
            keeper = self._next_due()
            if keeper.beat():
                with self._cond:
                    self._push(keeper)


_HEARTBEATS = Heartbeats()  # the process's one heartbeat thread (see Heartbeats)


@contextmanager
def hold_lease(store, key: str, claim: Claim, *, lease_s: float, clock: Callable[[], float] = time.time) -> Iterator[LeaseKeeper]:
    """Run the body while holding `claim`'s lease: LeaseLost on entry, before anything ran, when
    the claim's lease already lapsed by `clock` (the owner stalled between claim and run: another
    worker may have taken over); then renew every lease/3 (`Heartbeats`) until the body ends,
    before the caller records the outcome. A call longer than its lease is thus not taken over
    while its owner lives."""
    expires = claim.record.lease_expires_at
    if expires and clock() >= expires:
        raise LeaseLost(
            f"lease on {key[:16]}... (token {claim.token}) lapsed before the call started; not run, "
            "another worker may hold it now"
        )
    keeper = LeaseKeeper(store, key, claim, lease_s=lease_s, clock=clock)
    _HEARTBEATS.add(keeper)
    try:
        yield keeper
    finally:
        keeper.stop()


@dataclass(frozen=True)
class Execution:
    """What `execute_once` did: `ran` the function in this call, and the record afterwards."""

    ran: bool
    record: Record


def execute_once(store, key: str, fn: Callable[[], Any], *, lease_s: float = 30.0) -> Execution:
    """Claim `key`; if acquired run `fn()` under `hold_lease` and complete with its result (fail
    -> IN_DOUBT and re-raise on an exception). Not acquired: the existing record (COMPLETED,
    IN_FLIGHT, IN_DOUBT). LeaseLost when the claim went stale before `fn` started (not run)."""
    claim = store.claim(key, lease_s=lease_s)
    if not claim.acquired:
        return Execution(False, claim.record)
    try:
        with hold_lease(store, key, claim, lease_s=lease_s):
            result = fn()
    except LeaseLost:
        raise
    except BaseException as exc:
        store.fail(key, claim.owner, f"{type(exc).__name__}: {exc}", token=claim.token)
        raise
    return Execution(True, store.complete(key, claim.owner, result, token=claim.token))
