"""KV-cache blocks: a fixed pool of `block_size`-token blocks with hash-chained prefix caching.

A sequence owns a block table (block ids in token order). A block that is full gets a hash
chained from its predecessor's (`hash(prev_hash, its tokens)`), so two sequences whose token
prefixes are identical name the same blocks: a new sequence takes every leading block whose hash
is known by reference (ref count + 1) and only computes the rest. Freed blocks keep their hash and
stay findable until the pool needs them again (least recently freed first), so a system prompt +
tool catalog is computed once per engine and turn t+1 of a trajectory finds turn t's blocks.
It holds no tensors (`kv_cache.py` does) and knows nothing of scheduling (`scheduler.py`).
"""

# Adapted from the block manager idea of nano-vllm (https://github.com/GeeeekExplorer/nano-vllm,
# engine/block_manager.py): chained block hashes, ref counts, cached free blocks. The code is ours.

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass


def chain_hash(prev: bytes | None, tokens) -> bytes:
    """The hash of a full block given its predecessor's hash (None for the first block)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(prev or b"\0" * 16)
    h.update(b"".join(int(t).to_bytes(4, "little", signed=False) for t in tokens))
    return h.digest()


@dataclass
class CacheStats:
    queried_tokens: int = 0  # prompt tokens looked up in the prefix cache
    hit_tokens: int = 0  # of those, found (not recomputed)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


class BlockManager:
    """Allocation, sharing and release of KV blocks for sequences (host-side bookkeeping only)."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"Invalid block pool: expected >= 1 blocks of >= 1 tokens, got {num_blocks} x {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref = [0] * num_blocks
        self.hash: list[bytes | None] = [None] * num_blocks
        self.by_hash: dict[bytes, int] = {}
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))  # LRU first
        self.stats = CacheStats()

    @property
    def num_free(self) -> int:
        return len(self.free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # --- prefix lookup and allocation ------------------------------------------------------
    def cached_prefix(self, tokens: list[int], max_tokens: int, hashes: list[bytes] | None = None) -> list[int]:
        """Block ids of the longest run of leading full blocks already cached (within `max_tokens`);
        `hashes`: the caller's `prompt_hashes(tokens, max_tokens)`, so they are not computed again."""
        if not self.enable_prefix_caching:
            return []
        out = []
        for h in self.prompt_hashes(tokens, max_tokens) if hashes is None else hashes:
            block = self.by_hash.get(h)
            if block is None:
                break
            out.append(block)
        return out

    def can_allocate(self, tokens: list[int], num_tokens: int, compute_from: int, hashes=None) -> bool:
        hits = self.cached_prefix(tokens, compute_from, hashes)
        hit_free = sum(1 for b in hits if self.ref[b] == 0)
        return self.num_free - hit_free >= self.blocks_for(num_tokens) - len(hits)

    def allocate(self, tokens: list[int], num_tokens: int, compute_from: int, hashes=None) -> tuple[list[int], int]:
        """A block table for the first `num_tokens` token slots; reuse cached leading blocks below
        `compute_from` (at least one token is always computed). Returns (table, cached tokens)."""
        hits = self.cached_prefix(tokens, compute_from, hashes)
        for b in hits:
            self._take(b)
        table = hits + [self._fresh() for _ in range(self.blocks_for(num_tokens) - len(hits))]
        cached = len(hits) * self.block_size
        self.stats.queried_tokens += compute_from
        self.stats.hit_tokens += cached
        return table, cached

    def grow(self, table: list[int], num_tokens: int) -> bool:
        """Add blocks so `table` holds `num_tokens` slots; False (nothing changed) if the pool is short."""
        need = self.blocks_for(num_tokens) - len(table)
        if need > self.num_free:
            return False
        table.extend(self._fresh() for _ in range(need))
        return True

    def register_full(self, table: list[int], tokens: list[int], num_computed: int, hashes: list[bytes]) -> None:
        """Give every full, computed block of `table` its chained hash (so later sequences find it).

        `hashes` is the sequence's own list of its blocks' hashes so far, extended in place: each
        block is hashed once however many steps it takes to fill it.
        """
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        for i in range(len(hashes), num_computed // bs):
            h = chain_hash(hashes[-1] if hashes else None, tokens[i * bs : (i + 1) * bs])
            hashes.append(h)
            block = table[i]
            if self.hash[block] is None and h not in self.by_hash:
                self.hash[block] = h
                self.by_hash[h] = block

    def prompt_hashes(self, tokens: list[int], max_tokens: int) -> list[bytes]:
        """The chained hashes of the full blocks within the first `max_tokens` tokens."""
        out: list[bytes] = []
        for start in range(0, max_tokens - self.block_size + 1, self.block_size):
            out.append(chain_hash(out[-1] if out else None, tokens[start : start + self.block_size]))
        return out

    def release(self, table: list[int]) -> None:
        """Drop a sequence's references; blocks nobody holds become free (their hash stays findable)."""
        for block in reversed(table):  # the tail goes first, so a prefix outlives its continuations
            self.ref[block] -= 1
            if self.ref[block] < 0:
                raise RuntimeError(f"block {block} released more often than taken")  # a bookkeeping bug
            if self.ref[block] == 0:
                self.free[block] = None
        table.clear()

    def forget_cached(self) -> None:
        """Drop every cached block hash (a cold prefix cache; blocks in use keep their contents)."""
        self.by_hash.clear()
        self.hash = [None] * self.num_blocks

    # --- internals -------------------------------------------------------------------------
    def _take(self, block: int) -> None:
        if self.ref[block] == 0:
            self.free.pop(block)
        self.ref[block] += 1

    def _fresh(self) -> int:
        if not self.free:
            raise RuntimeError("KV block pool exhausted")  # callers check can_allocate/grow first
        block, _ = self.free.popitem(last=False)
        old = self.hash[block]
        if old is not None:  # evict the cached content this block held
            self.by_hash.pop(old, None)
            self.hash[block] = None
        self.ref[block] = 1
        return block
