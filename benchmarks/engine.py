"""Engine core benchmark: offline throughput, online latency under Poisson arrivals, prefix reuse.

Offline: the same constrained batch (the shipped surecall-tiny, its held-out prompts, the hardened
seed catalog, T=1, seeded) through the engine core (`EngineCore`, continuous batching, paged KV,
prefix cache), through `LLM.generate` (the static-bucket batch loop) and through HF `generate` with
xgrammar's logits processor on the same regex; tokens/s and calls that parse, checked before timing.
Online: a bounded Poisson arrival of requests at several rates into `AsyncLLM` versus a
static-batching baseline (requests queue until the running batch has drained, then go as one
`LLM.generate` batch); TTFT and inter-token latency p50/p99. Prefix reuse: time to first token of
turn t+1 (turn t's prompt + its answer + a new user message) with the prefix cache warm versus a
cold prefill of the same prompt. CPU by default; ends with one JSON line.
Usage: python benchmarks/engine.py [--rows 16] [--rates 2,8] [--requests 24] [--out benchmarks/results/engine_cpu]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def _pct(values, q):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def prompts_and_tools(n: int):
    from surecall.models import default_model_dir
    from surecall.tools import hardened_seed_tools

    rows = [json.loads(line) for line in (default_model_dir() / "heldout.jsonl").read_text().splitlines()]
    return [r["messages"] for r in rows[:n]], hardened_seed_tools()


# --- offline -------------------------------------------------------------------------------------
def offline(llm, msgs, tools, max_tokens: int, seed: int) -> dict:
    from surecall.config import SamplingParams
    from surecall.core import EngineCore
    from surecall.core.prompts import render_prompt

    params = [SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=seed + i) for i in range(len(msgs))]
    table = llm.compile(tools)
    out = {}
    start = time.perf_counter()
    batch = llm.generate(msgs, tools=tools, sampling=params)
    wall = time.perf_counter() - start
    out["static_batch"] = {"wall_s": wall, "tokens": sum(r.num_tokens for r in batch), "ok": sum(r.ok for r in batch)}
    core = EngineCore(llm.runner.model, pad_id=llm._pad_id())
    ids = [render_prompt(m, llm.tokenizer, tools, i) for i, m in enumerate(msgs)]
    start = time.perf_counter()
    seqs = [core.add_request(f"r{i}", p, s, stop_ids=llm.vocab.stop_ids, table=table, table_key="catalog")
            for i, (p, s) in enumerate(zip(ids, params))]
    core.run_to_completion()
    wall = time.perf_counter() - start
    from surecall.tools.calls import check_call

    fmt = llm._format(None)
    ok = sum(check_call(llm._text(s.payload.generated), fmt, tools).error is None for s in seqs)
    same = sum(s.payload.generated == r.token_ids for s, r in zip(seqs, batch))
    out["core"] = {"wall_s": wall, "tokens": sum(len(s.payload.generated) for s in seqs), "ok": ok,
                   "same_tokens_as_static": same, **{k: core.stats()[k] for k in ("prefix_hit_rate", "num_steps")}}
    out["hf_xgrammar"] = hf_xgrammar(llm, ids, tools, max_tokens, seed)
    for row in out.values():
        if row and "wall_s" in row:
            row["tok_per_s"] = row["tokens"] / row["wall_s"]
    return out


def hf_xgrammar(llm, ids, tools, max_tokens: int, seed: int) -> dict | None:
    try:
        import xgrammar  # noqa: F401
    except ImportError as exc:
        print(f"HF generate + xgrammar skipped: {exc}", file=sys.stderr)
        return None
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from e2e import xgrammar_compiled, xgrammar_processors

    from surecall.grammars.formats import catalog_regex
    from surecall.tools.calls import check_call

    fmt = llm._format(None)
    from surecall.grammars.options import GrammarOptions

    # the peer gets the same call language without our counter marks (long bounds left to validation)
    regex = catalog_regex(tools, fmt.name, GrammarOptions(counted_lengths=False)).regex
    compiled, _ = xgrammar_compiled(llm.vocab, regex)
    width = max(len(p) for p in ids)
    pad = llm._pad_id()
    batch = torch.tensor([[pad] * (width - len(p)) + p for p in ids])
    attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ids])
    torch.manual_seed(seed)
    start = time.perf_counter()
    out = llm.runner.model.generate(input_ids=batch, attention_mask=attn, max_new_tokens=max_tokens, do_sample=True,
                                    temperature=1.0, top_k=0, top_p=1.0, logits_processor=xgrammar_processors(compiled)(),
                                    pad_token_id=pad, eos_token_id=list(llm.vocab.stop_ids))
    wall = time.perf_counter() - start
    new = out[:, width:].tolist()
    stops = set(llm.vocab.stop_ids)
    texts = [llm._text([t for t in row if t not in stops and t != pad]) for row in new]
    ok = sum(check_call(t, fmt, tools).error is None for t in texts)
    return {"wall_s": wall, "tokens": sum(sum(1 for t in row if t != pad) for row in new), "ok": ok}


# --- online --------------------------------------------------------------------------------------
def online_core(engine, msgs, tools, rate: float, n: int, max_tokens: int, seed: int) -> dict:
    from surecall.config import SamplingParams

    rng = random.Random(seed)

    async def one(i, delay):
        await asyncio.sleep(delay)
        sent = time.perf_counter()
        stamps = []
        async for out in engine.generate(msgs[i % len(msgs)], SamplingParams(temperature=1.0, max_tokens=max_tokens,
                                                                              seed=seed + i), tools=tools):
            stamps.append(time.perf_counter())
            last = out
        return sent, stamps, last.ok

    async def main():
        delays, t = [], 0.0
        for _ in range(n):
            t += rng.expovariate(rate)
            delays.append(t)
        return await asyncio.gather(*[one(i, d) for i, d in enumerate(delays)])

    start = time.perf_counter()
    results = asyncio.run(main())
    wall = time.perf_counter() - start
    ttft = [stamps[0] - sent for sent, stamps, _ in results if stamps]
    itl = [b - a for _, stamps, _ in results for a, b in zip(stamps, stamps[1:])]
    return {"rate": rate, "requests": n, "wall_s": wall, "ok": sum(ok for *_, ok in results),
            "ttft_p50_s": _pct(ttft, 0.5), "ttft_p99_s": _pct(ttft, 0.99),
            "itl_p50_s": _pct(itl, 0.5), "itl_p99_s": _pct(itl, 0.99)}


def online_static(llm, msgs, tools, rate: float, n: int, max_tokens: int, seed: int) -> dict:
    """Static batching: arrivals queue while a batch runs; the next batch takes every queued request."""
    from surecall.config import SamplingParams

    rng = random.Random(seed)
    arrivals, t = [], 0.0
    for _ in range(n):
        t += rng.expovariate(rate)
        arrivals.append(t)
    clock, i, ttft, itl, ok = 0.0, 0, [], [], 0
    while i < n:
        clock = max(clock, arrivals[i])
        batch = [j for j in range(i, n) if arrivals[j] <= clock] or [i]
        params = [SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=seed + j) for j in batch]
        start = time.perf_counter()
        results = llm.generate([msgs[j % len(msgs)] for j in batch], tools=tools, sampling=params)
        took = time.perf_counter() - start
        bt = results[0].batch_timings
        step = bt["decode_s"] / max(bt["num_steps"], 1)
        for j, r in zip(batch, results):
            ttft.append(clock + bt["prefill_s"] + step - arrivals[j])
            itl += [step] * max(r.num_tokens - 1, 0)
            ok += r.ok
        clock += took
        i = batch[-1] + 1
    return {"rate": rate, "requests": n, "wall_s": clock, "ok": ok, "ttft_p50_s": _pct(ttft, 0.5),
            "ttft_p99_s": _pct(ttft, 0.99), "itl_p50_s": _pct(itl, 0.5), "itl_p99_s": _pct(itl, 0.99)}


# --- prefix reuse --------------------------------------------------------------------------------
def prefix_reuse(engine, msgs, tools, seed: int) -> dict:
    from surecall.config import SamplingParams

    async def ttft(prompt):
        sent = time.perf_counter()
        async for out in engine.generate(prompt, SamplingParams(temperature=0, max_tokens=48), tools=tools):
            return time.perf_counter() - sent, out
        return None, None

    async def main():
        turn1 = msgs[0]
        first = None
        async for out in engine.generate(turn1, SamplingParams(temperature=1.0, max_tokens=64, seed=seed), tools=tools):
            first = out
        ids = first.prompt_token_ids + first.token_ids + engine.llm.count_tokens("\nuser: now do the same for tests/\n")
        warm, out = await ttft(ids)
        return warm, out.num_cached_tokens, len(ids), ids

    warm, cached, length, ids = asyncio.run(main())
    from surecall import AsyncLLM

    cold_engine = AsyncLLM(engine.llm, enable_prefix_caching=False)
    try:
        async def cold():
            sent = time.perf_counter()
            async for _ in cold_engine.generate(ids, __import__("surecall").SamplingParams(temperature=0, max_tokens=48),
                                                tools=tools):
                return time.perf_counter() - sent
        cold_s = asyncio.run(cold())
    finally:
        cold_engine.shutdown()
    return {"prompt_tokens": length, "cached_tokens": cached, "ttft_warm_s": warm, "ttft_cold_s": cold_s,
            "speedup": cold_s / warm if warm else None}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--rates", default="2,8", help="comma-separated arrival rates (requests/s)")
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "engine_cpu"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    from surecall import LLM, AsyncLLM

    llm = LLM()
    msgs, tools = prompts_and_tools(max(args.rows, 8))
    llm.generate(msgs[:2], tools=tools)  # warm up: compile, allocate
    report = {"benchmark": "engine", "rows": args.rows, "max_tokens": args.max_tokens, "torch": torch.__version__,
              "offline": offline(llm, msgs[: args.rows], tools, args.max_tokens, args.seed)}
    engine = AsyncLLM(llm)
    try:
        report["online"] = []
        for rate in [float(r) for r in args.rates.split(",")]:
            report["online"].append({"core": online_core(engine, msgs, tools, rate, args.requests, args.max_tokens, args.seed),
                                     "static": online_static(llm, msgs, tools, rate, args.requests, args.max_tokens,
                                                             args.seed)})
        report["prefix_reuse"] = prefix_reuse(engine, msgs, tools, args.seed)
    finally:
        engine.shutdown()
    write(report, Path(args.out))
    print(json.dumps(report))
    return 0


def write(report: dict, stem: Path) -> None:
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1))
    off = report["offline"]
    lines = ["# Engine core on CPU", "", f"`python benchmarks/engine.py` ({report['rows']} rows, max_tokens "
             f"{report['max_tokens']}, shipped surecall-tiny, hardened seed catalog, T=1, one thread, 2-core shared VM)", "",
             "## Offline (one constrained batch)", "", "| path | wall s | tokens | tok/s | calls valid | vs HF+xgrammar |",
             "|---|---|---|---|---|---|"]
    peer = (off.get("hf_xgrammar") or {}).get("tok_per_s")
    for name, row in off.items():
        if not row:
            continue
        ratio = f"{row['tok_per_s'] / peer:.2f}x" if peer else "-"
        lines.append(f"| {name} | {row['wall_s']:.2f} | {row['tokens']} | {row['tok_per_s']:.0f} | {row['ok']}/{report['rows']} | {ratio} |")
    lines += ["", f"core: {off['core']['same_tokens_as_static']}/{report['rows']} rows give the same tokens as the "
              f"static batch; prefix-cache hit rate {off['core']['prefix_hit_rate']:.0%}", "",
              "## Online (Poisson arrivals)", "", "| rate req/s | engine | wall s | valid | TTFT p50 / p99 s | inter-token p50 / p99 ms |",
              "|---|---|---|---|---|---|"]
    for pair in report.get("online", []):
        for name, row in pair.items():
            lines.append(f"| {row['rate']:g} | {name} | {row['wall_s']:.2f} | {row['ok']}/{row['requests']} | "
                         f"{row['ttft_p50_s']:.3f} / {row['ttft_p99_s']:.3f} | {row['itl_p50_s'] * 1e3:.1f} / {row['itl_p99_s'] * 1e3:.1f} |")
    pr = report.get("prefix_reuse")
    if pr:
        lines += ["", "## Prefix reuse (turn t+1)", "",
                  f"{pr['prompt_tokens']}-token prompt, {pr['cached_tokens']} found in the cache: TTFT {pr['ttft_warm_s'] * 1e3:.1f} ms "
                  f"warm vs {pr['ttft_cold_s'] * 1e3:.1f} ms cold ({pr['speedup']:.1f}x)."]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
