"""Output modes: request parameters -> a validated ModeSpec -> a grammar; tokens -> content, calls, deltas.

`mode_spec(tool_choice, parallel_tool_calls, response_format, tool_names, where)` checks an
OpenAI-style request (RequestError naming the row and the field); `mode_grammar` turns it into
a `grammars.tool_modes.ModeGrammar` in the model's own call syntax. `OutputReader` reads the
emitted ids back incrementally: content, then per call its name once complete and its argument
bytes as they come, relying on the grammar (text never holds the call start; a call is
`{"name": ..., "<args key>": {...}}`), so it is a byte scanner, not a parser with recovery.
Its deltas merge (`merge_deltas`) into exactly `outcome()`. It does not decode or compile.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from surecall.errors import MalformedCall, RequestError
from surecall.grammars.formats import get_format
from surecall.grammars.strict_json import loads_strict
from surecall.grammars.tool_modes import ModeGrammar, call_syntax, find_controls

CHOICES = ("none", "auto", "required")
JSON_OBJECT_SCHEMA = {"type": "object"}


@dataclass(frozen=True)
class ModeSpec:
    """One request's output mode. `names`: the tools calls may name (None: every tool)."""

    choice: str = "auto"  # "none" | "auto" | "required"
    names: tuple[str, ...] | None = None
    parallel: bool = True
    schema: Any = None  # a JSON answer's schema (response_format): with "none" the answer, with "auto" answer or calls
    strict: bool = True

    def __post_init__(self):
        if self.choice not in CHOICES:
            raise ValueError(f"Invalid choice: expected one of {CHOICES}, got {self.choice!r}")
        if not isinstance(self.parallel, bool):
            raise ValueError(f"Invalid parallel: expected a bool, got {self.parallel!r}")
        if self.schema is not None and self.choice == "required":
            raise ValueError("Invalid schema: a JSON answer cannot go with choice 'required'")


# --- request parameters -> ModeSpec -----------------------------------------------------------------
def mode_spec(tool_choice=None, parallel_tool_calls=None, response_format=None, tool_names=None,
              where: str = "request") -> ModeSpec:
    """The validated mode of one request; RequestError naming `where` and the field otherwise."""
    names = list(tool_names or [])
    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise RequestError(f"Invalid parallel_tool_calls at {where}: expected a bool, got {parallel_tool_calls!r}")
    schema, strict = _response_format(response_format, where)
    if tool_choice is not None and not names:
        raise RequestError(f"Invalid tool_choice at {where}: tool_choice {tool_choice!r} needs tools, got none")
    choice, subset, named = _tool_choice(tool_choice, names, where)
    if schema is not None and names and choice == "required":
        raise RequestError(f"Invalid response_format at {where}: a JSON answer cannot go with required tool calls")
    parallel = False if named else (True if parallel_tool_calls is None else parallel_tool_calls)
    return ModeSpec(choice if names else "none", subset, parallel, schema, strict)


def _tool_choice(value, names: list[str], where: str) -> tuple[str, tuple | None, bool]:
    """(choice, allowed names or None, named) of an OpenAI tool_choice."""
    if value is None:
        return ("auto" if names else "none"), None, False
    if isinstance(value, str):
        if value not in CHOICES:
            raise RequestError(f"Invalid tool_choice at {where}: expected one of {CHOICES} or an object, got {value!r}")
        return value, None, False
    if not isinstance(value, dict):
        raise RequestError(f"Invalid tool_choice at {where}: expected a string or an object, got {type(value).__name__}")
    kind = value.get("type")
    if kind == "function":
        name = _choice_name(value, where)
        return "required", (_known(name, names, where),), True
    if kind == "allowed_tools":
        inner = value.get("allowed_tools", value)
        mode, tools = inner.get("mode", "auto"), inner.get("tools")
        if mode not in ("auto", "required"):
            raise RequestError(f"Invalid tool_choice.allowed_tools.mode at {where}: expected 'auto' or 'required', got {mode!r}")
        if not isinstance(tools, list) or not tools:
            raise RequestError(f"Invalid tool_choice.allowed_tools.tools at {where}: expected a non-empty list, got {tools!r}")
        subset = tuple(dict.fromkeys(_known(_choice_name(t, where), names, where) for t in tools))
        return mode, subset, False
    raise RequestError(f"Invalid tool_choice.type at {where}: expected 'function' or 'allowed_tools', got {kind!r}")


def _choice_name(entry, where: str) -> str:
    """The tool name of {"type":"function","function":{"name":..}}, {"type":"function","name":..} or a string."""
    if isinstance(entry, str):
        return entry
    if isinstance(entry, dict):
        inner = entry.get("function") if isinstance(entry.get("function"), dict) else entry
        if isinstance(inner.get("name"), str):
            return inner["name"]
    raise RequestError(f"Invalid tool_choice at {where}: expected a function name, got {entry!r}")


def _known(name: str, names: list[str], where: str) -> str:
    if name not in names:
        raise RequestError(f"Invalid tool_choice at {where}: tool {name!r} is not in tools (expected one of {sorted(names)})")
    return name


def _response_format(value, where: str) -> tuple[Any, bool]:
    """(schema or None, strict) of an OpenAI response_format."""
    if value is None:
        return None, True
    if not isinstance(value, dict):
        raise RequestError(f"Invalid response_format at {where}: expected an object, got {type(value).__name__}")
    kind = value.get("type")
    if kind == "text":
        return None, True
    if kind == "json_object":
        return JSON_OBJECT_SCHEMA, False
    if kind != "json_schema":
        raise RequestError(f"Invalid response_format.type at {where}: expected 'text', 'json_object' or 'json_schema', got {kind!r}")
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"]:
        raise RequestError(f"Invalid response_format.json_schema at {where}: expected an object with a non-empty 'name', got {spec!r}")
    schema, strict = spec.get("schema", {}), spec.get("strict", False)
    if not isinstance(schema, (dict, bool)) or not isinstance(strict, bool):
        raise RequestError(f"Invalid response_format.json_schema at {where}: expected 'schema' an object and 'strict' a bool, got {schema!r}, {strict!r}")
    return schema, strict


# --- ModeSpec -> grammar -----------------------------------------------------------------------------
def mode_grammar(spec: ModeSpec, tools: list[tuple[str, Any]], tool_format, vocab, where: str = "request") -> ModeGrammar:
    """The grammar of `spec` over the (name, schema) tools in `tool_format`'s syntax for `vocab`.

    A JSON answer with `auto` (the answer, or calls) needs a control-token call start: where the
    call start is text or a `{`, an answer and a call would begin alike (RequestError).
    """
    fmt = get_format(tool_format)
    controls = find_controls(vocab, call_syntax(fmt))
    if spec.schema is not None and spec.choice == "none":
        return ModeGrammar("json", fmt.name, schema=spec.schema, controls=controls)
    if spec.choice == "none":
        return ModeGrammar("text", fmt.name, controls=controls)
    chosen = tuple((n, s) for n, s in tools if spec.names is None or n in spec.names)
    grammar = ModeGrammar("auto" if spec.choice == "auto" else "calls", fmt.name, chosen, spec.parallel,
                          schema=spec.schema, controls=controls)
    if spec.schema is not None and grammar.start_kind != "control":
        raise RequestError(
            f"Invalid response_format at {where}: a JSON answer or tool calls needs a format whose calls start with "
            f"a control token; {fmt.name!r} has none in this vocabulary (pass tool_choice='none' for the answer alone)")
    return grammar


# --- tokens -> content, calls, deltas --------------------------------------------------------------
@dataclass
class ModeCall:
    id: str
    name: str
    arguments: str  # the model's own argument text (a JSON object)
    parsed: dict | None = None
    error: str | None = None


@dataclass
class ModeOutcome:
    content: str
    tool_calls: list[ModeCall] = field(default_factory=list)
    complete: bool = True  # no call was left open
    answer: Any = None  # a JSON answer's value (kind "json")
    error: str | None = None
    is_answer: bool = False  # a JSON answer: the grammar completes it inside the budget, never cut

    def finish_reason(self, stopped: bool) -> str:
        """"tool_calls" after complete calls, "stop" after text that ended itself or a JSON answer, else "length"."""
        if self.tool_calls:
            return "tool_calls" if self.complete else "length"
        return "stop" if stopped or (self.is_answer and self.error is None) else "length"


@dataclass
class _Call:
    index: int
    id: str
    name: str | None = None
    args: bytearray = field(default_factory=bytearray)
    sent: int = 0  # argument bytes already in deltas
    done: bool = False


def _utf8_cut(buf: bytes | bytearray) -> int:
    """Length of the longest prefix of `buf` that does not end inside a UTF-8 character."""
    n = len(buf)
    for back in range(1, min(4, n) + 1):
        b = buf[n - back]
        if b & 0xC0 != 0x80:  # a lead byte (or ASCII)
            need = 1 if b < 0x80 else 2 if b >> 5 == 6 else 3 if b >> 4 == 14 else 4
            return n if need <= back else n - back
    return n


class OutputReader:
    """Reads one row's emitted token ids (incrementally) into content, calls and OpenAI deltas."""

    def __init__(self, grammar: ModeGrammar, vocab, id_prefix: str | None = None):
        self.kind = grammar.kind
        self.start_kind = grammar.start_kind if grammar.kind in ("auto", "calls") else None
        syntax = grammar.syntax
        self.start_bytes = (syntax.start or "").encode()
        controls = dict(grammar.controls)
        self.start_id = controls.get(syntax.start) if self.start_kind == "control" else None
        self.control_ids = set(controls.values())
        self.args_key = get_format(grammar.format).args_key
        self.tools = dict(grammar.tools)
        self.schema = grammar.schema
        self.vocab = vocab
        self.stop_ids = set(vocab.stop_ids)
        self.id_prefix = id_prefix if id_prefix is not None else "call_" + secrets.token_hex(6) + "_"
        self.num_ids = 0  # ids fed so far: a caller with cumulative ids feeds ids[reader.num_ids:]
        self.in_calls = False
        self.seen_bytes = False
        self.pending = bytearray()  # text not yet in a content delta
        self.content = bytearray()
        self.calls: list[_Call] = []
        self._cur: _Call | None = None
        self._reset_scan()

    def _reset_scan(self) -> None:
        self.in_str = self.esc = self.in_args = False
        self.expect, self.key, self.strbuf, self.depth = "key", None, bytearray(), 0

    # --- feeding --------------------------------------------------------------------------------
    def feed(self, token_ids) -> list[dict]:
        """Take newly emitted ids; return the deltas they complete (content, call headers, argument text)."""
        fresh: list[dict] = []
        for tid in token_ids:
            self.num_ids += 1
            self._token(int(tid), fresh)
        self._flush_text(final=False, out=fresh)
        self._args_deltas(final=False, out=fresh)
        return fresh

    def finish(self) -> list[dict]:
        """The deltas left at the end (held-back text, incomplete characters)."""
        out: list[dict] = []
        self._flush_text(final=True, out=out)
        self._args_deltas(final=True, out=out)
        return out

    def _token(self, tid: int, out: list) -> None:
        if tid in self.stop_ids:
            return
        if tid in self.control_ids:
            if not self.in_calls and tid == self.start_id:
                self._flush_text(final=True, out=out)
                self.in_calls = True
            return  # in calls, control tokens are glue (`</tool_call>`, the next call's start)
        data = self.vocab.token_bytes[tid] if tid < self.vocab.vocab_size else b""
        if not data and tid in self.vocab.special_ids:  # a special id in free text: its name
            names = {v: k for k, v in self.vocab.special_tokens.items()}
            data = names.get(tid, "").encode()
        for b in data:
            self._byte(b, out)

    def _byte(self, b: int, out: list) -> None:
        first, self.seen_bytes = not self.seen_bytes, True
        if self.in_calls:
            self._call_byte(b, out)
            return
        if self.start_kind == "lead" and first and b == 0x7B:
            self.in_calls = True
            self._call_byte(b, out)
            return
        self.pending.append(b)
        if self.start_kind == "spelled" and self.pending.endswith(self.start_bytes):
            del self.pending[len(self.pending) - len(self.start_bytes):]
            self._flush_text(final=True, out=out)
            self.in_calls = True

    def _flush_text(self, final: bool, out: list) -> None:
        if self.in_calls and not self.pending:
            return
        keep = len(self.pending)
        if not final:
            if self.start_kind == "spelled":  # a tail that may still become the call start
                keep = min(keep, len(self.pending) - _partial_match(self.pending, self.start_bytes))
            keep = _utf8_cut(self.pending[:keep])
        if keep:
            chunk = bytes(self.pending[:keep])
            del self.pending[:keep]
            self.content += chunk
            out.append({"content": chunk.decode("utf-8", errors="replace")})

    # --- the calls' byte scanner (the grammar guarantees the shape) -------------------------------------
    def _call_byte(self, b: int, out: list) -> None:
        call = self._cur
        if call is None:
            if b == 0x7B:  # `{` opens a call object; anything else between calls is glue
                call = self._cur = _Call(len(self.calls), f"{self.id_prefix}{len(self.calls)}")
                self.calls.append(call)
                self._reset_scan()
            return
        if self.in_args:
            self._args_byte(call, b)
            return
        if self.in_str:
            self._envelope_string_byte(call, b, out)
        elif b == 0x22:
            self.in_str, self.strbuf = True, bytearray()
        elif b == 0x3A:
            self.expect = "value"
        elif b == 0x2C:
            self.expect = "key"
        elif b in (0x7B, 0x5B) and self.expect == "value" and self.key == self.args_key:
            self.in_args, self.depth = True, 1
            call.args.append(b)
        elif b == 0x7D:
            call.done, self._cur = True, None

    def _envelope_string_byte(self, call: _Call, b: int, out: list) -> None:
        if self.esc:
            self.esc = False
        elif b == 0x5C:
            self.esc = True
        elif b == 0x22:
            self.in_str = False
            text = json.loads(b'"' + bytes(self.strbuf) + b'"')
            if self.expect == "key":
                self.key = text
            elif self.key == "name" and call.name is None:
                call.name = text
                out.append({"tool_calls": [{"index": call.index, "id": call.id, "type": "function",
                                            "function": {"name": text, "arguments": ""}}]})
            return
        self.strbuf.append(b)

    def _args_byte(self, call: _Call, b: int) -> None:
        call.args.append(b)
        if self.in_str:
            if self.esc:
                self.esc = False
            elif b == 0x5C:
                self.esc = True
            elif b == 0x22:
                self.in_str = False
        elif b == 0x22:
            self.in_str = True
        elif b in (0x7B, 0x5B):
            self.depth += 1
        elif b in (0x7D, 0x5D):
            self.depth -= 1
            if self.depth == 0:
                self.in_args = False

    def _args_deltas(self, final: bool, out: list) -> None:
        for call in self.calls:
            if call.name is None or call.sent == len(call.args):
                continue
            end = len(call.args) if final else call.sent + _utf8_cut(call.args[call.sent:])
            if end > call.sent:
                frag = bytes(call.args[call.sent:end]).decode("utf-8", errors="replace")
                call.sent = end
                out.append({"tool_calls": [{"index": call.index, "function": {"arguments": frag}}]})

    # --- the whole result ------------------------------------------------------------------------------
    def outcome(self) -> ModeOutcome:
        """Content, calls (parsed and validated) and whether every call closed; call after `finish`."""
        content = bytes(self.content + self.pending).decode("utf-8", errors="replace")
        calls = [self._mode_call(c) for c in self.calls]
        complete = all(c.done for c in self.calls) and self._cur is None
        result = ModeOutcome(content, calls, complete)
        if self.kind == "json" or (self.schema is not None and not calls):
            result.answer, result.error = _json_answer(content, self.schema)
            result.is_answer = True
        else:
            result.error = next((f"tool call {i}: {c.error}" for i, c in enumerate(calls) if c.error), None)
            if not complete:
                result.error = result.error or "a tool call was left open"
        return result

    def _mode_call(self, call: _Call) -> ModeCall:
        text = bytes(call.args).decode("utf-8", errors="replace")
        out = ModeCall(call.id, call.name or "", text)
        try:
            out.parsed = loads_strict(text)
        except MalformedCall as exc:
            out.error = f"malformed arguments: {exc}"
            return out
        if call.name not in self.tools:
            out.error = f"unknown tool {call.name!r}"
            return out
        problem = _validate(self.tools[call.name], out.parsed)
        if problem:
            out.error = f"invalid arguments: {problem}"
        return out


def _partial_match(buf: bytearray, word: bytes) -> int:
    """Length of the longest suffix of `buf` that is a proper prefix of `word`."""
    for n in range(min(len(word) - 1, len(buf)), 0, -1):
        if buf.endswith(word[:n]):
            return n
    return 0


def _validate(schema, value) -> str | None:
    from surecall.tools.calls import _validate as validate_arguments

    return validate_arguments(schema, value)


def _json_answer(content: str, schema) -> tuple[Any, str | None]:
    try:
        value = loads_strict(content)
    except MalformedCall as exc:
        return None, f"JSON answer: {exc}"
    from surecall.dispatch.validate import validate_document

    problem = validate_document(schema, value) if isinstance(schema, dict) else None
    return value, (f"JSON answer: {problem}" if problem else None)


def read_output(grammar: ModeGrammar, vocab, token_ids, id_prefix: str | None = None) -> tuple[ModeOutcome, list[dict]]:
    """(outcome, every delta) of a finished row, as a stream would have produced them."""
    reader = OutputReader(grammar, vocab, id_prefix)
    deltas = reader.feed(token_ids) + reader.finish()
    return reader.outcome(), deltas


def merge_deltas(deltas: list[dict]) -> dict:
    """Merge chat-chunk deltas as the OpenAI client does: content appended, tool calls by index."""
    content, calls = [], {}
    for delta in deltas:
        if delta.get("content"):
            content.append(delta["content"])
        for part in delta.get("tool_calls", ()):
            slot = calls.setdefault(part["index"], {"id": None, "type": None, "function": {"name": "", "arguments": ""}})
            for key in ("id", "type"):
                if part.get(key):
                    slot[key] = part[key]
            fn = part.get("function", {})
            slot["function"]["name"] += fn.get("name") or ""
            slot["function"]["arguments"] += fn.get("arguments") or ""
    return {"content": "".join(content), "tool_calls": [calls[i] for i in sorted(calls)]}
