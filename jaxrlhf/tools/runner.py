"""Running one round of tool calls for a whole batch on the host, in parallel (docs/tools.md).

After a generation turn the host loop parses each trajectory's calls (`jaxrlhf.tools.hermes`) and hands them all
to `ToolRunner.run_round`, which returns one `CallResult` per call: the text of the tool message the policy reads
next, the step reward and the tool's metrics. Per call, as in verl's tool agent loop, the runner

* keeps the first `max_parallel_calls` calls of each trajectory and drops the rest (no result, no tool message);
* answers a malformed call or an unknown tool name with an error message;
* creates a tool instance from the trajectory's `create_kwargs`, executes the call on it and releases it,
  also when the call failed: one instance per call, never shared between calls or trajectories;
* truncates a long response to `max_response_length` characters (verl's `max_tool_response_length`; here error
  messages too, since an exception's text can be of any length).

Beyond verl: each call has `timeout_s` (create and execute together; release gets its own `timeout_s`), and a
timeout or an exception the tool raises becomes an `Error: ...` message, so one bad call never stops the rollout.
A tool that breaks the interface (returns something other than `(ToolResponse, reward, metrics)`, or images)
stops it with a `ToolError` naming the tool, since every later call would do the same.

Async tool methods run on one event loop the runner owns, in a background thread; a plain-function method runs in
a thread of its own. All calls of a round run concurrently. A plain function that times out keeps its thread until
it returns (Python cannot stop a thread) and its result is discarded; the threads are daemons, so a tool that never
returns does not keep the process from exiting.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import inspect
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from jaxrlhf.errors import UserError
from jaxrlhf.tools.base import BaseTool, ToolConfigError, ToolResponse
from jaxrlhf.tools.hermes import MalformedCall, ToolCall

TRUNCATE_SIDES = ("left", "middle", "right")
METRIC_PREFIX = "tools/"
COUNTERS = (
  "calls",
  "errors",
  "timeouts",
  "raised",
  "unknown_tools",
  "malformed_calls",
  "skipped_calls",
  "release_errors",
)

_log = logging.getLogger(__name__)


class ToolError(UserError, RuntimeError):
  """A tool broke the interface: `create` or `execute` returned the wrong thing, or a response carried images."""


class CallRequest(NamedTuple):
  """One call to run: which trajectory made it, the parsed call, and that trajectory's `create_kwargs` for the
  tool it names (a row's `extra_info.tools_kwargs[name].create_kwargs`; None for none)."""

  trajectory_index: int
  call: ToolCall | MalformedCall
  create_kwargs: Mapping[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class CallResult:
  """What one call gave: `text` for the tool message, `step_reward`, the tool's `metrics`, and `error` (the message
  in full; `text` is it truncated) when the call failed, else None. A failed call's step reward is 0.0, as in verl."""

  text: str
  step_reward: float
  metrics: dict[str, Any]
  error: str | None = None


def truncate_response(text: str, max_length: int, side: str = "middle") -> str:
  """`text` cut to `max_length` characters plus a marker, keeping its start, end or both (verl's rule)."""
  if len(text) <= max_length:
    return text
  if side == "left":
    return "(truncated)..." + text[-max_length:]
  if side == "right":
    return text[:max_length] + "...(truncated)"
  half = max_length // 2
  return text[:half] + "...(truncated)..." + (text[-half:] if half else "")


def _instance_id_of(created: Any, tool: BaseTool) -> str:
  # verl 0.9's create returns (instance_id, ToolResponse); tools written for older verl return the id alone.
  if isinstance(created, tuple) and created and isinstance(created[0], str):
    return created[0]
  if isinstance(created, str):
    return created
  raise ToolError(f"tool {tool.name!r}: create() returned {created!r}; expected (instance_id, ToolResponse)")


def _checked_result(returned: Any, tool: BaseTool) -> tuple[ToolResponse, float, dict[str, Any]]:
  if not (isinstance(returned, (tuple, list)) and len(returned) == 3):
    raise ToolError(
      f"tool {tool.name!r}: execute() returned {returned!r}; expected (ToolResponse, step_reward, metrics)"
    )
  response, reward, metrics = returned
  if isinstance(response, str):  # older verl tools return the text itself
    response = ToolResponse(text=response)
  if not isinstance(response, ToolResponse):
    raise ToolError(
      f"tool {tool.name!r}: execute() returned a {type(response).__name__} as its response, not a ToolResponse"
    )
  if response.image or response.video:
    raise ToolError(
      f"tool {tool.name!r} returned {'image' if response.image else 'video'} content; rollouts here are text-only "
      "(ToolResponse.text)"
    )
  try:
    reward = 0.0 if reward is None else float(reward)
  except (TypeError, ValueError):
    raise ToolError(f"tool {tool.name!r}: execute() returned step reward {reward!r}, not a number") from None
  if metrics is not None and not isinstance(metrics, Mapping):
    raise ToolError(f"tool {tool.name!r}: execute() returned metrics {metrics!r}, not a dict")
  return response, reward, dict(metrics or {})


class ToolRunner:
  """Runs rounds of tool calls: `tools` by name (`load_tools`), at most `max_parallel_calls` calls per trajectory
  per round, each within `timeout_s` seconds. `max_response_length` (None: no limit) and `truncate_side` cut long
  responses as verl does. `num_threads` bounds the plain-function tool methods running at once (not counting
  those that timed out).

  The event loop starts at the first round and stays until `close()` (a round after it starts it again); use the
  runner as a context manager to close it. Counters of calls, errors, timeouts and dropped calls accumulate until
  `pop_metrics()`.
  """

  def __init__(
    self,
    tools: Mapping[str, BaseTool],
    max_parallel_calls: int,
    timeout_s: float,
    *,
    max_response_length: int | None = None,
    truncate_side: str = "middle",
    num_threads: int = 64,
  ):
    for name, tool in tools.items():
      if not isinstance(tool, BaseTool):
        raise ToolConfigError(f"tool {name!r} is a {type(tool).__name__}, not a jaxrlhf.tools.BaseTool")
    if isinstance(max_parallel_calls, bool) or not isinstance(max_parallel_calls, int) or max_parallel_calls < 1:
      raise ToolConfigError(f"max_parallel_calls must be an integer >= 1, got {max_parallel_calls!r}")
    if not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
      raise ToolConfigError(f"the tool call timeout must be a number of seconds > 0, got {timeout_s!r}")
    if max_response_length is not None and (not isinstance(max_response_length, int) or max_response_length < 1):
      raise ToolConfigError(f"max_tool_response_length must be an integer >= 1 or None, got {max_response_length!r}")
    if truncate_side not in TRUNCATE_SIDES:
      raise ToolConfigError(f"tool_response_truncate_side must be one of {list(TRUNCATE_SIDES)}, got {truncate_side!r}")
    self.tools = dict(tools)
    self.max_parallel_calls = max_parallel_calls
    self.timeout_s = float(timeout_s)
    self.max_response_length = max_response_length
    self.truncate_side = truncate_side
    self.num_threads = num_threads
    self._counters: collections.Counter[str] = collections.Counter()
    self._lock = threading.Lock()
    self._loop: asyncio.AbstractEventLoop | None = None
    self._loop_thread: threading.Thread | None = None
    self._thread_slots: asyncio.Semaphore | None = None

  # ----- the round -------------------------------------------------------------------------------

  def run_round(self, requests: Sequence[CallRequest | tuple]) -> list[CallResult | None]:
    """Runs the calls concurrently; one result per request, in order. None marks a call beyond its trajectory's
    first `max_parallel_calls` in this round: verl drops it, so it gets no tool message."""
    requests = [CallRequest(*request) for request in requests]
    kept: list[int] = []
    calls_so_far: collections.Counter[int] = collections.Counter()
    for position, request in enumerate(requests):
      calls_so_far[request.trajectory_index] += 1
      if calls_so_far[request.trajectory_index] <= self.max_parallel_calls:
        kept.append(position)
    self._count(calls=len(kept), skipped_calls=len(requests) - len(kept))
    results: list[CallResult | None] = [None] * len(requests)
    if not kept:
      return results
    future = asyncio.run_coroutine_threadsafe(self._round([requests[i] for i in kept]), self._started_loop())
    for position, result in zip(kept, future.result()):
      results[position] = result
    return results

  async def _round(self, requests: list[CallRequest]) -> list[CallResult]:
    outcomes = await asyncio.gather(*(self._run_call(request) for request in requests), return_exceptions=True)
    for outcome in outcomes:  # every call has finished and released before a broken tool stops the round
      if isinstance(outcome, BaseException):
        raise outcome
    return outcomes

  async def _run_call(self, request: CallRequest) -> CallResult:
    call = request.call
    if isinstance(call, MalformedCall):
      self._count(errors=1, malformed_calls=1)
      return self._error(
        f'Error: malformed tool call ({call.error}); write <tool_call>{{"name": ..., "arguments": {{...}}}}</tool_call>'
      )
    tool = self.tools.get(call.name)
    if tool is None:
      self._count(errors=1, unknown_tools=1)
      return self._error(f"Error: unknown tool {call.name!r}; available tools: {sorted(self.tools)}")

    instance_id = None
    scope = asyncio.timeout(self.timeout_s)
    try:
      async with scope:
        created = await self._invoke(tool.create, create_kwargs=dict(request.create_kwargs or {}))
        instance_id = _instance_id_of(created, tool)
        returned = await self._invoke(tool.execute, instance_id, dict(call.arguments))
    except ToolError:
      raise
    except TimeoutError as error:
      if scope.expired():
        self._count(errors=1, timeouts=1)
        return self._error(f"Error: tool {tool.name!r} timed out after {self.timeout_s:g} s")
      return self._raised(tool, error)
    except Exception as error:
      return self._raised(tool, error)
    finally:
      if instance_id is not None:
        await self._release(tool, instance_id)

    response, step_reward, metrics = _checked_result(returned, tool)
    return CallResult(self._truncated(response.text or ""), step_reward, metrics)

  async def _release(self, tool: BaseTool, instance_id: str) -> None:
    # A failed release leaves the call's answer as it was: the policy did nothing wrong.
    try:
      async with asyncio.timeout(self.timeout_s):
        await self._invoke(tool.release, instance_id)
    except Exception as error:
      self._count(release_errors=1)
      _log.warning("tool %r: release(%r) failed: %s: %s", tool.name, instance_id, type(error).__name__, error)

  async def _invoke(self, method, *args, **kwargs) -> Any:
    """Awaits an async tool method; runs a plain one in a thread (its result awaited if it is awaitable)."""
    if inspect.iscoroutinefunction(method):
      result = await method(*args, **kwargs)
    else:
      async with self._thread_slots:
        result = await self._in_thread(functools.partial(method, *args, **kwargs))
    if inspect.isawaitable(result):
      result = await result
    return result

  @staticmethod
  async def _in_thread(fn) -> Any:
    # A daemon thread per call rather than a ThreadPoolExecutor, whose threads the interpreter joins at exit: a
    # plain-function tool that never returns would keep the process alive after training.
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(result, error):
      if future.done():  # cancelled: the call timed out
        return
      if error is not None:
        future.set_exception(error)
      else:
        future.set_result(result)

    def target():
      try:
        outcome = (fn(), None)
      except Exception as error:
        outcome = (None, error)
      except BaseException as error:  # sys.exit() in a tool: an error of the call, not of the event loop
        outcome = (None, RuntimeError(f"{type(error).__name__}: {error}"))
      try:
        loop.call_soon_threadsafe(settle, *outcome)
      except RuntimeError:  # the runner closed its loop while this call ran past its timeout
        pass

    threading.Thread(target=target, name="jaxrlhf-tool-call", daemon=True).start()
    return await future

  def _raised(self, tool: BaseTool, error: Exception) -> CallResult:
    self._count(errors=1, raised=1)
    return self._error(f"Error: tool {tool.name!r} raised {type(error).__name__}: {error}")

  def _error(self, message: str) -> CallResult:
    return CallResult(self._truncated(message), 0.0, {}, message)

  def _truncated(self, text: str) -> str:
    if self.max_response_length is None:
      return text
    return truncate_response(text, self.max_response_length, self.truncate_side)

  # ----- counters and life cycle -----------------------------------------------------------------

  def _count(self, **increments: int) -> None:
    with self._lock:
      self._counters.update(increments)

  def pop_metrics(self) -> dict[str, float]:
    """The counters since the last call (`tools/calls`, `tools/errors`, `tools/timeouts`, ...), then zeroed.

    `calls` counts calls run (kept ones); `errors` counts those answered with an error, of which `timeouts`,
    `raised` (the tool raised), `unknown_tools` and `malformed_calls` say why; `skipped_calls` counts calls
    dropped beyond `max_parallel_calls`; `release_errors` counts releases that failed (not errors of the call).
    """
    with self._lock:
      counters, self._counters = self._counters, collections.Counter()
    return {METRIC_PREFIX + name: float(counters[name]) for name in COUNTERS}

  def _started_loop(self) -> asyncio.AbstractEventLoop:
    with self._lock:
      if self._loop is None:
        self._thread_slots = asyncio.Semaphore(self.num_threads)
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._loop.run_forever, name="jaxrlhf-tool-loop", daemon=True)
        self._loop_thread.start()
      return self._loop

  def close(self) -> None:
    """Stops the event loop (threads of timed-out calls are left to finish)."""
    with self._lock:
      loop, thread = self._loop, self._loop_thread
      self._loop = self._loop_thread = self._thread_slots = None
    if loop is not None:
      loop.call_soon_threadsafe(loop.stop)
      thread.join(timeout=5.0)
      if not thread.is_alive():
        loop.close()

  def __enter__(self) -> ToolRunner:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()
