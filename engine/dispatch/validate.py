"""Argument validation: JSON Schema (jsonschema-rs) plus the limits canonical JSON needs.

`validate_arguments(tool_or_schema, args)` raises one `ArgumentValidationError` listing every
failure as (JSON pointer, message). Before the schema runs, the arguments are checked for what
RFC 8785 cannot canonicalise (integers beyond 2^53, non-finite floats, lone surrogates, non-JSON
types) and for size, so the idempotency key derived afterwards is always defined.
Each schema is validated under the draft its `$schema` names (draft 4, 6, 7, 2019-09, 2020-12;
2020-12 when absent), the same draft the grammar compiler reads it with. Compiled validators are
cached by the schema's canonical text. Formats are not asserted (an annotation by default).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import jsonschema_rs

from surecall.errors import ArgumentValidationError, SchemaError
from surecall.grammars.schema.meta import checked_schema

MAX_ARGUMENT_BYTES = 1 << 20  # 1 MiB of JSON text per call
MAX_DEPTH = 64
MAX_SAFE_INTEGER = (1 << 53) - 1  # beyond this RFC 8785 (I-JSON numbers are IEEE doubles) is undefined


def validate_arguments(tool_or_schema: Any, args: Any, *, max_bytes: int = MAX_ARGUMENT_BYTES) -> None:
    """Raise ArgumentValidationError (every failure, each with its JSON pointer) unless `args`
    is a JSON object that RFC 8785 can canonicalise, at most `max_bytes` long, and valid
    against the tool's input schema. `tool_or_schema`: a `Tool` (its `input_schema`) or a dict."""
    name, schema = _schema_of(tool_or_schema)
    where = f" for tool {name!r}" if name else ""
    if not isinstance(args, Mapping):
        raise ArgumentValidationError(f"Invalid arguments{where}: expected a JSON object, got {type(args).__name__}", [("", "not an object")])
    problems, size = _scan(args, "", 0)
    if problems:
        raise ArgumentValidationError(_summary(f"Invalid arguments{where}", problems), problems)
    if size > max_bytes:
        raise ArgumentValidationError(
            f"Invalid arguments{where}: about {size} bytes of JSON, more than the limit of {max_bytes} bytes",
            [("", f"oversized: {size} > {max_bytes} bytes")],
        )
    validator = compiled_validator(schema)
    if validator.is_valid(args):  # the fast path; iter_errors only to explain a failure
        return
    failures = [(_pointer(err.instance_path), err.message) for err in validator.iter_errors(args)]
    raise ArgumentValidationError(_summary(f"Invalid arguments{where}", failures), failures)


def validate_document(schema: dict, value: Any) -> str | None:
    """Why `value` (any JSON value: a `response_format` answer, not only an object) breaks `schema`, or None."""
    validator = compiled_validator(schema)
    if validator.is_valid(value):
        return None
    failures = [(_pointer(err.instance_path), err.message) for err in validator.iter_errors(value)]
    return _summary("Invalid document", failures)


def compiled_validator(schema: dict) -> jsonschema_rs.Validator:
    """The cached validator of `schema` (its `$schema` draft); SchemaError if the schema itself is malformed.
    A schema object is treated as immutable once validated against (a `Tool` copies its schema
    at construction): the fast path looks it up by identity, the slow path by canonical text."""
    hit = _BY_ID.get(id(schema))
    if hit is not None and hit[0] is schema:
        return hit[1]
    try:
        text = json.dumps(schema, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise SchemaError(f"Invalid schema: not JSON-serialisable ({exc})") from exc
    validator = _compile(text)
    if len(_BY_ID) >= _MAX_BY_ID:
        _BY_ID.clear()
    _BY_ID[id(schema)] = (schema, validator)  # holding the schema keeps its id from being reused
    return validator


_BY_ID: dict[int, tuple[dict, jsonschema_rs.Validator]] = {}
_MAX_BY_ID = 1024


@lru_cache(maxsize=1024)
def _compile(schema_text: str) -> jsonschema_rs.Validator:
    return make_validator(json.loads(schema_text))


def make_validator(schema: Any, *, registry: jsonschema_rs.Registry | None = None, validate_formats: bool = False) -> jsonschema_rs.Validator:
    """Check `schema` against its draft's metaschema, then compile it for that draft (2020-12 when
    `$schema` is absent). Remote `$ref`s resolve only through `registry`: the validator never
    fetches anything over the network."""
    try:  # a pattern in ECMA-262 Annex B syntax (`{{.+}}`) comes back escaped, as jsonschema-rs reads it
        schema = checked_schema(schema, registry, what="Invalid schema")
    except SchemaError:
        raise
    except Exception as exc:  # an unknown $schema, an unresolvable metaschema, a non-JSON value
        raise SchemaError(f"Invalid schema: {exc}") from exc
    try:
        cls = jsonschema_rs.validator_cls_for(schema) if isinstance(schema, dict) else jsonschema_rs.Draft202012Validator
        return cls(schema, registry=registry, validate_formats=validate_formats, offline=True)
    except Exception as exc:  # an unresolvable $ref, ... (jsonschema-rs's text runs over several lines)
        raise SchemaError(f"Invalid schema: {str(exc).strip().splitlines()[0]}") from exc


def check_canonicalisable(value: Any) -> list[tuple[str, str]]:
    """(pointer, problem) for every value RFC 8785 cannot canonicalise; [] when all is well."""
    return _scan(value, "", 0)[0]


def _scan(value: Any, pointer: str, depth: int) -> tuple[list[tuple[str, str]], int]:
    """(problems, size): size is the UTF-8 length of the compact JSON text, escapes not counted."""
    if depth > MAX_DEPTH:
        return [(pointer, f"nested deeper than {MAX_DEPTH} levels")], 0
    if isinstance(value, str):
        try:
            return [], len(value.encode("utf-8")) + 2
        except UnicodeEncodeError:
            return [(pointer, "string holds a lone surrogate; RFC 8785 needs valid Unicode")], len(value)
    if value is None or isinstance(value, bool):
        return [], 5
    if isinstance(value, int):
        if abs(value) > MAX_SAFE_INTEGER:
            return [(pointer, f"integer {value} is beyond 2^53-1; RFC 8785 cannot canonicalise it (send it as a string)")], 20
        return [], 20
    if isinstance(value, float):
        return ([], 24) if math.isfinite(value) else ([(pointer, f"{value} is not a finite number")], 24)
    if isinstance(value, Mapping):
        return _scan_object(value, pointer, depth)
    if isinstance(value, (list, tuple)):
        problems, size = [], 2
        for i, item in enumerate(value):
            p, n = _scan(item, f"{pointer}/{i}", depth + 1)
            problems += p
            size += n + 1
        return problems, size
    return [(pointer, f"{type(value).__name__} is not a JSON value")], 0


def _scan_object(value: Mapping, pointer: str, depth: int) -> tuple[list[tuple[str, str]], int]:
    problems, size = [], 2
    for key, item in value.items():
        child = f"{pointer}/{_escape(str(key))}"
        if not isinstance(key, str):
            problems.append((child, f"object key {key!r} is not a string"))
        elif _has_lone_surrogate(key):
            problems.append((child, "object key holds a lone surrogate; RFC 8785 needs valid Unicode"))
        p, n = _scan(item, child, depth + 1)
        problems += p
        size += n + len(str(key)) + 4
    return problems, size


def _has_lone_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _schema_of(tool_or_schema: Any) -> tuple[str | None, dict]:
    schema = getattr(tool_or_schema, "input_schema", tool_or_schema)
    if not isinstance(schema, dict):
        raise SchemaError(f"Invalid schema: expected a Tool or a JSON object, got {type(tool_or_schema).__name__}")
    return getattr(tool_or_schema, "name", None), schema


def _pointer(path: Any) -> str:
    return "".join(f"/{_escape(str(part))}" for part in path)


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _summary(prefix: str, failures: list[tuple[str, str]]) -> str:
    shown = "; ".join(f"{p or '/'}: {m}" for p, m in failures[:5])
    more = f" (+{len(failures) - 5} more)" if len(failures) > 5 else ""
    return f"{prefix}: {len(failures)} failure(s): {shown}{more}"
