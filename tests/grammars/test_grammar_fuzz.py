"""Fuzzing compiled grammars over the real Llama-3 vocabulary, corpus by corpus.

For schemas sampled per subset from ../shared/data/jsonschemabench and ../shared/data/tools
(fixed seed): every random walk (free and under a tight token budget) parses and validates
against the original schema, except on keywords the table lists as relaxed; the schemas' own
valid instances, rendered in the grammar's style and tokenized by the real tokenizer, are
accepted by the table exactly when the regex accepts the text; invalid instances the table
accepts fail only on relaxed keywords. Fast runs take small schemas; `-m slow` takes more.
"""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest

from surecall.errors import CompileBudgetExceeded, SchemaError, UnsupportedSchema
from surecall.grammars.compile import compile_schema
from surecall.grammars.options import GrammarOptions
from surecall.grammars.walk import accepts, decode, random_walk, schema_violations

OPTIONS = GrammarOptions(time_budget_s=4.0)  # a slower compile counts as unsupported here (the benchmark reports it)


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SURECALL_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def llama3(data_dir):
    from conftest import cached_vocab

    return cached_vocab("llama3")


@pytest.fixture(scope="module")
def llama3_encoder(data_dir):
    tiktoken = pytest.importorskip("tiktoken")
    from tiktoken.load import load_tiktoken_bpe

    manifest = json.loads((data_dir / "tokenizers" / "manifest.json").read_text())
    entry = next(t for t in manifest["tokenizers"] if t["name"] == "llama3")
    ranks = load_tiktoken_bpe(str(data_dir / "tokenizers" / "llama3" / "tokenizer.model"))
    return tiktoken.Encoding("llama3", pat_str=entry["pretokenizer_regex"], mergeable_ranks=ranks, special_tokens={})


def corpus(data_dir, per_subset: int, max_chars: int | None, seed: int = 0) -> list[tuple[str, dict, list]]:
    """(id, schema, tests) sampled per subset with a fixed seed."""
    out = []
    for path in sorted((data_dir / "jsonschemabench").glob("*.jsonl")) + sorted((data_dir / "tools").glob("*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        items = []
        for r in rows:
            schema = r.get("schema") or r.get("parameters_json_schema") or r.get("inputSchema")
            if isinstance(schema, dict) and (max_chars is None or len(json.dumps(schema)) <= max_chars):
                items.append((r["id"], schema, r.get("tests", [])))
        out += random.Random(seed).sample(items, min(per_subset, len(items)))
    return out


def compile_or_none(schema, vocab, options):
    try:
        return compile_schema(schema, vocab, options, use_cache=False)
    except (SchemaError, CompileBudgetExceeded):
        return None  # unsupported: counted by the benchmark, not a grammar failure


def check_walks(schema_id, schema, table, vocab, rng, num_walks: int) -> list[str]:
    failures = []
    for i in range(num_walks):
        budget = int(table.dist[0]) + (1 if i % 2 else 400)
        ids = random_walk(table, vocab, rng, max_tokens=budget)
        assert len(ids) <= budget
        text = decode(vocab, ids)
        try:
            doc = json.loads(text)
        except ValueError as exc:
            failures.append(f"{schema_id}: walk does not parse ({exc}): {text[:200]!r}")
            continue
        bad, _relaxed = schema_violations(schema, doc, table.relaxed)
        if bad:
            failures.append(f"{schema_id}: {bad[:2]} in {text[:200]!r}")
    return failures


def check_instances(schema_id, schema, tests, table, regex, encoder, vocab, options) -> tuple[list[str], int]:
    from surecall.grammars.schema.render import grammar_dumps

    failures, accepted = [], 0
    matches = None if regex is None else _regex_matcher(regex)
    for case in tests:
        text = grammar_dumps(case["data"], schema, options)
        ids = encoder.encode_ordinary(text)
        assert decode(vocab, ids) == text.encode()
        by_table = accepts(table, ids)
        if matches is not None and by_table != matches(text):
            failures.append(f"{schema_id}: table {by_table} but regex {not by_table} on {text[:120]!r}")
        accepted += by_table and case["valid"]
        if by_table and not case["valid"]:
            bad, _ = schema_violations(schema, case["data"], table.relaxed)
            if bad:
                failures.append(f"{schema_id}: accepts an invalid instance: {bad[:2]}")
    return failures, accepted


def _regex_matcher(regex: str):
    """fullmatch by Python's re; by outlines-core's byte DFA past 10k characters, where re's
    backtracking can take minutes on one invalid instance (Github_medium---o71260, 19k), and where
    free-form values sit on the bracket stack (ByteDFA.matches follows its marks). Counted strings
    are spelled out (`expand_counts`): the language the table's counters enforce."""
    from surecall.grammars.schema.to_regex import expand_counts, expand_items, expand_marks
    from surecall.grammars.stack import holds_stack

    stacked = holds_stack(regex)  # free-form values on the bracket stack: kept, and the DFA's matches follow it
    ws = OPTIONS.whitespace_regex()
    regex = expand_counts(expand_items(regex, ws)) if stacked else expand_marks(regex, ws)
    if len(regex) <= 10_000 and not stacked:
        pattern = re.compile(regex, re.DOTALL)
        return lambda text: bool(pattern.fullmatch(text))
    if "(?=" in regex:  # a counted body's length lookahead: no byte DFA, and re backtracks for minutes (o1052)
        return None
    from surecall.grammars.automaton import regex_to_dfa

    dfa = regex_to_dfa(regex)
    return lambda text: dfa.matches(text.encode("utf-8", "surrogatepass"))


def _sweep(data_dir, llama3, encoder, per_subset, max_chars, num_walks, options=OPTIONS):
    from surecall.grammars.schema.to_regex import schema_to_regex

    rng = np.random.default_rng(0)
    failures, compiled, accepted = [], 0, 0
    for schema_id, schema, tests in corpus(data_dir, per_subset, max_chars):
        table = compile_or_none(schema, llama3, options)
        if table is None:
            continue
        compiled += 1
        failures += check_walks(schema_id, schema, table, llama3, rng, num_walks)
        try:
            regex = schema_to_regex(schema, options).regex
        except UnsupportedSchema:  # compiles only spliced (inlined past max_regex_length): no regex to compare
            regex = None
        more, ok = check_instances(schema_id, schema, tests, table, regex, encoder, llama3, options)
        failures += more
        accepted += ok
    return failures, compiled, accepted


def test_corpus_walks_and_instances_small(data_dir, llama3, llama3_encoder):
    failures, compiled, accepted = _sweep(data_dir, llama3, llama3_encoder, per_subset=2, max_chars=700, num_walks=4)
    assert compiled >= 20, f"only {compiled} schemas compiled"
    assert accepted > 0, "no valid instance was accepted: the instance check is vacuous"
    assert not failures, "\n".join(failures[:20])


@pytest.mark.slow
def test_corpus_walks_and_instances_wide(data_dir, llama3, llama3_encoder):
    failures, compiled, accepted = _sweep(data_dir, llama3, llama3_encoder, per_subset=8, max_chars=6000, num_walks=8,
                                          options=GrammarOptions(time_budget_s=30.0))
    assert compiled >= 60 and accepted > 0
    known = [f for f in failures if f.split(":", 1)[0] in KNOWN_UNSOUND]
    unknown = [f for f in failures if f not in known]
    assert not unknown, "\n".join(unknown[:20])
    if known:
        pytest.xfail(f"known soundness gaps: {sorted(KNOWN_UNSOUND)}")


# Open soundness gaps, each a bug to fix (not an accepted behaviour): the schema id and what goes wrong.
KNOWN_UNSOUND: dict[str, str] = {}  # none open (build-cache-node-config-schema-5, ECMA vs Python \s: fixed)


# --- the seed catalog over two real vocabularies --------------------------------------------
@pytest.mark.parametrize("name", ["llama3", "qwen2"])
def test_seed_catalog_compiles_with_bounds(name, data_dir):
    pytest.importorskip("surecall.grammars.formats")
    from conftest import cached_vocab

    from surecall.grammars.compile import compile_catalog
    from surecall.tools.catalog import hardened_seed_tools as seed_tools

    vocab = cached_vocab(name)
    table = compile_catalog(seed_tools(), vocab, tool_format="json", use_cache=False)
    assert table.num_states > 0 and np.all(table.dist >= 0)
    assert table.relaxed == [] and table.has_counts  # maxLength 8192 included: counted
    rng = np.random.default_rng(3)
    tools = {t["name"]: t["parameters"] for t in seed_tools()}
    for i in range(12):
        ids = random_walk(table, vocab, rng, max_tokens=int(table.dist[0]) + (2 if i % 2 else 300))
        call = json.loads(decode(vocab, ids))
        bad, _ = schema_violations(tools[call["name"]], call["arguments"], table.relaxed)
        assert not bad, bad


# --- CLI -------------------------------------------------------------------------------------
def test_cli_compile_and_sample(tmp_path, capsys, data_dir):
    from surecall.cli import main

    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
                                               "days": {"type": "integer", "minimum": 1, "maximum": 14}},
              "required": ["city", "days"], "additionalProperties": False}
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    assert main(["compile", str(path), "--tokenizer", "shared:llama3", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["states"] > 0 and report["relaxed"] == []
    # the cold compile was stored for the warm one (timings are reported, never compared here: hosts are noisy)
    assert report["cache_bytes"] > 0 and report["cold_ms"] > 0 and report["warm_ms"] >= 0
    assert "setup_ms" in report  # the one-time set-up, timed apart (0 when this process had done it)
    assert main(["sample", str(path), "--tokenizer", "shared:llama3", "--n", "5", "--seed", "2", "--max-tokens", "12"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 5
    for line in lines:
        doc = json.loads(line)
        assert len(doc["city"]) <= 6 and 1 <= doc["days"] <= 14


def test_cli_bad_target(capsys, data_dir):
    from surecall.cli import main

    assert main(["compile", "/no/such/schema.json", "--tokenizer", "shared:llama3"]) == 2
    assert "is not a file: expected a JSON Schema file" in capsys.readouterr().err
