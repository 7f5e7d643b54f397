"""Valid-instance acceptance and relaxed-keyword regressions found on JSONSchemaBench (issue 15).

Each test names the benchmark schema it was reduced from; each checks that the valid instance is
accepted and that a nearby invalid one is still rejected (or, for pointers, where a relaxed
keyword is listed).
"""

from __future__ import annotations

import re

from surecall.grammars.options import GrammarOptions
from surecall.grammars.schema.render import grammar_dumps
from surecall.grammars.schema.to_regex import expand_marks, schema_to_regex


def accepts(schema, value_or_text, options=None) -> bool:
    options = options or GrammarOptions()
    regex = expand_marks(schema_to_regex(schema, options).regex, options.whitespace_regex())
    text = value_or_text if isinstance(value_or_text, str) else grammar_dumps(value_or_text, schema, options)
    return re.fullmatch(regex, text) is not None


def relaxed(schema, options=None) -> list[tuple[str, str]]:
    return schema_to_regex(schema, options or GrammarOptions()).relaxed


# --- key order under a union whose branch holds a counted string (Snowplow---sp_336) -----------
def test_union_branch_with_counted_string_is_rendered_in_its_declared_order():
    schema = {"oneOf": [
        {"type": "object", "properties": {"type": {"enum": ["A"]}}, "required": ["type"]},
        {"type": "object", "properties": {"errors": {"type": "array", "items": {"type": "string", "maxLength": 32}},
                                          "type": {"enum": ["B"]}}, "required": ["type", "errors"]}]}
    value = {"type": "B", "errors": ["x"]}  # written in the other order than declared
    assert grammar_dumps(value, schema) == '{"errors": ["x"], "type": "B"}'
    assert accepts(schema, value)
    assert not accepts(schema, {"type": "B", "errors": ["x" * 33]})  # maxLength still enforced


# --- origins of merged keywords survive an anyOf beside them (Handwritten---string5) -----------
def test_keyword_merged_from_all_of_is_listed_at_its_branch_inside_a_union():
    schema = {"allOf": [{"type": "string"}, {"format": "no-such-format"},
                        {"anyOf": [{"minLength": 1}, {"maxLength": 0}]}]}
    assert relaxed(schema) == [("/allOf/1", "format")]
    ref_branch = {"allOf": [{"$ref": "#/$defs/s"}, {"format": "no-such-format"}, {"anyOf": [{"maxLength": 3}]}],
                  "$defs": {"s": {"type": "string"}}}
    assert relaxed(ref_branch) == [("/allOf/1", "format")]
    assert accepts(ref_branch, '"abc"') and not accepts(ref_branch, '"abcd"')
