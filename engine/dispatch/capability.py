"""Capabilities C = (R, O, P, E): rights, objects, a cost ceiling and an expiry, as a MAC chain.

Macaroon-style: the root's MAC is HMAC-SHA256(key, JCS(body_0)), each child's HMAC-SHA256(
parent_mac, JCS(body_i)) (JCS = RFC 8785). A child carries its ancestors' bodies, never their
MACs, so no wider signature can be recovered from it; anyone may attenuate without the key, and
verification (key held only by the runtime) recomputes the chain and checks each link narrows
its parent (rights, objects, cost, expiry). Rights: `read`, `write`, `exec`, `call:<tool>`,
`approve:<tool>` (`:*` wildcards). Objects: absolute path prefixes compared by component after
`realpath`, or exact resource ids. It executes nothing. (Past 400 lines: chain, serialisation
and narrowing are one security argument, read together.)
"""
# Adapted from the macaroon construction: Birgisson et al., "Macaroons: Cookies with Contextual
# Caveats for Decentralized Authorization in the Cloud", NDSS 2014 (chained HMAC over caveats).

from __future__ import annotations

import enum
import hashlib
import hmac
import math
import os
import re
import threading
import time
from dataclasses import dataclass, fields
from pathlib import PurePosixPath
from typing import Any

import rfc8785

from surecall.errors import CapabilityError

DEFAULT_SKEW_S = 30.0
MIN_KEY_BYTES = 16
MAX_CHAIN_DEPTH = 64  # links after the root; verification is one HMAC and one narrowing check per link
BODY_VERSION = 2  # v1 carried the whole signed parent (a holder could present it): refused
NAME_MAX_BYTES, PATH_MAX_BYTES = 255, 4096  # Linux limits: a longer path is ENAMETOOLONG before anything runs
RIGHT_READ, RIGHT_WRITE, RIGHT_EXEC = "read", "write", "exec"
_HEX_MAC = re.compile(r"[0-9a-f]{64}")
_CAVEAT_KEYS = ("rights", "objects", "max_cost", "expires_at", "issued_at")


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
    BAD_COST = "bad_cost"
    MALFORMED = "bad_capability"


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str
    code: DenyCode = DenyCode.ALLOWED

    def raise_if_denied(self) -> None:
        if not self.allowed:
            raise CapabilityError(f"capability denied ({self.code.value}): {self.reason}")


@dataclass(frozen=True)
class Caveats:
    """One link's body: R rights, O objects, P per-call cost ceiling (None = unlimited),
    E expiry and issue time (unix s). What a MAC covers; it carries no signature."""

    rights: frozenset[str]
    objects: tuple[str, ...]
    max_cost: float | None
    expires_at: float
    issued_at: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.rights, str) or not _is_iterable(self.rights):
            raise ValueError(f"Invalid capability rights: expected a set of strings, got {self.rights!r}")
        if isinstance(self.objects, str) or not _is_iterable(self.objects):
            raise ValueError(f"Invalid capability objects: expected a list of strings, got {self.objects!r}")
        object.__setattr__(self, "rights", frozenset(self.rights))
        for right in self.rights:
            if not _is_text(right):
                raise ValueError(f"Invalid capability right: expected a non-empty string, got {right!r}")
        for obj in self.objects:
            if not _is_text(obj) or "\x00" in obj:
                raise ValueError(f"Invalid capability object: expected a non-empty string, got {obj!r}")
        object.__setattr__(self, "objects", tuple(sorted(set(self.objects))))
        if self.max_cost is not None and not (is_finite_number(self.max_cost) and self.max_cost >= 0):
            raise ValueError(f"Invalid capability max_cost: expected None or a finite number >= 0, got {self.max_cost!r}")
        for name in ("expires_at", "issued_at"):
            if not is_finite_number(getattr(self, name)):
                raise ValueError(f"Invalid capability {name}: expected a finite number, got {getattr(self, name)!r}")

    def caveats(self) -> Caveats:
        """This link's body alone (a Capability without its chain and signature)."""
        return Caveats(self.rights, self.objects, self.max_cost, self.expires_at, self.issued_at)

    def body(self, depth: int = 0) -> dict:
        """What the MAC of the link at `depth` (0 = root) covers, as JSON for RFC 8785."""
        return {"v": BODY_VERSION, "depth": depth, **self.to_dict_caveats()}

    def to_dict_caveats(self) -> dict:
        return {"rights": sorted(self.rights), "objects": list(self.objects), "max_cost": self.max_cost,
                "expires_at": self.expires_at, "issued_at": self.issued_at}


@dataclass(frozen=True)
class Capability(Caveats):
    """The leaf caveats (what this capability allows), the ancestors' bodies `chain` (root first,
    without their MACs) and the chained `signature`. Verify it with `verify` or `Authority`."""

    chain: tuple[Caveats, ...] = ()
    signature: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.chain, (str, bytes)) or not _is_iterable(self.chain):
            raise ValueError(f"Invalid capability chain: expected a list of caveat bodies, got {type(self.chain).__name__}")
        chain = tuple(self.chain)
        if len(chain) > MAX_CHAIN_DEPTH:
            raise ValueError(f"Invalid capability chain: expected at most {MAX_CHAIN_DEPTH} ancestors, got {len(chain)}")
        for link in chain:
            if not isinstance(link, Caveats):
                raise ValueError(f"Invalid capability chain link: expected Caveats, got {type(link).__name__}")
        object.__setattr__(self, "chain", tuple(link.caveats() for link in chain))  # never keep a MAC
        if not isinstance(self.signature, str):
            raise ValueError(f"Invalid capability signature: expected a hex string, got {type(self.signature).__name__}")

    @property
    def depth(self) -> int:
        return len(self.chain)

    def links(self) -> tuple[Caveats, ...]:
        """Root first, this capability's own caveats last."""
        return (*self.chain, self.caveats())

    def body(self, depth: int | None = None) -> dict:
        return super().body(self.depth if depth is None else depth)

    def to_dict(self) -> dict:
        """Serialisable form: the leaf caveats, the ancestors' bodies and the one signature."""
        return {"v": BODY_VERSION, **self.to_dict_caveats(), "chain": [link.to_dict_caveats() for link in self.chain],
                "signature": self.signature}

    @classmethod
    def from_dict(cls, data: Any) -> Capability:
        """The capability in `data` (as `to_dict` writes it); CapabilityError naming the bad field."""
        if not isinstance(data, dict):
            raise CapabilityError(f"malformed capability: expected a JSON object, got {type(data).__name__}")
        if data.get("v") != BODY_VERSION:
            raise CapabilityError(f"malformed capability: expected version v={BODY_VERSION}, got {data.get('v')!r} "
                                  "(v1 capabilities embedded their signed parent and are refused: reissue)")
        unknown = sorted(set(data) - {"v", "chain", "signature", *_CAVEAT_KEYS}, key=str)
        if unknown:
            raise CapabilityError(f"malformed capability: unknown fields {unknown}")
        chain, signature = data.get("chain", []), data.get("signature", "")
        if not isinstance(chain, list) or len(chain) > MAX_CHAIN_DEPTH:
            raise CapabilityError(f"malformed capability: /chain must be a list of at most {MAX_CHAIN_DEPTH} bodies")
        if not isinstance(signature, str) or not _HEX_MAC.fullmatch(signature):
            raise CapabilityError("malformed capability: /signature must be 64 lowercase hex digits")
        links = tuple(_caveats_from(link, f"/chain/{i}") for i, link in enumerate(chain))
        leaf = _caveats_from({k: v for k, v in data.items() if k in _CAVEAT_KEYS}, "")
        return cls(*(getattr(leaf, f.name) for f in fields(Caveats)), chain=links, signature=signature)


def _caveats_from(data: Any, where: str) -> Caveats:
    if not isinstance(data, dict):
        raise CapabilityError(f"malformed capability: {where or '/'} must be an object, got {type(data).__name__}")
    missing = [k for k in _CAVEAT_KEYS if k not in data]
    extra = sorted(set(data) - set(_CAVEAT_KEYS), key=str)
    if missing or extra:
        raise CapabilityError(f"malformed capability: {where or '/'} missing {missing}, unknown {extra}")
    for name in ("rights", "objects"):
        if not isinstance(data[name], list):
            raise CapabilityError(f"malformed capability: {where}/{name} must be a list of strings, got {type(data[name]).__name__}")
    try:
        return Caveats(frozenset(data["rights"]), tuple(data["objects"]), data["max_cost"], data["expires_at"], data["issued_at"])
    except (TypeError, ValueError) as exc:
        raise CapabilityError(f"malformed capability at {where or '/'}: {exc}") from exc


# --- the MAC chain ---------------------------------------------------------------------------
def canonical_body(cap: Caveats, depth: int | None = None) -> bytes:
    try:
        return rfc8785.dumps(cap.body() if depth is None else cap.body(depth))
    except Exception as exc:
        raise CapabilityError(f"capability body cannot be canonicalised: {exc}") from exc


def _link_mac(parent_mac: bytes, link: Caveats, depth: int) -> bytes:
    return hmac.new(parent_mac, canonical_body(link, depth), hashlib.sha256).digest()


def chain_mac(key: bytes, links: tuple[Caveats, ...]) -> str:
    """HMAC(...HMAC(HMAC(key, body_0), body_1)..., body_n) as hex."""
    mac = bytes(key)
    for depth, link in enumerate(links):
        mac = _link_mac(mac, link, depth)
    return mac.hex()


def sign(cap: Capability, key: bytes) -> Capability:
    """A copy of `cap` with the chained signature over its links (the key never leaves the caller).
    Signing does not check that the links narrow: `verify` does, on every use."""
    _check_key(key)
    return Capability(*(getattr(cap, f.name) for f in fields(Caveats)), chain=cap.chain, signature=chain_mac(key, cap.links()))


def verify(cap: Capability, key: bytes, now: float | None = None, skew_s: float = DEFAULT_SKEW_S) -> Decision:
    """Chained signature, every link no wider than its parent, and the validity window of every
    link (with `skew_s` of clock allowance)."""
    _check_key(key)
    return check_static(cap, key) or check_window(cap, time.time() if now is None else now, skew_s)


def check_static(cap: Capability, key: bytes) -> Decision | None:
    """The time-independent part of `verify` (signature, narrowing): a denial or None."""
    if not isinstance(cap, Capability):
        return Decision(False, f"expected a Capability, got {type(cap).__name__}", DenyCode.MALFORMED)
    links = cap.links()
    if not hmac.compare_digest(chain_mac(key, links), cap.signature):
        return Decision(False, "signature does not match the capability chain (tampered, foreign key, or a parent "
                               "rebuilt from a child)", DenyCode.BAD_SIGNATURE)
    for depth in range(1, len(links)):
        wider = _widening(links[depth - 1], links[depth])
        if wider:
            return Decision(False, f"link {depth} is wider than its parent: {wider}", DenyCode.WIDER_THAN_PARENT)
    return None


def check_window(cap: Capability, now: float, skew_s: float) -> Decision:
    """Expiry and not-before of every link, with `skew_s` of allowance."""
    if not is_finite_number(now):
        return Decision(False, f"the clock reads {now!r}, not a finite time", DenyCode.EXPIRED)
    for link in cap.links():
        if now > link.expires_at + skew_s:
            return Decision(False, f"expired at {link.expires_at:.3f}, now {now:.3f} (skew allowance {skew_s} s)", DenyCode.EXPIRED)
        if now < link.issued_at - skew_s:
            return Decision(False, f"not valid before {link.issued_at:.3f}, now {now:.3f} (skew allowance {skew_s} s)", DenyCode.NOT_YET_VALID)
    return Decision(True, "signature and validity window ok")


def approve(
    cap: Capability, op: str, target: str | os.PathLike | None, cost: float = 0.0, now: float | None = None,
    *, key: bytes, skew_s: float = DEFAULT_SKEW_S,
) -> Decision:
    """May `cap` perform right `op` on `target` (a path, a resource id, or None) at `cost`?"""
    decision = verify(cap, key, now, skew_s)
    return decision if not decision.allowed else authorize(cap, op, target, cost)


def authorize(cap: Capability, op: str, target, cost: float = 0.0) -> Decision:
    """Rights, cost ceiling and objects only: for a capability already verified. A cost that is
    not a finite number >= 0 (NaN compares false with any ceiling) is refused."""
    if not is_finite_number(cost) or cost < 0:
        return Decision(False, f"cost {cost!r} is not a finite number >= 0", DenyCode.BAD_COST)
    if not has_right(cap.rights, op):
        return Decision(False, f"right {op!r} not in {sorted(cap.rights)}", DenyCode.RIGHT_MISSING)
    if cap.max_cost is not None and cost > cap.max_cost:
        return Decision(False, f"cost {cost} exceeds the ceiling {cap.max_cost}", DenyCode.COST_EXCEEDED)
    if target is not None:
        return _approve_object(cap, target)
    return Decision(True, f"{op!r} allowed")


def attenuate(
    parent: Capability, key: bytes | None = None, *, rights=None, objects=None, max_cost: float | None = None,
    expires_at: float | None = None, now: float | None = None,
) -> Capability:
    """A child at most as wide as `parent` (any argument left None is inherited), MAC-chained from
    the parent's signature, so no key is needed; with `key` the parent is verified first.
    CapabilityError if the parent does not verify or the child would be wider."""
    if key is not None:
        decision = verify(parent, key, now)
        if not decision.allowed:
            raise CapabilityError(f"cannot attenuate: parent denied ({decision.code.value}): {decision.reason}")
    if not _HEX_MAC.fullmatch(parent.signature):
        raise CapabilityError("cannot attenuate: the parent is unsigned")
    if parent.depth >= MAX_CHAIN_DEPTH:
        raise CapabilityError(f"cannot attenuate: the chain already has {MAX_CHAIN_DEPTH} links after the root")
    try:
        child = Caveats(
            rights=parent.rights if rights is None else frozenset(rights),
            objects=parent.objects if objects is None else tuple(normalise_object(o) for o in objects),
            max_cost=parent.max_cost if max_cost is None else max_cost,
            expires_at=parent.expires_at if expires_at is None else expires_at,
            issued_at=time.time() if now is None else now,
        )
    except (TypeError, ValueError) as exc:
        raise CapabilityError(f"cannot attenuate: {exc}") from exc
    wider = _widening(parent, child)
    if wider:
        raise CapabilityError(f"cannot attenuate: child would be wider than its parent: {wider}")
    mac = _link_mac(bytes.fromhex(parent.signature), child, parent.depth + 1).hex()
    return Capability(*(getattr(child, f.name) for f in fields(Caveats)), chain=parent.links(), signature=mac)


class Authority:
    """Holds the signing key and the skew allowance; issues, attenuates and checks capabilities.
    Safe to share between threads (the verification cache is guarded by a lock)."""

    def __init__(self, key: bytes, skew_s: float = DEFAULT_SKEW_S):
        _check_key(key)
        if not (is_finite_number(skew_s) and skew_s >= 0):
            raise ValueError(f"Invalid skew_s: expected a finite number >= 0, got {skew_s!r}")
        self._key = bytes(key)
        self.skew_s = float(skew_s)
        self._checked: dict[Capability, Decision | None] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:  # never print the key
        return f"Authority(skew_s={self.skew_s})"

    def issue(self, rights, objects, max_cost: float | None = None, ttl_s: float = 3600.0, now: float | None = None) -> Capability:
        now = time.time() if now is None else now
        objs = tuple(normalise_object(o) for o in objects)
        return sign(Capability(frozenset(rights), objs, max_cost, now + ttl_s, issued_at=now), self._key)

    def verify(self, cap: Capability, now: float | None = None) -> Decision:
        """As `verify`, remembering capabilities whose chains were checked (by value: a tampered
        copy is a different key, so it is checked afresh); the window is always checked."""
        with self._lock:
            static = self._checked.get(cap, False)
        if static is False:
            static = check_static(cap, self._key)
            with self._lock:
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


def unnameable(path: str) -> str:
    """'' when the kernel can name `path`, else why not (a component or the whole too long)."""
    raw = path.encode("utf-8", errors="surrogatepass")
    if len(raw) >= PATH_MAX_BYTES:
        return f"{len(raw)} bytes, at or over PATH_MAX ({PATH_MAX_BYTES})"
    longest = max((len(part) for part in raw.split(b"/")), default=0)
    return f"a component of {longest} bytes, over NAME_MAX ({NAME_MAX_BYTES})" if longest > NAME_MAX_BYTES else ""


def _approve_object(cap: Capability, target) -> Decision:
    text = os.fspath(target)
    if not _is_text(text) or "\x00" in text:
        return Decision(False, f"target {target!r} is not a valid path or resource id", DenyCode.BAD_PATH)
    if not text.startswith("/"):
        if text in cap.objects:
            return Decision(True, f"resource {text!r} allowed")
        if os.sep in text or text in (".", ".."):
            return Decision(False, f"relative path {text!r}: resolve it against the workspace first", DenyCode.BAD_PATH)
        return Decision(False, f"resource {text!r} not among the objects {list(cap.objects)}", DenyCode.OBJECT_OUTSIDE)
    too_long = unnameable(text)
    if too_long:
        return Decision(False, f"path {text[:80]}... cannot exist: {too_long} (ENAMETOOLONG)", DenyCode.BAD_PATH)
    resolved = os.path.realpath(text)
    for obj in cap.objects:
        if obj.startswith("/") and path_within(resolved, obj):
            return Decision(True, f"{resolved} is inside {obj}")
    return Decision(False, f"{text} resolves to {resolved}, outside the objects {list(cap.objects)}", DenyCode.OBJECT_OUTSIDE)


def _widening(parent: Caveats, child: Caveats) -> str:
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


def is_finite_number(value: Any) -> bool:
    """An int or float (never a bool) that is neither NaN nor infinite."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_text(value: Any) -> bool:
    """A non-empty string that is valid Unicode (RFC 8785 cannot canonicalise a lone surrogate)."""
    if not isinstance(value, str) or not value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_iterable(value: Any) -> bool:
    return isinstance(value, (set, frozenset, list, tuple))


def _check_key(key: bytes) -> None:
    if not isinstance(key, (bytes, bytearray)) or len(key) < MIN_KEY_BYTES:
        raise CapabilityError(f"signing key must be at least {MIN_KEY_BYTES} bytes")
