"""surecall.toolbox: the four coding tools (shell, file view, file edit, search) and their sandbox.

`catalog.coding_tools(workspace)` returns them as `surecall.tools.Tool`s for
`surecall.dispatch.runtime.Runtime`. Modules: `paths` (workspace containment), `sandbox`
(bubblewrap + limits), `bash`, `files` (file_view, file_edit and its probe), `search`
(grep_search), `result` (ToolResult, Plan). Nothing here checks capabilities: the runtime does.
"""
