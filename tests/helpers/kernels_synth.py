"""Random valid TokenTables for the kernel tests (the real compiler lands separately).

`random_table` builds S states over a vocabulary of `vocab_size` ids padded to `logits_width`
columns: random sparse and dense transition sets (sorted CSR, random targets), a random set of
accepting states whose mask rows also allow the stop ids, a guaranteed path to acceptance from
every state (each state gets one edge to a state closer to acceptance), and `dist` from a BFS
over the reversed graph. It is test scaffolding, not a grammar compiler.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from surecall.grammars.table import TokenTable, split_blocks


def random_table(
    rng: np.random.Generator,
    num_states: int = 12,
    vocab_size: int = 300,
    logits_width: int | None = None,
    num_stop: int = 2,
    max_density: float = 0.6,
    accept_frac: float = 0.3,
) -> TokenTable:
    logits_width = logits_width or vocab_size
    stop_ids = np.sort(rng.choice(vocab_size, size=num_stop, replace=False)).astype(np.int32)
    normal = np.setdiff1d(np.arange(vocab_size), stop_ids)
    accept = rng.random(num_states) < accept_frac
    accept[rng.integers(num_states)] = True
    order = rng.permutation(
        num_states
    )  # depth order: each non-accepting state points to an earlier one
    rank = np.empty(num_states, dtype=np.int64)
    rank[order] = np.arange(num_states)
    rows: list[dict[int, int]] = []
    for s in range(num_states):
        density = rng.choice([0.0 if accept[s] else 0.01, 0.02, rng.uniform(0.05, max_density)])
        toks = normal[rng.random(normal.shape[0]) < density]
        # Targets drawn from the states after s in depth order keep `dist` deep when accept_frac is small.
        later = order[rank[s] :]
        row = {int(t): int(rng.choice(later)) for t in toks}
        if not accept[s]:
            closer = (
                order[: rank[s]][accept[order[: rank[s]]]]
                if rank[s]
                else np.array([], dtype=np.int64)
            )
            targets = order[: rank[s]] if rank[s] else np.flatnonzero(accept)
            target = int(rng.choice(closer if closer.size and rng.random() < 0.3 else targets))
            row[int(rng.choice(normal))] = target
        rows.append(row)
    _ensure_acceptance(rows, accept, rng, normal)
    return _assemble(rows, accept, stop_ids, vocab_size, logits_width)


def _ensure_acceptance(rows, accept, rng, normal) -> None:
    """Add an edge to an accepting state from any state that still cannot reach one."""
    while True:
        dist = bfs_dist(rows, accept)
        stuck = np.flatnonzero(dist < 0)
        if stuck.size == 0:
            return
        rows[int(stuck[0])][int(rng.choice(normal))] = int(rng.choice(np.flatnonzero(accept)))


def bfs_dist(rows: list[dict[int, int]], accept: np.ndarray) -> np.ndarray:
    """Fewest tokens from each state to an accepting one (-1 when unreachable)."""
    rev: list[list[int]] = [[] for _ in rows]
    for s, row in enumerate(rows):
        for nxt in set(row.values()):
            rev[nxt].append(s)
    dist = np.full(len(rows), -1, dtype=np.int64)
    queue = deque(int(s) for s in np.flatnonzero(accept))
    dist[list(queue)] = 0
    while queue:
        s = queue.popleft()
        for p in rev[s]:
            if dist[p] < 0:
                dist[p] = dist[s] + 1
                queue.append(p)
    return dist


def _assemble(rows, accept, stop_ids, vocab_size, logits_width) -> TokenTable:
    num_states = len(rows)
    num_words = (logits_width + 31) // 32
    bits = np.zeros((num_states, num_words * 32), dtype=bool)
    ptr, toks, nxts = [0], [], []
    for s, row in enumerate(rows):
        items = sorted(row.items())
        toks += [t for t, _ in items]
        nxts += [n for _, n in items]
        ptr.append(len(toks))
        bits[s, [t for t, _ in items]] = True
        if accept[s]:
            bits[s, stop_ids] = True
    mask = np.packbits(bits, axis=1, bitorder="little").view(np.int32)
    return TokenTable.from_dense(
        mask=np.ascontiguousarray(mask),
        accept=accept.astype(bool),
        trans_ptr=np.array(ptr, dtype=np.int32),
        trans_tok=np.array(toks, dtype=np.int32),
        trans_next=np.array(nxts, dtype=np.int32),
        dist=bfs_dist(rows, accept).astype(np.int32),
        vocab_size=vocab_size,
        logits_width=logits_width,
        stop_ids=stop_ids,
    )


def random_states(
    rng: np.random.Generator, batch: int, num_states: int, frac_free: float = 0.2
) -> np.ndarray:
    """int32 [batch] states with about `frac_free` rows at -1 (no grammar)."""
    states = rng.integers(0, num_states, size=batch)
    states[rng.random(batch) < frac_free] = -1
    return states.astype(np.int32)


def deep_table(
    rng: np.random.Generator, vocab_size: int = 200, logits_width: int | None = None
) -> TokenTable:
    """A table whose dist reaches at least 3 (for budget tests)."""
    for _ in range(50):
        table = random_table(
            rng, num_states=24, vocab_size=vocab_size, logits_width=logits_width, accept_frac=0.05
        )
        if int(table.dist.max()) >= 3:
            return table
    raise RuntimeError("could not draw a deep table")


def reblock(table: TokenTable, block_words: int) -> TokenTable:
    """The same table with its mask rows split into blocks of `block_words` words (the kernels read
    the block width from the table, so small blocks give several blocks per row on a small vocabulary)."""
    blocks, row_blocks = split_blocks(table.mask_dense(), block_words)
    return TokenTable(**{**table.__dict__, "mask_blocks": blocks, "mask_row_blocks": row_blocks})


def blocky_table(rng: np.random.Generator, num_states: int = 16, vocab_size: int = 1000,
                 logits_width: int = 1024, span: int = 64, palette: int = 3) -> TokenTable:
    """A random table whose rows are built span by span from a few token sets per span (or none),
    so rows share most of their blocks of span // 32 words yet differ as wholes."""
    stop_ids = np.sort(rng.choice(vocab_size, size=2, replace=False)).astype(np.int32)
    normal = np.setdiff1d(np.arange(vocab_size), stop_ids)
    choices = [[normal[(normal >= lo) & (normal < lo + span) & (rng.random(normal.size) < 0.3)]
                for _ in range(palette)] for lo in range(0, vocab_size, span)]
    accept = rng.random(num_states) < 0.3
    accept[0] = False
    accept[rng.integers(1, num_states)] = True
    rows = []
    for _ in range(num_states):
        picks = [c[int(rng.integers(palette))] if rng.random() < 0.5 else normal[:0] for c in choices]
        toks = np.concatenate(picks)
        rows.append({int(t): int(rng.integers(num_states)) for t in toks})
    _ensure_acceptance(rows, accept, rng, normal)
    return _assemble(rows, accept, stop_ids, vocab_size, logits_width)
