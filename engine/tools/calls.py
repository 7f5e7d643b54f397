"""ToolCall and the parse-then-validate step that free (unconstrained) decoding needs.

`check_call(text, tool_format, tools)` turns generated text into a `ToolCall` and says what is
wrong with it: "malformed" (the text does not parse in the tool format) or "invalid" (it
parses but names an unknown tool or fails the tool's schema). The text is parsed as I-JSON
(`surecall.grammars.strict_json`): a duplicate object name at any level (`"name"` twice), NaN,
or nesting past a fixed depth is malformed, and no input makes the parser recurse without
bound. Validation goes through
`surecall.dispatch.validate` when present, else jsonschema-rs directly. It does not decode,
authorize or execute anything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from surecall.errors import SurecallError
from surecall.grammars.formats import ToolFormat, get_format


@dataclass
class ToolCall:
    name: str
    arguments: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"name": self.name, "arguments": self.arguments}, ensure_ascii=False)


@dataclass
class CallCheck:
    call: ToolCall | None  # None when the text does not parse
    error: str | None  # why the call is malformed or invalid; None when it is fine
    error_kind: str | None  # "malformed" | "invalid" | None


def tool_name_schema(tool: Any) -> tuple[str, dict]:
    """(name, input schema) of a tool in any shape `surecall.tools.normalise_tool` accepts."""
    from surecall.tools.normalise import normalise_tool

    normalised = normalise_tool(tool)
    return normalised.name, normalised.input_schema


def _validate(schema: dict, arguments: Any) -> str | None:
    try:
        from surecall.dispatch.validate import validate_arguments
    except ImportError:
        validate_arguments = None
    if validate_arguments is not None:
        try:
            validate_arguments(schema, arguments)
        except SurecallError as exc:
            return str(exc)
        return None
    import jsonschema_rs

    errors = [f"{'/'.join(map(str, e.instance_path)) or '/'}: {e.message}"
              for e in jsonschema_rs.Draft202012Validator(schema).iter_errors(arguments)]
    return "; ".join(errors) or None


def check_call(text: str, tool_format: str | ToolFormat, tools: list) -> CallCheck:
    """Parse `text` with the tool format (a leading control token is skipped) and validate the call."""
    try:
        name, arguments = get_format(tool_format).parse(text)
    except (SurecallError, ValueError, TypeError, KeyError) as exc:
        return CallCheck(None, f"malformed call: {exc}", "malformed")
    call = ToolCall(name, arguments if isinstance(arguments, dict) else {})
    schemas = dict(tool_name_schema(t) for t in tools)
    if name not in schemas:
        return CallCheck(call, f"invalid call: unknown tool {name!r} (expected one of {sorted(schemas)})", "invalid")
    if not isinstance(arguments, dict):
        return CallCheck(call, f"invalid call: arguments of {name!r} are not a JSON object", "invalid")
    problem = _validate(schemas[name], arguments)
    if problem:
        return CallCheck(call, f"invalid call: {problem}", "invalid")
    return CallCheck(call, None, None)
