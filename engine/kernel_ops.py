"""The four grammar operations the decode loop needs, behind one small adapter.

Uses `surecall.kernels` (mask, sample, advance, DeviceTable) when it is importable and falls
back to plain torch references otherwise, so the engine runs and is testable before, or
without, the kernels. The references are deliberately simple (correct, not fast). This module
does not run the model or loop over steps; `decode.py` does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class RefTable:
    """A TokenTable on a device, for the torch references."""

    mask: torch.Tensor  # int32 [S, W]
    accept: torch.Tensor  # bool [S]
    dist: torch.Tensor  # int32 [S]
    keys: torch.Tensor  # int64 [nnz]: state * V + token, sorted
    trans_next: torch.Tensor  # int64 [nnz]
    trans_ptr: torch.Tensor  # int64 [S + 1]
    trans_tok: torch.Tensor  # int64 [nnz]
    stop_ids: torch.Tensor  # int64 [k]
    logits_width: int


def _ref_table(table, device) -> RefTable:
    ptr = np.asarray(table.trans_ptr, dtype=np.int64)
    rows = np.repeat(np.arange(table.num_states, dtype=np.int64), np.diff(ptr))
    keys = rows * table.logits_width + np.asarray(table.trans_tok, dtype=np.int64)
    t = lambda a, dt: torch.as_tensor(np.ascontiguousarray(a)).to(device=device, dtype=dt)  # noqa: E731
    return RefTable(
        mask=t(table.mask, torch.int32),
        accept=t(table.accept, torch.bool),
        dist=t(table.dist, torch.int32),
        keys=t(keys, torch.int64),
        trans_next=t(table.trans_next, torch.int64),
        trans_ptr=t(ptr, torch.int64),
        trans_tok=t(table.trans_tok, torch.int64),
        stop_ids=t(table.stop_ids, torch.int64),
        logits_width=table.logits_width,
    )


def _ref_mask_inplace(logits, table: RefTable, states, remaining) -> None:
    """Disallow every token the state forbids or that cannot reach acceptance in `remaining`."""
    width = logits.shape[1]
    shifts = torch.arange(32, device=logits.device, dtype=torch.int32)
    for b in range(logits.shape[0]):
        s = int(states[b])
        if s < 0:
            continue
        allowed = torch.zeros(width, dtype=torch.bool, device=logits.device)
        lo, hi = int(table.trans_ptr[s]), int(table.trans_ptr[s + 1])
        budget = int(remaining[b]) - 1 if remaining is not None else 1 << 30
        toks, nxt = table.trans_tok[lo:hi], table.trans_next[lo:hi]
        allowed[toks[table.dist[nxt] <= budget]] = True
        if bool(table.accept[s]):
            bits = ((table.mask[s].view(-1, 1) >> shifts) & 1).view(-1)[:width].bool()
            stops = table.stop_ids[table.stop_ids < width]
            allowed[stops] = bits[stops]
        logits[b].masked_fill_(~allowed, float("-inf"))


def _ref_sample(logits, temperature, top_k, top_p, seed, step):
    """Greedy or seeded sampling per row; logprobs of softmax(logits / T) (T = 1 when greedy)."""
    temp = torch.where(temperature > 0, temperature, torch.ones_like(temperature)).view(-1, 1)
    scaled = logits / temp
    logprobs_all = torch.log_softmax(scaled, dim=-1)
    tokens = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
    for b in range(logits.shape[0]):
        row = scaled[b]
        if float(temperature[b]) == 0:
            tokens[b] = int(torch.argmax(row))
            continue
        row = row.clone()
        k = int(top_k[b])
        if 0 < k < row.shape[0]:
            kth = torch.topk(row, k).values[-1]
            row[row < kth] = float("-inf")
        p = float(top_p[b])
        if p < 1.0:
            probs_sorted, order = torch.sort(torch.softmax(row, -1), descending=True)
            cut = (probs_sorted.cumsum(-1) - probs_sorted) >= p
            row[order[cut]] = float("-inf")
        gen = torch.Generator(device="cpu").manual_seed((int(seed[b]) * 1_000_003 + int(step[b])) % (2**63))
        noise = torch.empty(row.shape[0]).exponential_(generator=gen).to(row.device)
        tokens[b] = int(torch.argmax(torch.softmax(row, -1) / noise))
    return tokens, logprobs_all.gather(1, tokens.view(-1, 1)).view(-1)


def _ref_advance(states, tokens, table: RefTable):
    safe = states.clamp_min(0).long()
    keys = safe * table.logits_width + tokens
    idx = torch.searchsorted(table.keys, keys).clamp_max(max(table.keys.shape[0] - 1, 0))
    hit = table.keys[idx] == keys if table.keys.numel() else torch.zeros_like(keys, dtype=torch.bool)
    is_stop = torch.isin(tokens, table.stop_ids) & table.accept[safe]
    nxt = torch.where(hit, table.trans_next[idx], safe)
    return nxt.to(torch.int32), is_stop


class KernelOps:
    """mask / sample / advance over one (possibly concatenated) table, kernels or references."""

    def __init__(self, use_kernels: bool | None = None):
        self.kernels = None
        if use_kernels is not False:
            try:
                from surecall.kernels import advance, mask, sample, table

                self.kernels = (table, mask, sample, advance)
            except ImportError:
                if use_kernels:
                    raise
        self.name = "kernels" if self.kernels else "torch-reference"

    def to_device(self, table, device):
        if self.kernels:
            return self.kernels[0].DeviceTable.from_table(table, device)
        return _ref_table(table, device)

    def mask_inplace(self, logits, dtable, states, remaining, check: bool = False) -> None:
        if self.kernels:
            self.kernels[1].apply_token_mask_inplace(logits, dtable, states, remaining=remaining, check=check)
        else:
            _ref_mask_inplace(logits, dtable, states, remaining)

    def sample(self, logits, temperature, top_k, top_p, seed, step, check: bool = False):
        """-> (tokens int64 [B], logprobs float32 [B]) of the already-masked logits."""
        if self.kernels:
            mod = self.kernels[2]
            params = mod.SamplingTensors(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, step=step)
            out = mod.sample(logits, None, None, params, check=check)
            return out.tokens, out.logprobs
        return _ref_sample(logits, temperature, top_k, top_p, seed, step)

    def advance(self, states, tokens, dtable, check: bool = False):
        if self.kernels:
            return self.kernels[3].advance(states, tokens, dtable, check=check)
        return _ref_advance(states, tokens, dtable)
