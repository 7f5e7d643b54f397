"""Output-mode grammars and the output reader, without a model.

The byte DFAs of every (format, mode) accept the native call syntax and nothing that would let
text turn into a call; control ids carry sentinel bytes that no ordinary token can spell; the
reader's deltas merge into exactly its outcome; bad request parameters are typed errors.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace

import numpy as np
import pytest

from surecall.errors import RequestError
from surecall.grammars.automaton import regex_to_dfa
from surecall.grammars.options import GrammarOptions
from surecall.grammars.tool_modes import (
    SENTINEL_BASE,
    SYNTAX,
    ModeGrammar,
    compile_mode,
    control_vocab,
    ended_dfa,
    find_controls,
    mode_dfa,
    text_dfa,
)
from surecall.grammars.vocab.core import Vocab
from surecall.modes import (
    ModeSpec,
    OutputReader,
    merge_deltas,
    mode_grammar,
    mode_spec,
    read_output,
)
from surecall.tools.calls import tool_name_schema
from surecall.tools.catalog import hardened_seed_tools

TOOLS = tuple(tool_name_schema(t) for t in hardened_seed_tools())
HERMES_CONTROLS = (("<tool_call>", 1), ("</tool_call>", 2))
OPT = GrammarOptions(counted_lengths=False)  # byte-level checks: length bounds spelled out, no counter marks
VIEW = b'{"name": "file_view", "arguments": {"path": "a.py"}}'
BASH = b'{"name": "bash_execute", "arguments": {"command": "ls"}}'
S0, S1 = bytes([SENTINEL_BASE]), bytes([SENTINEL_BASE + 1])


def _dfa(kind, fmt, controls=(), parallel=True, tools=TOOLS):
    return mode_dfa(ModeGrammar(kind, fmt, tools if kind in ("auto", "calls") else (), parallel, controls=controls), OPT)[0]


# --- DFAs ----------------------------------------------------------------------------------------
def test_end_marker_keeps_edges_out_of_accepting_states():
    # outlines-core alone drops them (`x(?:ab)*` would accept "x" only); automaton._END_MARK keeps them
    for dfa in (regex_to_dfa(r"x(?:ab)*"), ended_dfa(r"x(?:ab)*")):
        assert dfa.matches(b"x") and dfa.matches(b"xab") and dfa.matches(b"xabab") and not dfa.matches(b"xa")


def test_text_is_valid_utf8_without_the_call_start():
    dfa = text_dfa(b"<tool_call>").dfa
    assert dfa.matches("héllo <tool 世界 🎺".encode()) and dfa.matches(b"") and dfa.matches(b"a <tool_cal")
    for bad in (b"x<tool_call>", b"\xff", b"\xc0\x80", b"\xed\xa0\x80", "é".encode()[:1]):
        assert not dfa.matches(bad), bad


def test_hermes_control_mode_enters_calls_only_on_the_sentinel():
    dfa = _dfa("auto", "hermes", HERMES_CONTROLS)
    call = S0 + b"\n" + VIEW + b"\n" + S1
    assert dfa.matches(b"") and dfa.matches(b"some text") and dfa.matches(call) and dfa.matches(b"hi " + call)
    assert dfa.matches(call + b"\n" + call)  # parallel: the next call starts with its own token
    assert not dfa.matches(b"<tool_call>\n" + VIEW + b"\n</tool_call>")  # spelled start: never a call
    assert not dfa.matches(b"text <tool_call> more")  # nor text
    assert not dfa.matches(call + b" trailing text")


def test_parallel_false_stops_after_one_call_in_the_grammar():
    call = S0 + b"\n" + VIEW + b"\n" + S1
    for kind in ("auto", "calls"):
        dfa = _dfa(kind, "hermes", HERMES_CONTROLS, parallel=False)
        assert dfa.matches(call) and not dfa.matches(call + b"\n" + call)


def test_required_has_no_text_and_named_subsets_hold():
    call = S0 + b"\n" + VIEW + b"\n" + S1
    dfa = _dfa("calls", "hermes", HERMES_CONTROLS)
    assert dfa.matches(call) and not dfa.matches(b"") and not dfa.matches(b"x" + call)
    only_bash = _dfa("calls", "hermes", HERMES_CONTROLS, tools=TOOLS[:1])
    assert only_bash.matches(S0 + b"\n" + BASH + b"\n" + S1) and not only_bash.matches(call)


def test_spelled_start_hermes_without_control_tokens():
    dfa = _dfa("auto", "hermes")
    call = b"<tool_call>\n" + VIEW + b"\n</tool_call>"
    assert dfa.matches(call) and dfa.matches(b"a <tool " + call) and dfa.matches(b"<tool")
    assert not dfa.matches(b"<tool_call> text")


def test_mistral_calls_are_one_list_after_the_control_token():
    dfa = _dfa("auto", "mistral", (("[TOOL_CALLS]", 5),))
    assert dfa.matches(S0 + b"[" + VIEW + b"]") and dfa.matches(b"ok " + S0 + b"[" + VIEW + b", " + BASH + b"]")
    assert not dfa.matches(b"[TOOL_CALLS][" + VIEW + b"]")
    single = _dfa("calls", "mistral", (("[TOOL_CALLS]", 5),), parallel=False)
    assert single.matches(S0 + b"[" + VIEW + b"]") and not single.matches(S0 + b"[" + VIEW + b", " + BASH + b"]")


@pytest.mark.parametrize("fmt, sep, key", [("json", b"\n", b"arguments"), ("llama3", b"; ", b"parameters")])
def test_lead_formats_a_leading_brace_is_a_call(fmt, sep, key):
    view, bash = VIEW.replace(b"arguments", key), BASH.replace(b"arguments", key)
    dfa = _dfa("auto", fmt)
    assert dfa.matches(view) and dfa.matches(view + sep + bash) and dfa.matches(b"plain {text}")
    assert not dfa.matches(b"{not a call}") and not dfa.matches(view + b" and text")
    assert _dfa("text", fmt).matches(b"{free text}")


def test_auto_with_a_json_answer_is_the_answer_or_the_calls():
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    grammar = ModeGrammar("auto", "hermes", TOOLS, True, schema=schema, controls=HERMES_CONTROLS)
    dfa = mode_dfa(grammar, OPT)[0]
    call = S0 + b"\n" + VIEW + b"\n" + S1
    assert dfa.matches(b'{"n": 3}') and dfa.matches(call) and dfa.matches(call + b"\n" + call)
    for bad in (b"", b"text", b'{"n": 3}' + call, b'{"m": 3}'):
        assert not dfa.matches(bad), bad
    vocab = _toy_vocab()
    with pytest.raises(RequestError, match="needs a format whose calls start with a control token"):
        mode_grammar(ModeSpec("auto", schema=schema), list(TOOLS), "json", vocab, where="row 2")
    assert mode_grammar(ModeSpec("auto", schema=schema), list(TOOLS), "hermes", vocab).schema == schema


# --- the sentinel vocabulary and the compiled table ------------------------------------------------
def _toy_vocab() -> Vocab:
    pieces = [bytes([b]) for b in range(256)] + [b"<tool", b"_call", b">", b"ab\xf9", b'{"', b'name"', b"", b"", b""]
    ids = {"<tool_call>": 262, "</tool_call>": 263, "<|end|>": 264}
    return Vocab(tuple(pieces), frozenset(ids.values()), (264,), 272, "hf-bpe", name="toy",
                 eos_id=264, special_tokens=ids)


def test_control_vocab_gives_sentinels_and_blocks_their_bytes():
    vocab = _toy_vocab()
    controls = find_controls(vocab, SYNTAX["hermes"])
    assert controls == (("<tool_call>", 262), ("</tool_call>", 263))
    derived = control_vocab(vocab, controls)
    assert derived.token_bytes[262] == S0 and derived.token_bytes[263] == S1
    assert 262 not in derived.special_ids and 264 in derived.special_ids
    assert {0xF8, 0xFF, 259} <= derived.special_ids  # ordinary tokens holding sentinel bytes: never allowed
    assert control_vocab(vocab, controls) is derived  # derived once per process


def test_without_the_control_id_auto_never_leaves_text():
    vocab = _toy_vocab()
    grammar = ModeGrammar("auto", "hermes", TOOLS, True, controls=find_controls(vocab, SYNTAX["hermes"]))
    table = compile_mode(grammar, vocab, use_cache=False)
    text = compile_mode(replace(grammar, kind="text", tools=()), vocab, use_cache=False)
    seen, todo = {0}, [0]
    while todo:
        s = todo.pop()
        for tok, nxt in zip(*(a.tolist() for a in table.transitions(s)), strict=True):
            if tok != 262 and nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    assert len(seen) == text.num_states and all(table.accept[s] or table.dist[s] <= 3 for s in seen)
    entered = {table.next_state(s, 262) for s in seen} - {None}
    assert entered and not entered & seen  # the control id leaves text, into the call


def test_mode_tables_list_each_tools_narrowings_and_relaxed_reasons():
    """A `tool_choice` mode table names, per tool, where it is stricter than the schema and why a
    relaxed keyword is not enforced, as a catalog's table does; the JSON answer's pairs come first."""
    vocab = _toy_vocab()
    pick = ("pick", {"type": "object", "properties": {"n": {"type": "integer", "not": {"multipleOf": 7}}},
                     "required": ["n"]})
    tags = ("tags", {"type": "object", "properties": {"t": {"type": "array", "uniqueItems": True,
                                                             "items": {"type": "string"}}}, "required": ["t"]})
    controls = find_controls(vocab, SYNTAX["hermes"])
    for kind in ("calls", "auto"):
        table = compile_mode(ModeGrammar(kind, "hermes", (pick, tags), True, controls=controls), vocab, use_cache=False)
        assert [(p, k) for p, k, _ in table.meta["narrowed"]] == [("pick#/properties/n", "not")]
        assert "integers nearest zero" in table.meta["narrowed"][0][2]
        assert table.relaxed == [("tags#/properties/t", "uniqueItems")]
        assert len(table.meta["relaxed_reasons"]) == 1 and table.meta["relaxed_reasons"][0]
    answer = {"type": "object", "properties": {"k": {"type": "integer", "not": {"multipleOf": 7}}}, "required": ["k"]}
    grammar = ModeGrammar("auto", "hermes", (pick,), True, controls=controls, schema=answer)
    table = compile_mode(grammar, vocab, use_cache=False)
    assert [(p, k) for p, k, _ in table.meta["narrowed"]] == [("/properties/k", "not"), ("pick#/properties/n", "not")]
    plain = compile_mode(ModeGrammar("text", "hermes", (), True, controls=controls), vocab, use_cache=False)
    assert "narrowed" not in plain.meta and plain.relaxed == []


# --- the output reader ------------------------------------------------------------------------------
def _ids(vocab: Vocab, *parts) -> list[int]:
    """Token ids for parts: an int is itself, bytes are one byte token each."""
    out = []
    for p in parts:
        out.extend([p] if isinstance(p, int) else list(p))
    return out


def _stream_equals(grammar, vocab, ids, rng):
    reader = OutputReader(grammar, vocab, id_prefix="call_t_")
    deltas, at = [], 0
    while at < len(ids):
        step = rng.randint(1, 4)
        deltas += reader.feed(ids[at : at + step])
        at += step
    deltas += reader.finish()
    outcome = reader.outcome()
    merged = merge_deltas(deltas)
    assert merged["content"] == outcome.content
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in merged["tool_calls"]] == [
        (c.id, c.name, c.arguments) for c in outcome.tool_calls]
    headers = [p for d in deltas for p in d.get("tool_calls", ()) if "id" in p]
    assert [h["function"]["arguments"] for h in headers] == [""] * len(outcome.tool_calls)
    return outcome


def test_reader_splits_text_and_calls_and_streams_equal():
    vocab, rng = _toy_vocab(), random.Random(0)
    grammar = ModeGrammar("auto", "hermes", TOOLS, True, controls=find_controls(vocab, SYNTAX["hermes"]))
    args = '{"path": "é/世.py"}'.encode()
    view = VIEW.replace(b'{"path": "a.py"}', args)
    ids = _ids(vocab, "Hi é ".encode(), 262, b"\n", view, b"\n", 263, b"\n", 262, b"\n", BASH, b"\n", 263, 264)
    for _ in range(5):
        outcome = _stream_equals(grammar, vocab, ids, rng)
    assert outcome.content == "Hi é " and [c.name for c in outcome.tool_calls] == ["file_view", "bash_execute"]
    assert outcome.tool_calls[0].arguments == args.decode() and outcome.tool_calls[1].parsed == {"command": "ls"}
    assert outcome.finish_reason(stopped=True) == "tool_calls" and outcome.error is None


def test_reader_holds_back_a_partial_spelled_start():
    vocab, rng = _toy_vocab(), random.Random(1)
    grammar = ModeGrammar("auto", "hermes", TOOLS, True)  # no controls: the start is spelled
    reader = OutputReader(grammar, vocab)
    assert reader.feed(_ids(vocab, b"ab<tool", b"_cal")) == [{"content": "ab"}]
    assert reader.finish() == [{"content": "<tool_cal"}]
    ids = _ids(vocab, b"x <tool_call>\n", VIEW, b"\n</tool_call>")
    outcome = _stream_equals(grammar, vocab, ids, rng)
    assert outcome.content == "x " and outcome.tool_calls[0].parsed == {"path": "a.py"}
    assert outcome.finish_reason(stopped=False) == "tool_calls"


@pytest.mark.parametrize("fmt", ["json", "llama3"])
def test_reader_lead_formats(fmt):
    vocab, rng = _toy_vocab(), random.Random(2)
    key = "parameters" if fmt == "llama3" else "arguments"
    grammar = ModeGrammar("auto", fmt, TOOLS, True)
    call = VIEW.replace(b"arguments", key.encode())
    outcome = _stream_equals(grammar, vocab, _ids(vocab, call, b"; " if fmt == "llama3" else b"\n", call), rng)
    assert outcome.content == "" and len(outcome.tool_calls) == 2
    text = _stream_equals(grammar, vocab, _ids(vocab, b"no {call} here"), rng)
    assert text.content == "no {call} here" and not text.tool_calls and text.finish_reason(False) == "length"


def test_reader_json_answer_and_invalid_arguments_are_reported():
    vocab = _toy_vocab()
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    outcome, _ = read_output(ModeGrammar("json", "json", schema=schema), vocab, _ids(vocab, b'{"a": 3}', 264))
    assert outcome.answer == {"a": 3} and outcome.error is None and outcome.finish_reason(True) == "stop"
    bad, _ = read_output(ModeGrammar("json", "json", schema=schema), vocab, _ids(vocab, b'{"b": 3}'))
    assert "JSON answer" in bad.error
    wrong = VIEW.replace(b'"path": "a.py"', b'"path": 3')
    calls, _ = read_output(ModeGrammar("calls", "json", TOOLS), vocab, _ids(vocab, wrong))
    assert "invalid arguments" in calls.tool_calls[0].error and calls.error.startswith("tool call 0")


# --- request parameters -------------------------------------------------------------------------------
NAMES = [n for n, _ in TOOLS]


def test_mode_spec_shapes():
    assert mode_spec(None, None, None, NAMES) == ModeSpec("auto")
    assert mode_spec(None, None, None, []) == ModeSpec("none")
    named = mode_spec({"type": "function", "function": {"name": "file_view"}}, True, None, NAMES)
    assert named == ModeSpec("required", ("file_view",), parallel=False)
    subset = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
        {"type": "function", "function": {"name": "file_view"}}, {"type": "function", "name": "grep_search"}]}}
    assert mode_spec(subset, False, None, NAMES) == ModeSpec("required", ("file_view", "grep_search"), False)
    assert mode_spec(None, None, {"type": "json_object"}, []).schema == {"type": "object"}
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}, "strict": True}}
    assert mode_spec("none", None, fmt, NAMES) == ModeSpec("none", schema={"type": "object"}, strict=True)


@pytest.mark.parametrize("args, match", [
    (("required", None, None, []), "tool_choice 'required' needs tools"),
    (({"type": "function", "function": {"name": "nope"}}, None, None, NAMES), "tool 'nope' is not in tools"),
    (("sometimes", None, None, NAMES), "expected one of"),
    (({"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}, None, None, NAMES), "non-empty list"),
    (({"type": "allowed_tools", "mode": "maybe", "tools": ["file_view"]}, None, None, NAMES), "'auto' or 'required'"),
    (("auto", "yes", None, NAMES), "parallel_tool_calls at row 3: expected a bool"),
    ((None, None, {"type": "xml"}, []), "response_format.type"),
    ((None, None, {"type": "json_schema", "json_schema": {"schema": {}}}, []), "non-empty 'name'"),
    (("required", None, {"type": "json_object"}, NAMES), "cannot go with required tool calls"),
])
def test_mode_spec_refuses_bad_parameters(args, match):
    with pytest.raises(RequestError, match=match):
        mode_spec(*args, where="row 3")


def test_mode_spec_value_checks():
    with pytest.raises(ValueError, match="Invalid choice"):
        ModeSpec("sometimes")
    with pytest.raises(ValueError, match="Invalid schema"):
        ModeSpec("required", schema={})
    with pytest.raises(ValueError, match="Invalid schema"):
        ModeGrammar("calls", "json", TOOLS, schema={})
    with pytest.raises(ValueError, match="Invalid kind"):
        ModeGrammar("free", "json")
    with pytest.raises(ValueError, match="needs at least one tool"):
        ModeGrammar("calls", "json")


def test_mode_grammar_kinds():
    vocab = _toy_vocab()
    assert mode_grammar(ModeSpec("none"), list(TOOLS), "hermes", vocab).kind == "text"
    spec = ModeSpec("required", ("file_view",), False)
    grammar = mode_grammar(spec, list(TOOLS), "qwen", vocab)
    assert (grammar.kind, grammar.format, [n for n, _ in grammar.tools], grammar.start_kind) == (
        "calls", "hermes", ["file_view"], "control")
    assert json.loads(grammar.key())[0] == "calls"
    assert np.array_equal(_dfa("text", "json").accept, _dfa("text", "llama3").accept)
