"""Model directories through `LLM`: the families added (Qwen3 dense and MoE, Llama 3.x rope
scaling), a tokenizer that is only a tiktoken `tokenizer.model`, and the shipped tokenizer config.

Every model is a tiny random-weight one built from a config and written by `save_pretrained` into
a tmp dir (with the shipped surecall-tiny tokenizer beside it), then decoded through
`LLM.generate` (the paged engine core), whose logprobs must agree with one plain forward pass over
prompt + output within 1e-4. Nothing is downloaded; the tiktoken test reads the shared Llama-3
ranks (skips without them).
"""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch

from surecall.config import SamplingParams
from surecall.errors import ModelLoadError
from surecall.models import default_model_dir
from surecall.tools.catalog import hardened_seed_tools as seed_tools

TINY_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
ASK = [{"role": "user", "content": "Show me the file src/main.py"}]
SHAPE = dict(vocab_size=3072, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=2048, bos_token_id=1, eos_token_id=4,
             pad_token_id=0)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}


def _model(kind: str):
    import transformers as tf

    torch.manual_seed(0)
    if kind == "qwen3":
        return tf.Qwen3ForCausalLM(tf.Qwen3Config(**SHAPE))
    if kind == "qwen3_moe":
        return tf.Qwen3MoeForCausalLM(tf.Qwen3MoeConfig(**SHAPE, moe_intermediate_size=32, num_experts=4,
                                                        num_experts_per_tok=2))
    return tf.LlamaForCausalLM(tf.LlamaConfig(**SHAPE, rope_scaling=LLAMA3_ROPE))


def _saved(kind: str, path):
    """A model directory: config.json + safetensors from save_pretrained, and the shipped tokenizer."""
    _model(kind).save_pretrained(path)
    for name in TINY_TOKENIZER_FILES:
        shutil.copy(default_model_dir() / name, path / name)
    return path


@pytest.fixture(scope="module", params=["qwen3", "qwen3_moe", "llama3_rope"])
def model_dir(request, tmp_path_factory):
    return request.param, _saved(request.param, tmp_path_factory.mktemp(request.param))


def test_new_families_decode_through_the_paged_core_as_a_plain_forward(model_dir):
    from surecall.llm import LLM

    kind, path = model_dir
    llm = LLM(path)
    assert llm.runner.model_type == ("llama" if kind == "llama3_rope" else kind)
    assert llm.default_format == "hermes"  # the shipped template's <tool_call> syntax
    tools = seed_tools()
    greedy = SamplingParams(temperature=0, max_tokens=llm.min_tokens(tools) + 24)
    [a] = llm.generate(ASK, tools=tools, sampling=greedy)
    assert a.batch_timings["step_mode"] == "paged"
    assert a.call is not None and a.finish_reason == ("stop" if a.ok else "length")
    # three rows of different lengths, sampled: their unmasked logprobs are the plain forward's
    prompts = [a.prompt_token_ids, a.prompt_token_ids[5:], a.prompt_token_ids[-7:]]
    params = [SamplingParams(temperature=0.9, max_tokens=12, seed=i, unmasked_logprobs=True) for i in range(3)]
    for prompt, r in zip(prompts, llm.generate(prompts, sampling=params, constrained=False), strict=True):
        seq = torch.tensor([prompt + r.token_ids])
        with torch.no_grad():
            logits = llm.runner.model(seq).logits[0, len(prompt) - 1 : -1].float()
        ref = torch.log_softmax(logits / 0.9, -1).gather(1, seq[0, len(prompt):, None]).view(-1)
        assert torch.allclose(torch.tensor(r.unmasked_logprobs), ref, atol=1e-4), (torch.tensor(r.unmasked_logprobs) - ref).abs().max()


def test_llama3_rope_scaling_is_loaded_not_dropped(tmp_path):
    from surecall.llm import LLM

    scaled = LLM(_saved("llama3_rope", tmp_path / "scaled")).runner
    rotary = scaled.model.model.rotary_emb
    assert rotary.rope_type == "llama3"
    plain = type(rotary)(type(scaled.config)(**SHAPE))  # the same model without the scaling
    assert plain.rope_type == "default"
    assert not torch.allclose(rotary.inv_freq, plain.inv_freq)  # llama3 lowers the low frequencies


def test_unsupported_family_lists_the_supported_ones(tmp_path):
    from surecall.llm import LLM

    path = _saved("qwen3", tmp_path / "m")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "model_type": "gpt_neox"}))
    with pytest.raises(ModelLoadError, match=r"Unsupported model architecture 'gpt_neox' .*qwen3, qwen3_moe"):
        LLM(path)


# --- tokenizers ------------------------------------------------------------------------------
def _bare_llama(path, vocab_size: int):
    import transformers as tf

    torch.manual_seed(0)
    config = tf.LlamaConfig(vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=1024,
                            tie_word_embeddings=True)
    tf.LlamaForCausalLM(config).save_pretrained(path)
    return path


def test_a_tiktoken_tokenizer_model_loads_with_the_model(data_dir, tmp_path):
    import tiktoken

    from surecall.llm import LLM

    ranks = data_dir / "tokenizers" / "llama3" / "tokenizer.model"
    if not ranks.is_file():
        pytest.skip(f"Llama-3 tiktoken ranks not found at {ranks}")
    path = _bare_llama(tmp_path / "llama3", 128256)
    shutil.copy(ranks, path / "tokenizer.model")  # the directory's only tokenizer file
    llm = LLM(path)
    assert isinstance(llm.tokenizer, tiktoken.Encoding)
    assert llm.count_tokens("hello world") == [15339, 1917]  # Llama 3 (= cl100k) ids
    assert llm.vocab.special_tokens["<|eot_id|>"] in llm.vocab.stop_ids
    tools = seed_tools()[:2]
    [r] = llm.generate("List the files", tools=tools, sampling=SamplingParams(max_tokens=llm.min_tokens(tools) + 4, seed=0))
    assert r.ok and r.finish_reason == "stop", r.text
    assert r.prompt_token_ids == llm.count_tokens("List the files")


def test_an_unreadable_tokenizer_model_fails_at_load_with_the_fix(tmp_path):
    from surecall.llm import LLM

    path = _bare_llama(tmp_path / "broken", 3072)
    (path / "tokenizer.model").write_bytes(b"neither ranks nor a protobuf\x00\x01")
    with pytest.raises(ModelLoadError, match=r"tokenizer.model is not tiktoken ranks, and transformers could not "
                                             r"read it as a SentencePiece model .*; pass tokenizer="):
        LLM(path)


def test_no_tokenizer_at_all_still_loads_for_token_ids(tmp_path):
    from surecall.llm import LLM

    llm = LLM(_bare_llama(tmp_path / "bare", 3072))
    assert llm.tokenizer is None and llm.vocab is None
    [r] = llm.generate([[1, 5, 9]], sampling=SamplingParams(temperature=0, max_tokens=3), constrained=False)
    assert len(r.token_ids) == 3


def test_shipped_tokenizer_knows_the_models_positions():
    """No 'sequence length is longer than the specified maximum' warning below the model's 2048."""
    from transformers import AutoTokenizer

    model_dir = default_model_dir()
    positions = json.loads((model_dir / "config.json").read_text())["max_position_embeddings"]
    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    assert tok.model_max_length == positions == 2048
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        ids = tok.encode("hello world " * 700)
    finally:
        logger.removeHandler(handler)
    assert 1024 < len(ids) < positions
    assert not [m for m in seen if "longer than the specified maximum" in m], seen
