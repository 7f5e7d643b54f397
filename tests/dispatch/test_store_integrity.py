"""What a store refuses to trust: corrupted records (StoreCorrupted, never a KeyError or a
JSONDecodeError), a Redis server that may lose records (StoreNotDurable at connect), and the
lease a float `timeout_ms` gets (timeout plus margin, in seconds; whole milliseconds for PX)."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import time
import uuid

import pytest
from conftest import REDIS_SERVER, free_port

from surecall.dispatch.idempotency import (
    LEASE_MARGIN_S,
    MAX_LEASE_S,
    RecordState,
    derive_key,
    lease_for,
    split_key,
)
from surecall.dispatch.runtime import Runtime
from surecall.dispatch.stores import SQLiteStore, open_store
from surecall.errors import StoreCorrupted, StoreNotDurable, StoreUnavailable
from surecall.tools import SideEffect, Tool

KEY = b"0123456789abcdef-test-signing-key"


def _key(tag: str) -> str:
    return derive_key(f"traj-{tag}-{time.time_ns()}", 1, "call-1", "file_edit", {"path": "a.py"})


# --- corrupted records --------------------------------------------------------------------------
GOOD_ROW = {"fp": "", "state": "COMPLETED", "owner": "o", "lease_expires": 0.0, "result": '{"ok": 1}', "error": "",
            "attempts": 1, "updated": 1.0}
CORRUPTIONS = [
    ("state", "BOGUS", r"state = 'BOGUS' is not one of \['UNSEEN', 'IN_FLIGHT'"),
    ("state", "UNSEEN", r"state = 'UNSEEN' is never stored"),
    ("result", "{not json", r"result is not JSON"),
    ("lease_expires", "soon", r"lease_expires = 'soon' is not a finite number"),
    ("attempts", "many", r"attempts = 'many' is not a finite number \(an integer >= 0\)"),
    ("updated", "nan", r"updated = 'nan' is not a finite number"),
]


def _sqlite_with_row(tmp_path, key: str, column: str, value) -> SQLiteStore:
    store = SQLiteStore(tmp_path / "records.db")
    slot, fp = split_key(key)
    row = {**GOOD_ROW, "fp": fp, column: value}
    with contextlib.closing(sqlite3.connect(store.path)) as conn:
        conn.execute("INSERT INTO surecall_records (slot, fp, state, owner, lease_expires, result, error, attempts, updated) "
                     "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", (slot, *row.values()))
        conn.commit()
    return store


@pytest.mark.parametrize(("column", "value", "match"), CORRUPTIONS, ids=[f"{c}={v}" for c, v, _ in CORRUPTIONS])
def test_sqlite_corrupted_row_is_store_corrupted(tmp_path, column, value, match):
    key = _key("corrupt")
    store = _sqlite_with_row(tmp_path, key, column, value)
    where = rf"SQLite store .*records.db: record {split_key(key)[0][:16]}\.\.\. is corrupted: "
    for step in (lambda: store.get(key), lambda: store.claim(key), lambda: store.settle(key, lambda r: True)):
        with pytest.raises(StoreCorrupted, match=where + match):
            step()
    store.close()


def test_sqlite_damaged_database_file(tmp_path):
    path = tmp_path / "records.db"
    path.write_bytes(b"this is not a database, just garbage " * 200)
    with pytest.raises(StoreCorrupted, match=r"SQLite store .*records.db: the database is damaged \(file is not a database\)"):
        SQLiteStore(path)


@pytest.fixture
def redis_prefix_store(redis_url):
    store = open_store(redis_url, prefix=f"corrupt-{uuid.uuid4().hex[:8]}:")
    yield store
    store.close()


@pytest.mark.parametrize(("column", "value", "match"), CORRUPTIONS, ids=[f"{c}={v}" for c, v, _ in CORRUPTIONS])
def test_redis_corrupted_hash_is_store_corrupted(redis_prefix_store, column, value, match):
    store, key = redis_prefix_store, _key("corrupt")
    slot, fp = split_key(key)
    store._redis.hset(f"{store.prefix}{{{slot}}}", mapping={**GOOD_ROW, "fp": fp, column: value})
    where = rf"Redis store .*: record {slot[:16]}\.\.\. is corrupted: "
    for step in (lambda: store.get(key), lambda: store.claim(key), lambda: store.settle(key, lambda r: True)):
        with pytest.raises(StoreCorrupted, match=where + match):
            step()


@pytest.mark.parametrize("damage", ["no_state", "wrong_type", "not_utf8", "no_fp"])
def test_redis_damaged_record_keys(redis_prefix_store, damage):
    store, key = redis_prefix_store, _key("damaged")
    slot, fp = split_key(key)
    rec = f"{store.prefix}{{{slot}}}"
    if damage == "no_state":
        store._redis.hset(rec, mapping={k: v for k, v in {**GOOD_ROW, "fp": fp}.items() if k != "state"})
        match = r"is corrupted \(CORRUPT the record has no state field\)"
    elif damage == "wrong_type":
        store._redis.set(rec, "a string, not a hash")
        match = r"is corrupted \(WRONGTYPE"
    elif damage == "not_utf8":
        store._redis.hset(rec, mapping={**GOOD_ROW, "fp": fp, "error": b"\xff\xfe"})
        match = r"is corrupted: a field is not UTF-8 text"
    else:
        store._redis.hset(rec, mapping={k: v for k, v in {**GOOD_ROW, "fp": fp}.items() if k != "fp"})
        match = r"is corrupted: it has no fingerprint"
    with pytest.raises(StoreCorrupted, match=match):
        store.claim(key)


def test_runtime_turns_a_corrupted_record_into_a_not_run_observation(tmp_path, redis_url):
    """A replay meeting a corrupted record neither raises nor runs the tool again."""
    runs = []
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}
    tool = Tool.from_schema("count", schema, level=SideEffect.A2, handler=lambda n: runs.append(n) or {"n": n})
    prefix = f"rt-corrupt-{uuid.uuid4().hex[:8]}:"
    stores = {"sqlite": SQLiteStore(tmp_path / "records.db"), "redis": open_store(redis_url, prefix=prefix)}
    for name, store in stores.items():
        rt = Runtime([tool], store, KEY)
        cap = rt.issue(["call:*"], [])
        first = rt.dispatch({"name": "count", "arguments": {"n": 1}}, cap, f"traj-{name}", 1, "c1")
        assert first.ok and runs == [1]
        if name == "sqlite":  # every record: whatever the key derivation, this call's record is among them
            with contextlib.closing(sqlite3.connect(store.path)) as conn:
                conn.execute("UPDATE surecall_records SET result='{garbage'")
                conn.commit()
        else:
            for rec in store._redis.scan_iter(match=f"{prefix}*"):
                if not rec.endswith(b":lease"):
                    store._redis.hset(rec, "result", "{garbage")
        again = rt.dispatch({"name": "count", "arguments": {"n": 1}}, cap, f"traj-{name}", 1, "c1")
        assert not again.ok and "is corrupted: result is not JSON" in again.error and "not run" in again.error
        assert runs == [1], name
        runs.clear()
        store.close()


# --- Redis durability ---------------------------------------------------------------------------
@contextlib.contextmanager
def redis_server(tmp_path, *extra: str, port: int | None = None):
    """A private redis-server on a free loopback port (skips when the binary is absent)."""
    if not os.path.exists(REDIS_SERVER):
        pytest.skip("redis-server not installed")
    port = port or free_port()
    workdir = tmp_path / f"redis-{port}"
    workdir.mkdir()
    proc = subprocess.Popen([REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(workdir), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis

    client = redis.Redis(port=port)
    try:
        for _ in range(200):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.02)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        client.close()
        proc.terminate()
        proc.wait(timeout=10)


DURABLE = ("--appendonly", "yes", "--appendfsync", "everysec", "--maxmemory-policy", "noeviction")


@pytest.mark.parametrize(("setting", "value", "match"), [
    ("appendonly", "no", r"appendonly is 'no' \(want yes\).*redis-cli CONFIG SET appendonly yes && redis-cli CONFIG REWRITE"),
    ("appendfsync", "no", r"appendfsync is 'no' \(want everysec or always\).*CONFIG SET appendfsync everysec"),
    ("maxmemory-policy", "allkeys-lru", r"maxmemory-policy is 'allkeys-lru' \(want noeviction\).*CONFIG SET maxmemory-policy noeviction"),
])
def test_redis_store_refuses_a_server_that_may_lose_records(tmp_path, setting, value, match):
    from surecall.dispatch.stores import RedisStore

    with redis_server(tmp_path, *DURABLE, f"--{setting}", value) as url:
        with pytest.raises(StoreNotDurable, match=r"Redis store .* may lose idempotency records.*" + match):
            RedisStore(url)
        with pytest.raises(StoreNotDurable, match="require_durability=False"):
            open_store(url)
        store = RedisStore(url, require_durability=False)  # the caller accepts the risk
        key = _key("risk")
        assert store.claim(key).acquired
        store.close()


def test_redis_store_accepts_a_durable_server(tmp_path):
    from surecall.dispatch.stores import RedisStore

    with redis_server(tmp_path, *DURABLE) as url:
        import redis

        for fsync in ("everysec", "always"):
            redis.Redis.from_url(url).config_set("appendfsync", fsync)
            store = RedisStore(url)
            assert store.claim(_key("durable")).acquired
            store.close()


def test_redis_store_without_config_command_says_to_pass_the_flag(tmp_path):
    """Managed Redis often renames CONFIG away: the check cannot run, and says what to do."""
    from surecall.dispatch.stores import RedisStore

    with redis_server(tmp_path, *DURABLE, "--rename-command", "CONFIG", "") as url:
        with pytest.raises(StoreNotDurable, match=r"cannot check durability, CONFIG GET is refused .*pass RedisStore\(\.\.\., require_durability=False\)"):
            RedisStore(url)
        store = RedisStore(url, require_durability=False)
        assert store.claim(_key("managed")).acquired
        store.close()


def test_redis_durability_checked_on_first_use_when_down_at_connect(tmp_path):
    from surecall.dispatch.stores import RedisStore

    port = free_port()
    store = RedisStore(f"redis://127.0.0.1:{port}/0", timeout_s=0.5)  # nothing listens yet: no error
    with pytest.raises(StoreUnavailable, match="Redis store"):
        store.claim(_key("down"))
    with redis_server(tmp_path, "--appendonly", "no", port=port):
        with pytest.raises(StoreNotDurable, match="appendonly is 'no'"):
            store.claim(_key("up"))
    store.close()


# --- the lease a timeout gets ------------------------------------------------------------------
@pytest.mark.parametrize(("timeout_ms", "lease_s"), [
    (120_000, 120 + LEASE_MARGIN_S), (120_000.0, 120 + LEASE_MARGIN_S), (90_500.5, 90.5005 + LEASE_MARGIN_S),
    (1_000, 30.0), (None, 30.0), ("120000", 30.0), (True, 30.0), (float("nan"), 30.0), (float("inf"), 30.0),
    (-5.0, 30.0), (1e300, MAX_LEASE_S),
])
def test_lease_for_a_timeout(timeout_ms, lease_s):
    assert lease_for(timeout_ms, 30.0) == pytest.approx(lease_s)


class _LeaseSpy:
    """A store proxy that remembers the leases it was asked for."""

    def __init__(self, inner):
        self.inner, self.leases = inner, []

    def claim(self, key, *, lease_s, **kw):
        self.leases.append(lease_s)
        return self.inner.claim(key, lease_s=lease_s, **kw)

    def renew(self, key, owner, *, lease_s, **kw):
        self.leases.append(lease_s)
        return self.inner.renew(key, owner, lease_s=lease_s, **kw)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_float_timeout_gets_the_timeout_lease(tmp_path, kind, request):
    """`timeout_ms: 120000.0` is valid JSON Schema "integer"/"number": it must get 130 s, not the 30 s default."""
    inner = SQLiteStore(tmp_path / "r.db") if kind == "sqlite" else open_store(request.getfixturevalue("redis_url"))
    store = _LeaseSpy(inner)
    ttl = []

    def handler(timeout_ms):
        if kind == "redis":  # the lease key's PX: whole milliseconds, timeout plus margin
            ttl.extend(inner._redis.pttl(k) for k in inner._redis.scan_iter(match=f"{inner.prefix}*:lease"))
        return {"ok": True}

    schema = {"type": "object", "properties": {"timeout_ms": {"type": "number"}}, "required": ["timeout_ms"],
              "additionalProperties": False}
    tool = Tool.from_schema("wait", schema, level=SideEffect.A2, handler=handler)
    rt = Runtime([tool], store, KEY)
    out = rt.dispatch({"name": "wait", "arguments": {"timeout_ms": 120_000.0}}, rt.issue(["call:*"], []), f"t-{uuid.uuid4()}", 1, "c1")
    assert out.ok and out.idempotency_state == RecordState.COMPLETED.value
    assert store.leases and set(store.leases) == {120 + LEASE_MARGIN_S}
    if kind == "redis":
        assert any(125_000 < t <= 130_000 for t in ttl)
    inner.close()
