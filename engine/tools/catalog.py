"""The seed's tool catalogs as data (`tools/data/*.json`), by name.

- `seed`: Listing 5 of the seed appendix (`shared/seeds/000_22f89e5b96841133.txt`), exactly: the
  four-tool coding catalog. It breaks the seed's own rule 3 in places (`path`, `old_str`, `glob`
  are unbounded; `surecall lint` says so).
- `seed-reference-edit`: Listing 1, the reference `file_edit` (with `allow_multiple` and the path
  `pattern`), verbatim.
- `seed-hardened`: our variant of Listing 5 with every string bounded, relative paths, optional
  `offset`/`limit`, and Listing 1's `allow_multiple`. It is what `surecall.toolbox` publishes and what
  the shipped model surecall-tiny was trained on; never substituted for the original.
Each call returns a fresh copy. It does not build `Tool`s (`surecall.tools.normalise`).
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

CATALOGS = {
    "seed": "seed_listing5.json",
    "seed-hardened": "seed_hardened.json",
    "seed-reference-edit": "seed_listing1_file_edit.json",
}


@cache
def _load(file_name: str) -> str:
    return resources.files("surecall.tools").joinpath("data", file_name).read_text(encoding="utf-8")


def catalog_tools(name: str) -> list[dict]:
    """A fresh copy of the named catalog's tool definitions [{name, description, parameters}]."""
    if name not in CATALOGS:
        raise KeyError(f"unknown catalog {name!r}; expected one of {sorted(CATALOGS)}")
    data = json.loads(_load(CATALOGS[name]))
    return data if isinstance(data, list) else [data]


def seed_tools() -> list[dict]:
    """Listing 5 exactly: the four tools bash_execute, file_view, file_edit, grep_search."""
    return catalog_tools("seed")


def reference_file_edit() -> dict:
    """Listing 1 verbatim: the reference exact-replacement `file_edit` definition."""
    return catalog_tools("seed-reference-edit")[0]


def hardened_seed_tools() -> list[dict]:
    """Our bounded variant of Listing 5 (what `surecall.toolbox.coding_tools` publishes)."""
    return catalog_tools("seed-hardened")
