"""surecall-tiny: the shipped files load offline, greedy output is pinned, episodes decode, training trains."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from surecall.errors import ModelLoadError
from surecall.models import (
    REQUIRED_FILES,
    default_heldout_episodes_path,
    default_heldout_path,
    default_model_dir,
    model_dir,
)
from surecall.models.training import evaluate as ev
from surecall.models.training import tokenizer as tk
from surecall.models.training import train as tr
from surecall.models.training.corpus import CorpusConfig, generate, read_jsonl
from surecall.models.training.episodes import (
    KINDS,
    call_message,
    generate_episodes,
    text_message,
    tool_message,
)
from surecall.models.training.evaluate import make_validators, parse_call
from surecall.tools.catalog import hardened_seed_tools as seed_tools

transformers = pytest.importorskip("transformers")

# A fixed episode: a request, the call it got, the tool's result. Recorded from the shipped
# checkpoint (CPU, fp32, greedy, 64 new tokens); regenerate only when retraining.
GOLDEN_EPISODE = [
    {"role": "user", "content": "Find `def main` and open the first file that matches"},
    call_message([("grep_search", {"pattern": "def main"})]),
    tool_message("grep_search", "src/app/main.py:12: def main():\n[1 match(es) in 9 file(s) searched]"),
]
GOLDEN_FIRST_IDS: list[int] = [32, 274, 34, 203, 271, 288, 262, 261, 420, 267, 261, 301, 262, 294, 342, 262, 261, 411,
                               525, 318, 203, 299, 274, 34, 4]
# (greedy, it answers in text here instead of opening the file: the recorded behaviour, not the gold)
GOLDEN_NEXT_IDS: list[int] = [42, 83, 89, 307, 338, 943, 12, 277, 13, 31, 454, 999, 488, 370, 280, 702, 19, 386, 18,
                              346, 68, 821, 520, 338, 18, 4]
# tiny_eval.py's parse rate of free calls on held-out episode turns at T=1.0 (the shipped model)
RECORDED_T1_PARSE_RATE = 0.762


@pytest.fixture(scope="module")
def shipped():
    path = default_model_dir()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True)
    return tokenizer, model.eval()


def _prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tools=seed_tools(), add_generation_prompt=True,
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


def test_shipped_chat_template_is_the_training_one(shipped):
    tokenizer, _ = shipped
    assert tokenizer.chat_template == tk.CHAT_TEMPLATE


def _render(tokenizer, messages, **kw) -> str:
    return tokenizer.apply_chat_template(messages, tools=seed_tools(), tokenize=False, **kw)


def test_chat_template_renders_parallel_calls_and_grouped_tool_results_qwen_style(shipped):
    tokenizer, _ = shipped
    messages = [{"role": "user", "content": "two things"},
                call_message([("file_view", {"path": "a.py"}), ("bash_execute", {"command": "ls"})]),
                tool_message("file_view", "1\tx"), tool_message("bash_execute", "[exit status 0]"),
                text_message("Both done.")]
    text = _render(tokenizer, messages)
    tail = text[text.index("<|im_start|>user\ntwo things"):]
    assert tail == (
        "<|im_start|>user\ntwo things<|im_end|>\n<|im_start|>assistant\n"
        '<tool_call>\n{"name": "file_view", "arguments": {"path": "a.py"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "bash_execute", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n1\tx\n</tool_response>\n"
        "<tool_response>\n[exit status 0]\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nBoth done.<|im_end|>\n")


def test_chat_template_keeps_string_arguments_and_text_before_calls(shipped):
    tokenizer, _ = shipped
    message = {"role": "assistant", "content": "Looking.", "tool_calls": [
        {"type": "function", "function": {"name": "grep_search", "arguments": '{"pattern": "é"}'}}]}
    text = _render(tokenizer, [{"role": "user", "content": "q"}, message])
    assert text.endswith('<|im_start|>assistant\nLooking.\n<tool_call>\n{"name": "grep_search", '
                         '"arguments": {"pattern": "é"}}\n</tool_call><|im_end|>\n')


def test_golden_greedy_output_on_a_fixed_episode(shipped):
    tokenizer, model = shipped
    first = _greedy(model, _prompt_ids(tokenizer, GOLDEN_EPISODE[:1]))
    assert first == GOLDEN_FIRST_IDS, tokenizer.decode(first)
    after_result = _greedy(model, _prompt_ids(tokenizer, GOLDEN_EPISODE))
    assert after_result == GOLDEN_NEXT_IDS, tokenizer.decode(after_result)
    assert parse_call(tokenizer.decode(first, skip_special_tokens=True))[0] == "grep_search"


def test_32_heldout_turns_give_text_answers_calls_after_results_and_the_recorded_parse_rate(shipped):
    tokenizer, model = shipped
    turns = tr.eval_turns(read_jsonl(default_heldout_episodes_path()), 32)
    prompts = tr.prompt_ids(tokenizer, turns, seed_tools())
    texts = ev.hf_generate(model, tokenizer, prompts, 1.0, seed=0, max_new_tokens=320)
    scores = [ev.score_turn(t, turn, make_validators(seed_tools())) for t, turn in zip(texts, turns)]
    assert any(not s.wants_call and s.is_right_tool for s in scores), texts
    assert any(s.kind == "call_after_result" and s.is_parsed for s in scores), texts
    calls = [s for s in scores if s.wants_call]
    rate, p = sum(s.is_parsed for s in calls) / len(calls), RECORDED_T1_PARSE_RATE
    # three binomial standard deviations at this sample size, plus one sample of slack
    tolerance = 3 * (p * (1 - p) / len(calls)) ** 0.5 + 1 / len(calls)
    assert abs(rate - p) <= tolerance, (rate, p, len(calls))


def test_heldout_rows_ship_and_validate():
    rows = read_jsonl(default_heldout_path())
    assert len(rows) >= 150
    assert {r["tool"] for r in rows} == {t["name"] for t in seed_tools()}
    validators = make_validators(seed_tools())
    assert all(validators[r["tool"]].is_valid(r["arguments"]) for r in rows)


def test_heldout_episodes_ship_with_every_kind_and_valid_calls():
    episodes = read_jsonl(default_heldout_episodes_path())
    assert len(episodes) >= 100 and {e["kind"] for e in episodes} == set(KINDS)
    turns = ev.episode_turns(episodes)
    assert {t["kind"] for t in turns} == set(ev.TURN_KINDS)
    validators = make_validators(seed_tools())
    for turn in turns:
        for call in turn["gold"].get("tool_calls") or []:
            assert validators[call["function"]["name"]].is_valid(call["function"]["arguments"])


@pytest.fixture(scope="module")
def tiny_setup():
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(default_model_dir()),
                                                           local_files_only=True)
    cfg = tr.TrainConfig(out_dir="unused", hidden_size=32, num_layers=2, num_heads=2,
                         intermediate_size=64, batch_size=8, lr=1e-2, warmup_steps=1)
    rows = generate(CorpusConfig(4, seed=1))
    episodes = generate_episodes(CorpusConfig(4, seed=1), seed_tools())
    encoded = tr.encode_rows(tokenizer, rows, seed_tools()) + tr.encode_conversations(
        tokenizer, [e["messages"] for e in episodes], seed_tools())
    prefix = torch.tensor(tr.shared_prefix_ids(tokenizer, seed_tools()))
    return tokenizer, cfg, encoded, prefix


def test_prefix_cached_loss_equals_the_full_sequence_loss(tiny_setup):
    tokenizer, cfg, encoded, prefix = tiny_setup
    torch.manual_seed(0)
    model = tr.make_model(cfg, tokenizer)
    batch = [encoded[0], encoded[-1]]  # a single call and a multi-turn episode
    cached = tr.batch_loss(model, prefix, batch, tokenizer.pad_token_id)
    losses = []
    for ids, mask in batch:
        full = torch.tensor([prefix.tolist() + ids])
        labels = torch.tensor([[-100] * len(prefix) + [i if m else -100 for i, m in zip(ids, mask)]])
        out = model(input_ids=full, labels=labels)
        losses.append((out.loss * (sum(mask[1:])), sum(mask[1:])))
    expected = sum(loss for loss, _ in losses) / sum(n for _, n in losses)
    assert torch.allclose(cached, expected, rtol=1e-4)


def test_the_loss_mask_covers_exactly_the_assistant_turns(tiny_setup):
    tokenizer, _, _, _ = tiny_setup
    episode = [{"role": "user", "content": "Run `ls`"}, call_message([("bash_execute", {"command": "ls"})]),
               tool_message("bash_execute", "a.py\n[exit status 0]"),
               text_message("The command succeeded (exit status 0).")]
    (ids, mask), = tr.encode_conversations(tokenizer, [episode], seed_tools())
    learned = tokenizer.decode([i for i, m in zip(ids, mask) if m])
    assert learned == ('<tool_call>\n{"name": "bash_execute", "arguments": {"command": "ls"}}\n'
                       "</tool_call><|im_end|>The command succeeded (exit status 0).<|im_end|>")


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


def _tiny_run(out_dir, **kw) -> tr.TrainConfig:
    return tr.TrainConfig(out_dir=str(out_dir), max_steps=4, minutes=1e4, num_train_rows=200,
                          num_train_episodes=60, num_heldout_rows=4, num_heldout_episodes=4,
                          vocab_size=400, hidden_size=32, num_layers=1, num_heads=2,
                          intermediate_size=64, batch_size=4, num_eval_rows=2,
                          eval_max_new_tokens=4, eval_minutes=1e4, checkpoint_steps=2, **kw)


@pytest.mark.slow
def test_a_stopped_run_resumes_to_the_same_weights(tmp_path):
    from safetensors.torch import load_file

    straight = tr.train(_tiny_run(tmp_path / "a"))
    # a run stopped after its step-2 checkpoint: only that checkpoint (and the tokenizer) survive
    stopped = tmp_path / "b"
    stopped.mkdir()
    shutil.copytree(tmp_path / "a" / "tokenizer", stopped / "tokenizer")
    shutil.copytree(tmp_path / "a" / "ckpt-000002", stopped / "ckpt-000002")
    resumed = tr.train(_tiny_run(stopped, resume=True))
    assert resumed.name == straight.name == "ckpt-000004"
    a, b = load_file(straight / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    log = [json.loads(line) for line in (stopped / "train_log.jsonl").read_text().splitlines()]
    assert log[0]["resumed_from"] == "ckpt-000002" and [e["step"] for e in log[1:]] == [4]


@pytest.mark.parametrize("kwargs,match", [
    ({"batch_size": 0}, "Invalid batch_size"),
    ({"minutes": 0}, "Invalid minutes"),
    ({"hidden_size": 30, "num_heads": 4}, "Invalid num_heads"),
])
def test_train_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tr.TrainConfig(out_dir="x", **kwargs)

