"""Idempotency record stores behind one interface: `SQLiteStore` (embedded default) and `RedisStore`.

Both implement `IdempotencyStore` (claim / renew / complete / fail / release / settle / get) with
the same state machine (see `surecall.dispatch.idempotency`). `RedisStore` needs the `redis`
client package and is imported only when used, and refuses a server that may lose records
(`require_durability`). Every step after a claim takes the claim's fencing token (`token=`).
"""

from __future__ import annotations

from surecall.dispatch.stores.base import IdempotencyStore
from surecall.dispatch.stores.sqlite import SQLiteStore

__all__ = ["IdempotencyStore", "SQLiteStore", "RedisStore", "open_store"]


def __getattr__(name: str):
    if name == "RedisStore":
        from surecall.dispatch.stores.redis import RedisStore

        return RedisStore
    raise AttributeError(f"module 'surecall.dispatch.stores' has no attribute {name!r}")


def open_store(url: str, **options) -> IdempotencyStore:
    """`redis://...` / `rediss://...` / `unix://...` -> RedisStore; `sqlite:///path` or a path -> SQLiteStore.
    `options` go to the store's constructor (`takeover_margin_s`; Redis: `require_durability`, `prefix`)."""
    if url.startswith(("redis://", "rediss://", "unix://")):
        from surecall.dispatch.stores.redis import RedisStore

        return RedisStore(url, **options)
    return SQLiteStore(url.removeprefix("sqlite://"), **options)
