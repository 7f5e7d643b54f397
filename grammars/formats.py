"""Tool-call formats as data, and the catalog regex: one tagged branch per tool.

A `ToolFormat` says how one model family wraps a call: the text around it (`prefix`,
`suffix`), the key that holds the arguments, whether the call sits in a JSON list, and the
control token that opens it (`control_prefix`, Mistral's `[TOOL_CALLS]`: the engine forces that
token; the grammar covers only the text after it). `catalog_regex` builds the union of calls
with each tool's name as a literal, so the name decides which arguments grammar follows.
Relaxed keywords of a catalog are named `<tool>#<json pointer>` (e.g.
`bash_execute#/properties/command`). This module does not compile automata.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from surecall.errors import MalformedCall, SchemaError, ToolDefinitionError
from surecall.grammars.options import GrammarOptions
from surecall.grammars.schema import json_lex as lex
from surecall.grammars.schema.render import grammar_dumps
from surecall.grammars.schema.to_regex import RegexResult, schema_to_regex
from surecall.grammars.strict_json import loads_strict
from surecall.grammars.tool_shape import tool_fields


@dataclass(frozen=True)
class ToolFormat:
    """How one model family writes a single tool call (data only)."""

    name: str
    args_key: str = "arguments"
    prefix: str = ""
    suffix: str = ""
    is_list: bool = False
    control_prefix: str | None = None

    def call_regex(self, tool_name: str, args_regex: str, options: GrammarOptions) -> str:
        """Regex of one call of `tool_name` whose arguments match `args_regex`."""
        ws = options.whitespace_regex()
        name = '"' + lex.escape_literal(tool_name) + '"'
        key = '"' + lex.escape_literal(self.args_key) + '"'
        call = f'\\{{{ws}"name"{ws}:{ws}{name}{ws},{ws}{key}{ws}:{ws}(?:{args_regex}){ws}\\}}'
        return f"\\[{ws}{call}{ws}\\]" if self.is_list else call

    def envelope_regex(self, calls_regex: str) -> str:
        return _literal(self.prefix) + f"(?:{calls_regex})" + _literal(self.suffix)

    def render(self, name: str, arguments: dict, schema: object = None,
               options: GrammarOptions | None = None) -> str:
        """The text the grammar accepts for this call (keys in `schema`'s order when given).

        Does not include `control_prefix` (the engine emits that token itself).
        """
        options = options or GrammarOptions()
        item_sep, key_sep = options.separators()
        args = grammar_dumps(arguments, schema if schema is not None else True, options)
        call = ("{" + json.dumps("name") + key_sep + json.dumps(name, ensure_ascii=False) + item_sep
                + json.dumps(self.args_key) + key_sep + args + "}")
        if self.is_list:
            call = "[" + call + "]"
        return self.prefix + call + self.suffix

    def parse(self, text: str) -> tuple[str, dict]:
        """(tool name, arguments) from a model's call text; MalformedCall says what is wrong."""
        body = text.strip()
        if self.control_prefix and body.startswith(self.control_prefix):
            body = body[len(self.control_prefix) :].strip()
        body = self._strip_envelope(body)
        try:
            value = loads_strict(body)  # I-JSON: duplicate names, NaN and deep nesting are refused
        except MalformedCall as exc:
            raise MalformedCall(f"{self.name} call: {exc}") from None
        if self.is_list:
            if not isinstance(value, list) or len(value) != 1:
                raise MalformedCall(f"{self.name} call must be a JSON list holding one call object")
            value = value[0]
        return self._unpack(value)

    def _strip_envelope(self, body: str) -> str:
        prefix, suffix = self.prefix.strip(), self.suffix.strip()
        if prefix:
            if not body.startswith(prefix):
                raise MalformedCall(f"{self.name} call must start with {prefix!r}")
            body = body[len(prefix) :]
        if suffix:
            if not body.rstrip().endswith(suffix):
                raise MalformedCall(f"{self.name} call must end with {suffix!r}")
            body = body.rstrip()[: -len(suffix)]
        return body.strip()

    def _unpack(self, value: object) -> tuple[str, dict]:
        if not isinstance(value, dict):
            raise MalformedCall(f"{self.name} call must be a JSON object, got {type(value).__name__}")
        expected = {"name", self.args_key}
        if set(value) != expected:
            raise MalformedCall(
                f"{self.name} call must have exactly the keys {sorted(expected)}, got {sorted(value)}")
        name, args = value["name"], value[self.args_key]
        if not isinstance(name, str):
            raise MalformedCall(f"{self.name} call 'name' must be a string, got {type(name).__name__}")
        if not isinstance(args, dict):
            raise MalformedCall(f"{self.name} call {self.args_key!r} must be an object, got {type(args).__name__}")
        return name, args


FORMATS: dict[str, ToolFormat] = {
    "json": ToolFormat(name="json"),
    "hermes": ToolFormat(name="hermes", prefix="<tool_call>\n", suffix="\n</tool_call>"),
    "llama3": ToolFormat(name="llama3", args_key="parameters"),
    "mistral": ToolFormat(name="mistral", is_list=True, control_prefix="[TOOL_CALLS]"),
}
ALIASES: dict[str, str] = {"qwen2": "hermes", "qwen": "hermes", "llama3.1": "llama3"}


def get_format(name: str | ToolFormat) -> ToolFormat:
    """The ToolFormat named `name` (or an alias); ValueError listing the known names otherwise."""
    if isinstance(name, ToolFormat):
        return name
    key = ALIASES.get(name, name)
    if key not in FORMATS:
        known = sorted([*FORMATS, *ALIASES])
        raise ValueError(f"Invalid tool format: expected one of {known}, got {name!r}")
    return FORMATS[key]


def tool_schemas(tools: list) -> list[tuple[str, object]]:
    """[(name, arguments schema)] of every tool, in any shape `grammars.tool_shape` reads."""
    out: list[tuple[str, object]] = []
    for i, tool in enumerate(tools):
        fields = tool_fields(tool, f"tool #{i}")
        if any(fields.name == seen for seen, _ in out):
            raise ToolDefinitionError(f"tool #{i}: duplicate tool name {fields.name!r}")
        out.append((fields.name, fields.schema))
    if not out:
        raise ToolDefinitionError("a tool catalog needs at least one tool")
    return out


def catalog_regex(tools: list, tool_format: str | ToolFormat = "json",
                  options: GrammarOptions | None = None) -> RegexResult:
    """Regex of one call to any tool of the catalog, in `tool_format`'s envelope."""
    fmt = get_format(tool_format)
    branches, merged = tool_branches(tool_schemas(tools), fmt, options or GrammarOptions())
    calls = "|".join(f"(?:{b})" for b in branches)
    return replace(merged, regex=fmt.envelope_regex(calls))


def tool_branches(named: list, fmt: ToolFormat, options: GrammarOptions) -> tuple[list[str], RegexResult]:
    """Each (name, schema)'s call regex in `fmt`, and one RegexResult (empty regex) with their relaxed,
    reasons and narrowed pairs, pointers prefixed by the tool's name ("name#/pointer")."""
    branches, merged = [], RegexResult(regex="")
    for name, schema in named:
        try:
            result = schema_to_regex(schema, options)
        except SchemaError as exc:
            raise type(exc)(f"tool {name!r}: {exc.reason}", f"{name}#{exc.pointer}", exc.keyword) from None
        branches.append(fmt.call_regex(name, result.regex, options))
        merged.relaxed.extend((f"{name}#{pointer}", keyword) for pointer, keyword in result.relaxed)
        merged.reasons.update({(f"{name}#{p}", k): why for (p, k), why in result.reasons.items()})
        merged.narrowed.update({(f"{name}#{p}", k): why for (p, k), why in result.narrowed.items()})
        merged.recursion_cut |= result.recursion_cut
    return branches, merged


def _literal(text: str) -> str:
    return "".join(lex.regex_char(ord(c)) if c != "\n" else "\\n" for c in text)
