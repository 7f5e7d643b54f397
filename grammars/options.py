"""GrammarOptions: every knob that changes which text a compiled grammar accepts, or how it is built.

One frozen dataclass, validated in `__post_init__`, with a stable `cache_key()` (the disk cache
keys on it). Whitespace, length bounds, recursion and closed-object policy decide the regex;
the time and memory budgets only bound the compiler. This module does no compiling itself.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass

WHITESPACE_POLICIES = ("none", "bounded", "free")
CALL_PIECES = ("auto", "always", "never")
_WHITESPACE_CHARS = " \t\n\r"


@dataclass(frozen=True)
class GrammarOptions:
    """How a schema becomes a grammar.

    whitespace: "bounded" (default: at most `max_whitespace` of `whitespace_chars` wherever JSON
        allows whitespace), "none" (compact JSON only) or "free" (any run of `whitespace_chars`).
    counted_lengths: True (default) enforces string minLength/maxLength, `^[set]{n,m}$` patterns
        and minItems/maxItems (above 8) of any size with per-row counters (grammars/counted.py,
        grammars/items.py); False materialises them up to max_bounded_length.
    max_bounded_length: length bounds that are not counted (all when counted_lengths is False;
        arrays with prefixItems or holding a counted array; a large quantifier inside a larger
        pattern) above it are not materialised; they are relaxed and listed with a reason.
    max_ref_depth: how many times one `$ref` may be expanded inside itself; deeper recursion is
        cut off (the grammar gets stricter, listed in the table's `narrowed`); a schema that
        cannot end inside it is unsupported. Where the unrolled grammar passes the memory budget,
        compile_schema/compile_catalog lower it one level at a time, down to 0, within the time
        budget (meta "ref_depth_fallback").
    max_any_depth: how many containers deep a value under an unconstrained schema (`{}`, `true`,
        a free-form `{"type": "object"}`) may nest; deeper values are rejected (stricter, never
        looser; each such value is listed in the table's `narrowed`). With splicing (compile_schema)
        each level is one sub-automaton, so the regex grows linearly (inlined text, as in catalogs
        and tool modes: ~4x per level) and depths up to 7 compile; but the byte DFA doubles per level either way (it must remember the stack
        of open `{`/`[`): +26% states per level on a Kubernetes schema. The default stays 2: at 3, median compile time on
        Kubernetes/Github_medium/JsonSchemaStore rose ~20-30% (tables ~+7%) and one more schema
        timed out, past the ~10% allowed (benchmarks/results/free_form_depth.md).
    free_form_stack: True (default) writes a free-form value to any depth (up to
        stack.MAX_STACK_DEPTH, 62) with one small automaton and a per-row stack of the open
        containers' kinds (grammars/stack.py); max_any_depth then applies only where the stack
        cannot be used (compile_schema falls back to it, meta "stack_fallback"). False unrolls
        free-form values max_any_depth levels deep, as before.
    allow_additional_properties: False (default) closes an object with declared properties and no
        `additionalProperties` keyword to those properties (stricter than JSON Schema's default,
        never looser); True lets undeclared keys follow them. An explicit `additionalProperties:
        true` or schema and a free-form object always take extra keys after the declared ones
        (an extra key never spells a declared name: no duplicate of a declared key); keys that
        match `patternProperties` are written from the pattern (and then no other extra keys).
    any_property_order: False (default) writes properties in the schema's declared order only
        (so does xgrammar; valid JSON in another order is rejected). True accepts any order for
        objects of at most schema.to_regex.MAX_ANY_ORDER (4) declared properties and no extra
        keys; larger objects keep declared order (the regex would grow as n!).
    rewrite_conditionals: True (default) writes if/then/else, `not` and overlapping oneOf into
        the grammar by negation (schema/conditionals.py); False leaves them relaxed. compile_schema
        retries with False when the table would pass the memory budget.
    max_regex_length: a schema whose regex grows past this many characters is unsupported
        (recursion and nested optional properties can grow it exponentially).
    call_pieces: how a large `$ref`'d object or array value that occurs in many places is compiled
        (grammars/calls.py). "auto" (default): copied into each place, and called instead (one
        body, the return site on the row's stack) where the copies pass the memory budget;
        "always": called wherever it can be; "never": always copied. Calls are made only in
        grammars without free-form values.
    time_budget_s / memory_budget_bytes: the compiler stops with CompileBudgetExceeded past them (the time
        budget is the whole compile's: conversion, byte DFA, token walk, table and fallbacks together).
    """

    whitespace: str = "bounded"
    max_whitespace: int = 1
    whitespace_chars: str = " "
    counted_lengths: bool = True
    max_bounded_length: int = 48
    max_ref_depth: int = 3
    max_any_depth: int = 2
    free_form_stack: bool = True
    allow_additional_properties: bool = False
    any_property_order: bool = False
    rewrite_conditionals: bool = True
    call_pieces: str = "auto"
    max_regex_length: int = 1_000_000
    time_budget_s: float = 30.0
    memory_budget_bytes: int = 2 << 30

    def __post_init__(self) -> None:
        if self.whitespace not in WHITESPACE_POLICIES:
            raise ValueError(
                f"Invalid whitespace: expected one of {WHITESPACE_POLICIES}, got {self.whitespace!r}"
            )
        _check_int("max_whitespace", self.max_whitespace, 0, 64)
        if not self.whitespace_chars or any(c not in _WHITESPACE_CHARS for c in self.whitespace_chars):
            raise ValueError(
                "Invalid whitespace_chars: expected a non-empty subset of ' \\t\\n\\r', "
                f"got {self.whitespace_chars!r}"
            )
        _check_int("max_bounded_length", self.max_bounded_length, 1, 4096)
        _check_int("max_ref_depth", self.max_ref_depth, 0, 64)
        _check_int("max_any_depth", self.max_any_depth, 0, 8)
        _check_int("max_regex_length", self.max_regex_length, 1000, 1 << 30)
        if not isinstance(self.counted_lengths, bool):
            raise ValueError(f"Invalid counted_lengths: expected a bool, got {self.counted_lengths!r}")
        if not isinstance(self.allow_additional_properties, bool):
            raise ValueError(
                "Invalid allow_additional_properties: expected a bool, "
                f"got {self.allow_additional_properties!r}"
            )
        if not isinstance(self.rewrite_conditionals, bool):
            raise ValueError(f"Invalid rewrite_conditionals: expected a bool, got {self.rewrite_conditionals!r}")
        if not isinstance(self.free_form_stack, bool):
            raise ValueError(f"Invalid free_form_stack: expected a bool, got {self.free_form_stack!r}")
        if not isinstance(self.any_property_order, bool):
            raise ValueError(f"Invalid any_property_order: expected a bool, got {self.any_property_order!r}")
        if self.call_pieces not in CALL_PIECES:
            raise ValueError(f"Invalid call_pieces: expected one of {CALL_PIECES}, got {self.call_pieces!r}")
        if not isinstance(self.time_budget_s, (int, float)) or not self.time_budget_s > 0:
            raise ValueError(f"Invalid time_budget_s: expected a number > 0, got {self.time_budget_s!r}")
        _check_int("memory_budget_bytes", self.memory_budget_bytes, 1 << 20, 1 << 50)

    def whitespace_regex(self) -> str:
        """The regex for one place where JSON allows whitespace ("" when none is allowed)."""
        if self.whitespace == "none" or (self.whitespace == "bounded" and self.max_whitespace == 0):
            return ""
        chars = "".join({" ": " ", "\t": r"\t", "\n": r"\n", "\r": r"\r"}[c] for c in self.whitespace_chars)
        unit = " " if chars == " " else f"[{chars}]"
        if self.whitespace == "free":
            return f"{unit}*"
        if self.max_whitespace == 1:
            return f"{unit}?"
        return f"{unit}{{0,{self.max_whitespace}}}"

    def separators(self) -> tuple[str, str]:
        """(item, key) separators of the canonical rendering: with a space when one is allowed."""
        if self.whitespace_regex() == "" or " " not in self.whitespace_chars:
            return (",", ":")
        return (", ", ": ")

    def cache_key(self) -> str:
        """A stable string naming these options (sorted JSON of every field)."""
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))


def _check_int(name: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"Invalid {name}: expected an int in [{low}, {high}], got {value!r}")


# One compile's stages (schema -> regex, the byte DFA, the token walk, the table) and its fallbacks
# share one time budget: each counts from when the outermost compile call began, not from its own
# start (a slow conversion followed by a slow DFA ran up to twice time_budget_s).
_BUDGET_STARTED: ContextVar[float | None] = ContextVar("surecall_budget_started", default=None)


@contextmanager
def one_time_budget():
    """Within it (and in what it calls on this thread or task), budget_started() is when the
    outermost `with` began; nested uses keep the outer start."""
    if _BUDGET_STARTED.get() is not None:
        yield
        return
    token = _BUDGET_STARTED.set(time.perf_counter())
    try:
        yield
    finally:
        _BUDGET_STARTED.reset(token)


def budget_started() -> float:
    """When the time budget under way began: the outermost one_time_budget(), else now."""
    started = _BUDGET_STARTED.get()
    return time.perf_counter() if started is None else started
