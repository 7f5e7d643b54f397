"""Free-form values on the bracket stack in the engine (kernels/stack.py wired into EngineCore's
sample/advance step): every sampled call parses and validates, also at the fewest tokens a call
needs, and nested values are written (the stack moves)."""

from __future__ import annotations

import functools

import jsonschema
import pytest

from surecall.config import SamplingParams
from surecall.core import EngineCore

TOOL = {"name": "save", "description": "Save metadata.", "parameters": {
    "type": "object", "properties": {"meta": {"type": "object"}, "tags": {"type": "array", "maxItems": 50},
                                     "any": {}},
    "required": ["meta", "tags", "any"], "additionalProperties": False}}


@pytest.fixture(scope="module")
def tiny():
    from surecall.llm import LLM

    return LLM()


def _biased_towards_brackets(monkeypatch, model, vocab, bias: float) -> None:
    """The model's logits of the ids that open `[` or `{` raised by `bias` (it nests deep)."""
    import torch

    ids = torch.tensor([i for i, b in enumerate(vocab.token_bytes) if b.lstrip(b" ")[:1] in (b"[", b"{")])
    forward = model.forward

    @functools.wraps(forward)  # the engine reads the cache keyword from the signature
    def biased(*args, **kwargs):
        out = forward(*args, **kwargs)
        out.logits[..., ids] += bias
        return out

    monkeypatch.setattr(model, "forward", biased)


@pytest.mark.parametrize("graph", [False, True])
def test_free_form_values_hold_in_sampled_calls_of_the_core(tiny, monkeypatch, graph):
    from surecall.core.prompts import render_prompt
    from surecall.tools.calls import check_call

    table = tiny.compile([TOOL])
    assert table.has_stack and table.has_items and "stack_fallback" not in table.meta
    fmt = tiny._format(None)
    key = tiny._table_key(tiny._row_tools([TOOL], 0, {}), fmt)
    core = EngineCore(tiny.runner.model, pad_id=0, block_size=16, num_blocks=256, graph_step=graph)
    _biased_towards_brackets(monkeypatch, tiny.runner.model, tiny.vocab, 8.0)
    prompt = render_prompt([{"role": "user", "content": "save it"}], tiny.tokenizer, [TOOL], 0)
    tight = int(table.dist[0])
    params = [SamplingParams(temperature=1.5, max_tokens=tight + (0, 2, 60, 200)[i % 4], seed=i) for i in range(12)]
    seqs = [core.add_request(f"s{i}", prompt, p, table=table, table_key=key) for i, p in enumerate(params)]
    depths = []
    while core.has_unfinished:
        depths += [o.state.stack_depth for o in core.step()]
    for seq in seqs:
        text = tiny._text(seq.payload.generated)
        check = check_call(text, fmt, [TOOL])
        assert check.error is None, (check.error, text, seq.payload.error)
        jsonschema.validate(check.call.arguments, TOOL["parameters"])
        assert seq.payload.finish_reason == "stop", seq.payload.error
        assert seq.payload.stack_depth == 0
    assert max(depths) >= 3  # rows nested past the old unrolled depth (2), then closed every level in time
