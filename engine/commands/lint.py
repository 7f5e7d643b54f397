"""`surecall lint FILE...`: lint tool schemas against the five rules and the anti-pattern table.

A FILE is a JSON Schema, a JSON list (or JSONL) of tools ({name, parameters} / OpenAI /
MCP {name, inputSchema}), an MCP `tools/list` result ({"tools": [...]}), a python
`module:attr` naming a Tool, a pydantic model, a dict or a list of them, or `seed` (the
built-in catalog); files are read through `surecall.commands.resolve`. Prints findings
(human or --json) and exits 1 when there are findings, 0 when clean, 2 on unreadable input.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from surecall.commands import resolve
from surecall.errors import ToolDefinitionError
from surecall.grammars.tool_shape import is_tool_dict, looks_like_schema, tool_fields
from surecall.tools.lint import RULES, Finding, count_by_rule, lint_schema
from surecall.tools.normalise import normalise_tool


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="schema / tools JSON / JSONL / MCP tool list / module:attr / seed")
    parser.add_argument("--json", action="store_true", help="one JSON object: findings, counts per rule, tools linted")
    parser.add_argument("--rules", default="", help="comma-separated rule ids to keep (default: all)")
    parser.add_argument("--summary", action="store_true", help="print only the counts per rule")


def run(args: argparse.Namespace) -> int:
    keep = {r.strip().upper() for r in args.rules.split(",") if r.strip()}
    unknown = keep - set(RULES)
    if unknown:
        raise ToolDefinitionError(f"unknown rule id(s) {sorted(unknown)}; expected some of {list(RULES)}")
    findings: list[tuple[str, Finding]] = []
    num_tools = 0
    for source in args.files:
        for where, name, schema in load_tool_entries(source):
            num_tools += 1
            findings += [(where, f) for f in lint_schema(schema, name) if not keep or f.rule in keep]
    counts = count_by_rule(f for _, f in findings)
    if args.json:
        print(json.dumps({"tools": num_tools, "counts": counts,
                          "findings": [] if args.summary else [{"file": s, **f.to_dict()} for s, f in findings]}))
    else:
        _print_human(findings, counts, num_tools, args.summary)
    return 1 if findings else 0


def _print_human(findings: list[tuple[str, Finding]], counts: dict[str, int], num_tools: int, summary_only: bool) -> None:
    if not summary_only:
        for source, f in findings:
            print(f"{source}: {f.tool or '<schema>'}: {f.rule} {f.slug} at {f.pointer or '/'}: {f.message}")
            print(f"    fix: {f.fix}")
    print(f"{sum(counts.values())} finding(s) in {num_tools} tool(s)")
    for rule, n in counts.items():
        if n:
            print(f"  {rule:<4} {RULES[rule][0]:<22} {n}")


def load_tool_schemas(source: str) -> list[tuple[str | None, Any]]:
    """(tool name or None, input schema) for every tool in `source` (see the module docstring)."""
    return [(name, schema) for _, name, schema in load_tool_entries(source)]


def load_tool_entries(source: str) -> list[tuple[str, str | None, Any]]:
    """(where: `file:line` or `file[i]`, tool name or None, input schema) for every tool in `source`."""
    from surecall.tools.catalog import CATALOGS

    if source in CATALOGS or resolve.is_python_spec(source):
        objects = resolve.load_tools(source) if source in CATALOGS else resolve.python_objects(source)
        entries = [_entry(item, f"{source}[{i}]") for i, item in enumerate(objects)]
    else:
        _, records = resolve.read_json_input(source, ToolDefinitionError)
        entries = [entry for where, value in records for entry in _entries(value, where)]
    if not entries:
        raise ToolDefinitionError(f"{source}: holds no tool definitions or schemas")
    return entries


def _entries(data: Any, source: str) -> list[tuple[str, str | None, Any]]:
    if isinstance(data, dict) and isinstance(data.get("tools"), list):  # MCP tools/list result
        data = data["tools"]
    if isinstance(data, list):
        return [_entry(item, f"{source}[{i}]") for i, item in enumerate(data)]
    if isinstance(data, dict):
        return [_entry(data, source)]
    raise ToolDefinitionError(f"{source}: expected a schema, a tool or a list of tools, got {type(data).__name__}")


def _entry(item: Any, where: str) -> tuple[str, str | None, Any]:
    """One tool definition (any shape `surecall.tools` reads) or a bare object schema."""
    if isinstance(item, dict) and not is_tool_dict(item):
        if not looks_like_schema(item):
            raise ToolDefinitionError(
                f"{where}: not a tool definition or a JSON Schema (keys {sorted(item)[:6]}); "
                "expected {name, parameters}, an OpenAI/MCP tool, or a schema with type/properties")
        return where, None, item  # a bare schema: lint it as is, without a tool name
    if isinstance(item, dict):  # read the shape only: lint reports a broken schema, it does not refuse it
        fields = tool_fields(item, where)
        return where, fields.name, fields.schema
    tool = normalise_tool(item, where=where)
    return where, tool.name, tool.input_schema

