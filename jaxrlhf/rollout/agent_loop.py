"""The host side of multi-turn rollouts: verl's tool agent loop over a whole batch (docs/architecture.md,
"Multi-turn rollouts"; docs/tools.md).

Every trajectory goes through verl's states: generating (a turn of the compiled `rollout.turns.run_turn`, all live
rows at once), then on the host: the turn is decoded, its tool calls parsed (`format`: hermes), the calls of every
trajectory run together (`execute`: in parallel, with a timeout), and their responses are rendered through the chat
template and given back to the device as the next turn's forced tokens, out of the loss. verl's termination rules,
in its order after each assistant turn: the response budget is used up; `max_assistant_turns` reached;
`max_user_turns` reached; the turn has no tool call. A tool response that would not fit the response budget ends the
trajectory without being appended (verl drops it too). `max_parallel_calls`: the calls of a turn beyond it are not
run. Unlike verl, a malformed call (bad JSON, no name) is answered with an error text, as an unknown tool is,
instead of being dropped: the policy sees what went wrong, and the call counts as a tool error.

One compiled program per turn (whatever the tool responses' lengths: they are padded to the response budget), one
host round trip per turn: the turn's tokens come back, the forced tokens go out. The KV cache never leaves the
device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class TurnLimits:
  """verl's `MultiTurnConfig` settings the loop reads."""

  max_assistant_turns: int | None = None
  max_user_turns: int | None = None
  max_parallel_calls: int = 1

  @classmethod
  def from_config(cls, multi_turn) -> TurnLimits:
    return cls(
      max_assistant_turns=multi_turn.max_assistant_turns,
      max_user_turns=multi_turn.max_user_turns,
      max_parallel_calls=int(multi_turn.max_parallel_calls),
    )


@dataclasses.dataclass
class Trajectory:
  """One row's multi-turn bookkeeping on the host."""

  assistant_turns: int = 0
  user_turns: int = 0
  tool_calls: int = 0  # calls run
  tool_errors: int = 0  # calls that returned an error text (malformed, unknown tool, raised, timed out)
  tool_rewards: list = dataclasses.field(default_factory=list)  # each call's step reward (verl's `tool_rewards`)
  done: bool = False

  @property
  def num_turns(self) -> int:
    """verl's count: assistant turns + tool turns + 1 (2 for a trajectory that calls no tool)."""
    return self.assistant_turns + self.user_turns + 1


def trajectory_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
  """verl's `num_turns/{min,max,mean}` and `tool_call_counts/{min,max,mean}`; the tool errors per trajectory
  (`tool_errors/mean`) and the share of trajectories that called a tool and got a result from every call
  (`tool_calls/success_rate`)."""
  metrics = {}
  for name, values in (
    ("num_turns", [t.num_turns for t in trajectories]),
    ("tool_call_counts", [t.tool_calls for t in trajectories]),
  ):
    values = np.asarray(values, np.float64)
    metrics.update({f"{name}/min": values.min(), f"{name}/max": values.max(), f"{name}/mean": values.mean()})
  metrics["tool_errors/mean"] = np.mean([t.tool_errors for t in trajectories])
  metrics["tool_calls/success_rate"] = np.mean([t.tool_calls > 0 and not t.tool_errors for t in trajectories])
  return {name: float(value) for name, value in metrics.items()}


TOOL_CALL_CLOSE = "</tool_call>"


def tool_call_close_ids(tokenizer) -> tuple[int, ...]:
  """The ids of the tokens whose text ends a hermes tool call (`</tool_call>`: one token in Qwen's vocabulary): a
  turn also ends at one of them, so the policy does not spend tokens after its call."""
  return tuple(sorted(i for token, i in tokenizer.get_vocab().items() if token.endswith(TOOL_CALL_CLOSE)))


class ToolMessages:
  """Tool responses as the tokens the chat template puts after an assistant turn: the template's rendering of
  [user, assistant, *tool messages] with the generation prompt, after what it renders for [user, assistant] up to
  the end-of-turn token (what the policy itself samples). A turn that ended at a tool call's close instead of EOS
  gets the end-of-turn token first, forced like the rest."""

  _BASE = ({"role": "user", "content": "U"}, {"role": "assistant", "content": "A"})

  def __init__(self, tokenizer, tool_schemas: Sequence[dict] | None = None):
    self.tokenizer = tokenizer
    self.kwargs = {"tools": list(tool_schemas)} if tool_schemas else {}
    if not getattr(tokenizer, "chat_template", None):
      raise ValueError(
        "multi-turn rollouts need a tokenizer with a chat template (tool responses are rendered through it)"
      )
    self.base_text = self._render(list(self._BASE), add_generation_prompt=False)
    eos = tokenizer.eos_token or ""
    # What the template writes after the assistant's end-of-turn token (e.g. Qwen's "\n" after <|im_end|>).
    cut = self.base_text.rfind(eos) if eos else -1
    self.after_eos = self.base_text[cut + len(eos) :] if cut >= 0 else ""

  def _render(self, messages, add_generation_prompt: bool) -> str:
    return self.tokenizer.apply_chat_template(
      messages, add_generation_prompt=add_generation_prompt, tokenize=False, **self.kwargs
    )

  def text(self, contents: Sequence[str]) -> str:
    full = self._render(
      list(self._BASE) + [{"role": "tool", "content": c} for c in contents], add_generation_prompt=True
    )
    if not full.startswith(self.base_text):
      raise ValueError(
        "the chat template renders an assistant turn differently once tool messages follow it; jaxrlhf appends "
        "tool responses as the template's continuation of a conversation and cannot with this template"
      )
    return self.after_eos + full[len(self.base_text) :]

  def tokens(self, contents: Sequence[str], ended_at_eos: bool = True) -> list[int]:
    tokens = list(self.tokenizer(self.text(contents), add_special_tokens=False)["input_ids"])
    return tokens if ended_at_eos else [self.tokenizer.eos_token_id] + tokens


@dataclasses.dataclass(frozen=True)
class CallOutcome:
  """What one tool call gave the trajectory: the response text the policy sees (truncated as verl does), the step
  reward, and whether it was an error (malformed call, unknown tool, an exception, a timeout)."""

  text: str
  reward: float | None = None
  error: bool = False


class ToolAgentLoop:
  """Runs turns until every trajectory of the batch has ended.

  `parse(text) -> list of calls`; `execute([(row, call, tools_kwargs), ...]) -> [CallOutcome, ...]` runs one round
  of calls of every trajectory (in parallel, with a timeout: `jaxrlhf.tools`); `tools_kwargs` is the row's
  `extra_info.tools_kwargs` (verl's per-tool `create_kwargs`).
  """

  def __init__(
    self,
    tokenizer,
    limits: TurnLimits,
    parse: Callable[[str], list],
    execute: Callable[[list[tuple[int, Any, dict]]], list[CallOutcome]],
    tool_messages: ToolMessages,
    eos_token_ids: Sequence[int],
  ):
    self.eos_token_ids = set(int(i) for i in eos_token_ids)
    self.tokenizer = tokenizer
    self.limits = limits
    self.parse = parse
    self.execute = execute
    self.tool_messages = tool_messages

  def run(self, state, turn: Callable, response_length: int, tools_kwargs: Sequence[dict]):
    """`state`: `rollout.turns.start_turns`'s; `turn(state, forced_NxR, forced_len_N, live_N) -> state` runs one
    turn (`run_turn` with the policy's weights bound); `tools_kwargs`: each row's. Returns (the final state, one
    `Trajectory` per row)."""
    rows = int(state.length.shape[0])
    trajectories = [Trajectory() for _ in range(rows)]
    live = np.ones(rows, bool)
    forced = np.zeros((rows, response_length), np.int32)
    forced_len = np.zeros(rows, np.int32)
    limits = self.limits
    while live.any():
      # The turn's own tokens follow the forced ones it starts with.
      sampled_from = np.asarray(state.length) + forced_len
      state = turn(state, forced, forced_len, live)
      responses, length = (np.asarray(x) for x in (state.responses, state.length))
      # New host buffers each turn: JAX on CPU may share a NumPy argument's memory while the program runs.
      forced = np.zeros((rows, response_length), np.int32)
      forced_len = np.zeros(rows, np.int32)
      calls = []  # (row, call, tools_kwargs)
      ended_at_eos = {}
      for row in np.flatnonzero(live):
        trajectory = trajectories[row]
        trajectory.assistant_turns += 1
        text = self.tokenizer.decode(responses[row, sampled_from[row] : length[row]].tolist())
        ended = (
          length[row] >= response_length
          or (limits.max_assistant_turns and trajectory.assistant_turns >= limits.max_assistant_turns)
          or (limits.max_user_turns and trajectory.user_turns >= limits.max_user_turns)
        )
        row_calls = [] if ended else self.parse(text)[: limits.max_parallel_calls]
        if not row_calls:
          trajectory.done = True
          continue
        ended_at_eos[row] = int(responses[row, length[row] - 1]) in self.eos_token_ids
        calls.extend((row, call, tools_kwargs[row]) for call in row_calls)
      outcomes = self.execute(calls) if calls else []
      by_row: dict[int, list[CallOutcome]] = {}
      for (row, _, _), outcome in zip(calls, outcomes):
        by_row.setdefault(row, []).append(outcome)
      live = np.zeros(rows, bool)
      for row, row_outcomes in by_row.items():
        trajectory = trajectories[row]
        trajectory.tool_calls += len(row_outcomes)
        trajectory.tool_errors += sum(o.error for o in row_outcomes)
        trajectory.tool_rewards.extend(o.reward for o in row_outcomes if o.reward is not None)
        tokens = self.tool_messages.tokens([o.text for o in row_outcomes], ended_at_eos[row])
        if length[row] + len(tokens) >= response_length:  # verl: the response would not fit; it ends here
          trajectory.done = True
          continue
        forced[row, : len(tokens)] = tokens
        forced_len[row] = len(tokens)
        trajectory.user_turns += 1
        live[row] = True
    return state, trajectories
