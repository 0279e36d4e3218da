"""The tool interface: verl's `BaseTool` life cycle, its OpenAI function schema and `ToolResponse` (docs/tools.md).

A verl tool ports by importing `BaseTool`, `ToolResponse` and `OpenAIFunctionToolSchema` from `jaxrlhf.tools`
instead of `verl.tools.base_tool` / `verl.tools.schemas`: the constructor, the method names and signatures and
what they return are verl's. Any of the four life-cycle methods may also be a plain function; the runner
(`jaxrlhf.tools.runner`) awaits the async ones and runs the plain ones in a thread.

The schemas are dataclasses rather than verl's pydantic models; `from_dict` reads the YAML's `tool_schema` and
names the missing or mistyped key, and `to_dict` gives what a chat template's `tools=` argument takes.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from typing import Any

from jaxrlhf.errors import UserError


class ToolConfigError(UserError, ValueError):
  """A tool config (YAML file, tool class or schema) is wrong: the message names the file, entry and key."""


@dataclasses.dataclass
class ToolResponse:
  """What a tool says back: `text` becomes the tool message the policy reads.

  `image` and `video` are verl's multimodal fields. They are accepted here so that a verl tool constructs its
  responses unchanged, but rollouts are text-only: the runner stops with an error naming the tool when one
  comes back non-empty.
  """

  text: str | None = None
  image: list[Any] | None = None
  video: list[Any] | None = None

  def is_empty(self) -> bool:
    return not self.text and not self.image and not self.video

  def is_text_only(self) -> bool:
    return not self.image and not self.video


def _require(mapping: Any, key: str, where: str, kind: type | tuple[type, ...], kind_name: str) -> Any:
  if not isinstance(mapping, Mapping):
    raise ToolConfigError(f"{where} must be a mapping, got {type(mapping).__name__}")
  if key not in mapping or mapping[key] is None:
    raise ToolConfigError(f"{where}: missing key {key!r}")
  value = mapping[key]
  if not isinstance(value, kind):
    raise ToolConfigError(f"{where}.{key} must be {kind_name}, got {type(value).__name__} {value!r}")
  return value


@dataclasses.dataclass
class OpenAIFunctionPropertySchema:
  """One parameter: its JSON type (a list of types for a union), description and allowed values.

  `extra` keeps the other JSON Schema keys of the parameter (`items`, `minimum`, ...) so that the chat template
  sees the schema as written (verl's pydantic model drops them).
  """

  type: str | list[str]
  description: str | None = None
  enum: list[Any] | None = None
  extra: dict[str, Any] = dataclasses.field(default_factory=dict)

  @classmethod
  def from_dict(cls, data: Any, where: str) -> OpenAIFunctionPropertySchema:
    type_ = _require(data, "type", where, (str, list), "a string or a list of strings")
    description = data.get("description")
    if description is not None and not isinstance(description, str):
      raise ToolConfigError(f"{where}.description must be a string, got {type(description).__name__}")
    enum = data.get("enum")
    if enum is not None and not isinstance(enum, list):
      raise ToolConfigError(f"{where}.enum must be a list, got {type(enum).__name__}")
    extra = {key: value for key, value in data.items() if key not in ("type", "description", "enum")}
    return cls(type=type_, description=description, enum=enum, extra=extra)

  def to_dict(self) -> dict[str, Any]:
    out: dict[str, Any] = {"type": self.type}
    if self.description is not None:
      out["description"] = self.description
    if self.enum is not None:
      out["enum"] = self.enum
    return {**out, **self.extra}


@dataclasses.dataclass
class OpenAIFunctionParametersSchema:
  """The function's parameters: an object schema with named `properties`; `required` may be omitted."""

  type: str
  properties: dict[str, OpenAIFunctionPropertySchema]
  required: list[str] | None = None

  @classmethod
  def from_dict(cls, data: Any, where: str) -> OpenAIFunctionParametersSchema:
    type_ = _require(data, "type", where, str, "a string")
    raw_properties = _require(data, "properties", where, Mapping, "a mapping of parameter name to schema")
    properties = {
      str(name): OpenAIFunctionPropertySchema.from_dict(value, f"{where}.properties.{name}")
      for name, value in raw_properties.items()
    }
    required = data.get("required")
    if required is not None:
      if not isinstance(required, list) or not all(isinstance(name, str) for name in required):
        raise ToolConfigError(f"{where}.required must be a list of parameter names, got {required!r}")
      unknown = [name for name in required if name not in properties]
      if unknown:
        raise ToolConfigError(f"{where}.required names {unknown}, which are not in properties {list(properties)}")
    return cls(type=type_, properties=properties, required=required)

  def to_dict(self) -> dict[str, Any]:
    out: dict[str, Any] = {"type": self.type, "properties": {k: v.to_dict() for k, v in self.properties.items()}}
    if self.required is not None:
      out["required"] = list(self.required)
    return out


def _no_parameters() -> OpenAIFunctionParametersSchema:
  return OpenAIFunctionParametersSchema(type="object", properties={}, required=[])


@dataclasses.dataclass
class OpenAIFunctionSchema:
  """The function a tool exposes: `name` (what the policy calls), `description` and `parameters`."""

  name: str
  description: str
  parameters: OpenAIFunctionParametersSchema = dataclasses.field(default_factory=_no_parameters)
  strict: bool | None = None

  @classmethod
  def from_dict(cls, data: Any, where: str) -> OpenAIFunctionSchema:
    name = _require(data, "name", where, str, "a string")
    if not name:
      raise ToolConfigError(f"{where}.name is empty")
    description = _require(data, "description", where, str, "a string")
    parameters = (
      OpenAIFunctionParametersSchema.from_dict(data["parameters"], f"{where}.parameters")
      if data.get("parameters") is not None
      else _no_parameters()
    )
    strict = data.get("strict")
    if strict is not None and not isinstance(strict, bool):
      raise ToolConfigError(f"{where}.strict must be true or false, got {strict!r}")
    return cls(name=name, description=description, parameters=parameters, strict=strict)

  def to_dict(self) -> dict[str, Any]:
    out = {"name": self.name, "description": self.description, "parameters": self.parameters.to_dict()}
    if self.strict is not None:
      out["strict"] = self.strict
    return out


@dataclasses.dataclass
class OpenAIFunctionToolSchema:
  """A tool in OpenAI's format, as the YAML's `tool_schema` writes it: `{type: function, function: {...}}`."""

  type: str
  function: OpenAIFunctionSchema

  @classmethod
  def from_dict(cls, data: Any, where: str = "tool_schema") -> OpenAIFunctionToolSchema:
    """Parses the YAML mapping; every error names the key under `where` (e.g. `tools[0].tool_schema.function`)."""
    type_ = _require(data, "type", where, str, "a string")
    if type_ != "function":
      raise ToolConfigError(f"{where}.type must be 'function' (OpenAI function tools), got {type_!r}")
    function = OpenAIFunctionSchema.from_dict(
      _require(data, "function", where, Mapping, "a mapping"), f"{where}.function"
    )
    return cls(type=type_, function=function)

  def to_dict(self) -> dict[str, Any]:
    """The schema as a chat template's `tools=` argument takes it (verl's `model_dump(exclude_none=True)`)."""
    return {"type": self.type, "function": self.function.to_dict()}


class BaseTool:
  """A tool the policy calls by name, with verl's life cycle: per call, the runner

  1. `create(create_kwargs=...)` makes an instance for the trajectory (the row's `tools_kwargs[name].create_kwargs`,
     e.g. its ground truth) and returns `(instance_id, ToolResponse)`;
  2. `execute(instance_id, parameters)` runs it on the call's arguments and returns
     `(ToolResponse, step_reward, metrics)`;
  3. `release(instance_id)` frees the instance, also when `execute` raised or timed out.

  `calc_reward(instance_id)` scores the instance's state; tools call it from `execute` (verl's agent loop never
  calls it). The defaults below do nothing, as verl's do. Subclasses keep the constructor's signature: the
  registry builds every tool as `cls(config=<the YAML's config>, tool_schema=<its tool_schema>)`.
  """

  def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None):
    self.config = config
    # A subclass may carry its own schema by overriding get_openai_tool_schema (used when the YAML has none).
    schema = tool_schema if tool_schema is not None else self.get_openai_tool_schema()
    if isinstance(schema, Mapping):
      schema = OpenAIFunctionToolSchema.from_dict(schema, f"{type(self).__name__}.get_openai_tool_schema()")
    if not isinstance(schema, OpenAIFunctionToolSchema):
      raise ToolConfigError(
        f"tool class {type(self).__name__} got no tool_schema and defines none (get_openai_tool_schema() returned "
        f"{schema!r}); give the tool a tool_schema in the tool config"
      )
    self.tool_schema = schema
    self.name = schema.function.name

  def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema | None:
    return self.__dict__.get("tool_schema")

  async def create(self, instance_id: str | None = None, **kwargs) -> tuple[str, ToolResponse]:
    """Makes an instance for one trajectory; returns its id (`instance_id`, or a new one) and a response."""
    return (instance_id if instance_id is not None else str(uuid.uuid4())), ToolResponse()

  async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
    """Runs the tool on the call's `parameters`; returns the response, a step reward and metrics."""
    return ToolResponse(text="Updated the tool state."), 0.0, {}

  async def calc_reward(self, instance_id: str, **kwargs) -> float:
    """The reward of the instance's current state."""
    return 0.0

  async def release(self, instance_id: str, **kwargs) -> None:
    """Frees the instance."""


def create_kwarg(kwargs: Mapping[str, Any], key: str, default: Any = None) -> Any:
  """`key` from a `create` call's keyword arguments: given directly (`create(ground_truth=...)`) or, as verl's
  agent loop and our runner pass it, inside `create_kwargs` (`create(create_kwargs={"ground_truth": ...})`)."""
  if kwargs.get(key) is not None:
    return kwargs[key]
  nested = kwargs.get("create_kwargs") or {}
  return nested.get(key, default)
