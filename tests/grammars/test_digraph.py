"""automaton.Digraph's searches: scipy.sparse.csgraph and the Python fallback give the same arrays.

Random graphs (chains, self-loops, cycles, unreachable parts) and real byte DFAs, compared with
each other and with plain definitions (reachability by repeated expansion, BFS by a deque).
"""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from surecall.grammars import automaton
from surecall.grammars.automaton import (
    Digraph,
    bfs_order,
    coreachable,
    regex_to_dfa,
    strongly_connected,
    weighted_distances,
)


def _random_graph(rng: np.random.Generator, n: int) -> Digraph:
    edges = set()
    for s in range(n):
        for _ in range(int(rng.integers(0, 4))):
            edges.add((s, int(rng.integers(0, n))))
    for s in range(n - 1):  # a long chain, as literal keys make
        if rng.random() < 0.6:
            edges.add((s, s + 1))
    by_src: dict[int, list[int]] = {}
    for s, t in edges:
        by_src.setdefault(s, []).append(t)
    src, dst = [], []
    for s in sorted(by_src):
        targets = by_src[s]
        rng.shuffle(targets)  # successor order is the graph's, not ascending
        src += [s] * len(targets)
        dst += targets
    return Digraph(n, np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64))


def _graphs():
    rng = np.random.default_rng(15)
    out = [_random_graph(rng, n) for n in (1, 2, 7, 40, 300) for _ in range(4)]
    for regex in (r'\{"a": ?[0-9]+(, ?"b": ?"[a-z]*")?\}', r"(ab|cd)*e{2,5}", r'"([^"\\]|\\.)*"'):
        out.append(Digraph.of_dfa(regex_to_dfa(regex).trans))
    return out


GRAPHS = _graphs()


def _both(fn):
    """fn() with scipy, then with the Python searches."""
    with_scipy = fn()
    automaton.USE_SCIPY = False
    try:
        return with_scipy, fn()
    finally:
        automaton.USE_SCIPY = True


def _plain_bfs(graph: Digraph, start: int, live: np.ndarray) -> list[int]:
    succ, seen, order, queue = graph.lists(), {start}, [start], deque([start])
    while queue:
        for t in succ[queue.popleft()]:
            if live[t] and t not in seen:
                seen.add(t)
                order.append(t)
                queue.append(t)
    return order


def _plain_reach_back(graph: Digraph, accept: np.ndarray) -> np.ndarray:
    live = accept.copy()
    src = graph.sources()
    while True:
        grown = live.copy()
        grown[src[live[graph.dst]]] = True
        if (grown == live).all():
            return live
        live = grown


@pytest.mark.parametrize("k", range(len(GRAPHS)))
def test_searches_agree_with_their_definitions_both_ways(k):
    graph = GRAPHS[k]
    rng = np.random.default_rng(k)
    accept = rng.random(graph.n) < 0.2
    accept[-1] = True
    live_a, live_b = _both(lambda: coreachable(graph, accept))
    assert np.array_equal(live_a, live_b)
    assert np.array_equal(live_a, _plain_reach_back(graph, accept))
    live = live_a.copy()
    live[0] = True
    order_a, order_b = _both(lambda: bfs_order(graph, 0, live))
    assert order_a.tolist() == order_b.tolist() == _plain_bfs(graph, 0, live)


@pytest.mark.parametrize("k", range(len(GRAPHS)))
def test_components_are_the_same_partition_both_ways(k):
    graph = GRAPHS[k]
    (comp_a, cyc_a), (comp_b, cyc_b) = _both(lambda: strongly_connected(graph))
    # labels may differ; the partition and each component's cycle flag may not
    pairs = set(zip(comp_a.tolist(), comp_b.tolist(), strict=True))
    assert len(pairs) == len(set(comp_a.tolist())) == len(set(comp_b.tolist()))
    assert np.array_equal(cyc_a[comp_a], cyc_b[comp_b])
    # same component iff each reaches the other
    reach = [set(_plain_bfs(graph, s, np.ones(graph.n, dtype=bool))) for s in range(graph.n)]
    for s in range(len(reach)):
        for t in range(len(reach)):
            assert (comp_a[s] == comp_a[t]) == (t in reach[s] and s in reach[t])
        assert cyc_a[comp_a[s]] == any(s in reach[t] for t in graph.lists()[s])


@pytest.mark.parametrize("k", range(len(GRAPHS)))
def test_weighted_distances_agree_both_ways(k):
    graph = GRAPHS[k]
    rng = np.random.default_rng(100 + k)
    src, dst = graph.sources(), graph.dst
    src, dst = np.concatenate([src, src]), np.concatenate([dst, dst])  # duplicates, other weights
    weight = rng.integers(0, 5, size=src.size)
    sources = np.flatnonzero(rng.random(graph.n) < 0.1)
    a, b = _both(lambda: weighted_distances(graph.n, src, dst, weight, sources))
    assert a.dtype == np.int32 and np.array_equal(a, b)
    # Bellman-Ford as the definition
    best = np.full(graph.n, np.iinfo(np.int64).max // 4)
    best[sources] = 0
    for _ in range(graph.n):
        np.minimum.at(best, dst, best[src] + weight)
    expect = np.where(best >= np.iinfo(np.int64).max // 4, -1, best)
    assert a.tolist() == expect.tolist()


def test_a_table_compiles_the_same_without_scipy():
    from helpers.grammar_checks import byte_vocab

    from surecall.grammars.compile import compile_schema

    schema = {"type": "object", "properties": {"q": {"type": "string", "maxLength": 60},
                                               "n": {"type": "array", "items": {"type": "integer"}, "maxItems": 12}},
              "required": ["q"]}
    vocab = byte_vocab("digraph")
    a, b = _both(lambda: compile_schema(schema, vocab, use_cache=False))
    for field in ("accept", "trans_default", "exc_row", "exc_ptr", "exc_tok", "exc_slot", "exc_base", "exc_targets",
                  "dist", "mask_row", "mask_blocks"):
        assert np.array_equal(getattr(a, field), getattr(b, field)), field
