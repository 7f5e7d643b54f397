"""SQLite idempotency store: the embedded default, safe across threads and processes.

WAL journal, `synchronous=NORMAL` (durable across process crashes, which is what a lease
protects against), autocommit, one connection per (process, thread). The claim is one
`INSERT ... ON CONFLICT DO NOTHING`; every later transition is one `UPDATE ... WHERE state=...`
(compare-and-set), so two processes never both win. Leases are judged by the local clock
(`now`, unix seconds): use it on one host, or use `RedisStore`. The fencing token is the
`attempts` column, matched in the same UPDATE as the owner. `purge` is one `DELETE` whose
WHERE re-checks state and `updated`, so it cannot remove a record a concurrent claim just took.
A row that cannot be read back (or a damaged database file) raises StoreCorrupted.
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import threading
import time
from typing import Any

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
from surecall.errors import IdempotencyConflict, StoreCorrupted, StoreUnavailable

_SCHEMA = """
CREATE TABLE IF NOT EXISTS surecall_records (
    slot TEXT PRIMARY KEY,
    fp TEXT NOT NULL,
    state TEXT NOT NULL,
    owner TEXT NOT NULL,
    lease_expires REAL NOT NULL,
    result TEXT,
    error TEXT NOT NULL DEFAULT '',
    attempts INTEGER NOT NULL,
    updated REAL NOT NULL
) WITHOUT ROWID
"""
_COLUMNS = "slot, fp, state, owner, lease_expires, result, error, attempts, updated"
_FIELDS = tuple(_COLUMNS.split(", "))
_EXPIRED = "lease expired before the call reported back: effect unknown"
# SQLITE_CORRUPT / SQLITE_NOTADB: the file itself is damaged, retrying cannot help
_CORRUPT_CODES = ("SQLITE_CORRUPT", "SQLITE_NOTADB")


class SQLiteStore(IdempotencyStore):
    def __init__(self, path: str | os.PathLike, *, busy_timeout_s: float = 5.0,
                 takeover_margin_s: float = DEFAULT_TAKEOVER_MARGIN_S):
        self.path = os.fspath(path)
        self.busy_timeout_s = busy_timeout_s
        self.takeover_margin_s = check_margin_s(takeover_margin_s)
        self._local = threading.local()
        self._run(lambda conn: conn.execute(_SCHEMA))

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r})"

    # --- connections ---------------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None or self._local.pid != os.getpid():  # never reuse a connection across fork
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn, self._local.pid = conn, os.getpid()
        return conn

    def _run(self, fn):
        try:
            return fn(self._conn())
        except sqlite3.Error as exc:
            if getattr(exc, "sqlite_errorname", "").startswith(_CORRUPT_CODES):
                raise StoreCorrupted(f"SQLite store {self.path}: the database is damaged ({exc}); nothing was recorded") from exc
            raise StoreUnavailable(f"SQLite store {self.path}: {exc}; nothing was recorded") from exc

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid == os.getpid():
            conn.close()
        self._local.conn = None

    # --- reads ---------------------------------------------------------------------------
    def _row(self, conn: sqlite3.Connection, slot: str, now: float | None = None) -> Record | None:
        return self._record(conn.execute(f"SELECT {_COLUMNS} FROM surecall_records WHERE slot=?", (slot,)).fetchone(), now)

    def _record(self, row: tuple | None, now: float | None = None) -> Record | None:
        """The row as a Record (StoreCorrupted when it cannot be); with `now`, whether a lapsed
        owner may still be running is judged against it."""
        if row is None:
            return None
        rec = parse_record(f"SQLite store {self.path}", row[0], dict(zip(_FIELDS, row)))
        if now is not None and rec.state in (RecordState.IN_FLIGHT, RecordState.IN_DOUBT) and rec.lease_expires_at > 0:
            rec = dataclasses.replace(rec, owner_may_be_alive=rec.lease_expires_at + self.takeover_margin_s > now)
        return rec

    def _expire(self, conn: sqlite3.Connection, rec: Record, now: float) -> Record:
        """IN_FLIGHT with a lease past `now` -> IN_DOUBT (CAS on owner and state)."""
        if rec.state is RecordState.IN_FLIGHT and rec.lease_expires_at <= now:
            conn.execute(
                "UPDATE surecall_records SET state='IN_DOUBT', error=?, updated=? WHERE slot=? AND state='IN_FLIGHT' AND owner=?",
                (_EXPIRED, now, rec.key, rec.owner),
            )
            # UNSEEN only if the owner completed it and a purge deleted it in between
            return self._row(conn, rec.key, now) or Record(key=rec.key, state=RecordState.UNSEEN)
        return rec

    def get(self, key: str, *, now: float | None = None) -> Record:
        slot, _ = split_key(key)
        now = time.time() if now is None else now

        def op(conn):
            rec = self._row(conn, slot, now)
            return Record(key=slot, state=RecordState.UNSEEN) if rec is None else self._expire(conn, rec, now)

        return self._run(op)

    # --- transitions ---------------------------------------------------------------------
    def claim(self, key: str, *, lease_s: float = DEFAULT_LEASE_S, owner: str | None = None, now: float | None = None) -> Claim:
        slot, fp = split_key(key)
        owner = owner or new_owner()
        now = time.time() if now is None else now
        expires = now + check_lease_s(lease_s)

        def attempt(conn) -> Claim | None:
            """One try; None when `purge` deleted the record between two of its statements."""
            cur = conn.execute(
                f"INSERT INTO surecall_records ({_COLUMNS}) VALUES (?, ?, 'IN_FLIGHT', ?, ?, NULL, '', 1, ?) ON CONFLICT(slot) DO NOTHING",
                (slot, fp, owner, expires, now),
            )
            if cur.rowcount == 1:
                return Claim(True, Record(slot, RecordState.IN_FLIGHT, fp, owner, expires, attempts=1, updated_at=now))
            rec = self._row(conn, slot)
            if rec is None:
                return None
            check_fingerprint(key, rec.fingerprint, fp)
            if rec.state is RecordState.NOT_EXECUTED:
                rows = conn.execute(
                    "UPDATE surecall_records SET state='IN_FLIGHT', owner=?, lease_expires=?, error='', attempts=attempts+1, updated=? "
                    f"WHERE slot=? AND state='NOT_EXECUTED' RETURNING {_COLUMNS}",
                    (owner, expires, now, slot),
                ).fetchall()
                if rows:
                    return Claim(True, self._record(rows[0]))
                rec = self._row(conn, slot)
                if rec is None:
                    return None
            rec = self._expire(conn, rec, now)
            return None if rec.state is RecordState.UNSEEN else Claim(False, rec)

        def op(conn):
            # a retry means `purge` deleted the slot between two statements: the next INSERT then
            # normally wins (or meets a new claimer's record); the bound only stops a livelock
            for _ in range(100):
                claim = attempt(conn)
                if claim is not None:
                    return claim
            raise IdempotencyConflict(f"cannot claim {slot[:16]}...: the record kept vanishing (concurrent purges)")

        return self._run(op)

    def _transition(self, key: str, owner: str, token: int | None, step: str, sql: str, params: tuple,
                    allowed: tuple[RecordState, ...], now: float, extra: tuple = ()) -> Record:
        """One compare-and-set UPDATE on (slot, fp, owner, token, state); the refusal says why."""
        slot, fp = split_key(key)
        token = check_token(token)

        def op(conn):
            # RETURNING (SQLite >= 3.35) hands back the new row from the same atomic statement
            where = (slot, fp, owner, token, token, *[s.value for s in allowed])
            rows = conn.execute(sql + f" RETURNING {_COLUMNS}", (*params, *where, *extra)).fetchall()
            if rows:  # fetchall: the statement (and its write lock) is finished before we return
                return self._record(rows[0])
            rec = self._row(conn, slot, now)
            if rec is None:
                raise IdempotencyConflict(f"cannot {step} {slot[:16]}...: no record (claim it first)")
            check_fingerprint(key, rec.fingerprint, fp)
            raise refuse(slot, step, self._expire(conn, rec, now), owner, token, renewing=step.startswith("renew"))

        return self._run(op)

    def _where(self, allowed: tuple[RecordState, ...]) -> str:
        states = ",".join("?" for _ in allowed)
        return f"WHERE slot=? AND fp=? AND owner=? AND (? IS NULL OR attempts=?) AND state IN ({states})"

    def renew(self, key: str, owner: str, *, token: int | None = None, lease_s: float = DEFAULT_LEASE_S,
              now: float | None = None) -> Record:
        now = time.time() if now is None else now
        expires = now + check_lease_s(lease_s)
        allowed = (RecordState.IN_FLIGHT,)
        # `lease_expires > now`: a lapsed lease is never revived, even before anyone noticed it
        sql = f"UPDATE surecall_records SET lease_expires=?, updated=? {self._where(allowed)} AND lease_expires>?"
        return self._transition(key, owner, token, "renew (lease lost or not held)", sql, (expires, now), allowed, now, (now,))

    def complete(self, key: str, owner: str, result: Any, *, token: int | None = None, now: float | None = None) -> Record:
        now = time.time() if now is None else now
        allowed = (RecordState.IN_FLIGHT, RecordState.IN_DOUBT)
        sql = f"UPDATE surecall_records SET state='COMPLETED', result=?, error='', lease_expires=0, updated=? {self._where(allowed)}"
        return self._transition(key, owner, token, "complete", sql, (dump_result(result), now), allowed, now)

    def fail(self, key: str, owner: str, error: str, *, token: int | None = None, now: float | None = None) -> Record:
        now = time.time() if now is None else now
        allowed = (RecordState.IN_FLIGHT,)
        sql = f"UPDATE surecall_records SET state='IN_DOUBT', error=?, lease_expires=0, updated=? {self._where(allowed)}"
        return self._transition(key, owner, token, "fail", sql, (str(error)[:4096], now), allowed, now)

    def release(self, key: str, owner: str, reason: str = "", *, token: int | None = None, now: float | None = None) -> Record:
        now = time.time() if now is None else now
        allowed = (RecordState.IN_FLIGHT,)
        sql = f"UPDATE surecall_records SET state='NOT_EXECUTED', error=?, lease_expires=0, updated=? {self._where(allowed)}"
        return self._transition(key, owner, token, "release", sql, (str(reason)[:4096], now), allowed, now)

    def _resolve(self, key: str, state: RecordState, result: Any, error: str, now: float | None) -> Record:
        slot, _ = split_key(key)
        now = time.time() if now is None else now

        def op(conn):
            conn.execute(
                "UPDATE surecall_records SET state=?, result=?, error=?, updated=? WHERE slot=? AND state='IN_DOUBT'",
                (state.value, dump_result(result), error, now, slot),
            )
            return self._row(conn, slot, now) or Record(key=slot, state=RecordState.UNSEEN)  # settled and purged meanwhile

        return self._run(op)

    def _purge(self, cutoff: float, limit: int | None) -> int:
        # One statement is one transaction holding the write lock from its first read: the state and
        # age test and the delete are atomic, and a record claimed or settled meanwhile is not seen
        # as old and settled. The test is in the outer WHERE too, so LIMIT only ever narrows it.
        # (DELETE ... LIMIT needs a compile option, hence the sub-select.) A full scan: purge is a
        # periodic chore, and an index on `updated` would cost every transition a second write.
        states = ",".join("?" for _ in PURGEABLE)
        where = f"state IN ({states}) AND updated < ?"
        params = (*[s.value for s in PURGEABLE], cutoff)
        if limit is None:
            sql, args = f"DELETE FROM surecall_records WHERE {where}", params
        else:
            sql = f"DELETE FROM surecall_records WHERE slot IN (SELECT slot FROM surecall_records WHERE {where} LIMIT ?) AND {where}"
            args = (*params, limit, *params)
        return self._run(lambda conn: conn.execute(sql, args).rowcount)

