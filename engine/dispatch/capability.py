"""Capabilities C = (R, O, P, E): rights, objects, a cost ceiling and an expiry, HMAC-signed.

The signature is HMAC-SHA256 over the RFC 8785 canonical body (never `repr`), keyed with a
secret only the runtime holds (`Authority`). Rights are strings: `read`, `write`, `exec`,
`call:<tool>` or `call:*`, and `approve:<tool>` / `approve:*` (the approval an A3 tool needs).
Objects are absolute path prefixes, resolved when issued (`Authority.issue`, `attenuate`);
a target is compared with them component by component after `realpath` (so `..` and
symlinks are resolved and `/work` never admits `/workspace_evil`), or exact
resource ids (anything not starting with `/`). `attenuate` only narrows; a child carries its
parent and is checked against it on every `approve`. This module does not execute anything.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath

import rfc8785

from surecall.errors import CapabilityError

DEFAULT_SKEW_S = 30.0
MIN_KEY_BYTES = 16
RIGHT_READ, RIGHT_WRITE, RIGHT_EXEC = "read", "write", "exec"


class DenyCode(str, enum.Enum):
    """Why a decision went the way it did (ALLOWED on success)."""

    ALLOWED = "allowed"
    BAD_SIGNATURE = "bad_signature"
    EXPIRED = "expired"
    NOT_YET_VALID = "not_yet_valid"
    WIDER_THAN_PARENT = "wider_than_parent"
    RIGHT_MISSING = "right_missing"
    OBJECT_OUTSIDE = "object_outside"
    BAD_PATH = "bad_path"
    COST_EXCEEDED = "cost_exceeded"


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str
    code: DenyCode = DenyCode.ALLOWED

    def raise_if_denied(self) -> None:
        if not self.allowed:
            raise CapabilityError(f"capability denied ({self.code.value}): {self.reason}")


@dataclass(frozen=True)
class Capability:
    """R: rights, O: objects, P: per-call cost ceiling (None = unlimited), E: expiry (unix s)."""

    rights: frozenset[str]
    objects: tuple[str, ...]
    max_cost: float | None
    expires_at: float
    issued_at: float = 0.0
    parent: Capability | None = field(default=None, repr=False)
    signature: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "rights", frozenset(self.rights))
        object.__setattr__(self, "objects", tuple(sorted(set(self.objects))))
        for right in self.rights:
            if not isinstance(right, str) or not right:
                raise ValueError(f"Invalid capability right: expected a non-empty string, got {right!r}")
        for obj in self.objects:
            if not isinstance(obj, str) or not obj or "\x00" in obj:
                raise ValueError(f"Invalid capability object: expected a non-empty string, got {obj!r}")
        if self.max_cost is not None and not (isinstance(self.max_cost, (int, float)) and self.max_cost >= 0):
            raise ValueError(f"Invalid capability max_cost: expected None or a number >= 0, got {self.max_cost!r}")

    def body(self) -> dict:
        """What the signature covers (JSON; canonicalised with RFC 8785)."""
        return {
            "v": 1,
            "rights": sorted(self.rights),
            "objects": list(self.objects),
            "max_cost": self.max_cost,
            "expires_at": self.expires_at,
            "issued_at": self.issued_at,
            "parent": self.parent.signature if self.parent is not None else None,
        }

    def to_dict(self) -> dict:
        """Serialisable form (with the parent chain and the signature)."""
        out = self.body()
        out["parent"] = self.parent.to_dict() if self.parent is not None else None
        out["signature"] = self.signature
        return out

    @classmethod
    def from_dict(cls, data: dict) -> Capability:
        try:
            parent = cls.from_dict(data["parent"]) if data.get("parent") else None
            return cls(
                rights=frozenset(data["rights"]), objects=tuple(data["objects"]), max_cost=data["max_cost"],
                expires_at=data["expires_at"], issued_at=data.get("issued_at", 0.0), parent=parent,
                signature=data.get("signature", ""),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CapabilityError(f"malformed capability: {exc}") from exc


def canonical_body(cap: Capability) -> bytes:
    try:
        return rfc8785.dumps(cap.body())
    except Exception as exc:
        raise CapabilityError(f"capability body cannot be canonicalised: {exc}") from exc


def _mac(cap: Capability, key: bytes) -> str:
    return hmac.new(key, canonical_body(cap), hashlib.sha256).hexdigest()


def sign(cap: Capability, key: bytes) -> Capability:
    """A copy of `cap` with its HMAC-SHA256 signature (the key never leaves the caller)."""
    _check_key(key)
    return replace(cap, signature=_mac(cap, key))


def verify(cap: Capability, key: bytes, now: float | None = None, skew_s: float = DEFAULT_SKEW_S) -> Decision:
    """Signature, validity window (with `skew_s` of clock allowance) and, along the parent
    chain, that each child is no wider than its parent."""
    _check_key(key)
    return check_static(cap, key) or check_window(cap, time.time() if now is None else now, skew_s)


def check_static(cap: Capability, key: bytes) -> Decision | None:
    """The time-independent part of `verify` (signatures, child <= parent): a denial or None."""
    if not cap.signature or not hmac.compare_digest(_mac(cap, key), cap.signature):
        return Decision(False, "signature does not match the capability body (tampered or foreign key)", DenyCode.BAD_SIGNATURE)
    if cap.parent is not None:
        denied = check_static(cap.parent, key)
        if denied is not None:
            return denied
        wider = _widening(cap.parent, cap)
        if wider:
            return Decision(False, f"child is wider than its parent: {wider}", DenyCode.WIDER_THAN_PARENT)
    return None


def check_window(cap: Capability, now: float, skew_s: float) -> Decision:
    """Expiry and not-before of `cap` and every ancestor, with `skew_s` of allowance."""
    node: Capability | None = cap
    while node is not None:
        if now > node.expires_at + skew_s:
            return Decision(False, f"expired at {node.expires_at:.3f}, now {now:.3f} (skew allowance {skew_s} s)", DenyCode.EXPIRED)
        if now < node.issued_at - skew_s:
            return Decision(False, f"not valid before {node.issued_at:.3f}, now {now:.3f} (skew allowance {skew_s} s)", DenyCode.NOT_YET_VALID)
        node = node.parent
    return Decision(True, "signature and validity window ok")


def approve(
    cap: Capability, op: str, target: str | os.PathLike | None, cost: float = 0.0, now: float | None = None,
    *, key: bytes, skew_s: float = DEFAULT_SKEW_S,
) -> Decision:
    """May `cap` perform right `op` on `target` (a path, a resource id, or None) at `cost`?"""
    decision = verify(cap, key, now, skew_s)
    return decision if not decision.allowed else authorize(cap, op, target, cost)


def authorize(cap: Capability, op: str, target, cost: float = 0.0) -> Decision:
    """Rights, cost ceiling and objects only: for a capability already verified."""
    if not has_right(cap.rights, op):
        return Decision(False, f"right {op!r} not in {sorted(cap.rights)}", DenyCode.RIGHT_MISSING)
    if cap.max_cost is not None and cost > cap.max_cost:
        return Decision(False, f"cost {cost} exceeds the ceiling {cap.max_cost}", DenyCode.COST_EXCEEDED)
    if target is not None:
        return _approve_object(cap, target)
    return Decision(True, f"{op!r} allowed")


def attenuate(
    parent: Capability, key: bytes, *, rights=None, objects=None, max_cost: float | None = None,
    expires_at: float | None = None, now: float | None = None,
) -> Capability:
    """A signed child that is at most as wide as `parent` (any argument left None is inherited).
    CapabilityError if the parent does not verify or the child would be wider."""
    decision = verify(parent, key, now)
    if not decision.allowed:
        raise CapabilityError(f"cannot attenuate: parent denied ({decision.code.value}): {decision.reason}")
    child = Capability(
        rights=parent.rights if rights is None else frozenset(rights),
        objects=parent.objects if objects is None else tuple(normalise_object(o) for o in objects),
        max_cost=parent.max_cost if max_cost is None else max_cost,
        expires_at=parent.expires_at if expires_at is None else expires_at,
        issued_at=time.time() if now is None else now,
        parent=parent,
    )
    wider = _widening(parent, child)
    if wider:
        raise CapabilityError(f"cannot attenuate: child would be wider than its parent: {wider}")
    return sign(child, key)


class Authority:
    """Holds the signing key and the skew allowance; issues, attenuates and checks capabilities."""

    def __init__(self, key: bytes, skew_s: float = DEFAULT_SKEW_S):
        _check_key(key)
        if skew_s < 0:
            raise ValueError(f"Invalid skew_s: expected >= 0, got {skew_s}")
        self._key = bytes(key)
        self.skew_s = float(skew_s)
        self._checked: dict[Capability, Decision | None] = {}

    def __repr__(self) -> str:  # never print the key
        return f"Authority(skew_s={self.skew_s})"

    def issue(self, rights, objects, max_cost: float | None = None, ttl_s: float = 3600.0, now: float | None = None) -> Capability:
        now = time.time() if now is None else now
        objs = tuple(normalise_object(o) for o in objects)
        return sign(Capability(frozenset(rights), objs, max_cost, now + ttl_s, issued_at=now), self._key)

    def verify(self, cap: Capability, now: float | None = None) -> Decision:
        """As `verify`, remembering capabilities whose signatures were checked (by value: a
        tampered copy is a different key, so it is checked afresh); the window is always checked."""
        try:
            static = self._checked[cap]
        except KeyError:
            static = check_static(cap, self._key)
            if len(self._checked) >= 4096:
                self._checked.clear()
            self._checked[cap] = static
        return static or check_window(cap, time.time() if now is None else now, self.skew_s)

    def approve(self, cap: Capability, op: str, target=None, cost: float = 0.0, now: float | None = None) -> Decision:
        decision = self.verify(cap, now)
        return decision if not decision.allowed else authorize(cap, op, target, cost)

    def attenuate(self, parent: Capability, **narrower) -> Capability:
        return attenuate(parent, self._key, **narrower)


# --- helpers -------------------------------------------------------------------------------
def has_right(rights: frozenset[str], op: str) -> bool:
    """Exact match, or a `prefix:*` wildcard right covering `prefix:<anything>`."""
    if op in rights:
        return True
    prefix, sep, _ = op.partition(":")
    return bool(sep) and f"{prefix}:*" in rights


def normalise_object(obj: str | os.PathLike) -> str:
    """Paths become absolute real paths (symlinks and `..` resolved); resource ids stay as given."""
    text = os.fspath(obj)
    return os.path.realpath(text) if text.startswith("/") else text


def path_within(target: str, prefix: str) -> bool:
    """Component-wise containment of two already-resolved absolute paths."""
    t, p = PurePosixPath(target).parts, PurePosixPath(prefix).parts
    return t[: len(p)] == p


def _approve_object(cap: Capability, target) -> Decision:
    text = os.fspath(target)
    if not isinstance(text, str) or not text or "\x00" in text:
        return Decision(False, f"target {target!r} is not a valid path or resource id", DenyCode.BAD_PATH)
    if not text.startswith("/"):
        if text in cap.objects:
            return Decision(True, f"resource {text!r} allowed")
        if os.sep in text or text in (".", ".."):
            return Decision(False, f"relative path {text!r}: resolve it against the workspace first", DenyCode.BAD_PATH)
        return Decision(False, f"resource {text!r} not among the objects {list(cap.objects)}", DenyCode.OBJECT_OUTSIDE)
    resolved = os.path.realpath(text)
    for obj in cap.objects:
        if obj.startswith("/") and path_within(resolved, obj):
            return Decision(True, f"{resolved} is inside {obj}")
    return Decision(False, f"{text} resolves to {resolved}, outside the objects {list(cap.objects)}", DenyCode.OBJECT_OUTSIDE)


def _widening(parent: Capability, child: Capability) -> str:
    """'' when child <= parent, else what is wider."""
    extra_rights = [r for r in child.rights if not has_right(parent.rights, r)]
    if extra_rights:
        return f"rights {sorted(extra_rights)} not in the parent's {sorted(parent.rights)}"
    for obj in child.objects:
        if not _object_covered(obj, parent.objects):
            return f"object {obj!r} is not inside the parent's objects {list(parent.objects)}"
    if parent.max_cost is not None and (child.max_cost is None or child.max_cost > parent.max_cost):
        return f"cost ceiling {child.max_cost} above the parent's {parent.max_cost}"
    if child.expires_at > parent.expires_at:
        return f"expiry {child.expires_at} after the parent's {parent.expires_at}"
    return ""


def _object_covered(obj: str, parent_objects: tuple[str, ...]) -> bool:
    if not obj.startswith("/"):
        return obj in parent_objects
    resolved = os.path.realpath(obj)
    return any(p.startswith("/") and path_within(resolved, os.path.realpath(p)) for p in parent_objects)


def _check_key(key: bytes) -> None:
    if not isinstance(key, (bytes, bytearray)) or len(key) < MIN_KEY_BYTES:
        raise CapabilityError(f"signing key must be at least {MIN_KEY_BYTES} bytes")
