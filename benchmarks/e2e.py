"""End-to-end decoding: our free and constrained loops against HF `generate` + xgrammar.

Same random-weight model (real shapes, real vocabulary), same prompts, same tool catalog (the
seed's four tools in the model's native format), batch sizes 1/16/128 on GPU (smaller on CPU).
Checks correctness first (every constrained call of ours parses; counts how many of the peer's
parse), warms up, then reports tokens/s, time per step, time to first token, t_mask
(constrained minus free, per step) and grammar compile time, a table with ratios, and one JSON
line. Results go to benchmarks/results/e2e_<device>.{json,md}.

    .venv/bin/python benchmarks/e2e.py --device cpu --model tiny --batches 1,4,16
    python benchmarks/e2e.py --device cuda --model qwen2-0.5b --batches 1,16,128   # on the H200
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"

# Real shapes of public models (random weights cost the same per step as trained ones).
SHAPES = {
    "tiny": dict(kind="llama", vocab="llama3", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
    "tiny-qwen2": dict(kind="qwen2", vocab="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2-0.5b": dict(kind="qwen2", vocab="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                       num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1000000.0),
    "llama3.2-1b": dict(kind="llama", vocab="llama3", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                        num_attention_heads=32, num_key_value_heads=8, head_dim=64, tie_word_embeddings=True,
                        rope_theta=500000.0),
}


def build_model(name: str, width: int, device: str, dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    shape = dict(SHAPES[name])
    kind = shape.pop("kind")
    shape.pop("vocab")
    torch.manual_seed(0)
    cls, cfg = (LlamaForCausalLM, LlamaConfig) if kind == "llama" else (Qwen2ForCausalLM, Qwen2Config)
    config = cfg(vocab_size=width, max_position_embeddings=4096, **shape)
    with torch.device(device):
        model = cls(config)
    # Random init gives near-uniform next-token distributions; a trained model's are peaked. Scale
    # the output head so logits have std ~10 (what trained LMs show), the regime samplers see.
    with torch.no_grad():
        model.get_output_embeddings().weight.normal_(0.0, 10.0 / config.hidden_size**0.5)
    return model.to(dtype).eval()


def load_vocab(name: str):
    from surecall.grammars.vocab_loaders import load_shared

    return load_shared(SHAPES[name]["vocab"])


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


# --- ours ------------------------------------------------------------------------------------
def run_ours(llm, prompts, tools, max_tokens: int, constrained: bool, seed: int):
    from surecall.config import SamplingParams

    params = [SamplingParams(max_tokens=max_tokens, seed=seed + i, logprobs=True) for i in range(len(prompts))]
    start = time.perf_counter()
    results = llm.generate(prompts, tools=tools, sampling=params, constrained=constrained)
    wall = time.perf_counter() - start
    t = results[0].timings
    steps = max(t["num_steps"], 1)
    return {
        "wall_s": wall,
        "step_s": t["decode_s"] / steps,
        "ttft_s": t["prefill_s"] + t["decode_s"] / steps,
        "mask_s_per_step": t.get("mask_s", 0.0) / steps,
        "tokens": sum(r.num_tokens for r in results),
        "steps": steps,
        "parsed": sum(r.call is not None for r in results),
        "valid": sum(r.call is not None and not r.error for r in results),
        "rows": len(results),
    }


# --- the peer: HF generate + xgrammar's logits processor -------------------------------------
def xgrammar_compiled(vocab, regex: str):
    import xgrammar as xgr

    start = time.perf_counter()
    info = xgr.TokenizerInfo(
        list(vocab.token_bytes), vocab_type=xgr.VocabType.RAW, vocab_size=vocab.logits_width,
        stop_token_ids=list(vocab.stop_ids),
    )
    compiled = xgr.GrammarCompiler(info).compile_regex(regex)
    return compiled, time.perf_counter() - start


def run_hf(model, vocab, prompts, max_tokens: int, compiled, fmt, device: str, seed: int):
    from surecall.calls import check_call

    ids = torch.tensor(prompts, device=device)
    attn = torch.ones_like(ids)
    processors = []
    if compiled is not None:
        import xgrammar as xgr

        processors = [xgr.contrib.hf.LogitsProcessor(compiled)]
    torch.manual_seed(seed)
    sync(device)
    start = time.perf_counter()
    out = model.generate(
        input_ids=ids, attention_mask=attn, max_new_tokens=max_tokens, do_sample=True, temperature=1.0, top_k=0,
        top_p=1.0, logits_processor=processors, pad_token_id=vocab.stop_ids[0], eos_token_id=list(vocab.stop_ids),
    )
    sync(device)
    wall = time.perf_counter() - start
    new = out[:, ids.shape[1] :].tolist()
    steps = max(len(new[0]), 1)
    stops = set(vocab.stop_ids)
    texts = [b"".join(vocab.token_bytes[t] for t in row if t not in stops).decode("utf-8", "replace") for row in new]
    parsed = sum(check_call(t, fmt, []).error_kind != "malformed" for t in texts) if compiled is not None else 0
    return {"wall_s": wall, "step_s": wall / steps, "tokens": sum(len(r) for r in new), "steps": steps,
            "parsed": parsed, "rows": len(new)}


def hf_ttft(model, prompts, device: str, processors_factory) -> float:
    ids = torch.tensor(prompts, device=device)
    sync(device)
    start = time.perf_counter()
    model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, do_sample=False,
                   logits_processor=processors_factory(), pad_token_id=0)
    sync(device)
    return time.perf_counter() - start


# --- driver ----------------------------------------------------------------------------------
def median_run(fn, repeats: int):
    runs = [fn() for _ in range(repeats)]
    best = dict(runs[0])
    for key in ("wall_s", "step_s", "ttft_s", "mask_s_per_step"):
        if key in best:
            best[key] = statistics.median(r[key] for r in runs)
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", default=None, choices=sorted(SHAPES))
    parser.add_argument("--batches", default=None, help="comma-separated batch sizes")
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--out", default=None, help="results stem (default benchmarks/results/e2e_<device>)")
    args = parser.parse_args(argv)
    gpu = args.device == "cuda"
    model_name = args.model or ("qwen2-0.5b" if gpu else "tiny")
    batches = [int(b) for b in (args.batches or ("1,16,128" if gpu else "1,4,16")).split(",")]
    max_tokens = args.max_tokens or (128 if gpu else 48)
    dtype = getattr(torch, args.dtype or ("bfloat16" if gpu else "float32"))

    from surecall.catalog import seed_tools
    from surecall.config import EngineConfig
    from surecall.grammars.compile import compile_catalog
    from surecall.grammars.formats import catalog_regex, get_format
    from surecall.kernels._triton import resolve_backend
    from surecall.llm import LLM

    # 1. model, vocabulary, tools, grammar (ours and the peer's), timed compiles
    vocab = load_vocab(model_name)
    model = build_model(model_name, vocab.logits_width, args.device, dtype)
    llm = LLM(model, tokenizer=vocab, config=EngineConfig(max_batch_size=max(batches)))
    tools = seed_tools()
    fmt = get_format(llm.default_format)

    start = time.perf_counter()
    table = compile_catalog(tools, vocab, fmt.name, None, use_cache=False)
    ours_compile_s = time.perf_counter() - start
    regex = catalog_regex(tools, fmt, None).regex
    try:
        compiled, xgr_compile_s = xgrammar_compiled(vocab, regex)
    except Exception as exc:  # the peer is optional on a bare machine
        print(f"xgrammar unavailable: {exc}", file=sys.stderr)
        compiled, xgr_compile_s = None, float("nan")
    max_tokens = max(max_tokens, int(table.dist[0]) + 8)

    rows = []
    gen = torch.Generator().manual_seed(0)
    for batch in batches:
        prompts = torch.randint(1000, 100000, (batch, args.prompt_len), generator=gen).tolist()
        # 2. correctness and warm-up
        check = run_ours(llm, prompts, tools, max_tokens, True, seed=0)
        if check["parsed"] != batch:
            raise SystemExit(f"correctness: only {check['parsed']}/{batch} constrained calls parsed")
        run_ours(llm, prompts, tools, max_tokens, False, seed=0)
        # 3. timed runs, peers in the same process
        free = median_run(lambda p=prompts: run_ours(llm, p, tools, max_tokens, False, seed=1), args.repeats)
        cons = median_run(lambda p=prompts: run_ours(llm, p, tools, max_tokens, True, seed=1), args.repeats)
        hf_free = median_run(lambda p=prompts: run_hf(model, vocab, p, max_tokens, None, fmt, args.device, 1), args.repeats)
        hf_xgr = (median_run(lambda p=prompts: run_hf(model, vocab, p, max_tokens, compiled, fmt, args.device, 1), args.repeats)
                  if compiled is not None else None)
        row = {
            "batch": batch,
            "ours_free": free,
            "ours_constrained": cons,
            "hf_free": hf_free,
            "hf_xgrammar": hf_xgr,
            "t_mask_s_per_step": cons["step_s"] - free["step_s"],
            "t_mask_overhead_pct": 100.0 * (cons["step_s"] - free["step_s"]) / free["step_s"],
            "hf_ttft_s": hf_ttft(model, prompts, args.device, lambda: []),
            "load_average_1m": os.getloadavg()[0],  # CPU timings are only as clean as the machine is idle
        }
        if hf_xgr is not None:
            row["throughput_vs_hf_xgrammar"] = (cons["tokens"] / cons["wall_s"]) / (hf_xgr["tokens"] / hf_xgr["wall_s"])
            row["step_ratio_vs_hf_xgrammar"] = hf_xgr["step_s"] / cons["step_s"]
        rows.append(row)
        print_row(row)

    report = {
        "benchmark": "e2e",
        "command": " ".join([sys.executable, *sys.argv]),
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "torch": torch.__version__,
                    "device": torch.cuda.get_device_name() if gpu else "cpu", "num_threads": torch.get_num_threads(),
                    "load_average_1m": os.getloadavg()[0]},
        "model": model_name, "vocab": SHAPES[model_name]["vocab"], "dtype": str(dtype), "tool_format": fmt.name,
        "max_tokens": max_tokens, "prompt_len": args.prompt_len, "kernels": "surecall.kernels:" + resolve_backend("auto", llm.runner.device),
        "compile_s": {"ours": ours_compile_s, "xgrammar": xgr_compile_s},
        "table": {"num_states": table.num_states, "dist_start": int(table.dist[0]), "relaxed": table.relaxed},
        "rows": rows,
    }
    stem = Path(args.out) if args.out else RESULTS / f"e2e_{'gpu' if gpu else 'cpu'}"
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1))
    stem.with_suffix(".md").write_text(markdown(report))
    print(json.dumps({"benchmark": "e2e", "model": model_name, "device": args.device,
                      "rows": [{k: v for k, v in r.items() if not isinstance(v, dict)} for r in rows]}))
    return 0


def _fmt_run(run) -> str:
    if run is None:
        return "n/a"
    return f"{run['step_s'] * 1e3:8.2f} ms/step {run['tokens'] / run['wall_s']:9.0f} tok/s"


def print_row(row) -> None:
    print(f"batch {row['batch']}")
    for key in ("ours_free", "ours_constrained", "hf_free", "hf_xgrammar"):
        print(f"  {key:18s} {_fmt_run(row[key])}")
    print(f"  t_mask {row['t_mask_s_per_step'] * 1e6:.0f} us/step ({row['t_mask_overhead_pct']:+.1f}%)"
          f"  vs hf+xgrammar: {row.get('throughput_vs_hf_xgrammar', float('nan')):.2f}x tok/s")


def markdown(report: dict) -> str:
    lines = [
        f"# e2e decoding ({report['machine']['device']}, model {report['model']}, {report['dtype']})",
        "",
        f"Command: `{report['command']}`  ",
        f"Machine: {report['machine']['platform']}, torch {report['machine']['torch']}, "
        f"{report['machine']['num_threads']} threads, load average {report['machine']['load_average_1m']:.1f}; "
        f"kernels: {report['kernels']}  ",
        f"Tool format {report['tool_format']}, seed four-tool catalog, max_tokens {report['max_tokens']}, "
        f"prompt {report['prompt_len']} tokens, random weights.  ",
        f"Compile: ours {report['compile_s']['ours'] * 1e3:.1f} ms (uncached), xgrammar "
        f"{report['compile_s']['xgrammar'] * 1e3:.1f} ms.",
        "",
        "| batch | ours free ms/step | ours constrained ms/step | t_mask us/step (%) | HF free ms/step | HF+xgrammar ms/step | "
        "ours tok/s | HF+xgr tok/s | ours/HF+xgr tok/s | ours TTFT ms | HF TTFT ms | ours parsed | HF+xgr parsed | load avg |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        c, f, h, x = r["ours_constrained"], r["ours_free"], r["hf_free"], r["hf_xgrammar"]
        xs = (x["step_s"] * 1e3, x["tokens"] / x["wall_s"], x["parsed"]) if x else (float("nan"),) * 3
        lines.append(
            f"| {r['batch']} | {f['step_s'] * 1e3:.2f} | {c['step_s'] * 1e3:.2f} | {r['t_mask_s_per_step'] * 1e6:.0f} "
            f"({r['t_mask_overhead_pct']:+.1f}%) | {h['step_s'] * 1e3:.2f} | {xs[0]:.2f} | {c['tokens'] / c['wall_s']:.0f} | "
            f"{xs[1]:.0f} | {r.get('throughput_vs_hf_xgrammar', float('nan')):.2f}x | {c['ttft_s'] * 1e3:.1f} | "
            f"{r['hf_ttft_s'] * 1e3:.1f} | {c['parsed']}/{c['rows']} | {xs[2]}/{r['batch']} | {r['load_average_1m']:.1f} |"
        )
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
