"""The tool layer: verl's tool config YAML, the hermes parser, the built-in tools and the runner (no JAX)."""

import asyncio
import subprocess
import sys
import textwrap
import time
import tomllib
from pathlib import Path

import pytest

from jaxrlhf.tools import (
  BaseTool,
  CalculatorTool,
  CallRequest,
  CallResult,
  Gsm8kTool,
  LookupTool,
  MalformedCall,
  OpenAIFunctionToolSchema,
  ToolCall,
  ToolConfigError,
  ToolError,
  ToolResponse,
  ToolRunner,
  builtin_config_path,
  calculate,
  load_tools,
  parse_tool_calls,
  truncate_response,
)

REPO = Path(__file__).resolve().parents[2]

# The layout of verl's examples/sglang_multiturn/config/tool_config/gsm8k_tool_config.yaml.
VERL_GSM8K_CONFIG = """
tools:
  - class_name: "verl.tools.gsm8k_tool.Gsm8kTool"
    config:
      type: native
    tool_schema:
      type: "function"
      function:
        name: "calc_gsm8k_reward"
        description: "Scores a GSM8K answer (1.0 if right, 0.0 otherwise)"
        parameters:
          type: "object"
          properties:
            answer:
              type: "string"
              description: "The answer, digits only"
          required: ["answer"]
"""


def schema_yaml(name: str, properties: str = "{}") -> str:
  return f"""
    tool_schema:
      type: function
      function:
        name: {name}
        description: a test tool
        parameters: {{type: object, properties: {properties}}}
"""


def write(path: Path, text: str) -> Path:
  path.write_text(textwrap.dedent(text))
  return path


def schema(name: str) -> OpenAIFunctionToolSchema:
  return OpenAIFunctionToolSchema.from_dict(
    {
      "type": "function",
      "function": {"name": name, "description": "d", "parameters": {"type": "object", "properties": {}}},
    }
  )


def run(coroutine):
  return asyncio.run(coroutine)


# ----- YAML loading --------------------------------------------------------------------------------


def test_verl_gsm8k_config_loads_our_gsm8k_tool(tmp_path):
  tools = load_tools(str(write(tmp_path / "gsm8k_tool_config.yaml", VERL_GSM8K_CONFIG)))
  assert list(tools) == ["calc_gsm8k_reward"]
  tool = tools["calc_gsm8k_reward"]
  assert isinstance(tool, Gsm8kTool) and tool.name == "calc_gsm8k_reward" and tool.config == {"type": "native"}
  assert tool.get_openai_tool_schema() is tool.tool_schema
  assert tool.tool_schema.to_dict() == {
    "type": "function",
    "function": {
      "name": "calc_gsm8k_reward",
      "description": "Scores a GSM8K answer (1.0 if right, 0.0 otherwise)",
      "parameters": {
        "type": "object",
        "properties": {"answer": {"type": "string", "description": "The answer, digits only"}},
        "required": ["answer"],
      },
    },
  }


def test_packaged_configs_load_and_are_package_data():
  classes = {"gsm8k": Gsm8kTool, "calculator": CalculatorTool, "lookup": LookupTool}
  for name, tool_class in classes.items():
    (tool,) = load_tools(builtin_config_path(name)).values()
    assert type(tool) is tool_class
  package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
  assert "configs/*.yaml" in package_data["jaxrlhf.tools"]
  with pytest.raises(ToolConfigError, match=r"no packaged tool config 'nope'; packaged: \['calculator', 'gsm8k'"):
    builtin_config_path("nope")


def test_schema_keeps_extra_json_schema_keys_and_omits_unset_ones():
  parsed = OpenAIFunctionToolSchema.from_dict(
    {
      "type": "function",
      "function": {
        "name": "f",
        "description": "d",
        "parameters": {"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "integer"}}}},
      },
    }
  )
  assert parsed.function.parameters.required is None
  assert parsed.to_dict()["function"]["parameters"] == {
    "type": "object",
    "properties": {"xs": {"type": "array", "items": {"type": "integer"}}},
  }
  no_parameters = OpenAIFunctionToolSchema.from_dict(
    {"type": "function", "function": {"name": "g", "description": "d"}}
  )
  assert no_parameters.function.parameters.properties == {}


@pytest.mark.parametrize(
  "body, message",
  [
    ("tools: [", "is not valid YAML"),
    ("other: 1", "missing key 'tools'"),
    ("tools: []", "'tools' must be a non-empty list"),
    ("tools:\n  - config: {type: native}", r"tools\[0\]: missing key 'class_name'"),
    (
      "tools:\n  - class_name: jaxrlhf.tools.calculator.CalculatorTool\n    config: {type: native}",
      r"tools\[0\]: missing key 'tool_schema'",
    ),
    (
      "tools:\n  - class_name: jaxrlhf.tools.calculator.CalculatorTool\n    config: {type: mcp}",
      "config.type 'mcp': MCP tools are not supported",
    ),
    (
      "tools:\n  - class_name: jaxrlhf.tools.calculator.CalculatorTool\n    config: {type: sandbox}",
      r"config.type must be one of \['native'\], got 'sandbox'",
    ),
    (
      "tools:\n  - class_name: verl.tools.search_tool.SearchTool\n    config: {type: native}",
      r"'verl.tools.search_tool.SearchTool' is a verl tool jaxrlhf does not have; supported: "
      r"verl.tools.gsm8k_tool.Gsm8kTool, jaxrlhf.tools.gsm8k.Gsm8kTool, jaxrlhf.tools.calculator.CalculatorTool",
    ),
    ("tools:\n  - class_name: no_such_pkg.Tool", "no module 'no_such_pkg'"),
    (
      "tools:\n  - class_name: jaxrlhf.tools.calculator.NoSuchTool",
      "module 'jaxrlhf.tools.calculator' defines no 'NoSuchTool'",
    ),
    ("tools:\n  - class_name: Calculator", "neither package.module.Class nor path/to/file.py:Class"),
    (
      "tools:\n  - class_name: jaxrlhf.tools.calculator.calculate",
      "is a function, not a jaxrlhf.tools.BaseTool subclass",
    ),
    ("tools:\n  - class_name: collections.OrderedDict", "is class OrderedDict, not a jaxrlhf.tools.BaseTool subclass"),
  ],
)
def test_config_errors_name_the_key(tmp_path, body, message):
  path = write(tmp_path / "tools.yaml", body)
  with pytest.raises(ToolConfigError, match=message) as raised:
    load_tools(str(path))
  assert str(path) in str(raised.value)


def test_missing_config_file(tmp_path):
  with pytest.raises(ToolConfigError, match=r"tool config '.*nope.yaml' does not exist"):
    load_tools(str(tmp_path / "nope.yaml"))


@pytest.mark.parametrize(
  "tool_schema, message",
  [
    ("{type: function}", r"tools\[0\].tool_schema: missing key 'function'"),
    ("{type: retrieval, function: {}}", r"tool_schema.type must be 'function'"),
    ("{type: function, function: {description: d}}", r"tool_schema.function: missing key 'name'"),
    ("{type: function, function: {name: f}}", r"tool_schema.function: missing key 'description'"),
    (
      "{type: function, function: {name: f, description: d, parameters: {type: object}}}",
      r"tool_schema.function.parameters: missing key 'properties'",
    ),
    (
      "{type: function, function: {name: f, description: d, parameters: {type: object, properties: {x: {}}}}}",
      r"tool_schema.function.parameters.properties.x: missing key 'type'",
    ),
    (
      "{type: function, function: {name: f, description: d, parameters: {type: object, properties: {}, "
      "required: [x]}}}",
      r"required names \['x'\], which are not in properties",
    ),
  ],
)
def test_schema_errors_name_the_key(tmp_path, tool_schema, message):
  body = f"tools:\n  - class_name: jaxrlhf.tools.calculator.CalculatorTool\n    tool_schema: {tool_schema}\n"
  with pytest.raises(ToolConfigError, match=message):
    load_tools(str(write(tmp_path / "tools.yaml", body)))


def test_duplicate_tool_names(tmp_path):
  entry = "  - class_name: jaxrlhf.tools.calculator.CalculatorTool" + schema_yaml("calc")
  path = write(tmp_path / "tools.yaml", "tools:\n" + entry + entry)
  with pytest.raises(ToolConfigError, match=r"tools\[1\]: duplicate tool name 'calc' \(also tools\[0\]\)"):
    load_tools(str(path))


TOOL_FILE = """
import asyncio
from jaxrlhf.tools import BaseTool, ToolResponse

class SyncEcho(BaseTool):
  def create(self, instance_id=None, **kwargs):
    self.prefix = kwargs["create_kwargs"].get("prefix", "")
    return "sync-instance", ToolResponse()

  def execute(self, instance_id, parameters, **kwargs):
    return ToolResponse(text=self.prefix + str(parameters.get("text"))), 0.5, {"echoed": 1}

  def release(self, instance_id, **kwargs):
    self.released = instance_id

class AsyncEcho(BaseTool):
  async def execute(self, instance_id, parameters, **kwargs):
    await asyncio.sleep(0)
    return ToolResponse(text="async " + str(parameters.get("text"))), 0.0, {}

class OwnSchema(BaseTool):
  def get_openai_tool_schema(self):
    return {"type": "function", "function": {"name": "own", "description": "carries its schema"}}

NOT_A_CLASS = 3
"""


def test_tool_file_by_path_with_sync_and_async_tools(tmp_path):
  (tmp_path / "lib").mkdir()
  write(tmp_path / "lib" / "my_tools.py", TOOL_FILE)
  config = write(
    tmp_path / "tools.yaml",
    "tools:\n"
    + "  - class_name: lib/my_tools.py:SyncEcho\n    config: {type: native, flavour: plain}"
    + schema_yaml("sync_echo", "{text: {type: string}}")
    + f"  - class_name: {tmp_path}/lib/my_tools.py:AsyncEcho"
    + schema_yaml("async_echo", "{text: {type: string}}")
    + "  - class_name: lib/my_tools.py:OwnSchema\n",
  )
  tools = load_tools(str(config))
  assert list(tools) == ["sync_echo", "async_echo", "own"]
  assert tools["sync_echo"].config == {"type": "native", "flavour": "plain"}
  with ToolRunner(tools, max_parallel_calls=2, timeout_s=5.0) as runner:
    results = runner.run_round(
      [
        (0, ToolCall("sync_echo", {"text": "hi"}), {"prefix": "> "}),
        (0, ToolCall("async_echo", {"text": "there"}), None),
      ]
    )
  assert results == [CallResult("> hi", 0.5, {"echoed": 1}), CallResult("async there", 0.0, {})]
  assert tools["sync_echo"].released == "sync-instance"


@pytest.mark.parametrize(
  "class_name, message",
  [
    ("missing.py:Tool", r"tool file '.*missing.py' does not exist \(a relative path is read from the tool config's"),
    ("my_tools.py:Nope", r"tool file '.*my_tools.py' defines no 'Nope'"),
    ("my_tools.py:NOT_A_CLASS", "is not a tool class"),
    ("my_tools.py:", "names a file but no class"),
    ("broken.py:Tool", r"importing tool file '.*broken.py' failed: ZeroDivisionError: division by zero"),
  ],
)
def test_tool_file_errors_name_the_file(tmp_path, class_name, message):
  write(tmp_path / "my_tools.py", TOOL_FILE)
  write(tmp_path / "broken.py", "x = 1 / 0\n")
  config = write(tmp_path / "tools.yaml", f"tools:\n  - class_name: '{class_name}'" + schema_yaml("t"))
  with pytest.raises(ToolConfigError, match=message):
    load_tools(str(config))


# ----- the hermes parser ---------------------------------------------------------------------------


def test_hermes_one_call_with_text_around_it():
  text = 'Let me check.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+2"}}\n</tool_call> done'
  content, calls = parse_tool_calls(text)
  assert content == "Let me check.\n done"
  assert calls == [ToolCall("calculator", {"expression": "1+2"})]


def test_hermes_two_calls_and_unknown_fields():
  text = (
    '<tool_call>{"name": "a", "arguments": {"x": 1}, "id": "call_7"}</tool_call>'
    '<tool_call>{"arguments": {}, "name": "b"}</tool_call>'
  )
  assert parse_tool_calls(text) == ("", [ToolCall("a", {"x": 1}), ToolCall("b", {})])


def test_hermes_malformed_calls():
  bodies = [
    '{"name": "a", "arguments": {"x": 1}',
    '{"arguments": {}}',
    '{"name": "a"}',
    '{"name": "a", "arguments": "{\\"x\\": 1}"}',
    '["a", {}]',
  ]
  content, calls = parse_tool_calls("".join(f"<tool_call>{body}</tool_call>" for body in bodies) + " tail")
  assert content == " tail"
  assert all(isinstance(call, MalformedCall) for call in calls)
  assert [call.raw for call in calls] == bodies
  errors = [call.error for call in calls]
  assert errors[0].startswith("invalid JSON (")
  assert errors[1:] == [
    "missing 'name'",
    "missing 'arguments' in the call to 'a'",
    "'arguments' of the call to 'a' must be a JSON object, got \"{\\\"x\\\": 1}\"",
    "expected a JSON object with 'name' and 'arguments', got a list",
  ]


def test_hermes_unclosed_tag_is_not_a_call():
  text = 'thinking <tool_call>{"name": "a", "arguments": {}}'
  assert parse_tool_calls(text) == (text, [])
  assert parse_tool_calls("no calls here") == ("no calls here", [])
  # A complete block before an unclosed one is a call; the unclosed rest stays in the content.
  content, calls = parse_tool_calls('<tool_call>{"name": "a", "arguments": {}}</tool_call> <tool_call>{"name"')
  assert content == ' <tool_call>{"name"' and calls == [ToolCall("a", {})]


# ----- built-in tools ------------------------------------------------------------------------------


def gsm8k_tool() -> Gsm8kTool:
  return Gsm8kTool(config={"type": "native"}, tool_schema=schema("calc_gsm8k_reward"))


def test_gsm8k_tool_rewards_as_verl():
  tool = gsm8k_tool()

  async def scenario():
    instance, response = await tool.create(create_kwargs={"ground_truth": "72"})
    assert response == ToolResponse()
    steps = [await tool.execute(instance, {"answer": answer}) for answer in ("70", "72", "#### 72", 72)]
    final = await tool.calc_reward(instance)
    await tool.release(instance)
    return steps, final

  steps, final = run(scenario())
  assert [(r.text, step) for r, step, _ in steps] == [
    ("Current parsed answer='70' reward=0.0", -0.05),  # wrong: not an improvement on 0.0
    ("Current parsed answer='72' reward=1.0", 0.0),  # right
    ("Current parsed answer='#### 72' reward=1.0", -0.05),  # repeated: no improvement
    ("Current parsed answer='72' reward=1.0", -0.05),  # a number is read as its text
  ]
  assert final == 1.0
  assert tool._instances == {}


def test_gsm8k_tool_takes_the_ground_truth_directly_and_through_the_runner():
  tool = gsm8k_tool()
  instance, _ = run(tool.create("mine", ground_truth="5"))
  assert instance == "mine" and run(tool.calc_reward("mine")) == 0.0
  with ToolRunner({"calc_gsm8k_reward": tool}, max_parallel_calls=2, timeout_s=5.0) as runner:
    right = ToolCall("calc_gsm8k_reward", {"answer": "5"})
    results = runner.run_round([(0, right, {"ground_truth": "5"}), (0, right, {"ground_truth": "5"}), (1, right, {})])
  # One instance per call (verl's agent loop): a repeated right answer is not penalised within a round.
  assert [(r.text, r.step_reward) for r in results] == [
    ("Current parsed answer='5' reward=1.0", 0.0),
    ("Current parsed answer='5' reward=1.0", 0.0),
    ("Current parsed answer='5' reward=0.0", -0.05),  # no ground truth for trajectory 1
  ]
  assert list(tool._instances) == ["mine"]  # the runner's instances were released


@pytest.mark.parametrize(
  "expression, value",
  [
    ("1 + 2 * 3", "7"),
    ("(1 + 2) * 3", "9"),
    ("-(4 - 10) / 4", "1.5"),
    ("6 / 3", "2"),
    ("+2 - -3", "5"),
    ("0.1 + 0.2", "0.30000000000000004"),
    (" 12 ", "12"),
    ("10 / 4 * 1e20", "2.5e+20"),
  ],
)
def test_calculator_values(expression, value):
  assert calculate(expression) == value


@pytest.mark.parametrize(
  "expression, error",
  [
    ("1 / 0", "Error: division by zero"),
    ("1 +", "Error: invalid expression '1 +'"),
    ("__import__('os').system('true')", "Error: unsupported Call; the calculator takes numbers, + - * /"),
    ("2 ** 10", "Error: unsupported operator Pow"),
    ("x + 1", "Error: unsupported Name"),
    ("'a' + 'b'", "Error: unsupported constant 'a'"),
    ("True + 1", "Error: unsupported constant True"),
    ("1e308 * 10", "Error: the result is too large"),
    ("(" * 5000 + "1" + ")" * 5000, "Error: the expression is longer than 1000 characters"),
  ],
)
def test_calculator_errors_are_text(expression, error):
  tool = CalculatorTool(config={}, tool_schema=schema("calculator"))
  response, step_reward, metrics = run(tool.execute("i", {"expression": expression}))
  assert response.text.startswith(error) and step_reward == 0.0 and metrics == {}


def test_calculator_never_evaluates(monkeypatch):
  import builtins

  monkeypatch.setattr(builtins, "eval", lambda *args: pytest.fail("eval was called"))
  tool = CalculatorTool(config={}, tool_schema=schema("calculator"))
  assert run(tool.execute("i", {"expression": "__import__('os')"}))[0].text.startswith("Error: unsupported Call")
  assert run(tool.execute("i", {"expression": 3}))[0].text == "3"
  assert run(tool.execute("i", {}))[0].text.startswith("Error: missing 'expression'")


def test_lookup_tool():
  tool = LookupTool(config={}, tool_schema=schema("lookup"))

  async def ask(table, parameters):
    instance, _ = await tool.create(create_kwargs={"table": table})
    try:
      return (await tool.execute(instance, parameters))[0].text
    finally:
      await tool.release(instance)

  table = {"capital": "Paris", "year": 1889}
  assert run(ask(table, {"key": "capital"})) == "Paris"
  assert run(ask(table, {"key": "year"})) == "1889"
  assert run(ask(table, {"key": "river"})) == "unknown key 'river'"
  assert run(ask(table, {})) == "missing 'key': say which key to look up"
  assert run(ask({"secret": 42}, {})) == "42"  # one entry: no key needed
  assert run(ask({}, {"key": "x"})) == "unknown key 'x'"
  assert tool._tables == {}
  with pytest.raises(TypeError, match="create_kwargs.table must be a mapping"):
    run(tool.create(table=[1, 2]))


# ----- the runner ----------------------------------------------------------------------------------


class SleepyTool(BaseTool):
  """Sleeps `seconds` (a call argument) in execute and records its life cycle."""

  def __init__(self, name: str):
    super().__init__({}, schema(name))
    self.events: list[str] = []

  async def create(self, instance_id=None, **kwargs):
    self.events.append("create")
    return await super().create(instance_id, **kwargs)

  async def execute(self, instance_id, parameters, **kwargs):
    await asyncio.sleep(parameters["seconds"])
    self.events.append("execute")
    return ToolResponse(text=f"slept {parameters['seconds']}"), 0.0, {}

  async def release(self, instance_id, **kwargs):
    self.events.append("release")


class PlainSleepyTool(BaseTool):
  def execute(self, instance_id, parameters, **kwargs):
    time.sleep(parameters["seconds"])
    return ToolResponse(text="done"), 1.0, {}


@pytest.mark.parametrize("plain", [False, True])
def test_calls_run_concurrently(plain):
  tool = PlainSleepyTool({}, schema("sleepy")) if plain else SleepyTool("sleepy")
  with ToolRunner({"sleepy": tool}, max_parallel_calls=1, timeout_s=5.0) as runner:
    runner.run_round([(0, ToolCall("sleepy", {"seconds": 0.0}))])  # start the loop and threads
    start = time.perf_counter()
    results = runner.run_round([(i, ToolCall("sleepy", {"seconds": 0.3})) for i in range(8)])
    elapsed = time.perf_counter() - start
  assert all(result.error is None for result in results)
  assert elapsed < 0.3 * 8 / 2, elapsed


def test_timeout_becomes_error_text_and_still_releases():
  tool = SleepyTool("sleepy")
  with ToolRunner({"sleepy": tool}, max_parallel_calls=2, timeout_s=0.2) as runner:
    slow, fast = runner.run_round([(0, ToolCall("sleepy", {"seconds": 5})), (0, ToolCall("sleepy", {"seconds": 0}))])
    metrics = runner.pop_metrics()
  assert slow == CallResult(
    "Error: tool 'sleepy' timed out after 0.2 s", 0.0, {}, "Error: tool 'sleepy' timed out after 0.2 s"
  )
  assert fast == CallResult("slept 0", 0.0, {})
  assert sorted(tool.events) == ["create", "create", "execute", "release", "release"]
  assert metrics["tools/calls"] == 2 and metrics["tools/errors"] == 1 and metrics["tools/timeouts"] == 1


def test_a_plain_function_tool_times_out_without_waiting_for_its_thread():
  with ToolRunner({"sleepy": PlainSleepyTool({}, schema("sleepy"))}, max_parallel_calls=1, timeout_s=0.1) as runner:
    start = time.perf_counter()
    (result,) = runner.run_round([(0, ToolCall("sleepy", {"seconds": 1.0}))])
    elapsed = time.perf_counter() - start
  assert result.error == "Error: tool 'sleepy' timed out after 0.1 s"
  assert elapsed < 0.8, elapsed


HUNG_TOOL_SCRIPT = """
import time
from jaxrlhf.tools import BaseTool, OpenAIFunctionToolSchema, ToolCall, ToolResponse, ToolRunner

class Hung(BaseTool):
  def execute(self, instance_id, parameters, **kwargs):
    time.sleep(600)

schema = OpenAIFunctionToolSchema.from_dict({"type": "function", "function": {"name": "hung", "description": "d"}})
runner = ToolRunner({"hung": Hung({}, schema)}, max_parallel_calls=1, timeout_s=0.1)
print(runner.run_round([(0, ToolCall("hung", {}))])[0].error)
"""


def test_a_hung_plain_function_tool_does_not_keep_the_process_alive():
  start = time.perf_counter()
  done = subprocess.run([sys.executable, "-c", HUNG_TOOL_SCRIPT], capture_output=True, text=True, timeout=60)
  assert done.returncode == 0, done.stderr
  assert done.stdout.strip() == "Error: tool 'hung' timed out after 0.1 s"
  assert time.perf_counter() - start < 30


class ExitingTool(BaseTool):
  def execute(self, instance_id, parameters, **kwargs):
    sys.exit(3)


def test_a_tool_calling_sys_exit_is_an_error_of_the_call():
  with ToolRunner({"exit": ExitingTool({}, schema("exit"))}, max_parallel_calls=1, timeout_s=2.0) as runner:
    (result,) = runner.run_round([(0, ToolCall("exit", {}))])
  assert result.error == "Error: tool 'exit' raised RuntimeError: SystemExit: 3"


class RaisingTool(BaseTool):
  async def execute(self, instance_id, parameters, **kwargs):
    raise ValueError(f"bad input {parameters}")

  def release(self, instance_id, **kwargs):
    raise RuntimeError("release failed")


def test_raising_tool_unknown_tool_and_malformed_call_become_error_text():
  tools = {"boom": RaisingTool({}, schema("boom")), "sleepy": SleepyTool("sleepy")}
  with ToolRunner(tools, max_parallel_calls=4, timeout_s=2.0) as runner:
    results = runner.run_round(
      [
        (0, ToolCall("boom", {"x": 1})),
        (0, ToolCall("search", {"q": "jax"})),
        (1, MalformedCall('{"name": "a"', "invalid JSON (Expecting ',' delimiter)")),
        (1, ToolCall("sleepy", {"seconds": 0})),
      ]
    )
    metrics = runner.pop_metrics()
    assert runner.pop_metrics()["tools/calls"] == 0  # popped
  assert [result.error for result in results] == [
    "Error: tool 'boom' raised ValueError: bad input {'x': 1}",
    "Error: unknown tool 'search'; available tools: ['boom', 'sleepy']",
    "Error: malformed tool call (invalid JSON (Expecting ',' delimiter)); "
    'write <tool_call>{"name": ..., "arguments": {...}}</tool_call>',
    None,
  ]
  assert all(result.text == result.error for result in results[:3])
  assert results[3].text == "slept 0"
  assert metrics == {
    "tools/calls": 4.0,
    "tools/errors": 3.0,
    "tools/timeouts": 0.0,
    "tools/raised": 1.0,
    "tools/unknown_tools": 1.0,
    "tools/malformed_calls": 1.0,
    "tools/skipped_calls": 0.0,
    "tools/release_errors": 1.0,
  }


def test_max_parallel_calls_keeps_each_trajectorys_first_calls():
  tool = SleepyTool("sleepy")
  call = ToolCall("sleepy", {"seconds": 0})
  requests = [
    CallRequest(0, call),
    CallRequest(1, call),
    CallRequest(0, call),
    CallRequest(0, call),
    CallRequest(1, call),
  ]
  with ToolRunner({"sleepy": tool}, max_parallel_calls=2, timeout_s=2.0) as runner:
    results = runner.run_round(requests)
    metrics = runner.pop_metrics()
    assert runner.run_round([]) == []
  assert [result is None for result in results] == [False, False, False, True, False]
  assert metrics["tools/calls"] == 4 and metrics["tools/skipped_calls"] == 1
  with ToolRunner({"sleepy": tool}, max_parallel_calls=1, timeout_s=2.0) as runner:  # verl's default
    assert [result is None for result in runner.run_round(requests)] == [False, False, True, True, True]


class ImageTool(BaseTool):
  async def execute(self, instance_id, parameters, **kwargs):
    return ToolResponse(text="look", image=["<image>"]), 0.0, {}


class NoneTool(BaseTool):
  async def execute(self, instance_id, parameters, **kwargs):
    return None


class OldStyleTool(BaseTool):
  async def create(self, instance_id=None, **kwargs):
    return "old-id"  # verl before 0.5 returned the id alone

  async def execute(self, instance_id, parameters, **kwargs):
    return f"text from {instance_id}", None, None  # and the text alone


def test_interface_violations_stop_the_round_with_the_tool_named():
  for tool_class, message in [
    (ImageTool, "tool 't' returned image content; rollouts here are text-only"),
    (NoneTool, r"tool 't': execute\(\) returned None; expected \(ToolResponse, step_reward, metrics\)"),
  ]:
    with ToolRunner({"t": tool_class({}, schema("t"))}, max_parallel_calls=1, timeout_s=2.0) as runner:
      with pytest.raises(ToolError, match=message):
        runner.run_round([(0, ToolCall("t", {}))])
  with ToolRunner({"t": OldStyleTool({}, schema("t"))}, max_parallel_calls=1, timeout_s=2.0) as runner:
    assert runner.run_round([(0, ToolCall("t", {}))]) == [CallResult("text from old-id", 0.0, {})]


def test_long_responses_are_truncated_as_verl():
  assert truncate_response("abcdefghij", 4, "left") == "(truncated)...ghij"
  assert truncate_response("abcdefghij", 4, "right") == "abcd...(truncated)"
  assert truncate_response("abcdefghij", 4, "middle") == "ab...(truncated)...ij"
  assert truncate_response("abcd", 4, "middle") == "abcd"
  tool = LookupTool({}, schema("lookup"))
  with ToolRunner({"lookup": tool}, max_parallel_calls=1, timeout_s=2.0, max_response_length=4) as runner:
    (result,) = runner.run_round([(0, ToolCall("lookup", {}), {"table": {"k": "abcdefghij"}})])
  assert result.text == "ab...(truncated)...ij"
  with ToolRunner({"boom": RaisingTool({}, schema("boom"))}, 1, 2.0, max_response_length=10) as runner:
    (result,) = runner.run_round([(0, ToolCall("boom", {"x": "y" * 100}))])
  assert result.text == "Error...(truncated)...yyy'}" and result.error.startswith(
    "Error: tool 'boom' raised ValueError"
  )


def test_runner_argument_errors():
  tools = {"t": SleepyTool("t")}
  with pytest.raises(ToolConfigError, match="max_parallel_calls must be an integer >= 1, got 0"):
    ToolRunner(tools, max_parallel_calls=0, timeout_s=1.0)
  with pytest.raises(ToolConfigError, match="timeout must be a number of seconds > 0, got -1"):
    ToolRunner(tools, max_parallel_calls=1, timeout_s=-1)
  with pytest.raises(ToolConfigError, match=r"truncate_side must be one of \['left', 'middle', 'right'\]"):
    ToolRunner(tools, max_parallel_calls=1, timeout_s=1.0, truncate_side="top")
  with pytest.raises(ToolConfigError, match="tool 'x' is a dict, not a jaxrlhf.tools.BaseTool"):
    ToolRunner({"x": {}}, max_parallel_calls=1, timeout_s=1.0)


def test_a_tool_without_a_schema_is_refused():
  with pytest.raises(ToolConfigError, match="tool class BaseTool got no tool_schema and defines none"):
    BaseTool({}, None)
  tool = BaseTool({}, schema("plain"))
  instance, response = run(tool.create())
  assert len(instance) == 36 and response.is_empty()
  assert run(tool.execute(instance, {})) == (ToolResponse(text="Updated the tool state."), 0.0, {})
  assert run(tool.calc_reward(instance)) == 0.0 and run(tool.release(instance)) is None
