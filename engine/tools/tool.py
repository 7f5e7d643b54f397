"""What a tool is: `Tool` (name, description, input schema) and its side-effect level A0..A3.

A `Tool` carries the name, the description and the input schema that is published to the model
(`descriptor()`) and that validates the model's arguments (the very same dict), plus a
side-effect level A0..A3 that the dispatch layer turns into policy: A2 needs an idempotency key,
A3 needs approval (the capability right `approve:<tool>`) and may carry a compensator.
It does not validate arguments, authorize or execute anything: see `surecall.dispatch`.
"""

from __future__ import annotations

import copy
import enum
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from surecall.errors import ToolDefinitionError


class SideEffect(enum.IntEnum):
    """What a call may do to the world, from harmless (A0) to destructive (A3)."""

    A0 = 0  # read-only: may run any number of times, needs no record
    A1 = 1  # idempotent write: running twice equals running once
    A2 = 2  # non-idempotent write: an idempotency key is required
    A3 = 3  # destructive: approval required (right `approve:<tool>`), compensator where one exists

    @property
    def requires_idempotency_key(self) -> bool:
        """A2 and A3 calls claim a key before they run, so a replay never runs them twice."""
        return self >= SideEffect.A2

    @property
    def requires_approval(self) -> bool:
        return self is SideEffect.A3

    @classmethod
    def parse(cls, value: SideEffect | int | str) -> SideEffect:
        """Accept `SideEffect.A2`, `2`, `"A2"` or `"a2"`; ToolDefinitionError otherwise."""
        if isinstance(value, SideEffect):
            return value
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 3:
            return cls(value)
        if isinstance(value, str) and value.upper() in cls.__members__:
            return cls[value.upper()]
        raise ToolDefinitionError(f"Invalid side-effect level: expected A0..A3 or 0..3, got {value!r}")

    @classmethod
    def from_mcp_annotations(cls, annotations: Mapping[str, Any] | None) -> SideEffect:
        """MCP hints -> level. No annotations means A3: MCP's defaults assume the worst.

        readOnlyHint -> A0; else destructiveHint (default true in MCP) -> A3; else
        idempotentHint -> A1; else A2.
        """
        if not annotations:
            return cls.A3
        if annotations.get("readOnlyHint") is True:
            return cls.A0
        if annotations.get("destructiveHint", True) is not False:
            return cls.A3
        if annotations.get("idempotentHint") is True:
            return cls.A1
        return cls.A2


# A compensator undoes the partial effect of an A3 call that failed after it started:
# (arguments, the failed ToolResult as a dict) -> None; raising means "could not undo".
Compensator = Callable[[dict, Any], None]
# A cost declares what one call spends, from its arguments, in the tool's own unit (bash: timeout_ms,
# file_edit: bytes written, ...); dispatch checks it against the capability's ceiling P.
Cost = Callable[[dict], float]
# A reconciliation probe reads the environment after a crash: see dispatch.idempotency.settle.
Probe = Callable[..., Any]


@dataclass(frozen=True)
class Tool:
    """A tool the model may call. `input_schema` is a JSON Schema 2020-12 object schema."""

    name: str
    description: str
    input_schema: dict
    level: SideEffect = SideEffect.A3
    compensator: Compensator | None = field(default=None, compare=False, repr=False)
    probe: Probe | None = field(default=None, compare=False, repr=False)
    handler: Callable[..., Any] | None = field(default=None, compare=False, repr=False)
    annotations: dict = field(default_factory=dict, compare=False)
    model: Any = field(default=None, compare=False, repr=False)  # the pydantic class, if any
    cost: Cost | None = field(default=None, compare=False, repr=False)  # None: every call costs 0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or len(self.name) > 128:
            raise ToolDefinitionError(f"Invalid tool name: expected 1..128 characters, got {self.name!r}")
        if not isinstance(self.description, str):
            raise ToolDefinitionError(f"Invalid description of tool {self.name!r}: expected a string, got {type(self.description).__name__}")
        if not isinstance(self.input_schema, dict):
            raise ToolDefinitionError(f"Invalid input schema of tool {self.name!r}: expected a JSON object, got {type(self.input_schema).__name__}")
        if self.input_schema.get("type", "object") != "object":
            raise ToolDefinitionError(f"Invalid input schema of tool {self.name!r}: expected type 'object' at /type, got {self.input_schema.get('type')!r}")
        _check_json(self.input_schema, self.name)
        object.__setattr__(self, "level", SideEffect.parse(self.level))

    # --- constructors -------------------------------------------------------------------
    @classmethod
    def from_schema(cls, name: str, schema: dict, description: str = "", level: SideEffect | int | str = SideEffect.A3, **extra) -> Tool:
        """A tool from a raw JSON Schema (copied, never mutated)."""
        return cls(name=name, description=description, input_schema=copy.deepcopy(schema), level=level, **extra)

    @classmethod
    def from_pydantic(cls, model: Any, name: str | None = None, description: str | None = None, level: SideEffect | int | str = SideEffect.A3, **extra) -> Tool:
        """A tool from a pydantic v2 model. Extra fields are forbidden: every object schema in
        the export (the root and each nested model under `$defs`) gets `additionalProperties: false`
        unless it already says otherwise, because pydantic only closes models configured so."""
        if not hasattr(model, "model_json_schema"):
            raise ToolDefinitionError(f"Invalid pydantic model: expected a BaseModel subclass, got {model!r}")
        schema = model.model_json_schema()
        _close_objects_inplace(schema)
        schema.pop("title", None)
        doc = (model.__doc__ or "").strip()
        return cls(
            name=name or _snake(model.__name__),
            description=description if description is not None else schema.pop("description", doc),
            input_schema=schema, level=level, model=model, **extra,
        )

    @classmethod
    def from_mcp(cls, tool: Mapping[str, Any], level: SideEffect | int | str | None = None, **extra) -> Tool:
        """A tool from an MCP `tools/list` entry: {name, description, inputSchema, annotations}.
        The level comes from the annotations unless given."""
        if isinstance(tool, Mapping) and "inputSchema" not in tool and "input_schema" not in tool:
            raise ToolDefinitionError(f"Invalid MCP tool {tool.get('name')!r}: expected an 'inputSchema'")
        from surecall.tools.normalise import normalise_tool

        return normalise_tool(tool, level=level, **extra)

    @classmethod
    def from_openai(cls, definition: Mapping[str, Any], level: SideEffect | int | str = SideEffect.A3, **extra) -> Tool:
        """A tool from an OpenAI function definition, `{type: function, function: {...}}` or the
        inner `{name, description, parameters}`. Parameters default to an empty closed object."""
        from surecall.tools.normalise import normalise_tool

        return normalise_tool(definition, level=level, **extra)

    @classmethod
    def from_any(cls, obj: Any, level: SideEffect | int | str | None = None) -> Tool:
        """Any shape `surecall.tools.normalise_tool` accepts."""
        from surecall.tools.normalise import normalise_tool

        return normalise_tool(obj, level=level)

    # --- what the model sees -------------------------------------------------------------
    def descriptor(self) -> dict:
        """The definition published to the model: {name, description, parameters}. The same
        schema object validates the arguments (`surecall.dispatch.validate`)."""
        return {"name": self.name, "description": self.description, "parameters": self.input_schema}

    def to_openai(self) -> dict:
        return {"type": "function", "function": self.descriptor()}

    def to_mcp(self) -> dict:
        return {"name": self.name, "description": self.description, "inputSchema": self.input_schema, "annotations": _mcp_hints(self.level)}


def _mcp_hints(level: SideEffect) -> dict:
    return {
        "readOnlyHint": level is SideEffect.A0,
        "destructiveHint": level is SideEffect.A3,
        "idempotentHint": level <= SideEffect.A1,
    }


def _close_objects_inplace(schema: Any) -> None:
    """Set `additionalProperties: false` on every object schema that declares properties."""
    if isinstance(schema, dict):
        is_object = schema.get("type") == "object" or "properties" in schema
        if is_object and "additionalProperties" not in schema and "unevaluatedProperties" not in schema:
            schema["additionalProperties"] = False
        for value in schema.values():
            _close_objects_inplace(value)
    elif isinstance(schema, list):
        for value in schema:
            _close_objects_inplace(value)


def _check_json(schema: dict, name: str) -> None:
    try:
        json.dumps(schema, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ToolDefinitionError(f"Invalid input schema of tool {name!r}: not JSON-serialisable ({exc})") from exc


def _snake(name: str) -> str:
    out = [("_" + c.lower()) if c.isupper() and i else c.lower() for i, c in enumerate(name)]
    return "".join(out)
