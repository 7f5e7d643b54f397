"""Idempotency stores (SQLite and a real redis-server): the state machine, crashes, races."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import time
import uuid

import pytest
from conftest import REDIS_SERVER, free_port

from surecall.dispatch.idempotency import ProbeOutcome, RecordState, derive_key, execute_once
from surecall.dispatch.stores import SQLiteStore, open_store
from surecall.errors import IdempotencyConflict, StoreUnavailable

CTX = multiprocessing.get_context("fork")


@pytest.fixture(params=["sqlite", "redis"])
def store_url(request, tmp_path):
    if request.param == "sqlite":
        return str(tmp_path / "records.db")
    return request.getfixturevalue("redis_url")


@pytest.fixture
def store(store_url):
    s = open_store(store_url)
    yield s
    s.close()


def _key(tag: str, args=None) -> str:
    return derive_key(f"traj-{tag}-{time.time_ns()}", 1, "call-1", "file_edit", args or {"path": "a.py"})


def _args_key(key: str, args: dict) -> str:
    """The same slot as `key` with other arguments' fingerprint."""
    return key.split(".")[0] + "." + derive_key("x", 0, "x", "x", args).split(".")[1]


# --- state machine ---------------------------------------------------------------------------
def test_claim_complete_replay(store):
    key = _key("replay")
    assert store.get(key).state is RecordState.UNSEEN
    first = execute_once(store, key, lambda: {"ok": 1})
    second = execute_once(store, key, lambda: {"ok": 2})
    assert first.ran and not second.ran
    assert second.record.state is RecordState.COMPLETED and second.record.result == {"ok": 1}
    assert second.record.attempts == 1


def test_same_key_other_arguments_conflicts(store):
    key = _key("conflict")
    claim = store.claim(key)
    other = _args_key(key, {"path": "b.py"})
    with pytest.raises(IdempotencyConflict, match="already used with different arguments"):
        store.claim(other)
    with pytest.raises(IdempotencyConflict, match="already used with different arguments"):
        store.complete(other, claim.owner, {})


def test_live_lease_blocks_and_owner_checked(store):
    key = _key("lease")
    claim = store.claim(key, lease_s=30)
    again = store.claim(key)
    assert not again.acquired and again.record.state is RecordState.IN_FLIGHT
    with pytest.raises(IdempotencyConflict, match="cannot complete .* IN_FLIGHT \\(held by another owner\\)"):
        store.complete(key, "not-the-owner", {})
    with pytest.raises(IdempotencyConflict, match="cannot settle .* live lease"):
        store.settle(key, lambda r: True)
    renewed = store.renew(key, claim.owner, lease_s=60)
    assert renewed.lease_expires_at > claim.record.lease_expires_at
    store.complete(key, claim.owner, {"done": True})
    with pytest.raises(IdempotencyConflict, match="cannot complete .* COMPLETED"):
        store.complete(key, claim.owner, {"done": True})


def test_failure_is_in_doubt_until_settled(store):
    key = _key("fail")
    claim = store.claim(key)
    assert store.fail(key, claim.owner, "TimeoutError: tool hung").state is RecordState.IN_DOUBT
    refused = store.claim(key)
    assert not refused.acquired and refused.record.state is RecordState.IN_DOUBT
    assert "TimeoutError" in refused.record.error
    assert store.settle(key, lambda r: None).state is RecordState.IN_DOUBT  # probe cannot tell
    settled = store.settle(key, lambda r: ProbeOutcome(True, {"probed": 1}))
    assert settled.state is RecordState.COMPLETED and settled.result == {"probed": 1}
    assert store.settle(key, lambda r: False).state is RecordState.COMPLETED  # settled stays settled
    assert store.claim(key).record.result == {"probed": 1}


def test_not_executed_can_be_claimed_again(store):
    key = _key("release")
    claim = store.claim(key)
    assert store.release(key, claim.owner, "denied").state is RecordState.NOT_EXECUTED
    again = store.claim(key)
    assert again.acquired and again.record.attempts == 2 and again.owner != claim.owner
    key2 = _key("settle-no")
    store.fail(key2, store.claim(key2).owner, "boom")
    assert store.settle(key2, lambda r: False).state is RecordState.NOT_EXECUTED
    assert store.claim(key2).acquired


def test_expired_lease_becomes_in_doubt_and_late_owner_may_complete(store):
    key = _key("late")
    claim = store.claim(key, lease_s=0.05)
    time.sleep(0.15)
    assert store.get(key).state is RecordState.IN_DOUBT
    with pytest.raises(IdempotencyConflict, match="cannot renew"):
        store.renew(key, claim.owner)
    assert store.complete(key, claim.owner, {"late": True}).state is RecordState.COMPLETED


def test_unknown_record_steps(store):
    key = _key("unknown")
    with pytest.raises(IdempotencyConflict, match="no record"):
        store.settle(key, lambda r: True)
    with pytest.raises(IdempotencyConflict, match="no record"):
        store.complete(key, "o", {})


def test_result_must_be_json(store):
    key = _key("json")
    claim = store.claim(key)
    with pytest.raises(IdempotencyConflict, match="not JSON-serialisable"):
        store.complete(key, claim.owner, {"x": object()})
    assert store.get(key).state is RecordState.IN_FLIGHT


def test_store_unavailable(tmp_path):
    with pytest.raises(StoreUnavailable, match="SQLite store .*nothing was recorded"):
        SQLiteStore(tmp_path / "missing-dir" / "x.db")
    from surecall.dispatch.stores import RedisStore

    down = RedisStore(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.5)
    with pytest.raises(StoreUnavailable, match="Redis store"):
        down.claim(_key("down"))


def test_redis_store_down_mid_run(tmp_path):
    """A store that goes away: typed error, and once it is back the record is where it was."""
    if not os.path.exists(REDIS_SERVER):
        pytest.skip("redis-server not installed")
    port = free_port()
    args = [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path), "--appendonly", "yes", "--save", "",
            "--maxmemory-policy", "noeviction"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    from surecall.dispatch.stores import RedisStore

    store = RedisStore(f"redis://127.0.0.1:{port}/0", timeout_s=1.0)
    try:
        _wait_ready(store)
        key = _key("down-mid")
        claim = store.claim(key)
        proc.terminate()
        proc.wait(timeout=10)
        with pytest.raises(StoreUnavailable, match="retry it"):
            store.complete(key, claim.owner, {"r": 1})
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_ready(store)
        assert store.complete(key, claim.owner, {"r": 1}).state is RecordState.COMPLETED
    finally:
        store.close()
        proc.terminate()
        proc.wait(timeout=10)


def _wait_ready(store) -> None:
    for _ in range(100):
        try:
            store.get(_key("ping"))
            return
        except StoreUnavailable:
            time.sleep(0.05)
    raise RuntimeError("redis-server did not come up")


# --- crashes and races (separate processes) --------------------------------------------------
def _crashing_worker(url: str, key: str, effects: str, ready: str, do_effect: bool) -> None:
    store = open_store(url)
    claim = store.claim(key, lease_s=LEASE_S)
    if claim.acquired and do_effect:
        with open(effects, "a") as fh:
            fh.write("x\n")
    open(ready, "w").close()
    time.sleep(60)  # killed with SIGKILL before it can complete


LEASE_S = 0.6


def _count(path: str) -> int:
    return len(open(path).read().splitlines()) if os.path.exists(path) else 0


@pytest.mark.parametrize("did_effect", [True, False])
def test_sigkill_mid_execution(store_url, tmp_path, did_effect):
    store = open_store(store_url, takeover_margin_s=0)  # the owner is known dead: settle at once
    key = _key(f"kill-{did_effect}")
    effects, ready = str(tmp_path / "effects"), str(tmp_path / "ready")
    proc = CTX.Process(target=_crashing_worker, args=(store_url, key, effects, ready, did_effect))
    proc.start()
    deadline = time.time() + 10
    while not os.path.exists(ready) and time.time() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    killed_at = time.time()
    # 1. the lease is still live: IN_FLIGHT, and a repeat is refused
    assert store.get(key).state is RecordState.IN_FLIGHT
    assert not store.claim(key).acquired
    # 2. after the lease: IN_DOUBT, never silently re-run
    time.sleep(max(0.0, LEASE_S - (time.time() - killed_at)) + 0.2)
    for _ in range(3):
        repeat = store.claim(key)
        assert not repeat.acquired and repeat.record.state is RecordState.IN_DOUBT
    # 3. settle with a probe that reads the environment (the effects file)
    settled = store.settle(key, lambda r: ProbeOutcome(_count(effects) > 0, {"effects": _count(effects)}))
    if did_effect:
        assert settled.state is RecordState.COMPLETED and settled.result == {"effects": 1}
        assert not store.claim(key).acquired
    else:
        assert settled.state is RecordState.NOT_EXECUTED
        assert execute_once(store, key, lambda: open(effects, "a").write("x\n")).ran
    assert _count(effects) == 1
    store.close()


def _racing_worker(url: str, key: str, effects: str, barrier, results) -> None:
    store = open_store(url)
    barrier.wait()

    def effect():
        with open(effects, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        time.sleep(0.05)
        return {"pid": os.getpid()}

    outcome = execute_once(store, key, effect, lease_s=10)
    results.put((outcome.ran, outcome.record.state.value))
    store.close()


@pytest.mark.parametrize("num_procs", [8])
def test_concurrent_same_call_runs_once(store_url, tmp_path, num_procs):
    key = _key("race")
    effects = str(tmp_path / "effects")
    barrier, results = CTX.Barrier(num_procs), CTX.Queue()
    procs = [CTX.Process(target=_racing_worker, args=(store_url, key, effects, barrier, results)) for _ in range(num_procs)]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    assert _count(effects) == 1
    assert sum(ran for ran, _ in outcomes) == 1
    assert {state for ran, state in outcomes if not ran} <= {"IN_FLIGHT", "COMPLETED"}
    final = open_store(store_url).get(key)
    assert final.state is RecordState.COMPLETED and final.result["pid"] == int(open(effects).read().strip())


def test_concurrent_settles_compare_and_set(store):
    """A settle that loses the race returns the winner's record instead of overwriting it."""
    key = _key("settle-race")
    store.fail(key, store.claim(key).owner, "crashed")

    def outer_probe(record):
        inner = store.settle(key, lambda r: False)  # another settler gets there first
        assert inner.state is RecordState.NOT_EXECUTED
        return True

    assert store.settle(key, outer_probe).state is RecordState.NOT_EXECUTED
    assert store.claim(key).acquired


# --- purge: garbage collection of settled records ---------------------------------------------
@pytest.fixture
def own_store(store_url):
    """A store no other test writes to: a fresh SQLite file, or a Redis prefix of its own (with
    glob characters, so purge's SCAN pattern must escape them to stay inside it)."""
    s = _open_own(store_url, f"t*?[{uuid.uuid4().hex[:8]}]:" if store_url.startswith("redis") else None)
    yield s
    s.close()


def _open_own(url: str, prefix: str | None):
    if prefix is None:
        return open_store(url)
    from surecall.dispatch.stores import RedisStore

    return RedisStore(url, prefix=prefix)


def _settle_at(store, key: str, state: RecordState, at: float, *, lease_s: float = 30.0):
    """Put `key` into `state` with every timestamp at `at`."""
    claim = store.claim(key, lease_s=lease_s, now=at)
    assert claim.acquired
    if state is RecordState.COMPLETED:
        store.complete(key, claim.owner, {"at": at}, now=at)
    elif state is RecordState.NOT_EXECUTED:
        store.release(key, claim.owner, "denied", now=at)
    elif state is RecordState.IN_DOUBT:
        store.fail(key, claim.owner, "crashed", now=at)
    return claim


def test_purge_deletes_only_old_settled_records(own_store):
    now = time.time()
    old, recent = now - 3600, now - 10
    keys = {name: _key(f"purge-{name}") for name in
            ("completed", "not_executed", "in_doubt", "live", "lapsed", "recent_completed", "recent_not_executed")}
    _settle_at(own_store, keys["completed"], RecordState.COMPLETED, old)
    _settle_at(own_store, keys["not_executed"], RecordState.NOT_EXECUTED, old)
    _settle_at(own_store, keys["in_doubt"], RecordState.IN_DOUBT, old)
    _settle_at(own_store, keys["live"], RecordState.IN_FLIGHT, old, lease_s=7200)  # old stamp, live lease
    _settle_at(own_store, keys["lapsed"], RecordState.IN_FLIGHT, old, lease_s=0.05)  # lease runs out, unread
    _settle_at(own_store, keys["recent_completed"], RecordState.COMPLETED, recent)
    _settle_at(own_store, keys["recent_not_executed"], RecordState.NOT_EXECUTED, recent)
    time.sleep(0.1)  # Redis judges leases by the server clock

    assert own_store.purge(60, now=now) == 2
    states = {name: own_store.get(key, now=now).state for name, key in keys.items()}
    assert states == {
        "completed": RecordState.UNSEEN, "not_executed": RecordState.UNSEEN,
        "in_doubt": RecordState.IN_DOUBT, "live": RecordState.IN_FLIGHT, "lapsed": RecordState.IN_DOUBT,
        "recent_completed": RecordState.COMPLETED, "recent_not_executed": RecordState.NOT_EXECUTED,
    }
    # unsettled records stay whatever their age; settled ones go once past the window
    assert own_store.purge(0, now=now + 10**6) == 2
    assert own_store.get(keys["in_doubt"]).state is RecordState.IN_DOUBT
    assert own_store.get(keys["live"]).state is RecordState.IN_FLIGHT
    assert own_store.get(keys["recent_completed"]).state is RecordState.UNSEEN


def test_purge_window_boundary_is_strict(own_store):
    at = 1_000_000.0
    _settle_at(own_store, _key("boundary"), RecordState.COMPLETED, at)
    assert own_store.purge(10, now=at + 10) == 0  # updated == cutoff: not older, kept
    assert own_store.purge(10, now=at + 10.5) == 1


def test_purged_key_runs_again(own_store):
    """The documented trade-off: past the retention window a replay is a new call."""
    key = _key("rerun")
    assert execute_once(own_store, key, lambda: {"n": 1}).ran
    assert not execute_once(own_store, key, lambda: {"n": 2}).ran
    assert own_store.purge(0, now=time.time() + 1) == 1
    again = own_store.claim(key)
    assert again.acquired and again.record.attempts == 1
    own_store.complete(key, again.owner, {"n": 3})
    assert own_store.get(key).result == {"n": 3}


def test_purge_respects_limit(own_store, monkeypatch):
    from surecall.dispatch.stores import redis as redis_store

    monkeypatch.setattr(redis_store, "PURGE_BATCH", 2)  # several SCAN/pipeline rounds with few records
    old = time.time() - 3600
    for i in range(5):
        _settle_at(own_store, _key(f"limit-{i}"), RecordState.COMPLETED, old)
    _settle_at(own_store, _key("limit-doubt"), RecordState.IN_DOUBT, old)
    assert [own_store.purge(60, limit=2) for _ in range(4)] == [2, 2, 1, 0]
    assert own_store.purge(60, limit=1) == 0


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"older_than_s": -1}, "Invalid older_than_s: expected a finite number of seconds >= 0, got -1"),
    ({"older_than_s": float("nan")}, "Invalid older_than_s: .* got nan"),
    ({"older_than_s": float("inf")}, "Invalid older_than_s: .* got inf"),
    ({"older_than_s": "60"}, "Invalid older_than_s: .* got '60'"),
    ({"older_than_s": True}, "Invalid older_than_s: .* got True"),
    ({"older_than_s": 60, "limit": 0}, "Invalid limit: expected None or an integer >= 1, got 0"),
    ({"older_than_s": 60, "limit": 2.0}, "Invalid limit: .* got 2.0"),
    ({"older_than_s": 60, "limit": True}, "Invalid limit: .* got True"),
    ({"older_than_s": 60, "now": float("nan")}, "Invalid now: expected a finite number of unix seconds or None, got nan"),
])
def test_purge_argument_errors(own_store, kwargs, match):
    key = _key("args")
    _settle_at(own_store, key, RecordState.COMPLETED, time.time() - 3600)
    kwargs = dict(kwargs)
    older_than_s = kwargs.pop("older_than_s")
    with pytest.raises(ValueError, match=match):
        own_store.purge(older_than_s, **kwargs)
    assert own_store.get(key).state is RecordState.COMPLETED  # nothing deleted


def test_redis_purge_stays_inside_its_prefix_and_keeps_unstamped(redis_url):
    """Another store's keys that an unescaped glob would match, and a hash without `updated`."""
    import redis

    from surecall.dispatch.stores import RedisStore

    tag = uuid.uuid4().hex[:8]
    mine, theirs = RedisStore(redis_url, prefix=f"p*{tag}:"), RedisStore(redis_url, prefix=f"pX{tag}:")
    client = redis.Redis.from_url(redis_url)
    try:
        old = time.time() - 3600
        _settle_at(mine, _key("mine"), RecordState.COMPLETED, old)
        _settle_at(theirs, theirs_key := _key("theirs"), RecordState.COMPLETED, old)
        client.hset(f"p*{tag}:{{handmade}}", mapping={"state": "COMPLETED", "fp": ""})
        client.set(f"p*{tag}:{{other}}", "not a hash")
        assert mine.purge(60) == 1
        assert theirs.get(theirs_key).state is RecordState.COMPLETED
        assert client.exists(f"p*{tag}:{{handmade}}", f"p*{tag}:{{other}}") == 2
    finally:
        mine.close()
        theirs.close()
        client.close()


def _purge_after_scan(store, monkeypatch, change, older_than_s: float, now: float) -> int:
    """purge, with `change()` run after SCAN has listed every record and before any delete script."""
    scan = type(store)._record_keys

    def listing_then_change():
        yield from scan(store)
        change()

    monkeypatch.setattr(store, "_record_keys", listing_then_change)
    return store.purge(older_than_s, now=now)


def test_redis_purge_rechecks_records_changed_after_scan(redis_url, monkeypatch):
    """Deterministic form of the race: a record listed by SCAN and changed before its delete
    script ran is kept, because the script re-reads state and `updated` on the server."""
    from surecall.dispatch.stores import RedisStore

    store = RedisStore(redis_url, prefix=f"scan-{uuid.uuid4().hex[:8]}:")
    try:
        old = time.time() - 3600
        claimed, idle, completed = _key("listed-claimed"), _key("listed-idle"), _key("listed-completed")
        for key in (claimed, idle):
            _settle_at(store, key, RecordState.NOT_EXECUTED, old)
        _settle_at(store, completed, RecordState.COMPLETED, old)
        # claimed meanwhile: IN_FLIGHT, kept by the state check even with a cutoff past every stamp
        claims = []
        far = time.time() + 3600
        assert _purge_after_scan(store, monkeypatch, lambda: claims.append(store.claim(claimed)), 0, far) == 2
        assert claims[0].acquired and store.get(claimed).state is RecordState.IN_FLIGHT
        assert store.get(completed).state is RecordState.UNSEEN and store.get(idle).state is RecordState.UNSEEN
        # released again meanwhile: NOT_EXECUTED but fresh, kept by the timestamp check
        store.release(claimed, claims[0].owner, "denied", now=old)
        assert _purge_after_scan(store, monkeypatch, lambda: store.release(claimed, store.claim(claimed).owner, "again"), 60, time.time()) == 0
        assert store.get(claimed).state is RecordState.NOT_EXECUTED and store.get(claimed).attempts == 3
    finally:
        store.close()


def _claiming_worker(url: str, prefix: str | None, keys: list[str], holds: int, started, out) -> None:
    """Claim, renew and release (or complete) the keys in turn while another process purges, until
    `holds` claims were won: a record deleted while held makes the next step fail with 'no record'.
    A COMPLETED key is only claimable again once the purger has deleted it."""
    store = _open_own(url, prefix)
    started.wait(10)
    lost, held, deadline = [], 0, time.time() + 20
    while held < holds and time.time() < deadline:
        for key in keys:
            claim = store.claim(key)
            if not claim.acquired:
                continue
            held += 1
            try:
                store.renew(key, claim.owner)
                if held % 4 == 0:
                    store.complete(key, claim.owner, {"held": held})
                else:
                    store.release(key, claim.owner, "again")
            except IdempotencyConflict as exc:
                lost.append(str(exc))
    store.close()
    out.put((held, lost))


def test_purge_never_deletes_a_record_being_claimed(own_store, store_url):
    """One process claims/renews/settles four keys over and over; this one purges everything
    settled (any age) meanwhile. State changes between selection and delete must win."""
    keys = [_key(f"gc-race-{i}") for i in range(16)]
    started, out = CTX.Event(), CTX.Queue()
    prefix = getattr(own_store, "prefix", None)
    worker = CTX.Process(target=_claiming_worker, args=(store_url, prefix, keys, 300, started, out))
    worker.start()
    purged = 0
    while worker.is_alive():
        purged += own_store.purge(0, now=time.time() + 3600)
        started.set()
    held, lost = out.get(timeout=30)
    worker.join(timeout=30)
    assert lost == []
    assert held >= 300 and purged >= 300 // 4  # every 4th hold completes: only a purge frees it again
