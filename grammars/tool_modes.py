"""Output-mode grammars: free text, text-then-calls (`auto`), calls only, JSON answers.

A call start that is one control token (Qwen's `<tool_call>`, Mistral's `[TOOL_CALLS]`) has no
bytes, so `control_vocab` derives a vocabulary where each chosen control id carries one sentinel
byte (0xF8.., never in UTF-8) and ordinary tokens holding such bytes are disallowed; the call
regex uses placeholder characters (never in JSON or glue) relabelled to the sentinels. Text is
a hand-built DFA (valid UTF-8 x a KMP matcher) that never holds the spelled call start;
`mode_dfa` splices it to the calls on the sentinel, on the completed spelled start, or (formats
whose call is a bare JSON object: json, llama3) on a leading `{`, so there a completion is a
call exactly when it starts with `{`. It builds DFAs and tables, it does not read output.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field, replace

import numpy as np

from surecall.grammars import cache as table_cache
from surecall.grammars.automaton import ByteDFA, prune, regex_to_dfa
from surecall.grammars.formats import ToolFormat, _literal, get_format, tool_branches
from surecall.grammars.options import GrammarOptions
from surecall.grammars.schema.to_regex import RegexResult, schema_to_regex

SENTINEL_BASE = 0xF8  # bytes 0xF8..0xFF never occur in UTF-8
# Raw control bytes that JSON strings, whitespace and glue never hold, and that the marks of
# `schema.to_regex` (counted strings 0x01, 0x02, 0x10-0x1F; counted arrays 0x0B) do not use:
# placeholders 0x03-0x08.
_PLACEHOLDER_BASE = 0x03
_MAX_CONTROLS = 6
MODE_KINDS = ("text", "auto", "calls", "json")


@dataclass(frozen=True)
class CallSyntax:
    """One format's native syntax for one or more calls: START OPEN call EACH (BETWEEN call EACH)* CLOSE.

    `start` None: the calls begin with the call object itself (`{`). `controls` are the strings
    that may be single control tokens of a vocabulary. The glue strings are literals except
    `between`/`open`/`close` of list formats, which take the grammar's whitespace.
    """

    start: str | None
    open: str = ""
    each: str = ""
    between: str = "\n"
    close: str = ""
    listed: bool = False  # calls are items of one JSON list (Mistral): glue is `[`, `,`, `]` with whitespace
    controls: tuple[str, ...] = ()


SYNTAX: dict[str, CallSyntax] = {
    "hermes": CallSyntax("<tool_call>", "\n", "\n</tool_call>", "\n<tool_call>\n",
                         controls=("<tool_call>", "</tool_call>")),
    "mistral": CallSyntax("[TOOL_CALLS]", listed=True, controls=("[TOOL_CALLS]",)),
    "llama3": CallSyntax(None, between="; "),
    "json": CallSyntax(None, between="\n"),
}


def call_syntax(fmt: ToolFormat) -> CallSyntax:
    """The built-in format's syntax; a custom `ToolFormat` repeats its prefix/suffix around each call."""
    if fmt.name in SYNTAX:
        return SYNTAX[fmt.name]
    if fmt.control_prefix:
        return CallSyntax(fmt.control_prefix, fmt.prefix, fmt.suffix, "\n" + fmt.control_prefix + fmt.prefix,
                          controls=(fmt.control_prefix,))
    return CallSyntax(fmt.prefix or None, "", fmt.suffix, "\n" + fmt.prefix)


@dataclass(frozen=True)
class ModeGrammar:
    """What one mode's grammar is: enough to compile it and to read the output back."""

    kind: str  # "text" (no call), "auto" (text, then calls), "calls" (calls only), "json" (a JSON answer)
    format: str
    tools: tuple = ()  # ((name, schema), ...) the calls may name
    parallel: bool = True
    schema: object = None  # the JSON answer's schema (kind "json"; kind "auto": the answer if no call)
    controls: tuple = ()  # ((string, token id), ...) control tokens of this vocabulary in the syntax

    def __post_init__(self):
        if self.kind not in MODE_KINDS:
            raise ValueError(f"Invalid kind: expected one of {MODE_KINDS}, got {self.kind!r}")
        if self.kind in ("auto", "calls") and not self.tools:
            raise ValueError(f"Invalid tools: mode {self.kind!r} needs at least one tool, got none")
        if self.schema is not None and self.kind not in ("json", "auto"):
            raise ValueError(f"Invalid schema: a JSON answer goes with kind 'json' or 'auto', got {self.kind!r}")

    @property
    def syntax(self) -> CallSyntax:
        return call_syntax(get_format(self.format))

    @property
    def start_kind(self) -> str:
        """"control" (one token opens the calls), "spelled" (text opens them) or "lead" (a `{`)."""
        start = self.syntax.start
        if start is None:
            return "lead"
        return "control" if start in dict(self.controls) else "spelled"

    def key(self) -> str:
        return json.dumps([self.kind, self.format, [list(t) for t in self.tools], self.parallel, self.schema,
                           [list(c) for c in self.controls]], sort_keys=True, default=str)


_FOUND: dict = {}  # (vocab fingerprint, control strings) -> find_controls' answer


def find_controls(vocab, syntax: CallSyntax) -> tuple[tuple[str, int], ...]:
    """The syntax's control strings that are one token of `vocab` (a special token, or one whose bytes are exactly it)."""
    key = (vocab.fingerprint, syntax.controls)
    if key not in _FOUND:
        if len(_FOUND) >= 32:
            _FOUND.pop(next(iter(_FOUND)))
        _FOUND[key] = _find_controls(vocab, syntax)
    return _FOUND[key]


def _find_controls(vocab, syntax: CallSyntax) -> tuple[tuple[str, int], ...]:
    out = []
    by_bytes = None
    for text in syntax.controls:
        tid = vocab.special_tokens.get(text)
        if tid is None:
            if by_bytes is None:
                by_bytes = {b: i for i, b in enumerate(vocab.token_bytes) if b and i not in vocab.special_ids}
            tid = by_bytes.get(text.encode())
        if tid is not None:
            out.append((text, int(tid)))
    return tuple(out)


_DERIVED: dict = {}  # (vocab fingerprint, controls) -> derived Vocab (a few per process)


def control_vocab(vocab, controls) -> object:
    """`vocab` with control id k carrying the sentinel byte 0xF8+k; ordinary tokens holding 0xF8..0xFF disallowed."""
    controls = tuple(controls)
    if not controls:
        return vocab
    key = (vocab.fingerprint, vocab.logits_width, controls)
    if key not in _DERIVED:
        if len(_DERIVED) >= 8:
            _DERIVED.pop(next(iter(_DERIVED)))
        _DERIVED[key] = _derive(vocab, controls)
    return _DERIVED[key]


def _derive(vocab, controls: tuple):
    if len(controls) > min(0x100 - SENTINEL_BASE, _MAX_CONTROLS):
        raise ValueError(f"Invalid controls: expected at most {min(0x100 - SENTINEL_BASE, _MAX_CONTROLS)}, "
                         f"got {len(controls)}")
    token_bytes = list(vocab.token_bytes)
    ids = {tid for _, tid in controls}
    blocked = {i for i, b in enumerate(token_bytes) if i not in ids and any(x >= SENTINEL_BASE for x in b)}
    for k, (_, tid) in enumerate(controls):
        token_bytes[tid] = bytes([SENTINEL_BASE + k])
    special = (set(vocab.special_ids) - ids) | blocked
    return replace(vocab, token_bytes=tuple(token_bytes), special_ids=frozenset(special),
                   name=f"{vocab.name}+controls")


# --- the calls DFA (regex with placeholders, relabelled) -----------------------------------------------
def _placeholders(controls) -> dict[str, str]:
    return {text: chr(_PLACEHOLDER_BASE + k) for k, (text, _) in enumerate(controls)}


def _glue(text: str, holders: dict[str, str]) -> str:
    """Regex of a literal glue string in which control strings stand for their placeholder."""
    out, i = [], 0
    while i < len(text):
        hit = next((c for c in holders if text.startswith(c, i)), None)
        if hit:
            out.append(f"\\x{ord(holders[hit]):02x}")
            i += len(hit)
        else:
            out.append(_literal(text[i]))
            i += 1
    return "".join(out)


def calls_regex(grammar: ModeGrammar, options: GrammarOptions) -> RegexResult:
    """Regex of the calls (start included) with control strings as placeholders, and the tools'
    relaxed, reasons and narrowed pairs ("name#/pointer")."""
    fmt = replace(get_format(grammar.format), is_list=False)
    syntax, holders = grammar.syntax, _placeholders(grammar.controls)
    branches, merged = tool_branches(grammar.tools, fmt, options)
    call = "(?:" + "|".join(f"(?:{b})" for b in branches) + ")"
    ws = options.whitespace_regex()
    if syntax.listed:
        open_, between, close = f"\\[{ws}", f"{ws},{ws}", f"{ws}\\]"
    else:
        open_, between, close = (_glue(s, holders) for s in (syntax.open, syntax.between, syntax.close))
    each = _glue(syntax.each, holders)
    start = _glue(syntax.start, holders) if syntax.start else ""
    more = f"(?:{between}{call}{each})*" if grammar.parallel else ""
    return replace(merged, regex=f"{start}{open_}{call}{each}{more}{close}")


def ended_dfa(regex: str) -> ByteDFA:
    """The byte DFA of `regex`; accepting states keep their outgoing edges (automaton._END_MARK)."""
    return regex_to_dfa(regex)


def _relabel(dfa: ByteDFA, count: int) -> ByteDFA:
    trans = dfa.trans.copy()
    for k in range(count):
        trans[:, SENTINEL_BASE + k] = trans[:, _PLACEHOLDER_BASE + k]
        trans[:, _PLACEHOLDER_BASE + k] = -1
    return ByteDFA(trans, dfa.accept)


# --- the text DFA: valid UTF-8, never holding `forbid` ---------------------------------------------
_UTF8 = np.full((8, 256), -1, dtype=np.int32)  # 0 boundary; 1-3 continuation bytes owed; 4-7 restricted first one
_UTF8[0, 0x20:0x80] = 0
_UTF8[0, [0x09, 0x0A, 0x0D]] = 0  # C0 controls other than tab/newline/return are not text: the
# counted-string marks (0x01, 0x02, 0x10-0x1F) and the placeholders travel on them
_UTF8[0, 0xC2:0xE0] = 1
_UTF8[0, 0xE1:0xED] = 2
_UTF8[0, 0xEE:0xF0] = 2
_UTF8[0, 0xE0], _UTF8[0, 0xED], _UTF8[0, 0xF0], _UTF8[0, 0xF4] = 4, 5, 6, 7
_UTF8[0, 0xF1:0xF4] = 3
_UTF8[1, 0x80:0xC0] = 0
_UTF8[2, 0x80:0xC0] = 1
_UTF8[3, 0x80:0xC0] = 2
_UTF8[4, 0xA0:0xC0] = 1
_UTF8[5, 0x80:0xA0] = 1
_UTF8[6, 0x90:0xC0] = 2
_UTF8[7, 0x80:0x90] = 2


def _kmp(word: bytes) -> np.ndarray:
    """int32 [len(word), 256]: matched prefix length after each byte (len(word) = found)."""
    n = len(word)
    table = np.zeros((max(n, 1), 256), dtype=np.int32)
    if n == 0:
        return table
    table[0, word[0]] = 1
    back = 0
    for k in range(1, n):
        table[k] = table[back]
        table[k, word[k]] = k + 1
        back = int(table[back, word[k]])
    return table


@dataclass
class TextDFA:
    dfa: ByteDFA
    found: list = field(default_factory=list)  # (state, byte) where `forbid` completes (dead in text)
    lead: list = field(default_factory=list)  # (state, byte) of a leading `{` (dead in text)


def text_dfa(forbid: bytes = b"", no_lead_brace: bool = False) -> TextDFA:
    """Valid UTF-8 text never containing `forbid`; with `no_lead_brace` it may not start with `{`.

    States are (UTF-8 position, matched prefix of `forbid`, at start); all boundary states accept.
    """
    kmp = _kmp(forbid)
    ids: dict[tuple, int] = {(0, 0, True): 0}
    order = [(0, 0, True)]
    rows, out = [], TextDFA(ByteDFA(np.zeros((0, 256), np.int32), np.zeros(0, bool)))
    i = 0
    while i < len(order):
        u, k, first = order[i]
        row = np.full(256, -1, dtype=np.int32)
        for b in np.flatnonzero(_UTF8[u] >= 0).tolist():
            k2 = int(kmp[k, b]) if forbid else 0
            if forbid and k2 == len(forbid):
                out.found.append((i, b))
                continue
            if first and no_lead_brace and b == 0x7B:
                out.lead.append((i, b))
                continue
            nxt = (int(_UTF8[u, b]), k2, False)
            if nxt not in ids:
                ids[nxt] = len(order)
                order.append(nxt)
            row[b] = ids[nxt]
        rows.append(row)
        i += 1
    accept = np.asarray([u == 0 for u, _, _ in order], dtype=bool)
    out.dfa = ByteDFA(np.stack(rows), accept)
    return out


# --- composing the mode DFA ----------------------------------------------------------------------
def _walk(dfa: ByteDFA, data: bytes, state: int = 0) -> int:
    for b in data:
        state = int(dfa.trans[state, b])
        if state < 0:
            raise ValueError(f"Invalid walk: the calls grammar does not start with {data!r}")
    return state


def mode_dfa(grammar: ModeGrammar, options: GrammarOptions) -> tuple[ByteDFA, RegexResult]:
    """The byte DFA of a mode (over the sentinel bytes of `control_vocab`) and what it relaxes and
    narrows (a RegexResult whose regex is not needed any more: empty)."""
    if grammar.kind == "json":
        result = schema_to_regex(grammar.schema, options)
        return ended_dfa(result.regex), replace(result, regex="")
    syntax = grammar.syntax
    start = (syntax.start or "").encode()
    if grammar.kind == "text":
        return text_dfa(start).dfa, RegexResult(regex="")
    result = calls_regex(grammar, options)
    calls, result = _relabel(ended_dfa(result.regex), len(grammar.controls)), replace(result, regex="")
    if grammar.kind == "calls":
        return calls, result
    kind = grammar.start_kind
    if grammar.schema is not None:
        return _answer_or_calls(grammar, options, calls, result)
    text = text_dfa(start, no_lead_brace=kind == "lead")
    n = text.dfa.num_states
    trans = np.concatenate([text.dfa.trans, np.where(calls.trans >= 0, calls.trans + n, -1)]).astype(np.int32)
    accept = np.concatenate([text.dfa.accept, calls.accept])
    if kind == "control":
        sentinel = SENTINEL_BASE + [c for c, _ in grammar.controls].index(syntax.start)
        entered = int(calls.trans[0, sentinel]) + n
        trans[np.flatnonzero(text.dfa.accept), sentinel] = entered
    elif kind == "spelled":
        entered = _walk(calls, start) + n
        for state, byte in text.found:
            trans[state, byte] = entered
    else:
        for state, byte in text.lead:
            trans[state, byte] = int(calls.trans[0, byte]) + n
    return prune(trans, accept), result


def _answer_or_calls(grammar: ModeGrammar, options: GrammarOptions, calls: ByteDFA, tools: RegexResult):
    """`auto` with a JSON answer: the completion is the answer, or (control token first) the calls."""
    if grammar.start_kind != "control":
        raise ValueError(f"Invalid schema: a JSON answer or calls needs a control-token call start; "
                         f"format {grammar.format!r} has none here (both would begin alike)")
    result = schema_to_regex(grammar.schema, options)
    answer = ended_dfa(result.regex)
    n = answer.num_states
    trans = np.concatenate([answer.trans, np.where(calls.trans >= 0, calls.trans + n, -1)]).astype(np.int32)
    sentinel = SENTINEL_BASE + [c for c, _ in grammar.controls].index(grammar.syntax.start)
    trans[0, sentinel] = int(calls.trans[0, sentinel]) + n  # only before the answer's first byte
    merged = RegexResult(regex="", relaxed=[*result.relaxed, *tools.relaxed], reasons={**result.reasons, **tools.reasons},
                         narrowed={**result.narrowed, **tools.narrowed})
    return prune(trans, np.concatenate([answer.accept, calls.accept])), merged


def compile_mode(grammar: ModeGrammar, vocab, options: GrammarOptions | None = None, use_cache: bool | str = True):
    """TokenTable of a mode over `vocab` (its control ids given sentinel bytes); cached on disk."""
    from surecall.grammars.compile import _pairs, _through_cache, _with_reasons, compile_dfa

    options = options or GrammarOptions()
    cvocab = control_vocab(vocab, grammar.controls)
    key = table_cache.entry_key("mode", grammar.key(), cvocab, options)

    def build():
        from surecall.grammars.counted import CountedCutError

        meta = {"kind": "mode", "mode": grammar.kind, "format": grammar.format}
        dfa, result = mode_dfa(grammar, options)
        try:
            return compile_dfa(dfa, cvocab, options, _pairs(result.relaxed), _with_reasons(meta, result))
        except CountedCutError as exc:  # the composed automaton mixes a count mark with other text
            if not options.counted_lengths:
                raise
            plain = dataclasses.replace(options, counted_lengths=False)
            dfa, result = mode_dfa(grammar, plain)
            table = compile_dfa(dfa, cvocab, plain, _pairs(result.relaxed), _with_reasons(meta, result))
            table.meta["counted_fallback"] = str(exc)
            return table

    return _through_cache(key, use_cache, build)
