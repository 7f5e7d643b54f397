"""The undeclared keys of an object with `patternProperties`, split by the patterns they match.

A key that is not declared takes the schema of every pattern that finds it (all of them at
once) or, when it matches none, `additionalProperties`. `key_atoms` partitions the undeclared
keys into atoms no pattern tells apart (schema/object_exists.py's `_atoms`, one string
automaton over code points, schema/string_automaton.py) and writes each atom's keys as a
quoted JSON string regex, so the converter can give each atom the allOf of its patterns'
schemas: two patterns that meet, or a pattern that finds a declared name, are then enforced
exactly instead of listed as relaxed. A key a pattern may or may not match (a pattern whose
translation is approximate) lies in no atom: it is never written (stricter, never looser).
Duplicate keys among the undeclared ones are not told apart (as for the converter's extra keys).
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache

from surecall.grammars.schema import json_lex as lex
from surecall.grammars.schema.object_exists import MAX_ATOMS, NotExact, Term, _atoms
from surecall.grammars.schema.pattern import _outside_classes, _split_alternatives
from surecall.grammars.schema.string_automaton import RegularUnsupported, StringAutomaton

MAX_PATTERNS = 8  # patterns split together (atoms: at most MAX_ATOMS, object_exists.py)


class KeysNotWritten(Exception):
    """The undeclared keys are not split here (the message says why); the converter relaxes."""


@dataclass(frozen=True)
class KeyAtom:
    key: str  # regex of the quoted JSON key, e.g. '"(?:x-[a-z]*)"'
    patterns: frozenset[int]  # indices of the patterns every key of the atom matches (empty: none)


@dataclass(frozen=True)
class KeyAtoms:
    atoms: tuple[KeyAtom, ...]
    is_exact: bool  # False: some key a pattern may match was left out (narrowed)


def key_atoms(patterns: tuple[str, ...], declared: tuple[str, ...], with_rest: bool,
              deadline: float | None = None, names: object = None) -> KeyAtoms:
    """The atoms of the keys none of `declared`, by the `patterns` they match; the atom matching
    no pattern only `with_rest` (additionalProperties writes it); with `names` (propertyNames as
    a string expression, schema/regular.py) only keys in it. KeysNotWritten past the caps."""
    if len(patterns) > MAX_PATTERNS:
        raise KeysNotWritten(f"more than {MAX_PATTERNS} patterns")
    key = (patterns, declared, with_rest, None if names is None else json.dumps(names, default=str))
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    found = _key_atoms(patterns, declared, with_rest, deadline, names)
    _CACHE[key] = found
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return found


# A $ref's object is converted once per context: its key split recurs (failures are not kept:
# one may be a deadline).
_CACHE: OrderedDict[tuple, KeyAtoms] = OrderedDict()
_CACHE_SIZE = 1024


def _key_atoms(patterns: tuple[str, ...], declared: tuple[str, ...], with_rest: bool,
               deadline: float | None, names: object) -> KeyAtoms:
    classes = [pattern_class(p) for p in patterns]
    rules: list = [(cls, True) for cls in classes]
    if declared:
        rules.append((("lit", declared), False))
    if names is not None:
        rules.append((("not", names), False))
    if not with_rest:
        rules.append((("not", ("any", classes)), False))
    try:
        automaton = StringAutomaton(("any", [cls for cls, _ in rules]), deadline)
        atoms = []
        for dfa, inside in _atoms(automaton, Term(rules=rules)):
            body = automaton.emit(dfa) if inside or names is not None else _emitted(automaton, dfa, patterns, declared)
            if body is not None:
                atoms.append(KeyAtom(f'"(?:{body})"', frozenset(i for i in inside if i < len(patterns))))
    except (NotExact, RegularUnsupported) as exc:
        raise KeysNotWritten(f"the keys are not split by pattern: {exc}") from exc
    if len(atoms) > MAX_ATOMS:
        raise KeysNotWritten(f"the keys split into more than {MAX_ATOMS} classes")
    exact = all(tree_exact for _, tree_exact in automaton.patterns.values())
    return KeyAtoms(tuple(atoms), exact)


def _emitted(automaton: StringAutomaton, dfa, patterns: tuple[str, ...], declared: tuple[str, ...]) -> str | None:
    """The body of the keys no pattern finds: by state elimination, or, where that regex is too
    long (the complement of many declared names) and every pattern is a literal prefix
    (`^x-`), as the complement over one trie of the names and the prefixes."""
    try:
        return automaton.emit(dfa)
    except RegularUnsupported:
        prefixes = [_literal_prefix(p) for p in patterns]
        if None in prefixes:
            raise
        return string_not_in(declared, tuple(prefixes))


_LITERAL_PREFIX = re.compile(r"\^([^\\.^$|?*+()\[\]{}]*)")


def _literal_prefix(pattern: str) -> str | None:
    """The literal a pattern `^literal` finds at the start of a key (None: another pattern)."""
    found = _LITERAL_PREFIX.fullmatch(pattern)
    return None if found is None else found.group(1)


def pattern_class(pattern: str) -> tuple:
    """A pattern as a string expression (schema/regular.py's); a leading negative lookahead
    `^(?!A)B` as the keys with no prefix in A that `^B` finds (the lookahead is the only one
    and A holds none), which string_automaton's parser does not read itself. A branch of A
    that ends in `$` excludes that whole key rather than a prefix (`^(?!(and|or)$)[a-z]+$`:
    ansible-lint's names other than its keywords)."""
    if not pattern.startswith("^(?!"):
        return ("pat", pattern)
    # the `)` closing the group opened at index 1: the first one back at depth 0
    close = next((i for i, c, depth in _outside_classes(pattern) if c == ")" and depth == 0), None)
    if close is None:
        return ("pat", pattern)
    ahead, rest = pattern[4:close], pattern[close + 1:]
    if (_LOOKAROUND.search(ahead) or "(?" in rest
            or any(c == "|" and depth == 0 for _, c, depth in _outside_classes(rest))):
        return ("pat", pattern)
    excluded = [("pat", f"^(?:{branch[:-1]})$" if _ends_anchored(branch) else f"^(?:{branch})")
                for branch in _split_alternatives(ahead)]
    return ("all", [("not", excluded[0] if len(excluded) == 1 else ("any", excluded)), ("pat", "^" + rest)])


_LOOKAROUND = re.compile(r"\(\?(?!:)")  # a group that is not a plain `(?:`


def _ends_anchored(branch: str) -> bool:
    """Whether `branch` ends in an unescaped `$`."""
    return branch.endswith("$") and (len(branch) - 1 - len(branch[:-1].rstrip("\\"))) % 2 == 0


_PLAIN_CHARS = lex.subtract(lex.ALL_CHARS, [(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)])
_BLOCKED = "**"  # a trie mark (a key character is one long, the end mark "" none): every string from this node on is excluded


@lru_cache(maxsize=4096)  # a $ref's object is converted once per context: its key set recurs
def string_not_in(names: tuple[str, ...], prefixes: tuple[str, ...] = ()) -> str:
    """String body whose value is none of `names` and starts with none of `prefixes`: a
    complement over their trie.

    Factored so that the free tail and the large character class are written once, not at every
    trie node (12 names of 321 characters wrote 27.7k regex characters, and a few such keys
    passed outlines-core's NFA size limit: "error building NFA"). A string that is not excluded
    stops at a trie node no name ends at (`stop`), or leaves the trie at some node by a character
    that is not a child there: one of the few characters the names use or any ASCII one (`local`,
    a small class per node), or one of the others, which no node has as a child (`prefix`, any
    node's path, then that one shared class, or an escape of such a character: `_escape_off_trie`),
    and then runs free, escapes included. Along the trie characters are literal, so an escape
    never spells a name (`"\\u0061"` is not the name `a`: stricter, never looser)."""
    if not names and not prefixes:
        return _FREE_TAIL
    trie: dict = {}
    for word, mark in [*((n, "") for n in names), *((p, _BLOCKED) for p in prefixes)]:
        node = trie
        for ch in word:
            node = node.setdefault(ch, {})
        node[mark] = {}
    used_chars = {c for w in (*names, *prefixes) for c in w}
    used = lex.normalize([(ord(c), ord(c)) for c in used_chars])
    local = lex.subtract(_PLAIN_CHARS, lex.subtract(_PLAIN_CHARS, lex.normalize([(0, 0x7F), *used])))
    shared = lex.char_set_regex(lex.subtract(_PLAIN_CHARS, local))
    off_trie = "|".join(part for part in (shared, _escape_off_trie(used_chars)) if part)
    stop, leave, prefix = _trie_parts(trie, local)
    tail = _FREE_TAIL
    branches = [stop, None if leave is None else f"(?:{leave}){tail}",
                None if prefix is None or not off_trie else f"(?:{prefix})(?:{off_trie}){tail}"]
    alive = [b for b in branches if b is not None]
    return "(?:" + "|".join(f"(?:{b})" if b else "" for b in alive) + ")" if alive else "(?!)"


# Any string body, spelled apart from string_bodies.STRING_BODY (`STRING_CHAR*`) so that it is built
# inline: the overlay of shared bodies copies a body per use, and the key alternatives of an open
# object (one after each declared property) would leave as many equivalent copies unmerged.
_FREE_TAIL = f"(?:{lex.STRING_CHAR})*"
_SHORT_ESCAPED = {'"': '"', "\\": "\\", "/": "/", "\b": "b", "\f": "f", "\n": "n", "\r": "r", "\t": "t"}
_NON_ASCII_ESCAPE = (r"u(?:00[89a-fA-F][0-9a-fA-F]|0[1-9a-fA-F][0-9a-fA-F]{2}|[1-9a-cA-CefEF][0-9a-fA-F]{3}"
                     r"|[dD][0-7][0-9a-fA-F]{2}|[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2})")


def _escape_off_trie(used: set[str]) -> str | None:
    """One JSON escape whose character no name uses (so it is a child of no trie node): the short
    escapes of unused characters, and `\\u` escapes of non-ASCII ones when every name is ASCII."""
    short = "".join(re.escape(letter) for ch, letter in _SHORT_ESCAPED.items() if ch not in used)
    parts = [f"[{short}]" if short else None, _NON_ASCII_ESCAPE if all(ord(c) < 0x80 for c in used) else None]
    alive = [p for p in parts if p]
    return None if not alive else "\\\\(?:" + "|".join(alive) + ")"


_FLAT_RUN = 24  # trie links written flat (one alternative per node) before a nested group


def _trie_parts(node: dict, local: list[tuple[int, int]]) -> tuple[str | None, str | None, str | None]:
    """(stop, leave, prefix) regexes of the paths from `node` on (None: none): ending at a node no
    name ends at; then one `local` character that is not a child there; any node's path. A
    blocked node (a prefix) has none of them.

    A run of single-child nodes is written as flat alternatives (`|a|ab|abc`), nesting a group
    only where the trie branches or every _FLAT_RUN links: one group per character passed the
    regex parser's nesting limit on a 69-character property name."""
    if _BLOCKED in node:
        return None, None, None
    stop: list[str] = []
    leave: list[str] = []
    prefix: list[str] = []
    path, cur = "", node
    for step in range(_FLAT_RUN):
        if _BLOCKED in cur:
            break
        children = [c for c in cur if len(c) == 1]
        if "" not in cur:
            stop.append(path)
        other = lex.char_set_regex(lex.subtract(local, [(ord(c), ord(c)) for c in children]))
        if other is not None:
            leave.append(path + other)
        prefix.append(path)
        if len(children) != 1 or step == _FLAT_RUN - 1:
            for ch in children:
                below = _trie_parts(cur[ch], local)
                for parts, part in zip((stop, leave, prefix), below, strict=True):
                    if part is not None:
                        parts.append(f"{path}{lex.escape_literal(ch)}(?:{part})")
            break
        path += lex.escape_literal(children[0])
        cur = cur[children[0]]
    return _alternatives(stop), _alternatives(leave), _alternatives(prefix)


def _alternatives(parts: list[str | None]) -> str | None:
    alive = [p for p in parts if p is not None]
    if not alive:
        return None
    return alive[0] if len(alive) == 1 else "|".join(f"(?:{p})" if p else "" for p in alive)
