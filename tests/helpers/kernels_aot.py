"""Compile every kernel variant for an H100/H200 (sm_90) without a GPU: catches errors the interpreter misses.

Run as a script in a process WITHOUT TRITON_INTERPRET (the interpreter replaces `triton.jit`).
It lowers each kernel through Triton's real pipeline (TTIR -> TTGIR -> LLVM -> PTX -> cubin via
the bundled ptxas) for each constexpr combination, and prints one line per variant.
"""

from __future__ import annotations

import itertools
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from surecall.grammars.table import MASK_BLOCK_WORDS
from surecall.kernels.advance import _advance_kernel
from surecall.kernels.mask import _apply_mask_kernel
from surecall.kernels.sample import _sample_combine_kernel, _sample_split_kernel

TARGET = GPUTarget("cuda", 90, 32)

# pointer element types per argument name; every other non-constexpr argument is an i32 scalar
POINTERS = {
    "logits_ptr": None,  # filled per dtype
    "rows_ptr": "*i64", "states_ptr": "*i32", "mask_blocks_ptr": "*i32",
    "row_blocks_ptr": "*i32", "remaining_ptr": "*i32",
    "max_next_dist_ptr": "*i32", "exc_lo_ptr": "*i32", "exc_hi_ptr": "*i32", "exc_tok_ptr": "*i32",
    "exc_slot_ptr": "*i32", "exc_base_ptr": "*i32", "exc_targets_ptr": "*i32",
    "mask_row_ptr": "*i32", "trans_default_ptr": "*i32",
    "dist_ptr": "*i32", "inv_temp_ptr": "*fp32", "temp_ptr": "*fp32", "seed_ptr": "*i64", "step_ptr": "*i64",
    "part_max_ptr": "*fp32", "part_sum_ptr": "*fp32", "part_key_ptr": "*fp32", "part_idx_ptr": "*i32",
    "part_umax_ptr": "*fp32", "part_usum_ptr": "*fp32", "tokens_ptr": "*i64", "logprobs_ptr": "*fp32",
    "unmasked_ptr": "*fp32", "next_ptr": "*i32", "finished_ptr": "*i8", "accept_ptr": "*i8", "is_stop_ptr": "*i8",
    "counters_ptr": "*i32", "next_counters_ptr": "*i32", "count_row_ptr": "*i32", "count_lo_ptr": "*i32",
    "count_hi_ptr": "*i32", "count_chars_ptr": "*i8", "dist_entry_ptr": "*i32", "entry_key_ptr": "*i64",
    "entry_val_ptr": "*i32",
}  # fmt: skip
LOGITS = {"fp32": "*fp32", "bf16": "*bf16", "fp16": "*fp16"}


def _compile(kernel, logits_type: str, constexprs: dict, options: dict) -> None:
    fn = kernel
    signature = {}
    for name in fn.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name == "logits_ptr":
            signature[name] = logits_type
        elif name == "tokens_ptr" and fn is _advance_kernel:
            signature[name] = "*i64"
        else:
            signature[name] = POINTERS.get(name, "i32")
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    triton.compile(src, target=TARGET, options={"enable_fp_fusion": False, **options})


def main(quick: bool = False) -> int:
    variants = []
    for dtype, has_rows, has_budget, mode, counts in itertools.product(
        LOGITS, (False, True), (False, True), (0, 1, 2), (False, True)
    ):
        flags = {"HAS_ROWS": has_rows, "HAS_BUDGET": has_budget, "HAS_COUNTS": counts, "BLOCK_WORDS": 128,
                 "MASK_BW": MASK_BLOCK_WORDS}
        variants.append((_apply_mask_kernel, dtype, {**flags, "STORE_MODE": mode}))
    for dtype, has_table, has_budget, unmasked, counts in itertools.product(
        LOGITS, (False, True), (False, True), (False, True), (False, True)
    ):
        if (has_budget or counts) and not has_table:
            continue
        flags = {
            "HAS_TABLE": has_table,
            "HAS_BUDGET": has_budget,
            "HAS_COUNTS": counts,
            "HAS_UNMASKED": unmasked,
            "BLOCK_WORDS": 32,
            "MASK_BW": MASK_BLOCK_WORDS,
        }
        variants.append((_sample_split_kernel, dtype, flags))
        variants.append(
            (_sample_combine_kernel, dtype, {"HAS_UNMASKED": unmasked, "ROWS": 64, "SPLITS": 16})
        )
    variants.append((_advance_kernel, "fp32", {"HAS_COUNTS": False, "BLOCK": 128, "MASK_BW": MASK_BLOCK_WORDS}))
    variants.append((_advance_kernel, "fp32", {"HAS_COUNTS": True, "BLOCK": 128, "MASK_BW": MASK_BLOCK_WORDS}))
    if quick:  # the richest variant of each kernel, bf16 logits
        variants = [
            v
            for v in variants
            if v[1] in ("bf16", "fp32")
            and all(
                v[2].get(f, True) for f in ("HAS_ROWS", "HAS_TABLE", "HAS_BUDGET", "HAS_UNMASKED", "HAS_COUNTS")
            )
        ]
        variants = [v for v in variants if v[0] is _advance_kernel or v[1] == "bf16"]
        variants = [v for v in variants if v[2].get("STORE_MODE", 2) == 2]
    unique = {(k.__name__, d, tuple(sorted(f.items()))): (k, d, f) for k, d, f in variants}
    failures = 0
    for kernel, dtype, flags in unique.values():
        try:
            _compile(kernel, LOGITS[dtype], flags, {"num_warps": 4})
            print(f"ok   {kernel.__name__} {dtype} {flags}")
        except Exception as exc:  # report every variant, then fail
            failures += 1
            print(
                f"FAIL {kernel.__name__} {dtype} {flags}: {type(exc).__name__}: {str(exc)[:2000]}"
            )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(quick="--quick" in sys.argv))
