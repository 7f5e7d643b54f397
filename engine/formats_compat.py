"""Tool-call formats for the engine: `surecall.grammars.formats` when present, else a fallback.

The engine needs three things from a format: its name and optional control prefix, `parse(text)
-> (name, arguments)`, and a compiled catalog table. When `surecall.grammars.formats` (the
grammar engineers' module) is importable it is used unchanged. Otherwise this module supplies
a small stand-in with the same surface: the call is one JSON object {"name", <args key>} in the
family's envelope, the arguments come from `schema_to_regex`, and the table from
`compile_regex`. It does not replace the formats module's richer rendering or aliasing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from surecall.errors import MalformedCall, RequestError, SurecallError

_SPECIAL = set(".^$*+?{}[]\\|()")


def _escape(text: str) -> str:
    """Regex-escape for the grammar compiler's syntax (escapes control characters as \\n, \\t, ...)."""
    named = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}
    return "".join(named.get(c) or ("\\" + c if c in _SPECIAL else c) for c in text)


@dataclass(frozen=True)
class FallbackFormat:
    name: str
    prefix: str = ""  # text before the JSON object (after any control token)
    suffix: str = ""
    args_key: str = "arguments"
    control_prefix: str | None = None  # a special token the engine forces before the grammar
    wrap_list: bool = False  # the object sits inside [ ... ]

    def render(self, name: str, arguments: dict) -> str:
        body = json.dumps({"name": name, self.args_key: arguments}, ensure_ascii=False)
        body = f"[{body}]" if self.wrap_list else body
        return f"{self.prefix}{body}{self.suffix}"

    def parse(self, text: str) -> tuple[str, dict]:
        body = text
        if self.control_prefix and body.lstrip().startswith(self.control_prefix):
            body = body.lstrip()[len(self.control_prefix) :]
        body = body.strip()
        for edge, cut in ((self.prefix.strip(), body.startswith), (self.suffix.strip(), body.endswith)):
            if edge and not cut(edge):
                raise MalformedCall(f"expected the {self.name} envelope {edge!r}, got {text[:60]!r}")
        body = body[len(self.prefix.strip()) : len(body) - len(self.suffix.strip())].strip()
        try:
            value = json.loads(body)
        except ValueError as exc:
            raise MalformedCall(f"the call is not valid JSON ({exc})") from exc
        if self.wrap_list:
            if not isinstance(value, list) or len(value) != 1:
                raise MalformedCall("expected a JSON list holding one call")
            value = value[0]
        if not isinstance(value, dict) or not isinstance(value.get("name"), str) or self.args_key not in value:
            raise MalformedCall(f"expected an object with 'name' and {self.args_key!r}")
        return value["name"], value[self.args_key]

    def catalog_regex(self, tools: list, options) -> tuple[str, list[tuple[str, str]]]:
        from surecall.grammars.schema_regex import schema_to_regex

        item_sep, key_sep = options.separators() if options is not None else (", ", ": ")
        branches, relaxed = [], []
        for tool in tools:
            result = schema_to_regex(tool["parameters"], options)
            relaxed += [(f"/{tool['name']}{p}", k) for p, k in result.relaxed]
            head = "{" + json.dumps("name") + key_sep + json.dumps(tool["name"], ensure_ascii=False) + item_sep
            head += json.dumps(self.args_key) + key_sep
            branches.append(_escape(head) + f"({result.regex})" + _escape("}"))
        call = "(" + "|".join(branches) + ")"
        call = _escape("[") + call + _escape("]") if self.wrap_list else call
        return _escape(self.prefix) + call + _escape(self.suffix), relaxed


FALLBACK_FORMATS = {
    "json": FallbackFormat("json"),
    "hermes": FallbackFormat("hermes", prefix="<tool_call>\n", suffix="\n</tool_call>"),
    "llama3": FallbackFormat("llama3", args_key="parameters"),
    "mistral": FallbackFormat("mistral", control_prefix="[TOOL_CALLS]", wrap_list=True),
}
FALLBACK_FORMATS["qwen2"] = FALLBACK_FORMATS["hermes"]


def _formats_module():
    try:
        from surecall.grammars import formats
    except ImportError:
        return None
    return formats


def get_format(name: str):
    module = _formats_module()
    if module is not None:
        try:
            return module.get_format(name)
        except (KeyError, ValueError, SurecallError) as exc:
            raise RequestError(f"Invalid tool_format: {exc}") from exc
    if name not in FALLBACK_FORMATS:
        raise RequestError(f"Invalid tool_format: expected one of {sorted(FALLBACK_FORMATS)}, got {name!r}")
    return FALLBACK_FORMATS[name]


def compile_tools(tools: list[dict], vocab, fmt, options, use_cache: bool = True):
    """The TokenTable of a catalog ([{name, parameters}]) in `fmt`."""
    if _formats_module() is not None:
        from surecall.grammars.compile import compile_catalog

        return compile_catalog(tools, vocab, tool_format=fmt.name, options=options, use_cache=use_cache)
    from surecall.grammars.compile import compile_regex

    regex, relaxed = fmt.catalog_regex(tools, options)
    meta = {"kind": "catalog", "format": fmt.name}
    return compile_regex(regex, vocab, options, relaxed=relaxed, use_cache=use_cache, meta=meta)


def catalog_regex(tools: list[dict], fmt, options) -> str:
    """The regex of a catalog in `fmt` (what a peer engine compiles for the same calls)."""
    module = _formats_module()
    if module is not None:
        return module.catalog_regex(tools, fmt.name, options).regex
    return fmt.catalog_regex(tools, options)[0]
