"""Output modes through LLM.generate: tiny random-weight models (Qwen2.5-, Llama-3- and
Mistral-vocabularies) and the shipped model, many seeds, tight max_tokens.

The random models' heads get a bias on the call-start token (and the end token) so that both
text and calls come out over a few seeds; the grammar, not the bias, decides what is legal.
Every emitted call parses and validates, parallel_tool_calls=False never yields two calls, a
named tool is always the one called, the stream merges into the result byte for byte, and the
call-start token never shows up in text nor inside arguments.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from surecall.config import EngineConfig, SamplingParams
from surecall.errors import RequestError
from surecall.modes import OutputReader, merge_deltas
from surecall.tools.catalog import hardened_seed_tools

pytest.importorskip("transformers")

TOOLS = hardened_seed_tools()
QWEN25_CONTROLS = {"<tool_call>": 151657, "</tool_call>": 151658}  # Qwen2.5's ids for them


def _tiny(width: int, bias: dict[int, float], seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    shape = dict(vocab_size=width, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=False)
    model = LlamaForCausalLM(LlamaConfig(**shape)).eval()
    head = torch.nn.Linear(64, width, bias=True)
    with torch.no_grad():
        head.weight.normal_(0.0, 1.25)
        head.bias.zero_()
        for tid, value in bias.items():
            head.bias[tid] = value
    model.lm_head = head
    return model


def _qwen25_vocab():
    """The shared Qwen2 vocabulary plus Qwen2.5's <tool_call> / </tool_call> control tokens."""
    from conftest import cached_vocab

    base = cached_vocab("qwen2")
    size = max(QWEN25_CONTROLS.values()) + 1
    return replace(base, token_bytes=tuple(base.token_bytes) + (b"",) * (size - base.vocab_size),
                   special_ids=frozenset(set(base.special_ids) | set(QWEN25_CONTROLS.values())),
                   special_tokens={**base.special_tokens, **QWEN25_CONTROLS}, name="qwen2.5-like")


@pytest.fixture(scope="module")
def models(data_dir):
    from conftest import cached_vocab

    from surecall.llm import LLM

    config = EngineConfig()
    qwen = _qwen25_vocab()
    llama, mistral = cached_vocab("llama3"), cached_vocab("mistral-v0.3")
    brace = llama.token_bytes.index(b"{")
    return {
        "hermes": LLM(_tiny(qwen.logits_width, {151657: 40.0, 151658: 40.0, 151645: 38.0}), tokenizer=qwen, config=config),
        "json": LLM(_tiny(llama.logits_width, {brace: 36.0, 128009: 38.0}, seed=1), tokenizer=llama, config=config),
        "llama3": LLM(_tiny(llama.logits_width, {brace: 36.0, 128009: 38.0}, seed=2), tokenizer=llama, config=config),
        "mistral": LLM(_tiny(mistral.logits_width, {5: 34.0, 2: 34.0}, seed=3), tokenizer=mistral, config=config),
        # the call start biased less: the first token is as often a JSON answer's `{` as [TOOL_CALLS]
        "mistral-answer": LLM(_tiny(mistral.logits_width, {5: 20.0, 2: 30.0}, seed=5), tokenizer=mistral, config=config),
        # the end token unbiased (after a call, ending and starting another are about even), `"` biased
        # (strings end early, leaving budget for a second call)
        "hermes-parallel": LLM(_tiny(qwen.logits_width, {151657: 40.0, 151658: 40.0, qwen.token_bytes.index(b'"'): 38.0},
                                     seed=4), tokenizer=qwen, config=config),
    }


FORMATS = ["hermes", "json", "llama3", "mistral"]
CONTROL = {"hermes": 151657, "mistral": 5}


def _prompts(n: int, offset: int = 0) -> list[list[int]]:
    return [[1000 + 37 * (i + offset), 2000 + i + offset] for i in range(n)]


def _run(llm, fmt, n, max_tokens, offset=0, **mode):
    params = [SamplingParams(max_tokens=max_tokens, seed=1000 * offset + i) for i in range(n)]
    return llm.generate(_prompts(n, offset), tools=TOOLS, sampling=params, tool_format=fmt, **mode), params


def _shortest(llm, fmt, **mode) -> int:
    """Fewest tokens of one call in this mode (the budget a required row needs)."""
    from surecall.grammars.tool_modes import compile_mode
    from surecall.modes import mode_grammar, mode_spec
    from surecall.tools.calls import tool_name_schema

    named = [tool_name_schema(t) for t in TOOLS]
    spec = mode_spec(mode.get("tool_choice"), mode.get("parallel_tool_calls"), None, [n for n, _ in named])
    return int(compile_mode(mode_grammar(spec, named, fmt, llm.vocab), llm.vocab, llm.config.grammar_options).dist[0])


def _check(result, params, fmt, llm):
    """Calls parse and validate; finish_reason and the token budget hold; no call start in text or arguments."""
    assert result.error is None, (result.error, result.text)
    assert result.num_tokens <= params.max_tokens
    for call in result.tool_calls:
        assert call.error is None and isinstance(call.parsed, dict), (call, result.text)
    assert result.finish_reason in (("tool_calls",) if result.tool_calls else ("stop", "length"))
    start = result.mode.syntax.start
    if start:  # neither spelled out in text nor inside arguments
        assert start not in result.content
        assert all(start not in c.arguments for c in result.tool_calls)
    if result.mode.start_kind == "control":  # the control id opens each call (hermes) or the list (mistral)
        starts = result.token_ids.count(dict(result.mode.controls)[start])
        assert starts == (len(result.tool_calls) if fmt == "hermes" else min(1, len(result.tool_calls)))
    _check_stream(result, llm)


def _check_stream(result, llm, rng=random.Random(0)):
    """Feeding the ids in random chunks gives deltas that merge into exactly the result."""
    reader = OutputReader(result.mode, llm.vocab, id_prefix="s_")
    deltas, at, ids = [], 0, result.token_ids
    while at < len(ids):
        step = rng.randint(1, 3)
        deltas += reader.feed(ids[at : at + step])
        at += step
    merged = merge_deltas(deltas + reader.finish())
    assert merged["content"] == result.content
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in merged["tool_calls"]] == [
        (c.name, c.arguments) for c in result.tool_calls]
    assert [c["id"] for c in merged["tool_calls"]] == [f"s_{i}" for i in range(len(result.tool_calls))]


@pytest.mark.parametrize("fmt", FORMATS)
def test_auto_yields_text_and_calls_and_all_parse(models, fmt):
    llm = models[fmt]
    results, params = _run(llm, fmt, 16, 48, tool_choice="auto")
    for r, p in zip(results, params, strict=True):
        _check(r, p, fmt, llm)
    assert any(r.tool_calls for r in results), [r.text for r in results]
    assert any(not r.tool_calls for r in results), [r.text for r in results]


@pytest.mark.parametrize("fmt", ["hermes", "json", "mistral"])
def test_auto_never_starts_a_call_it_cannot_finish(models, fmt):
    llm = models[fmt]
    need = _shortest(llm, fmt, tool_choice="required", parallel_tool_calls=False)
    called = 0
    for budget in (need - 1, need, need + 2):
        results, params = _run(llm, fmt, 12, budget, offset=budget, tool_choice="auto")
        for r, p in zip(results, params, strict=True):
            _check(r, p, fmt, llm)  # every started call is complete and valid
        if budget < need:
            assert not any(r.tool_calls for r in results)
        called += sum(bool(r.tool_calls) for r in results)
    assert called  # at the tightest budgets that fit, calls still happen (and complete)


@pytest.mark.parametrize("fmt", FORMATS)
def test_required_parallel_false_gives_exactly_one_call_at_the_tightest_budget(models, fmt):
    llm = models[fmt]
    need = _shortest(llm, fmt, tool_choice="required", parallel_tool_calls=False)
    for extra in (0, 6):
        results, params = _run(llm, fmt, 8, need + extra, offset=extra, tool_choice="required", parallel_tool_calls=False)
        for r, p in zip(results, params, strict=True):
            _check(r, p, fmt, llm)
            assert len(r.tool_calls) == 1 and r.content == "" and r.finish_reason == "tool_calls"


@pytest.mark.parametrize("fmt", FORMATS)
def test_required_parallel_calls_parse(models, fmt):
    llm = models["hermes-parallel" if fmt == "hermes" else fmt]
    results, params = _run(llm, fmt, 8, 120, offset=3, tool_choice="required")
    for r, p in zip(results, params, strict=True):
        _check(r, p, fmt, llm)
        assert r.tool_calls and r.content == ""
    if fmt in CONTROL:  # nothing pushes towards the end after a call: some rows call twice
        assert any(len(r.tool_calls) > 1 for r in results), [r.text for r in results]


@pytest.mark.parametrize("fmt", FORMATS)
def test_named_tool_is_always_the_one_called(models, fmt):
    llm = models[fmt]
    choice = {"type": "function", "function": {"name": "grep_search"}}
    results, params = _run(llm, fmt, 8, 60, offset=5, tool_choice=choice)
    for r, p in zip(results, params, strict=True):
        _check(r, p, fmt, llm)
        assert [c.name for c in r.tool_calls] == ["grep_search"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_allowed_tools_subset_and_none(models, fmt):
    llm = models[fmt]
    subset = {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": ["file_view", "bash_execute"]}}
    results, params = _run(llm, fmt, 12, 48, offset=7, tool_choice=subset)
    for r, p in zip(results, params, strict=True):
        _check(r, p, fmt, llm)
        assert {c.name for c in r.tool_calls} <= {"file_view", "bash_execute"}
    results, params = _run(llm, fmt, 8, 24, offset=8, tool_choice="none")
    for r, p in zip(results, params, strict=True):
        _check(r, p, fmt, llm)
        assert not r.tool_calls and r.finish_reason in ("stop", "length")
        assert CONTROL.get(fmt) not in r.token_ids


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_many_seeds_every_mode(models, fmt):
    llm = models[fmt]
    need = _shortest(llm, fmt, tool_choice="required", parallel_tool_calls=False)
    modes = [{"tool_choice": "auto"}, {"tool_choice": "auto", "parallel_tool_calls": False},
             {"tool_choice": "required"}, {"tool_choice": "required", "parallel_tool_calls": False},
             {"tool_choice": {"type": "function", "function": {"name": "file_edit"}}}, {"tool_choice": "none"}]
    for k, mode in enumerate(modes):
        least = need if mode["tool_choice"] in ("auto", "none") else _shortest(llm, fmt, **mode)
        for extra in (0, 5, 20):
            results, params = _run(llm, fmt, 16, least + extra, offset=100 + 10 * k + extra, **mode)
            for r, p in zip(results, params, strict=True):
                _check(r, p, fmt, llm)
                if mode.get("parallel_tool_calls") is False or "type" in str(mode["tool_choice"]):
                    assert len(r.tool_calls) <= 1
                if mode["tool_choice"] == "none":
                    assert not r.tool_calls
                elif mode["tool_choice"] != "auto":
                    assert r.tool_calls and r.content == ""


def test_json_answers_schema_and_object(models):
    llm = models["json"]
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                               "days": {"type": "integer", "minimum": 1, "maximum": 9}},
              "required": ["city", "days"]}
    formats = [{"type": "json_schema", "json_schema": {"name": "trip", "schema": schema, "strict": True}},
               {"type": "json_object"}]
    for response_format in formats:
        params = [SamplingParams(max_tokens=40, seed=i) for i in range(6)]
        for r in llm.generate(_prompts(6), sampling=params, response_format=response_format):
            assert r.error is None and r.finish_reason == "stop" and not r.tool_calls, (r.error, r.text)
            _check_stream(r, llm)
            if response_format["type"] == "json_schema":
                import json

                value = json.loads(r.content)
                assert set(value) == {"city", "days"} and 1 <= value["days"] <= 9


def test_auto_with_a_json_answer_answers_or_calls(models):
    llm = models["mistral-answer"]
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    answer = {"type": "json_schema", "json_schema": {"name": "count", "schema": schema, "strict": True}}
    results, params = _run(llm, "mistral", 12, 60, tool_choice="auto", response_format=answer)
    for r, p in zip(results, params, strict=True):
        _check(r, p, "mistral", llm)
        if not r.tool_calls:
            import json

            assert r.finish_reason == "stop" and isinstance(json.loads(r.content)["n"], int)
    assert any(r.tool_calls for r in results) and any(not r.tool_calls for r in results)
    with pytest.raises(RequestError, match="needs a format whose calls start with a control token"):
        models["json"].generate(_prompts(1), tools=TOOLS, tool_format="json", tool_choice="auto", response_format=answer)


def test_constrained_true_is_unchanged_without_mode_arguments(models):
    llm = models["json"]
    [r] = llm.generate(_prompts(1), tools=TOOLS, sampling=SamplingParams(max_tokens=80, seed=1), tool_format="json")
    assert r.content is None and r.call is not None and r.ok and r.mode is None


# --- bad input: typed errors before decoding; the rest of a batch goes on -----------------------
def test_bad_rows_report_and_the_rest_decode(models):
    llm = models["hermes"]
    need = _shortest(llm, "hermes", tool_choice="required", parallel_tool_calls=False)
    bad_schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}
    results = llm.generate(
        _prompts(4), tools=[TOOLS, TOOLS, None, TOOLS], tool_format="hermes",
        sampling=[SamplingParams(max_tokens=need - 1), SamplingParams(max_tokens=40, seed=1), SamplingParams(),
                  SamplingParams(max_tokens=40, seed=2)],
        tool_choice=["required", {"type": "function", "function": {"name": "nope"}}, None, "auto"],
        parallel_tool_calls=False, response_format=[None, None, bad_schema, None])
    assert "Invalid max_tokens at row 0: the shortest call takes" in results[0].error
    assert "Invalid tool_choice at row 1: tool 'nope' is not in tools" in results[1].error
    assert results[2].error.startswith("Invalid response_format at row 2")
    assert [r.finish_reason for r in results[:3]] == ["error"] * 3
    assert results[3].error is None and results[3].finish_reason in ("tool_calls", "stop", "length")


def test_request_wide_errors(models):
    llm = models["json"]
    with pytest.raises(RequestError, match="tool_choice 'auto' needs tools"):
        llm.generate(_prompts(1), tool_choice="auto")
    with pytest.raises(RequestError, match="Invalid tool_format"):
        llm.generate(_prompts(1), tools=TOOLS, tool_format="xml", tool_choice="auto")
    with pytest.raises(RequestError, match="need constrained=True"):
        llm.generate(_prompts(1), tools=TOOLS, constrained=False, tool_choice="auto")
    with pytest.raises(RequestError, match="expected one value or a list of 2"):
        llm.generate(_prompts(2), tools=TOOLS, tool_choice=["auto"])
    with pytest.raises(RequestError, match="Invalid max_tokens at row 0: the shortest call"):
        llm.generate(_prompts(1), tools=TOOLS, tool_choice="required", sampling=SamplingParams(max_tokens=3))


# --- the shipped model (hermes, the call start spelled in text) ------------------------------------
@pytest.fixture(scope="module")
def shipped():
    from surecall.llm import LLM

    return LLM(config=EngineConfig())


def _chat(n: int) -> list[list[dict]]:
    asks = ["Show me the file {i}.py", "Search for TODO in src/{i}", "Run the tests in pkg{i}", "Hello {i}, how are you?"]
    return [[{"role": "user", "content": asks[i % 4].format(i=i)}] for i in range(n)]


@pytest.mark.parametrize("mode", [{"tool_choice": "auto"}, {"tool_choice": "required", "parallel_tool_calls": False},
                                  {"tool_choice": {"type": "function", "function": {"name": "file_edit"}}},
                                  {"tool_choice": "none"}])
def test_shipped_model_modes(shipped, mode):
    params = [SamplingParams(max_tokens=40, seed=i, temperature=1.2) for i in range(6)]
    results = shipped.generate(_chat(6), tools=TOOLS, sampling=params, **mode)
    for r, p in zip(results, params, strict=True):
        _check(r, p, "hermes", shipped)
        choice = mode["tool_choice"]
        if choice == "none":
            assert not r.tool_calls and "<tool_call>" not in r.content
        elif choice != "auto":
            assert len(r.tool_calls) == 1 and r.content == ""
            if isinstance(choice, dict):
                assert r.tool_calls[0].name == "file_edit"
