"""schema_violations: errors on relaxed keywords are told apart from real ones, $refs included.

jsonschema's error paths run through `$ref`s without naming them, so a keyword relaxed where a
reference points (`/definitions/s`) is reported at the referencing path (`/properties/x`): these
tests pin that such errors count as relaxed, in draft 4, 7 and 2020-12, and that a relaxed
keyword elsewhere explains nothing.
"""

from __future__ import annotations

import pytest

from surecall.grammars.walk import schema_violations

DRAFTS = {"draft-04": "http://json-schema.org/draft-04/schema#",
          "draft-07": "http://json-schema.org/draft-07/schema#",
          "2020-12": "https://json-schema.org/draft/2020-12/schema"}


def _schema(draft: str) -> dict:
    defs = "$defs" if draft == "2020-12" else "definitions"
    return {
        "$schema": DRAFTS[draft],
        defs: {
            "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
            "holder": {"type": "object", "properties": {"tags": {"$ref": f"#/{defs}/tags"}}},
        },
        "type": "object",
        "properties": {"x": {"$ref": f"#/{defs}/tags"}, "y": {"$ref": f"#/{defs}/holder"}},
    }


@pytest.mark.parametrize("draft", sorted(DRAFTS))
def test_relaxed_keyword_behind_a_ref_counts_as_relaxed(draft):
    schema = _schema(draft)
    defs = "$defs" if draft == "2020-12" else "definitions"
    doc = {"x": ["a", "a"], "y": {"tags": ["b", "b"]}}
    bad, soft = schema_violations(schema, doc, [(f"/{defs}/tags", "uniqueItems")])
    assert bad == [] and len(soft) == 2, (bad, soft)


@pytest.mark.parametrize("draft", sorted(DRAFTS))
def test_unrelaxed_or_elsewhere_relaxed_keyword_is_an_error(draft):
    schema = _schema(draft)
    doc = {"x": ["a", "a"]}
    bad, soft = schema_violations(schema, doc, [])
    assert len(bad) == 1 and "uniqueItems at /properties/x" in bad[0] and soft == []
    bad, soft = schema_violations(schema, doc, [("/properties/z", "uniqueItems"), ("", "uniqueItems")])
    assert len(bad) == 1 and soft == []  # a pointer that is not the keyword's own explains nothing


def test_ref_with_siblings_is_relaxed_under_the_referencing_path():
    """The compiler lists a $ref-with-siblings target's keywords at the referencing schema."""
    schema = {"$defs": {"tags": {"type": "array", "uniqueItems": True}},
              "properties": {"y": {"$ref": "#/$defs/tags", "minItems": 1}}}
    bad, soft = schema_violations(schema, {"y": [1, 1]}, [("/properties/y", "uniqueItems")])
    assert bad == [] and len(soft) == 1


def test_the_compilers_own_relaxed_list_explains_errors_behind_refs():
    from surecall.grammars.schema.to_regex import schema_to_regex

    schema = _schema("draft-07")
    relaxed = schema_to_regex(schema).relaxed
    assert ("/definitions/tags", "uniqueItems") in relaxed
    bad, soft = schema_violations(schema, {"x": ["a", "a"], "y": {"tags": ["b", "b"]}}, relaxed)
    assert bad == [] and len(soft) == 2


def test_anchor_ref_found_by_object_identity():
    """A `$ref` the pointer walk cannot follow (a draft-7 `$id` anchor) is located by identity."""
    schema = {"$schema": DRAFTS["draft-07"],
              "definitions": {"tags": {"$id": "#tags", "type": "array", "uniqueItems": True}},
              "properties": {"x": {"$ref": "#tags"}}}
    bad, soft = schema_violations(schema, {"x": [1, 1]}, [("/definitions/tags", "uniqueItems")])
    assert bad == [] and len(soft) == 1


def test_combinator_error_under_a_relaxed_location_is_relaxed():
    schema = {"properties": {"x": {"anyOf": [{"type": "array", "uniqueItems": True}, {"type": "string"}]}}}
    bad, soft = schema_violations(schema, {"x": [1, 1]}, [("/properties/x/anyOf/0", "uniqueItems")])
    assert bad == [] and len(soft) == 1
    bad, soft = schema_violations(schema, {"x": [1, 1]}, [])
    assert len(bad) == 1 and bad[0].startswith("anyOf at /properties/x")


def test_error_inside_a_relaxed_applicator_is_relaxed():
    """A value under a relaxed patternProperties is not enforced, so its type error is explained."""
    schema = {"properties": {"m": {"type": "object", "patternProperties": {".*": {"type": "string"}}}}}
    doc = {"m": {"k": 123}}
    bad, soft = schema_violations(schema, doc, [("/properties/m", "patternProperties")])
    assert bad == [] and len(soft) == 1
    bad, soft = schema_violations(schema, doc, [("/properties/other", "patternProperties")])
    assert len(bad) == 1 and "type at /properties/m/patternProperties/.*" in bad[0]


def test_multiple_of_is_judged_exactly_not_by_float_division():
    schema = {"type": "number", "multipleOf": 0.01}
    assert schema_violations(schema, 0.07, []) == ([], [])  # jsonschema alone: 0.07 / 0.01 = 7.000000000000001
    bad, _ = schema_violations(schema, 0.075, [])
    assert bad and bad[0].startswith("multipleOf")
    assert schema_violations({"multipleOf": 7}, 7 * 10**30 + 1, [])[0]


def test_contains_error_is_relaxed_when_a_keyword_inside_contains_is():
    schema = {"type": "array", "contains": {"type": "integer", "multipleOf": 11}}
    bad, soft = schema_violations(schema, [12], [("/contains", "multipleOf")])
    assert bad == [] and soft and soft[0].startswith("contains")
    bad, _ = schema_violations(schema, [12], [("/items", "multipleOf")])  # elsewhere: explains nothing
    assert bad and bad[0].startswith("contains")


@pytest.mark.parametrize("draft", sorted(DRAFTS))
@pytest.mark.parametrize("combinator", ["anyOf", "oneOf"])
def test_union_whose_branch_fails_on_a_relaxed_keyword_behind_a_ref_is_relaxed(draft, combinator):
    """The union's error sits at /properties/x, the relaxed keyword at the $ref's target: the
    branch that fails only on it explains the union's error; a value no branch nearly fits does not."""
    defs = "$defs" if draft == "2020-12" else "definitions"
    schema = {"$schema": DRAFTS[draft], defs: {"tags": {"type": "array", "uniqueItems": True}},
              "properties": {"x": {combinator: [{"anyOf": [{"$ref": f"#/{defs}/tags"}, {"type": "null"}]},
                                                {"type": "string"}]}}}
    relaxed = [(f"/{defs}/tags", "uniqueItems")]
    bad, soft = schema_violations(schema, {"x": [1, 1]}, relaxed)
    assert bad == [] and len(soft) == 1 and soft[0].startswith(f"{combinator} at /properties/x")
    bad, soft = schema_violations(schema, {"x": 5}, relaxed)  # every branch fails on `type`
    assert len(bad) == 1 and bad[0].startswith(combinator) and soft == []
    bad, soft = schema_violations(schema, {"x": [1, 1]}, [])
    assert len(bad) == 1 and soft == []


def test_a_keyword_merged_from_two_allof_branches_is_listed_at_both():
    """Handwritten---pp2's shape: two branches' multipleOf merge into one relaxed value; a walk
    breaking either one must be explained by the relaxed list (was: only the first was listed).
    Steps of 13 fraction digits: no regex writes them, not even the nearest multiples."""
    from surecall.grammars.schema.to_regex import schema_to_regex

    schema = {"type": "object", "required": ["abcd"], "allOf": [
        {"patternProperties": {"a": {"type": "array", "items": {"type": "number", "multipleOf": 2.5e-13}}}},
        {"patternProperties": {"c": {"type": "array", "items": {"multipleOf": 7e-13}}}}]}
    relaxed = set(schema_to_regex(schema).relaxed)
    assert ("/allOf/0/patternProperties/a/items", "multipleOf") in relaxed
    assert ("/allOf/1/patternProperties/c/items", "multipleOf") in relaxed
    bad, explained = schema_violations(schema, {"abcd": [2.5e-13]}, list(relaxed))
    assert not bad and explained


def test_the_same_value_merged_from_two_allof_branches_is_listed_at_both():
    """Handwritten mod306's shape: equal values of a relaxed keyword in two allOf branches; the
    validator may report either branch, so both are listed (was: the first only, and a walk that
    broke it counted as unsound)."""
    from surecall.grammars.schema.to_regex import schema_to_regex

    schema = {"allOf": [{"type": "array", "items": {"type": "object"}, "uniqueItems": True},
                        {"uniqueItems": True}]}
    relaxed = set(schema_to_regex(schema).relaxed)
    assert {("/allOf/0", "uniqueItems"), ("/allOf/1", "uniqueItems")} <= relaxed
    bad, explained = schema_violations(schema, [{}, {}], list(relaxed))
    assert not bad and explained
    bad, _ = schema_violations(schema, [{}, {}], [("/allOf/0", "uniqueItems")])
    assert bad  # listed at one branch only, the other branch's error is unexplained


@pytest.mark.parametrize(("schema", "document", "listed"), [
    ({"contains": {"const": 1}, "minContains": 2}, [1], ("", "contains")),  # the compiler lists the count as contains
    ({"contains": {"const": 1}, "maxContains": 1}, [1, 1], ("", "contains")),
    ({"propertyNames": False}, {"foo": 1}, ("", "propertyNames")),  # a false subschema: no validator keyword
    ({"properties": {"a": {"propertyNames": False}}}, {"a": {"x": 1}}, ("/properties/a", "propertyNames")),
])
def test_count_and_false_subschema_errors_are_matched_to_their_listed_keyword(schema, document, listed):
    bad, soft = schema_violations(schema, document, [listed])
    assert not bad and soft
    bad, _ = schema_violations(schema, document, [])
    assert bad  # not listed: an error


def test_a_pattern_pythons_re_cannot_read_is_reported_as_unchecked_not_raised():
    bad, soft = schema_violations({"type": "string", "pattern": "^\\p{L}+$"}, "abc", [])
    assert not bad and "cannot evaluate" in soft[0]
