"""LLM: the public entry point that turns prompts and tools into tool calls.

`LLM(model, tokenizer)` loads the model runner and the vocabulary once (a model directory's own
tokenizer: Hugging Face files, SentencePiece or tiktoken `tokenizer.model`); `generate` turns
each row's tools (any accepted shape) into `Tool`s, renders its prompt, compiles (and caches)
the grammar of each distinct (tools, format), refuses rows whose budget cannot fit any call,
submits the good rows to its `EngineCore` (the same continuous-batching core `AsyncLLM` runs on,
kept between calls so its prefix cache serves the next call too), steps it until every row is
done, then parses and validates every completion. A bad row reports its error in its own result;
only a request in which every row is bad raises. It does not dispatch or run tools.
"""

from __future__ import annotations

import codecs
import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from surecall.config import EngineConfig, SamplingParams
from surecall.core.engine import EngineCore, RequestState
from surecall.core.model_runner import ModelRunner
from surecall.core.prompts import is_single_prompt, render_prompt
from surecall.errors import ModelLoadError, RequestError, SurecallError, ToolDefinitionError
from surecall.grammars.compile import compile_catalog
from surecall.grammars.formats import get_format
from surecall.models.tokenizers import load_model_tokenizer
from surecall.tools import Tool, normalise_tool
from surecall.tools.calls import ToolCall, check_call, tool_name_schema

KV_CACHE_BYTES = 1 << 30  # the most K/V pool `generate` sizes for a request's rows (more rows: preemption)
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
    # One dict shared by every row of a generate call: prefill_s (steps that fed prompt chunks),
    # decode_s (the other steps), sample_s (the sampling kernels, grammar mask fused in), advance_s
    # (grammar advance), num_steps (engine steps), num_decode_steps (those in decode_s; per-step time is
    # decode_s / num_decode_steps), num_rows, step_mode ("paged" | "plain"),
    # prefix_hit_rate, num_preemptions, graph_capture_s and compactions (0: kept for old readers),
    # and compile_s (the whole generate call's grammar compiles)
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
        # the grammar compiler's per-process set-up for this vocabulary (~0.3 s on a 128k one), here
        # at load rather than in the first request that brings tools
        from surecall.grammars.compile import warm_up

        if self.vocab is not None:  # None: built without a tokenizer, so only unconstrained rows
            warm_up(self.vocab, self.config.grammar_options)
        self._tables: dict[str, Any] = {}  # (tools, format, options) key -> TokenTable
        self._engine: EngineCore | None = None  # built on first generate, grown when a request needs more
        self._calls = itertools.count()
        self._engine_lock = threading.Lock()
        self._stops: frozenset[int] | None = None  # vocab stop ids and special-token names, for _token_bytes
        self._names: dict[int, bytes] = {}

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
        for row, res in zip(good, self._decode(good, fmt), strict=True):
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
    def engine(self, rows: int = 1, tokens_per_row: int = 1) -> EngineCore:
        """The engine core `generate` runs on, with a K/V pool for `rows` x `tokens_per_row` tokens.

        Built on first use and kept (its prefix cache outlives a call); rebuilt larger when a
        request's rows need more room than it has, up to KV_CACHE_BYTES (beyond that the core
        preempts and recomputes; a single row always fits).
        """
        from surecall.core.kv_cache import bytes_per_token

        block = 16
        per_block = bytes_per_token(self.runner.config, self.runner.param_dtype) * block
        one_row = -(-tokens_per_row // block)
        want = max(one_row, min(rows * one_row, KV_CACHE_BYTES // per_block))
        if self._engine is None or self._engine.blocks.num_blocks < want:
            default = EngineCore.default_num_blocks(self.runner.model, block, self._max_len())
            self._engine = EngineCore(self.runner.model, block_size=block, num_blocks=max(want, default),
                                      max_num_seqs=self.config.max_batch_size, max_model_len=self._max_len(),
                                      pad_id=self._pad_id(), check_kernel_inputs=self.config.check_kernel_inputs,
                                      graph_step=self.config.graph_step)
        return self._engine

    def _max_len(self) -> int:
        return self.config.max_seq_len or self.runner.max_positions

    def _decode(self, rows: list[_Row], fmt) -> list[GenerationResult]:
        """Submit every row to the engine core, step it until all are done, read each row's outcome.

        Calls from several threads take turns (one engine core per LLM)."""
        with self._engine_lock:
            return self._decode_locked(rows, fmt)

    def _decode_locked(self, rows: list[_Row], fmt) -> list[GenerationResult]:
        core = self.engine(len(rows), max(len(r.ids) + r.sampling.max_tokens for r in rows))
        stop_ids = list(self.vocab.stop_ids) if self.vocab is not None else self._config_stop_ids()
        call = next(self._calls)
        before = dict(core.timings)
        hits = (core.blocks.stats.hit_tokens, core.blocks.stats.queried_tokens)
        preemptions = core.num_preemptions
        seqs = []
        start = time.perf_counter()
        prefill_s = decode_s = 0.0
        steps = decode_steps = 0
        try:
            for r in rows:
                table = self._tables[r.table_key] if r.table_key is not None else None
                seqs.append(core.add_request(f"generate-{call}-{r.index}", r.ids, r.sampling, stop_ids=stop_ids,
                                             table=table, table_key=r.table_key, forced_ids=r.forced))
            while core.has_unfinished:
                t = time.perf_counter()
                core.step()
                took = time.perf_counter() - t
                steps += 1
                if core.last_step_prefill:
                    prefill_s += took
                else:
                    decode_s += took
                    decode_steps += 1
        finally:  # an interrupted call leaves nothing running (no-op for finished rows)
            for seq in seqs:
                core.abort(seq.request_id)
        hit, queried = core.blocks.stats.hit_tokens - hits[0], core.blocks.stats.queried_tokens - hits[1]
        batch_timings = {"prefill_s": prefill_s, "decode_s": decode_s, "num_steps": steps, "num_decode_steps": decode_steps,
                         "num_rows": len(rows),
                         **{k: core.timings[k] - before[k] for k in before},
                         "step_mode": "paged" if core.paged else "plain", "prefix_hit_rate": hit / queried if queried else 0.0,
                         "num_preemptions": core.num_preemptions - preemptions, "graph_capture_s": 0.0, "compactions": 0}
        return [self._result(r, _row_output(seq.payload, start), batch_timings, fmt)
                for r, seq in zip(rows, seqs, strict=True)]

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
        return self._token_bytes(ids).decode("utf-8", errors="replace")

    def _token_bytes(self, ids: list[int]) -> bytes:
        """The bytes `ids` spell (stop ids dropped; a special token without bytes is its name)."""
        if self._stops is None:
            self._stops = frozenset(self.vocab.stop_ids)
            self._names = {v: k.encode() for k, v in self.vocab.special_tokens.items()}
        stops, names, table, size = self._stops, self._names, self.vocab.token_bytes, self.vocab.vocab_size
        return b"".join((table[t] if t < size else b"") or names.get(t, b"") for t in ids if t not in stops)

    def text_stream(self) -> TextStream:
        """An incremental decoder of generated ids to text (what `_text` gives, without re-decoding)."""
        return TextStream(self)

    def _config_stop_ids(self) -> list[int]:
        eos = getattr(self.runner.config, "eos_token_id", None)
        return [eos] if isinstance(eos, int) else list(eos or [])

    def _pad_id(self) -> int:
        pad = getattr(self.runner.config, "pad_token_id", None)
        return int(pad) if isinstance(pad, int) and 0 <= pad < self.runner.logits_width else 0


@dataclass
class _RowOut:
    """One row's decode outcome, read off the engine core's request state."""

    token_ids: list[int]
    logprobs: list[float] | None
    unmasked_logprobs: list[float] | None
    finish_reason: str  # "stop" (a stop id or the grammar's end) | "length" | "error"
    error: str | None
    num_steps: int  # sampling rounds (forced ids are none; a failed round counts)
    finish_s: float  # seconds from the call's first step to the row's end


def _row_output(st: RequestState, start: float) -> _RowOut:
    s = st.sampling
    failed = st.error is not None
    return _RowOut(
        token_ids=list(st.generated),
        logprobs=list(st.logprobs) if s.logprobs else None,
        unmasked_logprobs=list(st.unmasked_logprobs) if s.unmasked_logprobs else None,
        finish_reason="error" if failed else ("stop" if st.by_stop else "length"),
        error=st.error,
        num_steps=len(st.generated) - len(st.forced) + (1 if failed else 0),
        finish_s=(st.finished_s or time.perf_counter()) - start,
    )


class TextStream:
    """Generated ids to text, token by token: each `feed` decodes only the new ids.

    Bytes of a character split across tokens wait for the rest (the text only ever grows);
    `finish` flushes them, so the final text equals `LLM._text` of all the ids.
    """

    def __init__(self, llm: LLM):
        self.llm = llm
        self.text = ""
        self.num_ids = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._lock = threading.Lock()  # AsyncLLM feeds from its step thread and from abort

    def feed(self, ids: list[int], final: bool = False) -> str:
        """Decode ids[num_ids:] (ids is the cumulative list); the text so far."""
        with self._lock:
            if self.llm.vocab is not None and (len(ids) > self.num_ids or final):
                self.text += self._decoder.decode(self.llm._token_bytes(ids[self.num_ids :]), final=final)
            self.num_ids = max(self.num_ids, len(ids))
            return self.text


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
