"""The captured decode step (core/graph_step.py) against the eager step: same tokens, and step time.

On random-weight models in real shapes (benchmarks/e2e.py's SHAPES, real vocabularies, the seed's
four-tool catalog as the grammar): 1. correctness first: at batch 16, mixed constrained/free rows
with seeds, the tokens of the CUDA-graph replay equal those of the same static step run eagerly
(must be bit-identical) and those of the engine's eager step (reported: bf16 attention over a longer,
masked key range may round differently); 2. per batch (1/16/128/512) and mode (free, constrained),
the median engine step time, eager vs graph, each after its warm-up and capture; the constrained /
free ratio per path is the issue's goal (within 2% on the H200). A table, then one JSON line; the
JSON also goes to --out.

    python benchmarks/gpu/graph_step.py --device cuda --model qwen2-0.5b --out $OUT/graph_step_qwen2.json
    TRITON_INTERPRET=1 .venv/bin/python benchmarks/gpu/graph_step.py --device cpu --model tiny --batches 1,2 --steps 4
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from e2e import SHAPES, build_model, load_vocab  # noqa: E402

PROMPT_LEN = 32


def make_core(llm, batch: int, max_tokens: int, graph: bool, capture: bool = True):
    from surecall.core import EngineCore

    blocks = batch * (-(-(PROMPT_LEN + max_tokens + 1) // 16)) + 16
    core = EngineCore(llm.runner.model, block_size=16, num_blocks=blocks, max_num_seqs=batch,
                      max_num_batched_tokens=max(4096, PROMPT_LEN * 8), pad_id=0, graph_step=graph)
    if core.graph is not None:
        core.graph.capture = capture and core.device.type == "cuda"
    return core


def add_rows(core, llm, table, batch: int, max_tokens: int, constrained, seed: int = 0):
    """`constrained(i)` says which rows take the catalog grammar; prompts are fixed random ids."""
    from surecall.config import SamplingParams

    gen = torch.Generator().manual_seed(seed)
    seqs = []
    for i in range(batch):
        prompt = torch.randint(10, 1000, (PROMPT_LEN,), generator=gen).tolist()
        params = SamplingParams(temperature=1.0 if i % 4 else 0.0, max_tokens=max_tokens, seed=seed + i)
        grammar = dict(table=table, table_key="catalog") if constrained(i) else {}
        seqs.append(core.add_request(f"r{i}", prompt, params, stop_ids=(), **grammar))
    return seqs


def check_tokens(llm, table, steps: int) -> dict:
    """Batch 16, every other row constrained: replay vs static-eager vs engine-eager tokens."""
    runs = {}
    for name, graph, capture in (("engine_eager", False, False), ("static_eager", True, False),
                                 ("graph", True, True)):
        core = make_core(llm, 16, steps, graph, capture)
        seqs = add_rows(core, llm, table, 16, steps, lambda i: i % 2 == 0, seed=5)
        core.run_to_completion()
        runs[name] = [s.payload.generated for s in seqs]
        if name == "graph":
            runs["num_captures"] = core.graph.num_captures
            runs["num_replays"] = core.graph.num_replays
    rows_equal = sum(a == b for a, b in zip(runs["graph"], runs["engine_eager"], strict=True))
    return {"replay_equals_static_eager": runs["graph"] == runs["static_eager"],
            "replay_equals_engine_eager": runs["graph"] == runs["engine_eager"],
            "rows_equal_to_engine_eager": f"{rows_equal}/16", "num_captures": runs["num_captures"],
            "num_replays": runs["num_replays"]}


def time_steps(llm, table, batch: int, constrained: bool, graph: bool, steps: int, warmup: int = 3) -> dict:
    max_tokens = int(table.dist[0]) + warmup + steps + 8  # room for a complete call past the timed steps
    core = make_core(llm, batch, max_tokens, graph)
    add_rows(core, llm, table, batch, max_tokens, (lambda i: True) if constrained else (lambda i: False))
    while core.has_unfinished and (core.num_steps == 0 or core.last_step_prefill):
        core.step()  # prefill (chunks), then the first decode step (a capture on the graph path)
    for _ in range(warmup):
        core.step()
    times, rows = [], []
    for _ in range(steps):
        if not core.has_unfinished:
            break
        rows.append(sum(1 for s in core.requests.values() if s.payload.finish_reason is None))
        start = time.perf_counter()
        core.step()  # ends in a sync (the tokens go to the host)
        times.append(time.perf_counter() - start)
    out = {"step_ms": 1e3 * statistics.median(times) if times else None, "rows_mean": statistics.fmean(rows or [0])}
    if core.graph is not None:
        out.update(num_captures=core.graph.num_captures, capture_s=round(core.graph.capture_s, 3),
                   num_replays=core.graph.num_replays, num_static_eager=core.graph.num_eager)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", default=None, choices=sorted(SHAPES))
    parser.add_argument("--batches", default=None, help="comma-separated batch sizes")
    parser.add_argument("--steps", type=int, default=16, help="timed decode steps per case")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/graph_step_<device>.json)")
    args = parser.parse_args(argv)
    gpu = args.device == "cuda"
    if not gpu:
        torch.set_num_threads(1)
    name = args.model or ("qwen2-0.5b" if gpu else "tiny")
    batches = [int(b) for b in (args.batches or ("1,16,128,512" if gpu else "1,2")).split(",")]
    dtype = torch.bfloat16 if gpu else torch.float32

    from surecall.config import EngineConfig
    from surecall.grammars.compile import compile_catalog
    from surecall.llm import LLM
    from surecall.tools.catalog import seed_tools

    vocab = load_vocab(name)
    model = build_model(name, vocab.logits_width, args.device, dtype)
    llm = LLM(model, tokenizer=vocab, config=EngineConfig(max_batch_size=max(batches)))
    table = compile_catalog(seed_tools(), vocab, llm.default_format, None, use_cache=False)
    report = {"bench": "graph_step", "model": name, "device": args.device, "dtype": str(dtype),
              "machine": torch.cuda.get_device_name() if gpu else platform.processor() or platform.machine(),
              "torch": torch.__version__, "check": check_tokens(llm, table, steps=int(table.dist[0]) + 8), "cases": []}
    print(f"check: {report['check']}")
    print(f"{'batch':>6} {'mode':>12} {'eager ms':>9} {'graph ms':>9} {'speedup':>8} {'rows':>6}")
    for batch in batches:
        for constrained in (False, True):
            eager = time_steps(llm, table, batch, constrained, graph=False, steps=args.steps)
            graph = time_steps(llm, table, batch, constrained, graph=True, steps=args.steps)
            case = {"batch": batch, "mode": "constrained" if constrained else "free", "eager": eager, "graph": graph,
                    "speedup": eager["step_ms"] / graph["step_ms"] if eager["step_ms"] and graph["step_ms"] else None}
            report["cases"].append(case)
            print(f"{batch:>6} {case['mode']:>12} {eager['step_ms']:>9.3f} {graph['step_ms']:>9.3f} "
                  f"{case['speedup'] or 0:>7.2f}x {graph['rows_mean']:>6.1f}")
    by_key = {(c["batch"], c["mode"]): c for c in report["cases"]}
    report["constrained_over_free"] = {
        path: {str(b): by_key[(b, "constrained")][path]["step_ms"] / by_key[(b, "free")][path]["step_ms"]
               for b in batches} for path in ("eager", "graph")}
    print(f"constrained / free step time: {report['constrained_over_free']}")
    out = Path(args.out) if args.out else Path(__file__).resolve().parents[1] / "results" / f"graph_step_{args.device}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report))
    ok = report["check"]["replay_equals_static_eager"] and report["check"]["num_captures"] >= (1 if gpu else 0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
