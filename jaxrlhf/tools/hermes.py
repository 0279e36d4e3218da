"""Parsing the hermes tool-call format (Qwen2.5, Qwen3, Hermes models) out of an assistant turn:
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

A call is a complete `<tool_call>...</tool_call>` block (the shortest one: blocks do not nest) whose body is a
JSON object with a string `name` and an object `arguments`; other keys in it are ignored. An unclosed
`<tool_call>` is not a call and stays in the content, as in verl's hermes parser.

verl drops a block whose JSON is bad, has no name or no arguments, and when every block of a turn is dropped the
trajectory ends there. Here such a block is a `MalformedCall`: the runner answers it with an error message, so
the policy learns what it got wrong and the turn goes on (docs/tools.md).
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
_TOOL_CALL_RE = re.compile(re.escape(TOOL_CALL_START) + r"(.*?)" + re.escape(TOOL_CALL_END), re.DOTALL)


@dataclasses.dataclass(frozen=True)
class ToolCall:
  """A well-formed call: the tool's `name` and the `arguments` object the policy wrote."""

  name: str
  arguments: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class MalformedCall:
  """A `<tool_call>` block that is not a call: its body as written (`raw`) and what is wrong with it."""

  raw: str
  error: str


def _parse_block(body: str) -> ToolCall | MalformedCall:
  try:
    value = json.loads(body)
  except json.JSONDecodeError as error:
    return MalformedCall(body, f"invalid JSON ({error})")
  if not isinstance(value, dict):
    return MalformedCall(body, f"expected a JSON object with 'name' and 'arguments', got a {type(value).__name__}")
  name = value.get("name")
  if not isinstance(name, str) or not name:
    return MalformedCall(body, "missing 'name'" if name is None else f"'name' must be a non-empty string, got {name!r}")
  if "arguments" not in value:
    return MalformedCall(body, f"missing 'arguments' in the call to {name!r}")
  arguments = value["arguments"]
  if not isinstance(arguments, dict):
    return MalformedCall(
      body, f"'arguments' of the call to {name!r} must be a JSON object, got {json.dumps(arguments)}"
    )
  return ToolCall(name, arguments)


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall | MalformedCall]]:
  """Splits a decoded assistant turn into its content (the text with every complete call block removed) and the
  calls in the order written."""
  bodies = _TOOL_CALL_RE.findall(text)
  if not bodies:
    return text, []
  return _TOOL_CALL_RE.sub("", text), [_parse_block(body) for body in bodies]
