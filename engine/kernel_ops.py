"""The grammar operations the decode loop needs (masked sample, advance), behind one adapter.

Uses `surecall.kernels` (fused mask+sample, advance, DeviceTable) where importable and falls
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
    trans_next: torch.Tensor  # int64 [nnz]
    trans_ptr: torch.Tensor  # int64 [S + 1]
    trans_tok: torch.Tensor  # int64 [nnz]
    stop_ids: torch.Tensor  # int64 [k]
    logits_width: int


def _ref_table(table, device) -> RefTable:
    ptr = np.asarray(table.trans_ptr, dtype=np.int64)
    t = lambda a, dt: torch.as_tensor(np.ascontiguousarray(a)).to(device=device, dtype=dt)  # noqa: E731
    return RefTable(
        mask=t(table.mask, torch.int32),
        accept=t(table.accept, torch.bool),
        dist=t(table.dist, torch.int32),
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


def _ref_sample(logits, dtable, states, remaining, temperature, top_k, top_p, seed, step, want_unmasked):
    """Mask, then greedy or seeded sampling per row; logprobs of softmax(logits / T) (T = 1 when greedy)."""
    temp = torch.where(temperature > 0, temperature, torch.ones_like(temperature)).view(-1, 1)
    unmasked_all = torch.log_softmax(logits / temp, dim=-1) if want_unmasked else None
    logits = logits.clone()
    if dtable is not None:
        _ref_mask_inplace(logits, dtable, states, remaining)
    scaled = logits / temp
    logprobs_all = torch.log_softmax(scaled, dim=-1)
    tokens = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
    for b in range(logits.shape[0]):
        row = scaled[b]
        if float(temperature[b]) == 0:
            tokens[b] = int(torch.argmax(row))
            continue
        k, p = int(top_k[b]), float(top_p[b])
        if 0 < k < row.shape[0]:
            row = row.masked_fill(row < torch.topk(row, k).values[-1], float("-inf"))
        if p < 1.0:
            probs_sorted, order = torch.sort(torch.softmax(row, -1), descending=True)
            row = row.clone()
            row[order[(probs_sorted.cumsum(-1) - probs_sorted) >= p]] = float("-inf")
        gen = torch.Generator(device="cpu").manual_seed((int(seed[b]) * 1_000_003 + int(step[b])) % (2**63))
        noise = torch.empty(row.shape[0]).exponential_(generator=gen).to(row.device)
        tokens[b] = int(torch.argmax(torch.softmax(row, -1) / noise))
    pick = lambda a: a.gather(1, tokens.view(-1, 1)).view(-1)  # noqa: E731
    return tokens, pick(logprobs_all), pick(unmasked_all) if want_unmasked else None


def _ref_advance(states, tokens, table):
    """Next state per row from the CSR rows (host loop), and whether a stop id ended the row."""
    nxt = states.clone().to(torch.int32)
    ptr, tok, dest = table.trans_ptr.tolist(), table.trans_tok, table.trans_next
    for b, (s, t) in enumerate(zip(states.tolist(), tokens.tolist(), strict=True)):
        if s < 0:
            continue
        row = tok[ptr[s] : ptr[s + 1]]
        i = int(torch.searchsorted(row, torch.tensor(t, dtype=row.dtype, device=row.device)))
        if i < row.shape[0] and int(row[i]) == t:
            nxt[b] = int(dest[ptr[s] + i])
    finished = torch.isin(tokens, table.stop_ids.to(tokens.dtype)) & table.accept[states.clamp_min(0).long()]
    return nxt, finished


def _import(name: str):
    try:
        return __import__(f"surecall.kernels.{name}", fromlist=[name])
    except ImportError:
        return None


class KernelOps:
    """sample (mask fused) / advance over one (possibly concatenated) table, kernels or references."""

    def __init__(self, use_kernels: bool = True):
        mods = [_import(n) for n in ("table", "sample", "advance")] if use_kernels else [None] * 3
        self.table_mod, self.sample_mod, self.advance_mod = mods
        if self.table_mod is None or self.sample_mod is None:
            self.table_mod = self.sample_mod = None
        if self.table_mod is None:
            self.advance_mod = None
        self.name = "+".join(
            f"{op}:{'kernels' if mod else 'torch-reference'}"
            for op, mod in (("sample", self.sample_mod), ("advance", self.advance_mod))
        )

    def to_device(self, table, device):
        if self.table_mod:
            return self.table_mod.DeviceTable.from_table(table, device)
        return _ref_table(table, device)

    def sample(self, logits, dtable, states, remaining, temperature, top_k, top_p, seed, step,
               use_sort: bool, want_unmasked: bool, check: bool = False):
        """-> (tokens int64 [B], logprobs float32 [B], unmasked float32 [B] | None); logits untouched."""
        if self.sample_mod:
            mod = self.sample_mod
            params = mod.SamplingTensors(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, step=step,
                                         use_top_k_top_p=use_sort)
            out = mod.sample(logits, dtable, states if dtable is not None else None, params,
                             remaining=remaining if dtable is not None else None,
                             return_unmasked_logprobs=want_unmasked, check=check)
            return out.tokens, out.logprobs, out.unmasked_logprobs
        return _ref_sample(logits, dtable, states, remaining, temperature, top_k, top_p, seed, step, want_unmasked)

    def advance(self, states, tokens, dtable, check: bool = False):
        if self.advance_mod:
            return self.advance_mod.advance(states, tokens, dtable, check=check)
        return _ref_advance(states, tokens, dtable)
