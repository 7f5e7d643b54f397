"""Disk cache of compiled TokenTables: one folder of uncompressed .npy files per entry.

Key: sha256 over (kind, canonical schema/regex text, vocabulary fingerprint, options.cache_key(),
surecall version, cache format). Folder: $SURECALL_CACHE_DIR or ~/.cache/surecall. Entries are
written into a temporary folder and renamed into place (atomic), and loaded with
np.load(mmap_mode="r"), so a warm load costs milliseconds. What a load checks, exactly: the
header parses; every array has the recorded dtype and shape; the table's shapes are consistent;
and a CRC32 matches over every byte of each array up to 64 KiB and, for larger arrays (mask
blocks, exceptions), over 16 sampled 4 KiB blocks plus the last block. A truncated, malformed or rewritten entry
is deleted and reported as a miss; a bit flip outside the sampled blocks of a large array is not
seen unless the load hashes every byte (`load(key, full_check=True)`, or SURECALL_CACHE_FULL_CHECK=1).
The cache is bounded: after each save, least recently used entries are evicted until it holds at
most $SURECALL_CACHE_MAX_BYTES (default 2 GiB); a load marks its entry as used.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import zlib
from pathlib import Path

import numpy as np

from surecall.grammars.table import (
    COUNT_ARRAYS,
    ITEM_ARRAYS,
    STACK_ARRAYS,
    TABLE_ARRAYS,
    TokenTable,
)

CACHE_FORMAT = 13  # 2: optional count_* arrays (counted string lengths); 3: compact layout (distinct mask rows,
# default + exceptions); 4: accepting states keep their outgoing edges (automaton._END_MARK);
# 5: nested item counters (item_depth, item_below_*), counted pattern bodies;
# 6: mask rows as deduplicated blocks (mask_blocks, mask_row_blocks); 7: meta lists a cut recursion in
# "narrowed" and a lowered max_ref_depth in "ref_depth_fallback" (the arrays are unchanged); 8: hostname
# and email as a free body under a counted cap (string_formats.COUNTED_FORMATS), not bounded labels;
# 9: shared exception rows (exc_row, exc_slot, exc_base, exc_targets instead of exc_next); 10: maxProperties over
# undeclared keys counted by the item counters (a table cached before listed it as relaxed); 11: meta lists
# each free-form value's depth cap (max_any_depth) in "narrowed" (the arrays are unchanged); 12: free-form
# values of any depth on a bracket stack (optional stack_* arrays); 13: a pattern's counted repetition (a word
# count) rides the string counter (a table cached before widened it and listed it as relaxed; the passes after
# 12 also wrote more patterns, oneOfs and ifs exactly without a new format: those tables are recompiled too)
_ARRAYS = TABLE_ARRAYS
_FULL_CHECK_BYTES = 1 << 16  # arrays up to this size are always hashed in full
_SAMPLES = 16
_SAMPLE_BYTES = 4096
DEFAULT_MAX_CACHE_BYTES = 2 << 30


def cache_dir() -> Path:
    override = os.environ.get("SURECALL_CACHE_DIR")
    return Path(override).expanduser() if override else Path.home() / ".cache" / "surecall"


def max_cache_bytes() -> int:
    """The size bound: $SURECALL_CACHE_MAX_BYTES (an integer number of bytes) or 2 GiB."""
    raw = os.environ.get("SURECALL_CACHE_MAX_BYTES")
    if raw is None or raw.strip() == "":
        return DEFAULT_MAX_CACHE_BYTES
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"Invalid SURECALL_CACHE_MAX_BYTES: expected an integer number of bytes, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"Invalid SURECALL_CACHE_MAX_BYTES: expected >= 0, got {value}")
    return value


def _entries() -> list[tuple[float, int, Path]]:
    """(last use, bytes, folder) of every complete entry."""
    out = []
    root = cache_dir()
    if not root.is_dir():
        return out
    for shard in root.iterdir():
        if not shard.is_dir():
            continue
        for entry in shard.iterdir():
            if entry.name.startswith(".tmp-") or not entry.is_dir():
                continue
            try:
                size = sum(f.stat().st_size for f in entry.iterdir())
                used = (entry / "header.json").stat().st_mtime
            except OSError:
                continue
            out.append((used, size, entry))
    return out


def cache_bytes() -> int:
    """Bytes held by complete entries."""
    return sum(size for _, size, _ in _entries())


def evict(max_bytes: int | None = None, keep: Path | None = None) -> int:
    """Delete least recently used entries until the cache holds at most `max_bytes`; returns bytes freed."""
    limit = max_cache_bytes() if max_bytes is None else max_bytes
    entries = sorted(_entries(), key=lambda e: e[0])
    total = sum(size for _, size, _ in entries)
    freed = 0
    for _, size, path in entries:
        if total <= limit:
            break
        if keep is not None and path == keep:
            continue
        shutil.rmtree(path, ignore_errors=True)
        total -= size
        freed += size
    return freed


def _touch(path: Path) -> None:
    try:
        os.utime(path / "header.json")
    except OSError:
        pass


def entry_key(kind: str, text: str, vocab, options) -> str:
    from surecall import __version__

    h = hashlib.sha256()
    for part in (f"format={CACHE_FORMAT}", f"version={__version__}", kind, vocab.fingerprint,
                 str(vocab.logits_width), options.cache_key(), text):
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()


def entry_path(key: str) -> Path:
    return cache_dir() / key[:2] / key


def save(key: str, table: TokenTable) -> Path | None:
    """Write `table` under `key` atomically; returns the entry folder (None if the disk refused)."""
    final = entry_path(key)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key[:16]}-", dir=final.parent))
    except OSError:
        return None
    try:
        header = {"format": CACHE_FORMAT, "arrays": {}, "relaxed": table.relaxed, "meta": table.meta,
                  "vocab_size": table.vocab_size, "logits_width": table.logits_width}
        header["count_fill"] = table.count_fill
        for name in (_ARRAYS + (COUNT_ARRAYS if table.has_counts else ()) + (ITEM_ARRAYS if table.has_items else ())
                     + (STACK_ARRAYS if table.has_stack else ())):
            arr = np.ascontiguousarray(getattr(table, name))
            np.save(tmp / f"{name}.npy", arr, allow_pickle=False)
            header["arrays"][name] = {"dtype": arr.dtype.str, "shape": list(arr.shape),
                                      "sampled": _checksum(arr, full=False), "full": _checksum(arr, full=True)}
        (tmp / "header.json").write_text(json.dumps(header, default=_json_default))
        try:
            os.rename(tmp, final)
        except OSError:  # another writer got there first: theirs is as good as ours
            shutil.rmtree(tmp, ignore_errors=True)
        evict(keep=final)
        return final
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        return None


def load(key: str, full_check: bool | None = None) -> TokenTable | None:
    """The cached table (arrays memory-mapped, read-only) or None; a bad entry is deleted."""
    path = entry_path(key)
    if not path.is_dir():
        return None
    if full_check is None:
        full_check = os.environ.get("SURECALL_CACHE_FULL_CHECK", "") not in ("", "0")
    try:
        table = _read(path, full_check)
    except (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError):
        table = None
    if table is None:
        shutil.rmtree(path, ignore_errors=True)
    else:
        _touch(path)
    return table


def _read(path: Path, full_check: bool) -> TokenTable | None:
    header = json.loads((path / "header.json").read_text())
    if header.get("format") != CACHE_FORMAT:
        return None
    arrays = {}
    for name in (_ARRAYS + (COUNT_ARRAYS if "count_row" in header["arrays"] else ())
                 + (ITEM_ARRAYS if "item_hi" in header["arrays"] else ())
                 + (STACK_ARRAYS if "stack_key" in header["arrays"] else ())):
        spec = header["arrays"][name]
        arr = np.load(path / f"{name}.npy", mmap_mode="r", allow_pickle=False)
        if arr.dtype.str != spec["dtype"] or list(arr.shape) != spec["shape"]:
            return None
        expected = spec["full"] if full_check else spec["sampled"]
        if _checksum(arr, full=full_check) != expected:
            return None
        arrays[name] = arr
    table = TokenTable(**arrays, vocab_size=int(header["vocab_size"]), logits_width=int(header["logits_width"]),
                       relaxed=[tuple(r) for r in header["relaxed"]], meta=dict(header["meta"]),
                       count_fill=int(header.get("count_fill", 1)))
    return table if _consistent(table) else None


def _consistent(t: TokenTable) -> bool:
    s = t.accept.shape[0]
    return (
        s > 0
        and t.mask_row.shape == (s,)
        and t.trans_default.shape == (s,)
        and t.exc_row.shape == (s,)
        and t.exc_base.shape == (s + 1,)
        and t.dist.shape == (s,)
        and t.exc_ptr.size >= 1
        and int(t.exc_ptr[0]) == 0
        and int(t.exc_ptr[-1]) == t.exc_tok.shape[0] == t.exc_slot.shape[0]
        and 0 <= int(t.exc_row.min()) <= int(t.exc_row.max()) < t.exc_ptr.size - 1
        and int(t.exc_base[0]) == 0 and int(t.exc_base[-1]) == t.exc_targets.shape[0]
        and (s == 0 or 0 <= int(t.mask_row.min()) <= int(t.mask_row.max()) < t.num_mask_rows)
    )


def _checksum(arr: np.ndarray, full: bool) -> int:
    raw = np.asarray(arr).reshape(-1).view(np.uint8)
    if full or raw.size <= _FULL_CHECK_BYTES:
        return zlib.crc32(raw)
    step = raw.size // _SAMPLES
    crc = zlib.crc32(raw[-_SAMPLE_BYTES:])
    for i in range(_SAMPLES):
        crc = zlib.crc32(raw[i * step : i * step + _SAMPLE_BYTES], crc)
    return crc


def _json_default(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    return str(obj)


def clear() -> None:
    """Delete every cached table (the whole cache folder)."""
    shutil.rmtree(cache_dir(), ignore_errors=True)
