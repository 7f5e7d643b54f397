"""Random walks through a TokenTable: fuzz a grammar without a model.

`random_walk` draws tokens uniformly from what the table allows (random logits, equal weight),
keeping only tokens that the counters allow and that can still reach acceptance inside the
budget (dist[next] + need <= remaining - 1, the same rule as the mask kernel), and stops with a stop token in an accepting state. The
returned ids exclude the stop token; `decode` joins their bytes. `accepts` replays ids through
the CSR and the counters. Nothing here samples from a model or touches a device.
"""

from __future__ import annotations

import re
from fractions import Fraction

import numpy as np

from surecall.errors import RequestError
from surecall.grammars import items, stack
from surecall.grammars.schema.to_regex import pointer_join
from surecall.grammars.table import TokenTable

DEFAULT_MAX_TOKENS = 4096


def random_walk(table: TokenTable, vocab, rng: np.random.Generator, max_tokens: int | None = None) -> list[int]:
    """Token ids of one random document the table accepts, at most `max_tokens` of them.

    With max_tokens None the walk is capped at DEFAULT_MAX_TOKENS. Raises RequestError when
    the budget is below the fewest tokens any document needs (dist of the start state).
    """
    budget = DEFAULT_MAX_TOKENS if max_tokens is None else int(max_tokens)
    if budget < int(table.dist[0]):
        raise RequestError(
            f"max_tokens {budget} is below the {int(table.dist[0])} tokens the shortest document needs"
        )
    state, counter, out = 0, 0, []
    item = 0  # the item counters of a table with counted arrays (grammars/items.py: a stack)
    depth, bits = 0, 0  # the bracket stack of free-form values (grammars/stack.py)
    while True:
        remaining = budget - len(out)
        toks, nexts = table.transitions(state)
        ok, after, depths, kinds, item_after = stack.stack_step(table, state, depth, bits, toks, nexts, remaining,
                                                                item if table.has_items else None)
        left = remaining - int(stack.stack_need(depth))  # kernels.stack.stack_remaining (>= 1 while tokens are left)
        if table.has_items:
            ok &= items.kept(table, state, counter, item, toks, nexts, left)
        else:
            ok &= kept(table, state, counter, toks, nexts, left)
        num_options = int(ok.sum()) + (1 if table.accept[state] and depth == 0 else 0)
        if num_options == 0:
            raise AssertionError(f"state {state}: no token keeps the document completable (a grammar bug)")
        pick = int(rng.integers(num_options))
        if table.accept[state] and depth == 0 and pick == num_options - 1:
            return out
        i = np.flatnonzero(ok)[pick]
        out.append(int(toks[i]))
        plain = _next_item(table, state, item, int(toks[i]))
        item = item_after[i] if item_after[i] is not item else plain  # an outcome that counted separators
        counter = table.next_counter(state, counter, int(toks[i]))
        state, depth, bits = int(after[i]), int(depths[i]), int(kinds[i])


def kept(table: TokenTable, state: int, counter: int, toks: np.ndarray, nexts: np.ndarray,
         remaining: int) -> np.ndarray:
    """bool per transition of `state`: the counter bounds and the budget keep it (the kernels' rule)."""
    if not table.has_counts:
        return table.dist[nexts] <= remaining - 1
    ok = table.count_allows(state, counter, toks)
    nexts = nexts.astype(np.int64)
    lo, fill = table.count_lo[nexts].astype(np.int64), table.count_fill
    start = np.zeros(toks.shape[0], dtype=np.int64)
    if table.count_row[state] >= 0:
        v = table.count_chars[table.count_row[state], toks].astype(np.int64)
        start = np.where((v >= 0) & (v % 2 == 0), counter + v // 2, 0)
    need = np.where(table.count_row[nexts] >= 0, -(-np.maximum(lo - start, 0) // fill), 0)
    return ok & (table.dist[nexts] + need <= remaining - 1)


def decode(vocab, ids: list[int]) -> bytes:
    return b"".join(vocab.token_bytes[i] for i in ids)


def accepts(table: TokenTable, ids: list[int]) -> bool:
    """Whether the table walks `ids` from state 0 into an accepting state (CSR only)."""
    state, counter, item, depth, bits = 0, 0, 0, 0, 0
    for t in ids:
        nxt = table.next_state(state, int(t))
        if nxt is None or not table.count_allows(state, counter, np.asarray([int(t)]))[0]:
            return False
        if table.has_items and not items.item_allows(table, state, item, np.asarray([int(t)]))[0]:
            return False
        item_next = _next_item(table, state, item, int(t))
        if table.has_stack:
            got = stack.outcome(table, state, int(t), depth, bits, item if table.has_items else None)
            if got is None:
                return False
            if got[0] >= 0:  # the token has an entry: its outcome moves the row
                nxt = got[0]
            if got[3] is not item and table.has_items:  # an outcome that counted separators
                item_next = got[3]
            depth, bits = got[1], got[2]
        item = item_next
        state, counter = nxt, table.next_counter(state, counter, int(t))
    return bool(table.accept[state]) and depth == 0


def _next_item(table: TokenTable, state: int, item, token: int):
    """The row's item counters after `token` (a stack, outermost first; 0 without counted arrays)."""
    return items.next_item_counters(table, state, item, np.asarray([token]))[0] if table.has_items else 0


def schema_violations(schema, document, relaxed) -> tuple[list[str], list[str]]:
    """(unaccounted errors, errors on relaxed keywords) of `document` against `schema`.

    Uses the `jsonschema` package (a dev dependency). An error counts as relaxed when its
    keyword was listed for one of its schema locations (`error_locations`: the path the
    validator took, or the place a `$ref` on that path points to), when it is a combinator
    (anyOf/oneOf/...) whose location holds, or lies under, a relaxed keyword's location, or when
    it is an anyOf/oneOf with a branch that fails on relaxed keywords only (`_is_explained`).
    """
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    relaxed_pairs = {(str(p).rstrip("/"), str(k)) for p, k in relaxed}
    bad, soft = [], []
    try:
        errors = list(cls(schema).iter_errors(document))
    except (OverflowError, ValueError, re.error) as exc:  # 1e999 parses to inf and multipleOf cannot divide it;
        # a pattern Python's re cannot parse (\p{L}): the check cannot say either way
        return [], [f"the validator cannot evaluate this document ({type(exc).__name__}: {exc})"]
    for error in errors:
        if _is_float_artefact(error):
            continue
        shown = "/" + "/".join(str(p) for p in list(error.absolute_schema_path)[:-1])  # the validator's path
        message = f"{error.validator} at {shown}: {error.message[:200]}"
        (soft if _is_explained(schema, error, relaxed_pairs) else bad).append(message)
    return bad, soft


def _is_explained(root, error, relaxed_pairs: set, depth: int = 0) -> bool:
    """Whether `error` is due to relaxed keywords only: its keyword is relaxed where it sits, or it
    is an anyOf/oneOf that no branch matched and one branch fails on relaxed keywords alone (that
    branch's keywords may sit behind a `$ref`, far from the combinator's own location)."""
    if _is_float_artefact(error) or any(_is_relaxed(error_locations(root, error), keyword, relaxed_pairs)
                                        for keyword in _error_keywords(error)):
        return True
    if error.validator not in ("anyOf", "oneOf") or not error.context or depth >= 16:
        return False
    branches: dict[object, list] = {}
    for sub in error.context:
        branches.setdefault(sub.relative_schema_path[0] if sub.relative_schema_path else None, []).append(sub)
    return any(all(_is_explained(root, sub, relaxed_pairs, depth + 1) for sub in subs) for subs in branches.values())


def _error_keywords(error) -> tuple[str, ...]:
    """The keywords `error` may be listed under: its validator's; for a `false` subschema (no
    validator) the keyword holding it (`propertyNames: false`); min/maxContains also under
    `contains`, which the compiler lists for the count as well."""
    if error.validator is None:
        path = list(error.absolute_schema_path)
        return (str(path[-1]),) if path else ()
    keyword = str(error.validator)
    return (keyword, "contains") if keyword in ("minContains", "maxContains") else (keyword,)


def _is_float_artefact(error) -> bool:
    """A multipleOf error that jsonschema draws from float division (0.07 / 0.01 gives
    7.000000000000001) but exact arithmetic on the numbers' shortest spellings refutes."""
    value, step = error.instance, error.validator_value
    if error.validator != "multipleOf" or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in (value, step)):
        return False
    try:
        return Fraction(repr(value)) % Fraction(repr(step)) == 0
    except (ValueError, ZeroDivisionError, OverflowError):  # inf, nan
        return False


def error_locations(root, error) -> set[str]:
    """JSON pointers of the schema object that holds `error`'s keyword, one per way to spell it.

    jsonschema's `schema_path` runs through `$ref`s without naming them (draft 4 to 2020-12), so
    `/properties/x/maxLength` may live at `/definitions/s`. The compiler lists a keyword either
    where the reference points (a bare `$ref`) or under the referencing path (a `$ref` with
    siblings), so each `$ref` hop on the path adds its target as a second spelling.
    """
    path = list(error.absolute_schema_path)
    node, spellings = root, {""}
    for i, part in enumerate(path):
        for _ in range(32):  # a chain of $ref hops, bounded against reference cycles
            if not isinstance(node, dict) or part in node or not isinstance(node.get("$ref"), str):
                break
            hop = _resolve_local(root, node["$ref"])
            if hop is None:
                break
            node, target = hop
            spellings.add(target)
        if i == len(path) - 1:
            break
        node = _child(node, part)
        spellings = {pointer_join(s, part) for s in spellings}
    if node is not error.schema:  # the walk lost its way (a remote $ref, an $id): find the object itself
        spellings |= _pointers_of(root, error.schema)
    return {s.rstrip("/") for s in spellings}


def _child(node, part):
    if isinstance(node, dict):
        return node.get(part)
    if isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
        return node[part]
    return None


def _resolve_local(root, ref: str):
    """(target object, its pointer) of a local `#...` reference; None for any other."""
    from urllib.parse import unquote

    if not ref.startswith("#") or (len(ref) > 1 and not ref.startswith("#/")):
        return None
    node, parts = root, []
    for raw in ref[1:].split("/")[1:]:
        part = unquote(raw).replace("~1", "/").replace("~0", "~")
        node = _child(node, int(part) if isinstance(node, list) and part.isdigit() else part)
        if node is None:
            return None
        parts.append(part)
    return node, pointer_join("", *parts)


def _pointers_of(root, target) -> set[str]:
    """Every pointer at which the object `target` (by identity) sits inside `root`."""
    found, stack = set(), [(root, "")]
    while stack:
        node, ptr = stack.pop()
        if node is target:
            found.add(ptr)
        if isinstance(node, dict):
            stack += [(v, pointer_join(ptr, k)) for k, v in node.items() if isinstance(v, (dict, list))]
        elif isinstance(node, list):
            stack += [(v, pointer_join(ptr, i)) for i, v in enumerate(node) if isinstance(v, (dict, list))]
    return found


_COMBINATORS = ("anyOf", "oneOf", "allOf", "$ref", "not", "if", "then", "else")
_APPLICATORS = ("patternProperties", "propertyNames", "dependentSchemas", "dependencies", "contains", "not", "if",
                "unevaluatedProperties", "unevaluatedItems")


def _is_relaxed(where: set[str], keyword: str, relaxed_pairs: set) -> bool:
    """Whether an error on `keyword`, held at any pointer in `where`, is explained by a relaxed pair."""
    for ptr in where:
        # An error inside a then/else branch belongs to the `if` next to it: relaxed when that `if` is.
        for branch in ("/then", "/else"):
            if branch in ptr and _is_relaxed({ptr.rsplit(branch, 1)[0]}, "if", relaxed_pairs):
                return True
        for pointer, kw in relaxed_pairs:
            if kw == keyword and pointer == ptr:
                return True
            if kw in _APPLICATORS and _under(ptr, pointer_join(pointer, kw)):
                return True  # inside the subschemas of a relaxed applicator: nothing there is enforced
            if keyword in _COMBINATORS and (_under(pointer, ptr) or _under(ptr, pointer)):
                return True
            if keyword == "contains" and _under(pointer, pointer_join(ptr, "contains")):
                return True  # one error for the whole subschema: relaxed when a keyword inside it is
    return False


def _under(pointer: str, prefix: str) -> bool:
    return pointer == prefix or pointer.startswith(prefix + "/")
