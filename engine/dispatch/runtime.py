"""`Runtime.dispatch`: every tool call crosses validate -> approve -> claim -> execute -> record.

One call, one `Observation` (the same shape for every tool): the tool's output and error, the
exit status (shell only), a truncation flag, the idempotency key and state, and the decision
that allowed or denied it. Nothing raises for a bad call: an unknown tool, invalid arguments,
a path outside the workspace or a denied capability each come back as a denied observation
(so the agent loop can show it to the model and keep serving). A2/A3 calls claim an
idempotency key first; a replay of a COMPLETED call returns the stored result without running
again; an IN_DOUBT call is settled by the tool's reconciliation probe (`Tool.probe`) before
anything re-runs. It does not decode, sandbox or hold tool logic: see `surecall.toolbox`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from surecall.dispatch.capability import Authority, Capability, Decision
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
from surecall.dispatch.validate import validate_arguments
from surecall.errors import (
    ArgumentValidationError,
    IdempotencyConflict,
    LeaseLost,
    PathOutsideWorkspace,
    SandboxUnavailable,
    StoreUnavailable,
    ToolDefinitionError,
    ToolError,
)
from surecall.toolbox.result import Plan, ToolResult
from surecall.tools import Tool

NOT_REQUIRED, NOT_CLAIMED = "NOT_REQUIRED", "NOT_CLAIMED"


@dataclass(frozen=True)
class Verdict:
    """Whether the call was allowed to run, why, and a stable code (`allowed`, `unknown_tool`,
    `invalid_arguments`, `outside_workspace`, or a capability `DenyCode` value)."""

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


def _unpack(call: Any) -> tuple[str, dict]:
    if isinstance(call, Mapping):
        return str(call.get("name", "")), call.get("arguments", {})
    return str(getattr(call, "name", "")), getattr(call, "arguments", {})


def coerce_result(value: Any) -> ToolResult:
    """A handler's return value as a ToolResult (strings are output; other JSON goes to data)."""
    if isinstance(value, ToolResult):
        return value
    if isinstance(value, str):
        return ToolResult(output=value)
    return ToolResult(output=json.dumps(value, ensure_ascii=False), data={"value": value})


class Runtime:
    """Runs tool calls under signed capabilities, at most once where the side-effect level says so."""

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
    ):
        self.tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self.tools:
                raise ToolDefinitionError(f"duplicate tool name {tool.name!r} in the runtime's catalog")
            if tool.handler is None:
                raise ToolDefinitionError(f"tool {tool.name!r} has no handler: the runtime cannot execute it")
            self.tools[tool.name] = tool
        if not lease_s > 0:
            raise ValueError(f"Invalid lease_s: expected > 0, got {lease_s!r}")
        self.store, self.lease_s, self.clock, self.auto_settle = store, float(lease_s), clock, auto_settle
        self._authority = Authority(signing_key, skew_s)
        self._intents: dict[str, tuple[str, dict]] = {}  # key -> (tool, arguments), for settle(key)

    def __repr__(self) -> str:
        return f"Runtime(tools={sorted(self.tools)}, store={self.store!r})"

    def issue(self, rights: Iterable[str], objects: Iterable[str], *, max_cost: float | None = None, ttl_s: float = 3600.0) -> Capability:
        """A capability signed with the runtime's key (only the runtime holds it)."""
        return self._authority.issue(rights, objects, max_cost=max_cost, ttl_s=ttl_s, now=self.clock())

    def attenuate(self, parent: Capability, **narrower) -> Capability:
        return self._authority.attenuate(parent, **narrower)

    # --- the one entry point -------------------------------------------------------------
    def dispatch(self, call: Any, capability: Capability, trajectory_id: str, turn: int, call_id: str) -> Observation:
        """Validate, approve, claim, execute and record one call; always returns an Observation."""
        name, arguments = _unpack(call)
        # 1. look the tool up and validate the arguments against its published schema
        tool = self.tools.get(name)
        if tool is None:
            return _denied(name, "unknown_tool", f"unknown tool {name!r}; this runtime serves {sorted(self.tools)}")
        try:
            validate_arguments(tool, arguments)
        except ArgumentValidationError as exc:
            return _denied(name, "invalid_arguments", str(exc), data={"errors": exc.errors})
        # 2. bind the call to what it touches, and approve each of those against the capability
        try:
            plan = self._plan(tool, arguments, capability)
        except PathOutsideWorkspace as exc:
            return _denied(name, "outside_workspace", str(exc))
        except (ToolError, ValueError) as exc:
            return _denied(name, "bad_input", str(exc))
        verdict = self._approve(tool, plan, capability)
        if not verdict.allowed:
            return _denied(name, verdict.code, verdict.reason, verdict=verdict, key_state=self._key_state(tool))
        # 3. run: directly when the level allows re-running, else at most once under a key
        if not tool.level.requires_idempotency_key:
            result, _ = _run(plan)
            return _observed(name, verdict, result)
        key = derive_key(trajectory_id, turn, call_id, name, arguments)
        return self._run_once(tool, arguments, plan, key, verdict)

    def settle(self, key: str, call: Any = None) -> Record:
        """Settle an IN_DOUBT record with the tool's reconciliation probe. `call` (name and
        arguments) is needed when this runtime did not dispatch the key itself (after a crash)."""
        name, arguments = _unpack(call) if call is not None else self._intents.get(key, ("", {}))
        tool = self.tools.get(name)
        if tool is None:
            raise IdempotencyConflict(f"cannot settle {key[:16]}...: unknown call; pass call=(name, arguments)")
        if split_key(key)[1] != fingerprint(arguments):
            raise IdempotencyConflict(f"cannot settle {key[:16]}...: the arguments given are not the ones the key was derived from")
        if tool.probe is None:
            raise IdempotencyConflict(f"cannot settle {key[:16]}...: tool {name!r} declares no reconciliation probe")
        return self.store.settle(key, lambda _record: _probe(tool, arguments), now=self.clock())

    # --- steps ---------------------------------------------------------------------------
    def _plan(self, tool: Tool, arguments: dict, capability: Capability) -> Plan:
        objects = tuple(getattr(capability, "objects", ()))
        if hasattr(tool.handler, "plan"):
            return tool.handler.plan(arguments, objects)
        return Plan((), run=lambda: coerce_result(tool.handler(**arguments)))

    def _approve(self, tool: Tool, plan: Plan, capability: Capability) -> Verdict:
        if not isinstance(capability, Capability):
            return Verdict(False, f"expected a Capability, got {type(capability).__name__}", "bad_capability")
        now = self.clock()
        checks = [(f"call:{tool.name}", None)]
        if tool.level.requires_approval:
            checks.append((f"approve:{tool.name}", None))
        checks += [(access.right, access.path) for access in plan.accesses]
        reasons = []
        for op, target in checks:
            decision = self._authority.approve(capability, op, target, now=now)
            if not decision.allowed:
                return Verdict.of(decision)
            reasons.append(decision.reason)
        return Verdict(True, "; ".join(reasons))

    def _key_state(self, tool: Tool) -> str:
        return NOT_CLAIMED if tool.level.requires_idempotency_key else NOT_REQUIRED

    def _lease_for(self, arguments: dict) -> float:
        return lease_for(arguments.get("timeout_ms"), self.lease_s)

    def _run_once(self, tool: Tool, arguments: dict, plan: Plan, key: str, verdict: Verdict) -> Observation:
        name = tool.name
        try:
            claim = self.store.claim(key, lease_s=self._lease_for(arguments), now=self.clock())
            if not claim.acquired and claim.record.state is RecordState.IN_DOUBT and self.auto_settle and tool.probe:
                # settle first: COMPLETED is then replayed, NOT_EXECUTED claimed and run, None stays
                self.settle(key, {"name": name, "arguments": arguments})
                claim = self.store.claim(key, lease_s=self._lease_for(arguments), now=self.clock())
        except (StoreUnavailable, IdempotencyConflict) as exc:
            return _observed(name, verdict, ToolResult(error=f"not run: {exc}"), key=key, state=NOT_CLAIMED)
        if not claim.acquired:
            return _from_record(name, verdict, key, claim.record)
        self._intents[key] = (name, arguments)
        return self._execute_claimed(name, plan, key, claim, self._lease_for(arguments), verdict)

    def _execute_claimed(self, name: str, plan: Plan, key: str, claim: Claim, lease_s: float, verdict: Verdict) -> Observation:
        owner, token = claim.owner, claim.token
        try:
            with hold_lease(self.store, key, claim, lease_s=lease_s, clock=self.clock):  # heartbeat while it runs
                result, failure = _run(plan)
        except LeaseLost as exc:  # raised on entry only: the lease lapsed before the run, nothing ran
            return _observed(name, verdict, ToolResult(error=f"not run: {exc}"), key=key, state=NOT_CLAIMED)
        except BaseException as exc:  # interrupted mid-call: the effect is unknown
            self.store.fail(key, owner, f"interrupted: {type(exc).__name__}", token=token, now=self.clock())
            raise
        try:
            if failure == "refused":
                record = self.store.release(key, owner, result.error or "", token=token, now=self.clock())
            elif failure == "failed":
                record = self.store.fail(key, owner, result.error or "", token=token, now=self.clock())
            else:
                record = self.store.complete(key, owner, result.to_dict(), token=token, now=self.clock())
            if record.state is not RecordState.IN_DOUBT:
                self._intents.pop(key, None)  # only IN_DOUBT records may need settle(key) later
        except (StoreUnavailable, IdempotencyConflict) as exc:
            error = f"ran, but the result could not be recorded ({exc}); the record will turn IN_DOUBT"
            return _observed(name, verdict, result, key=key, state="UNRECORDED", extra_error=error)
        return _observed(name, verdict, result, key=key, state=record.state.value)


# --- helpers ---------------------------------------------------------------------------------
def _run(plan: Plan) -> tuple[ToolResult, str | None]:
    """(result, failure): failure None (a result, refusals included), 'refused' (the tool did
    not start: nothing ran) or 'failed' (it broke mid-way: the effect is unknown)."""
    try:
        return plan.run(), None
    except SandboxUnavailable as exc:
        return ToolResult(error=str(exc)), "refused"
    except ToolError as exc:  # a refusal: the tool guarantees nothing changed
        return ToolResult(error=str(exc)), None
    except Exception as exc:
        return ToolResult(error=f"tool failed: {type(exc).__name__}: {exc}"), "failed"


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


def _from_record(name: str, verdict: Verdict, key: str, record: Record) -> Observation:
    if record.state is RecordState.COMPLETED:
        stored = ToolResult.from_dict(record.result if isinstance(record.result, dict) else {"output": str(record.result)})
        return _observed(name, verdict, stored, key=key, state=record.state.value, replayed=True)
    if record.state is RecordState.IN_FLIGHT:
        error = f"not run: this call is in flight elsewhere (lease until {record.lease_expires_at:.3f})"
    else:
        error = f"not run: an earlier execution's effect is unknown ({record.error}); settle it with Runtime.settle(key)"
    return _observed(name, verdict, ToolResult(error=error), key=key, state=record.state.value)
