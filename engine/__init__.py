"""surecall: constrained decoding for LLM tool calls.

Every proposed call parses by construction (grammar masks applied next to the sampler), and
every call is validated, authorized and run at most once before a tool touches anything.
The public names are imported lazily so that the ground-floor subpackages (`surecall.grammars`,
`surecall.errors`) can be used without importing torch models or the decoder.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> module that defines it (resolved on first access)
_LAZY = {
    "LLM": "surecall.llm",
    "AsyncLLM": "surecall.async_llm",
    "RequestOutput": "surecall.async_llm",
    "EngineConfig": "surecall.config",
    "SamplingParams": "surecall.config",
    "Tool": "surecall.tools",
    "ToolCall": "surecall.tools.calls",
    "Runtime": "surecall.dispatch.runtime",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'surecall' has no attribute {name!r}")
    return getattr(importlib.import_module(module_name), name)
