"""The seed's catalogs: Listing 5 exactly, Listing 1 verbatim, the hardened variant beside them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from surecall.tools import (
    hardened_seed_tools,
    load_tools,
    normalise_tools,
    reference_file_edit,
    seed_tools,
)
from surecall.tools.lint import lint_schema

SEED = Path(__file__).resolve().parents[3] / "shared" / "seeds" / "000_22f89e5b96841133.txt"


def _listing(number: int):
    if not SEED.is_file():
        pytest.skip(f"seed appendix not found at {SEED}")
    text = SEED.read_text(encoding="utf-8")
    match = re.search(rf"列表\s*{number}\s*:", text)
    start = text.index("{", match.end())
    return json.JSONDecoder().raw_decode(text[start:])[0]


def test_seed_catalog_is_listing_5_exactly():
    assert seed_tools() == _listing(5)["tools"]
    file_view = next(t for t in seed_tools() if t["name"] == "file_view")
    assert file_view["parameters"]["required"] == ["path", "offset", "limit"]


def test_reference_file_edit_is_listing_1_verbatim():
    ref = reference_file_edit()
    assert ref == _listing(1)
    assert "allow_multiple" in ref["parameters"]["properties"]
    assert ref["parameters"]["properties"]["path"]["pattern"].startswith("^/")


def test_lint_reports_the_seeds_own_unbounded_strings():
    unbounded = {(t["name"], f.pointer) for t in seed_tools() for f in lint_schema(t["parameters"], t["name"])
                 if f.rule == "AP2"}
    assert {("file_view", "/properties/path"), ("file_edit", "/properties/old_str"),
            ("grep_search", "/properties/glob")} <= unbounded
    assert not [f for t in hardened_seed_tools() for f in lint_schema(t["parameters"], t["name"]) if f.rule == "AP2"]


def test_catalogs_by_name_and_distinct():
    assert [t.name for t in load_tools("seed")] == ["bash_execute", "file_view", "file_edit", "grep_search"]
    assert [t.name for t in load_tools("seed-hardened")] == [t.name for t in load_tools("seed")]
    assert hardened_seed_tools() != seed_tools()
    copy = seed_tools()
    copy[0]["name"] = "changed"
    assert seed_tools()[0]["name"] == "bash_execute"  # a fresh copy every call


def test_normalise_tools_every_shape():
    from pydantic import BaseModel

    from surecall.tools import Tool

    class GetWeather(BaseModel):
        """Weather for a city."""
        city: str

    shapes = [
        GetWeather,
        {"type": "object", "title": "Lookup Order", "properties": {"id": {"type": "integer"}}},
        Tool.from_schema("bare", {"type": "object"}),
        {"name": "mcp_tool", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}},
        {"type": "function", "function": {"name": "oa", "parameters": {"type": "object"}}, "strict": True},
    ]
    tools = normalise_tools(shapes)
    assert [t.name for t in tools] == ["get_weather", "Lookup_Order", "bare", "mcp_tool", "oa"]
    assert tools[0].description == "Weather for a city."
    assert tools[3].level.name == "A0" and tools[4].level.name == "A3"
    assert tools[4].annotations["strict"] is True
    with pytest.raises(Exception, match=r"tools\[1\]: duplicate tool name 'a'"):
        normalise_tools([{"name": "a"}, {"name": "a"}])
    with pytest.raises(Exception, match="pass the class"):
        normalise_tools([GetWeather(city="x")])
