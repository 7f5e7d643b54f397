"""Continuous batching: which sequences feed which tokens in the next step.

A `Sequence` is one request's tokens (prompt, forced ids, then sampled ids) plus how many of them
are already in the KV cache (`num_computed`). Each step the scheduler picks, first come first
served: every running sequence that has a token to feed (one token for a decoding sequence, the
next chunk for one still in prefill), then waiting sequences while `max_num_seqs` and the step's
`max_num_batched_tokens` allow (long prompts are prefilled in chunks). When the block pool runs
out, the most recently admitted running sequence is preempted: its blocks are freed and it goes
back to the front of the queue, to be recomputed (its sampled tokens kept, so nothing changes).
It does not run the model or sample (`engine.py`).
"""

# Adapted from the scheduling loop of nano-vllm (https://github.com/GeeeekExplorer/nano-vllm,
# engine/scheduler.py) and vLLM's chunked prefill: FCFS, token budget, preempt by recompute.

from __future__ import annotations

import enum
import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from surecall.core.blocks import BlockManager


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


_arrival = itertools.count()


@dataclass
class Sequence:
    request_id: str
    token_ids: list[int]  # prompt + forced ids, then every sampled token
    num_prompt: int  # prompt tokens (forced ids excluded)
    max_tokens: int  # generated tokens allowed, forced ids included
    payload: Any = None  # what the engine keeps per request (sampling, grammar state, outputs)
    num_computed: int = 0  # leading tokens whose K/V are in the cache
    num_cached: int = 0  # of the prompt, tokens found in the prefix cache at admission (last admission)
    block_table: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    arrival: int = field(default_factory=lambda: next(_arrival))
    num_preemptions: int = 0
    block_hashes: list[bytes] = field(default_factory=list)  # chained hashes of the full computed blocks

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_to_feed(self) -> int:
        return self.num_tokens - self.num_computed


@dataclass
class Work:
    seq: Sequence
    start: int  # first token position fed this step
    end: int  # one past the last; == seq.num_tokens means the step samples for this sequence

    @property
    def samples(self) -> bool:
        return self.end == self.seq.num_tokens


@dataclass
class Plan:
    decode: list[Work]  # one token each
    prefill: list[Work]  # chunks of prompts (or of recomputed sequences)
    preempted: list[Sequence]

    @property
    def is_empty(self) -> bool:
        return not self.decode and not self.prefill


POLICIES = ("continuous", "drain")


class Scheduler:
    """`policy` "continuous": newcomers join at any step. "drain" (static batching, a baseline for
    benchmarks): a new batch is admitted only until its first decode step, then not again until
    every running sequence has finished."""

    def __init__(self, blocks: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 policy: str = "continuous"):
        if policy not in POLICIES:
            raise ValueError(f"Invalid scheduling policy: expected one of {', '.join(POLICIES)}, got {policy!r}")
        self.blocks = blocks
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.policy = policy
        self._batch_open = True  # drain policy: admitting into the current batch
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def finish(self, seq: Sequence) -> None:
        """Retire a sequence (done, aborted or failed) and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.release(seq.block_table)
        seq.status = Status.FINISHED

    def schedule(self) -> Plan:
        """The next step's work (see the module docstring)."""
        budget = self.max_num_batched_tokens
        decode, prefill, preempted = [], [], []
        # 1. running sequences, oldest first; make room by preempting the newest
        for seq in list(self.running):
            if seq.status is not Status.RUNNING:
                continue  # preempted earlier in this loop
            if budget <= 0:
                break
            n = min(seq.num_to_feed, budget)
            while not self.blocks.grow(seq.block_table, seq.num_computed + n):
                victim = self.running[-1]
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is not Status.RUNNING:
                continue
            (decode if n == 1 and seq.num_to_feed == 1 else prefill).append(Work(seq, seq.num_computed, seq.num_computed + n))
            budget -= n
        # 2. waiting sequences, first come first served
        if self.policy == "drain":
            self._batch_open = not self.running or (self._batch_open and not decode)
        computing: set[bytes] = set()  # prompt blocks that sequences admitted this step will compute
        while self._batch_open and self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            compute_from = seq.num_tokens - 1  # at least the last token is fed, for its logits
            hashes = self.blocks.prompt_hashes(seq.token_ids, compute_from) if self.blocks.enable_prefix_caching else []
            hits = len(self.blocks.cached_prefix(seq.token_ids, compute_from, hashes))
            if hits < len(hashes) and hashes[hits] in computing:
                break  # its next block is being computed right now: admitted next step, it finds it cached
            if not self.blocks.can_allocate(seq.token_ids, seq.num_tokens, compute_from, hashes):
                break  # wait for blocks to free up (never preempt for a newcomer)
            self.waiting.popleft()
            seq.block_table, seq.num_cached = self.blocks.allocate(seq.token_ids, seq.num_tokens, compute_from, hashes)
            seq.block_hashes = []
            computing.update(hashes[hits:])
            seq.num_computed = seq.num_cached
            seq.status = Status.RUNNING
            self.running.append(seq)
            n = min(seq.num_to_feed, budget)
            prefill.append(Work(seq, seq.num_computed, seq.num_computed + n))
            budget -= n
        return Plan(decode, prefill, preempted)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.release(seq.block_table)
        seq.num_computed = 0
        seq.block_hashes = []
        seq.status = Status.WAITING
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)
