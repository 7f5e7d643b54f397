"""One resolver for `--tokenizer` and `--tools`: every command accepts the same inputs.

`catalog-cost` used to refuse the gpt2 directory and Llama-2's SentencePiece `tokenizer.model`
that `vocab` loads; here `vocab`, `compile` and `catalog-cost` each take `shared:gpt2`, the gpt2
directory and the llama2 model file, and the tools side takes `seed`, a file and `module:attr`.
"""

from __future__ import annotations

import json

import pytest

from surecall.cli import main
from surecall.commands import resolve
from surecall.errors import ToolDefinitionError, VocabError

TINY_SCHEMA = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"],
               "additionalProperties": False}
SPECS = {"shared:gpt2": "gpt2", "DATA/tokenizers/gpt2": "gpt2", "DATA/tokenizers/llama2/tokenizer.model": "llama2"}


def spec_path(spec: str, data_dir) -> str:
    if not spec.startswith("DATA/"):
        return spec
    path = data_dir / spec.removeprefix("DATA/")
    if not path.exists():
        pytest.skip(f"{path} not found")
    return str(path)


@pytest.mark.parametrize("spec", list(SPECS))
def test_catalog_cost_accepts_every_tokenizer_form(spec, data_dir, capsys):
    assert main(["catalog-cost", "--tokenizer", spec_path(spec, data_dir), "--tools", "seed", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["num_tools"] == 4 and report["tokens_per_turn"] > 100
    assert report["tokenizer"] == SPECS[spec]


@pytest.mark.parametrize("spec", list(SPECS))
def test_compile_accepts_every_tokenizer_form(spec, data_dir, tmp_path, capsys):
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(TINY_SCHEMA))
    assert main(["compile", str(schema), "--tokenizer", spec_path(spec, data_dir), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kind"] == "schema" and report["states"] > 0 and report["vocab"] == SPECS[spec]


@pytest.mark.parametrize("spec", list(SPECS))
def test_vocab_accepts_every_tokenizer_form(spec, data_dir, capsys):
    assert main(["vocab", spec_path(spec, data_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == SPECS[spec]


def test_llama2_counts_match_sentencepiece(data_dir):
    import sentencepiece

    text = 'grep_search {"pattern": "TODO", "path": "src/"}  \n\t héllo 123456'
    llama2_path = spec_path("DATA/tokenizers/llama2/tokenizer.model", data_dir)
    processor = sentencepiece.SentencePieceProcessor(model_file=llama2_path)
    assert resolve.load_counting_tokenizer(llama2_path).encode(text) == processor.encode(text)


def test_gpt2_counts_match_its_own_tiktoken_file(data_dir):
    """Offline check of the byte-level BPE reading against the shipped r50k_base.tiktoken ranks."""
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    ranks_path = spec_path("DATA/tokenizers/gpt2", data_dir) + "/r50k_base.tiktoken"
    pattern = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    enc = tiktoken.Encoding("r50k", pat_str=pattern, mergeable_ranks=load_tiktoken_bpe(ranks_path), special_tokens={})
    tok = resolve.load_counting_tokenizer(spec_path("DATA/tokenizers/gpt2", data_dir))
    for text in ['{"path": "src/main.py", "old_str": "x = 1"}', "  two  spaces\nand a newline", "ünïcode 42"]:
        assert tok.encode(text) == enc.encode(text)


def test_unknown_shared_name():
    with pytest.raises(VocabError, match="unknown shared vocabulary 'nope': expected one of"):
        resolve.load_vocab("shared:nope")
    with pytest.raises(VocabError, match="unknown shared vocabulary 'nope'"):
        resolve.load_counting_tokenizer("shared:nope")


def test_tools_forms(tmp_path, monkeypatch):
    from surecall.tools.catalog import seed_tools

    assert resolve.load_tools("seed") == seed_tools()
    path = tmp_path / "tools.jsonl"
    path.write_text(json.dumps({"type": "function", "function": {"name": "f", "parameters": TINY_SCHEMA}}) + "\n")
    assert [t["name"] for t in resolve.load_tools(str(path))] == ["f"]
    (tmp_path / "resolve_mod.py").write_text(
        "import pydantic\nclass GetWeather(pydantic.BaseModel):\n    city: str\nTOOLS = [GetWeather]\n")
    monkeypatch.chdir(tmp_path)
    tools = resolve.load_tools("resolve_mod:TOOLS")
    assert tools[0]["name"] == "get_weather" and "city" in tools[0]["parameters"]["properties"]
    with pytest.raises(ToolDefinitionError, match="cannot load resolve_mod:MISSING"):
        resolve.load_tools("resolve_mod:MISSING")
    with pytest.raises(ToolDefinitionError, match="tools file not found: nope.json"):
        resolve.load_tools("nope.json")


def test_catalog_cost_takes_a_module_attr(tmp_path, monkeypatch, data_dir, capsys):
    (tmp_path / "cost_mod.py").write_text(
        "import pydantic\nclass GetWeather(pydantic.BaseModel):\n    city: str\nTOOLS = [GetWeather]\n")
    monkeypatch.chdir(tmp_path)
    assert main(["catalog-cost", "--tokenizer", "shared:gpt2", "--tools", "cost_mod:TOOLS", "--json"]) == 0
    assert list(json.loads(capsys.readouterr().out)["tool_tokens"]) == ["get_weather"]


def test_json_depth():
    assert resolve.json_depth(1) == 0
    assert resolve.json_depth([]) == 1
    assert resolve.json_depth({"a": [1, {"b": {}}]}) == 4


def test_lint_and_compile_take_seed_and_module_attr(tmp_path, monkeypatch, data_dir, capsys):
    (tmp_path / "compile_mod.py").write_text(
        "import pydantic\nclass Flag(pydantic.BaseModel):\n    model_config = pydantic.ConfigDict(extra='forbid')\n"
        "    on: bool\nTOOLS = [Flag]\n")
    monkeypatch.chdir(tmp_path)
    assert main(["lint", "seed", "--json"]) in (0, 1)
    assert json.loads(capsys.readouterr().out)["tools"] == 4
    assert main(["compile", "compile_mod:TOOLS", "--tokenizer", "shared:gpt2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kind"] == "tools" and report["states"] > 0
