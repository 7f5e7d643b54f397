"""surecall.tools: what a tool is.

`Tool` and its side-effect levels (`SideEffect` A0..A3), the one normaliser from every accepted
shape (`normalise_tool`, `normalise_tools`), loading definitions from files (`load_tools`), the
seed's catalogs (`seed_tools`, `hardened_seed_tools`, `reference_file_edit`) and schema lint
(`surecall.tools.lint`). It does not validate arguments or run tools (`surecall.dispatch`,
`surecall.toolbox`).
"""

from surecall.tools.catalog import hardened_seed_tools, reference_file_edit, seed_tools
from surecall.tools.loading import load_tool_dicts, load_tools, read_json_records
from surecall.tools.normalise import normalise_tool, normalise_tools
from surecall.tools.tool import Compensator, Probe, SideEffect, Tool

__all__ = [
    "Tool", "SideEffect", "Compensator", "Probe", "normalise_tool", "normalise_tools", "load_tools",
    "load_tool_dicts", "read_json_records", "seed_tools", "hardened_seed_tools", "reference_file_edit",
]
