"""JSON string bodies from one per-process DFA, laid into the rows of the regex's DFA.

A JSON string's body (json_lex.STRING_CHAR*) is the most repeated sub-regex of a schema's regex
(every free string, counted or not) and costs outlines-core ~0.3 ms each. Its DFA depends on no
schema: it is built once per process, each body is written as a placeholder (splice.py's form),
and a copy of its rows replaces each placeholder path: a body state's bytes differ from the bytes
that may follow the body, so the rows overlay without a subset construction. Where they would
not, the regex is built as written. Nothing here is keyed by a schema.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from surecall.grammars.automaton import ByteDFA, prune, regex_to_dfa
from surecall.grammars.schema.json_lex import STRING_CHAR
from surecall.grammars.splice import (
    MAX_PIECES,
    PLACEHOLDER_LEAD,
    find_placeholders,
    placeholder,
    placeholders_in,
)

STRING_BODY = f"{STRING_CHAR}*"
_BODY_INDEX = MAX_PIECES - 1  # its placeholder; to_regex's pieces stay below (Pieces raises first)
_MIN_BODIES = 2  # one body alone saves less than the overlay costs
_shared_dfas: dict[str, ByteDFA] = {}


def build_with_shared_bodies(regex: str, build: Callable[[str], ByteDFA],
                             build_parent: Callable[[str], ByteDFA] | None = None) -> ByteDFA:
    """`build(regex)`, with its string bodies taken from the per-process DFA of STRING_BODY.

    `build_parent` builds the regex with placeholders (default `build`); it may leave the DFA
    unpruned (start 0, dead and unreachable states kept): the overlay prunes it anyway.

    Only for a regex without placeholders of its own (splice.py's pieces are built leaf first);
    falls back to `build(regex)` where a body's rows would share a byte with the rows around it.
    The language is always `build(regex)`'s; the DFA is its minimal one, array for array, on the
    schemas the tests and benchmarks/table_guard.py check.
    """
    if regex.count(STRING_BODY) < _MIN_BODIES or placeholders_in(regex) or "\\" + STRING_BODY in regex:
        return build(regex)  # (after a backslash the text would not be a group: leave it as written)
    parent = (build_parent or build)(regex.replace(STRING_BODY, placeholder(_BODY_INDEX)))
    body = _shared_dfas.get(STRING_BODY)
    if body is None:
        body = _shared_dfas[STRING_BODY] = regex_to_dfa(STRING_BODY)
    dfa = _overlay(parent, body)
    return build(regex) if dfa is None else dfa


def _overlay(parent: ByteDFA, body: ByteDFA) -> ByteDFA | None:
    """`parent` with each body placeholder path s --> t replaced by a copy of `body` leaving for t
    (one copy per t), pruned; None where the rows would overlap (a subset construction needed)."""
    try:
        found = find_placeholders(parent)
    except ValueError:
        return None
    sources = [s for s, _, _ in found]
    exits = sorted({t for _, _, t in found})
    if (not found or any(i != _BODY_INDEX for _, i, _ in found) or set(sources) & set(exits)
            or len(set(sources)) < len(sources)):
        return None
    n, m = parent.num_states, body.num_states
    live, final = body.trans >= 0, np.flatnonzero(body.accept)
    trans = np.full((n + m * len(exits), 256), -1, dtype=np.int32)
    trans[:n] = parent.trans
    trans[sources, PLACEHOLDER_LEAD] = -1
    accept = np.zeros(trans.shape[0], dtype=bool)
    accept[:n] = parent.accept
    offset_of = {t: n + m * k for k, t in enumerate(exits)}
    for t, offset in offset_of.items():
        exit_row = parent.trans[t]
        if (live[final] & (exit_row >= 0)).any():
            return None
        rows = trans[offset : offset + m]
        rows[live] = body.trans[live] + offset
        rows[final] = np.where(exit_row >= 0, exit_row, rows[final])  # disjoint: the exit's bytes
        accept[offset + final] = parent.accept[t]
    merged_into: dict[int, int] = {}
    for s, _, t in found:
        offset, own = offset_of[t], trans[s]
        if not (own >= 0).any() and not parent.accept[s]:  # s is the copy's start: one state
            if merged_into.setdefault(t, s) != s:
                return None
            continue
        first = trans[offset]
        if ((own >= 0) & (first >= 0)).any():
            return None
        trans[s] = np.where(own >= 0, own, first)
        accept[s] |= accept[offset]
    for t, s in merged_into.items():
        offset = offset_of[t]
        trans[s] = trans[offset]
        accept[s] = accept[offset]
        block = trans[offset : offset + m]
        block[block == offset] = s
        trans[s][trans[s] == offset] = s
        for q, _, u in found:  # other sources entering this copy read its start row, now s's
            if u == t and q != s:
                trans[q][trans[q] == offset] = s
    return prune(trans, accept, 0)
