"""Spliced sub-automata (grammars/splice.py) against the inlined regex they stand for.

On schemas small enough to inline, the spliced byte DFA must be the inlined one's minimal DFA,
array for array (minimal DFAs numbered in BFS order are unique), and agree with it on random
walks, near misses and the schemas' own test instances; a schema whose inlined regex is past
max_regex_length compiles once spliced. The splice threshold is lowered so that small schemas
splice (nested pieces, unions of pieces, counted marks inside pieces).
"""

from __future__ import annotations

import json
import random

import jsonschema_rs
import numpy as np
import pytest

from surecall.errors import CompileBudgetExceeded, UnsupportedSchema
from surecall.grammars import splice, string_bodies
from surecall.grammars.automaton import ByteDFA, minimize, regex_to_dfa
from surecall.grammars.compile import compile_regex, compile_schema
from surecall.grammars.options import GrammarOptions
from surecall.grammars.schema import json_lex as lex
from surecall.grammars.schema import to_regex
from surecall.grammars.schema.to_regex import schema_to_regex
from surecall.grammars.table import TABLE_ARRAYS
from surecall.grammars.vocab.core import Vocab
from surecall.grammars.walk import accepts, decode, random_walk

_STRING_OBJECT = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 60},
                                                   "tags": {"type": "array", "items": {"type": "string"},
                                                            "maxItems": 20}},
                  "required": ["name"]}
SCHEMAS = {
    "ref_used_often": {
        "$defs": {"item": _STRING_OBJECT},
        "type": "object",
        "properties": {k: {"$ref": "#/$defs/item"} for k in "abcde"},
        "required": ["c"],
    },
    "nested_refs": {
        "$defs": {"leaf": _STRING_OBJECT,
                  "mid": {"type": "object", "properties": {"x": {"$ref": "#/$defs/leaf"},
                                                           "y": {"type": "array", "items": {"$ref": "#/$defs/leaf"}}}},
                  "top": {"type": "array", "items": {"$ref": "#/$defs/mid"}, "minItems": 1, "maxItems": 12}},
        "type": "object",
        "properties": {"p": {"$ref": "#/$defs/top"}, "q": {"$ref": "#/$defs/mid"}},
    },
    "union_of_pieces": {  # alternatives sharing a prefix: a subset construction, not singletons
        "anyOf": [
            {"type": "object", "properties": {"kind": {"const": "a"}, "v": {"type": "integer", "minimum": 3}},
             "required": ["kind"]},
            {"type": "object", "properties": {"kind": {"const": "b"}, "v": {"type": "string"}}, "required": ["kind"]},
            {"type": "array", "items": {"type": "number"}},
        ],
    },
    "free_form_values": {"type": "object", "properties": {"meta": {"type": "object"}, "any": {}}},
}


@pytest.fixture(autouse=True)
def _small_pieces(monkeypatch, tmp_path):
    monkeypatch.setattr(to_regex, "SPLICE_MIN_CHARS", 40)
    monkeypatch.setenv("SURECALL_CACHE_DIR", str(tmp_path / "cache"))


def inlined_and_spliced(schema) -> tuple[ByteDFA, ByteDFA, list[str]]:
    inlined = schema_to_regex(schema)
    spliced = schema_to_regex(schema, splice=True)
    assert not inlined.pieces
    dfa = splice.build_spliced(spliced.regex, spliced.pieces, regex_to_dfa, 2 << 30)
    return minimize(regex_to_dfa(inlined.regex)), dfa, spliced.pieces


def byte_walks(dfa: ByteDFA, rng: random.Random, num: int, max_len: int = 400) -> list[bytes]:
    """Random accepted strings of `dfa`, and for each a near miss (one byte changed or cut)."""
    out = []
    for _ in range(num):
        state, data = 0, bytearray()
        while len(data) < max_len and not (dfa.accept[state] and rng.random() < 0.3):
            live = np.flatnonzero(dfa.trans[state] >= 0)
            if not live.size:
                break
            b = int(live[rng.randrange(live.size)])
            data.append(b)
            state = int(dfa.trans[state, b])
        out.append(bytes(data))
        if data:
            miss = bytearray(data)
            miss[rng.randrange(len(miss))] = rng.randrange(256)
            out += [bytes(miss), bytes(data[:-1])]
    return out


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_spliced_dfa_is_the_inlined_minimal_dfa(name):
    inlined, spliced, pieces = inlined_and_spliced(SCHEMAS[name])
    assert pieces, "the lowered threshold should make pieces"
    assert spliced.num_states == inlined.num_states
    np.testing.assert_array_equal(spliced.trans, inlined.trans)
    np.testing.assert_array_equal(spliced.accept, inlined.accept)
    for text in byte_walks(inlined, random.Random(name), 30):
        assert spliced.matches(text) == inlined.matches(text)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_alternatives_joined_by_their_parents_give_the_same_dfa(name, monkeypatch):
    _, by_subsets, _ = inlined_and_spliced(SCHEMAS[name])
    monkeypatch.setattr(splice, "_UNION_BY_SUBSETS", 0)  # every union as its parents' union, spliced
    _, by_parents, _ = inlined_and_spliced(SCHEMAS[name])
    np.testing.assert_array_equal(by_parents.trans, by_subsets.trans)
    np.testing.assert_array_equal(by_parents.accept, by_subsets.accept)


def test_nested_pieces_hold_placeholders_of_earlier_ones():
    result = schema_to_regex(SCHEMAS["nested_refs"], splice=True)
    users = [i for i, piece in enumerate(result.pieces) if splice.placeholders_in(piece)]
    assert users, "some piece should hold another piece"
    assert all(max(splice.placeholders_in(result.pieces[i])) < i for i in users)
    assert len(result.regex) < sum(map(len, result.pieces))


def test_equal_pieces_share_a_symbol_but_keep_every_exit():
    # Pieces 0 and 2 are one language written two ways (one DFA, one symbol), leaving the start for
    # different states; piece 1 has as many states but differs.
    pieces = ["ab|ac", "xy|xz", "a(?:b|c)"]
    parent = f"{splice.placeholder(0)}1|{splice.placeholder(1)}2|{splice.placeholder(2)}3"
    dfa = splice.build_spliced(parent, pieces, regex_to_dfa, 1 << 30)
    np.testing.assert_array_equal(dfa.trans, regex_to_dfa("ab1|ac1|xy2|xz2|ab3|ac3").trans)
    first = splice._FirstOf()
    assert [first.first(regex_to_dfa(p), i) for i, p in enumerate(pieces)] == [0, 1, 0]


def test_placeholder_byte_never_reaches_the_dfa():
    for schema in SCHEMAS.values():
        _, spliced, _ = inlined_and_spliced(schema)
        assert (spliced.trans[:, splice.PLACEHOLDER_LEAD] < 0).all()


def _rows(subset: str, data_dir, count: int) -> list[dict]:
    rows = [json.loads(line) for line in (data_dir / "jsonschemabench" / f"{subset}.jsonl").open()]
    return random.Random(0).sample(rows, min(count, len(rows)))


@pytest.mark.parametrize("subset", ["Github_medium", "Kubernetes", "Snowplow"])
def test_benchmark_schemas_and_instances_agree(subset, data_dir):
    checked = 0
    for row in _rows(subset, data_dir, 12):
        try:
            inlined = schema_to_regex(row["schema"])
            if len(inlined.regex) > 20000:
                continue
        except (UnsupportedSchema, ValueError):
            continue
        want, got, _ = inlined_and_spliced(row["schema"])
        assert np.array_equal(got.trans, want.trans) and np.array_equal(got.accept, want.accept), row["id"]
        for test in row.get("tests", []):
            text = json.dumps(test.get("data"), separators=(",", ":"), ensure_ascii=False).encode()
            assert got.matches(text) == want.matches(text), row["id"]
        checked += 1
    assert checked >= 4


def _nested_arrays(levels: int) -> dict:
    """Arrays of arrays: the inlined regex doubles per level (`item(,item)*`), the DFA grows by a few states."""
    defs = {"l0": {"type": "object", "properties": {"id": {"type": "string", "format": "date-time"}},
                   "required": ["id"]}}
    for k in range(1, levels + 1):
        defs[f"l{k}"] = {"type": "array", "items": {"$ref": f"#/$defs/l{k - 1}"}}
    return {"$defs": defs, "$ref": f"#/$defs/l{levels}"}


def byte_vocab() -> Vocab:
    pieces = [bytes([b]) for b in range(256)] + [b'{"id":"', b'"}', b"[[", b"]]", b""]
    return Vocab(token_bytes=tuple(pieces), special_ids=frozenset({len(pieces) - 1}), stop_ids=(len(pieces) - 1,),
                 logits_width=len(pieces) + 3, format="test", name="splice-bytes")


def test_schema_past_max_regex_length_compiles_spliced(monkeypatch):
    monkeypatch.setattr(to_regex, "SPLICE_MIN_CHARS", 2000)
    schema = _nested_arrays(14)
    with pytest.raises(UnsupportedSchema, match="grows past max_regex_length"):
        schema_to_regex(schema)
    vocab = byte_vocab()
    table = compile_schema(schema, vocab, use_cache=False)
    assert table.meta["pieces"] >= 1
    doc = "[" * 14 + '{"id":"2024-01-02T03:04:05Z"}' + "]" * 14
    ids = [vocab.token_bytes.index(bytes([b])) for b in doc.encode()]
    assert accepts(table, ids)
    assert not accepts(table, ids[:-1])
    rng = np.random.default_rng(0)
    validator = jsonschema_rs.validator_for(schema)
    for _ in range(8):
        text = decode(vocab, random_walk(table, vocab, rng))
        assert validator.is_valid(json.loads(text)), text


def test_counted_marks_inside_pieces_make_the_same_table():
    schema = SCHEMAS["nested_refs"]
    vocab = byte_vocab()
    spliced = compile_schema(schema, vocab, use_cache=False)
    inlined = compile_regex(schema_to_regex(schema).regex, vocab, use_cache=False)
    assert spliced.meta["pieces"] >= 2
    for name in (*TABLE_ARRAYS, "count_row", "count_lo", "count_hi"):
        if hasattr(inlined, name):
            np.testing.assert_array_equal(getattr(spliced, name), getattr(inlined, name), err_msg=name)
    assert inlined.num_states == spliced.num_states


def test_item_counter_inside_a_piece_is_seen_through_its_placeholder():
    inner = {"type": "array", "items": {"type": "integer"}, "maxItems": 30}
    schema = {"type": "array", "items": {"type": "object", "properties": {"v": inner, "w": inner}}, "maxItems": 25}
    plain, spliced = schema_to_regex(schema), schema_to_regex(schema, splice=True)
    assert spliced.pieces
    outer_counted = [r for r in [plain.regex, spliced.regex] if r.startswith("\\[\\x03")]
    assert not outer_counted, "one item counter per row: the outer array is not counted"
    assert spliced.relaxed == plain.relaxed


def test_budget_and_malformed_placeholders_raise():
    result = schema_to_regex(SCHEMAS["nested_refs"], splice=True)
    with pytest.raises(CompileBudgetExceeded, match="splicing sub-automata needs more than"):
        splice.build_spliced(result.regex, result.pieces, regex_to_dfa, 64 * 1024)
    with pytest.raises(ValueError, match="Invalid piece index"):
        splice.placeholder(splice.MAX_PIECES)
    with pytest.raises(ValueError, match="Invalid placeholder: piece 3"):
        splice.build_spliced(splice.placeholder(3), ["a"], regex_to_dfa, 2 << 30)
    with pytest.raises(ValueError, match="after the lead byte has a non-index edge"):
        splice.find_placeholders(regex_to_dfa("\\x00(?:AAAA|x)"))


def test_union_past_the_state_budget_raises():
    left, right = regex_to_dfa("a[bc]*"), regex_to_dfa("a[bd]*")
    assert splice.union_dfa([left, right], 64).matches(b"abdb")
    with pytest.raises(CompileBudgetExceeded, match="splicing sub-automata needs more than 5 states"):
        splice.union_dfa([left, right], 5)


def test_check_runs_after_every_splice():
    result = schema_to_regex(SCHEMAS["nested_refs"], splice=True)
    calls = []
    splice.build_spliced(result.regex, result.pieces, regex_to_dfa, 2 << 30, lambda: calls.append(1))
    assert len(calls) >= len({i for p in [result.regex, *result.pieces] for i in splice.placeholders_in(p)})

    def out_of_time():
        raise CompileBudgetExceeded("compile ran past its time budget")

    with pytest.raises(CompileBudgetExceeded, match="time budget"):
        splice.build_spliced(result.regex, result.pieces, regex_to_dfa, 2 << 30, out_of_time)


def test_check_runs_inside_a_subset_construction_too(monkeypatch):
    """A single large splice (one subset construction of many batches) is stopped within it: the
    budget was only looked at between splices (WashingtonPost wp_53 ran 61.5 s under 60 s)."""
    left, right = regex_to_dfa("a[bc]*d"), regex_to_dfa("a[bd]*c")
    calls = []
    union = splice.union_dfa([left, right], 64, lambda: calls.append("check"))
    assert union.matches(b"abcbd") and union.matches(b"abdbc") and calls  # called inside union_dfa itself
    trans, accept, eps = splice._joined([ByteDFA(np.full((1, 256), -1, dtype=np.int32), np.zeros(1, bool)),
                                         left, right], None)
    eps[0] = [1, 1 + left.num_states]
    seen = []
    monkeypatch.setattr(splice, "_BATCH_BYTES", 1)  # one subset per batch: a check after each
    splice._determinize(trans, accept, eps, 0, 64, lambda: seen.append(1))
    assert len(seen) >= 2
    rounds = []  # minimisation looks too, once per refinement round (here the x and z branches
    # agree on acceptance, live bytes and distance until their last byte: several rounds)
    assert minimize(regex_to_dfa("x[ab]{3}y|z[ab]{3}w", minimal=False), lambda: rounds.append(1)).num_states == 10
    assert len(rounds) >= 2

    def out_of_time():
        raise CompileBudgetExceeded("compile ran past its time budget")

    with pytest.raises(CompileBudgetExceeded):
        minimize(regex_to_dfa("(?:ab|cd){3}", minimal=False), out_of_time)


def test_a_ref_is_converted_once_whatever_refs_enclose_it():
    # a chain of diamonds: l{k} -> a{k}, b{k} -> l{k+1}; each non-recursive ref converts once,
    # not once per path of enclosing refs (2^k of them)
    defs = {"l12": {"type": "integer"}}
    for k in range(11, -1, -1):
        defs[f"a{k}"] = {"type": "array", "items": {"$ref": f"#/$defs/l{k + 1}"}}
        defs[f"b{k}"] = {"type": "object", "properties": {"v": {"$ref": f"#/$defs/l{k + 1}"}}}
        defs[f"l{k}"] = {"anyOf": [{"$ref": f"#/$defs/a{k}"}, {"$ref": f"#/$defs/b{k}"}]}
    schema = {"$defs": defs, "$ref": "#/$defs/l0"}
    conv = to_regex.Converter(schema, to_regex.GrammarOptions(), splice.Pieces("\\x03"))
    regex = conv.convert(schema, "")
    assert sum(map(len, conv.ref_regex.values())) == len(defs)
    result = splice.build_spliced(regex, conv.pieces.regexes, regex_to_dfa, 2 << 30)
    assert result.matches(b"[" * 12 + b"1" + b"]" * 12)
    assert result.matches(b"{\"v\":" * 12 + b"1" + b"}" * 12)


def test_recursive_refs_convert_once_per_distinct_regex():
    # a 3-cycle: the depths of the other two refs enclosing one differ in 24 ways that give 18 regexes
    defs = {n: {"type": "object", "properties": {m: {"$ref": f"#/$defs/{m}"} for m in "abc" if m != n}}
            for n in "abc"}
    schema = {"$defs": defs, "$ref": "#/$defs/a"}
    conv = to_regex.Converter(schema, GrammarOptions(max_ref_depth=2), splice.Pieces("\\x0b"))
    conv.convert(schema, "")
    for ref, entries in conv.ref_regex.items():
        assert len({regex for _, regex in entries}) == len(entries), ref
    assert sum(map(len, conv.ref_regex.values())) == 16 + 18 + 18


def _random_recursive_schema(rng: random.Random) -> dict:
    n = rng.randint(2, 5)
    defs = {}
    for i in range(n):
        def ref():
            t = rng.randrange(n + 1)
            return {"$ref": f"#/$defs/d{t}"} if t < n else {"type": "integer"}
        shape = rng.randrange(4)
        if shape == 0:
            defs[f"d{i}"] = {"anyOf": [{"type": "object", "properties": {"p": ref(), "q": ref()}}, {"type": "null"}]}
        elif shape == 1:
            defs[f"d{i}"] = {"type": "array", "items": ref(), "maxItems": 2}
        elif shape == 2:
            defs[f"d{i}"] = {"allOf": [ref(), {"type": ["object", "null", "integer"]}]}
        else:
            defs[f"d{i}"] = {"type": "object", "properties": {f"p{j}": ref() for j in range(rng.randint(1, 3))}}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


@pytest.mark.parametrize("seed", range(3))
def test_memoised_refs_give_the_unmemoised_regex(seed):
    rng = random.Random(seed)
    for _ in range(60):
        schema, depth = _random_recursive_schema(rng), rng.randint(0, 3)
        outcomes = []
        for memo in (True, False):
            conv = to_regex.Converter(schema, GrammarOptions(max_ref_depth=depth))
            if not memo:
                conv.memo_ref = lambda ref, convert: convert()
            try:
                outcomes.append(conv.convert(schema, ""))
            except (UnsupportedSchema, RecursionError) as exc:
                outcomes.append(type(exc).__name__)
        assert outcomes[0] == outcomes[1], (schema, depth)


@pytest.mark.parametrize("name", sorted(set(SCHEMAS) - {"union_of_pieces"}))  # that one has a single string
def test_shared_string_bodies_give_the_inlined_dfa(name):
    regex = schema_to_regex(SCHEMAS[name]).regex
    assert regex.count(string_bodies.STRING_BODY) >= 2, "the schema should hold several free strings"
    np.testing.assert_array_equal(string_bodies.build_with_shared_bodies(regex, regex_to_dfa).trans, regex_to_dfa(regex).trans)
    parent = regex_to_dfa(regex.replace(string_bodies.STRING_BODY, splice.placeholder(splice.MAX_PIECES - 1)))
    assert string_bodies._overlay(parent, {string_bodies._BODY_INDEX: regex_to_dfa(string_bodies.STRING_BODY)}) is not None, "no fallback expected here"


@pytest.mark.parametrize("regex", [
    '0(?:{b}|ab)"|1(?:{b}|cd)"',  # "a" starts a body character too: the start rows overlap
    '"{b}a"|"{b}b"',  # a body can end before "a" or go on with it: the exit rows overlap
])
def test_shared_string_bodies_fall_back_where_rows_overlap(regex):
    regex = regex.format(b=string_bodies.STRING_BODY)
    parent = regex_to_dfa(regex.replace(string_bodies.STRING_BODY, splice.placeholder(splice.MAX_PIECES - 1)))
    assert string_bodies._overlay(parent, {string_bodies._BODY_INDEX: regex_to_dfa(string_bodies.STRING_BODY)}) is None
    dfa = string_bodies.build_with_shared_bodies(regex, regex_to_dfa)
    np.testing.assert_array_equal(dfa.trans, regex_to_dfa(regex).trans)
    assert dfa.matches(b'0xa"') and dfa.matches(b'1cd"') if regex[0] == "0" else dfa.matches(b'"xxab"')


def _recording(calls: list[str]):
    """regex_to_dfa, noting each regex it is given in `calls`."""
    def build(text):
        calls.append(text)
        return regex_to_dfa(text)
    return build


def test_shared_string_bodies_beside_a_splice_piece():
    """A catalog's regex holds pieces' placeholders and free strings: the bodies are laid in, the
    piece's path stays for the splice, and the result is the DFA of the bodies written inline."""
    b, piece = string_bodies.STRING_BODY, splice.placeholder(0)
    regex = f'\\{{"a": "{b}", "b": {piece}, "c": "{b}"\\}}|"{b}"'
    calls: list[str] = []
    dfa = string_bodies.build_with_shared_bodies(regex, _recording(calls))
    assert len(calls) == 1 and b not in calls[0], "one parent build, every body laid in"
    assert [i for _, i, _ in splice.find_placeholders(dfa)] == [0]
    np.testing.assert_array_equal(dfa.trans, regex_to_dfa(regex).trans)
    np.testing.assert_array_equal(dfa.accept, regex_to_dfa(regex).accept)


def test_shared_bodies_that_meet_are_written_out_and_the_rest_laid_in():
    """An integer or a number at one place (`type: [integer, number]`) share a source state: those
    two are written out again; the string bodies are still laid in (not the whole regex inlined)."""
    b = string_bodies.STRING_BODY
    integer, number = lex.INTEGER, f"(?:{lex.NUMBER})"
    regex = f'\\{{"a": "{b}", "n": (?:{integer}|{number}), "z": "{b}"\\}}'
    calls: list[str] = []
    dfa = string_bodies.build_with_shared_bodies(regex, _recording(calls))
    assert len(calls) == 2, "the first try with every body, then without the two that meet"
    assert b not in calls[1] and lex.NUMBER in calls[1]
    inlined = regex_to_dfa(regex)
    np.testing.assert_array_equal(minimize(dfa).trans, inlined.trans)
    assert dfa.matches(b'{"a": "x", "n": -1.5e3, "z": ""}') and not dfa.matches(b'{"a": "x", "n": 01, "z": ""}')


# --- free-form values: one piece per nesting level -------------------------------------------
def _depth_options(depth: int, **kw) -> GrammarOptions:
    """Free-form values unrolled `depth` containers deep (not on the bracket stack)."""
    return GrammarOptions(max_any_depth=depth, free_form_stack=False, **kw)


def _nested(levels: int) -> bytes:
    """A value `levels` containers deep, objects and arrays alternating: {"k": [{"k": [...]}]}."""
    text = "1"
    for level in range(levels):
        text = f'{{"k": {text}}}' if level % 2 else f"[{text}]"
    return text.encode()


def _spliced_dfa(schema, options=None) -> ByteDFA:
    result = schema_to_regex(schema, options, splice=True)
    return splice.build_spliced(result.regex, result.pieces, regex_to_dfa, 2 << 30)


def test_free_form_regex_grows_linearly_in_depth_with_splicing():
    def chars(depth, splice_on):
        result = schema_to_regex({"type": "object"}, _depth_options(depth), splice=splice_on)
        return len(result.regex) + sum(map(len, result.pieces))

    steps = {chars(d + 1, True) - chars(d, True) for d in range(2, 8)}
    assert len(steps) == 1 and 0 < steps.pop() < 1000  # one more level: one more short piece
    assert chars(4, False) > 3 * chars(3, False)  # inlined, each level copies the one inside 4 times


@pytest.mark.parametrize("depth", [1, 2, 3])
@pytest.mark.parametrize("schema", [{"type": "object"}, True, SCHEMAS["free_form_values"]],
                         ids=["object", "true", "properties"])
def test_spliced_free_form_levels_are_the_inlined_minimal_dfa(schema, depth):
    inlined = minimize(regex_to_dfa(schema_to_regex(schema, _depth_options(depth)).regex))
    spliced = _spliced_dfa(schema, _depth_options(depth))
    np.testing.assert_array_equal(spliced.trans, inlined.trans)
    np.testing.assert_array_equal(spliced.accept, inlined.accept)
    for text in byte_walks(inlined, random.Random(depth), 30) + [_nested(n) for n in range(depth + 2)]:
        assert spliced.matches(text) == inlined.matches(text), text


def test_deep_free_form_values_compile_spliced_and_are_cut_past_the_depth():
    dfa = _spliced_dfa(True, _depth_options(4))
    assert dfa.matches(b'{"a": {"b": {"c": [1]}}}')  # 4 containers deep
    assert dfa.matches(_nested(4)) and not dfa.matches(_nested(5))  # the cut: stricter, never looser
    unrolled = _spliced_dfa(True, _depth_options(2))
    assert unrolled.matches(_nested(2)) and not unrolled.matches(_nested(3))  # max_any_depth's default, 2
    stacked = _spliced_dfa(True)  # the default: the bracket stack, any depth
    assert stacked.matches(_nested(12)) and stacked.num_states < unrolled.num_states
    deepest = schema_to_regex(True, _depth_options(8), splice=True)  # inlined: ~4^8 times level 0
    assert len(deepest.regex) + sum(map(len, deepest.pieces)) < 10_000


def test_kubernetes_free_form_fields_v1_accepts_its_valid_instance(data_dir):
    """kb_176's declared free-form `fieldsV1` (a `{"type": "object"}`) holds a value 4 deep."""
    row = next(r for r in _rows("Kubernetes", data_dir, 10**6) if r["id"] == "Kubernetes---kb_176_Normalized")
    value = row["tests"][0]["data"]["items"][0]["metadata"]["managedFields "][0]["fieldsV1"]
    assert value == {"f:metadata": {"f:labels": {".": {}}}}
    schema = row["schema"]
    fields_v1 = next(k for k in schema["definitions"] if k.endswith("meta_v1_FieldsV1"))
    fields_schema = {"definitions": schema["definitions"], "$ref": f"#/definitions/{fields_v1}"}
    assert _spliced_dfa(fields_schema).matches(json.dumps(value).encode())  # on the bracket stack (the default)
    assert not _spliced_dfa(fields_schema, _depth_options(2)).matches(json.dumps(value).encode())  # unrolled 2 deep
    assert _spliced_dfa(fields_schema, _depth_options(4)).matches(json.dumps(value).encode())
    jsonschema_rs.validator_for(schema).validate(row["tests"][0]["data"])  # the instance is valid


_NUMERIC = {
    "numbers_and_integers": {"type": "object", "required": ["a", "b"], "properties": {
        "a": {"type": "integer"}, "b": {"type": "number"}, "c": {"type": "array", "items": {"type": "number"}},
        "d": {"type": "array", "items": {"type": "integer"}}, "e": {"type": "string"}}},
    # a number ending where a string's closing quote also leads (its last digit state would copy that row)
    "string_or_number_values": {"type": "object", "additionalProperties": {"anyOf": [
        {"type": "string"}, {"type": "number"}]}, "properties": {"x": {"type": "integer"}}},
    "number_list_in_list": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
    "formats": {"type": "object", "required": ["a", "b"], "properties": {
        "a": {"type": "string", "format": "uri"}, "b": {"type": "string", "format": "uri"},
        "c": {"type": "string", "format": "date-time"}, "d": {"type": "string", "format": "email", "maxLength": 60},
        "e": {"type": "array", "items": {"type": "string", "format": "date"}}}},
}


@pytest.mark.parametrize("name", sorted(_NUMERIC))
def test_shared_numbers_and_formats_give_the_inlined_dfa(name):
    regex = schema_to_regex(_NUMERIC[name], GrammarOptions(allow_additional_properties=True)).regex
    assert any(text in regex for text, _, _ in string_bodies._SHARED[1:]), "the schema should hold a number or format"
    dfa = string_bodies.build_with_shared_bodies(regex, regex_to_dfa)
    inlined = regex_to_dfa(regex)
    # the same language (minimal DFAs in BFS order are unique); the overlay is minimal itself
    # except where two copies of a number end alike (string_or_number_values: one extra state)
    small = minimize(dfa)
    np.testing.assert_array_equal(small.trans, inlined.trans)
    np.testing.assert_array_equal(small.accept, inlined.accept)
    assert dfa.num_states <= inlined.num_states + (1 if name == "string_or_number_values" else 0)
    # the shared path was taken (no fallback to the inlined build)
    written = string_bodies.written_with_placeholders(regex, string_bodies._SHARED)
    bodies = {index: regex_to_dfa(body) for text, index, body in string_bodies._SHARED if text in regex}
    assert string_bodies._overlay(regex_to_dfa(written), bodies) is not None


def test_pieces_leave_the_shared_bodies_placeholders_free():
    pieces = splice.Pieces("\\x0b")
    pieces.regexes = ["x"] * (splice.MAX_PIECES - splice.RESERVED_PIECES)
    with pytest.raises(CompileBudgetExceeded, match=f"more than {splice.MAX_PIECES - splice.RESERVED_PIECES}"):
        pieces.add("y")


def test_a_value_many_properties_share_is_spliced_once_and_gives_the_inlined_dfa(monkeypatch):
    """JsonSchemaStore nuget-project: one $ref under 47 properties was a 194k-character regex."""
    monkeypatch.setattr(to_regex, "SPLICE_MIN_CHARS", 2000)  # the default: the value alone is no piece
    monkeypatch.setattr(to_regex, "_REPEATED_MEMBER_CHARS", 1500)
    schema = {"$defs": {"item": {"type": "object", "properties": {"id": {"type": "integer"},
                                                                  "tags": {"type": "array", "items": {"type": "string"}}},
                                 "required": ["id"], "additionalProperties": False}},
              "type": "object", "properties": {k: {"$ref": "#/$defs/item"} for k in "abcdefghij"},
              "additionalProperties": False}
    value = schema_to_regex(schema["$defs"]["item"]).regex
    assert to_regex._SHARED_VALUE_CHARS < len(value) <= 2000 and 10 * len(value) > 1500
    inlined, spliced, pieces = inlined_and_spliced(schema)
    assert value in pieces and len(pieces) == 1  # written once, not ten times
    np.testing.assert_array_equal(spliced.trans, inlined.trans)
    np.testing.assert_array_equal(spliced.accept, inlined.accept)
    monkeypatch.setattr(to_regex, "_REPEATED_MEMBER_CHARS", 10 * len(value))  # at the limit: inlined
    assert value not in schema_to_regex(schema, splice=True).pieces


def test_every_free_form_level_is_built_once_per_process_and_changes_no_table(monkeypatch):
    """Every level of a free-form value (`any_value(d)`, the top one too) is a piece that is the same
    in every schema: compile.py builds each level's spliced DFA once per whitespace style and level
    and shares it read-only, whatever index the schema gave the piece; tables are the same as when
    the levels are built afresh."""
    from surecall.grammars import compile as compile_module

    ws = GrammarOptions().whitespace_regex()
    free = to_regex.free_value_regex(ws)
    built = []
    real = compile_module.build_with_shared_bodies
    monkeypatch.setattr(compile_module, "build_with_shared_bodies",
                        lambda r, *a: (built.append(r), real(r, *a))[1])
    monkeypatch.setattr(compile_module, "_FREE_VALUE_DFAS", {})
    vocab = byte_vocab()
    unrolled = _depth_options(2)
    first = compile_schema(SCHEMAS["free_form_values"], vocab, unrolled, use_cache=False)
    levels = [r for r in built if r == free or to_regex.placeholders_in(r) and "true|false|null" in r]
    assert built.count(free) == 1 and len(levels) == 2  # level 1 and level 2 (max_any_depth), once each
    # another schema, whose other pieces come first (the levels take other indices): nothing built again
    built.clear()
    second_schema = {"type": "object", "properties": {"ref": {"$ref": "#/$defs/big"}, "any": {}},
                     "required": ["ref", "any"],
                     "$defs": {"big": {"type": "object", "properties": {f"k{i}": {"type": "string"} for i in range(30)}}}}
    second = compile_schema(second_schema, vocab, unrolled, use_cache=False)
    assert to_regex.schema_to_regex(second_schema, unrolled, splice=True).pieces[0] != free  # another numbering
    assert built and free not in built and not any("true|false|null" in r for r in built)
    assert set(compile_module._FREE_VALUE_DFAS) == {(ws, 1), (ws, 2)}
    for dfa in compile_module._FREE_VALUE_DFAS.values():
        assert not dfa.trans.flags.writeable and not dfa.accept.flags.writeable
    compact = compile_schema({"type": "object"}, vocab, _depth_options(2, whitespace="none"), use_cache=False)
    assert len(compile_module._FREE_VALUE_DFAS) == 4 and compact.num_states > 0  # another style: its own levels
    monkeypatch.setattr(compile_module, "_FREE_VALUE_DFAS", {})
    for schema, table in ((SCHEMAS["free_form_values"], first), (second_schema, second)):
        monkeypatch.setattr(compile_module, "_FREE_VALUE_DFAS", {})
        fresh = compile_schema(schema, vocab, unrolled, use_cache=False)
        for name in TABLE_ARRAYS:
            a, b = getattr(table, name), getattr(fresh, name)
            assert (a is None and b is None) or np.array_equal(a, b), name


def test_the_bracket_stack_value_is_built_once_per_process_and_changes_no_table(monkeypatch):
    """The free-form value on the bracket stack (grammars/stack.py) is one piece, the same in every
    schema: its DFA is built once per whitespace style and shared read-only; tables are the same as
    when it is built afresh."""
    from surecall.grammars import compile as compile_module
    from surecall.grammars.stack import stack_value_regex

    ws = GrammarOptions().whitespace_regex()
    marked = stack_value_regex(ws)
    built = []
    real = compile_module.build_with_shared_bodies
    monkeypatch.setattr(compile_module, "build_with_shared_bodies", lambda r, *a: (built.append(r), real(r, *a))[1])
    monkeypatch.setattr(compile_module, "_FREE_VALUE_DFAS", {})
    vocab = byte_vocab()
    first = compile_schema(SCHEMAS["free_form_values"], vocab, use_cache=False)
    second = compile_schema({"type": "array", "items": {}}, vocab, use_cache=False)
    assert built.count(marked) == 1 and first.has_stack and second.has_stack
    assert set(compile_module._FREE_VALUE_DFAS) == {(ws, "stack")}
    assert not compile_module._FREE_VALUE_DFAS[(ws, "stack")].trans.flags.writeable
    monkeypatch.setattr(compile_module, "_FREE_VALUE_DFAS", {})
    fresh = compile_schema(SCHEMAS["free_form_values"], vocab, use_cache=False)
    for name in TABLE_ARRAYS:
        assert np.array_equal(getattr(first, name), getattr(fresh, name)), name
