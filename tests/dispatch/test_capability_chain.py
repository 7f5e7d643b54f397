"""Attenuation as a MAC chain: a child verifies alone, only narrows, and never yields its parent.

The attacker holds a child capability (as a sub-agent would) and tries to get a wider one back:
rebuild the parent from what the child carries, tamper with any body of the chain, extend the
chain with a wider link (anyone can compute a child MAC), or hand over malformed dicts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import math

import pytest
import rfc8785

from surecall.dispatch.capability import (
    MAX_CHAIN_DEPTH,
    Authority,
    Capability,
    DenyCode,
    attenuate,
    authorize,
    verify,
)
from surecall.errors import CapabilityError

KEY = b"k" * 32
NOW = 1_800_000_000.0


@pytest.fixture
def workspace(tmp_path):
    ws = tmp_path / "work"
    (ws / "src").mkdir(parents=True)
    return ws


@pytest.fixture
def auth():
    return Authority(KEY, skew_s=5.0)


@pytest.fixture
def root(auth, workspace):
    return auth.issue({"read", "write", "exec", "call:*"}, [workspace], max_cost=100.0, ttl_s=600.0, now=NOW)


@pytest.fixture
def child(auth, root, workspace):
    return auth.attenuate(root, rights={"read", "call:file_view"}, objects=[workspace / "src"], max_cost=5.0, now=NOW)


def _walk(value):
    """Every dict and every string anywhere inside `value`."""
    if isinstance(value, dict):
        yield value
        for item in value.values():
            yield from _walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from _walk(item)
    elif isinstance(value, str):
        yield value


def _reconstructions(child: Capability):
    """Every capability an attacker can assemble from the child's serialised form: each embedded
    body, with each MAC-looking string it holds (or none), at each chain position."""
    data = json.loads(json.dumps(child.to_dict()))
    found = list(_walk(data))
    bodies = [d for d in found if isinstance(d, dict) and "rights" in d]
    macs = {s for s in found if isinstance(s, str) and len(s) == 64} | {""}
    for body in bodies:
        try:
            yield Capability.from_dict(body)  # as embedded (the v1 form carried a signed parent)
        except CapabilityError:
            pass
        for mac in macs:
            for cut in range(len(data["chain"]) + 1):
                candidate = {k: body[k] for k in ("rights", "objects", "max_cost", "expires_at", "issued_at")}
                try:
                    yield Capability.from_dict({"v": 2, **candidate, "chain": data["chain"][:cut], "signature": mac})
                except CapabilityError:
                    pass


def test_no_wider_capability_can_be_rebuilt_from_a_child(auth, root, child, workspace):
    assert not hasattr(child, "parent")
    assert root.signature not in json.dumps(child.to_dict())  # no earlier MAC travels with the child
    tried = allowed_wider = 0
    for candidate in _reconstructions(child):
        tried += 1
        if auth.approve(candidate, "write", workspace / "src" / "a.py", now=NOW).allowed:
            allowed_wider += 1
    assert tried > 0 and allowed_wider == 0
    assert auth.approve(child, "read", workspace / "src" / "a.py", now=NOW).allowed  # the child itself works


@pytest.mark.parametrize("field,value", [
    ("rights", ["read", "write", "exec", "call:*", "approve:*"]),
    ("objects", ["/"]),
    ("max_cost", 1e9),
    ("expires_at", NOW + 1e6),
    ("issued_at", NOW - 1.0),
])
def test_tampering_any_body_in_the_chain_is_refused(auth, child, field, value):
    grandchild = auth.attenuate(child, rights={"read"}, now=NOW)
    data = grandchild.to_dict()
    bodies = [*data["chain"], data]  # the root, the child, and the grandchild's own caveats
    for i in range(len(bodies)):
        mutated = json.loads(json.dumps(data))
        target = mutated if i == len(bodies) - 1 else mutated["chain"][i]
        target[field] = value
        d = auth.approve(Capability.from_dict(mutated), "read", None, now=NOW)
        assert (d.allowed, d.code) == (False, DenyCode.BAD_SIGNATURE), (field, i)


def test_dropping_or_reordering_links_is_refused(auth, child):
    grandchild = auth.attenuate(child, rights={"read"}, now=NOW)
    for chain in (grandchild.chain[1:], grandchild.chain[:1], grandchild.chain[::-1]):
        forged = dataclasses.replace(grandchild, chain=chain)
        assert auth.verify(forged, now=NOW).code is DenyCode.BAD_SIGNATURE


def test_a_holder_can_narrow_without_the_key_but_never_widen(auth, child, workspace):
    narrower = attenuate(child, rights={"read"}, max_cost=1.0, now=NOW)  # no key: a sub-agent
    assert auth.approve(narrower, "read", workspace / "src", cost=1.0, now=NOW).allowed
    assert auth.approve(narrower, "read", workspace / "src", cost=2.0, now=NOW).code is DenyCode.COST_EXCEEDED
    with pytest.raises(CapabilityError, match=r"wider than its parent: rights \['write'\]"):
        attenuate(child, rights={"read", "write"}, now=NOW)
    # an attacker computes a wider link's MAC by hand (HMAC keyed with the child's signature)
    wider = dataclasses.replace(child.caveats(), rights=frozenset({"read", "write", "call:*"}), objects=("/",))
    body = rfc8785.dumps({"v": 2, "depth": 2, **wider.to_dict_caveats()})
    mac = hmac.new(bytes.fromhex(child.signature), body, hashlib.sha256).hexdigest()
    forged = Capability(wider.rights, wider.objects, wider.max_cost, wider.expires_at, wider.issued_at,
                        chain=child.links(), signature=mac)
    d = auth.approve(forged, "write", "/etc/passwd", now=NOW)
    assert (d.allowed, d.code) == (False, DenyCode.WIDER_THAN_PARENT) and "link 2" in d.reason


def test_deep_chain_verifies_standalone_and_round_trips(root, workspace):
    cap = root
    for depth in range(1, MAX_CHAIN_DEPTH + 1):
        cap = attenuate(cap, max_cost=100.0 - depth, now=NOW)
    assert cap.depth == MAX_CHAIN_DEPTH and cap.max_cost == 100.0 - MAX_CHAIN_DEPTH
    again = Capability.from_dict(json.loads(json.dumps(cap.to_dict())))
    assert again == cap
    fresh = Authority(KEY)  # nothing cached: the child alone proves its chain
    assert fresh.approve(again, "read", workspace / "src", cost=36.0, now=NOW).allowed
    assert fresh.approve(again, "read", workspace / "src", cost=37.0, now=NOW).code is DenyCode.COST_EXCEEDED
    with pytest.raises(CapabilityError, match="already has 64 links"):
        attenuate(cap, now=NOW)
    assert verify(again, b"x" * 32, now=NOW).code is DenyCode.BAD_SIGNATURE


def test_expired_ancestor_expires_the_child(auth, root):
    child = auth.attenuate(root, expires_at=root.expires_at - 100, now=NOW)
    assert auth.verify(child, now=root.expires_at - 50).code is DenyCode.EXPIRED
    assert auth.verify(child, now=NOW).allowed


@pytest.mark.parametrize("mutate,match", [
    (lambda d: d.update(v=1), "expected version v=2"),
    (lambda d: d.update(parent={}), r"unknown fields \['parent'\]"),
    (lambda d: d.update(rights="read"), "/rights must be a list"),
    (lambda d: d.update(rights=[1]), "Invalid capability right"),
    (lambda d: d.update(objects=[None]), "Invalid capability object"),
    (lambda d: d.update(max_cost="5"), "Invalid capability max_cost"),
    (lambda d: d.update(max_cost=-1), "Invalid capability max_cost"),
    (lambda d: d.update(expires_at=math.nan), "Invalid capability expires_at"),
    (lambda d: d.update(issued_at=True), "Invalid capability issued_at"),
    (lambda d: d.update(chain={}), "/chain must be a list"),
    (lambda d: d.update(chain=[{"rights": []}]), r"/chain/0 missing"),
    (lambda d: d.update(chain=[None]), "/chain/0 must be an object"),
    (lambda d: d.update(signature=None), "/signature must be 64"),
    (lambda d: d.update(signature="zz" * 32), "/signature must be 64"),
    (lambda d: d.pop("rights"), r"missing \['rights'\]"),
    (lambda d: d.update(rights=["\ud800"]), "Invalid capability right"),
])
def test_malformed_dicts_are_refused_with_the_field(child, mutate, match):
    data = json.loads(json.dumps(child.to_dict()))
    mutate(data)
    with pytest.raises(CapabilityError, match=match):
        Capability.from_dict(data)


def test_bad_costs_and_unnameable_paths_are_refused(root, workspace):
    for cost in (math.nan, math.inf, -1.0, "1", None, True):
        assert authorize(root, "read", None, cost).code is DenyCode.BAD_COST
    long_name = workspace / ("a" * 300)
    d = authorize(root, "read", long_name)
    assert (d.allowed, d.code) == (False, DenyCode.BAD_PATH) and "NAME_MAX" in d.reason
    assert authorize(root, "read", "/" + "a/" * 2100).code is DenyCode.BAD_PATH
    with pytest.raises(ValueError, match="Invalid capability expires_at"):
        Capability(frozenset({"read"}), ("/x",), None, math.nan)
