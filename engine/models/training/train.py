"""Train surecall-tiny: corpus + episodes -> BPE tokenizer -> small Llama -> checkpoints.

`python -m surecall.models.training.train --out DIR --minutes M --seed S` builds the corpus
(single-call rows and multi-turn episodes) and the tokenizer (or reuses `--init-from`'s),
trains a LlamaForCausalLM (loss on assistant turns only) and saves a checkpoint (model,
tokenizer, held-out rows, optimizer state) plus a quick held-out eval every `--eval-minutes`;
`--resume` continues a stopped run from its last checkpoint. Every row shares the same
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
from surecall.models.training.episodes import call_message, generate_episodes, user_texts
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
    num_train_episodes: int = 0  # multi-turn episodes mixed with the single-call rows
    num_heldout_episodes: int = 120
    max_row_tokens: int = 900  # longer training rows (after the shared prefix) are dropped
    resume: bool = False  # continue from the last checkpoint in out_dir (same command otherwise)
    checkpoint_steps: int = 0  # also checkpoint every N steps (0: only every eval_minutes)

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


def build_tokenizer(rows: list[dict], tools: list[dict], cfg: TrainConfig, out_dir: Path,
                    extra_texts: list[str] = ()):
    """Train the BPE on system block, user turns, calls, code and `extra_texts`; load it with HF."""
    texts = [tk.system_block(tools)] * 100 + ["assistant\n"] * 100 + list(extra_texts)
    texts += ["user\n" + r["messages"][0]["content"] for r in rows]
    texts += [render_call(r["tool"], r["arguments"]) for r in rows]
    texts += code_text(cfg.seed, len(rows) // 8)
    tk.save_hf(tk.train_bpe(texts, cfg.vocab_size), out_dir)
    return AutoTokenizer.from_pretrained(str(out_dir))


def copy_tokenizer(src: Path, out_dir: Path):
    """Reuse a checkpoint's vocabulary; the chat template is always this module's current one."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "special_tokens_map.json"):
        shutil.copy(src / name, out_dir / name)
    old = json.loads((src / "tokenizer_config.json").read_text(encoding="utf-8"))
    config = tk.tokenizer_config(old.get("model_max_length", 1024))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    return AutoTokenizer.from_pretrained(str(out_dir))


def shared_prefix_ids(tokenizer, tools: list[dict]) -> list[int]:
    """The ids every prompt starts with: BOS, the system turn and the user turn's <|im_start|>."""
    marker = tk.IM_START + "user\n"
    probe = [{"role": "user", "content": "probe"}]
    text = tokenizer.apply_chat_template(probe, tools=tools, tokenize=False)
    text = text[: text.index(marker)] + tk.IM_START
    return tokenizer(text, add_special_tokens=False)["input_ids"]


_ASSISTANT = tk.IM_START + "assistant\n"


def _segments(text: str) -> list[tuple[str, int]]:
    """(piece, 1 if it is an assistant completion incl. its <|im_end|>, else 0), in order."""
    out, pos = [], 0
    while (i := text.find(_ASSISTANT, pos)) >= 0:
        start = i + len(_ASSISTANT)
        end = text.index(tk.IM_END, start) + len(tk.IM_END)
        out += [(text[pos:start], 0), (text[start:end], 1)]
        pos = end
    if pos < len(text):
        out.append((text[pos:], 0))
    return out


def row_messages(row: dict) -> list[dict]:
    """A single-call corpus row as a conversation: the request and the assistant's call."""
    return row["messages"] + [call_message([(row["tool"], row["arguments"])])]


def encode_conversations(tokenizer, conversations: list[list[dict]],
                         tools: list[dict]) -> list[tuple[list[int], list[int]]]:
    """Per conversation: (ids after the shared prefix, 1 per id of an assistant completion)."""
    prefix = shared_prefix_ids(tokenizer, tools)
    prefix_text = tokenizer.decode(prefix, skip_special_tokens=False)
    texts = [tokenizer.apply_chat_template(c, tools=tools, tokenize=False) for c in conversations]
    if any(not t.startswith(prefix_text) for t in texts):
        raise RuntimeError("a conversation does not start with the shared system prefix")
    segments = [_segments(t[len(prefix_text):]) for t in texts]
    flat = [piece for segs in segments for piece, _ in segs]
    flat_ids = iter(tokenizer(flat, add_special_tokens=False)["input_ids"])
    out = []
    for segs in segments:
        ids, mask = [], []
        for _, is_completion in segs:
            piece = next(flat_ids)
            ids += piece
            mask += [is_completion] * len(piece)
        out.append((ids, mask))
    for text, (ids, _) in list(zip(texts, out, strict=True))[:20]:
        if tokenizer(text, add_special_tokens=False)["input_ids"] != prefix + ids:
            raise RuntimeError("chat template and training encoding disagree")
    return out


def encode_rows(tokenizer, rows: list[dict], tools: list[dict]) -> list[tuple[list[int], list[int]]]:
    """Single-call rows encoded like episodes: (ids after the shared prefix, completion mask)."""
    return encode_conversations(tokenizer, [row_messages(r) for r in rows], tools)


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


def batch_loss(model, prefix: torch.Tensor, batch: list[tuple[list[int], list[int]]], pad_id: int):
    """Mean completion loss of a batch that shares `prefix` (run once, its cache expanded)."""
    size, width = len(batch), max(len(ids) for ids, _ in batch)
    ids = torch.full((size, width), pad_id, dtype=torch.long)
    labels = torch.full((size, width), -100, dtype=torch.long)
    mask = torch.zeros((size, len(prefix) + width), dtype=torch.long)
    mask[:, : len(prefix)] = 1
    for i, (row, completion) in enumerate(batch):
        row_ids = torch.tensor(row)
        ids[i, : len(row)] = row_ids
        labels[i, : len(row)] = torch.where(torch.tensor(completion, dtype=torch.bool), row_ids, -100)
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


STATE_FILE = "train_state.pt"


def save_checkpoint(model, tokenizer_dir: Path, heldout: list[dict], out: Path,
                    heldout_episodes: list[dict] | None = None, state: dict | None = None) -> None:
    model.save_pretrained(str(out), safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(tokenizer_dir / name, out / name)
    write_jsonl(heldout, out / "heldout.jsonl")
    if heldout_episodes:
        write_jsonl(heldout_episodes, out / "heldout_episodes.jsonl")
    if state is not None:  # optimizer, step, clock: what --resume needs (not shipped)
        torch.save(state, out / STATE_FILE)


def last_checkpoint(out_dir: Path) -> Path | None:
    """The newest checkpoint of a run that carries its training state, or None."""
    found = sorted(p for p in out_dir.glob("ckpt-*") if (p / STATE_FILE).is_file())
    return found[-1] if found else None


def quick_eval(model, tokenizer, prompts, turns, validators, seed: int, max_new_tokens: int,
               temperatures=(0.0, 1.0)) -> dict:
    """Free decoding of held-out episode turns; per-kind rates (evaluate.summarize_turns)."""
    model.eval()
    result = {}
    for temperature in temperatures:
        texts = ev.hf_generate(model, tokenizer, prompts, temperature, seed, max_new_tokens)
        scores = [ev.score_turn(t, turn, validators) for t, turn in zip(texts, turns, strict=True)]
        result[f"t{temperature:g}"] = ev.summarize_turns(scores)["all"]
    model.train()
    return result


def eval_turns(episodes: list[dict], count: int) -> list[dict]:
    """`count` held-out turns spread over the turn kinds (round robin), in a fixed order."""
    by_kind = {k: [t for t in ev.episode_turns(episodes) if t["kind"] == k] for k in ev.TURN_KINDS}
    out, i = [], 0
    while len(out) < count and any(i < len(v) for v in by_kind.values()):
        out += [v[i] for v in by_kind.values() if i < len(v)][: count - len(out)]
        i += 1
    return out


def build_data(cfg: TrainConfig, tools: list[dict]):
    """(held-out rows, held-out episodes, training conversations): no held-out request trains."""
    heldout = generate(CorpusConfig(cfg.num_heldout_rows, cfg.seed, "heldout"))
    heldout_eps = generate_episodes(CorpusConfig(cfg.num_heldout_episodes, cfg.seed, "heldout"), tools)
    seen = {r["messages"][0]["content"] for r in heldout}
    seen |= {text for e in heldout_eps for text in user_texts(e)}
    rows = [r for r in generate(CorpusConfig(cfg.num_train_rows, cfg.seed, "train"))
            if r["messages"][0]["content"] not in seen]
    conversations = [row_messages(r) for r in rows]
    if cfg.num_train_episodes:
        episodes = generate_episodes(CorpusConfig(cfg.num_train_episodes, cfg.seed, "train"), tools)
        conversations += [e["messages"] for e in episodes if not seen.intersection(user_texts(e))]
    return heldout, heldout_eps, rows, conversations


def train(cfg: TrainConfig) -> Path:
    # 1. seeds, corpus (held-out prompts never in training) and tokenizer
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.num_threads)
    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tools = hardened_seed_tools()
    heldout, heldout_eps, rows, conversations = build_data(cfg, tools)
    if cfg.init_from:
        tokenizer = copy_tokenizer(Path(cfg.init_from), out_dir / "tokenizer")
    else:
        extra = [m["content"] for c in conversations[len(rows):] for m in c
                 if m["role"] in ("tool", "assistant") and m["content"]]
        tokenizer = build_tokenizer(rows, tools, cfg, out_dir / "tokenizer", extra)
    encoded = [e for e in encode_conversations(tokenizer, conversations, tools)
               if len(e[0]) <= cfg.max_row_tokens]
    prefix = torch.tensor(shared_prefix_ids(tokenizer, tools))
    turns = eval_turns(heldout_eps, cfg.num_eval_rows)
    eval_prompts = prompt_ids(tokenizer, turns, tools)
    validators = ev.make_validators(tools)
    # 2. model and optimizer (or the last checkpoint's, with --resume)
    resume_from = last_checkpoint(out_dir) if cfg.resume else None
    source = str(resume_from) if resume_from else cfg.init_from
    if source:
        model = LlamaForCausalLM.from_pretrained(source, local_files_only=True)
    else:
        model = make_model(cfg, tokenizer)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=[tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(tk.EOS)])
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.01)
    step, running, clock = 0, None, 0.0
    if resume_from:
        state = torch.load(resume_from / STATE_FILE, weights_only=False)
        opt.load_state_dict(state["optimizer"])
        step, running, clock = state["step"], state["running"], state["elapsed_s"]
        torch.set_rng_state(state["torch_rng"])
    log = open(out_dir / "train_log.jsonl", "a", encoding="utf-8")
    log.write(json.dumps({"config": asdict(cfg), "num_params": model.num_parameters(),
                          "num_train_rows": len(encoded), "prefix_tokens": len(prefix),
                          "resumed_from": resume_from.name if resume_from else None}) + "\n")
    # 3. the loop: cosine schedule over steps (and time), periodic checkpoint + eval
    budget_s, start = cfg.minutes * 60, time.perf_counter() - clock
    next_eval = clock + cfg.eval_minutes * 60
    batch_iter = batches(encoded, cfg.batch_size, random.Random(
        cfg.seed if cfg.shuffle_seed is None else cfg.shuffle_seed))
    first_step = step if resume_from else -1  # a resumed run does not re-save its checkpoint
    for _ in range(step):  # the same data order as a run that never stopped
        next(batch_iter)
    model.train()
    while True:
        elapsed = time.perf_counter() - start
        done = step >= cfg.max_steps or elapsed >= budget_s
        due = elapsed >= next_eval or bool(
            cfg.checkpoint_steps and step and step % cfg.checkpoint_steps == 0)
        if (done or due) and step > first_step:
            ckpt = out_dir / f"ckpt-{step:06d}"
            save_checkpoint(model, out_dir / "tokenizer", heldout, ckpt, heldout_eps, {
                "step": step, "running": running, "elapsed_s": elapsed,
                "optimizer": opt.state_dict(), "torch_rng": torch.get_rng_state()})
            metrics = quick_eval(model, tokenizer, eval_prompts, turns, validators, cfg.seed,
                                 cfg.eval_max_new_tokens, temperatures=(1.0,))
            entry = {"step": step, "elapsed_s": round(elapsed, 1), "loss": running,
                     "checkpoint": ckpt.name, "eval": metrics}
            log.write(json.dumps(entry) + "\n")
            log.flush()
            print(json.dumps(entry), flush=True)
            next_eval = elapsed + cfg.eval_minutes * 60
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
        if step % 25 == 0:
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
    parser.add_argument("--eval-rows", type=int, default=64, help="held-out turns per quick eval")
    parser.add_argument("--episodes", type=int, default=0, help="multi-turn training episodes")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--warmup-steps", type=int, default=50)
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    parser.add_argument("--checkpoint-steps", type=int, default=0, help="also checkpoint every N steps")
    args = parser.parse_args(argv)
    cfg = TrainConfig(out_dir=args.out, minutes=args.minutes, max_steps=args.max_steps,
                      seed=args.seed, num_train_rows=args.rows, eval_minutes=args.eval_minutes,
                      num_threads=args.threads, init_from=args.init_from,
                      shuffle_seed=args.shuffle_seed, lr=args.lr, num_eval_rows=args.eval_rows,
                      num_train_episodes=args.episodes, batch_size=args.batch_size,
                      warmup_steps=args.warmup_steps, resume=args.resume,
                      checkpoint_steps=args.checkpoint_steps)
    print(train(cfg))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
