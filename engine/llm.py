"""LLM: the public entry point that turns prompts and tools into tool calls.

`LLM(model, tokenizer)` loads the model runner and the vocabulary once (a model directory's own
tokenizer: Hugging Face files, SentencePiece or tiktoken `tokenizer.model`); `generate` turns
each row's tools (any accepted shape) into `Tool`s, renders its prompt, compiles (and caches)
the grammar of each distinct (tools, format), refuses rows whose budget cannot fit any call,
decodes the good rows in batches through `Decoder`, then parses and validates every completion.
A bad row reports its error in its own result; only a request in which every row is bad raises.
It does not dispatch or run tools.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from surecall.config import EngineConfig, SamplingParams
from surecall.core.decode import Decoder, DecodeRow
from surecall.core.model_runner import ModelRunner
from surecall.core.prompts import is_single_prompt, render_prompt
from surecall.errors import ModelLoadError, RequestError, SurecallError, ToolDefinitionError
from surecall.grammars.compile import compile_catalog
from surecall.grammars.formats import get_format
from surecall.kernels import DeviceTable
from surecall.models.tokenizers import load_model_tokenizer
from surecall.tools import Tool, normalise_tool
from surecall.tools.calls import ToolCall, check_call, tool_name_schema

MAX_DEVICE_TABLES = 16  # concatenated per-batch tables kept on the device
DEFAULT_FORMATS = {"qwen2": "hermes", "qwen3": "hermes", "qwen3_moe": "hermes", "llama": "llama3", "mistral": "mistral"}
_SCHEMA_KEYS = ("type", "properties", "$schema", "$defs", "$ref", "anyOf", "oneOf", "allOf", "required")


@dataclass
class GenerationResult:
    """One row's outcome. `timings` is this row's own; `batch_timings` is the batch it decoded in."""

    token_ids: list[int]  # generated ids (a forced control token included)
    text: str
    call: ToolCall | None  # the parsed call (also set when it parses but fails its schema)
    error: str | None  # why the call is malformed/invalid, or the row's input error
    logprobs: list[float] | None
    unmasked_logprobs: list[float] | None
    finish_reason: str  # "stop" (a stop id, or a complete valid call) | "length" (the budget ended it) | "error"
    timings: dict = field(default_factory=dict)  # this row: num_tokens, num_steps (decode steps), finish_s
    num_tokens: int = 0
    error_kind: str | None = None  # "malformed" | "invalid" | "request" | "decode" | None
    ok: bool = False  # a call parsed and is valid against its tool's schema
    prompt_token_ids: list[int] = field(default_factory=list)  # the rendered prompt (forced ids excluded)
    # One dict shared by every row of a decoded batch: prefill_s, decode_s, sample_s (the sampling
    # kernels, grammar mask fused in), advance_s (grammar advance), num_steps, num_rows, step_mode,
    # graph_capture_s, compactions, and compile_s (the whole generate call's grammar compiles)
    batch_timings: dict = field(default_factory=dict)
    # --- output modes (issue 17; surecall.modes): set when generate got tool_choice,
    # parallel_tool_calls or response_format. finish_reason is then "tool_calls" | "stop" | "length" | "error",
    # `ok` means no error (a text-only row is ok) and `call` is the first of `tool_calls`.
    content: str | None = None  # the text outside calls (a JSON answer's text); None outside modes
    tool_calls: list = field(default_factory=list)  # surecall.modes.ModeCall: id, name, arguments, parsed, error
    mode: Any = None  # the row's grammars.tool_modes.ModeGrammar (feed token_ids to modes.OutputReader to stream)


@dataclass
class _Row:
    index: int
    ids: list[int] | None = None
    sampling: SamplingParams | None = None
    tools: list | None = None
    table_key: str | None = None
    forced: tuple[int, ...] = ()
    error: SurecallError | None = None
    mode: Any = None  # issue 17: the row's ModeGrammar (modes path only)
    mode_args: tuple = ()  # issue 17: (tool_choice, parallel_tool_calls, response_format) of this row


def _load_vocab(tokenizer, logits_width: int):
    from surecall.grammars.vocab.core import Vocab

    if tokenizer is None or isinstance(tokenizer, Vocab):
        vocab = tokenizer
    else:
        from surecall.grammars.vocab.loaders import load

        vocab = load(tokenizer, logits_width=max(logits_width, len(tokenizer)) if hasattr(tokenizer, "__len__") else logits_width)
    if vocab is not None and vocab.vocab_size > logits_width:
        raise ModelLoadError(
            f"Tokenizer does not match the model: {vocab.vocab_size} token ids but the model's logits are "
            f"{logits_width} wide"
        )
    if vocab is not None and vocab.logits_width != logits_width:
        from dataclasses import replace

        vocab = replace(vocab, logits_width=logits_width)
    return vocab


def _default_format(tokenizer, model_type: str) -> str:
    """The chat template's own call syntax when it shows one, else the model family's default."""
    template = getattr(tokenizer, "chat_template", None)
    template = template if isinstance(template, str) else ""
    if "<tool_call>" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    return DEFAULT_FORMATS.get(model_type, "json")


class LLM:
    """A causal LM plus its tokenizer, generating tool calls (constrained or free)."""

    def __init__(self, model=None, tokenizer=None, device=None, dtype=None, config: EngineConfig | None = None):
        if model is None:
            from surecall.models import default_model_dir

            model = default_model_dir()
        self.config = config or EngineConfig()
        self.runner = ModelRunner(model, device=device, dtype=dtype, attn_implementation=self.config.attn_implementation)
        from surecall.grammars.vocab.core import Vocab

        self.tokenizer, vocab = load_model_tokenizer(tokenizer, model)
        self.vocab = _load_vocab(vocab if vocab is not None else self.tokenizer, self.runner.logits_width)
        if isinstance(self.tokenizer, Vocab):
            self.tokenizer = None
        self.default_format = _default_format(self.tokenizer, self.runner.model_type)
        self.decoder = Decoder(self.runner, self.config)
        self._tables: dict[str, Any] = {}  # (tools, format, options) key -> TokenTable
        self._device_tables: dict[tuple, tuple] = {}  # tuple of table keys -> (device table, offsets)

    # --- public ---------------------------------------------------------------------------
    def generate(self, prompts, tools=None, sampling=None, constrained: bool = True, tool_format: str | None = None,
                 tool_choice=None, parallel_tool_calls=None, response_format=None):
        """One GenerationResult per prompt (a single prompt gives a list of one).

        tool_choice ("none" | "auto" | "required" | {"type": "function", ...} | {"type": "allowed_tools", ...}),
        parallel_tool_calls and response_format (OpenAI shapes) select an output mode (surecall.modes);
        each is one value for every row or a list with one per row. Without them, `constrained` is as before.
        """
        prompts = [prompts] if is_single_prompt(prompts) else list(prompts)
        if not prompts:
            raise RequestError("Invalid prompts: expected at least one prompt, got an empty list")
        row_tools = self._per_row_tools(tools, len(prompts))
        # modes (issue 17): any of the three parameters puts every row on the mode path
        modes = _modes_args(len(prompts), tool_choice, parallel_tool_calls, response_format)
        if modes and not constrained:
            raise RequestError("Invalid request: tool_choice / parallel_tool_calls / response_format need constrained=True")
        fmt = self._format(tool_format) if any(row_tools) or modes else None
        rows = self._prepare(prompts, row_tools, self._per_row_sampling(sampling, len(prompts)), constrained, fmt, modes)
        good = [r for r in rows if r.error is None]
        if not good:
            raise rows[0].error
        results: dict[int, GenerationResult] = {r.index: self._error_result(r) for r in rows if r.error is not None}
        for start in range(0, len(good), self.config.max_batch_size):
            chunk = good[start : start + self.config.max_batch_size]
            for row, res in zip(chunk, self._decode_chunk(chunk, constrained, fmt), strict=True):
                results[row.index] = res
        for res in results.values():
            res.batch_timings["compile_s"] = self._compile_s
        return [results[i] for i in range(len(prompts))]

    def count_tokens(self, text: str) -> list[int]:
        from surecall.core.prompts import _encode

        return _encode(self.tokenizer, text, add_special_tokens=False)

    def compile(self, tools, tool_format: str | None = None):
        """The TokenTable of a tool list in a format (compiled once, then cached in this LLM)."""
        if self.vocab is None:
            raise RequestError("Invalid request: constrained decoding needs a tokenizer (LLM was built without one)")
        fmt = self._format(tool_format)
        self._compile_s = 0.0
        tools = _normalise_tools(tools if isinstance(tools, (list, tuple)) else [tools], "tools")
        return self._compile(self._table_key(tools, fmt), tools, fmt)

    def min_tokens(self, tools: list, tool_format: str | None = None) -> int:
        """The fewest tokens any call of `tools` takes (max_tokens below it is refused)."""
        fmt = self._format(tool_format)
        return int(self.compile(tools, tool_format).dist[0]) + (1 if getattr(fmt, "control_prefix", None) else 0)

    # --- preparation ----------------------------------------------------------------------
    def _format(self, name: str | None):
        try:
            return get_format(name or self.default_format)
        except ValueError as exc:
            raise RequestError(f"Invalid tool_format: {exc}") from exc

    @staticmethod
    def _per_row_tools(tools, n: int) -> list:
        """One tool list per row: a list of n lists (or None) is per row; one tool or one list, the batch's."""
        if tools is None:
            return [None] * n
        if not isinstance(tools, (list, tuple)):
            tools = [tools]  # one tool (a Tool, a pydantic class, a dict) for every row
        tools = list(tools)
        if len(tools) == n and tools and all(t is None or isinstance(t, (list, tuple)) for t in tools):
            return [list(t) if t is not None else None for t in tools]
        return [tools] * n

    @staticmethod
    def _per_row_sampling(sampling, n: int) -> list[SamplingParams]:
        if sampling is None:
            return [SamplingParams()] * n
        if isinstance(sampling, SamplingParams):
            return [sampling] * n
        sampling = list(sampling)
        if len(sampling) != n or not all(isinstance(s, SamplingParams) for s in sampling):
            raise RequestError(f"Invalid sampling: expected one SamplingParams or a list of {n}, got {len(sampling)} items")
        return sampling

    def _prepare(self, prompts, tools, sampling, constrained: bool, fmt, modes=None) -> list[_Row]:
        self._compile_s = 0.0
        rows = []
        normalised: dict[int, list[Tool] | SurecallError] = {}  # id(row's tool list) -> its Tools
        for i, (prompt, row_tools, params) in enumerate(zip(prompts, tools, sampling, strict=True)):
            row = _Row(i, sampling=params, mode_args=modes[i] if modes else ())
            try:
                row.tools = self._row_tools(row_tools, i, normalised)
                row.ids = render_prompt(prompt, self.tokenizer, row.tools, i)
                if modes:
                    self._prepare_mode(row, fmt)
                elif constrained:
                    self._prepare_grammar(row, fmt)
                self._check_length(row)
            except SurecallError as exc:
                row.error = exc
            rows.append(row)
        return rows

    @staticmethod
    def _row_tools(tools: list | None, row: int, done: dict) -> list[Tool] | None:
        """The row's tools as `Tool`s; a list shared by many rows is normalised (or fails) once."""
        if tools is None:
            return None
        if id(tools) not in done:
            try:
                done[id(tools)] = _normalise_tools(tools, f"tools of row {row}")
            except SurecallError as exc:
                done[id(tools)] = exc
        found = done[id(tools)]
        if isinstance(found, SurecallError):
            raise found
        return found

    def _prepare_grammar(self, row: _Row, fmt) -> None:
        if not row.tools:
            raise RequestError(f"Invalid request at row {row.index}: constrained decoding needs at least one tool")
        if self.vocab is None:
            raise RequestError("Invalid request: constrained decoding needs a tokenizer (LLM was built without one)")
        row.table_key = self._table_key(row.tools, fmt)
        table = self._compile(row.table_key, row.tools, fmt)
        prefix = getattr(fmt, "control_prefix", None)
        if prefix:
            if prefix not in self.vocab.special_tokens:
                raise RequestError(f"Invalid tool_format {fmt.name!r}: control token {prefix!r} is not in the vocabulary")
            row.forced = (int(self.vocab.special_tokens[prefix]),)
        need = int(table.dist[0]) + len(row.forced)
        if row.sampling.max_tokens < need:
            raise RequestError(
                f"Invalid max_tokens at row {row.index}: the shortest call takes {need} tokens, got max_tokens={row.sampling.max_tokens}"
            )

    def _prepare_mode(self, row: _Row, fmt) -> None:
        """Issue 17: the row's ModeSpec -> ModeGrammar -> table; the budget must fit the shortest call/answer."""
        from surecall.errors import SchemaError
        from surecall.grammars.tool_modes import compile_mode
        from surecall.modes import mode_grammar, mode_spec

        if self.vocab is None:
            raise RequestError("Invalid request: output modes need a tokenizer (LLM was built without one)")
        named = [tool_name_schema(t) for t in row.tools or []]
        spec = mode_spec(*row.mode_args, tool_names=[n for n, _ in named], where=f"row {row.index}")
        row.mode = mode_grammar(spec, named, fmt, self.vocab, where=f"row {row.index}")
        row.table_key = "mode:" + json.dumps([row.mode.key(), self._table_key([], fmt)])
        if row.table_key not in self._tables:
            start = time.perf_counter()
            try:
                self._tables[row.table_key] = compile_mode(row.mode, self.vocab, self.config.grammar_options)
            except SchemaError as exc:
                where = "tools" if row.mode.schema is None or str(exc).startswith("tool ") else "response_format"
                raise RequestError(f"Invalid {where} at row {row.index}: {exc}") from exc
            self._compile_s += time.perf_counter() - start
        need = int(self._tables[row.table_key].dist[0])
        if row.sampling.max_tokens < need:
            what = {"json": "JSON answer", "calls": "call"}.get(row.mode.kind, "JSON answer or call")
            raise RequestError(
                f"Invalid max_tokens at row {row.index}: the shortest {what} takes {need} tokens, got max_tokens={row.sampling.max_tokens}")

    def _table_key(self, tools: list, fmt) -> str:
        options = self.config.grammar_options
        opt_key = options.cache_key() if options is not None else "default"
        described = [tool_name_schema(t) for t in tools]
        return json.dumps([getattr(fmt, "name", str(fmt)), opt_key, described], sort_keys=True)

    def _compile(self, key: str, tools: list, fmt):
        if key not in self._tables:
            start = time.perf_counter()
            named = [{"name": n, "parameters": s} for n, s in (tool_name_schema(t) for t in tools)]
            self._tables[key] = compile_catalog(named, self.vocab, fmt.name, self.config.grammar_options)
            self._compile_s += time.perf_counter() - start
        return self._tables[key]

    def _check_length(self, row: _Row) -> None:
        limit = self.config.max_seq_len or self.runner.max_positions
        total = len(row.ids) + row.sampling.max_tokens
        if total > limit:
            raise RequestError(
                f"Invalid request at row {row.index}: prompt ({len(row.ids)} tokens) + max_tokens "
                f"({row.sampling.max_tokens}) exceeds the model's {limit} positions"
            )

    # --- decoding and results -------------------------------------------------------------
    def _batch_table(self, keys: tuple[str, ...]):
        if keys not in self._device_tables:
            from surecall.grammars.table import TokenTable

            if len(self._device_tables) >= MAX_DEVICE_TABLES:  # drop the oldest batch combination
                self._device_tables.pop(next(iter(self._device_tables)))
            tables = [self._tables[k] for k in keys]
            table, offsets = TokenTable.concat(tables) if len(tables) > 1 else (tables[0], [0])
            self._device_tables[keys] = (DeviceTable.from_table(table, self.runner.device), [int(o) for o in offsets])
            self._device_tables[keys] += (_item_table(table, self.runner.device),)  # counted arrays (or None)
        return self._device_tables[keys][:2]

    def _decode_chunk(self, chunk: list[_Row], constrained: bool, fmt) -> list[GenerationResult]:
        dtable, start_of = None, {}
        if constrained:
            keys = tuple(sorted({r.table_key for r in chunk}))
            dtable, offsets = self._batch_table(keys)
            start_of = dict(zip(keys, offsets, strict=True))
        rows = [DecodeRow(r.ids, r.sampling, start_of.get(r.table_key, -1), r.forced) for r in chunk]
        stop_ids = list(self.vocab.stop_ids) if self.vocab is not None else self._config_stop_ids()
        items = self._device_tables[keys][2] if constrained else None
        out = self.decoder.run(rows, stop_ids=stop_ids, table=dtable, pad_id=self._pad_id(), items=items)
        batch_timings = {**out.timings, "num_rows": len(chunk)}  # one dict for the whole batch
        return [self._result(r, o, batch_timings, fmt) for r, o in zip(chunk, out.rows, strict=True)]

    def _result(self, row: _Row, out, batch_timings: dict, fmt) -> GenerationResult:
        if row.mode is not None:
            return self._mode_result(row, out, batch_timings)
        text = self._text(out.token_ids)
        call, error, kind = None, None, None
        if out.error:  # the decoder ended the row (empty mask, refused token): report it, do not parse
            error, kind = f"Decode error at row {row.index}: {out.error}", "decode"
        elif row.tools:
            check = check_call(text, fmt, row.tools)
            call, error, kind = check.call, check.error, check.error_kind
        ok = call is not None and error is None
        # A complete, valid call is a stop even when the budget ran out right after it (tight budgets
        # leave no room for the stop token): "length" is for output the budget cut short.
        finish_reason = "stop" if ok else out.finish_reason
        return GenerationResult(
            token_ids=out.token_ids, text=text, call=call, error=error, logprobs=out.logprobs,
            unmasked_logprobs=out.unmasked_logprobs, finish_reason=finish_reason,
            timings={"num_tokens": len(out.token_ids), "num_steps": out.num_steps, "finish_s": out.finish_s},
            num_tokens=len(out.token_ids), error_kind=kind, ok=ok, prompt_token_ids=list(row.ids),
            batch_timings=batch_timings,
        )

    def _mode_result(self, row: _Row, out, batch_timings: dict) -> GenerationResult:
        """Issue 17: content, tool_calls and finish_reason read from the tokens (surecall.modes)."""
        from surecall.modes import read_output

        outcome, _ = read_output(row.mode, self.vocab, out.token_ids)
        error, kind = outcome.error, ("invalid" if outcome.error else None)
        if out.error:
            error, kind = f"Decode error at row {row.index}: {out.error}", "decode"
        finish = "error" if out.error else outcome.finish_reason(out.finish_reason == "stop")
        first = outcome.tool_calls[0] if outcome.tool_calls else None
        call = ToolCall(first.name, first.parsed or {}) if first else None
        return GenerationResult(
            token_ids=out.token_ids, text=self._text(out.token_ids), call=call, error=error, logprobs=out.logprobs,
            unmasked_logprobs=out.unmasked_logprobs, finish_reason=finish,
            timings={"num_tokens": len(out.token_ids), "num_steps": out.num_steps, "finish_s": out.finish_s},
            num_tokens=len(out.token_ids), error_kind=kind, ok=error is None, prompt_token_ids=list(row.ids),
            batch_timings=batch_timings, content=outcome.content, tool_calls=outcome.tool_calls, mode=row.mode,
        )

    @staticmethod
    def _error_result(row: _Row) -> GenerationResult:
        return GenerationResult(
            token_ids=[], text="", call=None, error=str(row.error), logprobs=None, unmasked_logprobs=None,
            finish_reason="error", error_kind="request", prompt_token_ids=list(row.ids or []),
            content=None if not row.mode_args else "",
        )

    def _text(self, ids: list[int]) -> str:
        if self.vocab is None:
            return ""
        stops = set(self.vocab.stop_ids)
        names = {v: k for k, v in self.vocab.special_tokens.items()}
        parts = []
        for t in ids:
            if t in stops:
                continue
            b = self.vocab.token_bytes[t] if t < self.vocab.vocab_size else b""
            parts.append(b if b else names.get(t, "").encode())
        return b"".join(parts).decode("utf-8", errors="replace")

    def _config_stop_ids(self) -> list[int]:
        eos = getattr(self.runner.config, "eos_token_id", None)
        return [eos] if isinstance(eos, int) else list(eos or [])

    def _pad_id(self) -> int:
        pad = getattr(self.runner.config, "pad_token_id", None)
        return int(pad) if isinstance(pad, int) and 0 <= pad < self.runner.logits_width else 0


# --- output modes (issue 17): per-row request parameters ---------------------------------------
def _modes_args(n: int, tool_choice, parallel_tool_calls, response_format) -> list[tuple] | None:
    """[(tool_choice, parallel_tool_calls, response_format)] per row, or None when none was given."""
    if tool_choice is None and parallel_tool_calls is None and response_format is None:
        return None
    columns = []
    for name, value in (("tool_choice", tool_choice), ("parallel_tool_calls", parallel_tool_calls),
                        ("response_format", response_format)):
        if isinstance(value, (list, tuple)):
            if len(value) != n:
                raise RequestError(f"Invalid {name}: expected one value or a list of {n}, got {len(value)} items")
            columns.append(list(value))
        else:
            columns.append([value] * n)
    return list(zip(*columns, strict=True))


# --- tools in every accepted shape (the one normaliser: surecall.tools.normalise_tool) ------------
def _normalise_tools(tools, where: str) -> list[Tool]:
    """Every entry of one tool list as a `Tool`; ToolDefinitionError naming the entry, or a repeated name."""
    out = []
    for i, obj in enumerate(tools):
        try:
            out.append(normalise_tool(obj, where=f"Invalid tool {i} in {where}"))
        except ToolDefinitionError as exc:
            hint = " (per-row tools: give every row a list of tools, or None)" if isinstance(obj, (list, tuple)) else ""
            raise ToolDefinitionError(f"{exc}{hint}") from exc
    names = [t.name for t in out]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ToolDefinitionError(
            f"Invalid {where}: tool name {repeated[0]!r} appears more than once (give each raw JSON Schema "
            f"its own 'title', or pass {{'name': ..., 'parameters': schema}})"
        )
    return out


def _item_table(table, device):
    """The item counters of a table with counted arrays on `device` (kernels/items.py), else None."""
    from surecall.kernels.items import ItemTable

    return ItemTable.from_table(table, device) if table.has_items else None
