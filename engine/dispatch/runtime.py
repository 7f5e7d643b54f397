"""`Runtime.dispatch`: every tool call crosses validate -> approve -> claim -> execute -> record.

One call, one `Observation` (output, error, exit status, truncation, idempotency key and state,
the decision). Nothing raises for a bad call: dispatch fails closed in one place, so a malformed
call, id or capability, a bad cost, a store failing or answering garbage, or a probe raising is a
denied or not-run observation naming the step. A2/A3 calls claim a key scoped to
`Runtime.namespace`; a COMPLETED replay returns the stored result; IN_DOUBT is settled by
`Tool.probe` before anything re-runs; an A3 tool failing partway runs `Tool.compensator`. It does
not decode, sandbox or hold tool logic (`surecall.toolbox`). (Past 400 lines: the fail-closed
path, its step table and the record/replay helpers are read together.)
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from surecall.dispatch.capability import Authority, Capability, Decision, is_finite_number
from surecall.dispatch.idempotency import (
    LEASE_MARGIN_S,  # noqa: F401 - re-exported: a lease outlives a tool's own timeout_ms by this much
    Claim,
    ProbeOutcome,
    Record,
    RecordState,
    as_outcome,
    derive_key,
    fingerprint,
    hold_lease,
    lease_for,
    split_key,
)
from surecall.dispatch.validate import MAX_SAFE_INTEGER, validate_arguments
from surecall.errors import (
    ArgumentValidationError,
    CapabilityError,
    IdempotencyConflict,
    LeaseLost,
    PathOutsideWorkspace,
    SandboxUnavailable,
    StoreUnavailable,
    SurecallError,
    ToolDefinitionError,
    ToolError,
)
from surecall.toolbox.result import Plan, ToolResult
from surecall.tools import SideEffect, Tool

MAX_ID_CHARS = 512
NOT_REQUIRED, NOT_CLAIMED, UNRECORDED = "NOT_REQUIRED", "NOT_CLAIMED", "UNRECORDED"
# step of dispatch -> (what the observation says failed, the decision code if it fails there)
_STEPS = {
    "call": ("the call is malformed", "bad_input"),
    "capability": ("the capability is malformed", "bad_capability"),
    "arguments": ("the arguments are invalid", "invalid_arguments"),
    "plan": ("the tool could not bind the call", "bad_input"),
    "cost": ("the tool's cost could not be computed", "bad_cost"),
    "approve": ("the capability could not be checked", "bad_capability"),
    "key": ("the idempotency key could not be derived", "bad_input"),
    "claim": ("the idempotency store failed", "store_error"),
    "settle": ("the reconciliation probe failed; the record stays IN_DOUBT", "store_error"),
    "replay": ("the stored record is unreadable", "store_error"),
    "execute": ("the call failed after the tool started; its effect is unknown", "internal_error"),
}

_TYPED_CODES = ((ArgumentValidationError, "invalid_arguments"), (PathOutsideWorkspace, "outside_workspace"),
                (CapabilityError, "bad_capability"))


@dataclass(frozen=True)
class Verdict:
    """Whether the call was allowed to run, why, and a stable code (`allowed`, `unknown_tool`,
    `invalid_arguments`, `outside_workspace`, `bad_input`, or a capability `DenyCode` value)."""

    allowed: bool
    reason: str
    code: str = "allowed"

    @classmethod
    def of(cls, decision: Decision) -> Verdict:
        return cls(decision.allowed, decision.reason, decision.code.value)


@dataclass(frozen=True)
class Observation:
    tool: str
    decision: Verdict
    output: str = ""
    error: str | None = None
    exit_status: int | None = None
    truncated: bool = False
    idempotency_key: str | None = None
    idempotency_state: str = NOT_REQUIRED
    replayed: bool = False
    data: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.decision.allowed and self.error is None

    def to_dict(self) -> dict:
        return asdict(self)

    def to_message(self) -> str:
        """The text to show the model."""
        if not self.decision.allowed:
            return f"[denied: {self.decision.reason}]"
        text = self.output
        if self.exit_status not in (None, 0):
            text += f"\n[exit status {self.exit_status}]"
        return text if self.error is None else f"{text}\n[error: {self.error}]".lstrip()


@dataclass
class _Progress:
    """How far one dispatch got: what the single fail-closed handler needs to say what ran."""

    name: str = ""
    step: str = "call"
    verdict: Verdict | None = None
    key: str | None = None
    key_state: str = NOT_REQUIRED

    def refusal(self, exc: Exception) -> Observation:
        what, code = _STEPS[self.step]
        # typed errors already say where and what; anything else is named with its step
        reason = str(exc) if isinstance(exc, SurecallError) and self.verdict is None else f"{what}: {type(exc).__name__}: {exc}"
        if self.verdict is None:  # nothing was approved, so nothing ran
            code = next((c for cls, c in _TYPED_CODES if isinstance(exc, cls)), code)
            data = {"errors": exc.errors} if isinstance(exc, ArgumentValidationError) else {}
            return _denied(self.name, code, reason, key_state=self.key_state, data=data)
        if self.step == "execute":
            return _observed(self.name, self.verdict, ToolResult(error=reason), key=self.key, state=UNRECORDED)
        return _observed(self.name, self.verdict, ToolResult(error=f"not run: {reason}"), key=self.key, state=NOT_CLAIMED)


def _unpack(call: Any) -> tuple[str, Any]:
    if isinstance(call, Mapping):
        return str(call.get("name", "")), call.get("arguments", {})
    return str(getattr(call, "name", "")), getattr(call, "arguments", {})


def coerce_result(value: Any) -> ToolResult:
    """A handler's return value as a ToolResult (strings are output; other JSON goes to data)."""
    if isinstance(value, ToolResult):
        return value
    if isinstance(value, str):
        return ToolResult(output=value)
    return ToolResult(output=json.dumps(value, ensure_ascii=False, allow_nan=False), data={"value": value})


def as_capability(value: Any) -> Capability:
    """A Capability, or its `to_dict` form (as a sub-agent hands it over); CapabilityError otherwise."""
    if isinstance(value, Capability):
        try:  # re-check the fields: a caller may have bypassed __post_init__ (object.__setattr__)
            Capability(value.rights, value.objects, value.max_cost, value.expires_at, value.issued_at,
                       chain=value.chain, signature=value.signature)
        except (TypeError, ValueError, AttributeError) as exc:
            raise CapabilityError(f"malformed capability: {exc}") from exc
        return value
    if isinstance(value, Mapping):
        return Capability.from_dict(dict(value))
    raise CapabilityError(f"expected a Capability or its dict form, got {type(value).__name__}")


def check_call_ids(trajectory_id: Any, turn: Any, call_id: Any) -> None:
    """ValueError unless the ids can name an idempotency slot (strings of valid Unicode, an int turn)."""
    for name, value in (("trajectory_id", trajectory_id), ("call_id", call_id)):
        if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_CHARS:
            raise ValueError(f"Invalid {name}: expected a string of 1..{MAX_ID_CHARS} characters, got {value!r:.80}")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"Invalid {name}: holds a lone surrogate ({value!r:.80}); expected valid Unicode") from None
    if not isinstance(turn, int) or isinstance(turn, bool) or not 0 <= turn <= MAX_SAFE_INTEGER:
        raise ValueError(f"Invalid turn: expected an integer in 0..2^53-1, got {turn!r}")


def default_namespace(tools: Iterable[Tool]) -> str:
    """A runtime id from the real paths of the tools' workspaces and the catalog (names, levels,
    schemas): runtimes over other workspaces or catalogs never share idempotency records."""
    tools = list(tools)
    workspaces = sorted({os.path.realpath(os.fspath(ws)) for t in tools
                         if (ws := getattr(t.handler, "workspace", None)) is not None})
    catalog = sorted([t.name, int(t.level), json.dumps(t.input_schema, sort_keys=True)] for t in tools)
    text = json.dumps({"workspaces": workspaces, "catalog": catalog}, sort_keys=True, ensure_ascii=True)
    return "rt-" + hashlib.sha256(text.encode()).hexdigest()[:32]


class Runtime:
    """Runs tool calls under signed capabilities, at most once where the side-effect level says so.
    `namespace` scopes its idempotency keys (default `default_namespace(tools)`; give a tenant id
    to share or separate records explicitly, and to keep keys stable when the catalog changes)."""

    def __init__(
        self,
        tools: Iterable[Tool],
        store,
        signing_key: bytes,
        *,
        lease_s: float = 30.0,
        skew_s: float = 30.0,
        clock: Callable[[], float] = time.time,
        auto_settle: bool = True,
        namespace: str | None = None,
    ):
        self.tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self.tools:
                raise ToolDefinitionError(f"duplicate tool name {tool.name!r} in the runtime's catalog")
            if tool.handler is None:
                raise ToolDefinitionError(f"tool {tool.name!r} has no handler: the runtime cannot execute it")
            self.tools[tool.name] = tool
        if not (is_finite_number(lease_s) and lease_s > 0):
            raise ValueError(f"Invalid lease_s: expected a finite number > 0, got {lease_s!r}")
        if namespace is not None and not (isinstance(namespace, str) and 0 < len(namespace) <= MAX_ID_CHARS):
            raise ValueError(f"Invalid namespace: expected a string of 1..{MAX_ID_CHARS} characters, got {namespace!r:.80}")
        self.store, self.lease_s, self.clock, self.auto_settle = store, float(lease_s), clock, auto_settle
        self.namespace = default_namespace(self.tools.values()) if namespace is None else namespace
        self._authority = Authority(signing_key, skew_s)
        self._intents: dict[str, tuple[str, dict]] = {}  # key -> (tool, arguments), for settle(key)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Runtime(tools={sorted(self.tools)}, store={self.store!r}, namespace={self.namespace!r})"

    def issue(self, rights: Iterable[str], objects: Iterable[str], *, max_cost: float | None = None, ttl_s: float = 3600.0) -> Capability:
        """A capability signed with the runtime's key (only the runtime holds it)."""
        return self._authority.issue(rights, objects, max_cost=max_cost, ttl_s=ttl_s, now=self.clock())

    def attenuate(self, parent: Capability, **narrower) -> Capability:
        return self._authority.attenuate(parent, **narrower)

    # --- the one entry point -------------------------------------------------------------
    def dispatch(self, call: Any, capability: Capability | dict, trajectory_id: str, turn: int, call_id: str) -> Observation:
        """Validate, approve, claim, execute and record one call; always returns an Observation.

        Fails closed here, in one place: an exception before approval is a denied observation
        (nothing ran); after approval but before the tool starts, a not-run one (`error` starts
        with "not run:"); once the tool has started, its failure is recorded, never raised.
        Thread-safe: dispatch may be called concurrently from threads (and from processes that
        share the store); each A2/A3 call runs at most once per (namespace, trajectory, turn,
        call id), and a concurrent duplicate gets the stored result or "in flight elsewhere".
        A BaseException (KeyboardInterrupt, SystemExit) mid-call marks the record IN_DOUBT and
        propagates."""
        progress = _Progress()
        try:
            return self._dispatch(progress, call, capability, trajectory_id, turn, call_id)
        except Exception as exc:  # the one fail-closed path: every step says where it was
            return progress.refusal(exc)

    def settle(self, key: str, call: Any = None) -> Record:
        """Settle an IN_DOUBT record with the tool's reconciliation probe. `call` (name and
        arguments) is needed when this runtime did not dispatch the key itself (after a crash)."""
        with self._lock:
            intent = self._intents.get(key, ("", {}))
        name, arguments = _unpack(call) if call is not None else intent
        tool = self.tools.get(name)
        if tool is None:
            raise IdempotencyConflict(f"cannot settle {key[:16]}...: unknown call; pass call=(name, arguments)")
        if split_key(key)[1] != fingerprint(arguments):
            raise IdempotencyConflict(f"cannot settle {key[:16]}...: the arguments given are not the ones the key was derived from")
        if tool.probe is None:
            raise IdempotencyConflict(f"cannot settle {key[:16]}...: tool {name!r} declares no reconciliation probe")
        return self.store.settle(key, lambda _record: _probe(tool, arguments), now=self.clock())

    # --- steps ---------------------------------------------------------------------------
    def _dispatch(self, p: _Progress, call: Any, capability: Any, trajectory_id: Any, turn: Any, call_id: Any) -> Observation:
        # 1. a well-formed call, capability and ids; a known tool; arguments valid for its schema
        p.name, arguments = _unpack(call)
        p.step = "capability"
        capability = as_capability(capability)
        p.step = "call"
        check_call_ids(trajectory_id, turn, call_id)
        tool = self.tools.get(p.name)
        if tool is None:
            return _denied(p.name, "unknown_tool", f"unknown tool {p.name!r}; this runtime serves {sorted(self.tools)}")
        p.key_state = NOT_CLAIMED if tool.level.requires_idempotency_key else NOT_REQUIRED
        p.step = "arguments"
        validate_arguments(tool, arguments)
        # 2. bind the call to what it touches and what it costs; approve each against the capability
        p.step = "plan"
        plan = self._plan(tool, arguments, capability)
        p.step = "cost"
        cost = call_cost(tool, arguments)
        p.step = "approve"
        verdict = self._approve(tool, plan, capability, cost)
        if not verdict.allowed:
            return _denied(p.name, verdict.code, verdict.reason, verdict=verdict, key_state=p.key_state)
        p.verdict = verdict
        # 3. run: directly when the level allows re-running, else at most once under a key
        if not tool.level.requires_idempotency_key:
            p.step = "execute"
            result, _ = _run(plan)
            return _observed(p.name, verdict, result)
        p.step = "key"
        p.key = derive_key(trajectory_id, turn, call_id, p.name, arguments, namespace=self.namespace)
        return self._run_once(p, tool, arguments, plan, verdict)

    def _plan(self, tool: Tool, arguments: dict, capability: Capability) -> Plan:
        if hasattr(tool.handler, "plan"):
            if _takes_rights(tool.handler.plan):  # the shell binds the workspace by the capability's rights
                return tool.handler.plan(arguments, capability.objects, capability_rights=frozenset(capability.rights))
            return tool.handler.plan(arguments, capability.objects)
        return Plan((), run=lambda: tool.handler(**arguments))

    def _approve(self, tool: Tool, plan: Plan, capability: Capability, cost: float) -> Verdict:
        now = self.clock()
        checks = [(f"call:{tool.name}", None)]
        if tool.level.requires_approval:
            checks.append((f"approve:{tool.name}", None))
        checks += [(access.right, access.path) for access in plan.accesses]
        reasons = []
        for op, target in checks:
            decision = self._authority.approve(capability, op, target, cost=cost, now=now)
            if not decision.allowed:
                return Verdict.of(decision)
            reasons.append(decision.reason)
        return Verdict(True, "; ".join(reasons))

    def _lease_for(self, arguments: dict) -> float:
        return lease_for(arguments.get("timeout_ms"), self.lease_s)

    def _claim(self, key: str, lease_s: float) -> Claim:
        """The store's claim, checked: a store answering anything but a well-formed Claim fails."""
        claim = self.store.claim(key, lease_s=lease_s, now=self.clock())
        record = getattr(claim, "record", None)
        if not (isinstance(claim, Claim) and isinstance(claim.acquired, bool) and isinstance(record, Record)
                and isinstance(record.state, RecordState)):
            raise StoreUnavailable(f"{self.store!r} answered the claim with {claim!r:.120}, not a Claim")
        if claim.acquired and not (record.state is RecordState.IN_FLIGHT and isinstance(record.owner, str) and record.owner):
            raise StoreUnavailable(f"{self.store!r} granted a claim in state {record.state.value} without an owner")
        return claim

    def _run_once(self, p: _Progress, tool: Tool, arguments: dict, plan: Plan, verdict: Verdict) -> Observation:
        key, lease_s = p.key, self._lease_for(arguments)
        p.step = "claim"
        claim = self._claim(key, lease_s)
        if not claim.acquired and claim.record.state is RecordState.IN_DOUBT and self.auto_settle and tool.probe:
            # settle first: COMPLETED is then replayed, NOT_EXECUTED claimed and run, None stays
            p.step = "settle"
            self.settle(key, {"name": tool.name, "arguments": arguments})
            p.step = "claim"
            claim = self._claim(key, lease_s)
        if not claim.acquired:
            p.step = "replay"
            return _from_record(tool.name, verdict, key, claim.record)
        p.step = "execute"
        with self._lock:
            self._intents[key] = (tool.name, arguments)
        return self._execute_claimed(tool, arguments, plan, key, claim, lease_s, verdict)

    def _execute_claimed(self, tool: Tool, arguments: dict, plan: Plan, key: str, claim: Claim, lease_s: float,
                         verdict: Verdict) -> Observation:
        name, owner, token = tool.name, claim.owner, claim.token
        try:
            with hold_lease(self.store, key, claim, lease_s=lease_s, clock=self.clock):  # heartbeat while it runs
                result, failure = _run(plan)
        except LeaseLost as exc:  # raised on entry only: the lease lapsed before the run, nothing ran
            return _observed(name, verdict, ToolResult(error=f"not run: {exc}"), key=key, state=NOT_CLAIMED)
        except BaseException as exc:  # interrupted mid-call: the effect is unknown
            with contextlib.suppress(Exception):  # the lease expiring turns it IN_DOUBT anyway
                self.store.fail(key, owner, f"interrupted: {type(exc).__name__}", token=token, now=self.clock())
            raise
        if failure == "failed" or _partial_failure(result):
            result, failure = _compensate(tool, arguments, result, failure)
        try:
            if failure == "refused":
                record = self.store.release(key, owner, result.error or "", token=token, now=self.clock())
            elif failure == "failed":
                record = self.store.fail(key, owner, result.error or "", token=token, now=self.clock())
            else:
                record = self.store.complete(key, owner, result.to_dict(), token=token, now=self.clock())
            state = record.state
            if state is not RecordState.IN_DOUBT:
                with self._lock:
                    self._intents.pop(key, None)  # only IN_DOUBT records may need settle(key) later
        except Exception as exc:
            error = (f"ran, but the result could not be recorded ({exc}); another owner holds the key now"
                     if isinstance(exc, LeaseLost) else
                     f"ran, but the result could not be recorded ({exc}); the record will turn IN_DOUBT")
            return _observed(tool.name, verdict, result, key=key, state=UNRECORDED, extra_error=error)
        return _observed(tool.name, verdict, result, key=key, state=getattr(state, "value", str(state)))


# --- helpers ---------------------------------------------------------------------------------
def _takes_rights(plan: Callable) -> bool:
    try:
        return "capability_rights" in inspect.signature(plan).parameters
    except (TypeError, ValueError):
        return False


def call_cost(tool: Tool, arguments: dict) -> float:
    """What one call of `tool` costs (`Tool.cost`, 0 when it declares none); ValueError unless
    a finite number >= 0 (NaN would pass any ceiling)."""
    if tool.cost is None:
        return 0.0
    value = tool.cost(dict(arguments))
    if not is_finite_number(value) or value < 0:
        raise ValueError(f"Invalid cost of tool {tool.name!r}: expected a finite number >= 0, got {value!r}")
    return float(value)


def _run(plan: Plan) -> tuple[ToolResult, str | None]:
    """(result, failure): failure None (a result, refusals included), 'refused' (the tool did
    not start: nothing ran) or 'failed' (it broke mid-way: the effect is unknown)."""
    try:
        return coerce_result(plan.run()), None
    except SandboxUnavailable as exc:
        return ToolResult(error=str(exc)), "refused"
    except ToolError as exc:  # a refusal: the tool guarantees nothing changed
        return ToolResult(error=str(exc)), None
    except Exception as exc:
        return ToolResult(error=f"tool failed: {type(exc).__name__}: {exc}"), "failed"


def _partial_failure(result: ToolResult) -> bool:
    """A returned failure that says it left a partial effect (`data["partial_effect"] is True`)."""
    return result.error is not None and isinstance(result.data, dict) and result.data.get("partial_effect") is True


def _compensate(tool: Tool, arguments: dict, result: ToolResult, failure: str | None) -> tuple[ToolResult, str | None]:
    """An A3 tool that failed partway runs its compensator. Undone: recorded COMPLETED with the
    failure (a replay shows it, nothing re-runs); the compensator raised: IN_DOUBT ('failed')."""
    if tool.level is not SideEffect.A3 or tool.compensator is None:
        return result, failure
    try:
        tool.compensator(dict(arguments), result.to_dict())
    except Exception as exc:
        note = {"ran": True, "undone": False, "error": f"{type(exc).__name__}: {exc}"}
        error = f"{result.error}; compensation failed ({note['error']}): the partial effect may remain"
        return ToolResult(result.output, error, result.exit_status, result.truncated, {**result.data, "compensation": note}), "failed"
    note = {"ran": True, "undone": True, "error": None}
    error = f"{result.error}; compensated: the compensator undid the partial effect"
    return ToolResult(result.output, error, result.exit_status, result.truncated, {**result.data, "compensation": note}), None


def _probe(tool: Tool, arguments: dict) -> ProbeOutcome:
    outcome = as_outcome(tool.probe(arguments))
    if outcome.executed and outcome.result is None:
        note = f"{tool.name}: settled by its reconciliation probe: the effect is present (original output lost)"
        return ProbeOutcome(True, ToolResult(output=note, data={"settled_by_probe": True}).to_dict())
    return outcome


def _denied(name: str, code: str, reason: str, *, verdict: Verdict | None = None, key_state: str = NOT_REQUIRED, data: dict | None = None) -> Observation:
    verdict = verdict or Verdict(False, reason, code)
    return Observation(tool=name, decision=verdict, error=reason, idempotency_state=key_state, data=data or {})


def _observed(name: str, verdict: Verdict, result: ToolResult, *, key: str | None = None, state: str = NOT_REQUIRED,
              replayed: bool = False, extra_error: str | None = None) -> Observation:
    error = "; ".join(e for e in (result.error, extra_error) if e) or None
    return Observation(
        tool=name, decision=verdict, output=result.output, error=error, exit_status=result.exit_status,
        truncated=result.truncated, idempotency_key=key, idempotency_state=state, replayed=replayed, data=result.data,
    )


def stored_result(value: Any) -> ToolResult:
    """A COMPLETED record's result as a ToolResult; StoreUnavailable when the row is not one."""
    if not isinstance(value, dict):
        raise StoreUnavailable(f"stored result is a {type(value).__name__}, not a ToolResult object")
    types = {"output": (str,), "error": (str, type(None)), "exit_status": (int, type(None)), "truncated": (bool,), "data": (dict,)}
    for name, allowed in types.items():
        if name in value and not isinstance(value[name], allowed):
            raise StoreUnavailable(f"stored result field {name!r} is a {type(value[name]).__name__}")
    return ToolResult.from_dict(value)


def _from_record(name: str, verdict: Verdict, key: str, record: Record) -> Observation:
    if record.state is RecordState.COMPLETED:
        return _observed(name, verdict, stored_result(record.result), key=key, state=record.state.value, replayed=True)
    if record.state is RecordState.IN_FLIGHT:
        until = record.lease_expires_at
        when = f"{until:.3f}" if isinstance(until, (int, float)) else repr(until)
        error = f"not run: this call is in flight elsewhere (lease until {when})"
    elif record.state is RecordState.IN_DOUBT:
        error = f"not run: an earlier execution's effect is unknown ({record.error}); settle it with Runtime.settle(key)"
    else:
        raise StoreUnavailable(f"the store refused a claim of a record in state {record.state.value}")
    return _observed(name, verdict, ToolResult(error=error), key=key, state=record.state.value)
