"""Compile coverage of `format`s and slow spots of the schema walk (issue 15, "cover").

Every format regex stays a small byte DFA (the bounded URI of before was 4444 states and its
schemas ran past the memory budget); `uri` and `uri-reference` admit every RFC 3986 form
jsonschema-rs accepts but IPvFuture hosts (file://, urn:, mailto:, IPv6 literals) and nothing it
rejects; random walks through compiled tables validate with formats checked. The MCPspec and
Github_hard schemas that failed on `format: uri` compile. The enum filter's validator cache
keeps filtering per probe.
"""

from __future__ import annotations

import json

import jsonschema_rs
import numpy as np
import pytest

from surecall.grammars.automaton import regex_to_dfa
from surecall.grammars.compile import compile_schema
from surecall.grammars.schema.string_formats import STRING_FORMATS
from surecall.grammars.schema.to_regex import schema_to_regex
from surecall.grammars.vocab import Vocab
from surecall.grammars.walk import decode, random_walk, schema_violations

# The most states each format's minimal byte DFA may have (measured: 21-262; uri 102 with IPv6).
_MAX_FORMAT_STATES = 300


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SURECALL_CACHE_DIR", str(tmp_path / "cache"))


def _format_validator(fmt: str):
    return jsonschema_rs.validator_for({"format": fmt}, validate_formats=True)


@pytest.mark.parametrize("fmt", sorted(STRING_FORMATS))
def test_every_format_is_a_small_dfa(fmt):
    assert regex_to_dfa(STRING_FORMATS[fmt]).num_states <= _MAX_FORMAT_STATES


_URIS = ["file:///etc/hosts", "urn:isbn:0451450523", "mailto:a@b.example", "http://[::1]:8080/x",
         "https://u:p@h.example:80/p/q;r?s=t&u#f", "x:", "x:%41/b", "tag:a,b:c", "a+b.c-d://", "s://h:",
         "news:comp.lang", "http://" + "a" * 300 + ".com", "data:,A%20b", "ldap://h/c=GB?o"]
_NOT_URIS = ["//h/p", "/p", "a b:c", "x:%zz", "http://a|b", "1a:b", ":x", "http://h/a b", "x:a\u00e9",
             "http://a@b@c", "http://[::1"]
_REFERENCES = ["", "/a", "a/b", "?x", "#f", "//h/p", "a:b", "../x?y#z", "%41"]
_NOT_REFERENCES = [":a", "a b", "x:%zz", "//a|b", "[", "a#b#c"]


@pytest.mark.parametrize("fmt, good, bad", [("uri", _URIS, _NOT_URIS),
                                            ("uri-reference", _URIS + _REFERENCES, _NOT_URIS[2:] + _NOT_REFERENCES)])
def test_uri_forms_agree_with_the_validator(fmt, good, bad):
    dfa, validator = regex_to_dfa(STRING_FORMATS[fmt]), _format_validator(fmt)
    for text in good:
        assert validator.is_valid(text), text  # the case itself is right
        assert dfa.matches(text.encode()), text
    for text in bad:
        assert not validator.is_valid(text), text
        assert not dfa.matches(text.encode()), text


def byte_vocab() -> Vocab:
    pieces = [bytes([b]) for b in range(256)] + [b"http://", b"://", b'": "', b'"}', b"%2", b""]
    stop = len(pieces) - 1
    return Vocab(token_bytes=tuple(pieces), special_ids=frozenset({stop}), stop_ids=(stop,),
                 logits_width=len(pieces) + 3, format="test", name="format-synthetic")


def _walks_validate(schema: dict, vocab, walks: int, seed: int) -> None:
    """Random walks through the compiled table parse and validate, formats checked."""
    table = compile_schema(schema, vocab, use_cache=False)
    validator = jsonschema_rs.validator_for(schema, validate_formats=True)
    relaxed = {(str(p), str(k)) for p, k in table.relaxed}
    rng = np.random.default_rng(seed)
    for _ in range(walks):
        doc = json.loads(decode(vocab, random_walk(table, vocab, rng, max_tokens=400)))
        bad, _soft = schema_violations(schema, doc, table.relaxed)  # formats unchecked there
        assert bad == [], (doc, bad)
        for error in validator.iter_errors(doc):  # formats checked: only a relaxed one may fail
            where = "/" + "/".join(map(str, error.schema_path[:-1]))
            assert error.schema_path[-1] == "format" and (where, "format") in relaxed, (doc, error.message)


def test_uri_schema_walks_validate_with_formats_checked():
    schema = {"type": "object", "required": ["uri", "ref", "when"], "additionalProperties": False,
              "properties": {"uri": {"type": "string", "format": "uri", "maxLength": 60},
                             "ref": {"type": "string", "format": "uri-reference"},
                             "when": {"type": "string", "format": "date-time"}}}
    assert schema_to_regex(schema).relaxed == []
    _walks_validate(schema, byte_vocab(), walks=60, seed=1)


@pytest.fixture(scope="module")
def llama3(data_dir):
    from conftest import cached_vocab

    return cached_vocab("llama3")


def _bench_schema(data_dir, subset: str, name: str) -> dict:
    from conftest import bench_schema

    return bench_schema(data_dir, subset, name)


@pytest.mark.parametrize("subset, sid", [("MCPspec", "ReadResourceRequest"), ("MCPspec", "ReadResourceResult"),
                                         ("MCPspec", "UnsubscribeRequest"), ("Github_hard", "o1052")])
def test_uri_format_schemas_compile_and_walks_validate(data_dir, llama3, subset, sid):
    """These ran past the memory budget on the 4444-state bounded URI DFA."""
    _walks_validate(_bench_schema(data_dir, subset, sid), llama3, walks=8, seed=3)


def test_enum_filter_is_per_probe():
    """The filter's validators are cached by probe: equal probes share one, others do not."""
    schema = {"definitions": {"short": {"maxLength": 2}},
              "type": "object", "required": ["a", "b", "c"], "additionalProperties": False,
              "properties": {"a": {"enum": ["x", "yyy", 3], "type": "string"},
                             "b": {"enum": ["x", "yyy", 3], "$ref": "#/definitions/short"},
                             "c": {"enum": ["zz", "wwww"], "type": "string"}}}
    regex = schema_to_regex(schema).regex
    from surecall.grammars.automaton import regex_to_dfa as dfa_of

    dfa = dfa_of(regex)
    assert dfa.matches(b'{"a":"yyy","b":"x","c":"wwww"}')
    assert not dfa.matches(b'{"a":3,"b":"x","c":"zz"}')  # 3 is not a string
    assert not dfa.matches(b'{"a":"x","b":"yyy","c":"zz"}')  # "yyy" breaks maxLength 2


# --- recursion through allOf: the $refs the merge follows count toward max_ref_depth --------------
_PARITY = {  # Handwritten mod304's idea, small: a chain of "a"s whose depth must be even
    "allOf": [{"$ref": "#/definitions/word"}, {"$ref": "#/definitions/x0"}],
    "definitions": {"word": {"type": "object", "properties": {"a": {"$ref": "#/definitions/word"}},
                             "additionalProperties": False},
                    "x0": {"additionalProperties": {"$ref": "#/definitions/x1"}},
                    "x1": {"additionalProperties": {"$ref": "#/definitions/x0"}, "minProperties": 1}}}


def _depth(doc: dict) -> int:
    return 0 if not doc else 1 + _depth(doc["a"])


def test_recursion_through_all_of_ends_at_the_depth_limit():
    """Was a RecursionError: each merge followed the refs again without counting them."""
    regex = schema_to_regex(_PARITY).regex
    dfa = regex_to_dfa(regex)
    for depth in range(6):
        doc = json.dumps(json.loads('{"a":' * depth + "{}" + "}" * depth), separators=(",", ":"))
        assert dfa.matches(doc.encode()) == (depth in (0, 2)), doc  # word expanded 4 times: depth 3 at most
    _walks_validate(_PARITY, byte_vocab(), walks=30, seed=2)


def test_all_of_recursion_that_cannot_end_in_the_limit_is_unsupported(data_dir):
    from surecall.errors import UnsupportedSchema

    schema = _bench_schema(data_dir, "Handwritten", "mod304")  # needs 60 levels: depth a multiple of 30, not 30
    with pytest.raises(UnsupportedSchema, match=r"recursion cannot end within max_ref_depth=3"):
        schema_to_regex(schema)
