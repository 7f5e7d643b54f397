"""Output-mode benchmark: t_mask per decode step for `auto` (text phase, call phase), `required` and free.

For each vocabulary (the shipped tiny model's 3k one, and a Qwen2.5-like 152k one where
`<tool_call>` is a control token) it compiles the seed catalog's `auto` and `required` grammars
in the hermes syntax, walks a rendered output through each table to find a text-phase state
and a call-phase state (inside an argument string), then times the fused constrained
`sample` at those states against the same `sample` without a table (free):
t_mask = constrained - free (median of alternated pairs), per step, at batch 1 and 16 (and 128 with --batches), with the
budget rule on (remaining tokens given). It checks first that every sampled token is allowed
by the state's mask. CPU: the torch reference path, perf_counter medians.
Usage: python benchmarks/modes.py [--batches 1,16] [--repeats 15] [--out benchmarks/results/modes_cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import replace
from functools import partial

import numpy as np
import torch

from surecall.grammars.tool_modes import (
    SYNTAX,
    ModeGrammar,
    compile_mode,
    control_vocab,
    find_controls,
)
from surecall.kernels import DeviceTable, SamplingTensors, sample
from surecall.tools.calls import tool_name_schema
from surecall.tools.catalog import hardened_seed_tools

QWEN25_CONTROLS = {"<tool_call>": 151657, "</tool_call>": 151658}
CALL_PREFIX = '\n{"name": "file_view", "arguments": {"path": "src/mod'


def vocabularies() -> dict:
    from surecall.grammars.vocab.loaders import load
    from surecall.models import default_model_dir

    out = {"surecall-tiny (3k)": load(default_model_dir())}
    try:
        from surecall.grammars.vocab.loaders import load_shared

        base = load_shared("qwen2")
        size = max(QWEN25_CONTROLS.values()) + 1
        out["qwen2.5-like (152k)"] = replace(
            base, token_bytes=tuple(base.token_bytes) + (b"",) * (size - base.vocab_size),
            special_ids=frozenset(set(base.special_ids) | set(QWEN25_CONTROLS.values())),
            special_tokens={**base.special_tokens, **QWEN25_CONTROLS}, name="qwen2.5-like")
    except Exception as exc:  # the shared data folder is optional
        print(f"(skipping the Qwen2.5-like vocabulary: {exc})", file=sys.stderr)
    return out


def walk(table, token_bytes, state: int, data: bytes) -> int:
    """Greedy longest-token walk of `data` through `table` from `state`; the state reached."""
    at = 0
    while at < len(data):
        best = None
        for tok, nxt in zip(*(a.tolist() for a in table.transitions(state)), strict=True):
            piece = token_bytes[tok]
            if piece and data.startswith(piece, at) and (best is None or len(piece) > len(best[0])):
                best = (piece, nxt)
        if best is None:
            raise ValueError(f"no token continues {data[at:at + 20]!r} from state {state}")
        at += len(best[0])
        state = best[1]
    return state


def states_of(vocab, tools) -> tuple[dict, dict]:
    """Tables ({mode: TokenTable}) and the timed states ({phase: (mode, state)})."""
    grammar = ModeGrammar("auto", "hermes", tools, True, controls=find_controls(vocab, SYNTAX["hermes"]))
    auto = compile_mode(grammar, vocab)
    required = compile_mode(replace(grammar, kind="calls"), vocab)
    cvocab = control_vocab(vocab, grammar.controls)
    start = b"\xf8" if grammar.start_kind == "control" else b"<tool_call>"
    text_state = walk(auto, cvocab.token_bytes, 0, b"Let me look")
    call_bytes = start + CALL_PREFIX.encode()
    return {"auto": auto, "required": required}, {
        "auto text phase": ("auto", text_state),
        "auto call phase": ("auto", walk(auto, cvocab.token_bytes, text_state, call_bytes)),
        "required call phase": ("required", walk(required, cvocab.token_bytes, 0, call_bytes)),
    }


def paired_us(free_fn, masked_fn, repeats: int) -> tuple[float, float, float]:
    """(free, masked, masked - free) medians in us, the two calls alternated so load drifts cancel."""
    free_fn(), masked_fn()
    free, masked, diff = [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        free_fn()
        t1 = time.perf_counter()
        masked_fn()
        t2 = time.perf_counter()
        free.append(t1 - t0)
        masked.append(t2 - t1)
        diff.append((t2 - t1) - (t1 - t0))
    return tuple(float(np.median(x)) * 1e6 for x in (free, masked, diff))


def bench(vocab_name, vocab, batches, repeats) -> list[dict]:
    tools = tuple(tool_name_schema(t) for t in hardened_seed_tools())
    tables, phases = states_of(vocab, tools)
    device = torch.device("cpu")
    dtables = {k: DeviceTable.from_table(t, device) for k, t in tables.items()}
    rows = []
    for batch in batches:
        logits = torch.randn(batch, vocab.logits_width) * 4
        params = SamplingTensors.build([1.0] * batch, [0] * batch, [1.0] * batch, list(range(batch)), [0] * batch)
        remaining = torch.full((batch,), 64, dtype=torch.int32)
        free_fn = partial(sample, logits, None, None, params, check=False)

        for phase, (mode, state) in phases.items():
            states = torch.full((batch,), state, dtype=torch.int32)
            out = sample(logits, dtables[mode], states, params, remaining=remaining, check=True)
            allowed = set(tables[mode].allowed(state).tolist())
            if not all(int(t) in allowed for t in out.tokens.tolist()):
                raise AssertionError(f"{phase}: sampled a token the mask of state {state} forbids")

            masked_fn = partial(sample, logits, dtables[mode], states, params, remaining=remaining, check=False)
            free, masked, t_mask = paired_us(free_fn, masked_fn, repeats)
            rows.append({"vocab": vocab_name, "batch": batch, "phase": phase, "free_us": free, "sample_us": masked,
                         "t_mask_us": t_mask, "allowed": len(allowed)})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    batches = [int(b) for b in args.batches.split(",")]
    rows = [r for name, vocab in vocabularies().items() for r in bench(name, vocab, batches, args.repeats)]
    lines = ["| vocabulary | batch | phase | allowed tokens | free step (us) | masked step (us) | t_mask (us) | t_mask / free |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['vocab']} | {r['batch']} | {r['phase']} | {r['allowed']} | {r['free_us']:.0f} | "
                     f"{r['sample_us']:.0f} | {r['t_mask_us']:.0f} | {r['t_mask_us'] / r['free_us']:+.1%} |")
    table = "\n".join(lines)
    print(table)
    meta = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "load": os.getloadavg()[0], "torch": torch.__version__, "repeats": args.repeats}
    if args.out:
        with open(args.out + ".json", "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
        with open(args.out + ".md", "w") as f:
            f.write(f"# Output modes: t_mask per step (CPU)\n\n`{' '.join(['python', 'benchmarks/modes.py', *sys.argv[1:]])}`"
                    f" on {meta['cpus']} CPUs (load {meta['load']:.1f}), torch {meta['torch']}, "
                    f"median of {args.repeats}.\n\n{table}\n")
    print(json.dumps({"meta": meta, "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
