"""minProperties/maxProperties and propertyNames of one object, written into its regex.

`bounded_members` writes the in-order selections of an object's declared members (required
ones always, optional ones maybe) that hold low..high members, enumerated: past MAX_OPTIONAL
optional members the caller keeps the keywords relaxed. `bounded_extras` repeats one undeclared
member at most MAX_EXTRA_REPEATS times (an object with no declared member). `extra_keys` says
how an undeclared key is written under `propertyNames`: the names of an enum, or the string
schema itself when no declared name could be such a key. It does not count keys beside
patternProperties, nor bound minProperties above 1 over free keys (a duplicate key counts once).
"""

from __future__ import annotations

from collections.abc import Callable

from surecall.grammars.schema.keywords import is_undefined

MAX_OPTIONAL = 8
MAX_SELECTION_CHARS = 50_000  # an enumeration past this keeps the counts relaxed
MAX_EXTRA_REPEATS = 8
_STRING_KEYWORDS = {"type", "pattern", "minLength", "maxLength", "format", "enum", "const"}
_ANNOTATIONS = {"title", "description", "$comment", "examples", "default"}


def bounded_members(members: list[tuple[str, bool]], low: int, high: int | None, sep: str) -> str | None:
    """Regex of the members in order, comma-separated (`sep`), `low..high` of them in all (None:
    no selection has that size). `members` are (regex, is_required); at least one is written
    when low >= 1."""
    high = len(members) if high is None else high

    def rest(i: int, count: int, is_first: bool) -> str | None:
        """Members i.. after `count` written ("": none more, and that is a valid end)."""
        if i == len(members):
            return "" if count >= low else None
        regex, is_required = members[i]
        take = None
        if count < high:
            after = rest(i + 1, count + 1, False)
            if after is not None:
                take = ("" if is_first else sep) + f"(?:{regex})" + after
        if is_required:
            return take
        return _either(take, rest(i + 1, count, is_first))

    return rest(0, 0, True)


def _either(a: str | None, b: str | None) -> str | None:
    if a is None or b is None:
        return b if a is None else a
    if a == "" or b == "":
        return f"(?:{a or b})?"
    return f"(?:{a}|{b})"


def bounded_extras(extra: str, high: int, sep: str) -> str:
    """One to `high` undeclared members (the caller makes the whole run optional)."""
    return f"{extra}(?:{sep}{extra}){{0,{high - 1}}}"


def _excluded_names(names: object) -> list[str] | None:
    """The names of a propertyNames `{"not": {"enum": [...]}}` (or `const`; a string type beside
    is fine), None for any other schema."""
    if not isinstance(names, dict) or set(names) - _ANNOTATIONS - {"type"} != {"not"}:
        return None
    inner = names["not"]
    if names.get("type", "string") != "string" or not isinstance(inner, dict):
        return None
    own = set(inner) - _ANNOTATIONS
    if own == {"const"}:
        values = [inner["const"]]
    elif own == {"enum"} and isinstance(inner["enum"], list):
        values = inner["enum"]
    else:
        return None
    return [v for v in values if isinstance(v, str)]


def extra_keys(names: object, declared: list[str], is_valid: Callable[[object, str], bool | None]) -> object:
    """How an undeclared key is written under propertyNames `names`: True (any key: `names`
    asserts nothing), ("not_in", names) (a `not` of an enum: any key but those), a list of
    literal names (an enum, less the declared ones), a string schema
    (no declared name satisfies it, so no extra key can repeat one), or None (not written
    exactly: the keyword stays relaxed). `is_valid(schema, name)` checks one name (None: cannot tell)."""
    names = {k: v for k, v in names.items() if not is_undefined(k)} if isinstance(names, dict) else names
    if names is True or (isinstance(names, dict) and not set(names) - _ANNOTATIONS):
        return True
    excluded = _excluded_names(names)
    if excluded is not None:
        return ("not_in", excluded)
    if not isinstance(names, dict) or set(names) - _STRING_KEYWORDS - _ANNOTATIONS:
        return None
    if names.get("type", "string") != "string":
        return None
    if "enum" in names or "const" in names:
        values = names["enum"] if "enum" in names else [names["const"]]
        return [v for v in values if isinstance(v, str) and v not in declared and is_valid(names, v) is True]
    if all(is_valid(names, name) is False for name in declared):
        return {**names, "type": "string"}
    return None
