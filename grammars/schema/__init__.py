"""surecall.grammars.schema: JSON Schema -> one regex plus the list of keywords it relaxed.

`to_regex` walks the schema; `json_lex` holds the JSON lexemes, `pattern` translates ECMA-262
patterns, `ranges` integer ranges, `string_formats` the `format` regexes, `render` the regex text.
It does not build automata or token tables (`surecall.grammars.automaton`, `compile`).
"""

from surecall.grammars.schema.to_regex import RegexResult, schema_to_regex

__all__ = ["RegexResult", "schema_to_regex"]
