"""The engine core: paged KV blocks with prefix caching, continuous batching, preemption, faults."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

from surecall.config import SamplingParams
from surecall.core import EngineCore
from surecall.core.blocks import BlockManager
from surecall.errors import RequestError


# --- blocks --------------------------------------------------------------------------------
def test_blocks_share_cached_prefixes_and_return_every_block():
    bm = BlockManager(num_blocks=8, block_size=4)
    tokens = list(range(10))
    table, cached = bm.allocate(tokens, len(tokens), compute_from=9)
    assert cached == 0 and len(table) == 3 and bm.num_free == 5
    bm.register_full(table, tokens, num_computed=10, hashes=[])  # blocks 0-1 are full and computed
    other, cached = bm.allocate(tokens[:8] + [99, 98], 10, compute_from=9)
    assert cached == 8 and other[:2] == table[:2] and other[2] != table[2]
    assert bm.stats.hit_tokens == 8 and bm.stats.queried_tokens == 18
    bm.release(table)
    bm.release(other)
    assert bm.num_free == 8
    again, cached = bm.allocate(tokens, 10, compute_from=9)  # freed blocks stay findable
    assert cached == 8
    bm.release(again)
    different, cached = bm.allocate([7] + tokens[1:], 10, compute_from=9)  # a different first block: no hit
    assert cached == 0
    bm.release(different)


def test_blocks_evict_least_recently_freed_and_refuse_when_short():
    bm = BlockManager(num_blocks=3, block_size=2)
    a = [1, 2, 3, 4]
    table, _ = bm.allocate(a, 4, compute_from=3)
    bm.register_full(table, a, 4, [])
    bm.release(table)
    fresh, _ = bm.allocate([9, 9, 9, 9, 9, 9], 6, compute_from=5)  # takes all 3 blocks: evicts a's hashes
    assert bm.num_free == 0 and bm.cached_prefix(a, 3) == []
    assert not bm.grow(fresh, 8) and len(fresh) == 3
    bm.release(fresh)
    with pytest.raises(ValueError, match="Invalid block pool"):
        BlockManager(0, 4)


# --- the engine on the shipped model ------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    from surecall.llm import LLM

    return LLM()


def _core(llm, **kw):
    kw.setdefault("block_size", 16)
    kw.setdefault("num_blocks", 256)
    return EngineCore(llm.runner.model, pad_id=0, **kw)


def _prompt(llm, text: str) -> list[int]:
    return llm.count_tokens(text)


def _run(core, requests):
    seqs = {rid: core.add_request(rid, ids, params, stop_ids=(2,)) for rid, ids, params in requests}
    core.run_to_completion()
    return {rid: seq.payload for rid, seq in seqs.items()}


def test_greedy_equals_llm_generate(tiny):
    prompt = _prompt(tiny, "user: view the first lines of src/app.py\nassistant:")
    greedy = SamplingParams(temperature=0, max_tokens=40)
    [ref] = tiny.generate([prompt], sampling=greedy, constrained=False)
    out = _run(_core(tiny), [("a", prompt, greedy)])["a"]
    stop = [t for t in ref.token_ids]
    assert out.generated == stop[: len(out.generated)] and len(out.generated) == len(ref.token_ids)


def test_sampled_rows_do_not_depend_on_arrival_order_or_batch(tiny):
    prompts = [_prompt(tiny, f"user: request number {i} about file_{i}.py\nassistant:") for i in range(5)]
    params = [SamplingParams(temperature=1.0, max_tokens=24, seed=100 + i) for i in range(5)]
    forward = _run(_core(tiny), [(f"r{i}", p, s) for i, (p, s) in enumerate(zip(prompts, params))])
    backward = _run(_core(tiny, max_num_batched_tokens=40), [(f"r{i}", prompts[i], params[i]) for i in reversed(range(5))])
    alone = {f"r{i}": _run(_core(tiny), [(f"r{i}", prompts[i], params[i])])[f"r{i}"] for i in (0, 3)}
    for rid in forward:
        assert forward[rid].generated == backward[rid].generated
    for rid, st in alone.items():
        assert st.generated == forward[rid].generated


def test_a_request_submitted_mid_decode_finishes_first(tiny):
    core = _core(tiny)
    long_prompt = _prompt(tiny, "user: please grep for TODO everywhere\nassistant:")
    short_prompt = _prompt(tiny, "user: hi\nassistant:")
    long_ = core.add_request("long", long_prompt, SamplingParams(temperature=0, max_tokens=120), stop_ids=())
    for _ in range(10):
        core.step()
    short = core.add_request("short", short_prompt, SamplingParams(temperature=0, max_tokens=8), stop_ids=())
    finished = []
    while core.has_unfinished:
        finished += [o.request_id for o in core.step() if o.finished]
    assert finished == ["short", "long"]
    solo = _run(_core(tiny), [("short", short_prompt, SamplingParams(temperature=0, max_tokens=8))])["short"]
    assert short.payload.generated == solo.generated[: len(short.payload.generated)]
    assert long_.payload.finish_reason == "length" and len(long_.payload.generated) == 120


def test_prefix_cache_computes_a_shared_prefix_once_with_the_same_logits(tiny):
    system = _prompt(tiny, "system: you are a coding agent with four tools. " * 6)
    prompts = [system + _prompt(tiny, f" user: task {i}\nassistant:") for i in range(3)]
    params = SamplingParams(temperature=0.8, max_tokens=12, seed=7, unmasked_logprobs=True)
    cached_core = _core(tiny)
    first = _run(cached_core, [("p0", prompts[0], params)])
    rest = _run(cached_core, [(f"p{i}", prompts[i], params) for i in (1, 2)])
    stats = cached_core.stats()
    full_blocks = (len(system) // 16) * 16
    assert stats["prefix_hit_tokens"] >= 2 * full_blocks > 0
    cold = _run(_core(tiny, enable_prefix_caching=False), [(f"p{i}", prompts[i], params) for i in range(3)])
    for rid, st in {**first, **rest}.items():
        assert st.generated == cold[rid].generated
        assert torch.allclose(torch.tensor(st.unmasked_logprobs), torch.tensor(cold[rid].unmasked_logprobs), atol=1e-4)


def test_preemption_under_a_small_cache_keeps_every_output(tiny):
    prompts = [_prompt(tiny, f"user: open notes_{i}.txt and show it\nassistant:") for i in range(6)]
    params = [SamplingParams(temperature=1.0, max_tokens=30, seed=i) for i in range(6)]
    roomy = _run(_core(tiny), [(f"q{i}", p, s) for i, (p, s) in enumerate(zip(prompts, params))])
    need = max(len(p) for p in prompts) + 30
    small = _core(tiny, block_size=8, num_blocks=-(-need // 8) + 4)
    tight = _run(small, [(f"q{i}", p, s) for i, (p, s) in enumerate(zip(prompts, params))])
    assert small.num_preemptions > 0
    for rid in roomy:
        assert tight[rid].generated == roomy[rid].generated and tight[rid].finish_reason == roomy[rid].finish_reason
    assert small.blocks.num_free == small.blocks.num_blocks


def test_abort_at_any_moment_frees_every_block(tiny):
    core = _core(tiny, num_blocks=64, max_num_batched_tokens=16)
    start = core.blocks.num_free
    prompt = _prompt(tiny, "user: a longer prompt that takes several prefill chunks to get through\nassistant:")
    for moment in (0, 1, 3, 8):
        core.add_request("x", prompt, SamplingParams(temperature=1.0, max_tokens=20, seed=1))
        core.add_request("y", prompt, SamplingParams(temperature=1.0, max_tokens=20, seed=2))
        for _ in range(moment):
            core.step()
        assert core.abort("x")
        core.run_to_completion()
        assert core.blocks.num_free == start and not core.abort("x")
        assert sum(core.blocks.ref) == 0


def test_requests_that_can_never_fit_are_refused(tiny):
    core = _core(tiny, num_blocks=4, block_size=8)
    with pytest.raises(RequestError, match="do not fit the KV cache"):
        core.add_request("big", [1] * 30, SamplingParams(max_tokens=10))
    with pytest.raises(RequestError, match="exceeds the model's"):
        core.add_request("huge", [1] * 10, SamplingParams(max_tokens=core.max_model_len))
    with pytest.raises(RequestError, match="empty prompt"):
        core.add_request("empty", [], SamplingParams())
    core.add_request("ok", [1, 2, 3], SamplingParams(max_tokens=4))
    with pytest.raises(RequestError, match="still running"):
        core.add_request("ok", [1, 2, 3], SamplingParams(max_tokens=4))


def test_a_failing_step_fails_its_requests_and_the_engine_goes_on(tiny, monkeypatch):
    core = _core(tiny)
    prompt = _prompt(tiny, "user: hello\nassistant:")
    bad = core.add_request("bad", prompt, SamplingParams(temperature=0, max_tokens=5))
    real = core._forward
    calls = {"n": 0}

    def flaky(works, keep):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("device fell over")
        return real(works, keep)

    monkeypatch.setattr(core, "_forward", flaky)
    core.run_to_completion()
    assert bad.payload.finish_reason == "error" and "device fell over" in bad.payload.error
    good = _run(core, [("good", prompt, SamplingParams(temperature=0, max_tokens=5))])["good"]
    assert good.finish_reason in ("length", "stop") and good.generated
    assert core.blocks.num_free == core.blocks.num_blocks


def test_constrained_rows_with_mixed_tools_complete_valid_calls(tiny):
    from surecall.tools import hardened_seed_tools
    from surecall.tools.calls import check_call

    tools = hardened_seed_tools()
    fmt = tiny._format(None)
    catalogs = [tools, tools[:2], tools[2:]]
    core = _core(tiny)
    rows = []
    for i, cat in enumerate(catalogs * 2):
        key = tiny._table_key(cat, fmt)
        table = tiny.compile(cat)
        from surecall.core.prompts import render_prompt

        prompt = render_prompt([{"role": "user", "content": f"edit file {i}"}], tiny.tokenizer, cat, i)
        budget = int(table.dist[0]) + 3 + i  # tight budgets: the call must still complete
        seq = core.add_request(f"c{i}", prompt, SamplingParams(temperature=1.0, max_tokens=budget, seed=i),
                               table=table, table_key=key)
        rows.append((seq, cat))
    core.run_to_completion()
    for seq, cat in rows:
        st = seq.payload
        check = check_call(tiny._text(st.generated), fmt, cat)
        assert check.error is None, check.error
        assert st.finish_reason == "stop", st.error  # a complete call, even when the budget ended with it
    assert not core.grammars.users and core.grammars.current()[0] is None


def test_counted_length_bounds_hold_in_the_core_as_in_generate(tiny):
    from surecall.core.prompts import render_prompt
    from surecall.tools.calls import check_call

    tool = {"name": "note", "description": "Write a note.", "parameters": {
        "type": "object", "properties": {"text": {"type": "string", "minLength": 49, "maxLength": 60}},
        "required": ["text"], "additionalProperties": False}}
    table = tiny.compile([tool])
    assert table.meta.get("counted_fallback") is None and not table.relaxed
    fmt = tiny._format(None)
    key = tiny._table_key(tiny._row_tools([tool], 0, {}), fmt)
    core = _core(tiny)
    params = [SamplingParams(temperature=1.0, max_tokens=int(table.dist[0]) + 40, seed=i) for i in range(8)]
    prompt = render_prompt([{"role": "user", "content": "write a note"}], tiny.tokenizer, [tool], 0)
    seqs = [core.add_request(f"n{i}", prompt, p, table=table, table_key=key) for i, p in enumerate(params)]
    core.run_to_completion()
    ref = tiny.generate([[{"role": "user", "content": "write a note"}]] * 8, tools=[tool], sampling=params)
    for seq, r in zip(seqs, ref):
        text = tiny._text(seq.payload.generated)
        check = check_call(text, fmt, [tool])
        assert check.error is None, (check.error, text)
        assert 49 <= len(check.call.arguments["text"]) <= 60
        assert seq.payload.generated == r.token_ids


# --- an untested transformers version: warned once, plain path, same tokens --------------------
@pytest.mark.parametrize("version, known", [("5.17.0", True), ("5.24.0", True), ("5.20.1.dev0", True),
                                            ("5.25.0", False), ("5.16.2", False), ("4.57.1", False),
                                            ("6.0.0", False), ("main", False)])
def test_the_tested_transformers_range(version, known, monkeypatch):
    from surecall.core import kv_cache

    monkeypatch.setattr(kv_cache, "_warned_versions", set())
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert kv_cache.paged_cache_supported(version) is known
    assert len(seen) == (0 if known else 1)


def test_an_untested_transformers_version_warns_once_and_decodes_plain(tiny, monkeypatch):
    from surecall.core import kv_cache

    monkeypatch.setattr(kv_cache, "_warned_versions", set())
    monkeypatch.setattr("transformers.__version__", "5.99.0")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        plain = _core(tiny, max_num_batched_tokens=24)  # chunked prefill too
        again = _core(tiny)
    messages = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and re.search(r"transformers 5\.99\.0 is outside .*5\.17 to 5\.24.*plain decoding",
                                            messages[0])
    assert not plain.paged and plain.kv is None and not plain.blocks.enable_prefix_caching and not again.paged
    monkeypatch.undo()
    prompts = [_prompt(tiny, f"user: show me file_{i}.py and its tests\nassistant:") for i in range(3)]
    params = [SamplingParams(temperature=1.0, max_tokens=16, seed=i, unmasked_logprobs=True) for i in range(3)]
    requests = [(f"r{i}", p, s) for i, (p, s) in enumerate(zip(prompts, params))]
    paged_core = _core(tiny)
    assert paged_core.paged
    got, ref = _run(plain, requests), _run(paged_core, requests)
    for rid in ref:
        assert got[rid].generated == ref[rid].generated
        assert torch.allclose(torch.tensor(got[rid].unmasked_logprobs), torch.tensor(ref[rid].unmasked_logprobs),
                              atol=1e-4)
    assert plain.blocks.stats.hit_tokens == 0 and plain.blocks.num_free == plain.blocks.num_blocks


def test_device_tables_of_grammar_sets_seen_before_are_reused(tiny, monkeypatch):
    from surecall.core import engine as core_engine
    from surecall.core.prompts import render_prompt
    from surecall.tools import hardened_seed_tools

    tools = hardened_seed_tools()
    fmt = tiny._format(None)
    built = []
    real = core_engine.DeviceTable.from_table
    monkeypatch.setattr(core_engine.DeviceTable, "from_table", staticmethod(lambda *a: built.append(1) or real(*a)))
    core = _core(tiny)

    def run():
        for i, cat in enumerate([tools, tools[:2], tools[2:]]):
            table = tiny.compile(cat)
            prompt = render_prompt([{"role": "user", "content": f"edit file {i}"}], tiny.tokenizer, cat, i)
            core.add_request(f"t{i}", prompt, SamplingParams(temperature=1.0, max_tokens=int(table.dist[0]) + 10 * i,
                                                             seed=i), table=table, table_key=tiny._table_key(cat, fmt))
        core.run_to_completion()

    run()
    first = len(built)
    assert first >= 2  # the three grammars, then the sets left as rows finish
    run()
    assert len(built) == first  # the same sets again: nothing rebuilt


@pytest.mark.parametrize("headroom", [64, 3])
def test_dense_decode_views_give_the_plain_forwards_logprobs(tiny, monkeypatch, headroom):
    """Rows of different lengths leave at different steps (the views drop them by moving rows), a
    newcomer joins mid-decode, and a small headroom forces rebuilds: logprobs stay a plain forward's."""
    from surecall.core import kv_cache

    monkeypatch.setattr(kv_cache, "DENSE_HEADROOM", headroom)
    core = _core(tiny)
    prompts = [_prompt(tiny, "user: " + "list every file " * (1 + 3 * i) + "\nassistant:") for i in range(5)]
    seqs = [core.add_request(f"d{i}", p, SamplingParams(temperature=0.9, max_tokens=6 + 5 * i, seed=i,
                                                        unmasked_logprobs=True), stop_ids=())
            for i, p in enumerate(prompts[:4])]
    for _ in range(4):
        core.step()
    seqs.append(core.add_request("late", prompts[4], SamplingParams(temperature=0.9, max_tokens=9, seed=9,
                                                                    unmasked_logprobs=True), stop_ids=()))
    core.run_to_completion()
    decode_steps = core.num_steps
    assert 0 < core.kv.num_dense_rebuilds < decode_steps
    for prompt, seq in zip(prompts, seqs, strict=True):
        st = seq.payload
        ids = torch.tensor([prompt + st.generated])
        with torch.no_grad():
            logits = tiny.runner.model(ids).logits[0, len(prompt) - 1 : -1].float()
        ref = torch.log_softmax(logits / 0.9, -1).gather(1, ids[0, len(prompt):, None]).view(-1)
        assert torch.allclose(torch.tensor(st.unmasked_logprobs), ref, atol=1e-4), seq.request_id


def test_the_drain_policy_admits_a_new_batch_only_when_the_running_one_is_done(tiny):
    with pytest.raises(ValueError, match="Invalid scheduling policy: expected one of continuous, drain, got 'fifo'"):
        _core(tiny, scheduling="fifo")
    core = _core(tiny, scheduling="drain")
    greedy = SamplingParams(temperature=0, max_tokens=30)
    first = [core.add_request(f"a{i}", _prompt(tiny, f"user: task {i}\nassistant:"), greedy, stop_ids=()) for i in range(2)]
    core.step()
    late = core.add_request("late", _prompt(tiny, "user: hi\nassistant:"), SamplingParams(temperature=0, max_tokens=4),
                            stop_ids=())
    finished = []
    while core.has_unfinished:
        finished += [o.request_id for o in core.step() if o.finished]
    assert finished == ["a0", "a1", "late"]  # continuous batching would finish "late" first
    alone = _run(_core(tiny), [("late", late.token_ids[: late.num_prompt], SamplingParams(temperature=0, max_tokens=4))])
    assert late.payload.generated == alone["late"].generated and all(len(s.payload.generated) == 30 for s in first)
