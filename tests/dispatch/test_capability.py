"""Capabilities: signing, approval, attenuation, and the mutation vectors (all denied, right reason)."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import os

import pytest
import rfc8785

from surecall.dispatch.capability import (
    Authority,
    Capability,
    DenyCode,
    approve,
    attenuate,
    canonical_body,
    sign,
    verify,
)
from surecall.errors import CapabilityError

KEY = b"k" * 32
NOW = 1_800_000_000.0


@pytest.fixture
def workspace(tmp_path):
    ws = tmp_path / "work"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "a.py").write_text("x = 1\n")
    evil = tmp_path / "workspace_evil"
    evil.mkdir()
    (evil / "secret").write_text("s")
    return ws


@pytest.fixture
def auth():
    return Authority(KEY, skew_s=5.0)


@pytest.fixture
def cap(auth, workspace):
    return auth.issue({"read", "write", "call:*"}, [workspace], max_cost=10.0, ttl_s=60.0, now=NOW)


def test_allows_inside_the_workspace(auth, cap, workspace):
    d = auth.approve(cap, "read", workspace / "src" / "a.py", cost=1.0, now=NOW)
    assert d.allowed and d.code is DenyCode.ALLOWED
    assert auth.approve(cap, "call:file_view", None, now=NOW).allowed
    assert auth.approve(cap, "write", workspace / "new_file.txt", now=NOW).allowed  # not yet existing
    assert auth.approve(cap, "read", workspace, now=NOW).allowed


def test_signature_covers_the_rfc8785_body(cap):
    body = cap.body()
    assert canonical_body(cap) == rfc8785.dumps(body)
    assert cap.signature == hmac.new(KEY, rfc8785.dumps(body), hashlib.sha256).hexdigest()


# --- mutation vectors ------------------------------------------------------------------------
def test_flipped_signature_byte_denied(auth, cap, workspace):
    sig = cap.signature
    flipped = sig[:10] + ("0" if sig[10] != "0" else "1") + sig[11:]
    d = auth.approve(dataclasses.replace(cap, signature=flipped), "read", workspace / "src", now=NOW)
    assert (d.allowed, d.code) == (False, DenyCode.BAD_SIGNATURE)
    assert "tampered" in d.reason


def test_widened_rights_denied(auth, cap, workspace):
    assert auth.approve(cap, "read", workspace, now=NOW).allowed  # the genuine one is now cached
    forged = dataclasses.replace(cap, rights=cap.rights | {"exec"})
    d = auth.approve(forged, "exec", workspace, now=NOW)
    assert (d.allowed, d.code) == (False, DenyCode.BAD_SIGNATURE)


def test_widened_prefix_denied(auth, cap, workspace):
    forged = dataclasses.replace(cap, objects=("/",))
    d = auth.approve(forged, "read", "/etc/passwd", now=NOW)
    assert (d.allowed, d.code) == (False, DenyCode.BAD_SIGNATURE)


def test_raised_cost_ceiling_and_later_expiry_denied(auth, cap, workspace):
    for forged in (dataclasses.replace(cap, max_cost=1e9), dataclasses.replace(cap, expires_at=NOW + 1e6)):
        assert auth.approve(forged, "read", workspace, now=NOW).code is DenyCode.BAD_SIGNATURE


def test_dotdot_out_of_the_workspace_denied(auth, cap, workspace):
    d = auth.approve(cap, "read", f"{workspace}/src/../../workspace_evil/secret", now=NOW)
    assert (d.allowed, d.code) == (False, DenyCode.OBJECT_OUTSIDE)
    assert "workspace_evil" in d.reason


def test_symlink_out_of_the_workspace_denied(auth, cap, workspace):
    link = workspace / "src" / "escape"
    os.symlink(workspace.parent / "workspace_evil", link)
    d = auth.approve(cap, "read", link / "secret", now=NOW)
    assert (d.allowed, d.code) == (False, DenyCode.OBJECT_OUTSIDE)


def test_string_prefix_sibling_denied(auth, cap, workspace):
    evil = str(workspace) + "space_evil"  # /.../work -> /.../workspace_evil
    assert evil.startswith(str(workspace))
    d = auth.approve(cap, "read", evil + "/secret", now=NOW)
    assert (d.allowed, d.code) == (False, DenyCode.OBJECT_OUTSIDE)


def test_expired_with_and_without_skew(cap, workspace):
    late = cap.expires_at + 3.0
    assert approve(cap, "read", workspace, now=late, key=KEY, skew_s=5.0).allowed  # inside the allowance
    d = approve(cap, "read", workspace, now=late, key=KEY, skew_s=0.0)
    assert (d.allowed, d.code) == (False, DenyCode.EXPIRED)
    d = approve(cap, "read", workspace, now=cap.expires_at + 6.0, key=KEY, skew_s=5.0)
    assert (d.allowed, d.code) == (False, DenyCode.EXPIRED)
    d = approve(cap, "read", workspace, now=NOW - 60.0, key=KEY, skew_s=5.0)
    assert (d.allowed, d.code) == (False, DenyCode.NOT_YET_VALID)


def test_child_wider_than_parent(auth, cap, workspace):
    with pytest.raises(CapabilityError, match=r"wider than its parent: rights \['exec'\]"):
        auth.attenuate(cap, rights={"read", "exec"}, now=NOW)
    with pytest.raises(CapabilityError, match="object .* is not inside the parent's objects"):
        auth.attenuate(cap, objects=[workspace.parent], now=NOW)
    with pytest.raises(CapabilityError, match="cost ceiling 20.0 above"):
        auth.attenuate(cap, max_cost=20.0, now=NOW)
    with pytest.raises(CapabilityError, match="expiry .* after the parent's"):
        auth.attenuate(cap, expires_at=cap.expires_at + 1, now=NOW)
    # a child signed by a careless issuer with the right key is still refused at approval
    forged = sign(Capability(frozenset({"read", "exec"}), (str(workspace),), 5.0, cap.expires_at, NOW, chain=(cap,)), KEY)
    d = auth.approve(forged, "exec", workspace, now=NOW)
    assert (d.allowed, d.code) == (False, DenyCode.WIDER_THAN_PARENT)


def test_attenuation_narrows(auth, cap, workspace):
    child = auth.attenuate(cap, rights={"read"}, objects=[workspace / "src"], max_cost=2.0, now=NOW)
    assert auth.approve(child, "read", workspace / "src" / "a.py", cost=2.0, now=NOW).allowed
    assert auth.approve(child, "write", workspace / "src" / "a.py", now=NOW).code is DenyCode.RIGHT_MISSING
    assert auth.approve(child, "read", workspace / "other", now=NOW).code is DenyCode.OBJECT_OUTSIDE
    assert auth.approve(child, "read", workspace / "src", cost=3.0, now=NOW).code is DenyCode.COST_EXCEEDED
    grandchild = auth.attenuate(child, rights={"read"}, now=NOW)
    assert auth.approve(grandchild, "read", workspace / "src", now=NOW).allowed
    tampered_parent = dataclasses.replace(child, chain=(dataclasses.replace(cap.caveats(), rights=frozenset({"*"})),))
    assert auth.approve(tampered_parent, "read", workspace / "src", now=NOW).code is DenyCode.BAD_SIGNATURE


def test_serialisation_round_trip(auth, cap, workspace):
    child = auth.attenuate(cap, rights={"read"}, now=NOW)
    again = Capability.from_dict(child.to_dict())
    assert again == child and auth.approve(again, "read", workspace, now=NOW).allowed
    with pytest.raises(CapabilityError, match="malformed capability"):
        Capability.from_dict({"rights": ["read"]})


def test_other_denials_and_errors(auth, cap, workspace):
    assert verify(cap, b"x" * 32, now=NOW).code is DenyCode.BAD_SIGNATURE  # foreign key
    assert auth.approve(cap, "exec", workspace, now=NOW).code is DenyCode.RIGHT_MISSING
    assert auth.approve(cap, "approve:rm", None, now=NOW).code is DenyCode.RIGHT_MISSING
    assert auth.approve(cap, "read", "src/a.py", now=NOW).code is DenyCode.BAD_PATH
    assert auth.approve(cap, "read", str(workspace) + "/a\x00b", now=NOW).code is DenyCode.BAD_PATH
    assert auth.approve(cap, "read", "db:prod", now=NOW).code is DenyCode.OBJECT_OUTSIDE
    with pytest.raises(CapabilityError, match=r"capability denied \(right_missing\)"):
        auth.approve(cap, "exec", workspace, now=NOW).raise_if_denied()
    with pytest.raises(CapabilityError, match="at least 16 bytes"):
        Authority(b"short")
    with pytest.raises(ValueError, match="Invalid capability max_cost"):
        Capability(frozenset({"read"}), ("/x",), -1.0, NOW)
    with pytest.raises(CapabilityError, match="cannot attenuate: parent denied"):
        attenuate(dataclasses.replace(cap, signature="00"), KEY, rights={"read"}, now=NOW)
    assert "k" * 4 not in repr(auth)


def test_resource_ids_and_approval_rights(auth):
    cap = auth.issue({"approve:rm_rf", "call:rm_rf"}, ["db:staging"], ttl_s=60, now=NOW)
    assert auth.approve(cap, "approve:rm_rf", "db:staging", now=NOW).allowed
    assert auth.approve(cap, "approve:other", "db:staging", now=NOW).code is DenyCode.RIGHT_MISSING
