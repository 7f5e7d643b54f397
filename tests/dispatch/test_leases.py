"""Leases under stalls, on both stores: the heartbeat keeps a call longer than its lease from
being taken over, the takeover margin keeps a probe from racing an owner that is only paused,
and the fencing token refuses a stale owner (its start and its result)."""

from __future__ import annotations

import threading
import time

import pytest

from surecall.dispatch.idempotency import (
    Claim,
    LeaseKeeper,
    ProbeOutcome,
    Record,
    RecordState,
    derive_key,
    execute_once,
    hold_lease,
)
from surecall.dispatch.runtime import Runtime
from surecall.dispatch.stores import open_store
from surecall.errors import IdempotencyConflict, LeaseLost, StoreUnavailable
from surecall.tools import SideEffect, Tool

LEASE_S = 0.6  # heartbeat every 0.2 s: 0.4 s of slack for a loaded CI machine
KEY = b"0123456789abcdef-test-signing-key"


@pytest.fixture(params=["sqlite", "redis"])
def store_url(request, tmp_path):
    if request.param == "sqlite":
        return str(tmp_path / "records.db")
    return request.getfixturevalue("redis_url")


def _key(tag: str) -> str:
    return derive_key(f"traj-{tag}-{time.time_ns()}", 1, "call-1", "file_edit", {"path": "a.py"})


def _wait_until(predicate, timeout_s: float = 5.0) -> bool:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


# --- heartbeat ---------------------------------------------------------------------------------
def test_heartbeat_keeps_a_call_longer_than_its_lease(store_url):
    """Four lease lengths of work under hold_lease: every replay meanwhile sees IN_FLIGHT."""
    with open_store(store_url, takeover_margin_s=0) as owner_store, open_store(store_url, takeover_margin_s=0) as other:
        key = _key("beat")
        claim = owner_store.claim(key, lease_s=LEASE_S)
        seen = set()
        with hold_lease(owner_store, key, claim, lease_s=LEASE_S) as keeper:
            deadline = time.time() + 4 * LEASE_S
            while time.time() < deadline:
                replay = other.claim(key, lease_s=LEASE_S)
                assert not replay.acquired
                seen.add(replay.record.state)
                time.sleep(LEASE_S / 6)
        assert seen == {RecordState.IN_FLIGHT}
        assert keeper.num_renewals >= 4 and keeper.lost is None  # one per beat: about 12
        renewals = keeper.num_renewals
        done = owner_store.complete(key, claim.owner, {"ok": True}, token=claim.token)
        time.sleep(LEASE_S / 2)
        assert done.state is RecordState.COMPLETED and keeper.num_renewals == renewals  # the thread stopped


def _slow_edit_tool(effects: list, seconds: float, started: threading.Event) -> Tool:
    """An A2 tool that works `seconds` and then applies its effect; its probe looks for the effect."""
    def handler(path):
        started.set()
        time.sleep(seconds)
        effects.append(path)
        return {"edited": path}

    schema = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"], "additionalProperties": False}
    return Tool.from_schema("slow_edit", schema, level=SideEffect.A2, handler=handler,
                            probe=lambda args: ProbeOutcome(args["path"] in effects))


def test_replay_during_a_long_call_does_not_run_it_again(store_url):
    """The reported break: a call outlives its lease, a replay settles it by probe (nothing is
    visible yet: NOT_EXECUTED) and runs it a second time. With the heartbeat the replay sees
    the call in flight, and the effect happens once."""
    effects: list = []
    started = threading.Event()
    tool = _slow_edit_tool(effects, 4 * LEASE_S, started)
    with open_store(store_url, takeover_margin_s=0) as store_a, open_store(store_url, takeover_margin_s=0) as store_b:
        first_rt, replay_rt = Runtime([tool], store_a, KEY, lease_s=LEASE_S), Runtime([tool], store_b, KEY, lease_s=LEASE_S)
        cap = first_rt.issue(["call:*"], [])
        call = {"name": "slow_edit", "arguments": {"path": "a.py"}}
        first = []
        worker = threading.Thread(target=lambda: first.append(first_rt.dispatch(call, cap, "traj-beat", 1, "c1")))
        worker.start()
        assert started.wait(10)  # the first dispatch holds the claim and runs
        replays = []
        while worker.is_alive():
            replays.append(replay_rt.dispatch(call, cap, "traj-beat", 1, "c1"))
            time.sleep(LEASE_S / 4)
        worker.join()
    assert effects == ["a.py"]
    assert first[0].ok and first[0].idempotency_state == "COMPLETED" and not first[0].replayed
    assert replays and all(r.idempotency_state in ("IN_FLIGHT", "COMPLETED") for r in replays)
    assert not any(r.ok and not r.replayed for r in replays)


def test_heartbeat_notices_a_lost_lease():
    """A renewal the store refuses ends the heartbeat and makes `check()` raise."""
    class Store:
        def __init__(self):
            self.calls = 0

        def renew(self, key, owner, *, token, lease_s, now):
            self.calls += 1
            if self.calls == 2:
                raise StoreUnavailable("flaky network")  # transient: retried at the next beat
            if self.calls == 4:
                raise IdempotencyConflict("record is IN_DOUBT")

    store = Store()
    claim = Claim(True, Record("slot", RecordState.IN_FLIGHT, owner="me", lease_expires_at=time.time() + 60, attempts=3))
    with hold_lease(store, "slot.fp", claim, lease_s=0.15) as keeper:
        keeper.check()
        assert _wait_until(lambda: keeper.lost is not None)
        with pytest.raises(LeaseLost, match=r"lease on slot.fp... lost \(token 3\): record is IN_DOUBT"):
            keeper.check()
    assert store.calls == 4  # no renewal after the refusal


@pytest.mark.parametrize("lease_s", [0, -1, float("nan"), float("inf"), "1", True, 10**9])
def test_lease_must_be_a_finite_positive_duration(store_url, lease_s):
    with open_store(store_url) as store:
        key = _key("bad-lease")
        with pytest.raises(ValueError, match=r"Invalid lease_s: expected a finite number of seconds in \(0, 604800\]"):
            store.claim(key, lease_s=lease_s)
        assert store.get(key).state is RecordState.UNSEEN
        claim = store.claim(key, lease_s=1.5)
        with pytest.raises(ValueError, match="Invalid lease_s"):
            store.renew(key, claim.owner, token=claim.token, lease_s=lease_s)
        with pytest.raises(ValueError, match="Invalid lease_s"):
            LeaseKeeper(store, key, claim, lease_s=lease_s)


# --- takeover margin and fencing ------------------------------------------------------------------
MARGIN_S = 1.0


def test_settle_waits_out_the_takeover_margin(store_url):
    """A lapsed lease is IN_DOUBT at once (never re-run), but a probe may not settle it while the
    owner may only be stalled; once the margin has passed it may. A reported failure (the owner
    is done) settles at once."""
    with open_store(store_url, takeover_margin_s=MARGIN_S) as store:
        key = _key("margin")
        store.claim(key, lease_s=0.2)
        time.sleep(0.3)
        record = store.get(key)
        assert record.state is RecordState.IN_DOUBT and record.owner_may_be_alive
        assert not store.claim(key).acquired
        probed = []
        with pytest.raises(IdempotencyConflict, match=r"lease lapsed less than 1 s ago and its owner may still be running"):
            store.settle(key, lambda r: probed.append(r) or False)
        assert probed == []  # the probe was not even asked
        assert _wait_until(lambda: not store.get(key).owner_may_be_alive, timeout_s=3)
        assert store.settle(key, lambda r: False).state is RecordState.NOT_EXECUTED

        failed = _key("margin-fail")
        claim = store.claim(failed, lease_s=30)
        store.fail(failed, claim.owner, "boom", token=claim.token)
        assert not store.get(failed).owner_may_be_alive
        assert store.settle(failed, lambda r: False).state is RecordState.NOT_EXECUTED


def test_stalled_owner_is_fenced_after_a_takeover(store_url, tmp_path):
    """Owner A (worker id `w1`) claims and stalls before its effect, past lease and margin. B
    (restarted with the same worker id) settles, claims with a higher token and runs. When A
    wakes, hold_lease refuses to let it start and its stale result is not recorded."""
    effects = tmp_path / "effects"

    def effect(tag: str) -> dict:
        with open(effects, "a") as fh:
            fh.write(tag + "\n")
        return {"by": tag}

    with open_store(store_url, takeover_margin_s=0.2) as store:
        key = _key("fence")
        a = store.claim(key, lease_s=0.2, owner="w1")
        assert a.acquired and a.token == 1
        assert _wait_until(lambda: not store.get(key).owner_may_be_alive, timeout_s=3)  # A stalls, no heartbeat
        assert store.settle(key, lambda r: effects.exists()).state is RecordState.NOT_EXECUTED
        b = store.claim(key, lease_s=30, owner="w1")
        assert b.acquired and b.token == 2
        with hold_lease(store, key, b, lease_s=30):
            result = effect("B")
        # A wakes up: it may not start, renew or record
        with pytest.raises(LeaseLost, match=r"\(token 1\) lapsed before the call started; not run"):
            with hold_lease(store, key, a, lease_s=0.2):
                effect("A")
        with pytest.raises(LeaseLost, match="fenced: token 1 is stale, the slot was claimed again with token 2"):
            store.renew(key, a.owner, token=a.token, lease_s=0.2)
        with pytest.raises(LeaseLost, match=r"cannot complete .* \(fenced: token 1 is stale"):
            store.complete(key, a.owner, {"by": "A"}, token=a.token)
        with pytest.raises(LeaseLost, match=r"cannot fail .* \(fenced"):
            store.fail(key, a.owner, "A gave up", token=a.token)
        assert store.complete(key, b.owner, result, token=b.token).result == {"by": "B"}
    assert effects.read_text() == "B\n"


def test_late_owner_still_holding_the_token_may_record(store_url):
    """No takeover happened: the owner whose lease lapsed records its real result (that settles
    the doubt with the truth); a wrong token is refused even then."""
    with open_store(store_url) as store:
        key = _key("late")
        claim = store.claim(key, lease_s=0.1)
        time.sleep(0.2)
        assert store.get(key).state is RecordState.IN_DOUBT
        with pytest.raises(LeaseLost, match="cannot renew"):
            store.renew(key, claim.owner, token=claim.token)
        with pytest.raises(LeaseLost, match="token 7 is stale"):
            store.complete(key, claim.owner, {"late": True}, token=7)
        with pytest.raises(ValueError, match="Invalid token: expected None or the claim's fencing token"):
            store.complete(key, claim.owner, {"late": True}, token=0)
        assert store.complete(key, claim.owner, {"late": True}, token=claim.token).result == {"late": True}


def test_execute_once_does_not_start_a_stale_claim(store_url):
    """execute_once checks the lease before it runs: a claim that lapsed meanwhile (and was taken
    over) raises LeaseLost, fn never runs."""
    with open_store(store_url, takeover_margin_s=0) as store:
        key = _key("stale-start")
        original_claim = store.claim
        ran = []

        def claim_then_stall(k, **kw):
            claim = original_claim(k, **kw)
            time.sleep(0.2)  # stalled past the lease; another worker settles and takes over
            store.settle(k, lambda r: False)
            assert original_claim(k, lease_s=30).acquired
            return claim

        store.claim = claim_then_stall
        with pytest.raises(LeaseLost, match="lapsed before the call started"):
            execute_once(store, key, lambda: ran.append(1), lease_s=0.1)
        assert ran == []


@pytest.mark.parametrize("margin", [-1, float("nan"), float("inf"), "10", None])
def test_takeover_margin_must_be_a_finite_duration(store_url, margin):
    with pytest.raises(ValueError, match=r"Invalid takeover_margin_s: expected a finite number of seconds >= 0, got"):
        open_store(store_url, takeover_margin_s=margin)
