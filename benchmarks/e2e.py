"""End-to-end decoding: our free and constrained loops against HF `generate` + xgrammar / outlines.

Same random-weight model (real shapes, real vocabulary), same prompts, same tool catalog (the
seed's four tools in the model's native format), batch sizes 1/16/128 on GPU (smaller on CPU).
The peers are HF `generate` with xgrammar's and outlines' own logits processors, both built from
the same regex over the same vocabulary (each is skipped, with the reason printed, when its
package is missing). Checks correctness first (every constrained call of ours parses; counts how
many of each peer's parse), warms up, then reports tokens/s, time per step, time to first token,
t_mask (constrained minus free, per step; the two run alternately, and "paired" is the median over
back-to-back pairs, steadier on a loaded machine) and grammar compile time, a table with ratios, and one
JSON line. Results go to benchmarks/results/e2e_<device>.{json,md}. Every arm's tokens/s is generated
tokens (a row's padding after its stop id excluded) over the call's wall time; our time per step is
decode time over decode steps, HF's is wall time over steps (its prefill included).

    TRITON_INTERPRET=1 .venv/bin/python benchmarks/e2e.py --device cpu --model tiny --batches 1,4,16 --max-tokens 40
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

import regex as re
import torch

RESULTS = Path(__file__).resolve().parent / "results"
PEERS = ("xgrammar", "outlines")

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
    from surecall.grammars.vocab.loaders import load_shared

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
    t = results[0].batch_timings
    steps = max(t["num_steps"], 1)
    return {
        "wall_s": wall,
        "step_s": t["decode_s"] / max(t["num_decode_steps"], 1),  # decode time over decode steps
        "ttft_s": t["prefill_s"],  # the prefill step samples each row's first token
        "sample_s_per_step": t.get("sample_s", 0.0) / steps,  # sampling kernels (the mask fused in)
        "advance_s_per_step": t.get("advance_s", 0.0) / steps,  # grammar state advance
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


def xgrammar_processors(compiled):
    """A fresh xgrammar HF logits processor per `generate` call (it holds per-row matchers)."""
    import xgrammar as xgr

    return lambda: [xgr.contrib.hf.LogitsProcessor(compiled)]


# --- the peer: HF generate + outlines' logits processor --------------------------------------
def hf_tokenizer(vocab):
    """A `transformers` tokenizer whose id -> text map is exactly `vocab` (byte-level pieces).

    outlines builds its index from an HF tokenizer (`get_vocab`, `convert_tokens_to_string`,
    `eos_token_id`); the shared Llama-3 vocabulary is a bare tiktoken ranks file, so we give it one
    built from the same ids and bytes. It has no merges: it is never used to encode text.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    to_char = bytes_to_unicode()
    texts = {idx: text for text, idx in vocab.special_tokens.items()}
    pieces = {}
    for idx, raw in enumerate(vocab.token_bytes):
        if idx in texts:
            pieces[texts[idx]] = idx
        elif raw and idx not in vocab.special_ids:
            pieces["".join(to_char[b] for b in raw)] = idx
    tok = Tokenizer(models.BPE(vocab=pieces, merges=[]))
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for _, t in sorted(texts.items())])
    eos = vocab.eos_id if vocab.eos_id is not None else vocab.stop_ids[0]
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=texts[eos])


def outlines_compiled(model, vocab, regex: str):
    """outlines' own regex logits processor (outlines-core backend); times its vocabulary + index build."""
    import outlines
    from outlines.backends import get_regex_logits_processor

    wrapped = outlines.from_transformers(model, hf_tokenizer(vocab))
    start = time.perf_counter()
    processor = get_regex_logits_processor("outlines_core", wrapped, regex)
    return processor, time.perf_counter() - start


def outlines_processors(processor):
    """The same outlines processor, reset before each `generate` call (its documented reuse path)."""

    def make():
        processor.reset()
        return [processor]

    return make


def build_peers(model, vocab, regex: str) -> dict:
    """name -> (processors factory or None, compile seconds, reason skipped or None)."""
    peers = {}
    for name, build, wrap in (("xgrammar", lambda: xgrammar_compiled(vocab, regex), xgrammar_processors),
                              ("outlines", lambda: outlines_compiled(model, vocab, regex), outlines_processors)):
        try:
            compiled, seconds = build()
            peers[name] = (wrap(compiled), seconds, None)
        except ImportError as exc:  # the peers are optional: `pip install -e .[peers]`
            peers[name] = (None, float("nan"), f"not importable ({exc})")
        except Exception as exc:  # a peer that cannot take this grammar is reported, not fatal
            peers[name] = (None, float("nan"), f"{type(exc).__name__}: {exc}")
        if peers[name][2]:
            print(f"peer {name} skipped: {peers[name][2]}", file=sys.stderr)
    return peers


def run_hf(model, vocab, prompts, max_tokens: int, processors_factory, fmt, device: str, seed: int, language=None):
    from surecall.tools.calls import check_call

    ids = torch.tensor(prompts, device=device)
    attn = torch.ones_like(ids)
    processors = processors_factory() if processors_factory is not None else []
    torch.manual_seed(seed)
    sync(device)
    start = time.perf_counter()
    out = model.generate(
        input_ids=ids, attention_mask=attn, max_new_tokens=max_tokens, do_sample=True, temperature=1.0, top_k=0,
        top_p=1.0, logits_processor=processors, pad_token_id=vocab.stop_ids[0], eos_token_id=list(vocab.stop_ids),
    )
    sync(device)
    wall = time.perf_counter() - start
    stops = set(vocab.stop_ids)
    padded = out[:, ids.shape[1] :].tolist()
    steps = max(len(padded[0]), 1)
    new = [_until_stop(row, stops) for row in padded]  # a row that stopped early is padded: not generated
    texts = [b"".join(vocab.token_bytes[t] for t in row if t not in stops).decode("utf-8", "replace") for row in new]
    parsed = sum(check_call(t, fmt, []).error_kind != "malformed" for t in texts) if processors else 0
    run = {"wall_s": wall, "step_s": wall / steps, "tokens": sum(len(r) for r in new), "steps": steps,
           "parsed": parsed, "rows": len(new)}
    if language is not None:  # a row cut by max_tokens must still be a prefix of the call language
        run["in_language"] = sum(language.fullmatch(t, partial=True) is not None for t in texts)
    return run


def _until_stop(row: list[int], stops: set[int]) -> list[int]:
    """A generated row up to and including its first stop id (HF pads the rest of a finished row)."""
    for i, t in enumerate(row):
        if t in stops:
            return row[: i + 1]
    return row


def run_peer(model, vocab, prompts, max_tokens: int, factory, fmt, device: str, repeats: int, language):
    """A constrained peer's median run plus its time to first token (mask included), after a warm-up
    that checks every row stayed inside the call language."""
    check = run_hf(model, vocab, prompts, max_tokens, factory, fmt, device, 0, language)
    if check["in_language"] != check["rows"]:
        raise SystemExit(f"correctness: only {check['in_language']}/{check['rows']} peer rows are in the call language")
    run = median_run(lambda: run_hf(model, vocab, prompts, max_tokens, factory, fmt, device, 1, language), repeats)
    run["ttft_s"] = statistics.median(hf_ttft(model, prompts, device, factory) for _ in range(repeats))
    return run


def hf_ttft(model, prompts, device: str, processors_factory) -> float:
    ids = torch.tensor(prompts, device=device)
    sync(device)
    start = time.perf_counter()
    model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, do_sample=False,
                   logits_processor=processors_factory(), pad_token_id=0)
    sync(device)
    return time.perf_counter() - start


# --- driver ----------------------------------------------------------------------------------
def paired_runs(fn_a, fn_b, repeats: int):
    """(median run of a, median run of b, median of the per-pair step-time ratios b / a), the two
    run alternately, so load on a shared machine that drifts hits both alike."""
    pairs = [(fn_a(), fn_b()) for _ in range(repeats)]
    ratio = statistics.median(b["step_s"] / a["step_s"] for a, b in pairs)
    return median_of([a for a, _ in pairs]), median_of([b for _, b in pairs]), ratio


def median_run(fn, repeats: int):
    return median_of([fn() for _ in range(repeats)])


def median_of(runs: list[dict]) -> dict:
    best = dict(runs[0])
    for key in ("wall_s", "step_s", "ttft_s", "sample_s_per_step", "advance_s_per_step"):
        if key in best:
            best[key] = statistics.median(r[key] for r in runs)
    return best


def _graph_note(llm) -> str:
    """What ran the decode steps: the captured graph step (CUDA default) or the eager step."""
    core = getattr(llm, "_engine", None)
    graph = getattr(core, "graph", None)
    if graph is None:
        return "none (decode steps ran eagerly)"
    return (f"graph step: {graph.num_replays} replays of {graph.num_captures} captured buckets, "
            f"{graph.num_eager} steps on static buffers without capture")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", default=None, choices=sorted(SHAPES))
    parser.add_argument("--batches", default=None, help="comma-separated batch sizes")
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default 1 on CPU: a tiny model on a shared box is fastest and "
                             "least noisy single-threaded, OpenMP spin-waits otherwise; untouched on CUDA)")
    parser.add_argument("--out", default=None, help="results stem (default benchmarks/results/e2e_<device>)")
    args = parser.parse_args(argv)
    gpu = args.device == "cuda"
    if args.threads or not gpu:
        torch.set_num_threads(args.threads or 1)  # every peer runs in this process: same threads for all
    model_name = args.model or ("qwen2-0.5b" if gpu else "tiny")
    batches = [int(b) for b in (args.batches or ("1,16,128" if gpu else "1,4,16")).split(",")]
    max_tokens = args.max_tokens or (128 if gpu else 48)
    dtype = getattr(torch, args.dtype or ("bfloat16" if gpu else "float32"))

    from surecall.config import EngineConfig
    from surecall.grammars.compile import compile_catalog
    from surecall.grammars.formats import catalog_regex, get_format
    from surecall.grammars.options import GrammarOptions
    from surecall.kernels._triton import resolve_backend
    from surecall.llm import LLM
    from surecall.tools.catalog import seed_tools

    # 1. model, vocabulary, tools, grammar (ours and the peer's), timed compiles
    vocab = load_vocab(model_name)
    model = build_model(model_name, vocab.logits_width, args.device, dtype)
    config = EngineConfig(max_batch_size=max(batches))
    llm = LLM(model, tokenizer=vocab, config=config)
    tools = seed_tools()
    fmt = get_format(llm.default_format)

    start = time.perf_counter()
    table = compile_catalog(tools, vocab, fmt.name, None, use_cache=False)
    ours_compile_s = time.perf_counter() - start
    regex = catalog_regex(tools, fmt, GrammarOptions(counted_lengths=False)).regex  # peers cannot count
    language = re.compile(regex)  # the `regex` package: partial matches say "a prefix of a call"
    peers = build_peers(model, vocab, regex)
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
        free, cons, paired = paired_runs(lambda p=prompts: run_ours(llm, p, tools, max_tokens, False, seed=1),
                                         lambda p=prompts: run_ours(llm, p, tools, max_tokens, True, seed=1), args.repeats)
        hf_free = median_run(lambda p=prompts: run_hf(model, vocab, p, max_tokens, None, fmt, args.device, 1), args.repeats)
        row = {
            "batch": batch,
            "ours_free": free,
            "ours_constrained": cons,
            "hf_free": hf_free,
            "t_mask_s_per_step": cons["step_s"] - free["step_s"],
            "t_mask_overhead_pct": 100.0 * (cons["step_s"] - free["step_s"]) / free["step_s"],
            # median over back-to-back (free, constrained) pairs: less exposed to load drifting between them
            "t_mask_overhead_pct_paired": 100.0 * (paired - 1.0),
            "hf_ttft_s": statistics.median(hf_ttft(model, prompts, args.device, list) for _ in range(args.repeats)),
            "load_average_1m": os.getloadavg()[0],  # CPU timings are only as clean as the machine is idle
        }
        for name in PEERS:
            factory = peers[name][0]
            peer = (run_peer(model, vocab, prompts, max_tokens, factory, fmt, args.device, args.repeats, language)
                    if factory is not None else None)
            row[f"hf_{name}"] = peer
            if peer is not None:
                row[f"throughput_vs_hf_{name}"] = (cons["tokens"] / cons["wall_s"]) / (peer["tokens"] / peer["wall_s"])
                row[f"step_ratio_vs_hf_{name}"] = peer["step_s"] / cons["step_s"]
        rows.append(row)
        print_row(row)

    report = {
        "benchmark": "e2e",
        "command": " ".join([*(f"{k}={os.environ[k]}" for k in ("TRITON_INTERPRET",) if k in os.environ),
                             sys.executable, *sys.argv]),
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "torch": torch.__version__,
                    "device": torch.cuda.get_device_name() if gpu else "cpu", "num_threads": torch.get_num_threads(),
                    "load_average_1m": os.getloadavg()[0], "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET")},
        "model": model_name, "vocab": SHAPES[model_name]["vocab"], "dtype": str(dtype), "tool_format": fmt.name,
        "max_tokens": max_tokens, "prompt_len": args.prompt_len, "kernels": "surecall.kernels:" + resolve_backend("auto", llm.runner.device),
        "cuda_graphs": _graph_note(llm),
        "compile_s": {"ours": ours_compile_s, **{name: peers[name][1] for name in PEERS}},
        "peers_skipped": {name: peers[name][2] for name in PEERS if peers[name][2]},
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
    for key in ("ours_free", "ours_constrained", "hf_free", *(f"hf_{name}" for name in PEERS)):
        print(f"  {key:18s} {_fmt_run(row[key])}")
    ratios = "  ".join(f"vs hf+{name}: {row.get(f'throughput_vs_hf_{name}', float('nan')):.2f}x tok/s" for name in PEERS)
    print(f"  t_mask {row['t_mask_s_per_step'] * 1e6:.0f} us/step ({row['t_mask_overhead_pct']:+.1f}%; "
          f"paired {row['t_mask_overhead_pct_paired']:+.1f}%)  {ratios}")


def _peer_cells(row, name: str) -> list[str]:
    """ms/step, tok/s, ours/peer tok/s, TTFT ms, parsed for one peer ("n/a" when it was skipped)."""
    run = row[f"hf_{name}"]
    if run is None:
        return ["n/a"] * 5
    return [f"{run['step_s'] * 1e3:.2f}", f"{run['tokens'] / run['wall_s']:.0f}",
            f"{row[f'throughput_vs_hf_{name}']:.2f}x", f"{run['ttft_s'] * 1e3:.1f}", f"{run['parsed']}/{run['rows']}"]


def markdown(report: dict) -> str:
    compile_s = report["compile_s"]
    peers_note = "".join(f" Peer {name} skipped: {why}." for name, why in report.get("peers_skipped", {}).items())
    lines = [
        f"# e2e decoding ({report['machine']['device']}, model {report['model']}, {report['dtype']})",
        "",
        f"Command: `{report['command']}`  ",
        f"Machine: {report['machine']['platform']}, torch {report['machine']['torch']}, "
        f"{report['machine']['num_threads']} threads, load average {report['machine']['load_average_1m']:.1f}; "
        f"kernels: {report['kernels']}; cuda graphs: {report['cuda_graphs']}  ",
        f"Tool format {report['tool_format']}, seed four-tool catalog, max_tokens {report['max_tokens']}, "
        f"prompt {report['prompt_len']} tokens, random weights; the peers get the same regex over the same vocabulary.  ",
        f"Compile: ours {compile_s['ours'] * 1e3:.1f} ms (uncached), "
        + ", ".join(f"{name} {compile_s[name] * 1e3:.1f} ms" for name in PEERS) + "." + peers_note,
        "",
        "Peers are HF `generate` with the library's logits processor (xgr = xgrammar, out = outlines); "
        "HF TTFT is unconstrained, a peer's TTFT includes its first mask; parsed = the call parses within max_tokens "
        "(ours guarantee it; before timing, every peer row is checked to be a prefix of the call language).",
        "",
        "| batch | ours free ms/step | ours constrained ms/step | t_mask us/step (%; paired %) | HF free ms/step "
        "| HF+xgr ms/step | HF+out ms/step | ours tok/s | HF+xgr tok/s | HF+out tok/s | ours/HF+xgr tok/s "
        "| ours/HF+out tok/s | ours TTFT ms | HF TTFT ms | HF+xgr TTFT ms | HF+out TTFT ms | ours parsed "
        "| HF+xgr parsed | HF+out parsed | load avg |",
        "|" + "---|" * 20,
    ]
    for r in report["rows"]:
        c, f, h = r["ours_constrained"], r["ours_free"], r["hf_free"]
        x, o = _peer_cells(r, "xgrammar"), _peer_cells(r, "outlines")
        cells = [
            r["batch"], f"{f['step_s'] * 1e3:.2f}", f"{c['step_s'] * 1e3:.2f}",
            f"{r['t_mask_s_per_step'] * 1e6:.0f} ({r['t_mask_overhead_pct']:+.1f}%; paired "
            f"{r.get('t_mask_overhead_pct_paired', float('nan')):+.1f}%)", f"{h['step_s'] * 1e3:.2f}",
            x[0], o[0], f"{c['tokens'] / c['wall_s']:.0f}", x[1], o[1], x[2], o[2],
            f"{c['ttft_s'] * 1e3:.1f}", f"{r['hf_ttft_s'] * 1e3:.1f}", x[3], o[3],
            f"{c['parsed']}/{c['rows']}", x[4], o[4], f"{r['load_average_1m']:.1f}",
        ]
        lines.append("| " + " | ".join(str(cell) for cell in cells) + " |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
