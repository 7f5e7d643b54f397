"""The static-shape decode step (the form CUDA graphs capture) against the dynamic KV cache.

On CPU the bucket runs its forward eagerly, so these tests check everything a captured graph
relies on: the preallocated cache, the padded batch, the mask columns opened step by step, the
reset between runs. The `gpu` tests then check that replaying the captured graph gives exactly
what the same bucket gives eagerly.
"""

from __future__ import annotations

import json

import pytest
import torch

from surecall.config import EngineConfig, SamplingParams
from surecall.core.decode import Decoder, DecodeRow
from surecall.core.model_runner import ModelRunner
from surecall.core.static_step import CACHE_LEN_STEP, batch_bucket, cache_bucket

ON_GPU = torch.cuda.is_available()


def _tiny_model(kind: str, **extra):
    """A 2-layer random-weight model of `kind` (built on the current default device)."""
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    classes = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM),
               "mistral": (MistralConfig, MistralForCausalLM)}
    config_cls, model_cls = classes[kind]
    config = config_cls(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, **extra)
    return model_cls(config).eval()


def _tiny(kind: str, device=None, **extra) -> ModelRunner:
    torch.manual_seed(0)
    return ModelRunner(_tiny_model(kind, **extra), device=device)


def _padded(prompts):
    length = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), length), dtype=torch.long)
    mask = torch.zeros((len(prompts), length), dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, length - len(p):] = torch.tensor(p)
        mask[r, length - len(p):] = 1
    return ids, mask


def _trace(runner, prompts, steps: int, cuda_graphs):
    """Greedy logits of every step, feeding the argmax back."""
    ids, mask = _padded(prompts)
    logits = runner.prefill(ids, mask, steps, cuda_graphs=cuda_graphs)[:, -1]
    out = [logits.clone()]
    for _ in range(steps - 1):
        logits = runner.decode(logits.argmax(-1))
        out.append(logits.clone())
    mode = runner.last_mode
    runner.release()
    return torch.stack(out, 1), mode


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral"])
def test_static_step_gives_the_dynamic_cache_logits(kind):
    runner = _tiny(kind)
    prompts = [[5, 6, 7, 8, 9], [11], [3, 4, 200]]  # 3 rows -> a bucket of 4, left padding of 4 and 2
    dynamic, mode_d = _trace(runner, prompts, 12, cuda_graphs=False)
    static, mode_s = _trace(runner, prompts, 12, cuda_graphs=True)
    assert (mode_d, mode_s) == ("dynamic", "static")
    assert static.shape == dynamic.shape == (3, 12, 512)
    assert torch.allclose(static, dynamic, atol=1e-4), (static - dynamic).abs().max()


def test_buckets_are_reused_and_reset_between_runs():
    runner = _tiny("llama")
    first, _ = _trace(runner, [[5, 6, 7], [8]], 10, cuda_graphs=True)
    [bucket] = runner._buckets.buckets.values()
    assert (bucket.batch, bucket.cache_len) == (2, CACHE_LEN_STEP)
    other, _ = _trace(runner, [[9, 9, 9, 9, 9, 9]], 10, cuda_graphs=True)  # another batch bucket in between
    again, _ = _trace(runner, [[5, 6, 7], [8]], 10, cuda_graphs=True)
    assert list(runner._buckets.buckets) == [(1, CACHE_LEN_STEP), (2, CACHE_LEN_STEP)]
    assert runner._buckets.buckets[(2, CACHE_LEN_STEP)] is bucket  # same cache, same addresses
    assert torch.equal(first, again)  # nothing left over from the runs before
    assert not torch.allclose(first[:1], other)


def test_least_recently_used_bucket_is_dropped():
    runner = _tiny("llama")
    runner._buckets.limit = 2
    for batch in (1, 2, 3):  # buckets 1, 2, 4
        _trace(runner, [[5 + i] for i in range(batch)], 2, cuda_graphs=True)
    assert list(runner._buckets.buckets) == [(2, CACHE_LEN_STEP), (4, CACHE_LEN_STEP)]
    runner.release_buckets()
    assert not runner._buckets.buckets


def test_bucket_sizes():
    assert [batch_bucket(b) for b in (1, 2, 3, 5, 9, 16, 17, 65, 128, 129, 2000)] == [1, 2, 4, 8, 12, 16, 24, 96, 128, 192, 2000]
    assert all(batch_bucket(b) < b * 3 / 2 for b in range(8, 1025))  # from 8 rows, padding under half a batch
    assert cache_bucket(1, 1024) == CACHE_LEN_STEP
    assert cache_bucket(CACHE_LEN_STEP + 1, 4096) == 2 * CACHE_LEN_STEP
    assert cache_bucket(300, 300) == 300  # never past the model's positions
    assert cache_bucket(1000, 900) == 1000  # the runner refuses such requests earlier; never shorter than needed


def test_a_long_request_gets_a_longer_cache():
    runner = _tiny("llama")
    _, mode = _trace(runner, [[5, 6]], CACHE_LEN_STEP + 10, cuda_graphs=True)
    assert mode == "static"
    assert list(runner._buckets.buckets) == [(1, 2 * CACHE_LEN_STEP)]


def test_sliding_window_shorter_than_the_cache_falls_back_with_a_warning():
    runner = _tiny("mistral", sliding_window=16)
    assert "sliding-window attention (16 tokens)" in runner.static_reason(CACHE_LEN_STEP)
    with pytest.warns(UserWarning, match=r"static decode step \(CUDA graphs\) off for this model: sliding-window attention \(16 tokens\)"):
        _, mode = _trace(runner, [[5, 6]], 4, cuda_graphs=True)
    assert mode == "dynamic"
    _, mode = _trace(runner, [[5, 6]], 4, cuda_graphs=None)  # auto: the same fallback, silently
    assert mode == "dynamic"


def test_dynamic_rope_and_flash_attention_are_refused():
    runner = _tiny("llama", rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    assert "rotary embedding type 'dynamic'" in runner.static_reason(CACHE_LEN_STEP)
    runner = _tiny("llama")
    runner.config._attn_implementation = "flash_attention_2"
    assert "attention implementation 'flash_attention_2'" in runner.static_reason(CACHE_LEN_STEP)


def test_eager_attention_uses_an_additive_mask():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         attn_implementation="eager")
    runner = ModelRunner(LlamaForCausalLM(config).eval())
    dynamic, _ = _trace(runner, [[5, 6, 7], [8]], 8, cuda_graphs=False)
    static, mode = _trace(runner, [[5, 6, 7], [8]], 8, cuda_graphs=True)
    assert mode == "static" and not runner.attn_is_sdpa
    assert torch.allclose(static, dynamic, atol=1e-4)


def test_decoder_reports_the_step_mode_and_seeded_rows_agree():
    runner = _tiny("qwen2")
    rows = [DecodeRow([5, 6, 7], SamplingParams(max_tokens=16, seed=3, temperature=1.0)),
            DecodeRow([9], SamplingParams(max_tokens=9, seed=4, temperature=1.0))]
    dynamic = Decoder(runner, EngineConfig(cuda_graphs=False, stop_check_interval=2)).run(rows, stop_ids=[1])
    static = Decoder(runner, EngineConfig(cuda_graphs=True, stop_check_interval=2)).run(rows, stop_ids=[1])
    assert dynamic.timings["step_mode"] == "dynamic" and static.timings["step_mode"] == "static"
    for a, b in zip(dynamic.rows, static.rows, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)


def test_stories_greedy_through_the_static_step(data_dir):
    from surecall.llm import LLM

    path = data_dir / "models" / "stories260K"
    if not (path / "hf" / "model.safetensors").is_file():
        pytest.skip(f"stories260K checkpoint not found under {path}")
    expected = json.loads((path / "expected_greedy.json").read_text())
    llm = LLM(path / "hf", config=EngineConfig(cuda_graphs=True))
    [result] = llm.generate([expected["prompt_ids"]], sampling=SamplingParams(temperature=0, max_tokens=256),
                            constrained=False)
    assert result.batch_timings["step_mode"] == "static"
    assert result.token_ids == expected["generated_ids"]


# --- on the GPU: the captured graph against the same bucket run eagerly ---------------------
@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral"])
def test_cuda_graph_replay_equals_the_eager_static_step(kind):
    runner = _tiny(kind, device="cuda")
    prompts = [[5, 6, 7, 8, 9], [11], [3, 4, 200]]
    runner.capture_graphs = False
    eager, mode_e = _trace(runner, prompts, 20, cuda_graphs=None)
    runner.capture_graphs = True
    graphed, mode_g = _trace(runner, prompts, 20, cuda_graphs=None)
    captured = runner.last_capture_s
    again, _ = _trace(runner, prompts, 20, cuda_graphs=None)
    assert (mode_e, mode_g) == ("static", "graph")
    assert captured > 0 and runner.last_capture_s == 0.0  # captured once, then replayed
    assert torch.equal(graphed, eager) and torch.equal(again, eager)
    dynamic, _ = _trace(runner, prompts, 20, cuda_graphs=False)
    assert torch.allclose(graphed, dynamic, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_cuda_graph_decoder_rows_match_eager_decoding():
    runner = _tiny("llama", device="cuda")
    rows = [DecodeRow([5, 6, 7 + i], SamplingParams(max_tokens=24, seed=i, temperature=1.0)) for i in range(5)]
    graphed = Decoder(runner, EngineConfig()).run(rows, stop_ids=[1])
    assert graphed.timings["step_mode"] == "graph"
    runner.capture_graphs = False
    eager = Decoder(runner, EngineConfig()).run(rows, stop_ids=[1])
    assert eager.timings["step_mode"] == "static"
    for a, b in zip(graphed.rows, eager.rows, strict=True):
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs


# --- capturability on CPU: meta tensors refuse every host read, as graph capture does ---------
def _meta_runner(kind: str, **extra) -> ModelRunner:
    with torch.device("meta"):
        return ModelRunner(_tiny_model(kind, **extra))


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral"])
def test_the_static_step_never_reads_a_tensor_on_the_host(kind):
    """A `.item()`, `bool(tensor)` or `.tolist()` in the step would break capture; on meta tensors it raises."""
    from surecall.core.static_step import StaticBucket

    bucket = StaticBucket(_meta_runner(kind), 4, CACHE_LEN_STEP)
    bucket.column = 3
    with torch.inference_mode():
        for _ in range(3):
            logits = bucket.decode(torch.zeros(3, dtype=torch.long, device="meta"))
    assert logits.shape == (3, 512) and logits.dtype == torch.float32
    assert bucket.column == 6


def test_the_meta_probe_catches_a_host_read():
    """The same probe on a forward that reads a tensor on the host (dynamic rotary scaling) fails."""
    from surecall.core.static_step import StaticBucket

    bucket = StaticBucket(_meta_runner("llama", rope_scaling={"rope_type": "dynamic", "factor": 2.0}), 1,
                          CACHE_LEN_STEP)
    with torch.inference_mode(), pytest.raises(RuntimeError, match="meta"):
        bucket.decode(torch.zeros(1, dtype=torch.long, device="meta"))


# --- batch compaction: finished rows leave the batch at stop checks --------------------------
def _mixed_rows(greedy: bool):
    lengths = [3, 5, 40, 4, 2, 36, 6]  # most rows end early, two run long
    return [DecodeRow([1, 50 + 7 * i, 9 + i], SamplingParams(max_tokens=n, seed=100 + i,
                                                            temperature=0.0 if greedy else 1.0,
                                                            unmasked_logprobs=True))
            for i, n in enumerate(lengths)]


@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_compaction_changes_nothing_but_the_work(cuda_graphs):
    runner = _tiny("llama")
    rows = _mixed_rows(greedy=False)
    base = Decoder(runner, EngineConfig(cuda_graphs=cuda_graphs, compact_batches=False, stop_check_interval=2))
    compact = Decoder(runner, EngineConfig(cuda_graphs=cuda_graphs, stop_check_interval=2))
    a, b = base.run(rows, stop_ids=[]), compact.run(rows, stop_ids=[])
    assert a.timings["compactions"] == 0 and b.timings["compactions"] >= 2
    for x, y, row in zip(a.rows, b.rows, rows, strict=True):
        assert len(y.token_ids) == row.sampling.max_tokens and y.finish_reason == "length"
        assert x.token_ids == y.token_ids
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4)
        assert torch.allclose(torch.tensor(x.unmasked_logprobs), torch.tensor(y.unmasked_logprobs), atol=1e-4)
    if cuda_graphs:  # the long rows ended in the 2-row bucket
        assert (2, CACHE_LEN_STEP) in runner._buckets.buckets


def test_compaction_keeps_stories_greedy_exact(data_dir):
    path = data_dir / "models" / "stories260K"
    if not (path / "hf" / "model.safetensors").is_file():
        pytest.skip(f"stories260K checkpoint not found under {path}")
    expected = json.loads((path / "expected_greedy.json").read_text())
    runner = ModelRunner(path / "hf")
    rows = [DecodeRow(expected["prompt_ids"], SamplingParams(temperature=0, max_tokens=n)) for n in (3, 200, 7, 9)]
    for graphs in (False, True):
        out = Decoder(runner, EngineConfig(cuda_graphs=graphs, stop_check_interval=4)).run(rows, stop_ids=[])
        assert out.timings["compactions"] >= 1
        for row, res in zip(rows, out.rows, strict=True):
            assert res.token_ids == expected["generated_ids"][: row.sampling.max_tokens]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_cuda_graph_compaction_matches_the_eager_static_step():
    runner = _tiny("qwen2", device="cuda")
    rows = _mixed_rows(greedy=False)
    graphed = Decoder(runner, EngineConfig(stop_check_interval=2)).run(rows, stop_ids=[])
    assert graphed.timings["step_mode"] == "graph" and graphed.timings["compactions"] >= 2
    runner.capture_graphs = False
    eager = Decoder(runner, EngineConfig(stop_check_interval=2)).run(rows, stop_ids=[])
    for a, b in zip(graphed.rows, eager.rows, strict=True):
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs


def test_the_default_is_the_static_step_on_cpu_too():
    runner = _tiny("qwen2")
    _, mode = _trace(runner, [[5, 6, 7]], 4, cuda_graphs=None)
    assert mode == "static"  # no per-step concatenation of the cache; graphs only where CUDA is


# --- a prompt beginning every row shares is prefilled once -----------------------------------
def test_shared_prefix_length():
    from surecall.core.decode import MIN_SHARED_PREFIX, _shared_prefix

    base = list(range(100, 100 + MIN_SHARED_PREFIX + 4))
    assert _shared_prefix([base + [1, 2], base + [3]], keep_last=1) == len(base)
    assert _shared_prefix([base + [1, 2], base + [1, 3]], keep_last=1) == len(base) + 1
    assert _shared_prefix([base, base], keep_last=1) == len(base) - 1  # every row keeps one token of its own
    assert _shared_prefix([base + [1], base + [2]], keep_last=3) == len(base) - 2  # forced ids' logprobs
    assert _shared_prefix([base[:8] + [1], base[:8] + [2]], keep_last=1) == 0  # too short to bother
    assert _shared_prefix([base + [1]], keep_last=1) == 0  # one row: nothing to share


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_shared_prefix_prefill_gives_the_same_logits(kind):
    runner = _tiny(kind)
    system = [7 + (i * 13) % 400 for i in range(40)]
    prompts = [system + [11, 12, 13], system + [21], system + [31, 32]]  # 3 rows: a padding row in bucket 4
    ids, mask = _padded(prompts)
    plain = runner.prefill(ids, mask, 8, num_last=2, cuda_graphs=True)
    plain_steps = [runner.decode(plain[:, -1].argmax(-1)) for _ in range(1)]
    shared = runner.prefill(ids, mask, 8, num_last=2, cuda_graphs=True, shared_prefix=len(system))
    assert runner._static.column == len(system) + 3  # [shared][padding][own]: narrower than the padded batch
    shared_steps = [runner.decode(shared[:, -1].argmax(-1)) for _ in range(1)]
    assert torch.allclose(plain, shared, atol=1e-4)
    assert torch.allclose(plain_steps[0], shared_steps[0], atol=1e-4)


def test_decoder_shares_the_prefix_and_changes_no_token():
    runner = _tiny("llama")
    system = [7 + (i * 13) % 400 for i in range(30)]
    rows = [DecodeRow(system + [50 + i] * (1 + i % 3), SamplingParams(max_tokens=12, seed=i, temperature=1.0))
            for i in range(5)]
    dynamic = Decoder(runner, EngineConfig(cuda_graphs=False)).run(rows, stop_ids=[])
    static = Decoder(runner, EngineConfig()).run(rows, stop_ids=[])
    assert static.timings["step_mode"] == "static"
    for a, b in zip(dynamic.rows, static.rows, strict=True):
        assert a.token_ids == b.token_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)


def test_a_shared_prefix_never_eats_the_rows_last_tokens():
    runner = _tiny("llama")
    system = list(range(40, 80))
    ids, mask = _padded([system + [11, 12], system + [21]])
    plain = runner.prefill(ids, mask, 4, num_last=2, cuda_graphs=True)
    clamped = runner.prefill(ids, mask, 4, num_last=2, cuda_graphs=True, shared_prefix=len(system))
    assert runner._static.column == len(system) - 1 + 3  # shared 39: row 1 keeps its last 2 tokens
    assert torch.allclose(plain, clamped, atol=1e-4)
