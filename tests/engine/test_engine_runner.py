"""Model runner and decode loop on the real trained stories260K checkpoint (token ids in, ids out)."""

from __future__ import annotations

import json

import pytest
import torch

from surecall.config import EngineConfig, SamplingParams
from surecall.core.model_runner import ModelRunner
from surecall.errors import ModelLoadError


@pytest.fixture(scope="module")
def stories(data_dir):
    path = data_dir / "models" / "stories260K"
    if not (path / "hf" / "model.safetensors").is_file():
        pytest.skip(f"stories260K checkpoint not found under {path}")
    return path


@pytest.fixture(scope="module")
def llm(stories):
    from surecall.llm import LLM

    return LLM(stories / "hf", config=EngineConfig())


def test_stories_greedy_matches_llama2c(stories, llm):
    expected = json.loads((stories / "expected_greedy.json").read_text())
    [result] = llm.generate([expected["prompt_ids"]], sampling=SamplingParams(temperature=0, max_tokens=256), constrained=False)
    assert result.token_ids == expected["generated_ids"]
    assert result.finish_reason == "length"
    assert result.num_tokens == 256
    assert set(result.batch_timings) >= {"prefill_s", "decode_s", "sample_s", "advance_s", "compile_s"}
    assert (result.timings["num_tokens"], result.timings["num_steps"]) == (256, 256)
    assert 0 < result.timings["finish_s"] < result.batch_timings["prefill_s"] + result.batch_timings["decode_s"] + 0.01


def test_left_padding_gives_the_same_continuation(stories, llm):
    expected = json.loads((stories / "expected_greedy.json").read_text())["generated_ids"]
    greedy = SamplingParams(temperature=0, max_tokens=24)
    short, long_ = llm.generate([[1], [1, *expected[:5]]], sampling=greedy, constrained=False)
    assert short.token_ids == expected[:24]
    assert long_.token_ids == expected[5:29]


def test_logprobs_match_a_plain_forward_pass(stories, llm):
    params = SamplingParams(temperature=0.7, max_tokens=12, seed=5, unmasked_logprobs=True)
    [result] = llm.generate([[1, 403]], sampling=params, constrained=False)
    seq = torch.tensor([[1, 403, *result.token_ids]])
    with torch.no_grad():
        logits = llm.runner.model(seq).logits[0].float()
    ref = torch.log_softmax(logits[1:-1] / 0.7, dim=-1).gather(1, seq[0, 2:].view(-1, 1)).view(-1)
    assert torch.allclose(torch.tensor(result.logprobs), ref, atol=1e-4)
    assert torch.allclose(torch.tensor(result.unmasked_logprobs), ref, atol=1e-4)


def test_seeded_rows_do_not_depend_on_the_batch(llm):
    params = SamplingParams(temperature=1.0, max_tokens=20, seed=1234)
    alone = llm.generate([[1, 403]], sampling=params, constrained=False)[0]
    others = [SamplingParams(temperature=1.0, max_tokens=20, seed=s) for s in (7, 8, 9)]
    batch = llm.generate([[1, 261, 378], [1, 403], [1], [1, 407]], sampling=[others[0], params, others[1], others[2]], constrained=False)
    assert batch[1].token_ids == alone.token_ids
    assert batch[0].token_ids != batch[1].token_ids or batch[2].token_ids != batch[1].token_ids


def test_different_seeds_differ(llm):
    a, b = llm.generate([[1], [1]], sampling=[SamplingParams(max_tokens=30, seed=1), SamplingParams(max_tokens=30, seed=2)], constrained=False)
    assert a.token_ids != b.token_ids


def test_rows_finish_independently_on_stop_ids(stories):
    from surecall.core import EngineCore

    runner = ModelRunner(stories / "hf")
    expected = json.loads((stories / "expected_greedy.json").read_text())["generated_ids"]
    stop = expected[3]  # greedy row 0 emits it at step 4
    greedy = SamplingParams(temperature=0, max_tokens=40)
    core = EngineCore(runner.model, num_blocks=32)
    first = core.add_request("a", [1], greedy, stop_ids=[stop]).payload
    second = core.add_request("b", [1, *expected[:4]], greedy, stop_ids=[stop]).payload
    core.run_to_completion()
    assert first.generated == expected[:4] and first.finish_reason == "stop" and first.by_stop
    assert len(second.generated) > 4


def test_unknown_model_dir_is_refused(tmp_path):
    with pytest.raises(ModelLoadError, match="not found"):
        ModelRunner(tmp_path / "missing")
    with pytest.raises(ModelLoadError, match="no config.json"):
        ModelRunner(tmp_path)


def test_unknown_architecture_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt_neox"}))
    with pytest.raises(ModelLoadError, match="Unsupported model architecture 'gpt_neox'"):
        ModelRunner(tmp_path)


def test_missing_weights_are_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ModelLoadError, match="no \\*.safetensors"):
        ModelRunner(tmp_path)


def test_not_a_model_is_refused():
    with pytest.raises(ModelLoadError, match="expected a local directory or a transformers model"):
        ModelRunner(object())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"temperature": -1.0}, "Invalid temperature"),
        ({"temperature": float("nan")}, "Invalid temperature"),
        ({"top_k": -2}, "Invalid top_k"),
        ({"top_p": 0.0}, "Invalid top_p"),
        ({"top_p": 1.5}, "Invalid top_p"),
        ({"max_tokens": 0}, "Invalid max_tokens"),
        ({"seed": -1}, "Invalid seed"),
        ({"logprobs": "yes"}, "Invalid logprobs"),
    ],
)
def test_sampling_params_are_validated(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_batch_size": 0}, "Invalid max_batch_size"),
        ({"max_seq_len": 1}, "Invalid max_seq_len"),
    ],
)
def test_engine_config_is_validated(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig(**kwargs)


def test_empty_prompts_are_refused(llm):
    from surecall.errors import RequestError

    with pytest.raises(RequestError, match="Invalid prompt at row 0: expected at least one token id"):
        llm.generate([[]], constrained=False)
    with pytest.raises(RequestError, match="expected at least one prompt"):
        llm.generate([], constrained=False)


def test_text_prompt_without_tokenizer_is_refused(llm):
    from surecall.errors import RequestError

    with pytest.raises(RequestError, match="text needs a tokenizer"):
        llm.generate("Once upon a time", constrained=False)


def test_prompt_past_the_context_is_refused_per_row(llm):
    good, bad = llm.generate([[1], [1] * 500], sampling=SamplingParams(temperature=0, max_tokens=16), constrained=False)
    assert bad.finish_reason == "error" and "exceeds the model's 512 positions" in bad.error
    assert good.num_tokens == 16


def test_default_model_loads_and_its_calls_validate():
    from surecall.llm import LLM
    from surecall.models import default_model_dir
    from surecall.tools.catalog import hardened_seed_tools as seed_tools

    try:
        path = default_model_dir()
    except ModelLoadError as exc:
        pytest.skip(f"the shipped model is not there: {exc}")
    llm = LLM()
    assert llm.default_format == "hermes"  # its chat template writes <tool_call> blocks
    prompts = [json.loads(line)["messages"] for line in (path / "heldout.jsonl").read_text().splitlines()[:3]]
    for r in llm.generate(prompts, tools=seed_tools(), sampling=SamplingParams(temperature=0, max_tokens=96)):
        assert r.call is not None and r.error is None, (r.text, r.error)
        assert r.text.startswith("<tool_call>")
