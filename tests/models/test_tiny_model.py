"""surecall-tiny: the shipped files load offline, greedy output is pinned, training code trains."""

from __future__ import annotations

import json

import pytest
import torch

from surecall.errors import ModelLoadError
from surecall.models import REQUIRED_FILES, default_heldout_path, default_model_dir, model_dir
from surecall.models.training import train as tr
from surecall.models.training.corpus import CorpusConfig, generate, read_jsonl
from surecall.models.training.evaluate import make_validators, parse_call
from surecall.tools.catalog import hardened_seed_tools as seed_tools

transformers = pytest.importorskip("transformers")

# Recorded from the shipped checkpoint (CPU, fp32, greedy); regenerate only when retraining.
GOLDEN_PROMPT = "Show 20 lines of `src/app/main.py` starting at line 40"
GOLDEN_IDS: list[int] = [32, 274, 34, 203, 271, 288, 262, 261, 400, 267, 261, 301, 262, 294, 295, 262, 261, 702, 19, 749, 857, 19, 851, 18, 346, 267, 261, 513, 262, 338, 16, 261, 349, 262, 338, 298, 203, 299, 274, 34, 4]


@pytest.fixture(scope="module")
def shipped():
    path = default_model_dir()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True)
    return tokenizer, model.eval()


def _prompt_ids(tokenizer, content: str) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": content}],
                                         tools=seed_tools(), add_generation_prompt=True,
                                         tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _greedy(model, ids: list[int], max_new_tokens: int = 64) -> list[int]:
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                             dtype=torch.long), do_sample=False, max_new_tokens=max_new_tokens)
    return out[0, len(ids):].tolist()


def test_shipped_files_exist_and_config_is_a_small_llama():
    path = default_model_dir()
    for name in REQUIRED_FILES:
        assert (path / name).is_file(), name
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "llama" and config["tie_word_embeddings"] is True
    assert config["surecall_tool_format"] == "hermes"
    assert (path / "model.safetensors").stat().st_size < 20_000_000


def test_missing_model_raises_a_clear_error():
    with pytest.raises(ModelLoadError, match="lacks config.json"):
        model_dir("no_such_model")


def test_chat_template_presents_every_tool_and_accepts_openai_style_tools(shipped):
    tokenizer, _ = shipped
    messages = [{"role": "user", "content": "run the tests"}]
    bare = tokenizer.apply_chat_template(messages, tools=seed_tools(), add_generation_prompt=True,
                                         tokenize=False)
    wrapped = tokenizer.apply_chat_template(
        messages, tools=[{"type": "function", "function": t} for t in seed_tools()],
        add_generation_prompt=True, tokenize=False)
    assert bare == wrapped
    assert bare.startswith("<|bos|><|im_start|>system\n")
    assert bare.endswith("<|im_start|>user\nrun the tests<|im_end|>\n<|im_start|>assistant\n")
    for tool in seed_tools():
        assert json.dumps(tool["parameters"], ensure_ascii=False) in bare


def test_stop_ids_and_special_tokens(shipped):
    tokenizer, model = shipped
    stop = model.generation_config.eos_token_id
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in stop
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|pad|>"
    assert model.config.vocab_size == len(tokenizer)


def test_golden_greedy_output(shipped):
    tokenizer, model = shipped
    got = _greedy(model, _prompt_ids(tokenizer, GOLDEN_PROMPT))
    assert got == GOLDEN_IDS, tokenizer.decode(got)
    text = tokenizer.decode(got, skip_special_tokens=True)
    assert parse_call(text)[0] == "file_view"


def test_heldout_rows_ship_and_validate():
    rows = read_jsonl(default_heldout_path())
    assert len(rows) >= 150
    assert {r["tool"] for r in rows} == {t["name"] for t in seed_tools()}
    validators = make_validators(seed_tools())
    assert all(validators[r["tool"]].is_valid(r["arguments"]) for r in rows)


@pytest.fixture(scope="module")
def tiny_setup():
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(default_model_dir()),
                                                           local_files_only=True)
    cfg = tr.TrainConfig(out_dir="unused", hidden_size=32, num_layers=2, num_heads=2,
                         intermediate_size=64, batch_size=8, lr=1e-2, warmup_steps=1)
    rows = generate(CorpusConfig(8, seed=1))
    encoded = tr.encode_rows(tokenizer, rows, seed_tools())
    prefix = torch.tensor(tr.shared_prefix_ids(tokenizer, seed_tools()))
    return tokenizer, cfg, encoded, prefix


def test_prefix_cached_loss_equals_the_full_sequence_loss(tiny_setup):
    tokenizer, cfg, encoded, prefix = tiny_setup
    torch.manual_seed(0)
    model = tr.make_model(cfg, tokenizer)
    cached = tr.batch_loss(model, prefix, encoded[:2], tokenizer.pad_token_id)
    losses = []
    for ids, num_prompt in encoded[:2]:
        full = torch.tensor([prefix.tolist() + ids])
        labels = full.clone()
        labels[0, : len(prefix) + num_prompt] = -100
        out = model(input_ids=full, labels=labels)
        losses.append((out.loss * (len(ids) - num_prompt), len(ids) - num_prompt))
    expected = sum(loss for loss, _ in losses) / sum(n for _, n in losses)
    assert torch.allclose(cached, expected, rtol=1e-4)


def test_a_few_training_steps_lower_the_loss(tiny_setup):
    tokenizer, cfg, encoded, prefix = tiny_setup
    torch.manual_seed(0)
    model = tr.make_model(cfg, tokenizer)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    losses = []
    for _ in range(15):
        loss = tr.batch_loss(model, prefix, encoded, tokenizer.pad_token_id)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


@pytest.mark.slow
def test_train_end_to_end_writes_a_loadable_checkpoint(tmp_path):
    cfg = tr.TrainConfig(out_dir=str(tmp_path), max_steps=3, num_train_rows=300,
                         num_heldout_rows=4, vocab_size=400, hidden_size=32, num_layers=1,
                         num_heads=2, intermediate_size=64, batch_size=4, num_eval_rows=2,
                         eval_max_new_tokens=8)
    ckpt = tr.train(cfg)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt), local_files_only=True)
    assert model.config.hidden_size == 32
    assert len(read_jsonl(ckpt / "heldout.jsonl")) == 4
    log = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert log[-1]["step"] == 3 and "t1" in log[-1]["eval"]


@pytest.mark.parametrize("kwargs,match", [
    ({"batch_size": 0}, "Invalid batch_size"),
    ({"minutes": 0}, "Invalid minutes"),
    ({"hidden_size": 30, "num_heads": 4}, "Invalid num_heads"),
])
def test_train_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tr.TrainConfig(out_dir="x", **kwargs)

