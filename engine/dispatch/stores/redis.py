"""Redis idempotency store: the same state machine as SQLiteStore, for workers on many hosts.

Each record is a hash `surecall:idem:{slot}`; its lease is a separate key claimed with
`SET NX PX` (`surecall:idem:{slot}:lease`), so the Redis server's clock, not the workers',
decides when a lease ends. Each transition is one Lua script (atomic on the server): the claim
creates the record and the lease together; a record IN_FLIGHT whose lease key has vanished is
turned into IN_DOUBT. The `now` arguments only stamp `updated`; lease expiry ignores them.
Connection failures raise StoreUnavailable. Records have no TTL: `purge` walks the prefix with
SCAN and deletes each old settled record with a script that re-checks its state and `updated`.
The lease's end by the server clock is kept too (`lease_end_ms`), so the takeover margin is
judged by one clock. The fencing token is the hash's `attempts`, compared in the script that writes. At
connect the server's persistence is checked (see `RedisStore`): a store that forgets records
breaks at-most-once silently.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import redis

from surecall.dispatch.idempotency import (
    Claim,
    Record,
    RecordState,
    check_fingerprint,
    check_lease_s,
    split_key,
)
from surecall.dispatch.stores.base import (
    DEFAULT_LEASE_S,
    DEFAULT_TAKEOVER_MARGIN_S,
    PURGEABLE,
    IdempotencyStore,
    check_margin_s,
    check_token,
    dump_result,
    new_owner,
    parse_record,
    refuse,
)
from surecall.errors import IdempotencyConflict, StoreCorrupted, StoreNotDurable, StoreUnavailable

_EXPIRED = "lease expired before the call reported back: effect unknown"

# KEYS: rec, lease. Shared prologue: load the state and turn a lapsed lease into IN_DOUBT.
# `lease_end_ms` is when the lease ends by the server's clock (TIME): `get` compares it, plus the
# caller's takeover margin, with the server's clock to say whether a lapsed owner may still run.
_PROLOGUE = f"""
local rec, lease = KEYS[1], KEYS[2]
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function lease_end(ms) return string.format('%.0f', now_ms + tonumber(ms)) end
local st = redis.call('HGET', rec, 'state')
if not st and redis.call('EXISTS', rec) == 1 then return redis.error_reply('CORRUPT the record has no state field') end
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
             'attempts', 1, 'updated', ARGV[5], 'error', '', 'result', '', 'lease_end_ms', lease_end(ARGV[3]))
  return {1, redis.call('HGETALL', rec)}
end
local fp = redis.call('HGET', rec, 'fp')
if fp ~= ARGV[1] then return {-1, fp} end
if st == 'NOT_EXECUTED' and redis.call('SET', lease, ARGV[2], 'NX', 'PX', ARGV[3]) then
  redis.call('HSET', rec, 'state', 'IN_FLIGHT', 'owner', ARGV[2], 'lease_expires', ARGV[4], 'updated', ARGV[5], 'error', '',
             'lease_end_ms', lease_end(ARGV[3]))
  redis.call('HINCRBY', rec, 'attempts', 1)
  return {1, redis.call('HGETALL', rec)}
end
return {0, redis.call('HGETALL', rec)}
"""

# ARGV: fp, owner, new_state, allowed states (comma list), result, error (or lease_expires for
# RENEW), now, renew_ms, token ('' = owner only). The owner and the fencing token
# (`attempts`) are compared here, in the same script that writes.
_TRANSITION = _PROLOGUE + """
if not st then return {-2, {}} end
local fp = redis.call('HGET', rec, 'fp')
if fp ~= ARGV[1] then return {-1, fp} end
local owner = redis.call('HGET', rec, 'owner')
local allowed = string.find(',' .. ARGV[4] .. ',', ',' .. st .. ',', 1, true)
local fenced = ARGV[9] ~= '' and redis.call('HGET', rec, 'attempts') ~= ARGV[9]
if owner ~= ARGV[2] or fenced or not allowed then return {0, redis.call('HGETALL', rec)} end
if ARGV[3] == 'RENEW' then
  redis.call('SET', lease, ARGV[2], 'PX', ARGV[8])
  redis.call('HSET', rec, 'lease_expires', ARGV[6], 'updated', ARGV[7], 'lease_end_ms', lease_end(ARGV[8]))
else
  redis.call('DEL', lease)
  redis.call('HSET', rec, 'state', ARGV[3], 'result', ARGV[5], 'error', ARGV[6], 'lease_expires', 0, 'updated', ARGV[7],
             'lease_end_ms', 0)
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

# ARGV: takeover_margin_ms -> {owner may be alive (0|1), hgetall}
_GET = _PROLOGUE + """
if not st then return {0, {}} end
local ends = tonumber(redis.call('HGET', rec, 'lease_end_ms') or '0') or 0
local held = (st == 'IN_FLIGHT' or st == 'IN_DOUBT') and ends > 0 and now_ms < ends + tonumber(ARGV[1])
return {held and 1 or 0, redis.call('HGETALL', rec)}
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
# What `require_durability` wants of the server: each setting and the values accepted (first: the fix).
DURABLE_CONFIG = {"appendonly": ("yes",), "appendfsync": ("everysec", "always"), "maxmemory-policy": ("noeviction",)}


def _ms(seconds: float) -> int:
    """Whole milliseconds for PX (an integer), rounded up so a lease is never shorter than asked."""
    return max(1, math.ceil(seconds * 1000))


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class RedisStore(IdempotencyStore):
    """`require_durability` (default True) checks the server at connect and refuses one that may
    lose records (StoreNotDurable): AOF on (`appendonly yes`, `appendfsync` everysec or always)
    and `maxmemory-policy noeviction`. everysec can lose the last second of writes on a host
    crash (not on a redis-server crash); `always` closes that. A server unreachable at
    construction is checked on first use instead."""

    def __init__(self, url: str = "redis://127.0.0.1:6379/0", *, prefix: str = "surecall:idem:", timeout_s: float = 5.0,
                 require_durability: bool = True, takeover_margin_s: float = DEFAULT_TAKEOVER_MARGIN_S):
        self.url, self.prefix = url, prefix
        self.takeover_margin_s = check_margin_s(takeover_margin_s)
        try:
            self._redis = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        except ValueError as exc:
            raise StoreUnavailable(f"Redis store {url}: {exc}") from exc
        scripts = {"claim": _CLAIM, "transition": _TRANSITION, "resolve": _RESOLVE, "get": _GET, "purge": _PURGE}
        self._scripts = {name: self._redis.register_script(src) for name, src in scripts.items()}
        self._is_checked = not require_durability
        try:
            self._check_durability()
        except StoreNotDurable:
            self._redis.close()
            raise
        except StoreUnavailable:
            pass  # not reachable yet: checked again before the first operation

    def __repr__(self) -> str:
        return f"RedisStore({self.url!r})"

    def close(self) -> None:
        self._redis.close()

    # --- durability ------------------------------------------------------------------------
    def _check_durability(self) -> None:
        """StoreNotDurable unless the server keeps every acknowledged write (see the class docstring)."""
        if self._is_checked:
            return
        try:
            config = {}
            for name in DURABLE_CONFIG:
                config.update({_text(k): _text(v) for k, v in self._redis.config_get(name).items()})
        except redis.ResponseError as exc:  # CONFIG renamed away or denied (managed Redis, ACLs)
            raise StoreNotDurable(
                f"Redis store {self.url}: cannot check durability, CONFIG GET is refused ({exc}). If the server "
                "persists with AOF (appendonly yes, appendfsync everysec or always) and never evicts "
                "(maxmemory-policy noeviction), pass RedisStore(..., require_durability=False)"
            ) from exc
        except redis.RedisError as exc:
            raise StoreUnavailable(f"Redis store {self.url}: {exc}; durability not checked yet") from exc
        wrong = [(name, config.get(name), want) for name, want in DURABLE_CONFIG.items() if config.get(name) not in want]
        if wrong:
            found = ", ".join(f"{name} is {got!r} (want {' or '.join(want)})" for name, got, want in wrong)
            fixes = " && ".join(f"redis-cli CONFIG SET {name} {want[0]}" for name, _, want in wrong)
            raise StoreNotDurable(
                f"Redis store {self.url} may lose idempotency records (a replay would then run a call twice): {found}. "
                f"Fix the server: {fixes} && redis-cli CONFIG REWRITE (or set them in redis.conf); "
                "or accept the risk with RedisStore(..., require_durability=False)"
            )
        self._is_checked = True

    # --- scripts ---------------------------------------------------------------------------
    def _keys(self, slot: str) -> list[str]:
        rec = f"{self.prefix}{{{slot}}}"
        return [rec, f"{rec}:lease"]

    def _call(self, name: str, slot: str, args: list) -> Any:
        self._check_durability()
        try:
            return self._scripts[name](keys=self._keys(slot), args=args)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise StoreUnavailable(f"Redis store {self.url}: {exc}; the outcome of this step is unknown, retry it") from exc
        except redis.ResponseError as exc:
            if str(exc).startswith(("WRONGTYPE", "CORRUPT")):
                raise StoreCorrupted(
                    f"Redis store {self.url}: record {slot[:16]}... is corrupted ({exc}); "
                    "nothing was changed, inspect or delete it"
                ) from exc
            raise StoreUnavailable(f"Redis store {self.url}: {exc}") from exc
        except redis.RedisError as exc:
            raise StoreUnavailable(f"Redis store {self.url}: {exc}") from exc

    def _record(self, slot: str, flat: list, *, owner_may_be_alive: bool = False) -> Record:
        if not flat:
            return Record(key=slot, state=RecordState.UNSEEN)
        where = f"Redis store {self.url}"
        try:
            fields = {flat[i].decode(): flat[i + 1].decode() for i in range(0, len(flat) - 1, 2)}
        except (UnicodeDecodeError, AttributeError) as exc:
            raise StoreCorrupted(f"{where}: record {slot[:16]}... is corrupted: a field is not UTF-8 text ({exc})") from exc
        return parse_record(where, slot, fields, owner_may_be_alive=owner_may_be_alive)

    def _stored_fp(self, slot: str, payload: Any) -> str:
        if not isinstance(payload, bytes):
            raise StoreCorrupted(f"Redis store {self.url}: record {slot[:16]}... is corrupted: it has no fingerprint (fp)")
        return payload.decode(errors="replace")

    def get(self, key: str, *, now: float | None = None) -> Record:
        slot, _ = split_key(key)
        alive, flat = self._call("get", slot, [_ms(self.takeover_margin_s)])
        return self._record(slot, flat, owner_may_be_alive=alive == 1)

    def claim(self, key: str, *, lease_s: float = DEFAULT_LEASE_S, owner: str | None = None, now: float | None = None) -> Claim:
        slot, fp = split_key(key)
        owner = owner or new_owner()
        now = time.time() if now is None else now
        lease_s = check_lease_s(lease_s)
        args = [fp, owner, _ms(lease_s), repr(now + lease_s), repr(now)]
        code, payload = self._call("claim", slot, args)
        if code == -1:
            check_fingerprint(key, self._stored_fp(slot, payload), fp)
        return Claim(code == 1, self._record(slot, payload))

    def _transition(self, key: str, owner: str, step: str, state: str, allowed: str, *, token: int | None,
                    result: str = "", error: str = "", now: float | None = None, lease_s: float = DEFAULT_LEASE_S) -> Record:
        slot, fp = split_key(key)
        token = check_token(token)
        now = time.time() if now is None else now
        extra = repr(now + lease_s) if state == "RENEW" else error
        args = [fp, owner, state, allowed, result, extra, repr(now), _ms(lease_s), "" if token is None else str(token)]
        code, payload = self._call("transition", slot, args)
        if code == -2:
            raise IdempotencyConflict(f"cannot {step} {slot[:16]}...: no record (claim it first)")
        if code == -1:
            check_fingerprint(key, self._stored_fp(slot, payload), fp)
        record = self._record(slot, payload)
        if code == 0:
            raise refuse(slot, step, record, owner, token, renewing=state == "RENEW")
        return record

    def renew(self, key: str, owner: str, *, token: int | None = None, lease_s: float = DEFAULT_LEASE_S,
              now: float | None = None) -> Record:
        return self._transition(key, owner, "renew (lease lost or not held)", "RENEW", "IN_FLIGHT", token=token, now=now,
                                lease_s=check_lease_s(lease_s))

    def complete(self, key: str, owner: str, result: Any, *, token: int | None = None, now: float | None = None) -> Record:
        return self._transition(key, owner, "complete", "COMPLETED", "IN_FLIGHT,IN_DOUBT", token=token,
                                result=dump_result(result), now=now)

    def fail(self, key: str, owner: str, error: str, *, token: int | None = None, now: float | None = None) -> Record:
        return self._transition(key, owner, "fail", "IN_DOUBT", "IN_FLIGHT", token=token, error=str(error)[:4096], now=now)

    def release(self, key: str, owner: str, reason: str = "", *, token: int | None = None, now: float | None = None) -> Record:
        return self._transition(key, owner, "release", "NOT_EXECUTED", "IN_FLIGHT", token=token, error=str(reason)[:4096], now=now)

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
