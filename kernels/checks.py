"""Host-side validation for the kernel launchers (only when called with check=True).

Every check raises `KernelInputError` naming the argument and what was expected. These
checks read device tensors back to the host (state range, empty rows), so the decode loop
calls the kernels with check=False; tests and first calls use check=True.
"""

from __future__ import annotations

import torch

from surecall.errors import KernelInputError
from surecall.kernels.table import DeviceTable

LOGITS_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_logits(logits: torch.Tensor) -> None:
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise KernelInputError(
            f"logits: expected a 2-D tensor [batch, vocab], got {_describe(logits)}"
        )
    if logits.dtype not in LOGITS_DTYPES:
        raise KernelInputError(
            f"logits: expected dtype float32, float16 or bfloat16, got {logits.dtype}"
        )
    if logits.stride(1) != 1:
        raise KernelInputError("logits: expected contiguous rows (stride 1 along vocab)")


def check_vector(
    t: torch.Tensor | None, name: str, length: int, dtypes: tuple, device: torch.device
) -> None:
    """A 1-D tensor of `length` elements, one of `dtypes`, on `device`."""
    if t is None:
        return
    if not isinstance(t, torch.Tensor) or t.dim() != 1:
        raise KernelInputError(f"{name}: expected a 1-D tensor, got {_describe(t)}")
    if length >= 0 and t.shape[0] != length:
        raise KernelInputError(
            f"{name}: expected shape [{length}] (one per batch row), got {list(t.shape)}"
        )
    if t.dtype not in dtypes:
        raise KernelInputError(
            f"{name}: expected dtype {' or '.join(str(d) for d in dtypes)}, got {t.dtype}"
        )
    if t.device != device:
        raise KernelInputError(
            f"{name}: expected device {device} (the logits' device), got {t.device}"
        )


def check_table(table: DeviceTable, logits: torch.Tensor) -> None:
    if not isinstance(table, DeviceTable):
        raise KernelInputError(
            f"table: expected a DeviceTable (DeviceTable.from_table), got {type(table).__name__}"
        )
    if table.device != logits.device:
        raise KernelInputError(
            f"table: expected device {logits.device} (the logits' device), got {table.device}"
        )
    if logits.shape[1] < table.vocab_size:
        raise KernelInputError(
            f"logits: width {logits.shape[1]} is smaller than the table's vocabulary ({table.vocab_size} ids)"
        )


def check_counters(counters: torch.Tensor | None, table: DeviceTable, batch: int, device: torch.device) -> None:
    """Counters are given exactly when the table counts string lengths (one int32 >= 0 per row)."""
    if counters is None:
        if table.has_counts:
            raise KernelInputError(
                "counters: expected an int32 tensor [batch] for a table with counted strings, got None"
            )
        return
    check_vector(counters, "counters", batch, (torch.int32,), device)
    if counters.numel() and int(counters.min()) < 0:
        raise KernelInputError(f"counters: expected values >= 0, got {int(counters.min())}")


def check_rows(rows: torch.Tensor | None, batch: int, device: torch.device) -> None:
    check_vector(rows, "rows", -1, (torch.int64, torch.int32), device)
    if rows is not None and rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= batch):
        raise KernelInputError(
            f"rows: expected batch row indices in [0, {batch}), got {rows.min()}..{rows.max()}"
        )


def check_states(states: torch.Tensor, table: DeviceTable) -> None:
    if states.numel() and int(states.max()) >= table.num_states:
        bad = int(torch.nonzero(states >= table.num_states)[0, 0])
        raise KernelInputError(
            f"states: row {bad} has state {int(states[bad])}, out of range for a table of {table.num_states} states"
        )


def check_nonempty(
    table: DeviceTable,
    states: torch.Tensor,
    remaining: torch.Tensor | None,
    rows: torch.Tensor | None,
) -> None:
    """Every grammar row (state >= 0) in `rows` must allow at least one token after the budget."""
    idx = torch.arange(states.shape[0], device=states.device) if rows is None else rows.long()
    idx = idx[states[idx] >= 0]
    st = states[idx].long()
    ok = table.has_allowed[st]
    if remaining is not None:
        rem = remaining[idx].long()
        ok = ok & ((table.has_stop[st] & (rem >= 1)) | (table.min_next_dist[st].long() <= rem - 1))
    if not bool(ok.all()):
        bad = int(idx[~ok][0])
        budget = f" with remaining={int(remaining[bad])}" if remaining is not None else ""
        raise KernelInputError(
            f"row {bad}: state {int(states[bad])}{budget} allows no token (the mask after the budget is empty)"
        )


def _describe(x: object) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor of shape {list(x.shape)}, dtype {x.dtype}"
    return type(x).__name__
