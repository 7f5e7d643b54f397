"""Sliding-window attention in the engine core's own masks (core/masks.py) against HF's forward.

Tiny random-weight Qwen2 (sliding layers from `max_window_layers`, the mask dict) and Mistral (every
layer windowed, one mask) with a 4-token window over 12-token prompts: the core's greedy tokens and
logprobs, eager and static-buffer steps, equal a plain HF loop that builds its own masks.
"""

from __future__ import annotations

import pytest
import torch

from surecall.config import SamplingParams
from surecall.core import EngineCore
from surecall.core.masks import attention_mask, has_layer_types, window_of
from surecall.kernels._triton import INTERPRET

WINDOW = 4


def _model(kind: str, window: int | None, attn: str = "sdpa"):
    from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.3,
                  attn_implementation=attn, tie_word_embeddings=False)
    torch.manual_seed(0)
    if kind == "qwen2":
        config = Qwen2Config(use_sliding_window=window is not None, sliding_window=window or 4096,
                             max_window_layers=1, **common)
        return Qwen2ForCausalLM(config).eval()
    return MistralForCausalLM(MistralConfig(sliding_window=window, **common)).eval()


def _hf_greedy(model, prompts, steps: int):
    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids, lps = list(prompt), []
            for _ in range(steps):
                logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
                tok = int(logits.argmax())
                lps.append(float(torch.log_softmax(logits, -1)[tok]))
                ids.append(tok)
            out.append((ids[len(prompt):], lps))
    return out


def _core_greedy(model, prompts, steps: int, graph: bool):
    core = EngineCore(model, pad_id=0, block_size=4, num_blocks=64, graph_step=graph)
    seqs = [core.add_request(f"r{i}", p, SamplingParams(temperature=0, max_tokens=steps)) for i, p in enumerate(prompts)]
    core.run_to_completion()
    return [(s.payload.generated, s.payload.logprobs) for s in seqs]


PROMPTS = [[5, 17, 33, 2, 71, 9, 60, 44, 12, 3, 88, 21], [40, 7, 19, 63, 2, 11, 5]]


@pytest.mark.parametrize("kind, attn", [("qwen2", "sdpa"), ("mistral", "sdpa"), ("mistral", "eager")])
def test_windowed_core_equals_hf_forward(kind, attn):
    model = _model(kind, WINDOW, attn)
    assert window_of(model.config) == WINDOW and has_layer_types(model.config) == (kind == "qwen2")
    ref = _hf_greedy(model, PROMPTS, 8)
    graphs = (False, True) if INTERPRET else (False,)
    for graph in graphs:
        got = _core_greedy(model, PROMPTS, 8, graph)
        for (tokens, lps), (ref_tokens, ref_lps) in zip(got, ref, strict=True):
            assert tokens == ref_tokens, (graph, tokens, ref_tokens)
            assert torch.allclose(torch.tensor(lps), torch.tensor(ref_lps), atol=1e-4), graph
    # the window matters here: the same weights attending fully give other logprobs
    full = _model(kind, None, attn)
    assert window_of(full.config) is None
    unwindowed = _hf_greedy(full, PROMPTS, 8)
    assert any(max(abs(a - b) for a, b in zip(w[1], u[1])) > 1e-3 for w, u in zip(ref, unwindowed))


def test_mask_keeps_the_window_and_a_key_for_padding_queries():
    from transformers import MistralConfig

    config = MistralConfig(sliding_window=3)
    kpos = torch.arange(6)[None, :]
    qpos = torch.tensor([[5], [-1]])
    allowed = (kpos[:, None, :] <= qpos[:, :, None]) & (qpos[:, :, None] >= 0)
    allowed[:, :, 0] |= qpos < 0
    mask = attention_mask(allowed, kpos, qpos, config, is_sdpa=True, dtype=torch.float32)
    assert mask.shape == (2, 1, 1, 6)
    assert mask[0, 0, 0].tolist() == [False, False, False, True, True, True]
    assert mask[1, 0, 0].tolist() == [True, False, False, False, False, False]
    additive = attention_mask(allowed, kpos, qpos, config, is_sdpa=False, dtype=torch.float32)
    assert additive[0, 0, 0, 3] == 0 and additive[0, 0, 0, 2] == torch.finfo(torch.float32).min
