"""Tools for multi-turn rollouts, as verl's: the `BaseTool` interface, loading tools from verl's tool config YAML,
the hermes tool-call parser, the built-in tools and the runner that executes a round of calls (docs/tools.md).

Pure Python: nothing here imports JAX, so tools run on the host beside the generation loop.
"""

from jaxrlhf.tools.base import (
  BaseTool,
  OpenAIFunctionParametersSchema,
  OpenAIFunctionPropertySchema,
  OpenAIFunctionSchema,
  OpenAIFunctionToolSchema,
  ToolConfigError,
  ToolResponse,
  create_kwarg,
)
from jaxrlhf.tools.calculator import CalculatorTool, calculate
from jaxrlhf.tools.gsm8k import Gsm8kTool
from jaxrlhf.tools.hermes import MalformedCall, ToolCall, parse_tool_calls
from jaxrlhf.tools.lookup import LookupTool
from jaxrlhf.tools.registry import BUILTIN_TOOLS, CONFIG_DIR, VERL_TOOL_NAMES, builtin_config_path, load_tools
from jaxrlhf.tools.runner import CallRequest, CallResult, ToolError, ToolRunner, truncate_response

__all__ = [
  "BUILTIN_TOOLS",
  "BaseTool",
  "CONFIG_DIR",
  "CalculatorTool",
  "CallRequest",
  "CallResult",
  "Gsm8kTool",
  "LookupTool",
  "MalformedCall",
  "OpenAIFunctionParametersSchema",
  "OpenAIFunctionPropertySchema",
  "OpenAIFunctionSchema",
  "OpenAIFunctionToolSchema",
  "ToolCall",
  "ToolConfigError",
  "ToolError",
  "ToolResponse",
  "ToolRunner",
  "VERL_TOOL_NAMES",
  "builtin_config_path",
  "calculate",
  "create_kwarg",
  "load_tools",
  "parse_tool_calls",
  "truncate_response",
]
