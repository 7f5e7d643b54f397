"""Regex -> byte DFA: dense state ids, start 0, accepting set, dead states pruned.

The regex is compiled by outlines-core's `Index` over a 256-entry vocabulary of single bytes
(token id = byte value), so its automaton is the byte-level DFA of the regex; we then relabel it
densely in BFS order and drop every state that is unreachable or cannot reach acceptance. This
module knows nothing of tokenizers: walking real tokens through the DFA is `tokenwalk.py`'s job.
It also offers the strongly connected components the token walk uses to share work.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from surecall.errors import SchemaError

_EOS_ID = 256  # the byte vocabulary's end id: outlines-core needs one; never a byte


@dataclass(frozen=True)
class ByteDFA:
    trans: np.ndarray  # int32 [S, 256]; next state per byte, -1 = dead
    accept: np.ndarray  # bool [S]

    @property
    def num_states(self) -> int:
        return int(self.accept.shape[0])

    def matches(self, data: bytes) -> bool:
        """Whether the DFA accepts exactly `data` (a reference for tests)."""
        state = 0
        for b in data:
            state = int(self.trans[state, b])
            if state < 0:
                return False
        return bool(self.accept[state])


@lru_cache(maxsize=1)
def _byte_vocabulary():
    from outlines_core import Vocabulary

    return Vocabulary(_EOS_ID, {bytes([b]): [b] for b in range(256)})


def regex_to_dfa(regex: str) -> ByteDFA:
    """Compile `regex` into a pruned, densely numbered byte DFA (state 0 is the start).

    Raises SchemaError when outlines-core rejects the regex or it matches nothing.
    """
    from outlines_core import Index

    try:
        index = Index(regex, _byte_vocabulary())
    except Exception as exc:  # outlines-core raises plain ValueError/RuntimeError
        raise SchemaError(f"regex does not compile: {exc}", pointer="", keyword="regex") from exc
    raw = index.get_transitions()
    finals = set(index.get_final_states())
    return _densify(raw, index.get_initial_state(), finals)


_CHILD_CODE = """
import io, resource, sys
import numpy as np
limit = int(sys.argv[1])
with open("/proc/self/status") as f:
    vm_size = next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:")), 0)
resource.setrlimit(resource.RLIMIT_AS, (vm_size + limit, vm_size + limit))
from surecall.errors import SchemaError
from surecall.grammars.automaton import regex_to_dfa
try:
    dfa = regex_to_dfa(sys.stdin.buffer.read().decode("utf-8", "surrogatepass"))
except SchemaError as exc:
    sys.stderr.write(str(exc))
    sys.exit(3)
except MemoryError:
    sys.exit(4)
out = io.BytesIO()
np.save(out, dfa.trans)
np.save(out, dfa.accept)
sys.stdout.buffer.write(out.getvalue())
"""


def regex_to_dfa_isolated(regex: str, time_budget_s: float, memory_budget_bytes: int) -> ByteDFA:
    """`regex_to_dfa` in a child interpreter that is killed past the time or memory budget.

    outlines-core cannot be interrupted once it runs, and a large regex can cost it minutes or
    gigabytes; a separate process bounds both (RLIMIT_AS inside, a wall-clock timeout outside).
    Raises CompileBudgetExceeded when the child is killed or runs out of memory.
    """
    import io
    import subprocess
    import sys

    from surecall.errors import CompileBudgetExceeded

    try:
        done = subprocess.run([sys.executable, "-c", _CHILD_CODE, str(int(memory_budget_bytes))],
                              input=regex.encode("utf-8", "surrogatepass"), capture_output=True,
                              timeout=time_budget_s)
    except subprocess.TimeoutExpired:
        raise CompileBudgetExceeded(
            f"the byte DFA of a {len(regex)}-character regex took longer than the time budget of "
            f"{time_budget_s:g} s; simplify the schema or raise time_budget_s"
        ) from None
    if done.returncode == 3:
        raise SchemaError(done.stderr.decode(errors="replace"), pointer="", keyword="regex")
    if done.returncode != 0:
        raise CompileBudgetExceeded(
            f"the byte DFA of a {len(regex)}-character regex ran past the memory budget of "
            f"{memory_budget_bytes / 2**20:.0f} MiB (child exit {done.returncode}); "
            "simplify the schema or raise memory_budget_bytes"
        )
    buf = io.BytesIO(done.stdout)
    return ByteDFA(trans=np.load(buf), accept=np.load(buf))


def _densify(raw: dict, initial: int, finals: set) -> ByteDFA:
    # 1. Sparse outlines-core ids -> 0..n-1 (any order), one flat edge list.
    ids = sorted(set(raw) | finals | {initial} | {t for row in raw.values() for t in row.values()})
    local = {s: i for i, s in enumerate(ids)}
    src, byte, dst = [], [], []
    for s, row in raw.items():
        byte.extend(row.keys())
        dst.extend(row.values())
        src.extend([s] * len(row))
    src_a = np.fromiter((local[s] for s in src), dtype=np.int64, count=len(src))
    dst_a = np.fromiter((local[s] for s in dst), dtype=np.int64, count=len(dst))
    byte_a = np.asarray(byte, dtype=np.int64)
    keep = byte_a < 256
    n = len(ids)
    trans = np.full((n, 256), -1, dtype=np.int32)
    trans[src_a[keep], byte_a[keep]] = dst_a[keep]
    accept = np.zeros(n, dtype=bool)
    accept[[local[s] for s in finals]] = True
    # 2. Keep states reachable from the start that can reach acceptance, BFS-numbered.
    return prune(trans, accept, local[initial])


def prune(trans: np.ndarray, accept: np.ndarray, start: int = 0) -> ByteDFA:
    """Drop unreachable and dead states; renumber in BFS order from `start` (which becomes 0)."""
    succ = successor_lists(trans)
    live = coreachable(succ, accept)
    if not live[start]:
        raise SchemaError("the grammar matches no text at all", pointer="", keyword="regex")
    order = bfs_order(succ, start, live)
    new_id = np.full(trans.shape[0] + 1, -1, dtype=np.int32)  # index -1 (dead) maps to -1
    new_id[order] = np.arange(len(order), dtype=np.int32)
    new_trans = new_id[trans[order]]
    return ByteDFA(trans=np.ascontiguousarray(new_trans, dtype=np.int32), accept=accept[order].copy())


def successor_lists(trans: np.ndarray) -> list[list[int]]:
    """For each state, its distinct successor states in order of the smallest byte leading there."""
    n = trans.shape[0]
    rows, byte = np.nonzero(trans >= 0)
    targets = trans[rows, byte].astype(np.int64)
    # One sort by (row, target, byte) finds each (row, target)'s smallest byte; a second sort
    # by (row, that byte) gives the canonical order.
    order = np.lexsort((byte, targets, rows))
    rows, targets, byte = rows[order], targets[order], byte[order]
    first = np.ones(rows.size, dtype=bool)
    first[1:] = (rows[1:] != rows[:-1]) | (targets[1:] != targets[:-1])
    rows, targets, byte = rows[first], targets[first], byte[first]
    order = np.lexsort((byte, rows))
    rows, targets = rows[order], targets[order]
    bounds = np.searchsorted(rows, np.arange(n + 1))
    flat = targets.tolist()
    return [flat[bounds[i] : bounds[i + 1]] for i in range(n)]


def coreachable(succ, accept: np.ndarray) -> np.ndarray:
    """Which states can reach an accepting state (reverse BFS); `succ[s]` lists s's successors."""
    pred: list[list[int]] = [[] for _ in succ]
    for s, targets in enumerate(succ):
        for t in targets:
            pred[t].append(s)
    live = accept.copy()
    queue = deque(np.flatnonzero(accept).tolist())
    while queue:
        t = queue.popleft()
        for s in pred[t]:
            if not live[s]:
                live[s] = True
                queue.append(s)
    return live


def bfs_order(succ, start: int, live: np.ndarray) -> np.ndarray:
    """Live states reachable from `start`, in BFS order (the dense numbering)."""
    seen = {start}
    order = [start]
    queue = deque([start])
    while queue:
        s = queue.popleft()
        for t in succ[s]:
            if live[t] and t not in seen:
                seen.add(t)
                order.append(t)
                queue.append(t)
    return np.asarray(order, dtype=np.int64)


def strongly_connected(succ: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(component id per state, whether that component has a cycle), iterative Tarjan."""
    n = len(succ)
    index = [-1] * n
    low = [0] * n
    on_stack = [False] * n
    comp = np.full(n, -1, dtype=np.int64)
    stack: list[int] = []
    counter = 0
    num_comps = 0
    cyclic: list[bool] = []
    for root in range(n):
        if index[root] >= 0:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack[v] = True
            recurse = False
            targets = succ[v]
            while i < len(targets):
                w = targets[i]
                i += 1
                if index[w] < 0:
                    work.append((v, i))
                    work.append((w, 0))
                    recurse = True
                    break
                if on_stack[w]:
                    low[v] = min(low[v], index[w])
            if recurse:
                continue
            if low[v] == index[v]:
                members = []
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    comp[w] = num_comps
                    members.append(w)
                    if w == v:
                        break
                cyclic.append(len(members) > 1 or v in succ[v])
                num_comps += 1
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return comp, np.asarray(cyclic, dtype=bool)
