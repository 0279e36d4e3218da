"""Phase `gen` of a multi-turn rollout (`actor_rollout_ref.rollout.multi_turn`; docs/architecture.md, "Multi-turn
rollouts"): a host loop of compiled programs instead of one program.

Programs: the actor's weights in the generation layout (once per rollout), the prompts' prefill, one turn (every live
trajectory at once: `rollout.turns.run_turn`), and the record in the train layout. Between turns the host decodes,
parses and runs the tool calls (`rollout.agent_loop.ToolAgentLoop`, `jaxrlhf.tools`). The training phases after it
stay one program (`PhasedStep.train_on_rollout`).
"""

from __future__ import annotations

import functools
import json
import time

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxrlhf.parallel import batch_sharding
from jaxrlhf.rollout import SamplingParams
from jaxrlhf.rollout.agent_loop import (
  CallOutcome,
  ToolAgentLoop,
  ToolMessages,
  TurnLimits,
  tool_call_close_ids,
  trajectory_metrics,
)
from jaxrlhf.rollout.turns import run_turn, start_turns
from jaxrlhf.tools.hermes import MalformedCall, parse_tool_calls
from jaxrlhf.tools.runner import ToolRunner
from jaxrlhf.trainer.records import Rollout

PARSERS = {"hermes": parse_tool_calls}  # multi_turn.format -> text -> (content, calls)


def create_kwargs(call, tools_kwargs: dict) -> dict | None:
  """The `create_kwargs` a row gives the tool a call names (verl reads only these of `tools_kwargs[name]`)."""
  if isinstance(call, MalformedCall):
    return None
  return (tools_kwargs.get(call.name) or {}).get("create_kwargs")


def tools_kwargs_notes(extra_infos, tool_names, key: str) -> list[str]:
  """What is off in the rows' `extra_info.tools_kwargs` (verl reads them without a check): rows that say
  `need_tools_kwargs` and have none, and kwargs for a tool the config does not have (a typo gives that tool no
  `create_kwargs`). One line per kind, naming the data key, a count and the first row."""
  missing, unknown = [], {}
  for row, info in enumerate(extra_infos):
    kwargs = info.get("tools_kwargs") or {}
    if not isinstance(kwargs, dict):
      raise ValueError(
        f"{key} row {row}: extra_info.tools_kwargs must be a mapping of tool name -> kwargs, got {kwargs!r}"
      )
    if info.get("need_tools_kwargs") and not kwargs:
      missing.append(row)
    for name in kwargs:
      if name not in tool_names:
        unknown.setdefault(name, row)
  notes = []
  if missing:
    notes.append(
      f"{key}: {len(missing)} rows have extra_info.need_tools_kwargs but no tools_kwargs (first: row {missing[0]}); "
      "their tools are created without create_kwargs"
    )
  for name, row in unknown.items():
    notes.append(
      f"{key}: extra_info.tools_kwargs names tool {name!r} (first: row {row}), which the tool config does not "
      f"have ({sorted(tool_names)}); it is never read"
    )
  return notes


def max_tool_calls(multi_turn, response_length: int) -> int:
  """A bound on one trajectory's tool calls (the width of `Rollout.tool_rewards`): a tool turn takes at least two
  response tokens (one sampled, one of the response), and `max_parallel_calls` calls at most."""
  turns = response_length // 2
  if multi_turn.max_assistant_turns:
    turns = min(turns, multi_turn.max_assistant_turns)
  if multi_turn.max_user_turns:
    turns = min(turns, multi_turn.max_user_turns)
  return max(1, turns * multi_turn.max_parallel_calls)


class TurnPrograms:
  """The compiled programs of a multi-turn rollout with one sampling setting: `weights(actor) -> params` (the
  actor's weights in the generation layout and the rollout dtype, `Generation.generation_params`),
  `start(params, prompts_NxP, prompt_mask_NxP, rng) -> TurnState` (the prefill) and
  `turn(params, state, forced_NxR, forced_len_N, live_N) -> TurnState` (one turn; the state is donated: the KV cache
  is updated in place). `stop_ids`: tokens that also end a turn (a tool call's close)."""

  def __init__(self, ppo, sampling: SamplingParams, stop_ids: tuple[int, ...] = (), weights=None):
    generation = ppo.generation
    layouts = generation.layouts
    model = generation.decode_model
    self.weights = weights or jax.jit(generation.generation_params)

    @jax.jit
    def start(params, prompts_NxP, prompt_mask_NxP, rng):
      prompts_NxP, prompt_mask_NxP = layouts.to_generation_batch((prompts_NxP, prompt_mask_NxP))
      return start_turns(model, params, prompts_NxP, prompt_mask_NxP, rng, sampling, generation.constrain_cache)

    @functools.partial(jax.jit, donate_argnums=1)
    def turn(params, state, forced_NxR, forced_len_N, live_N):
      forced_NxR, forced_len_N, live_N = layouts.to_generation_batch((forced_NxR, forced_len_N, live_N))
      return run_turn(
        model, params, state, forced_NxR, forced_len_N, live_N, sampling, generation.constrain_cache, stop_ids
      )

    self.start, self.turn = start, turn


class MultiTurnGeneration:
  """The host loop: `rollout(actor, batch, rng) -> (Rollout, metrics)`, what `PPOStep.rollout` is for one-turn
  rollouts (the metrics: the trajectories' turns and tool calls, the tools' time); `actor`: the actor's weights
  (`RoleState.weights`). The generation mode around it is `step_modes.MultiTurn`."""

  def __init__(self, ppo, tokenizer, dataset, put, tools):
    """`dataset`: the training rows (their `extra_info.tools_kwargs`); `put`: host arrays -> the batch layout;
    `tools`: by name (`jaxrlhf.tools.load_tools`)."""
    config = ppo.config
    self.config = config
    self.ppo = ppo
    self.multi_turn = multi_turn = config.actor_rollout_ref.rollout.multi_turn
    self.sampling = ppo.sampling
    self.dataset = dataset
    self.put = put
    self.response_length = config.data.max_response_length
    self.tools = tools
    schemas = [tool.tool_schema.to_dict() for tool in self.tools.values()]
    self.runner = ToolRunner(
      self.tools,
      multi_turn.max_parallel_calls,
      multi_turn.tool_timeout_s,
      max_response_length=multi_turn.max_tool_response_length,
      truncate_side=multi_turn.tool_response_truncate_side,
    )
    self.loop = ToolAgentLoop(
      tokenizer,
      TurnLimits.from_config(multi_turn),
      self._parse,
      self._execute,
      ToolMessages(tokenizer, schemas),
      ppo.sampling.eos_token_ids,
    )
    # One call per turn runs (verl drops the rest): the turn may end where the call closes. With more, the policy
    # writes them all, then EOS.
    self.stop_ids = tool_call_close_ids(tokenizer) if multi_turn.max_parallel_calls == 1 else ()
    self.tool_seconds = 0.0
    self._own_rows: np.ndarray | None = None  # [N] bool: the rows whose tool calls this process runs (several)
    self._programs: dict[SamplingParams, TurnPrograms] = {}

  def programs(self, sampling: SamplingParams) -> TurnPrograms:
    """The turn programs of `sampling` (training, validation), built once each; they share the weights program."""
    if sampling not in self._programs:
      shared = next(iter(self._programs.values()), None)
      self._programs[sampling] = TurnPrograms(
        self.ppo, sampling, self.stop_ids, weights=shared.weights if shared else None
      )
    return self._programs[sampling]

  # ----- tools --------------------------------------------------------------------------------------

  def _parse(self, text: str) -> list:
    return PARSERS[self.multi_turn.format](text)[1]

  def _execute(self, calls) -> list[CallOutcome]:
    """The round's calls' outcomes. Under several processes each runs the calls of its own rows (`_own_rows`) and
    every process gets every outcome (`_share_outcomes`): the loop goes on alike everywhere."""
    own = [i for i, (row, _, _) in enumerate(calls) if self._own_rows is None or self._own_rows[row]]
    start = time.perf_counter()
    results = self.runner.run_round(
      [(row, call, create_kwargs(call, kwargs)) for row, call, kwargs in (calls[i] for i in own)]
    )
    self.tool_seconds += time.perf_counter() - start
    outcomes = {}
    for i, r in zip(own, results):
      error = r.error is not None or isinstance(calls[i][1], MalformedCall)
      outcomes[i] = CallOutcome(text=r.text, reward=r.step_reward, error=error)
    if self._own_rows is not None:
      outcomes = _share_outcomes(outcomes)
    return [outcomes[i] for i in range(len(calls))]

  # ----- the phase ----------------------------------------------------------------------------------

  def trajectories(self, actor, prompts_NxP, prompt_mask_NxP, sample_index_N, rng, sampling: SamplingParams, dataset):
    """Every row's trajectory: (the final `TurnState` on the host, one `Trajectory` per row)."""
    programs = self.programs(sampling)
    params = programs.weights(actor)
    state = programs.start(params, prompts_NxP, prompt_mask_NxP, rng)
    tools_kwargs = [dataset.extra_infos[i].get("tools_kwargs") or {} for i in np.asarray(sample_index_N).tolist()]
    turn = lambda state, *inputs: programs.turn(params, state, *inputs)
    self.tool_seconds = 0.0
    if jax.process_count() == 1:
      state, trajectories = self.loop.run(state, turn, self.response_length, tools_kwargs)
      return jax.device_get(state), trajectories
    # Several processes: each runs the loop over every row (the same on all), the tool calls of its own rows.
    rows = len(tools_kwargs)
    sharding = batch_sharding(self.ppo.layouts.mesh, (rows,))
    self._own_rows = np.zeros(rows, bool)
    for index in sharding.addressable_devices_indices_map((rows,)).values():
      self._own_rows[index] = True
    try:
      gathered_turn = lambda gathered, *inputs: _GatheredTurns(turn(gathered.state, *inputs))
      gathered, trajectories = self.loop.run(_GatheredTurns(state), gathered_turn, self.response_length, tools_kwargs)
    finally:
      self._own_rows = None
    state = gathered.state
    state = state.replace(decode=state.decode.replace(cache=None))  # the host reads the rows, not the cache
    return jax.tree.map(_gather, state), trajectories

  def trajectory_arrays(self, trajectories) -> tuple[np.ndarray, np.ndarray]:
    """(num_turns [N] int32, tool_rewards [N, C] float32 with NaN past each row's calls): what the reward function
    sees of each trajectory (`reward.trajectory_infos`), as arrays a record carries."""
    calls = max_tool_calls(self.multi_turn, self.response_length)
    tool_rewards = np.full((len(trajectories), calls), np.nan, np.float32)
    for row, trajectory in enumerate(trajectories):
      kept = trajectory.tool_rewards[:calls]
      tool_rewards[row, : len(kept)] = kept
    return np.asarray([t.num_turns for t in trajectories], np.int32), tool_rewards

  def rollout(self, actor, batch, rng) -> tuple[Rollout, dict[str, float]]:
    """(the record in the batch layout, the trajectories' metrics and the tools' counts and time)."""
    n = self.config.actor_rollout_ref.rollout.n
    prompts_NxP, prompt_mask_NxP, sample_index_N = (
      np.repeat(_on_host(batch[key]), n, axis=0) for key in ("input_ids", "attention_mask", "sample_index")
    )
    state, trajectories = self.trajectories(
      actor, prompts_NxP, prompt_mask_NxP.astype(np.int32), sample_index_N, rng, self.sampling, self.dataset
    )
    metrics = {
      **trajectory_metrics(trajectories),
      **self.runner.pop_metrics(),  # tools/{calls, errors, timeouts, raised, unknown_tools, malformed_calls, ...}
      "timing_s/tool_calls": self.tool_seconds,
    }
    num_turns, tool_rewards = self.trajectory_arrays(trajectories)
    record = rollout_record(
      n, prompts_NxP, prompt_mask_NxP, sample_index_N, state, state.sequence_mask(), num_turns, tool_rewards
    )
    return self.put(record), metrics


def _gather(x) -> np.ndarray:
  """A global array's whole value, on every process (each holds its own devices' part)."""
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _on_host(x) -> np.ndarray:
  """An array's whole value on the host: gathered from every process when this one holds only its part."""
  return np.asarray(jax.device_get(x)) if x.is_fully_addressable else _gather(x)


class _GatheredTurns:
  """A `TurnState` of several processes as the host loop reads it (`ToolAgentLoop.run`): every row's `length` and
  `responses`, gathered to every process; `state` is the global one the turn program takes."""

  def __init__(self, state):
    self.state = state
    self.length, self.responses = _gather(state.length), _gather(state.responses)


def _share_outcomes(own: dict[int, CallOutcome]) -> dict[int, CallOutcome]:
  """Every process's outcomes of its own calls (by the call's index in the round), to every process."""
  text = json.dumps([[i, o.text, o.reward, o.error] for i, o in own.items()]).encode()
  lengths = np.asarray(multihost_utils.process_allgather(np.asarray([len(text)], np.int32))).reshape(-1)
  padded = np.zeros(int(lengths.max()), np.uint8)
  padded[: len(text)] = np.frombuffer(text, np.uint8)
  every = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(lengths), -1)
  outcomes = {}
  for row, length in zip(every, lengths):
    for i, text, reward, error in json.loads(row[:length].tobytes()):
      outcomes[i] = CallOutcome(text=text, reward=reward, error=error)
  return outcomes


def rollout_record(
  n: int,
  prompts_NxP,
  prompt_mask_NxP,
  sample_index_N,
  state,
  response_attention_mask_NxR,
  num_turns_N,
  tool_rewards_NxC,
) -> Rollout:
  """A multi-turn rollout's record from its final `TurnState` and its trajectories (`trajectory_arrays`): on the
  host, and under `jax.eval_shape` ahead of time (`abstract_rollout`), so both describe one record."""
  rows = prompts_NxP.shape[0]
  return Rollout(
    prompts=prompts_NxP,
    prompt_mask=prompt_mask_NxP.astype(np.int32),
    responses=state.responses,
    response_mask=state.loss_mask,
    rollout_log_probs=state.log_probs,
    sample_index=sample_index_N.astype(np.int32),
    group_index=np.repeat(np.arange(rows // n, dtype=np.int32), n),
    decode_steps=state.steps.astype(np.int32),
    response_attention_mask=response_attention_mask_NxR,
    num_turns=num_turns_N,
    tool_rewards=tool_rewards_NxC,
  )


def abstract_rollout(ppo, run, actor, batch, rng, place) -> Rollout:
  """Ahead of time (`jaxrlhf.aot`): `run` compiles the rollout's programs (the generation weights, the prefill, one
  turn) and this returns the record `MultiTurnGeneration.rollout` builds, as abstract arrays; `place`: an abstract
  tree -> the same in the batch layout. `run` is the AOT runner: `resident_state` says the train state stays on the
  devices beside the turn programs' arguments."""
  config = ppo.config
  n = config.actor_rollout_ref.rollout.n
  response_len = config.data.max_response_length
  programs = TurnPrograms(ppo, ppo.sampling)  # no tokenizer ahead of time: no tool-call close among the stop ids
  rows = batch["input_ids"].shape[0] * n
  rows_of = lambda shape, dtype=np.int32: jax.ShapeDtypeStruct((rows,) + shape, dtype)
  prompt_len = batch["input_ids"].shape[1]
  prompts_NxP, prompt_mask_NxP, sample_index_N = place((rows_of((prompt_len,)), rows_of((prompt_len,)), rows_of(())))
  params = run("gen_weights", programs.weights, actor)
  state = run("gen_prefill", programs.start, params, prompts_NxP, prompt_mask_NxP, rng, resident_state=True)
  forced = place((rows_of((response_len,)), rows_of(()), rows_of((), np.bool_)))
  run("gen_turn", programs.turn, params, state, *forced, resident_state=True)
  calls = max_tool_calls(config.actor_rollout_ref.rollout.multi_turn, response_len)
  record = jax.eval_shape(
    functools.partial(rollout_record, n),
    prompts_NxP,
    prompt_mask_NxP,
    sample_index_N,
    state,
    rows_of((response_len,)),
    rows_of(()),
    rows_of((calls,), np.float32),
  )
  return place(record)
