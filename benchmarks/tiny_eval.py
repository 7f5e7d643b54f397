"""surecall-tiny on its held-out split: single calls and multi-turn episode turns.

Episodes (heldout_episodes.jsonl): every assistant turn is prompted with the gold history
and decoded freely with `generate`; per turn kind (first call, parallel calls, call after a
tool result, text after a tool result, text only) it reports call / parse / valid / right
tool / exact rates over the turns that want a call, the text-answer rate over the turns that
want text, and bad_call = malformed or schema-invalid among completions that tried to call.

Free decoding runs twice: through plain Hugging Face `generate` (the reference, no engine
code) and, when `surecall.llm` loads, through the engine with constrained=False; constrained
decoding needs the engine. Each mode runs at temperature 0 (greedy) and 1.0 (pure sampling,
top_k/top_p off; `--repeats` seeds). Rates are over rows: parsed = a `<tool_call>` envelope
around {"name", "arguments"}; valid = a catalog tool whose schema accepts the arguments;
exact = the gold tool and arguments. Accuracy, not speed: times are wall seconds per pass.
Ends with one JSON line; `--out` writes the same JSON.

    python benchmarks/tiny_eval.py --out benchmarks/results/tiny_model.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import torch

from surecall.models import default_heldout_path, default_model_dir
from surecall.models.training.corpus import read_jsonl
from surecall.models.training.evaluate import (
    episode_turns,
    hf_generate,
    make_validators,
    score_call,
    score_turn,
    summarize,
    summarize_turns,
)
from surecall.tools.catalog import hardened_seed_tools as seed_tools


def _prompt_ids(tokenizer, rows, tools):
    texts = [tokenizer.apply_chat_template(r["messages"], tools=tools, add_generation_prompt=True,
                                           tokenize=False) for r in rows]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def _score(texts, rows, validators):
    return summarize([score_call(t, r["tool"], r["arguments"], validators)
                      for t, r in zip(texts, rows, strict=True)])


def run_hf(model_dir, rows, tools, temperatures, repeats, max_tokens):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True).eval()
    prompts, validators, out = _prompt_ids(tokenizer, rows, tools), make_validators(tools), {}
    for temperature in temperatures:
        for seed in range(repeats if temperature > 0 else 1):
            start = time.perf_counter()
            texts = hf_generate(model, tokenizer, prompts, temperature, seed, max_tokens)
            entry = _score(texts, rows, validators) | {"wall_s": time.perf_counter() - start}
            out.setdefault(f"t{temperature:g}", []).append(entry)
    return out


def run_turns(model_dir, episodes, tools, temperatures, repeats, max_tokens):
    """Free HF decoding of every held-out episode turn; per-kind rates, one entry per pass."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True).eval()
    turns = episode_turns(episodes)
    prompts, validators, out = _prompt_ids(tokenizer, turns, tools), make_validators(tools), {}
    for temperature in temperatures:
        for seed in range(repeats if temperature > 0 else 1):
            start = time.perf_counter()
            texts = hf_generate(model, tokenizer, prompts, temperature, seed, max_tokens)
            entry = summarize_turns([score_turn(t, turn, validators)
                                     for t, turn in zip(texts, turns, strict=True)])
            entry["wall_s"] = time.perf_counter() - start
            out.setdefault(f"t{temperature:g}", []).append(entry)
    return out


_TURN_KEYS = ("call_rate", "parse_rate", "valid_rate", "right_tool_rate", "exact_rate",
              "text_answer_rate", "bad_call_rate")


def _mean_turns(entries: list[dict]) -> dict:
    """Mean over passes of each kind's rates (a rate missing for a kind stays missing)."""
    out = {}
    for kind in entries[0]:
        if kind == "wall_s":
            continue
        rates = {k: sum(e[kind][k] for e in entries) / len(entries)
                 for k in _TURN_KEYS if k in entries[0][kind]}
        out[kind] = rates | {"num_turns": entries[0][kind]["num_turns"]}
    return out


def print_turn_table(turn_sections: dict) -> None:
    short = ("call", "parse", "valid", "right", "exact", "text", "bad")
    print(f"{'temp':<5} {'turn kind':<18} {'n':>4} " + " ".join(f"{s:>6}" for s in short))
    for mode, entries in turn_sections.items():
        for kind, rates in _mean_turns(entries).items():
            cells = [f"{rates[k]:>6.3f}" if k in rates else f"{'-':>6}" for k in _TURN_KEYS]
            print(f"{mode:<5} {kind:<18} {rates['num_turns']:>4} " + " ".join(cells))


def run_engine(model_dir, rows, tools, temperatures, repeats, max_tokens, tool_format):
    from surecall.config import SamplingParams
    from surecall.llm import LLM

    llm = LLM(str(model_dir), device="cpu")
    validators, out = make_validators(tools), {}
    prompts = [r["messages"] for r in rows]
    for constrained in (False, True):
        mode = "constrained" if constrained else "free"
        for temperature in temperatures:
            for seed in range(repeats if temperature > 0 else 1):
                sampling = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed)
                start = time.perf_counter()
                results = llm.generate(prompts, tools=tools, sampling=sampling,
                                       constrained=constrained, tool_format=tool_format)
                wall_s = time.perf_counter() - start
                entry = _score([r.text for r in results], rows, validators) | {"wall_s": wall_s}
                entry["engine_error_rate"] = sum(r.error is not None for r in results) / len(rows)
                out.setdefault(f"{mode}_t{temperature:g}", []).append(entry)
    return out


def _mean(entries: list[dict]) -> dict:
    keys = ("parse_rate", "valid_rate", "exact_rate")
    return {k: sum(e[k] for e in entries) / len(entries) for k in keys} | {"passes": len(entries)}


def print_table(sections: dict) -> None:
    print(f"{'decoder':<8} {'mode':<16} {'parse':>7} {'valid':>7} {'exact':>7} {'passes':>6}")
    for decoder, modes in sections.items():
        for mode, entries in modes.items():
            m = _mean(entries)
            print(f"{decoder:<8} {mode:<16} {m['parse_rate']:>7.3f} {m['valid_rate']:>7.3f} "
                  f"{m['exact_rate']:>7.3f} {m['passes']:>6}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model folder (default: shipped surecall-tiny)")
    parser.add_argument("--rows", type=int, default=0, help="first N held-out rows (0 = all)")
    parser.add_argument("--repeats", type=int, default=3, help="seeds per temperature > 0")
    parser.add_argument("--max-tokens", type=int, default=384)
    parser.add_argument("--tool-format", default="hermes")
    parser.add_argument("--skip-engine", action="store_true")
    parser.add_argument("--skip-rows", action="store_true", help="only the episode turns")
    parser.add_argument("--skip-turns", action="store_true", help="only the single-call rows")
    parser.add_argument("--episodes", type=int, default=0, help="first N held-out episodes (0 = all)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model_dir = args.model or default_model_dir()
    rows = read_jsonl(default_heldout_path() if args.model is None else f"{model_dir}/heldout.jsonl")
    rows = rows[: args.rows] if args.rows else rows
    episodes = read_jsonl(f"{model_dir}/heldout_episodes.jsonl")
    episodes = episodes[: args.episodes] if args.episodes else episodes
    tools, temps = seed_tools(), (0.0, 1.0)
    # 1. episode turns (HF free decoding); 2. single calls: HF reference, then the engine
    turn_sections = {}
    if not args.skip_turns:
        turn_sections = run_turns(model_dir, episodes, tools, temps, args.repeats, args.max_tokens)
        print_turn_table(turn_sections)
    sections = {}
    if not args.skip_rows:
        sections["hf"] = run_hf(model_dir, rows, tools, temps, args.repeats, args.max_tokens)
    engine_error = None
    if not args.skip_engine and not args.skip_rows:
        try:
            sections["engine"] = run_engine(model_dir, rows, tools, temps, args.repeats,
                                            args.max_tokens, args.tool_format)
        except Exception as exc:  # the engine is optional here; say why it was left out
            engine_error = f"{type(exc).__name__}: {exc}"
            print(f"engine run skipped: {engine_error}", file=sys.stderr)
    print_table(sections)
    payload = {
        "benchmark": "tiny_eval", "model": str(model_dir), "num_rows": len(rows),
        "max_tokens": args.max_tokens, "repeats": args.repeats, "tool_format": args.tool_format,
        "num_episodes": len(episodes),
        "summary": {f"{d}/{m}": _mean(e) for d, modes in sections.items() for m, e in modes.items()},
        "turns": {m: _mean_turns(e) for m, e in turn_sections.items()},
        "passes": sections, "turn_passes": turn_sections, "engine_error": engine_error,
        "command": "python " + " ".join(sys.argv),
        "machine": f"{platform.machine()} {platform.processor() or ''} torch {torch.__version__}, "
                   f"{args.threads} thread(s), CPU",
    }
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=1)
    print(json.dumps({"summary": payload["summary"], "turns": payload["turns"],
                      "engine_error": engine_error}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
