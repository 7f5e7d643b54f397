"""Constrained decoding in the engine core on a tiny random-weight Mistral with the real Mistral v0.3 vocabulary.

Works at the `EngineCore` level with schema tables (no tool format needed): the remaining-budget
mask always ends inside max_tokens in an accepting state, logprobs equal a plain forward pass
plus the mask, seeded rows ignore their batch, and mixed grammars share one concatenated table.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from surecall.config import SamplingParams
from surecall.core import EngineCore
from surecall.core.model_runner import ModelRunner

SCHEMA_A = {"type": "object", "properties": {"path": {"type": "string", "maxLength": 12}, "limit": {"type": "integer", "minimum": 1, "maximum": 500}},
            "required": ["path", "limit"], "additionalProperties": False}
SCHEMA_B = {"type": "object", "properties": {"flag": {"type": "boolean"}, "tags": {"type": "array", "items": {"enum": ["x", "yy"]}, "maxItems": 3}},
            "required": ["flag"], "additionalProperties": False}


@pytest.fixture(scope="module")
def vocab(data_dir):
    from conftest import cached_vocab

    return cached_vocab("mistral-v0.3")


@pytest.fixture(scope="module")
def runner(vocab):
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    config = MistralConfig(vocab_size=vocab.logits_width, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    return ModelRunner(MistralForCausalLM(config).eval())


@pytest.fixture(scope="module")
def tables(vocab):
    from surecall.grammars.compile import compile_schema
    from surecall.grammars.table import TokenTable

    a, b = compile_schema(SCHEMA_A, vocab), compile_schema(SCHEMA_B, vocab)
    both, offsets = TokenTable.concat([a, b])
    return a, b, both, [int(o) for o in offsets]


def _run(runner, vocab, requests, **kw):
    """requests: (prompt ids, SamplingParams, table or None[, forced ids]); each one's RequestState, and the core."""
    core = EngineCore(runner.model, num_blocks=128, **kw)
    seqs = []
    for i, (prompt, params, table, *forced) in enumerate(requests):
        key = None if table is None else f"table-{id(table)}"
        seqs.append(core.add_request(f"r{i}", prompt, params, stop_ids=vocab.stop_ids, table=table, table_key=key,
                                     forced_ids=forced[0] if forced else ()))
    core.run_to_completion()
    assert core.blocks.num_free == core.blocks.num_blocks
    return [seq.payload for seq in seqs], core


def _text(vocab, ids):
    stops = set(vocab.stop_ids)
    return b"".join(vocab.token_bytes[t] for t in ids if t not in stops).decode()


def _walk(table, ids, stops, start: int = 0) -> int:
    state = start
    for t in ids:
        if t in stops:
            break
        state = table.next_state(state, t)
        assert state is not None, f"token {t} is not a transition"
    return state


@pytest.mark.parametrize("extra", [0, 1, 5])
def test_budget_always_ends_in_an_accepting_state(runner, vocab, tables, extra):
    a, b, _, _ = tables
    requests = [([1, 100 + i], SamplingParams(max_tokens=int((a, b)[i % 2].dist[0]) + extra, seed=i), (a, b)[i % 2])
                for i in range(4)]
    out, core = _run(runner, vocab, requests)
    stops = set(vocab.stop_ids)
    for i, r in enumerate(out):
        table = (a, b)[i % 2]
        assert len(r.generated) <= requests[i][1].max_tokens
        state = _walk(table, r.generated, stops)
        assert table.accept[state], f"row {i} ended mid-call: {_text(vocab, r.generated)!r}"
        value = json.loads(_text(vocab, r.generated))
        assert set(value) <= set((SCHEMA_A if i % 2 == 0 else SCHEMA_B)["properties"])
    assert core.timings["sample_s"] > 0 and core.timings["advance_s"] > 0 and core.num_steps >= 1


def _reference(runner, table, prompt, ids, temperature, max_tokens, stops):
    seq = torch.tensor([prompt + ids])
    with torch.no_grad():
        logits = runner.model(seq).logits[0, len(prompt) - 1 : -1].float()
    from surecall.grammars.walk import kept

    state, counter, masked_lp, raw_lp = 0, 0, [], []
    for step, tok in enumerate(ids):
        allowed = np.zeros(logits.shape[1], dtype=bool)
        toks, nexts = table.transitions(state)
        keep = kept(table, state, counter, toks, nexts, max_tokens - step)
        allowed[toks[keep]] = True
        if table.accept[state]:
            allowed[sorted(stops)] = True
        row = logits[step] / temperature
        masked_lp.append(float(torch.log_softmax(row.masked_fill(~torch.from_numpy(allowed), float("-inf")), -1)[tok]))
        raw_lp.append(float(torch.log_softmax(row, -1)[tok]))
        if tok not in stops:
            state, counter = table.next_state(state, tok), table.next_counter(state, counter, tok)
    return masked_lp, raw_lp


def test_logprobs_equal_forward_pass_plus_mask(runner, vocab, tables):
    a = tables[0]
    params = SamplingParams(temperature=0.7, max_tokens=int(a.dist[0]) + 6, seed=3, unmasked_logprobs=True)
    [r], _ = _run(runner, vocab, [([1, 42], params, a)])
    masked, raw = _reference(runner, a, [1, 42], r.generated, 0.7, params.max_tokens, set(vocab.stop_ids))
    assert np.allclose(r.logprobs, masked, atol=2e-4)
    assert np.allclose(r.unmasked_logprobs, raw, atol=2e-4)


def test_seeded_constrained_rows_ignore_the_batch(runner, vocab, tables):
    a, b, _, _ = tables
    mine = SamplingParams(max_tokens=30, seed=99)
    [alone], _ = _run(runner, vocab, [([1, 7], mine, a)])
    batch, _ = _run(runner, vocab, [([1, 2, 3, 4], SamplingParams(max_tokens=20, seed=1), b), ([1, 7], mine, a),
                                    ([1], SamplingParams(max_tokens=25, seed=2, temperature=0), b)])
    assert batch[1].generated == alone.generated
    assert batch[1].logprobs == pytest.approx(alone.logprobs, abs=1e-4)


def test_forced_prefix_is_reported_first(runner, vocab, tables):
    a = tables[0]
    control = vocab.special_tokens.get("[TOOL_CALLS]")
    if control is None:
        pytest.skip("this Mistral vocabulary has no [TOOL_CALLS] token")
    params = SamplingParams(max_tokens=int(a.dist[0]) + 4, seed=5, unmasked_logprobs=True)
    [r], _ = _run(runner, vocab, [([1, 9], params, a, (control,))])
    assert r.generated[0] == control and r.logprobs[0] == 0.0
    assert len(r.generated) <= params.max_tokens
    with torch.no_grad():
        ref = torch.log_softmax(runner.model(torch.tensor([[1, 9]])).logits[0, -1].float(), -1)[control]
    assert r.unmasked_logprobs[0] == pytest.approx(float(ref), abs=2e-4)
    json.loads(_text(vocab, r.generated[1:]))


def _one_state_table(vocab, allowed_tok: int):
    """A 2-state table: state 0 allows only `allowed_tok` (-> state 1); state 1 accepts and allows nothing."""
    from surecall.grammars.table import TokenTable

    words = (vocab.logits_width + 31) // 32
    mask = np.zeros((2, words), dtype=np.int32)
    mask[0, allowed_tok // 32] = 1 << (allowed_tok % 32)  # allowed_tok % 32 < 31: no sign bit
    return TokenTable.from_dense(
        mask=mask, accept=np.array([False, True]), dist=np.array([1, 0], dtype=np.int32),
        trans_ptr=np.array([0, 1, 1], dtype=np.int32), trans_tok=np.array([allowed_tok], dtype=np.int32),
        trans_next=np.array([1], dtype=np.int32), stop_ids=np.array(sorted(vocab.stop_ids), dtype=np.int32),
        vocab_size=vocab.vocab_size, logits_width=vocab.logits_width,
    )


def test_a_row_whose_mask_allows_nothing_is_an_error(runner, vocab):
    table = _one_state_table(vocab, 300)  # state 1 accepts but masks every stop id: nothing to sample
    (bad, free), _ = _run(runner, vocab, [([1, 5], SamplingParams(max_tokens=4, seed=0), table),
                                          ([1, 6], SamplingParams(max_tokens=3, seed=1, temperature=0), None)])
    assert bad.finish_reason == "error" and bad.generated == [300]
    assert re.search(r"at step 1, the grammar mask of state 1 allows no token", bad.error)
    assert free.error is None and free.finish_reason in ("stop", "length")


def test_a_token_the_grammar_refuses_is_an_error(runner, vocab, monkeypatch):
    import surecall.core.engine as core_engine
    from surecall.kernels import sample as kernel_sample

    def wrong_token(*args, **kwargs):  # a sampler that ignores the mask (a kernel bug)
        out = kernel_sample(*args, **kwargs)
        out.tokens.fill_(301)
        return out

    monkeypatch.setattr(core_engine, "sample", wrong_token)
    [row], _ = _run(runner, vocab, [([1, 5], SamplingParams(max_tokens=4, seed=0), _one_state_table(vocab, 300))])
    assert row.finish_reason == "error" and row.generated == []  # the refused token is not kept
    assert re.search(r"at step 0, token 301 is not allowed in grammar state 0", row.error)


@pytest.mark.gpu
def test_cuda_decode_is_valid_deterministic_and_batch_independent(vocab, tables):
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    config = MistralConfig(vocab_size=vocab.logits_width, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    runner = ModelRunner(MistralForCausalLM(config).eval(), device="cuda")
    a, b, _, _ = tables
    mine = ([1, 7], SamplingParams(max_tokens=int(a.dist[0]) + 8, seed=42), a)
    others = [([1, 5 + i], SamplingParams(max_tokens=30, seed=i), (a, b)[i % 2]) for i in range(6)]
    [alone], _ = _run(runner, vocab, [mine])
    [again], _ = _run(runner, vocab, [mine])
    requests = others[:3] + [mine] + others[3:]
    batch, _ = _run(runner, vocab, requests)
    assert alone.generated == again.generated == batch[3].generated
    for (_, _, table), out in zip(requests, batch, strict=True):
        assert table.accept[_walk(table, out.generated, set(vocab.stop_ids))]
