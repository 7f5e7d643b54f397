"""JSON string bodies, free numbers and string formats from one per-process DFA each, laid into the
rows of the regex's DFA.

A JSON string's body (json_lex.STRING_CHAR*) is the most repeated sub-regex of a schema's regex
(every free string, counted or not) and costs outlines-core ~0.3 ms each. Its DFA depends on no
schema: it is built once per process, each body is written as a placeholder (splice.py's form),
and a copy of its rows replaces each placeholder path: a body state's bytes differ from the bytes
that may follow the body, so the rows overlay without a subset construction. Where they would
not, the regex is built as written. Free numbers, integers and string formats go the same way
(a number is ~30 states of outlines-core's work per use, a `uri` ~6 ms): on the JSONSchemaBench
sample's schemas under 300 ms, the median compile went 19.3 -> 16.7 ms. A regex that holds
splice.py's placeholders (a catalog, a large schema) shares its bodies too, the pieces' paths left
for the splice; a body whose rows meet the text around it is written out and the others laid in
again (GitHub MCP's 78 tools as one catalog: 2.1 -> 1.4 s). Nothing here is keyed by a schema.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import numpy as np

from surecall.grammars.automaton import ByteDFA, prune, regex_to_dfa
from surecall.grammars.schema import json_lex as lex
from surecall.grammars.schema.json_lex import STRING_CHAR
from surecall.grammars.schema.string_formats import STRING_FORMATS
from surecall.grammars.splice import (
    MAX_PIECES,
    PLACEHOLDER_LEAD,
    RESERVED_PIECES,
    find_placeholders,
    placeholder,
    placeholders_in,
)

STRING_BODY = f"{STRING_CHAR}*"
_BODY_INDEX = MAX_PIECES - 1  # its placeholder; to_regex's pieces stay below RESERVED_PIECES
# Free numbers and integers (json_lex): ~30 states each in outlines-core's DFA (the 16 digit
# positions), which a schema with a few numeric properties repeats; laid in the same way. Each
# is replaced only as a whole group, `(?:TEXT)` or INTEGER (itself one group), by a group, so a
# quantifier after it still applies to all of it.
# String formats (string_formats.py, written `(?:FORMAT)`) likewise: a `uri` costs outlines-core
# ~6 ms per use, an `email` 8, a `uri-reference` 10. Longer texts are replaced first.
# A string body is replaced only where the closing quote follows it, `BODY"` (a string value or key,
# counted or not): inside a pattern's translation (`"(?:BODY(?:x)*BODY)"`) a body's rows meet the
# text around it, and one such place would send the whole regex back to outlines-core as written.
_SHARED = (  # (text in the regex, its replacement's placeholder index, the body's regex)
    (f'{STRING_BODY}"', _BODY_INDEX, STRING_BODY),
    (lex.INTEGER, MAX_PIECES - 2, lex.INTEGER),
    (f"(?:{lex.NUMBER})", MAX_PIECES - 3, lex.NUMBER),
    *((f"(?:{body})", MAX_PIECES - 4 - k, body) for k, body in enumerate(
        sorted(set(STRING_FORMATS.values()), key=lambda b: (-len(b), b)))),
)
if len(_SHARED) > RESERVED_PIECES:
    raise ImportError(f"string_bodies shares {len(_SHARED)} bodies: raise splice.RESERVED_PIECES")
_MIN_BODIES = 2  # one body alone saves less than the overlay costs
_shared_dfas: dict[str, ByteDFA] = {}


def build_with_shared_bodies(regex: str, build: Callable[[str], ByteDFA],
                             build_parent: Callable[[str], ByteDFA] | None = None) -> ByteDFA:
    """`build(regex)`, with its string bodies, free numbers and formats taken from per-process DFAs.

    `build_parent` builds the regex with placeholders (default `build`); it may leave the DFA
    unpruned (start 0, dead and unreachable states kept): the overlay prunes it anyway.

    The regex may hold splice.py's placeholders (a catalog's larger pieces): their paths stay in
    the DFA for the splice. Where a body's rows would share a byte with the rows around it (or
    with a piece's path), that body's text is written out and the rest laid in again; with fewer
    than two bodies left, it is `build(regex)`.
    The language is always `build(regex)`'s; the DFA is its minimal one, array for array, on the
    schemas the tests and benchmarks/table_guard.py check (a few hundred JSONSchemaBench regexes
    too), but not always: two copies of a free number that end alike can stay apart (a state
    more; minimising every overlay would cost what sharing numbers saves).
    """
    # (after a backslash the text would not be a group: leave it as written)
    shared = [(text, index, body) for text, index, body in _SHARED if text in regex and "\\" + text not in regex]
    if any(i >= MAX_PIECES - RESERVED_PIECES for i in placeholders_in(regex)):
        return build(regex)  # shared bodies' own placeholders already in it (to_regex never writes them)
    while sum(regex.count(text) for text, _, _ in shared) >= _MIN_BODIES:
        parent = (build_parent or build)(written_with_placeholders(regex, shared))
        bodies = {}
        for _, index, body_regex in shared:
            body = _shared_dfas.get(body_regex)
            if body is None:
                body = _shared_dfas[body_regex] = regex_to_dfa(body_regex)
            bodies[index] = body
        dfa = _overlay_or_conflicts(parent, bodies)
        if isinstance(dfa, ByteDFA):
            return dfa
        if not dfa:
            break
        # Bodies whose rows meet (an integer or a number at one place, `type: [integer, number]`)
        # are written out again; the others are still laid in (a 100-tool catalog's 124 string bodies).
        shared = [entry for entry in shared if entry[1] not in dfa]
    return build(regex)


def written_with_placeholders(regex: str, shared) -> str:
    """`regex` with each text of `shared` (entries of _SHARED) replaced by its placeholder."""
    for text, index, _ in shared:
        regex = regex.replace(text, f'{placeholder(index)}"' if index == _BODY_INDEX else f"(?:{placeholder(index)})")
    return regex


def _overlay(parent: ByteDFA, bodies: dict[int, ByteDFA]) -> ByteDFA | None:
    """`parent` with each body placeholder path s --> t replaced by a copy of its body (by
    placeholder index) leaving for t (one copy per body and t), pruned; None where the rows
    would overlap (a subset construction needed). Other placeholders (splice.py's pieces) stay
    paths for the splice."""
    out = _overlay_or_conflicts(parent, bodies)
    return out if isinstance(out, ByteDFA) else None


def _overlay_or_conflicts(parent: ByteDFA, bodies: dict[int, ByteDFA]) -> ByteDFA | set[int]:
    """_overlay's DFA, or the body indices whose placeholders cannot be laid in (empty: none can)."""
    try:
        found = find_placeholders(parent)
    except ValueError:
        return set()
    pieces = {s for s, i, _ in found if i not in bodies}  # splice.py's own placeholders stay paths
    found = [(s, i, t) for s, i, t in found if i in bodies]
    if not found:
        return set()
    sources = collections.Counter(s for s, _, _ in found)
    exits = {t for _, _, t in found}
    clash = {i for s, i, t in found if sources[s] > 1 or s in exits or s in pieces or t in pieces}
    if clash:
        return clash
    n = parent.num_states
    copies = sorted({(i, t) for _, i, t in found})
    offset_of, size = {}, n
    for key in copies:
        offset_of[key] = size
        size += bodies[key[0]].num_states
    trans = np.full((size, 256), -1, dtype=np.int32)
    trans[:n] = parent.trans
    trans[list(sources), PLACEHOLDER_LEAD] = -1
    accept = np.zeros(trans.shape[0], dtype=bool)
    accept[:n] = parent.accept
    for (i, t), offset in offset_of.items():
        body = bodies[i]
        live, final = body.trans >= 0, np.flatnonzero(body.accept)
        exit_row = parent.trans[t]
        if (live[final] & (exit_row >= 0)).any():
            return {i}
        # A final state with no byte of its own (a number's last digit) would be a copy of t's
        # row: the edges into it go to t instead, which keeps the result minimal.
        ends_here = final[(final > 0) & ~live[final].any(axis=1)]
        local = np.arange(body.num_states, dtype=np.int32) + offset
        local[ends_here] = t
        rows = trans[offset : offset + body.num_states]
        rows[live] = local[body.trans[live]]
        rows[final] = np.where(exit_row >= 0, exit_row, rows[final])  # disjoint: the exit's bytes
        accept[offset + final] = parent.accept[t]
    merged_into: dict[tuple[int, int], int] = {}
    for s, i, t in found:
        offset, own = offset_of[(i, t)], trans[s]
        if not (own >= 0).any() and not parent.accept[s]:  # s is the copy's start: one state
            if merged_into.setdefault((i, t), s) != s:
                return {i}
            continue
        first = trans[offset]
        if ((own >= 0) & (first >= 0)).any():
            return {i}
        trans[s] = np.where(own >= 0, own, first)
        accept[s] |= accept[offset]
    for (i, t), s in merged_into.items():
        offset = offset_of[(i, t)]
        trans[s] = trans[offset]
        accept[s] = accept[offset]
        block = trans[offset : offset + bodies[i].num_states]
        block[block == offset] = s
        trans[s][trans[s] == offset] = s
        for q, j, u in found:  # other sources entering this copy read its start row, now s's
            if (j, u) == (i, t) and q != s:
                trans[q][trans[q] == offset] = s
    return prune(trans, accept, 0)
