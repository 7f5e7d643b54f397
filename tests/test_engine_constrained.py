"""Constrained generation on tiny random-weight Llama and Qwen2 models with the real vocabularies.

Random weights make the model propose arbitrary tokens, which is what stresses the grammar:
every completion must still parse in the model's tool format and satisfy the tool's schema
(keywords the compiler reports as relaxed excepted), inside tight `max_tokens`.
"""

from __future__ import annotations

import json

import jsonschema_rs
import numpy as np
import pytest
import torch
from surecall.calls import tool_name_schema
from surecall.catalog import seed_tools
from surecall.config import EngineConfig, SamplingParams
from surecall.errors import ModelLoadError, RequestError, SurecallError

pytest.importorskip("surecall.grammars.formats", reason="grammars/formats.py has not landed")
pytest.importorskip("surecall.grammars.compile", reason="grammars/compile.py has not landed")


def _tiny(kind: str, width: int, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    shape = dict(vocab_size=width, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**shape)).eval()
    return Qwen2ForCausalLM(Qwen2Config(**shape)).eval()


@pytest.fixture(scope="module")
def llama(data_dir):
    from conftest import cached_vocab
    from surecall.llm import LLM

    vocab = cached_vocab("llama3")
    return LLM(_tiny("llama", vocab.logits_width), tokenizer=vocab, config=EngineConfig(stop_check_interval=4))


@pytest.fixture(scope="module")
def qwen(data_dir):
    from surecall.llm import LLM
    from transformers import AutoTokenizer

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


@pytest.mark.parametrize("batch, extra", [(1, 4), (5, 0), (7, 12)])
def test_llama_seed_catalog_always_parses(llama, batch, extra):
    tools = seed_tools()
    _compiled(llama, tools)
    table = llama.table_for(tools)
    budget = int(table.dist[0]) + extra
    results = llama.generate(
        _prompts(batch), tools=tools,
        sampling=[SamplingParams(max_tokens=budget, seed=11 * i + extra) for i in range(batch)], constrained=True,
    )
    for r in results:
        _assert_valid(r, tools, table)
        assert r.num_tokens <= budget


@pytest.mark.parametrize("seed", range(4))
def test_qwen_chat_prompt_hermes_calls_parse(qwen, seed):
    tools = seed_tools()
    messages = [{"role": "user", "content": f"Look at file number {seed}."}]
    [result] = qwen.generate(messages, tools=tools, sampling=SamplingParams(max_tokens=48, seed=seed, temperature=1.0))
    _assert_valid(result, tools, qwen.table_for(tools))
    assert "<tool_call>" in result.text


def test_shared_tools_sample_parses(llama, shared_tools):
    results = llama.generate(_prompts(6), tools=shared_tools, sampling=SamplingParams(max_tokens=80, seed=5))
    table = llama.table_for(shared_tools)
    for r in results:
        _assert_valid(r, shared_tools, table)


def test_mixed_tools_in_one_batch(llama):
    tools = seed_tools()
    per_row = [[tools[0]], [tools[1], tools[3]], tools, [tools[2]]]
    results = llama.generate(_prompts(4), tools=per_row, sampling=SamplingParams(max_tokens=96, seed=2))
    for r, row_tools in zip(results, per_row, strict=True):
        _assert_valid(r, row_tools, llama.table_for(row_tools))
        assert r.call.name in {t["name"] for t in row_tools}


def test_seeded_constrained_row_ignores_its_batch(llama):
    tools = seed_tools()
    params = SamplingParams(max_tokens=60, seed=77)
    alone = llama.generate([_prompts(1)[0]], tools=[tools], sampling=params)[0]
    batch = llama.generate(
        [_prompts(3)[2], _prompts(1)[0], _prompts(2)[1]], tools=[[tools[1]], tools, [tools[0]]],
        sampling=[SamplingParams(max_tokens=90, seed=1), params, SamplingParams(max_tokens=70, seed=3)],
    )
    assert batch[1].token_ids == alone.token_ids


def _reference_logprobs(llm, prompt, result, table, temperature: float, max_tokens: int):
    """log softmax(mask(logits) / T) from one plain forward pass and the table read on the host."""
    seq = torch.tensor([prompt + result.token_ids])
    with torch.no_grad():
        logits = llm.runner.model(seq).logits[0, len(prompt) - 1 : -1].float()
    state, out = 0, []
    stops = set(int(s) for s in table.stop_ids)
    for step, tok in enumerate(result.token_ids):
        remaining = max_tokens - step
        allowed = np.zeros(logits.shape[1], dtype=bool)
        lo, hi = table.trans_ptr[state], table.trans_ptr[state + 1]
        keep = table.dist[table.trans_next[lo:hi]] <= remaining - 1
        allowed[table.trans_tok[lo:hi][keep]] = True
        if table.accept[state]:
            allowed[list(stops)] = True
        masked = logits[step].masked_fill(~torch.from_numpy(allowed), float("-inf"))
        out.append(float(torch.log_softmax(masked / temperature, dim=-1)[tok]))
        if tok not in stops:
            state = table.next_state(state, tok)
    return out


def test_logprobs_equal_masked_forward_reference(llama):
    tools = seed_tools()[:2]
    prompt = _prompts(1)[0]
    params = SamplingParams(max_tokens=40, seed=9, temperature=0.8, unmasked_logprobs=True)
    [result] = llama.generate([prompt], tools=tools, sampling=params)
    table = llama.table_for(tools)
    ref = _reference_logprobs(llama, prompt, result, table, 0.8, 40)
    assert np.allclose(result.logprobs, ref, atol=2e-4)
    assert all(u <= m + 1e-5 for u, m in zip(result.unmasked_logprobs, result.logprobs, strict=True))


def test_budget_too_small_is_refused(llama):
    tools = seed_tools()
    _compiled(llama, tools)
    need = int(llama.table_for(tools).dist[0])
    with pytest.raises(RequestError, match="the shortest call takes"):
        llama.generate(_prompts(1), tools=tools, sampling=SamplingParams(max_tokens=need - 1))


def _compiled(llm, tools) -> bool:
    llm.generate(_prompts(1), tools=tools, sampling=SamplingParams(max_tokens=200, seed=0))
    return True


def test_bad_row_reports_and_the_rest_decode(llama):
    tools = seed_tools()
    _compiled(llama, tools)
    need = int(llama.table_for(tools).dist[0])
    bad_schema = [{"name": "broken", "parameters": {"type": "object", "properties": {"x": {"type": "nonsense"}}}}]
    results = llama.generate(
        [_prompts(1)[0], [], _prompts(2)[1], _prompts(1)[0]],
        tools=[tools, tools, bad_schema, tools],
        sampling=[SamplingParams(max_tokens=need + 10, seed=1), SamplingParams(), SamplingParams(), SamplingParams(max_tokens=need - 1)],
    )
    assert results[0].call is not None and results[0].error is None
    assert results[1].finish_reason == "error" and "Invalid prompt at row 1" in results[1].error
    assert results[2].finish_reason == "error" and results[2].error
    assert results[3].finish_reason == "error" and "shortest call takes" in results[3].error


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
    results = llama.generate(_prompts(3), tools=tools, sampling=SamplingParams(max_tokens=12, seed=4), constrained=False)
    for r in results:  # a random model does not write a call: each row says why
        assert r.call is None and r.error_kind == "malformed" and r.error.startswith("malformed call")
