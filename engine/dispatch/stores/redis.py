"""Redis idempotency store: the same state machine as SQLiteStore, for workers on many hosts.

Each record is a hash `surecall:idem:{slot}`; its lease is a separate key claimed with
`SET NX PX` (`surecall:idem:{slot}:lease`), so the Redis server's clock, not the workers',
decides when a lease ends. Each transition is one Lua script (atomic on the server): the claim
creates the record and the lease together; a record IN_FLIGHT whose lease key has vanished is
turned into IN_DOUBT. The `now` arguments only stamp `updated`; lease expiry ignores them.
Connection failures raise StoreUnavailable. Records have no TTL: `purge` walks the prefix with
SCAN and deletes each old settled record with a script that re-checks its state and `updated`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import redis

from surecall.dispatch.idempotency import (
    Claim,
    Record,
    RecordState,
    check_fingerprint,
    split_key,
)
from surecall.dispatch.stores.base import (
    DEFAULT_LEASE_S,
    PURGEABLE,
    IdempotencyStore,
    dump_result,
    load_result,
    new_owner,
    refuse,
)
from surecall.errors import IdempotencyConflict, StoreUnavailable

_EXPIRED = "lease expired before the call reported back: effect unknown"

# KEYS: rec, lease. Shared prologue: load the state and turn a lapsed lease into IN_DOUBT.
_PROLOGUE = f"""
local rec, lease = KEYS[1], KEYS[2]
local st = redis.call('HGET', rec, 'state')
if st == 'IN_FLIGHT' and redis.call('EXISTS', lease) == 0 then
  redis.call('HSET', rec, 'state', 'IN_DOUBT', 'error', '{_EXPIRED}')
  st = 'IN_DOUBT'
end
"""

# ARGV: fp, owner, lease_ms, lease_expires, now -> {1|0, hgetall} or {-1, stored fp}
_CLAIM = _PROLOGUE + """
if not st then
  redis.call('SET', lease, ARGV[2], 'NX', 'PX', ARGV[3])
  redis.call('HSET', rec, 'fp', ARGV[1], 'state', 'IN_FLIGHT', 'owner', ARGV[2], 'lease_expires', ARGV[4],
             'attempts', 1, 'updated', ARGV[5], 'error', '', 'result', '')
  return {1, redis.call('HGETALL', rec)}
end
local fp = redis.call('HGET', rec, 'fp')
if fp ~= ARGV[1] then return {-1, fp} end
if st == 'NOT_EXECUTED' and redis.call('SET', lease, ARGV[2], 'NX', 'PX', ARGV[3]) then
  redis.call('HSET', rec, 'state', 'IN_FLIGHT', 'owner', ARGV[2], 'lease_expires', ARGV[4], 'updated', ARGV[5], 'error', '')
  redis.call('HINCRBY', rec, 'attempts', 1)
  return {1, redis.call('HGETALL', rec)}
end
return {0, redis.call('HGETALL', rec)}
"""

# ARGV: fp, owner, new_state, allowed states (comma list), result, error, now, renew_ms
_TRANSITION = _PROLOGUE + """
if not st then return {-2, {}} end
local fp = redis.call('HGET', rec, 'fp')
if fp ~= ARGV[1] then return {-1, fp} end
local owner = redis.call('HGET', rec, 'owner')
local allowed = string.find(',' .. ARGV[4] .. ',', ',' .. st .. ',', 1, true)
if owner ~= ARGV[2] or not allowed then return {0, redis.call('HGETALL', rec)} end
if ARGV[3] == 'RENEW' then
  redis.call('SET', lease, ARGV[2], 'PX', ARGV[8])
  redis.call('HSET', rec, 'lease_expires', ARGV[6], 'updated', ARGV[7])
else
  redis.call('DEL', lease)
  redis.call('HSET', rec, 'state', ARGV[3], 'result', ARGV[5], 'error', ARGV[6], 'updated', ARGV[7])
end
return {1, redis.call('HGETALL', rec)}
"""

# ARGV: new_state, result, error, now  (settle: IN_DOUBT -> new_state)
_RESOLVE = _PROLOGUE + """
if st == 'IN_DOUBT' then
  redis.call('HSET', rec, 'state', ARGV[1], 'result', ARGV[2], 'error', ARGV[3], 'updated', ARGV[4])
end
if not st then return {} end
return redis.call('HGETALL', rec)
"""

_GET = _PROLOGUE + """
if not st then return {} end
return redis.call('HGETALL', rec)
"""

# KEYS: rec, lease. ARGV: cutoff, purgeable states (comma list) -> 1 deleted, 0 kept. The state and
# `updated` are read again here, on the server, so a record claimed since SCAN listed it stays.
# A hash without a numeric `updated` is kept (none is written that way).
_PURGE = """
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then return 0 end
local st = redis.call('HGET', KEYS[1], 'state')
if not st or not string.find(',' .. ARGV[2] .. ',', ',' .. st .. ',', 1, true) then return 0 end
local updated = tonumber(redis.call('HGET', KEYS[1], 'updated'))
if not updated or updated >= tonumber(ARGV[1]) then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
return 1
"""
PURGE_BATCH = 500  # SCAN COUNT hint, and the most scripts sent in one pipeline round trip


class RedisStore(IdempotencyStore):
    def __init__(self, url: str = "redis://127.0.0.1:6379/0", *, prefix: str = "surecall:idem:", timeout_s: float = 5.0):
        self.url, self.prefix = url, prefix
        try:
            self._redis = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        except ValueError as exc:
            raise StoreUnavailable(f"Redis store {url}: {exc}") from exc
        scripts = {"claim": _CLAIM, "transition": _TRANSITION, "resolve": _RESOLVE, "get": _GET, "purge": _PURGE}
        self._scripts = {name: self._redis.register_script(src) for name, src in scripts.items()}

    def __repr__(self) -> str:
        return f"RedisStore({self.url!r})"

    def close(self) -> None:
        self._redis.close()

    def _keys(self, slot: str) -> list[str]:
        return [f"{self.prefix}{{{slot}}}", f"{self.prefix}{{{slot}}}:lease"]

    def _call(self, name: str, slot: str, args: list) -> Any:
        try:
            return self._scripts[name](keys=self._keys(slot), args=args)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise StoreUnavailable(f"Redis store {self.url}: {exc}; the outcome of this step is unknown, retry it") from exc
        except redis.RedisError as exc:
            raise StoreUnavailable(f"Redis store {self.url}: {exc}") from exc

    @staticmethod
    def _record(slot: str, flat: list) -> Record:
        if not flat:
            return Record(key=slot, state=RecordState.UNSEEN)
        h = {flat[i].decode(): flat[i + 1].decode() for i in range(0, len(flat), 2)}
        return Record(
            key=slot, state=RecordState(h["state"]), fingerprint=h.get("fp", ""), owner=h.get("owner", ""),
            lease_expires_at=float(h.get("lease_expires") or 0), result=load_result(h.get("result")),
            error=h.get("error", ""), attempts=int(h.get("attempts") or 0), updated_at=float(h.get("updated") or 0),
        )

    def get(self, key: str, *, now: float | None = None) -> Record:
        slot, _ = split_key(key)
        return self._record(slot, self._call("get", slot, []))

    def claim(self, key: str, *, lease_s: float = DEFAULT_LEASE_S, owner: str | None = None, now: float | None = None) -> Claim:
        slot, fp = split_key(key)
        owner = owner or new_owner()
        now = time.time() if now is None else now
        lease_ms = max(1, int(lease_s * 1000))
        code, payload = self._call("claim", slot, [fp, owner, lease_ms, repr(now + lease_s), repr(now)])
        if code == -1:
            check_fingerprint(key, payload.decode(), fp)
        return Claim(code == 1, self._record(slot, payload))

    def _transition(self, key: str, owner: str, step: str, state: str, allowed: str, result: str = "", error: str = "",
                    now: float | None = None, lease_s: float = 0.0) -> Record:
        slot, fp = split_key(key)
        now = time.time() if now is None else now
        extra = repr(now + lease_s) if state == "RENEW" else error
        code, payload = self._call("transition", slot, [fp, owner, state, allowed, result, extra, repr(now), max(1, int(lease_s * 1000))])
        if code == -2:
            raise IdempotencyConflict(f"cannot {step} {slot[:16]}...: no record (claim it first)")
        if code == -1:
            check_fingerprint(key, payload.decode(), fp)
        record = self._record(slot, payload)
        if code == 0:
            raise refuse(slot, step, record, owner)
        return record

    def renew(self, key: str, owner: str, *, lease_s: float = DEFAULT_LEASE_S, now: float | None = None) -> Record:
        return self._transition(key, owner, "renew (lease lost or not held)", "RENEW", "IN_FLIGHT", now=now, lease_s=lease_s)

    def complete(self, key: str, owner: str, result: Any, *, now: float | None = None) -> Record:
        return self._transition(key, owner, "complete", "COMPLETED", "IN_FLIGHT,IN_DOUBT", result=dump_result(result), now=now)

    def fail(self, key: str, owner: str, error: str, *, now: float | None = None) -> Record:
        return self._transition(key, owner, "fail", "IN_DOUBT", "IN_FLIGHT", error=str(error)[:4096], now=now)

    def release(self, key: str, owner: str, reason: str = "", *, now: float | None = None) -> Record:
        return self._transition(key, owner, "release", "NOT_EXECUTED", "IN_FLIGHT", error=str(reason)[:4096], now=now)

    def _resolve(self, key: str, state: RecordState, result: Any, error: str, now: float | None) -> Record:
        slot, _ = split_key(key)
        now = time.time() if now is None else now
        return self._record(slot, self._call("resolve", slot, [state.value, dump_result(result), error, repr(now)]))

    # --- garbage collection -----------------------------------------------------------------
    def _record_keys(self) -> Iterator[bytes]:
        """Every record hash under this store's prefix (not the lease keys), via SCAN."""
        escaped = "".join("\\" + ch if ch in "*?[]\\" else ch for ch in self.prefix)
        return self._redis.scan_iter(match=escaped + "{*}", count=PURGE_BATCH)

    def _purge_batch(self, records: list[bytes], args: list) -> int:
        pipe = self._redis.pipeline(transaction=False)
        for rec in records:
            self._scripts["purge"](keys=[rec, rec + b":lease"], args=args, client=pipe)
        return sum(int(n) for n in pipe.execute())

    def _purge(self, cutoff: float, limit: int | None) -> int:
        args = [repr(cutoff), ",".join(s.value for s in PURGEABLE)]
        deleted, batch = 0, []
        try:
            for rec in self._record_keys():
                batch.append(rec)
                # never send more scripts than records still allowed: each may delete one
                room = PURGE_BATCH if limit is None else min(PURGE_BATCH, limit - deleted)
                if len(batch) >= room:
                    deleted += self._purge_batch(batch, args)
                    batch = []
                    if limit is not None and deleted >= limit:
                        return deleted
            if batch:
                deleted += self._purge_batch(batch, args)
        except redis.RedisError as exc:
            raise StoreUnavailable(
                f"Redis store {self.url}: {exc}; purge stopped after deleting at least {deleted} records, run it again"
            ) from exc
        return deleted
