"""Loading tools from verl's tool config YAML (`multi_turn.tool_config_path`, docs/tools.md).

    tools:
      - class_name: verl.tools.gsm8k_tool.Gsm8kTool     # or package.module.Class, or path/to/file.py:Class
        config: {type: native}                           # given to the tool as `config`
        tool_schema: {type: function, function: {name: ..., description: ..., parameters: {...}}}

`class_name` is one of verl's built-in tools that jaxrlhf has (`VERL_TOOL_NAMES`), a dotted import path, or a
Python file and a class in it; a relative file is found from the YAML file's folder. The file is imported like a
custom reward file (`jaxrlhf.rewards.custom`). Every tool class subclasses `jaxrlhf.tools.BaseTool` and is built as
`cls(config=..., tool_schema=...)`, as in verl. Every error names the YAML file, the entry (`tools[i]`) and the key.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import Any

import yaml

from jaxrlhf.rewards.custom import load_custom_reward_function
from jaxrlhf.tools.base import BaseTool, OpenAIFunctionToolSchema, ToolConfigError
from jaxrlhf.tools.calculator import CalculatorTool
from jaxrlhf.tools.gsm8k import Gsm8kTool
from jaxrlhf.tools.lookup import LookupTool

CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")

# The class_name a verl tool config uses for a built-in tool -> ours. verl's other built-ins are refused by name.
VERL_TOOL_NAMES: dict[str, type[BaseTool]] = {"verl.tools.gsm8k_tool.Gsm8kTool": Gsm8kTool}
BUILTIN_TOOLS: dict[str, type[BaseTool]] = {
  "jaxrlhf.tools.gsm8k.Gsm8kTool": Gsm8kTool,
  "jaxrlhf.tools.calculator.CalculatorTool": CalculatorTool,
  "jaxrlhf.tools.lookup.LookupTool": LookupTool,
}
TOOL_TYPES = ("native",)


def builtin_config_path(name: str) -> str:
  """The packaged tool config for a built-in tool: `gsm8k`, `calculator` or `lookup`."""
  path = os.path.join(CONFIG_DIR, f"{name}.yaml")
  if not os.path.isfile(path):
    known = sorted(file.removesuffix(".yaml") for file in os.listdir(CONFIG_DIR) if file.endswith(".yaml"))
    raise ToolConfigError(f"no packaged tool config {name!r}; packaged: {known}")
  return path


def _supported() -> str:
  return (
    ", ".join([*VERL_TOOL_NAMES, *BUILTIN_TOOLS]) + ", or a BaseTool subclass as package.module.Class or file.py:Class"
  )


def _import_class(class_name: str, where: str, config_dir: str) -> Any:
  """The object `class_name` names (checked to be a tool class by the caller)."""
  if class_name in VERL_TOOL_NAMES:
    return VERL_TOOL_NAMES[class_name]
  if class_name.startswith("verl."):
    raise ToolConfigError(
      f"{where}.class_name {class_name!r} is a verl tool jaxrlhf does not have; supported: {_supported()}"
    )
  file_part, colon, attribute = class_name.rpartition(":")
  if colon and (file_part.endswith(".py") or os.sep in file_part or "/" in file_part):
    if not attribute:
      raise ToolConfigError(
        f"{where}.class_name {class_name!r} names a file but no class (write path/to/file.py:Class)"
      )
    path = os.path.join(config_dir, os.path.expanduser(file_part))
    if not os.path.isfile(path):
      raise ToolConfigError(
        f"{where}.class_name {class_name!r}: tool file {os.path.abspath(path)!r} does not exist "
        "(a relative path is read from the tool config's folder)"
      )
    try:
      return load_custom_reward_function(path, attribute)
    except ImportError as error:
      cause = error.__cause__ or error
      raise ToolConfigError(
        f"{where}.class_name {class_name!r}: importing tool file {os.path.abspath(path)!r} failed: "
        f"{type(cause).__name__}: {cause}"
      ) from error
    except AttributeError:
      raise ToolConfigError(
        f"{where}.class_name {class_name!r}: tool file {os.path.abspath(path)!r} defines no {attribute!r}"
      ) from None
    except TypeError:  # defined, but not callable: not a class
      raise ToolConfigError(
        f"{where}.class_name {class_name!r} is not a tool class (a jaxrlhf.tools.BaseTool subclass)"
      ) from None
  module_name, dot, attribute = class_name.rpartition(".")
  if not dot or not module_name or not attribute:
    raise ToolConfigError(
      f"{where}.class_name {class_name!r} is neither package.module.Class nor path/to/file.py:Class"
    )
  try:
    module = importlib.import_module(module_name)
  except ModuleNotFoundError as error:
    raise ToolConfigError(f"{where}.class_name {class_name!r}: no module {error.name or module_name!r}") from error
  except Exception as error:
    raise ToolConfigError(
      f"{where}.class_name {class_name!r}: importing module {module_name!r} failed: {type(error).__name__}: {error}"
    ) from error
  if not hasattr(module, attribute):
    raise ToolConfigError(f"{where}.class_name {class_name!r}: module {module_name!r} defines no {attribute!r}")
  return getattr(module, attribute)


def _check_tool_class(value: Any, class_name: str, where: str) -> type[BaseTool]:
  if isinstance(value, type) and issubclass(value, BaseTool):
    return value
  hint = ""
  if isinstance(value, type) and any(base.__module__.startswith("verl.") for base in value.__mro__[1:]):
    hint = "; it subclasses verl's BaseTool: import BaseTool from jaxrlhf.tools instead"
  kind = f"class {value.__name__}" if isinstance(value, type) else f"a {type(value).__name__}"
  raise ToolConfigError(f"{where}.class_name {class_name!r} is {kind}, not a jaxrlhf.tools.BaseTool subclass{hint}")


def _build_tool(entry: Any, where: str, config_dir: str) -> BaseTool:
  if not isinstance(entry, Mapping):
    raise ToolConfigError(f"{where} must be a mapping with class_name, config and tool_schema, got {entry!r}")
  class_name = entry.get("class_name")
  if not isinstance(class_name, str) or not class_name:
    raise ToolConfigError(f"{where}: missing key 'class_name' (the tool class)")
  config = entry.get("config")
  config = {} if config is None else config
  if not isinstance(config, Mapping):
    raise ToolConfigError(f"{where}.config must be a mapping, got {type(config).__name__}")
  tool_type = config.get("type", "native")
  if tool_type == "mcp":
    raise ToolConfigError(
      f"{where}.config.type 'mcp': MCP tools are not supported; supported types: {list(TOOL_TYPES)}"
    )
  if tool_type not in TOOL_TYPES:
    raise ToolConfigError(f"{where}.config.type must be one of {list(TOOL_TYPES)}, got {tool_type!r}")

  tool_class = _check_tool_class(_import_class(class_name, where, config_dir), class_name, where)
  if entry.get("tool_schema") is not None:
    schema = OpenAIFunctionToolSchema.from_dict(entry["tool_schema"], f"{where}.tool_schema")
  elif tool_class.get_openai_tool_schema is BaseTool.get_openai_tool_schema:
    raise ToolConfigError(f"{where}: missing key 'tool_schema' (the OpenAI function schema the policy sees)")
  else:
    schema = None  # the class supplies its own
  try:
    return tool_class(config=dict(config), tool_schema=schema)
  except ToolConfigError as error:
    raise ToolConfigError(f"{where}: {error}") from error
  except Exception as error:
    raise ToolConfigError(f"{where}: constructing {class_name} failed: {type(error).__name__}: {error}") from error


def load_tools(tool_config_path: str) -> dict[str, BaseTool]:
  """The tools of a verl tool config YAML, by the name the policy calls them (`tool_schema.function.name`);
  `builtin:<name>` is a packaged config (`builtin_config_path`)."""
  tool_config_path = str(tool_config_path)
  if tool_config_path.startswith("builtin:"):
    tool_config_path = builtin_config_path(tool_config_path.split(":", 1)[1])
  path = os.path.abspath(os.path.expanduser(tool_config_path))
  if not os.path.isfile(path):
    raise ToolConfigError(f"tool config {path!r} does not exist")
  try:
    with open(path) as file:
      document = yaml.safe_load(file)
  except yaml.YAMLError as error:
    raise ToolConfigError(f"tool config {path!r} is not valid YAML: {error}") from error
  if not isinstance(document, Mapping) or "tools" not in document:
    raise ToolConfigError(f"tool config {path!r}: missing key 'tools' (a list of tools)")
  entries = document["tools"]
  if not isinstance(entries, list) or not entries:
    raise ToolConfigError(f"tool config {path!r}: 'tools' must be a non-empty list of tools, got {entries!r}")

  tools: dict[str, BaseTool] = {}
  first_index: dict[str, int] = {}
  for index, entry in enumerate(entries):
    where = f"tool config {path!r}: tools[{index}]"
    tool = _build_tool(entry, where, os.path.dirname(path))
    if tool.name in tools:
      raise ToolConfigError(f"{where}: duplicate tool name {tool.name!r} (also tools[{first_index[tool.name]}])")
    tools[tool.name] = tool
    first_index[tool.name] = index
  return tools
