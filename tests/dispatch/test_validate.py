"""Argument validation: JSON-Schema-Test-Suite 2020-12 conformance and the typed errors."""

from __future__ import annotations

import json
import os

import jsonschema_rs
import pytest

from surecall.dispatch.validate import check_canonicalisable, make_validator, validate_arguments
from surecall.errors import ArgumentValidationError, SchemaError
from surecall.tools import Tool

# Tests the suite marks that jsonschema-rs 0.61 gets wrong (measured): custom metaschemas that
# switch format assertion on or off are not honoured. Everything else must pass.
KNOWN_FAILURES = {
    ("format-assertion.json", "schema that uses custom metaschema with format-assertion: false", "format-assertion: false: invalid string"),
    ("format-assertion.json", "schema that uses custom metaschema with format-assertion: true", "format-assertion: true: invalid string"),
}
REMOTE_BASE = "http://localhost:1234/"


def _remotes_registry(remotes: str) -> jsonschema_rs.Registry:
    """Every remote the 2020-12 tests may reference, under the URI refRemote.json expects.
    Resources that reference each other are added once their targets are in (a few rounds)."""
    pending = []
    for dirpath, _, files in os.walk(remotes):
        for name in sorted(files):
            if name.endswith(".json") and "/v1" not in dirpath:
                path = os.path.join(dirpath, name)
                with open(path) as fh:
                    pending.append((REMOTE_BASE + os.path.relpath(path, remotes), json.load(fh)))
    added: list = []
    for _ in range(4):
        still = []
        for item in pending:
            try:
                jsonschema_rs.Registry([*added, item])
                added.append(item)
            except Exception:
                still.append(item)
        pending = still
    return jsonschema_rs.Registry(added)


def _suite_cases(suite: str):
    for dirpath, _, files in os.walk(os.path.join(suite, "draft2020-12")):
        for name in sorted(files):
            if name.endswith(".json"):
                with open(os.path.join(dirpath, name)) as fh:
                    for case in json.load(fh):
                        yield dirpath, name, case


def test_json_schema_test_suite_2020_12(data_dir):
    suite = data_dir / "json-schema-test-suite"
    if not suite.exists():
        pytest.skip(f"{suite} not found")
    registry = _remotes_registry(str(suite / "remotes"))
    passed, failed = 0, set()
    for dirpath, name, case in _suite_cases(str(suite)):
        # optional/format asserts formats; everywhere else format is an annotation (2020-12 default)
        validator = make_validator(case["schema"], registry=registry, validate_formats=dirpath.endswith("format"))
        for test in case["tests"]:
            if validator.is_valid(test["data"]) == test["valid"]:
                passed += 1
            else:
                failed.add((name, case["description"], test["description"]))
    print(f"JSON-Schema-Test-Suite draft2020-12: {passed} passed, {len(failed)} failed (known: {len(KNOWN_FAILURES)})")
    assert failed == KNOWN_FAILURES
    assert passed >= 2223


def test_every_failure_listed_with_its_path():
    tool = Tool.from_schema("t", {
        "type": "object", "additionalProperties": False, "required": ["a", "inner"],
        "properties": {
            "a": {"type": "integer", "maximum": 3},
            "inner": {"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "string"}}}},
        },
    })
    with pytest.raises(ArgumentValidationError, match=r"for tool 't': 3 failure\(s\)") as info:
        validate_arguments(tool, {"a": 9, "inner": {"xs": ["ok", 5]}, "zzz": 1})
    pointers = sorted(p for p, _ in info.value.errors)
    assert pointers == ["", "/a", "/inner/xs/1"]
    validate_arguments(tool, {"a": 1, "inner": {"xs": []}})


def test_arguments_must_be_an_object():
    with pytest.raises(ArgumentValidationError, match="expected a JSON object, got list"):
        validate_arguments({"type": "object"}, [1, 2])


def test_integer_beyond_2_53_rejected_before_the_schema():
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    validate_arguments(schema, {"n": 2**53 - 1})
    with pytest.raises(ArgumentValidationError, match=r"beyond 2\^53-1; RFC 8785 cannot canonicalise") as info:
        validate_arguments(schema, {"n": 2**53})
    assert info.value.errors[0][0] == "/n"
    with pytest.raises(ArgumentValidationError, match="beyond 2"):
        validate_arguments(schema, {"n": [-(2**64)]})


def test_lone_surrogates_rejected_in_values_and_keys():
    with pytest.raises(ArgumentValidationError, match="lone surrogate") as info:
        validate_arguments({"type": "object"}, {"s": "ok\ud800"})
    assert info.value.errors == [("/s", "string holds a lone surrogate; RFC 8785 needs valid Unicode")]
    with pytest.raises(ArgumentValidationError, match="object key holds a lone surrogate"):
        validate_arguments({"type": "object"}, {"a": {"\udfff": 1}})
    validate_arguments({"type": "object"}, {"s": "emoji \U0001f600 ok"})


def test_non_json_values_and_nan():
    problems = check_canonicalisable({"f": float("nan"), "b": b"x", "k": {1: 2}})
    assert [p for p, _ in problems] == ["/f", "/b", "/k/1"]
    with pytest.raises(ArgumentValidationError, match="not a finite number"):
        validate_arguments({"type": "object"}, {"x": float("inf")})


def test_oversized_arguments():
    with pytest.raises(ArgumentValidationError, match=r"more than the limit of 100 bytes"):
        validate_arguments({"type": "object"}, {"s": "x" * 200}, max_bytes=100)


def test_malformed_schema_is_a_schema_error():
    with pytest.raises(SchemaError, match="Invalid schema"):
        validate_arguments({"type": "no-such-type"}, {})
    with pytest.raises(SchemaError, match="Invalid schema"):
        validate_arguments({"type": "object", "properties": {"p": {"type": "string", "pattern": "(unclosed"}}}, {"p": "x"})
    with pytest.raises(SchemaError, match="expected a Tool or a JSON object"):
        validate_arguments(42, {})


def test_remote_refs_are_never_fetched():
    with pytest.raises(SchemaError, match="Invalid schema"):
        validate_arguments({"$ref": "http://localhost:1/never.json"}, {})


def test_too_deep_arguments():
    deep: list = []
    node = deep
    for _ in range(80):
        node.append([])
        node = node[0]
    with pytest.raises(ArgumentValidationError, match="nested deeper than 64 levels"):
        validate_arguments({"type": "object"}, {"d": deep})


def test_a_schema_is_validated_under_the_draft_it_names():
    draft7 = {
        "$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
        "properties": {"xs": {"type": "array", "items": [{"type": "integer"}], "additionalItems": False}},
        "dependencies": {"a": ["b"]},
    }
    validate_arguments(draft7, {"xs": [1]})  # array-form items: a 2020-12 validator refused the schema itself
    with pytest.raises(ArgumentValidationError, match="xs"):
        validate_arguments(draft7, {"xs": [1, 2]})  # additionalItems: false
    with pytest.raises(ArgumentValidationError, match="b"):
        validate_arguments(draft7, {"a": 1})  # draft-7 dependencies (2020-12 would ignore the keyword)
    draft2020 = {"type": "object", "properties": {"xs": {"prefixItems": [{"type": "integer"}], "items": False}}}
    with pytest.raises(ArgumentValidationError, match="xs"):
        validate_arguments(draft2020, {"xs": [1, 2]})  # no $schema: 2020-12


def test_validate_document_takes_any_json_value():
    from surecall.dispatch.validate import validate_document
    from surecall.modes import _json_answer

    schema = {"type": "array", "items": {"type": "integer"}, "maxItems": 2}
    assert validate_document(schema, [1, 2]) is None
    assert "/1" in validate_document(schema, [1, "a"])
    assert validate_document({"type": "number"}, 1.5) is None
    assert _json_answer("[1, 2]", schema) == ([1, 2], None)  # a non-object JSON answer is valid when it is
    value, problem = _json_answer("[1, 2, 3]", schema)
    assert value == [1, 2, 3] and problem.startswith("JSON answer: Invalid document")
