"""benchmarks/e2e.py's peers: the HF tokenizer built for outlines, the outlines peer, the skip path.

The tokenizer must give outlines exactly our vocabulary (same ids, same bytes); the outlines peer
must keep every row inside the call language; a missing peer is skipped with a printed reason.
Timing is the benchmark's business, not these tests'.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
from conftest import cached_vocab

E2E_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "e2e.py"


@pytest.fixture(scope="module")
def e2e():
    spec = importlib.util.spec_from_file_location("e2e_bench", E2E_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def llama3(data_dir):
    return cached_vocab("llama3")


def test_hf_tokenizer_has_our_ids_and_bytes(e2e, llama3):
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tok = e2e.hf_tokenizer(llama3)
    to_byte = {c: b for b, c in bytes_to_unicode().items()}
    by_id = {idx: piece for piece, idx in tok.get_vocab().items()}
    specials = {idx: text for text, idx in llama3.special_tokens.items()}
    for idx, raw in enumerate(llama3.token_bytes):
        if idx in specials:
            assert by_id[idx] == specials[idx]
        elif raw:
            assert bytes(to_byte[c] for c in by_id[idx]) == raw, idx
    assert len(by_id) == sum(1 for i, b in enumerate(llama3.token_bytes) if b or i in specials)
    assert tok.eos_token_id == llama3.eos_id


def test_missing_peers_are_skipped_with_a_reason(e2e, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # import raises ImportError
    monkeypatch.setitem(sys.modules, "outlines", None)
    peers = e2e.build_peers(model=None, vocab=None, regex="a")
    for name in e2e.PEERS:
        factory, seconds, reason = peers[name]
        assert factory is None and math.isnan(seconds) and reason.startswith("not importable")
    assert "peer outlines skipped: not importable" in capsys.readouterr().err


def test_outlines_peer_keeps_rows_in_the_call_language(e2e, llama3):
    pytest.importorskip("outlines", reason="outlines not installed (pip install -e .[peers])")
    import regex as re
    import torch

    from surecall.grammars.formats import catalog_regex, get_format
    from surecall.grammars.options import GrammarOptions
    from surecall.tools.catalog import hardened_seed_tools as seed_tools

    fmt = get_format("llama3")
    pattern = catalog_regex(seed_tools(), fmt, GrammarOptions(counted_lengths=False)).regex  # peers cannot count
    model = e2e.build_model("tiny", llama3.logits_width, "cpu", torch.float32)
    factory = e2e.outlines_processors(e2e.outlines_compiled(model, llama3, pattern)[0])
    prompts = torch.randint(1000, 100000, (3, 8), generator=torch.Generator().manual_seed(0)).tolist()
    free = e2e.run_hf(model, llama3, prompts, 12, None, fmt, "cpu", 0, re.compile(pattern))
    assert free["in_language"] < free["rows"]  # unconstrained random weights leave the language
    for seed in (0, 1):  # the second call reuses the processor after reset()
        run = e2e.run_hf(model, llama3, prompts, 12, factory, fmt, "cpu", seed, re.compile(pattern))
        assert run["in_language"] == run["rows"] == 3


def test_peer_tokens_stop_at_the_first_stop_id(e2e):
    """HF pads a row that stopped early with the pad (= stop) id: those are not generated tokens."""
    assert e2e._until_stop([5, 7, 2, 2, 2], {2, 3}) == [5, 7, 2]
    assert e2e._until_stop([3, 9], {2, 3}) == [3]
    assert e2e._until_stop([5, 7, 9], {2, 3}) == [5, 7, 9]
