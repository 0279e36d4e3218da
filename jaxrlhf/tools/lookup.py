"""A per-trajectory lookup table: the policy asks for a key and reads back its value.

Each row brings its own table (`create_kwargs.table`, a mapping key -> value), so a task can hide the fact its
answer needs behind the tool: the CPU quickstart's tool task is answerable only by calling it. `execute` answers
`{"key": k}` with the value as text, or `unknown key 'k'`; a call without `key` on a one-entry table returns
that entry, so a policy that has not yet learned the argument name still gets the signal.
"""

from __future__ import annotations

import uuid
from typing import Any

from jaxrlhf.tools.base import BaseTool, OpenAIFunctionToolSchema, ToolResponse, create_kwarg


class LookupTool(BaseTool):
  """Answers `key` from the trajectory's `table`; step reward 0.0."""

  def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None):
    super().__init__(config, tool_schema)
    self._tables: dict[str, dict[str, Any]] = {}

  async def create(self, instance_id: str | None = None, table: Any = None, **kwargs) -> tuple[str, ToolResponse]:
    if instance_id is None:
      instance_id = str(uuid.uuid4())
    if table is None:
      table = create_kwarg(kwargs, "table", {})
    if not isinstance(table, dict):
      raise TypeError(f"lookup tool: create_kwargs.table must be a mapping of key to value, got {type(table).__name__}")
    self._tables[instance_id] = {str(key): value for key, value in table.items()}
    return instance_id, ToolResponse()

  async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
    table = self._tables[instance_id]
    key = parameters.get("key")
    if key is None:
      if len(table) == 1:
        return ToolResponse(text=str(next(iter(table.values())))), 0.0, {}
      return ToolResponse(text="missing 'key': say which key to look up"), 0.0, {}
    key = str(key)
    if key not in table:
      return ToolResponse(text=f"unknown key {key!r}"), 0.0, {}
    return ToolResponse(text=str(table[key])), 0.0, {}

  async def release(self, instance_id: str, **kwargs) -> None:
    self._tables.pop(instance_id, None)
