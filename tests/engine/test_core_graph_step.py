"""The static-buffer decode step (core/graph_step.py): same results as the eager step, no host sync,
inert padding rows; on CUDA the captured graph equals the eager step (`-m gpu`)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from surecall.config import EngineConfig, SamplingParams
from surecall.core import EngineCore
from surecall.core import graph_step as gs
from surecall.kernels._triton import INTERPRET

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers.no_sync import HostSyncError, NoHostSync  # noqa: E402

needs_interpreter = pytest.mark.skipif(not INTERPRET, reason="the step's kernels run on CPU under TRITON_INTERPRET=1")

TOOLS = [
    {"name": "note", "description": "Write a note.", "parameters": {
        "type": "object", "properties": {"text": {"type": "string", "minLength": 3, "maxLength": 12}},
        "required": ["text"], "additionalProperties": False}},
    {"name": "pick", "description": "Pick numbers.", "parameters": {
        "type": "object", "properties": {"n": {"type": "array", "items": {"type": "integer", "minimum": 0,
                                                                          "maximum": 9},
                                               "minItems": 12, "maxItems": 14}},
        "required": ["n"], "additionalProperties": False}},
    {"name": "save", "description": "Save metadata.", "parameters": {
        "type": "object", "properties": {"meta": {"type": "object"}, "xs": {"type": "array", "maxItems": 60}},
        "required": ["meta", "xs"], "additionalProperties": False}},
]


@pytest.fixture(scope="module")
def tiny():
    from surecall.llm import LLM

    return LLM()


@pytest.fixture(scope="module")
def grammars(tiny):
    from surecall.core.prompts import render_prompt

    fmt = tiny._format(None)
    out = []
    for tool in TOOLS:
        table = tiny.compile([tool])
        key = tiny._table_key(tiny._row_tools([tool], 0, {}), fmt)
        prompt = render_prompt([{"role": "user", "content": f"use {tool['name']}"}], tiny.tokenizer, [tool], 0)
        out.append((table, key, prompt))
    assert out[0][0].has_counts and out[1][0].has_items and out[2][0].has_stack
    return out


def _requests(tiny, grammars, use_sort: bool):
    """Mixed rows: free and constrained, seeds, greedy, tight budgets, unmasked logprobs."""
    rows = []
    for i in range(6):
        table, key, prompt = grammars[i % 3]
        tight = int(table.dist[0])
        params = SamplingParams(temperature=(0.0, 1.0, 0.8)[i % 3], max_tokens=tight + (0, 3, 40)[i % 3], seed=11 + i,
                                unmasked_logprobs=i == 1, top_k=5 if use_sort and i % 3 == 1 else 0,
                                top_p=0.9 if use_sort and i % 3 == 2 else 1.0)
        rows.append((f"c{i}", prompt, params, table, key))
    for i in range(3):
        prompt = tiny.count_tokens(f"user: request {i} about file_{i}.py\nassistant:")
        params = SamplingParams(temperature=(0.0, 1.0, 0.7)[i], max_tokens=(4, 30, 12)[i], seed=40 + i,
                                unmasked_logprobs=i == 2, top_k=7 if use_sort and i == 1 else 0)
        rows.append((f"f{i}", prompt, params, None, None))
    return rows


def _run(tiny, rows, graph: bool, **kw):
    core = EngineCore(tiny.runner.model, pad_id=0, block_size=16, num_blocks=256, graph_step=graph, **kw)
    seqs = {rid: core.add_request(rid, prompt, params, stop_ids=(2,), table=table, table_key=key)
            for rid, prompt, params, table, key in rows}
    steps = []
    while core.has_unfinished:
        steps.append({o.request_id: (tuple(o.new_token_ids), o.state.state, o.state.counter, o.state.item_counter,
                                     o.state.stack_depth, o.state.stack_bits, o.finished, o.state.finish_reason)
                      for o in core.step()})
    return core, steps, {rid: seq.payload for rid, seq in seqs.items()}


def _guarded(monkeypatch):
    """Run every static step under NoHostSync; the bucket keys it ran."""
    calls = []
    original = gs.GraphStep.device_step

    def device_step(self, bucket):
        with NoHostSync():
            original(self, bucket)
        calls.append(bucket.key)

    monkeypatch.setattr(gs.GraphStep, "device_step", device_step)
    return calls


@needs_interpreter
@pytest.mark.parametrize("use_sort", [False, True])
def test_static_step_equals_the_eager_step_without_host_sync(tiny, grammars, monkeypatch, use_sort):
    from test_core_stack import _biased_towards_brackets

    rows = _requests(tiny, grammars, use_sort)
    _biased_towards_brackets(monkeypatch, tiny.runner.model, tiny.vocab, 4.0)  # free-form values nest
    eager_core, eager_steps, eager = _run(tiny, rows, graph=False)
    calls = _guarded(monkeypatch)  # a host sync raises HostSyncError, which fails the step's rows
    graph_core, graph_steps, graph = _run(tiny, rows, graph=True)
    assert eager_core.graph is None and len(calls) == graph_core.graph.num_eager > 5  # the static step ran
    assert all(st.error is None for st in graph.values())
    assert graph_steps == eager_steps  # tokens, next states, counters, item counters, finishes, every step
    for rid, ref in eager.items():
        got = graph[rid]
        assert (got.generated, got.finish_reason, got.error, got.by_stop) == (
            ref.generated, ref.finish_reason, ref.error, ref.by_stop), rid
        assert torch.allclose(torch.tensor(got.logprobs), torch.tensor(ref.logprobs), atol=1e-5), rid
        assert torch.allclose(torch.tensor(got.unmasked_logprobs), torch.tensor(ref.unmasked_logprobs), atol=1e-5)
    assert {st.finish_reason for st in eager.values()} >= {"stop", "length"}
    seen = [v for step in graph_steps for v in step.values()]
    assert any(v[2] > 0 for v in seen) and any(max(v[3]) > 0 for v in seen)  # string and item counters moved
    assert any(v[4] > 0 for v in seen)  # and the bracket stack


@needs_interpreter
def test_the_guard_catches_the_eager_steps_syncs(tiny):
    core = EngineCore(tiny.runner.model, pad_id=0, block_size=16, num_blocks=64, graph_step=False)
    core.add_request("a", tiny.count_tokens("user: hi\nassistant:"), SamplingParams(temperature=0, max_tokens=4))
    plan = core.scheduler.schedule()
    sampled = core._forward_all(plan)
    with pytest.raises(HostSyncError, match="host sync"), NoHostSync():
        core._sample_and_advance(sampled)
    with pytest.raises(HostSyncError, match="nonzero"), NoHostSync():
        torch.arange(4).nonzero()


@needs_interpreter
def test_padding_rows_are_inert(tiny, grammars, monkeypatch):
    rows = [(rid, p, dataclasses.replace(s, max_tokens=int(t.dist[0]) if t is not None else 10), t, k)
            for rid, p, s, t, k in _requests(tiny, grammars, use_sort=False)[5:8]]  # tight budgets: short runs
    _, small_steps, small = _run(tiny, rows, graph=True)  # 3 rows in a bucket of 4
    monkeypatch.setattr(gs, "BATCH_BUCKETS", (16, 512))
    core, big_steps, big = _run(tiny, rows, graph=True)  # the same rows with 13 padding rows
    assert {key.batch for key in core.graph.buckets} == {16}
    assert big_steps == small_steps
    for rid, st in small.items():
        assert big[rid].generated == st.generated  # logprobs: the forward's float sums vary with the batch shape
        assert torch.allclose(torch.tensor(big[rid].logprobs), torch.tensor(st.logprobs), atol=1e-5)
    # one decode step writes the rows' new slots and the trash slot, nothing else
    core = EngineCore(tiny.runner.model, pad_id=0, block_size=16, num_blocks=64, graph_step=True)
    seqs = [core.add_request(rid, p, s, stop_ids=(2,), table=t, table_key=k) for rid, p, s, t, k in rows]
    while core.graph.num_eager == 0:  # prefill (eager), then the first static step
        core.step()
    before = [k.clone() for k in core.kv.k]
    core.step()
    assert core.graph.num_eager == 2 and all(seq.payload.finish_reason is None for seq in seqs)
    written = {seq.block_table[(seq.num_tokens - 2) // 16] * 16 + (seq.num_tokens - 2) % 16 for seq in seqs}
    changed = set((before[0] != core.kv.k[0]).any(dim=2).any(dim=0).nonzero()[:, 0].tolist())
    assert changed - {core.kv.trash_slot} == written
    assert all(torch.equal(b[:, core.kv.pad_slot], k[:, core.kv.pad_slot]) for b, k in zip(before, core.kv.k))


def test_engine_config_graph_step_option():
    assert EngineConfig().graph_step is None and EngineConfig(graph_step=False).graph_step is False
    with pytest.raises(ValueError, match="Invalid graph_step: expected None or a bool"):
        EngineConfig(graph_step="yes")


def test_cpu_default_is_the_eager_step(tiny):
    core = EngineCore(tiny.runner.model, pad_id=0, block_size=16, num_blocks=64)
    assert core.graph is None  # on CPU only when asked


# --- CUDA: the captured graph -------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("use_sort", [False, True])
def test_captured_graph_equals_the_eager_step_on_gpu(grammars, use_sort):
    from surecall.llm import LLM

    llm = LLM(device="cuda")
    rows = _requests(llm, grammars, use_sort)
    _, eager_steps, eager = _run(llm, rows, graph=False)
    core, graph_steps, graph = _run(llm, rows, graph=True)
    assert core.graph.capture and core.graph.num_captures >= 1 and core.graph.num_replays > 5
    assert graph_steps == eager_steps
    for rid, ref in eager.items():
        assert graph[rid].generated == ref.generated
        assert torch.allclose(torch.tensor(graph[rid].logprobs), torch.tensor(ref.logprobs), atol=1e-4)


@pytest.mark.gpu
def test_the_static_step_makes_no_host_sync_on_gpu(grammars, monkeypatch):
    from surecall.llm import LLM

    llm = LLM(device="cuda")
    original = gs.GraphStep.device_step
    calls = []

    def device_step(self, bucket):
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            original(self, bucket)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        calls.append(bucket.key)

    monkeypatch.setattr(gs.GraphStep, "device_step", device_step)
    core = EngineCore(llm.runner.model, pad_id=0, block_size=16, num_blocks=256, graph_step=True)
    core.graph.capture = False  # the same function, run eagerly, so a sync raises instead of breaking capture
    seqs = [core.add_request(rid, p, s, stop_ids=(2,), table=t, table_key=k)
            for rid, p, s, t, k in _requests(llm, grammars, use_sort=True)]
    core.run_to_completion()
    assert calls and all(seq.payload.error is None for seq in seqs), [seq.payload.error for seq in seqs]


def _eager_reference_and_capturing_core(tiny):
    """One sampled request run eagerly (its finished sequence), and a core set to capture with the same request added."""
    prompt = tiny.count_tokens("user: hi\nassistant:")
    params = SamplingParams(temperature=1.0, max_tokens=6, seed=3)
    ref = EngineCore(tiny.runner.model, pad_id=0, block_size=16, num_blocks=64, graph_step=False)
    want = ref.add_request("a", prompt, params)
    ref.run_to_completion()
    core = EngineCore(tiny.runner.model, pad_id=0, block_size=16, num_blocks=64, graph_step=True)
    core.graph.capture = True
    return want, core, core.add_request("a", prompt, params)


@needs_interpreter
def test_a_failed_capture_warns_and_runs_the_step_eagerly(tiny, monkeypatch):
    def broken(self, bucket):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(gs.GraphStep, "_capture", broken)
    want, core, got = _eager_reference_and_capturing_core(tiny)
    with pytest.warns(RuntimeWarning, match="CUDA graph capture of the decode step failed"):
        core.run_to_completion()
    assert got.payload.generated == want.payload.generated and not core.graph.capture
    assert core.graph.num_eager == 5 and core.graph.num_replays == 0


@needs_interpreter
def test_a_first_replay_that_differs_from_eager_turns_graphs_off(tiny, monkeypatch):
    class WrongGraph:  # a capture that replays a different token than the eager step
        def __init__(self, step, bucket):
            self.step, self.bucket = step, bucket

        def replay(self):
            self.step.device_step(self.bucket)
            self.bucket.outputs[:, gs.OUT_TOKEN] += 1

    def fake_capture(self, bucket):
        self.device_step(bucket)
        bucket.check = bucket.outputs.clone()
        bucket.graph = WrongGraph(self, bucket)

    monkeypatch.setattr(gs.GraphStep, "_capture", fake_capture)
    want, core, got = _eager_reference_and_capturing_core(tiny)
    with pytest.warns(RuntimeWarning, match="first replay differs from the same step run eagerly"):
        core.run_to_completion()
    assert got.payload.generated == want.payload.generated and not core.graph.capture
    assert core.graph.num_replays == 1 and core.graph.num_eager == 4


def test_batches_past_the_bucket_limits_take_the_eager_step(tiny, monkeypatch):
    monkeypatch.setattr(gs, "MAX_BUCKET_KEYS", 128)  # below the smallest bucket: rows x keys never fit
    core = EngineCore(tiny.runner.model, pad_id=0, block_size=16, num_blocks=64, graph_step=True)
    seq = core.add_request("a", tiny.count_tokens("user: hi\nassistant:"), SamplingParams(temperature=0, max_tokens=4))
    many = core.add_request("b", tiny.count_tokens("user: yo\nassistant:"), SamplingParams(temperature=0, max_tokens=4),
                            stop_ids=range(3, 3 + gs.MAX_STOP_IDS + 1))
    core.run_to_completion()
    assert core.graph.num_eager == 0 and core.graph.buckets == {}
    assert len(seq.payload.generated) == 4 and len(many.payload.generated) >= 1
    monkeypatch.setattr(gs, "MAX_BUCKET_KEYS", 1 << 20)
    assert not core.graph.fits([type("W", (), {"seq": many, "start": 5, "end": 6})()])  # too many stop ids


@needs_interpreter
def test_stories260k_greedy_ids_through_the_static_step(data_dir, monkeypatch):
    import json

    from surecall.llm import LLM

    stories = data_dir / "models" / "stories260K"
    if not (stories / "hf" / "model.safetensors").is_file():
        pytest.skip(f"stories260K checkpoint not found under {stories}")
    expected = json.loads((stories / "expected_greedy.json").read_text())
    monkeypatch.setattr(gs, "MIN_KEY_BUCKET", 64)  # key buckets 64, 128, 256: rows move between them
    llm = LLM(stories / "hf", config=EngineConfig(graph_step=True))
    [result] = llm.generate([expected["prompt_ids"]], sampling=SamplingParams(temperature=0, max_tokens=256),
                            constrained=False)
    assert result.token_ids == expected["generated_ids"]  # 255 static steps, across two key-bucket edges
    graph = llm._engine.graph
    assert graph.num_eager == 255 and {key.num_keys for key in graph.buckets} == {64, 128, 256}
