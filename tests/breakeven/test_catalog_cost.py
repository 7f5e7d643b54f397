"""catalog-cost over the shared tools with real vocabularies, and its errors."""

from __future__ import annotations

import json

import pytest

from surecall.breakeven.catalog_cost import measure, openai_tool, render
from surecall.cli import main
from surecall.errors import ToolDefinitionError, VocabError
from surecall.models.tokenizers import load_counting_tokenizer
from surecall.tools.catalog import hardened_seed_tools as seed_tools
from surecall.tools.loading import load_tool_dicts


@pytest.fixture(scope="module")
def mistral(data_dir):
    return load_counting_tokenizer(data_dir / "tokenizers/mistral-v0.3")


def test_template_rendering_counts_each_tool(mistral, data_dir):
    tools = load_tool_dicts(data_dir / "tools/github_mcp_tools.jsonl")[:12]
    cost = measure(tools, mistral.encode, mistral.hf, num_turns=5, context_window=32768, seed=seed_tools())
    assert cost.rendering == "chat_template"
    # S_k is the growth of the rendered prompt: the whole block equals the overhead plus the parts
    whole = mistral.hf.apply_chat_template(
        [{"role": "user", "content": "Hello."}], tools=[openai_tool(t) for t in tools], add_generation_prompt=True, tokenize=False
    )
    base = mistral.hf.apply_chat_template([{"role": "user", "content": "Hello."}], add_generation_prompt=True, tokenize=False)
    grown = len(mistral.encode(whole)) - len(mistral.encode(base))
    assert abs(cost.tokens_per_turn - grown) <= len(tools)  # merges at the joins move a token or so each
    assert all(s > 10 for s in cost.tool_tokens.values())
    assert cost.t_catalog == 5 * cost.tokens_per_turn
    assert cost.to_dict()["ratio_to_seed"] == pytest.approx(cost.tokens_per_turn / cost.seed_tokens_per_turn)


def test_json_rendering_with_tiktoken(data_dir):
    tok = load_counting_tokenizer(data_dir / "tokenizers/llama3/tokenizer.model")
    tools = load_tool_dicts(data_dir / "tools/bfcl_tools.jsonl")[:50]
    cost = measure(tools, tok.encode, None, num_turns=3, context_window=8192)
    assert cost.rendering == "json"
    assert len(cost.tool_tokens) == len({t["name"] for t in tools})
    assert cost.t_catalog == 3 * sum(cost.tool_tokens.values())


def test_cli_json(data_dir, capsys):
    rc = main(["catalog-cost", "--tokenizer", str(data_dir / "tokenizers/llama3/tokenizer.model"), "--tools", "seed", "--turns", "4", "--json"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert report["num_tools"] == 4 and report["t_catalog"] == 4 * report["tokens_per_turn"]
    assert report["ratio_to_seed"] == pytest.approx(1.0)


def test_errors(tmp_path, capsys):
    with pytest.raises(VocabError, match="pass a local directory"):
        load_counting_tokenizer("meta-llama/Llama-3.1-8B")
    bad = tmp_path / "tools.json"
    bad.write_text('[{"description": "no name"}]')
    with pytest.raises(ToolDefinitionError, match="'name' must be a non-empty string"):
        load_tool_dicts(bad)
    assert main(["catalog-cost", "--tokenizer", str(tmp_path / "missing"), "--tools", "seed"]) == 2
    assert "tokenizer not found" in capsys.readouterr().err


def test_render_names_the_costliest_tools():
    tokens = {"a": 10, "b": 30, "c": 20}
    report = {"tokenizer": "t", "rendering": "json", "num_tools": 3, "mean_tool_tokens": 20.0,
              "block_overhead_tokens": 0, "tokens_per_turn": 60, "share_of_context": 60 / 1000,
              "context_window": 1000, "num_turns": 2, "t_catalog": 120, "seed_tokens_per_turn": 30,
              "ratio_to_seed": 2.0, "tool_tokens": tokens}
    text = render(report, top=2)
    assert "most expensive tools: b (30), c (20)" in text and "a (10)" not in text
    assert "costs 2.0x" in text and "6.00% of a 1000-token context" in text
