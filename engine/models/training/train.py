"""Train surecall-tiny from scratch: corpus -> BPE tokenizer -> small Llama -> checkpoints.

`python -m surecall.models.training.train --out DIR --minutes M --seed S` builds the corpus and the
tokenizer, trains a LlamaForCausalLM (loss on the assistant completion only) and saves a
checkpoint (model, tokenizer, held-out rows) plus a quick held-out free-decoding eval every
`--eval-minutes`, so a run cut short still leaves a usable model. Every row shares the same
system block (the tool list), so each step runs that prefix once and reuses its KV cache for
the whole batch: exact (causal attention), and ~8x fewer tokens per step. It does not pick or
ship a checkpoint: copy the chosen one to engine/models/surecall_tiny/.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

from surecall.models.training import evaluate as ev
from surecall.models.training import tokenizer as tk
from surecall.models.training.corpus import (
    CorpusConfig,
    code_text,
    generate,
    render_call,
    write_jsonl,
)
from surecall.tools.catalog import hardened_seed_tools

TOOL_FORMAT = "hermes"


@dataclass
class TrainConfig:
    """One training run; `max_steps` and `minutes` both bound it (whichever comes first)."""

    out_dir: str
    minutes: float = 30.0
    max_steps: int = 1_000_000
    seed: int = 0
    num_train_rows: int = 80_000
    num_heldout_rows: int = 200
    vocab_size: int = 3072
    hidden_size: int = 192
    num_layers: int = 4
    num_heads: int = 6
    intermediate_size: int = 512
    batch_size: int = 16
    lr: float = 2e-3
    warmup_steps: int = 50
    eval_minutes: float = 4.0
    num_eval_rows: int = 64
    eval_max_new_tokens: int = 384
    num_threads: int = 1
    init_from: str | None = None  # a checkpoint to continue from (its tokenizer and weights)
    shuffle_seed: int | None = None  # data order; None = seed

    def __post_init__(self) -> None:
        for name in ("max_steps", "num_train_rows", "vocab_size", "hidden_size", "num_layers",
                     "num_heads", "batch_size", "num_eval_rows", "num_threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Invalid {name}: expected a positive int, got {value!r}")
        if not self.minutes > 0:
            raise ValueError(f"Invalid minutes: expected > 0, got {self.minutes!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"Invalid num_heads: expected a divisor of hidden_size "
                             f"{self.hidden_size}, got {self.num_heads}")


def build_tokenizer(rows: list[dict], tools: list[dict], cfg: TrainConfig, out_dir: Path):
    """Train the BPE on system block, user turns, calls and code text; load it back with HF."""
    texts = [tk.system_block(tools)] * 100 + ["assistant\n"] * 100
    texts += ["user\n" + r["messages"][0]["content"] for r in rows]
    texts += [render_call(r["tool"], r["arguments"]) for r in rows]
    texts += code_text(cfg.seed, len(rows) // 8)
    tk.save_hf(tk.train_bpe(texts, cfg.vocab_size), out_dir)
    return AutoTokenizer.from_pretrained(str(out_dir))


def copy_tokenizer(src: Path, out_dir: Path):
    """Reuse a checkpoint's tokenizer files (continued training keeps the vocabulary)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(src / name, out_dir / name)
    return AutoTokenizer.from_pretrained(str(out_dir))


def shared_prefix_ids(tokenizer, tools: list[dict]) -> list[int]:
    """The ids every prompt starts with: BOS, the system turn and the user turn's <|im_start|>."""
    marker = tk.IM_START + "user\n"
    probe = [{"role": "user", "content": "probe"}]
    text = tokenizer.apply_chat_template(probe, tools=tools, tokenize=False)
    text = text[: text.index(marker)] + tk.IM_START
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def encode_rows(tokenizer, rows: list[dict], tools: list[dict]) -> list[tuple[list[int], int]]:
    """Per row: (ids after the shared prefix, number of those that are prompt, not completion)."""
    prefix = shared_prefix_ids(tokenizer, tools)
    tails = [f"user\n{r['messages'][0]['content']}{tk.IM_END}\n{tk.IM_START}assistant\n"
             for r in rows]
    calls = [render_call(r["tool"], r["arguments"]) + tk.IM_END for r in rows]
    tail_ids = tokenizer(tails, add_special_tokens=False)["input_ids"]
    call_ids = tokenizer(calls, add_special_tokens=False)["input_ids"]
    for row, tail in list(zip(rows, tail_ids, strict=True))[:20]:
        full = tokenizer.apply_chat_template(row["messages"], tools=tools,
                                             add_generation_prompt=True, tokenize=False)
        if tokenizer(full, add_special_tokens=False)["input_ids"] != prefix + tail:
            raise RuntimeError("chat template and training encoding disagree")
    return [(t + c, len(t)) for t, c in zip(tail_ids, call_ids, strict=True)]


def prompt_ids(tokenizer, rows: list[dict], tools: list[dict]) -> list[list[int]]:
    texts = [tokenizer.apply_chat_template(r["messages"], tools=tools, add_generation_prompt=True,
                                           tokenize=False) for r in rows]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def make_model(cfg: TrainConfig, tokenizer) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_heads,
        max_position_embeddings=2048, tie_word_embeddings=True, rms_norm_eps=1e-5,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id)
    # The model is trained on Hermes calls; an engine keyed on model_type alone would pick llama3.
    config.surecall_tool_format = TOOL_FORMAT
    return LlamaForCausalLM(config)


def _cache_kwarg(model) -> str:
    # transformers 5.24 renamed `past_key_values=` to `cache=` (the old name goes in 5.40).
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def batch_loss(model, prefix: torch.Tensor, batch: list[tuple[list[int], int]], pad_id: int):
    """Mean completion loss of a batch that shares `prefix` (run once, its cache expanded)."""
    size, width = len(batch), max(len(ids) for ids, _ in batch)
    ids = torch.full((size, width), pad_id, dtype=torch.long)
    labels = torch.full((size, width), -100, dtype=torch.long)
    mask = torch.zeros((size, len(prefix) + width), dtype=torch.long)
    mask[:, : len(prefix)] = 1
    for i, (row, num_prompt) in enumerate(batch):
        ids[i, : len(row)] = torch.tensor(row)
        labels[i, num_prompt: len(row)] = torch.tensor(row[num_prompt:])
        mask[i, len(prefix): len(prefix) + len(row)] = 1
    cache = model.model(input_ids=prefix[None], use_cache=True).past_key_values
    for layer in cache.layers:
        layer.keys = layer.keys.expand(size, -1, -1, -1)
        layer.values = layer.values.expand(size, -1, -1, -1)
    positions = torch.arange(len(prefix), len(prefix) + width)[None].expand(size, width)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, labels=labels,
                use_cache=False, **{_cache_kwarg(model): cache})
    return out.loss


def batches(encoded: list, batch_size: int, rng: random.Random):
    """Endless shuffled batches; rows of similar length go together to save padding."""
    while True:
        order = list(range(len(encoded)))
        rng.shuffle(order)
        chunk = batch_size * 64
        for start in range(0, len(order), chunk):
            group = sorted(order[start:start + chunk], key=lambda i: len(encoded[i][0]))
            group_batches = [group[i:i + batch_size] for i in range(0, len(group), batch_size)]
            rng.shuffle(group_batches)
            for b in group_batches:
                yield [encoded[i] for i in b]


def lr_at(cfg: TrainConfig, step: int, progress: float) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def save_checkpoint(model, tokenizer_dir: Path, heldout: list[dict], out: Path) -> None:
    model.save_pretrained(str(out), safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(tokenizer_dir / name, out / name)
    write_jsonl(heldout, out / "heldout.jsonl")


def quick_eval(model, tokenizer, prompts, rows, validators, seed: int, max_new_tokens: int) -> dict:
    model.eval()
    result = {}
    for temperature in (0.0, 1.0):
        texts = ev.hf_generate(model, tokenizer, prompts, temperature, seed, max_new_tokens)
        scores = [ev.score_call(t, r["tool"], r["arguments"], validators)
                  for t, r in zip(texts, rows, strict=True)]
        result[f"t{temperature:g}"] = ev.summarize(scores)
    model.train()
    return result


def train(cfg: TrainConfig) -> Path:
    # 1. seeds, corpus (held-out prompts never in training) and tokenizer
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.num_threads)
    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tools = hardened_seed_tools()
    heldout = generate(CorpusConfig(cfg.num_heldout_rows, cfg.seed, "heldout"))
    seen = {r["messages"][0]["content"] for r in heldout}
    rows = [r for r in generate(CorpusConfig(cfg.num_train_rows, cfg.seed, "train"))
            if r["messages"][0]["content"] not in seen]
    if cfg.init_from:
        tokenizer = copy_tokenizer(Path(cfg.init_from), out_dir / "tokenizer")
    else:
        tokenizer = build_tokenizer(rows, tools, cfg, out_dir / "tokenizer")
    encoded = encode_rows(tokenizer, rows, tools)
    prefix = torch.tensor(shared_prefix_ids(tokenizer, tools))
    eval_rows = heldout[: cfg.num_eval_rows]
    eval_prompts = prompt_ids(tokenizer, eval_rows, tools)
    validators = ev.make_validators(tools)
    # 2. model and optimizer
    if cfg.init_from:
        model = LlamaForCausalLM.from_pretrained(cfg.init_from, local_files_only=True)
    else:
        model = make_model(cfg, tokenizer)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=[tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(tk.EOS)])
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.01)
    log = open(out_dir / "train_log.jsonl", "a", encoding="utf-8")
    log.write(json.dumps({"config": asdict(cfg), "num_params": model.num_parameters(),
                          "num_train_rows": len(rows), "prefix_tokens": len(prefix)}) + "\n")
    # 3. the loop: time-bounded cosine schedule, periodic checkpoint + eval
    budget_s, start = cfg.minutes * 60, time.perf_counter()
    next_eval, step, running = cfg.eval_minutes * 60, 0, None
    batch_iter = batches(encoded, cfg.batch_size, random.Random(
        cfg.seed if cfg.shuffle_seed is None else cfg.shuffle_seed))
    model.train()
    while True:
        elapsed = time.perf_counter() - start
        done = step >= cfg.max_steps or elapsed >= budget_s
        if done or elapsed >= next_eval:
            ckpt = out_dir / f"ckpt-{step:06d}"
            save_checkpoint(model, out_dir / "tokenizer", heldout, ckpt)
            metrics = quick_eval(model, tokenizer, eval_prompts, eval_rows, validators, cfg.seed,
                                 cfg.eval_max_new_tokens)
            entry = {"step": step, "elapsed_s": round(elapsed, 1), "loss": running,
                     "checkpoint": ckpt.name, "eval": metrics}
            log.write(json.dumps(entry) + "\n")
            log.flush()
            print(json.dumps(entry), flush=True)
            next_eval = (time.perf_counter() - start) + cfg.eval_minutes * 60
        if done:
            break
        progress = max(step / cfg.max_steps, elapsed / budget_s)
        for group in opt.param_groups:
            group["lr"] = lr_at(cfg, step, progress)
        loss = batch_loss(model, prefix, next(batch_iter), tokenizer.pad_token_id)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        running = loss.item() if running is None else 0.95 * running + 0.05 * loss.item()
        step += 1
        if step % 50 == 0:
            print(f"step {step} loss {running:.4f} lr {opt.param_groups[0]['lr']:.2e} "
                  f"elapsed {time.perf_counter() - start:.0f}s", flush=True)
    log.close()
    return out_dir / f"ckpt-{step:06d}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output folder for checkpoints and logs")
    parser.add_argument("--minutes", type=float, default=30.0, help="wall-clock training budget")
    parser.add_argument("--max-steps", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rows", type=int, default=80_000, help="training rows")
    parser.add_argument("--eval-minutes", type=float, default=4.0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--init-from", default=None, help="continue from this checkpoint")
    parser.add_argument("--shuffle-seed", type=int, default=None, help="data order (default: --seed)")
    parser.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    parser.add_argument("--eval-rows", type=int, default=64, help="held-out rows per quick eval")
    args = parser.parse_args(argv)
    cfg = TrainConfig(out_dir=args.out, minutes=args.minutes, max_steps=args.max_steps,
                      seed=args.seed, num_train_rows=args.rows, eval_minutes=args.eval_minutes,
                      num_threads=args.threads, init_from=args.init_from,
                      shuffle_seed=args.shuffle_seed, lr=args.lr, num_eval_rows=args.eval_rows)
    print(train(cfg))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
