"""The coding catalog publishes exactly the seed schemas, from typed pydantic models, with levels."""

from __future__ import annotations

import pytest

from surecall.errors import PathOutsideWorkspace, ToolError
from surecall.toolbox.bash import BashExecuteArgs
from surecall.toolbox.catalog import LEVELS, coding_tools, exec_directory, published_schema
from surecall.toolbox.files import FileEditArgs, FileViewArgs
from surecall.toolbox.search import GrepSearchArgs
from surecall.tools import SideEffect
from surecall.tools.catalog import hardened_seed_tools as seed_tools

MODELS = {"bash_execute": BashExecuteArgs, "file_view": FileViewArgs, "file_edit": FileEditArgs, "grep_search": GrepSearchArgs}


def _without_titles(node):
    if isinstance(node, dict):
        return {k: _without_titles(v) for k, v in node.items() if k != "title"}
    return node


@pytest.mark.parametrize("seed", seed_tools(), ids=lambda s: s["name"])
def test_pydantic_models_export_the_seed_schemas(seed):
    exported = _without_titles(MODELS[seed["name"]].model_json_schema())
    assert exported == seed["parameters"]
    assert published_schema(MODELS[seed["name"]]) == seed["parameters"]


def test_coding_tools_descriptors_equal_the_seed(tmp_path):
    tools = coding_tools(tmp_path)
    assert [t.descriptor() for t in tools] == seed_tools()
    assert {t.name: t.level for t in tools} == LEVELS
    assert LEVELS == {"bash_execute": SideEffect.A3, "file_view": SideEffect.A0,
                      "file_edit": SideEffect.A2, "grep_search": SideEffect.A0}
    assert [t.name for t in tools if t.probe is not None] == ["file_edit"]


@pytest.mark.parametrize("model", MODELS.values(), ids=list(MODELS))
def test_models_forbid_extra_fields(model):
    with pytest.raises(ValueError, match="Extra inputs are not permitted"):
        model.model_validate({"path": "a", "pattern": "a", "command": "a", "old_str": "a", "new_str": "b", "bogus": 1})


def test_missing_workspace_is_refused(tmp_path):
    with pytest.raises(ToolError, match="is not a directory"):
        coding_tools(tmp_path / "missing")


def test_exec_directory_follows_the_capability(tmp_path):
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    assert exec_directory(ws, (str(tmp_path),)) == ws
    assert exec_directory(ws, (str(ws / "sub"),)) == ws / "sub"
    with pytest.raises(PathOutsideWorkspace, match="names no directory in the workspace"):
        exec_directory(ws, (str(tmp_path / "elsewhere"), "db:prod"))
