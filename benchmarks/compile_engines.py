"""Engine adapters for benchmarks/compile.py, run inside its isolated worker processes.

Each adapter compiles one JSON Schema over the Llama-3 vocabulary (surecall, xgrammar,
llguidance with its defaults or lenient, outlines-core) and says whether a text is accepted
by the compiled object (Llama-3 token ids from the real tokenizer, or the engine's own string
API) and how many bytes its table holds. `Ours` also runs random walks, free and cut by a tight
token budget, and validates them against the original schema with `jsonschema`.
`compile_open` (ours, xgrammar) compiles with objects open instead: undeclared keys allowed and,
where the engine has the option, any property order; compile.py uses it for the second
acceptance figure. Nothing here isolates, limits or aggregates: compile.py does that.
"""

from __future__ import annotations

import dataclasses
import json
import time

LENGTH_ITEM_BOUNDS = ("minLength", "maxLength", "minItems", "maxItems")


class Tokens:
    """The Llama-3 vocabulary as surecall loads it, plus its tiktoken encoder (text -> ids)."""

    def __init__(self, data_dir):
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe

        from surecall.grammars.vocab.loaders import load_shared

        self.vocab = load_shared("llama3")
        manifest = json.loads((data_dir / "tokenizers" / "manifest.json").read_text())
        entry = next(t for t in manifest["tokenizers"] if t["name"] == "llama3")
        ranks = load_tiktoken_bpe(str(data_dir / "tokenizers" / "llama3" / "tokenizer.model"))
        self.encoding = tiktoken.Encoding("llama3", pat_str=entry["pretokenizer_regex"], mergeable_ranks=ranks,
                                          special_tokens=dict(self.vocab.special_tokens))

    def encode(self, text: str) -> list[int]:
        return self.encoding.encode_ordinary(text)


def timed(fn, *args):
    started = time.perf_counter()
    out = fn(*args)
    return out, (time.perf_counter() - started) * 1e3


class OpenGrammar:
    """Ours with objects open, as a byte DFA (`Ours.compile_open`)."""

    def __init__(self, dfa):
        self.dfa = dfa


class Ours:
    name = "ours"

    def __init__(self, tokens: Tokens, walks: int):
        self.tokens, self.walks = tokens, walks

    def warm_up(self) -> None:
        """The per-process set-up `LLM` and `surecall compile` do once (grammars.compile.warm_up)."""
        from surecall.grammars.compile import warm_up

        warm_up(self.tokens.vocab)

    def compile(self, schema):
        from surecall.grammars.compile import compile_schema

        return compile_schema(schema, self.tokens.vocab, use_cache=False)

    def compile_open(self, schema) -> OpenGrammar:
        """The byte DFA of the grammar with objects open (undeclared keys after the declared ones,
        any order for small closed objects); no token table: open tables over the Llama-3
        vocabulary often pass the memory budget, and which texts the policy admits does not
        depend on the vocabulary. Counted bounds are spelled out (relaxed past 48), which the
        valid instances this is used for meet anyway."""
        from surecall.grammars.automaton import regex_to_dfa
        from surecall.grammars.options import GrammarOptions
        from surecall.grammars.schema.to_regex import schema_to_regex
        from surecall.grammars.splice import build_spliced
        from surecall.grammars.stack import StackCutError, cut_stack_marks

        options = GrammarOptions(allow_additional_properties=True, any_property_order=True, counted_lengths=False)
        for opts in (options, dataclasses.replace(options, free_form_stack=False)):
            result = schema_to_regex(schema, opts, splice=True)
            dfa = (regex_to_dfa(result.regex) if not result.pieces else
                   build_spliced(result.regex, result.pieces, regex_to_dfa, opts.memory_budget_bytes))
            try:  # as compile_schema does: free-form values unrolled where the stack cannot be cut
                cut_stack_marks(dfa)
            except StackCutError:
                continue
            return OpenGrammar(dfa)
        return OpenGrammar(dfa)

    def describe(self, table) -> dict:
        relaxed = [list(r) for r in table.relaxed]
        return {"table_bytes": int(table.nbytes), "states": int(table.num_states), "relaxed": relaxed,
                "bounds_relaxed": sum(k in LENGTH_ITEM_BOUNDS for _, k in relaxed)}

    def relaxed(self, table) -> list:
        return table.relaxed

    def accepts(self, table, text: str) -> bool:
        from surecall.grammars.walk import accepts

        if isinstance(table, OpenGrammar):
            return table.dfa.matches(text.encode())
        return accepts(table, self.tokens.encode(text))

    def walk_check(self, schema, table) -> dict:
        """Random walks (odd ones cut at the fewest tokens + 2): parse, validate, explain."""
        import numpy as np

        from surecall.grammars.walk import decode, random_walk, schema_violations

        rng = np.random.default_rng(0)
        valid = unsound = relaxed_only = 0
        examples = []
        for i in range(self.walks):
            budget = int(table.dist[0]) + 2 if i % 2 else max(512, int(table.dist[0]) + 64)
            ids = random_walk(table, self.tokens.vocab, rng, max_tokens=budget)
            text = decode(self.tokens.vocab, ids)
            try:
                doc = json.loads(text)
            except ValueError:
                unsound += 1
                examples.append(f"does not parse: {text[:120]!r}")
                continue
            bad, soft = schema_violations(schema, doc, table.relaxed)
            valid += not bad and not soft
            relaxed_only += bool(soft) and not bad
            unsound += bool(bad)
            examples += [f"{bad[0][:160]}"] if bad else []
        return {"walks": self.walks, "walks_valid": valid, "walks_relaxed": relaxed_only, "walks_unsound": unsound,
                "walk_errors": examples[:2]}


class XGrammar:
    name = "xgrammar"

    def __init__(self, tokens: Tokens):
        import xgrammar as xgr

        vocab = tokens.vocab
        info = xgr.TokenizerInfo(list(vocab.token_bytes), xgr.VocabType.RAW, vocab_size=vocab.logits_width,
                                 stop_token_ids=list(vocab.stop_ids))
        self.xgr = xgr
        self.compiler = xgr.GrammarCompiler(info, cache_enabled=False)

    def compile(self, schema):
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)

    def compile_open(self, schema):
        """strict_mode off (undeclared keys where the schema does not forbid them), any_order on."""
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, strict_mode=False,
                                                 any_order=True)

    def describe(self, compiled) -> dict:
        return {"table_bytes": int(compiled.memory_size_bytes)}

    def relaxed(self, compiled) -> list:
        return []

    def accepts(self, compiled, text: str) -> bool:
        matcher = self.xgr.GrammarMatcher(compiled)
        return bool(matcher.accept_string(text) and matcher.is_completed())


class LLGuidance:
    """llguidance: 'compile' is the matcher's construction plus its first mask (it has no table)."""

    def __init__(self, tokens: Tokens, lenient: bool):
        import llguidance
        from llguidance.tiktoken import lltokenizer_from_encoding

        self.name = "llguidance-lenient" if lenient else "llguidance"
        self.llg, self.tokens, self.lenient = llguidance, tokens, lenient
        vocab = tokens.vocab
        self.tokenizer = lltokenizer_from_encoding(tokens.encoding, n_vocab=vocab.logits_width,
                                                   eos_token=list(vocab.stop_ids))

    def compile(self, schema):
        overrides = {"lenient": True} if self.lenient else None
        grammar = self.llg.LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=overrides)
        matcher = self.llg.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise RuntimeError(matcher.get_error())
        pristine = matcher.deep_copy()
        matcher.compute_bitmask()
        if matcher.is_error():
            raise RuntimeError(matcher.get_error())
        return pristine

    def describe(self, matcher) -> dict:
        return {}

    def relaxed(self, matcher) -> list:
        return []

    def accepts(self, matcher, text: str) -> bool:
        m = matcher.deep_copy()
        return bool(m.consume_tokens(self.tokens.encode(text)) and m.is_accepting())


class Outlines:
    name = "outlines"

    def __init__(self, tokens: Tokens):
        from outlines_core import Vocabulary

        vocab = tokens.vocab
        by_bytes: dict[bytes, list[int]] = {}
        for i, b in enumerate(vocab.token_bytes):
            if b and i not in vocab.special_ids:
                by_bytes.setdefault(b, []).append(i)
        self.tokens = tokens
        self.vocabulary = Vocabulary(vocab.stop_ids[0], by_bytes)

    def compile(self, schema):
        from outlines_core import Index
        from outlines_core.json_schema import build_regex_from_schema

        regex = build_regex_from_schema(json.dumps(schema), whitespace_pattern=r"[ ]?")
        return Index(regex, self.vocabulary)

    def describe(self, index) -> dict:
        return {}

    def relaxed(self, index) -> list:
        return []

    def accepts(self, index, text: str) -> bool:
        state = index.get_initial_state()
        for t in self.tokens.encode(text):
            state = index.get_next_state(state, t)
            if state is None:
                return False
        return bool(index.is_final_state(state))


def make_engine(name: str, tokens: Tokens, walks: int):
    factories = {"ours": lambda: Ours(tokens, walks), "xgrammar": lambda: XGrammar(tokens),
                 "llguidance": lambda: LLGuidance(tokens, lenient=False),
                 "llguidance-lenient": lambda: LLGuidance(tokens, lenient=True), "outlines": lambda: Outlines(tokens)}
    return factories[name]()


def styles(value, schema, with_grammar_order: bool = True) -> list[str]:
    """The texts of one instance tried on every engine: one-space, compact, and our grammar's order."""
    from surecall.grammars.schema.render import grammar_dumps

    texts = [json.dumps(value, ensure_ascii=False), json.dumps(value, ensure_ascii=False, separators=(",", ":"))]
    if with_grammar_order:
        try:
            texts.append(grammar_dumps(value, schema))
        except Exception:  # noqa: BLE001 - a schema the renderer cannot follow keeps the two plain spellings
            pass
    return list(dict.fromkeys(texts))


def instance_check(engine, schema, compiled, tests: list) -> dict:
    """Valid instances accepted (in any style), invalid ones rejected (in every style).

    `tests` holds (data, is_valid, texts) already confirmed by jsonschema, `texts` its spellings
    (`styles`). An invalid instance counts only where its violated keyword is one the engine
    enforces (ours: not relaxed).
    """
    from surecall.grammars.walk import schema_violations

    out = {**valid_check(engine, compiled, tests), "invalid_n": 0, "invalid_rejected": 0, "invalid_relaxed": 0}
    relaxed = engine.relaxed(compiled)
    for data, is_valid, texts in tests:
        if is_valid:
            continue
        if relaxed and not schema_violations(schema, data, relaxed)[0]:
            out["invalid_relaxed"] += 1
        else:
            out["invalid_n"] += 1
            out["invalid_rejected"] += not any(engine.accepts(compiled, t) for t in texts)
    return out


def valid_check(engine, compiled, tests: list) -> dict:
    """Valid instances accepted in any of their spellings, and the first two rejected ones."""
    out = {"valid_n": 0, "valid_accepted": 0, "rejected_valid": []}
    for data, is_valid, texts in tests:
        if not is_valid:
            continue
        accepted = any(engine.accepts(compiled, t) for t in texts)
        out["valid_n"] += 1
        out["valid_accepted"] += accepted
        if not accepted and len(out["rejected_valid"]) < 2:
            out["rejected_valid"].append(json.dumps(data)[:160])
    return out
