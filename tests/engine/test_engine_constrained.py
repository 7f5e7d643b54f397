"""Constrained generation on tiny random-weight Llama and Qwen2 models with the real vocabularies.

Random weights make the model propose arbitrary tokens, which is what stresses the grammar:
every completion must still parse in the model's tool format and satisfy the tool's schema
(keywords the compiler reports as relaxed excepted), inside tight `max_tokens`.
"""

from __future__ import annotations

import json
import re

import jsonschema_rs
import numpy as np
import pytest
import torch

from surecall.config import EngineConfig, SamplingParams
from surecall.errors import ModelLoadError, RequestError, SurecallError
from surecall.tools.calls import tool_name_schema
from surecall.tools.catalog import hardened_seed_tools as seed_tools

pytest.importorskip("surecall.grammars.compile", reason="grammars/compile.py has not landed")


def _tiny(kind: str, width: int, seed: int = 0):
    """hidden 64, 2 layers; the output head scaled so next-token distributions are peaked like a
    trained model's (logit std ~10) instead of near-uniform, which keeps CPU sampling cheap."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    shape = dict(vocab_size=width, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=False)
    model = (LlamaForCausalLM(LlamaConfig(**shape)) if kind == "llama" else Qwen2ForCausalLM(Qwen2Config(**shape))).eval()
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 1.25)
    return model


@pytest.fixture(scope="module")
def llama(data_dir):
    from conftest import cached_vocab

    from surecall.llm import LLM

    vocab = cached_vocab("llama3")
    return LLM(_tiny("llama", vocab.logits_width), tokenizer=vocab, config=EngineConfig())


@pytest.fixture(scope="module")
def qwen(data_dir):
    from transformers import AutoTokenizer

    from surecall.llm import LLM

    tok = AutoTokenizer.from_pretrained(str(data_dir / "tokenizers" / "qwen2"), local_files_only=True)
    return LLM(_tiny("qwen2", 151936, seed=1), tokenizer=tok)


@pytest.fixture(scope="module")
def shared_tools(data_dir):
    tools = []
    for line in (data_dir / "tools" / "github_mcp_tools.jsonl").read_text().splitlines():
        item = json.loads(line)
        tools.append({"name": item["name"], "description": item["description"], "parameters": item["parameters_json_schema"]})
    rng = np.random.default_rng(0)
    return [tools[i] for i in rng.choice(len(tools), size=6, replace=False)]


def _prompts(n: int, start: int = 128000) -> list[list[int]]:
    return [[start, 1000 + 37 * i, 2000 + i] for i in range(n)]


def _assert_valid(result, tools, table):
    """Parsed, known tool, schema-valid except for keywords the compiler says it relaxed."""
    assert result.call is not None, f"did not parse: {result.text!r} ({result.error})"
    schemas = dict(tool_name_schema(t) for t in tools)
    assert result.call.name in schemas
    relaxed = {kw for _, kw in table.relaxed}
    for err in jsonschema_rs.Draft202012Validator(schemas[result.call.name]).iter_errors(result.call.arguments):
        keyword = str(list(err.schema_path)[-1]) if list(err.schema_path) else ""
        assert keyword in relaxed, f"{err.message} in {result.text!r} (relaxed: {relaxed})"


def _tight(llm, tools, extra: int, seed: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=llm.min_tokens(tools) + extra, seed=seed, **kw)


def test_llama_seed_catalog_parses_at_the_tightest_budget(llama):
    tools = seed_tools()
    params = [_tight(llama, tools, extra, seed) for seed, extra in enumerate((0, 3))]
    for r, p in zip(llama.generate(_prompts(2), tools=tools, sampling=params), params, strict=True):
        _assert_valid(r, tools, llama.compile(tools))
        assert r.num_tokens <= p.max_tokens


@pytest.mark.slow
@pytest.mark.parametrize("batch, extra", [(1, 4), (5, 0), (7, 12), (16, 24)])
def test_llama_seed_catalog_always_parses_many_seeds(llama, batch, extra):
    tools = seed_tools()
    params = [_tight(llama, tools, extra, 11 * i + extra, temperature=1.0 + 0.1 * (i % 3)) for i in range(batch)]
    for r, p in zip(llama.generate(_prompts(batch), tools=tools, sampling=params), params, strict=True):
        _assert_valid(r, tools, llama.compile(tools))
        assert r.num_tokens <= p.max_tokens


def test_qwen_chat_prompt_hermes_call_parses(qwen):
    tools = seed_tools()
    messages = [{"role": "user", "content": "Look at the file."}]
    [result] = qwen.generate(messages, tools=tools, sampling=_tight(qwen, tools, 2, 0))
    _assert_valid(result, tools, qwen.compile(tools))
    assert result.text.startswith("<tool_call>")


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_qwen_hermes_calls_parse_many_seeds(qwen, seed):
    tools = seed_tools()
    messages = [[{"role": "user", "content": f"Look at file number {seed + i}."}] for i in range(3)]
    for result in qwen.generate(messages, tools=tools, sampling=_tight(qwen, tools, 8 * seed, seed)):
        _assert_valid(result, tools, qwen.compile(tools))


@pytest.mark.slow
def test_shared_tools_sample_parses(llama, shared_tools):
    params = [_tight(llama, shared_tools, 10 + i, i) for i in range(6)]
    for r in llama.generate(_prompts(6), tools=shared_tools, sampling=params):
        _assert_valid(r, shared_tools, llama.compile(shared_tools))


def test_mixed_tools_in_one_batch(llama):
    tools = seed_tools()
    per_row = [[tools[0]], [tools[1], tools[3]], [tools[2]]]
    params = [_tight(llama, t, 2, i) for i, t in enumerate(per_row)]
    results = llama.generate(_prompts(3), tools=per_row, sampling=params)
    for r, row_tools in zip(results, per_row, strict=True):
        _assert_valid(r, row_tools, llama.compile(row_tools))
        assert r.call.name in {t["name"] for t in row_tools}


def test_seeded_constrained_row_ignores_its_batch(llama):
    tools = seed_tools()
    params = _tight(llama, tools, 6, 77)
    alone = llama.generate([_prompts(1)[0]], tools=[tools], sampling=params)[0]
    batch = llama.generate(
        [_prompts(3)[2], _prompts(1)[0]], tools=[[tools[1]], tools],
        sampling=[_tight(llama, [tools[1]], 3, 1), params],
    )
    assert batch[1].token_ids == alone.token_ids


def _reference_logprobs(llm, prompt, result, table, temperature: float, max_tokens: int):
    """log softmax(mask(logits) / T) from one plain forward pass and the table read on the host."""
    seq = torch.tensor([prompt + result.token_ids])
    with torch.no_grad():
        logits = llm.runner.model(seq).logits[0, len(prompt) - 1 : -1].float()
    from surecall.grammars.walk import kept

    state, counter, out = 0, 0, []
    stops = set(int(s) for s in table.stop_ids)
    for step, tok in enumerate(result.token_ids):
        remaining = max_tokens - step
        allowed = np.zeros(logits.shape[1], dtype=bool)
        toks, nexts = table.transitions(state)
        keep = kept(table, state, counter, toks, nexts, remaining)
        allowed[toks[keep]] = True
        if table.accept[state]:
            allowed[list(stops)] = True
        masked = logits[step].masked_fill(~torch.from_numpy(allowed), float("-inf"))
        out.append(float(torch.log_softmax(masked / temperature, dim=-1)[tok]))
        if tok not in stops:
            state, counter = table.next_state(state, tok), table.next_counter(state, counter, tok)
    return out


def test_logprobs_equal_masked_forward_reference(llama):
    tools = seed_tools()[:2]
    prompt = _prompts(1)[0]
    params = _tight(llama, tools, 5, 9, temperature=0.8, unmasked_logprobs=True)
    [result] = llama.generate([prompt], tools=tools, sampling=params)
    ref = _reference_logprobs(llama, prompt, result, llama.compile(tools), 0.8, params.max_tokens)
    assert np.allclose(result.logprobs, ref, atol=2e-4)
    assert all(u <= m + 1e-5 for u, m in zip(result.unmasked_logprobs, result.logprobs, strict=True))


def test_budget_too_small_is_refused(llama):
    tools = seed_tools()
    with pytest.raises(RequestError, match="the shortest call takes"):
        llama.generate(_prompts(1), tools=tools, sampling=SamplingParams(max_tokens=llama.min_tokens(tools) - 1))


def test_bad_row_reports_and_the_rest_decode(llama):
    tools = seed_tools()
    need = llama.min_tokens(tools)
    bad_schema = [{"name": "broken", "parameters": {"type": "object", "properties": {"x": {"type": "nonsense"}}}}]
    results = llama.generate(
        [_prompts(1)[0], [], _prompts(2)[1], _prompts(1)[0]],
        tools=[tools, tools, bad_schema, tools],
        sampling=[SamplingParams(max_tokens=need + 1, seed=1), SamplingParams(), SamplingParams(), SamplingParams(max_tokens=need - 1)],
    )
    assert results[0].call is not None and results[0].error is None
    assert results[1].finish_reason == "error" and "Invalid prompt at row 1" in results[1].error
    assert results[2].finish_reason == "error" and results[2].error
    assert results[3].finish_reason == "error" and "shortest call takes" in results[3].error


def test_a_decode_failure_is_the_rows_error_not_a_call(llama, monkeypatch):
    import surecall.core.engine as core_engine
    from surecall.kernels import sample as kernel_sample

    def nothing_allowed(*args, **kwargs):  # what the sampler returns for a row whose mask is empty
        out = kernel_sample(*args, **kwargs)
        out.tokens.fill_(-1)
        return out

    monkeypatch.setattr(core_engine, "sample", nothing_allowed)
    tools = seed_tools()
    result = llama.generate(_prompts(1), tools=tools, sampling=SamplingParams(max_tokens=llama.min_tokens(tools) + 2))[0]
    assert result.finish_reason == "error" and result.error_kind == "decode" and result.call is None
    assert re.search(r"Decode error at row 0: at step 0, the grammar mask of state \d+ allows no token", result.error)


def test_tools_that_fail_to_compile_raise_when_alone(llama):
    bad_schema = [{"name": "broken", "parameters": {"type": "object", "properties": {"x": {"type": "nonsense"}}}}]
    with pytest.raises(SurecallError, match="nonsense|type"):
        llama.generate(_prompts(1), tools=bad_schema, sampling=SamplingParams(max_tokens=50))


def test_constrained_without_tools_is_refused(llama):
    with pytest.raises(RequestError, match="needs at least one tool"):
        llama.generate(_prompts(1), sampling=SamplingParams(max_tokens=10))


def test_unknown_tool_format_is_refused(llama):
    with pytest.raises(RequestError, match="Invalid tool_format"):
        llama.generate(_prompts(1), tools=seed_tools(), tool_format="no-such-format")


def test_tokenizer_wider_than_the_model_is_refused(data_dir):
    from conftest import cached_vocab

    from surecall.llm import LLM

    with pytest.raises(ModelLoadError, match="Tokenizer does not match the model: 128256 token ids"):
        LLM(_tiny("llama", 32000), tokenizer=cached_vocab("llama3"))


def test_free_mode_reports_malformed_calls(llama):
    tools = seed_tools()
    results = llama.generate(_prompts(2), tools=tools, sampling=SamplingParams(max_tokens=6, seed=4), constrained=False)
    for r in results:  # a random model does not write a call: each row says why
        assert r.call is None and r.error_kind == "malformed" and r.error.startswith("malformed call")


def test_mistral_forces_its_control_token(data_dir):
    from conftest import cached_vocab
    from transformers import MistralConfig, MistralForCausalLM

    from surecall.llm import LLM

    vocab = cached_vocab("mistral-v0.3")
    if "[TOOL_CALLS]" not in vocab.special_tokens:
        pytest.skip("this Mistral vocabulary has no [TOOL_CALLS] token")
    torch.manual_seed(0)
    model = MistralForCausalLM(MistralConfig(vocab_size=vocab.logits_width, hidden_size=64, intermediate_size=128,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)).eval()
    llm = LLM(model, tokenizer=vocab)
    tools = seed_tools()
    assert llm.default_format == "mistral"
    results = llm.generate([[1, 3, 100], [1, 3, 200]], tools=tools, sampling=_tight(llm, tools, 3, 1))
    for r in results:
        assert r.token_ids[0] == vocab.special_tokens["[TOOL_CALLS]"] and r.logprobs[0] == 0.0
        _assert_valid(r, tools, llm.compile(tools))


# --- the plain path (a transformers version the cache adapter was not tested with) -----------
@pytest.fixture(scope="module")
def llama_plain(llama):
    from surecall.core import kv_cache
    from surecall.llm import LLM

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kv_cache, "_warned_versions", set())
        mp.setattr("transformers.__version__", "9.0.0")
        plain = LLM(llama.runner.model, tokenizer=llama.vocab)
        with pytest.warns(RuntimeWarning, match=r"transformers 9\.0\.0 is outside .* falling back to plain decoding"):
            plain.engine(rows=8, tokens_per_row=256)  # built now, under the unknown version, and kept
    return plain


@pytest.mark.parametrize("batch, extra", [(3, 0), (6, 9)])
def test_plain_path_calls_parse_at_tight_budgets(llama_plain, batch, extra):
    tools = seed_tools()
    params = [_tight(llama_plain, tools, extra, 5 * i + extra, temperature=1.0 + 0.1 * (i % 3)) for i in range(batch)]
    results = llama_plain.generate(_prompts(batch), tools=tools, sampling=params)
    for r, p in zip(results, params, strict=True):
        assert r.batch_timings["step_mode"] == "plain" and r.batch_timings["prefix_hit_rate"] == 0.0
        _assert_valid(r, tools, llama_plain.compile(tools))
        assert r.num_tokens <= p.max_tokens


def test_plain_path_logprobs_and_batch_independence(llama, llama_plain):
    tools = seed_tools()[:2]
    prompt = _prompts(1)[0]
    params = _tight(llama_plain, tools, 5, 9, temperature=0.8)
    [alone] = llama_plain.generate([prompt], tools=tools, sampling=params)
    ref = _reference_logprobs(llama_plain, prompt, alone, llama_plain.compile(tools), 0.8, params.max_tokens)
    assert np.allclose(alone.logprobs, ref, atol=2e-4)
    batch = llama_plain.generate([_prompts(3)[2], prompt, _prompts(2)[1]], tools=[[seed_tools()[2]], tools, tools],
                                 sampling=[_tight(llama_plain, [seed_tools()[2]], 3, 1), params, params])
    assert batch[1].token_ids == alone.token_ids
    paged = llama.generate([prompt], tools=tools, sampling=params)[0]
    assert paged.batch_timings["step_mode"] == "paged" and paged.token_ids == alone.token_ids


def test_counted_length_bounds_hold_in_sampled_calls(llama):
    """maxLength 60 used to be relaxed (4 of 16 calls broke it); now a counter enforces it."""
    tools = [{"name": "note", "description": "Write a note.", "parameters": {
        "type": "object", "properties": {"text": {"type": "string", "minLength": 5, "maxLength": 60}},
        "required": ["text"], "additionalProperties": False}}]
    table = llama.compile(tools)
    assert table.relaxed == [] and table.has_counts
    params = [_tight(llama, tools, extra, seed, temperature=1.2) for seed, extra in enumerate([0, 1, 40, 60] * 4)]
    lengths = []
    for r, p in zip(llama.generate(_prompts(16), tools=tools, sampling=params), params, strict=True):
        _assert_valid(r, tools, table)
        assert r.num_tokens <= p.max_tokens
        lengths.append(len(r.call.arguments["text"]))
    assert min(lengths) >= 5 and max(lengths) <= 60 and max(lengths) > min(lengths)
