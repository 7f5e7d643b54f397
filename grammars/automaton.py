"""Regex -> byte DFA: minimal, dense state ids, start 0, accepting set, dead states pruned.

The regex is compiled by outlines-core's `Index` over a 256-entry vocabulary of single bytes
(token id = byte value), so its automaton is the byte-level DFA of the regex; we then minimise
it (outlines-core keeps many equivalent states), relabel it densely in BFS order and drop every
state that is unreachable or cannot reach acceptance. Long regexes are compiled in a reusable
child process bounded by the time and memory budgets. This module knows nothing of tokenizers:
walking real tokens through the DFA is `tokenwalk.py`'s job. It also offers the strongly
connected components the token walk uses to share work."""

from __future__ import annotations

import atexit
import heapq
import io
import os
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from functools import cached_property, lru_cache
from itertools import chain

import numpy as np

from surecall.errors import CompileBudgetExceeded, SchemaError

_EOS_ID = 256  # the byte vocabulary's end id: outlines-core needs one; never a byte


@dataclass(frozen=True)
class ByteDFA:
    trans: np.ndarray  # int32 [S, 256]; next state per byte, -1 = dead
    accept: np.ndarray  # bool [S]

    @property
    def num_states(self) -> int:
        return int(self.accept.shape[0])

    @cached_property
    def _stack_mark_states(self) -> np.ndarray:
        """bool [S]: states with a bracket-stack mark and nothing else (computed once per DFA)."""
        from surecall.grammars.stack import STACK_MARK

        column = self.trans[:, STACK_MARK] >= 0
        if not column.any():
            return column
        return column & ((self.trans >= 0).sum(axis=1) == 1)

    def matches(self, data: bytes) -> bool:
        """Whether the DFA accepts exactly `data` (a reference for tests). Bracket-stack marks
        (grammars/stack.py) are followed with a stack of the open containers' kinds."""
        from surecall.grammars.stack import POP_ARRAY, POP_EXIT, POP_OBJECT, PUSH, STACK_MARK

        marked = self._stack_mark_states
        state, kinds = 0, []
        for b in data:
            state = int(self.trans[state, b])
            if state < 0:
                return False
            mark = int(self.trans[state, STACK_MARK]) if marked[state] and b in b"{[]}" else -1
            if mark >= 0:  # a bracket of a free-form value: push its kind, or pop and say what is around
                if b in b"{[":
                    kinds.append(b)
                    letter = PUSH
                else:
                    if not kinds or kinds.pop() != (b"{" if b == ord("}") else b"[")[0]:
                        return False
                    letter = POP_EXIT if not kinds else POP_OBJECT if kinds[-1] == ord("{") else POP_ARRAY
                state = int(self.trans[mark, letter[0]])
                if state < 0:
                    return False
        return bool(self.accept[state]) and not kinds


@lru_cache(maxsize=1)
def _byte_vocabulary():
    from outlines_core import Vocabulary

    return Vocabulary(_EOS_ID, {bytes([b]): [b] for b in range(256)})


def regex_to_dfa(regex: str, minimal: bool = True, pruned: bool = True) -> ByteDFA:
    """Compile `regex` into a pruned, densely numbered byte DFA (state 0 is the start).

    With `minimal` (the default) the DFA is also minimised (`minimize`): outlines-core's subset
    construction keeps many equivalent states (up to 15x on JSONSchemaBench's larger schemas).
    Without `pruned`, unreachable and dead states stay and only the start is moved to 0 (for a
    caller that edits the DFA and prunes it afterwards: string_bodies.py saves a prune so).
    Raises SchemaError when outlines-core rejects the regex or it matches nothing.
    """
    trans, accept, start = _anchored_transitions(regex)
    if minimal:  # minimise first, then prune the (smaller) quotient once
        classes = _class_columns(trans)
        quotient = quotient_by(ByteDFA(trans, accept), _refine(trans, accept, classes), classes)
        if quotient is not None:
            trans, accept, block = quotient
            start = int(block[start])
    return prune(trans, accept, start) if pruned else _start_first(trans, accept, start)


def _start_first(trans: np.ndarray, accept: np.ndarray, start: int) -> ByteDFA:
    """The same automaton with states 0 and `start` swapped (nothing pruned)."""
    swap = np.arange(trans.shape[0] + 1, dtype=np.int32)
    swap[-1] = -1  # dead stays dead
    swap[[0, start]] = start, 0
    order = swap[:-1]
    return ByteDFA(trans=np.ascontiguousarray(swap[trans[order]], dtype=np.int32), accept=accept[order].copy())


# outlines-core's DFA builder also determinises the unanchored search automaton (a match may
# start at any byte), which for nested JSON regexes is exponentially larger than the anchored
# one: a free-form object took 30 s for 485 states. A leading byte that JSON text never holds
# ends every search thread that starts past byte 0, so only the anchored automaton is built;
# the start then moves past it. Byte 0x0E is used by no mark (splice placeholders 0x00; counted 0x01,
# 0x02, 0x10-0x1F; item mark 0x0B; tool-mode placeholders 0x03-0x08); were it in a regex, the language would not change.
_SEARCH_CUT = 0x0E
# outlines-core's DFA also drops the edges that leave an accepting state when it could stop there
# (a root-level number accepted "1" but not "1.5"). The regex is built followed by this end byte:
# a state accepts iff it has an edge on it; that edge is then removed. JSON text and every mark
# leave 0x0F unused (a string body excludes control bytes), so the language does not change.
_END_MARK = 0x0F


def _anchored_transitions(regex: str) -> tuple[np.ndarray, np.ndarray, int]:
    """outlines-core's DFA of `regex` as (trans, accept, start), between `_SEARCH_CUT` and `_END_MARK`."""
    from outlines_core import Index

    try:
        index = Index(f"\\x{_SEARCH_CUT:02x}(?:{regex})\\x{_END_MARK:02x}", _byte_vocabulary())
    except Exception as exc:  # outlines-core raises plain ValueError/RuntimeError
        raise SchemaError(f"regex does not compile: {exc}", pointer="", keyword="regex") from exc
    trans, accept, start = _densify(index.get_transitions(), index.get_initial_state(),
                                    set(index.get_final_states()))
    start = int(trans[start, _SEARCH_CUT])
    ends = trans[:, _END_MARK]
    accept = (ends >= 0) & accept[np.maximum(ends, 0)]
    trans[:, _END_MARK] = -1
    if start < 0 or not accept.any():
        raise SchemaError("the grammar matches no text at all", pointer="", keyword="regex")
    return trans, accept, start


# The child: set its address-space limit, say it is ready, then answer requests (8-byte
# length + UTF-8 regex) with a status byte, an 8-byte length and a payload (two .npy arrays,
# or SchemaError's text), until its stdin closes. Out of memory, it exits (status "M").
_CHILD_CODE = """
import io, resource, sys
try:  # Linux: die with the parent, so a killed compile leaves no orphan running outlines-core
    import ctypes
    ctypes.CDLL(None).prctl(1, 9)
except (OSError, AttributeError):
    pass
import numpy as np
limit = int(sys.argv[1])
with open("/proc/self/status") as f:
    vm_size = next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:")), 0)
hard = resource.getrlimit(resource.RLIMIT_AS)[1]
cap = vm_size + limit if hard == resource.RLIM_INFINITY else min(vm_size + limit, hard)
resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
from surecall.errors import SchemaError
from surecall.grammars.automaton import regex_to_dfa
regex_to_dfa('"a"')  # first-use costs (outlines-core, the graph searches' import: ~0.3 s) before "ready"
inp, out = sys.stdin.buffer, sys.stdout.buffer
out.write(b"R")
out.flush()
while True:
    head = inp.read(8)
    if len(head) < 8:
        break
    regex = inp.read(int.from_bytes(head, "little")).decode("utf-8", "surrogatepass")
    try:
        dfa = regex_to_dfa(regex)
    except SchemaError as exc:
        status, payload = b"S", str(exc).encode("utf-8", "replace")
    except MemoryError:
        out.write(b"M" + bytes(8))
        out.flush()
        sys.exit(4)
    else:
        buf = io.BytesIO()
        np.save(buf, dfa.trans)
        np.save(buf, dfa.accept)
        status, payload = b"D", buf.getvalue()
    out.write(status + len(payload).to_bytes(8, "little") + payload)
    out.flush()
"""
_WORKER_START_S = 120.0  # an interpreter start (not counted against a compile's time budget)


class _DfaWorker:
    """One child interpreter that builds byte DFAs, started on first use and reused.

    Reusing it saves the ~150 ms an interpreter start with numpy and outlines-core costs per
    compile. It is killed (and started afresh next time) past a time budget, after running out
    of memory, or when a compile asks for a different memory budget.
    """

    def __init__(self):
        self.proc = None
        self.budget = None
        self.ready = False  # the child said it is ready ("R"); a prestarted one may not have yet
        self.owner = os.getpid()
        self.lock = threading.Lock()

    def _own(self) -> None:
        if self.owner != os.getpid():  # a forked copy: the child belongs to the parent, start our own
            self.proc, self.owner, self.lock = None, os.getpid(), threading.Lock()

    def build(self, regex: str, time_budget_s: float, memory_budget_bytes: int) -> ByteDFA:
        self._own()
        with self.lock:
            if self.proc is None or self.proc.poll() is not None or self.budget != memory_budget_bytes:
                self._spawn(memory_budget_bytes)
            if not self.ready:
                self._wait_ready()
            data = regex.encode("utf-8", "surrogatepass")
            deadline = time.monotonic() + time_budget_s
            try:
                self.proc.stdin.write(len(data).to_bytes(8, "little") + data)
                self.proc.stdin.flush()
                head = self._read(9, deadline)
                payload = self._read(int.from_bytes(head[1:], "little"), deadline)
            except TimeoutError:
                self.stop()
                raise CompileBudgetExceeded(
                    f"the byte DFA of a {len(regex)}-character regex took longer than the time budget of "
                    f"{time_budget_s:g} s; simplify the schema or raise time_budget_s"
                ) from None
            except (OSError, EOFError):
                head = b"M"
            if head[:1] == b"S":
                raise SchemaError(payload.decode("utf-8", "replace"), pointer="", keyword="regex")
            if head[:1] != b"D":
                code = self.stop()
                raise CompileBudgetExceeded(
                    f"the byte DFA of a {len(regex)}-character regex ran past the memory budget of "
                    f"{memory_budget_bytes / 2**20:.0f} MiB (child exit {code}); "
                    "simplify the schema or raise memory_budget_bytes"
                )
            buf = io.BytesIO(payload)
            return ByteDFA(trans=np.load(buf), accept=np.load(buf))

    def prestart(self, memory_budget_bytes: int) -> None:
        """Start the child for `memory_budget_bytes` now without waiting for it (a process's set-up,
        `grammars.compile.warm_up`): its interpreter start then overlaps other work instead of
        delaying the first large regex."""
        self._own()
        with self.lock:
            if self.proc is None or self.proc.poll() is not None or self.budget != memory_budget_bytes:
                self._spawn(memory_budget_bytes)

    def _spawn(self, memory_budget_bytes: int) -> None:
        self.stop()
        self.proc = subprocess.Popen([sys.executable, "-c", _CHILD_CODE, str(int(memory_budget_bytes))],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.budget, self.ready = memory_budget_bytes, False

    def _wait_ready(self) -> None:
        try:
            if self._read(1, time.monotonic() + _WORKER_START_S) != b"R":
                raise EOFError
        except (TimeoutError, EOFError, OSError):
            self.stop()
            raise CompileBudgetExceeded("the byte-DFA child process did not start") from None
        self.ready = True

    def _read(self, size: int, deadline: float) -> bytes:
        fd = self.proc.stdout.fileno()
        chunks, got = [], 0
        while got < size:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(fd, min(size - got, 1 << 22))
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def stop(self):
        """Kill the child (if any, and ours); returns its exit code."""
        proc, self.proc = self.proc, None
        if proc is None or self.owner != os.getpid():
            return None
        proc.kill()
        for pipe in (proc.stdin, proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        return proc.wait()


_WORKER = _DfaWorker()
atexit.register(_WORKER.stop)


def prestart_isolated(memory_budget_bytes: int) -> None:
    """Start regex_to_dfa_isolated's child now, in the background (see _DfaWorker.prestart)."""
    _WORKER.prestart(memory_budget_bytes)


def regex_to_dfa_isolated(regex: str, time_budget_s: float, memory_budget_bytes: int) -> ByteDFA:
    """`regex_to_dfa` in a child interpreter that is killed past the time or memory budget.

    outlines-core cannot be interrupted once it runs, and a large regex can cost it minutes or
    gigabytes; a separate process bounds both (RLIMIT_AS inside, a wall-clock timeout outside).
    The child is reused across calls. Raises CompileBudgetExceeded when it is killed or runs
    out of memory, SchemaError when outlines-core rejects the regex.
    """
    return _WORKER.build(regex, time_budget_s, memory_budget_bytes)


def _densify(raw: dict, initial: int, finals: set) -> tuple[np.ndarray, np.ndarray, int]:
    """outlines-core's transitions as (int32 [n, 256] trans, bool [n] accept, start), not pruned."""
    # 1. Sparse outlines-core ids -> 0..n-1 (sorted order), one flat edge list.
    rows = list(raw.values())
    lens = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    total = int(lens.sum())
    src = np.repeat(np.fromiter(raw.keys(), dtype=np.int64, count=len(rows)), lens)
    byte_a = np.fromiter(chain.from_iterable(rows), dtype=np.int64, count=total)
    dst = np.fromiter(chain.from_iterable(r.values() for r in rows), dtype=np.int64, count=total)
    final_a = np.fromiter(finals, dtype=np.int64, count=len(finals))
    ids = np.unique(np.concatenate([src, dst, final_a, [initial]]))
    keep = byte_a < 256
    n = ids.size
    trans = np.full((n, 256), -1, dtype=np.int32)
    trans[np.searchsorted(ids, src[keep]), byte_a[keep]] = np.searchsorted(ids, dst[keep])
    accept = np.zeros(n, dtype=bool)
    accept[np.searchsorted(ids, final_a)] = True
    return trans, accept, int(np.searchsorted(ids, initial))


def prune(trans: np.ndarray, accept: np.ndarray, start: int = 0) -> ByteDFA:
    """Drop unreachable and dead states; renumber in BFS order from `start` (which becomes 0)."""
    graph = Digraph.of_dfa(trans)
    live = coreachable(graph, accept)
    if not live[start]:
        raise SchemaError("the grammar matches no text at all", pointer="", keyword="regex")
    order = bfs_order(graph, start, live)
    new_id = np.full(trans.shape[0] + 1, -1, dtype=np.int32)  # index -1 (dead) maps to -1
    new_id[order] = np.arange(len(order), dtype=np.int32)
    new_trans = new_id[trans[order]]
    return ByteDFA(trans=np.ascontiguousarray(new_trans, dtype=np.int32), accept=accept[order].copy())


def byte_classes(trans: np.ndarray) -> np.ndarray:
    """For each byte, the smallest byte whose column of `trans` is identical (its class representative).

    Past _HASHED_COLUMNS_FROM states the columns are grouped by a 64-bit hash (a random linear form
    over the states, mod 2^64) and each byte is then compared with its group's first byte: sorting
    the 256 columns as whole byte strings took 0.6-0.7 s at 47k states (Github_ultra o65431) inside
    a compile, the hash 0.08 s. A hash collision is caught there and the columns are sorted after all.
    """
    n = trans.shape[0]
    if not n:
        return np.arange(trans.shape[1])
    if n >= _HASHED_COLUMNS_FROM:
        hashes = np.zeros(trans.shape[1], dtype=np.int64)
        weights = _column_weights(n)
        for lo in range(0, n, _HASH_BLOCK):  # int64 products wrap: the form is taken mod 2^64
            hashes += weights[lo : lo + _HASH_BLOCK] @ trans[lo : lo + _HASH_BLOCK].astype(np.int64)
        _, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
        rep = first[inverse.reshape(-1)]
        # Confirmed a block of rows at a time: one column at a time strides the whole table (3x
        # slower at 80k states).
        rest = np.flatnonzero(rep != np.arange(rep.size))
        if all(np.array_equal(trans[lo : lo + _HASH_BLOCK, rest], trans[lo : lo + _HASH_BLOCK, rep[rest]])
               for lo in range(0, n, _HASH_BLOCK)):
            return rep
    columns = np.ascontiguousarray(trans.T)  # [256, n]: one byte's column per row, compared whole
    _, first, inverse = np.unique(columns.view(np.dtype((np.void, columns.dtype.itemsize * n)))
                                  .reshape(-1), return_index=True, return_inverse=True)
    return first[inverse.reshape(-1)]


_HASHED_COLUMNS_FROM = 1024  # below, sorting the columns is as fast (0.4 ms at 483 states)
_HASH_BLOCK = 4096  # states per block of the hash's int64 copy
_WEIGHTS: list[np.ndarray] = [np.zeros(0, dtype=np.int64)]


def _column_weights(n: int) -> np.ndarray:
    """n odd 64-bit weights, fixed (a seeded generator), grown and kept as larger DFAs come."""
    if _WEIGHTS[0].size < n:
        size = max(n, 2 * _WEIGHTS[0].size)
        _WEIGHTS[0] = np.random.default_rng(0x5EED).integers(1, 2**62, size=size, dtype=np.int64) | 1
    return _WEIGHTS[0][:n]


def _class_columns(trans: np.ndarray) -> np.ndarray:
    """One representative byte per class of identical columns, ascending."""
    return np.unique(byte_classes(trans))


def minimize(dfa: ByteDFA, check=None) -> ByteDFA:
    """The minimal DFA of the same language (Moore's partition refinement), BFS-numbered.

    Refinement runs over byte classes (bytes with identical columns), and each round names the
    states' signatures (own block, successor blocks) by a 64-bit hash. A hash collision could
    only merge blocks that should stay apart, so the final partition is checked to be a
    congruence (same acceptance, successors in the same blocks on every byte): a quotient by a
    congruence accepts exactly the same language. If the check fails, the DFA is returned as is.
    `dfa` must be pruned (no dead states), or the result may keep some equivalent states.
    `check()`, when given, runs between refinement rounds (a compile's time budget raises there).
    """
    classes = _class_columns(dfa.trans)
    block = _refine(dfa.trans, dfa.accept, classes, check)
    if int(block.max()) + 1 == dfa.num_states:
        return dfa
    quotient = quotient_by(dfa, block, classes)
    if quotient is None:
        return dfa
    trans, accept, start_block = quotient
    return prune(trans, accept, int(start_block[0]))


def _refine(trans: np.ndarray, accept: np.ndarray, classes: np.ndarray | None = None, check=None) -> np.ndarray:
    """Moore's coarsest partition of the states (block id per state), signatures hashed.

    A worklist form of Moore's rounds: a round re-signs only the blocks holding a predecessor
    of a state that changed block in the round before, and a split block keeps its id for one
    of its parts, so the rounds after the first few touch few states. It starts from the states'
    invariants (_invariants) rather than acceptance alone; the fixpoint is the same coarsest
    stable partition (dead = -1 is its own class throughout).
    """
    n = accept.shape[0]
    t = trans[:, _class_columns(trans) if classes is None else classes]  # [n, C]
    t = np.where(t < 0, n, t).astype(np.intp)  # dead (-1) reads the last slot; intp gathers fastest
    weights = _odd_weights(1, t.shape[1] + 1)
    pred_ptr, pred = _predecessors(t, n)
    start = _invariants(t, accept, pred_ptr, pred) if n >= _INVARIANTS_FROM else accept
    _, block = np.unique(start, return_inverse=True)
    block = block.reshape(-1).astype(np.int64)
    count = int(block.max()) + 1 if n else 0
    padded = np.empty(n + 1, dtype=np.int64)
    padded[n] = -1
    members = np.arange(n, dtype=np.int64)
    while members.size:
        if check is not None:
            check()
        padded[:n] = block
        own = block[members]
        with np.errstate(over="ignore"):
            h = padded.view(np.uint64)[t[members]] @ weights[1:] + own.view(np.uint64) * weights[0]
        _, group = np.unique(h, return_inverse=True)
        group = group.reshape(-1)
        keeper = np.empty(count, dtype=np.int64)
        keeper[own] = group  # one member's group per block keeps the block's id (any one will do)
        moved = group != keeper[own]
        if not moved.any():
            break
        changed = members[moved]
        block[changed] = count + group[moved]  # fresh ids (with gaps: made dense at the end)
        count += int(group.max()) + 1
        lo, hi = pred_ptr[changed], pred_ptr[changed + 1]
        sizes = hi - lo
        touched = pred[range_indices(lo, sizes)]
        affected = np.zeros(count, dtype=bool)
        affected[block[touched]] = True
        members = np.flatnonzero(affected[block])
    return np.unique(block, return_inverse=True)[1].reshape(-1).astype(np.int64)


_INVARIANTS_FROM = 32  # states; below, the few rounds they save cost less than finding them
_ODD_WEIGHTS: dict[tuple[int, int], np.ndarray] = {}


def _odd_weights(seed: int, size: int) -> np.ndarray:
    """`size` odd uint64 weights from generator `seed` (read-only, kept: a generator costs ~0.1 ms
    to start, a fifth of a small DFA's minimisation). At most 258 sizes per seed: byte classes + 2."""
    key = (seed, size)
    weights = _ODD_WEIGHTS.get(key)
    if weights is None:
        weights = np.random.default_rng(seed).integers(1, 2**63, size=size, dtype=np.uint64) | np.uint64(1)
        weights.setflags(write=False)
        _ODD_WEIGHTS[key] = weights
    return weights


def _invariants(t: np.ndarray, accept: np.ndarray, pred_ptr: np.ndarray, pred: np.ndarray) -> np.ndarray:
    """uint64 per state: a hash of its acceptance, of which byte classes lead somewhere (not to
    dead) and of the fewest bytes to an accepting state. States the refinement keeps together
    agree on all three (equal languages, the same dead edges), and a collision only joins more,
    so the refinement may start from them: it ends at the same partition in fewer rounds (one
    round per byte of the longest literal otherwise: 34 -> 15 on the seed catalog)."""
    n = accept.shape[0]
    k = t.shape[1]
    weights = _odd_weights(2, k + 2)
    dist = np.zeros(n, dtype=np.uint64)
    csgraph = _csgraph()
    sources = np.flatnonzero(accept)
    if csgraph is not None and sources.size:
        from scipy.sparse import csr_array

        back = csr_array((np.ones(pred.size), pred, pred_ptr), shape=(n, n))  # state -> its predecessors
        found = csgraph.dijkstra(back, directed=True, indices=sources, min_only=True)
        dist = np.where(np.isfinite(found), found + 1, 0).astype(np.uint64)
    with np.errstate(over="ignore"):
        return ((t < n).astype(np.uint64) @ weights[:k] + accept.astype(np.uint64) * weights[k]
                + dist * weights[k + 1])


def _predecessors(t: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(ptr [n + 1], sources) CSR of the edges of `t` ([n, C], n = dead) grouped by target."""
    dst = t.reshape(-1)
    src = np.repeat(np.arange(n, dtype=np.int64), t.shape[1])
    live = dst < n
    dst, src = dst[live], src[live]
    order = np.argsort(dst, kind="stable")
    return np.searchsorted(dst[order], np.arange(n + 1)), src[order]


def quotient_by(dfa: ByteDFA, block: np.ndarray, classes: np.ndarray | None = None):
    """(trans, accept, block of each old state) of `dfa` with each block of states merged, or
    None when the partition is not a congruence (members differ in acceptance or in a
    successor's block). `classes` (byte_classes' representatives) limits the check to one
    byte per class of identical columns: the other bytes' columns are copies."""
    _, first = np.unique(block, return_index=True)  # block ids are 0..count-1: each one's first state
    padded = np.append(block, -1)  # index -1 (dead) reads the last slot
    members = padded[dfa.trans if classes is None else dfa.trans[:, classes]]
    rep = first[block]
    if not (np.array_equal(members, members[rep]) and np.array_equal(dfa.accept, dfa.accept[rep])):
        return None
    return padded[dfa.trans[first]].astype(np.int32), dfa.accept[first].copy(), block


USE_SCIPY = True  # tests set False to run the Python searches


@lru_cache(maxsize=1)
def _scipy_csgraph():
    """scipy.sparse.csgraph, imported on first use (it costs ~0.1 s), or None where scipy is
    missing (a dependency, but e.g. the GPU image may lack it): the searches then run in Python."""
    try:
        from scipy.sparse import csgraph
    except ImportError:
        return None
    return csgraph


def _csgraph():
    return _scipy_csgraph() if USE_SCIPY else None


class Digraph:
    """A graph over states 0..n-1 as CSR: `dst[ptr[s]:ptr[s+1]]` are s's distinct successors, in
    the order given (the searches below visit them in that order). Built from edges sorted by
    source. The searches run in scipy.sparse.csgraph (C) where scipy is installed, else in Python
    (USE_SCIPY False); both give the same arrays (tests/grammars/test_digraph.py)."""

    def __init__(self, n: int, src: np.ndarray, dst: np.ndarray):
        self.n = n
        self.ptr = np.zeros(n + 1, dtype=np.int64)
        if src.size:
            np.cumsum(np.bincount(src, minlength=n), out=self.ptr[1:])
        self.dst = np.asarray(dst, dtype=np.int64)
        self._lists = None

    @classmethod
    def of_dfa(cls, trans: np.ndarray) -> Digraph:
        """A byte DFA's distinct successors per state, in order of the smallest byte leading there."""
        n = trans.shape[0]
        flat_trans = trans.reshape(-1)
        edge = np.flatnonzero(flat_trans >= 0)  # row-major: by (row, byte)
        rows = edge // trans.shape[1]
        # The first edge of each (row, target) is its smallest byte: keep those, in edge order.
        _, first = np.unique(rows * (n + 1) + flat_trans[edge], return_index=True)
        first.sort()
        return cls(n, rows[first], flat_trans[edge[first]])

    def sources(self) -> np.ndarray:
        """Each edge's source (the CSR's rows, expanded)."""
        return np.repeat(np.arange(self.n, dtype=np.int64), np.diff(self.ptr))

    def lists(self) -> list[list[int]]:
        """Successor lists (for the walks that go state by state in Python)."""
        if self._lists is None:
            bounds, flat = self.ptr.tolist(), self.dst.tolist()
            self._lists = [flat[bounds[i] : bounds[i + 1]] for i in range(self.n)]
        return self._lists

    def reversed(self, extra_sources: np.ndarray | None = None) -> Digraph:
        """The reversed graph; with `extra_sources`, one more state (id n) with an edge to each of
        them, for one search from all of them at once."""
        src, dst = self.dst, self.sources()
        size = self.n
        if extra_sources is not None:
            size += 1
            src = np.concatenate([src, np.full(extra_sources.size, self.n, dtype=np.int64)])
            dst = np.concatenate([dst, extra_sources.astype(np.int64)])
        by = np.argsort(src, kind="stable")
        return Digraph(size, src[by], dst[by])

    def csr(self, weight: np.ndarray | None = None):
        """scipy CSR of the edges (weight 1 each unless given, in edge order)."""
        from scipy.sparse import csr_array

        data = np.ones(self.dst.size) if weight is None else np.asarray(weight, dtype=np.float64)
        return csr_array((data, self.dst, self.ptr), shape=(self.n, self.n))


def range_indices(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """int64 indices of the ranges [starts[i], starts[i] + sizes[i]) laid end to end (CSR slices gathered
    in one step)."""
    return np.arange(int(sizes.sum()), dtype=np.int64) + np.repeat(starts - (np.cumsum(sizes) - sizes), sizes)


def coreachable(graph: Digraph, accept: np.ndarray) -> np.ndarray:
    """Which states can reach an accepting state (a search over reversed edges)."""
    sources = np.flatnonzero(accept)
    if not sources.size:
        return np.zeros(graph.n, dtype=bool)
    back = graph.reversed(sources)
    live = np.zeros(back.n, dtype=bool)
    live[_bfs(back, graph.n)] = True
    return live[: graph.n]


def bfs_order(graph: Digraph, start: int, live: np.ndarray) -> np.ndarray:
    """Live states reachable from `start`, in BFS order (the dense numbering), successors in
    graph order."""
    if not live.all():
        keep = live[graph.dst]
        graph = Digraph(graph.n, graph.sources()[keep], graph.dst[keep])
    return _bfs(graph, start)


def _bfs(graph: Digraph, start: int) -> np.ndarray:
    csgraph = _csgraph()
    if csgraph is not None:
        return csgraph.breadth_first_order(graph.csr(), start, return_predecessors=False).astype(np.int64)
    succ = graph.lists()
    seen = [False] * graph.n
    seen[start] = True
    order = [start]
    for s in order:  # the list is the queue: appended to while read
        for t in succ[s]:
            if not seen[t]:
                seen[t] = True
                order.append(t)
    return np.asarray(order, dtype=np.int64)


def strongly_connected(graph: Digraph) -> tuple[np.ndarray, np.ndarray]:
    """(component id per state, whether that component has a cycle)."""
    if graph.n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
    csgraph = _csgraph()
    if csgraph is not None:
        count, comp = csgraph.connected_components(graph.csr(), directed=True, connection="strong")
        comp = comp.astype(np.int64)
    else:
        comp = _tarjan(graph.lists())
        count = int(comp.max()) + 1
    src = graph.sources()
    cyclic = np.bincount(comp, minlength=count) > 1
    cyclic[comp[src[src == graph.dst]]] = True  # a self-loop
    return comp, cyclic


def _tarjan(succ: list[list[int]]) -> np.ndarray:
    """Component id per state (iterative Tarjan)."""
    n = len(succ)
    index, low, on_stack = [-1] * n, [0] * n, [False] * n
    comp = np.full(n, -1, dtype=np.int64)
    stack: list[int] = []
    counter = num_comps = 0
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
                    work += [(v, i), (w, 0)]
                    recurse = True
                    break
                if on_stack[w]:
                    low[v] = min(low[v], index[w])
            if recurse:
                continue
            if low[v] == index[v]:
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    comp[w] = num_comps
                    if w == v:
                        break
                num_comps += 1
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return comp


def weighted_distances(n: int, src: np.ndarray, dst: np.ndarray, weight: np.ndarray, sources: np.ndarray) -> np.ndarray:
    """Dijkstra over edges src -> dst (integer weights >= 0, duplicates allowed) from all of
    `sources` at once: per state, the lightest total weight from the nearest source (-1 where none)."""
    if not sources.size or n == 0:
        return np.full(n, -1, dtype=np.int32)
    by = np.argsort(src, kind="stable")
    graph = Digraph(n, src[by], dst[by])
    weight = np.asarray(weight, dtype=np.int64)[by]
    csgraph = _csgraph()
    if csgraph is not None:
        dist = csgraph.dijkstra(graph.csr(weight), directed=True, indices=np.asarray(sources, dtype=np.int64),
                                 min_only=True)
        out = np.full(n, -1, dtype=np.int32)
        reached = np.isfinite(dist)
        out[reached] = np.rint(dist[reached]).astype(np.int32)
        return out
    ptr, nxt, w = graph.ptr.tolist(), graph.dst.tolist(), weight.tolist()
    dist = [-1] * n
    heap = [(0, int(s)) for s in sources]
    heapq.heapify(heap)
    while heap:
        d, t = heapq.heappop(heap)
        if dist[t] >= 0:
            continue
        dist[t] = d
        for i in range(ptr[t], ptr[t + 1]):
            if dist[nxt[i]] < 0:
                heapq.heappush(heap, (d + w[i], nxt[i]))
    return np.asarray(dist, dtype=np.int32)
