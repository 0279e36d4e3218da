"""How a step generates and trains: the generation modes behind one interface, and the one place the fused/phased
choice is made (docs/architecture.md "The step's modes").

A generation mode turns the step's prompts into scored sequences:
`run(state, batches, rng, run) -> Generated(rollout, scored, metrics)`, and `abstract(...)` the same ahead of time
(every program compiled by the `jaxrlhf.aot` runner, abstract outputs); `validation_samples` samples the validation
set with `val_kwargs`. The modes:
- `SingleTurn`: prompts x n sampled in one compiled program (`PPOStep.rollout`), then the reward program;
- `MultiTurn`: a host loop of turn programs with the tool calls between turns (`multi_turn.MultiTurnGeneration`);
- `DynamicSampling` (DAPO, `algorithm.filter_groups`): rounds of another mode until enough groups have varied rewards.
A step mode runs a whole step, `run(state, batches, rng, run) -> (state, device metrics, host metrics)`: `FusedStep`
(every phase in one program) or `GenerateThenTrain` (a generation mode, then the training phases as one program or
phase by phase). `step_mode` chooses; `Trainer.train_step`, `Trainer.validate` and `aot.compile_step` each make one
call. `run(name, program, *args)` is the phase runner (`phased.timed`, or `jaxrlhf.aot`'s compiling one).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxrlhf.parallel import batch_sharding, replicated
from jaxrlhf.trainer.multi_turn import MultiTurnGeneration, abstract_rollout
from jaxrlhf.trainer.phased import PhasedStep, select_groups
from jaxrlhf.trainer.ppo_step import PPOStep
from jaxrlhf.trainer.records import Rollout, Scored
from jaxrlhf.trainer.reward import trajectory_infos


def batch_layout(mesh, tree):
  """Each leaf's sharding in the batch layout: rows split over the batch shards, scalars replicated."""
  return jax.tree.map(lambda x: batch_sharding(mesh, x.shape) if np.ndim(x) else replicated(mesh), tree)


def in_batch_layout(mesh, tree):
  """An abstract tree (`jax.ShapeDtypeStruct`s) placed in the batch layout: what `batch_layout` puts there."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, batch_layout(mesh, tree))


@dataclasses.dataclass(frozen=True)
class StepBatches:
  """Where a step's prompts come from: `train()` the step's batch (`data.train_batch_size` prompts); `gen_round()`
  the next round of dynamic sampling (`data.gen_batch_size` prompts; the trainer's generation cursor moves on)."""

  train: Callable[[], dict]
  gen_round: Callable[[], dict]


def abstract_batches(program) -> StepBatches:
  """A step's batches as abstract arrays at their widest (`StepProgram.abstract_batch`): ahead of time."""
  config = program.config.data
  return StepBatches(
    train=lambda: program.abstract_batch(config.train_batch_size),
    gen_round=lambda: program.abstract_batch(config.gen_batch_size or config.train_batch_size),
  )


@dataclasses.dataclass(frozen=True)
class Generated:
  """A generation mode's output: the scored sequences (in the batch layout) and the host's metrics of them."""

  rollout: Rollout
  scored: Scored
  metrics: dict[str, float]  # tool calls and turns (multi-turn), generation rounds (dynamic sampling)


@dataclasses.dataclass(frozen=True)
class ValidationSamples:
  """One validation batch, on the host: `val_kwargs.n` samples of each prompt."""

  model_scores: np.ndarray  # [N] the reward model's scores (zeros without one)
  responses: np.ndarray  # [N, R]
  response_mask: np.ndarray  # [N, R] every token of each response (tool responses included)
  trajectories: list | None = None  # multi-turn: one `agent_loop.Trajectory` per row
  trajectory_infos: list | None = None  # multi-turn: what the rule reward sees of each (`reward.trajectory_infos`)


class SingleTurn:
  """Prompts x n sampled in one compiled program, then the reward program (`PhasedStep`). `validate_program`:
  `validation.make_validation_fn`'s, jitted; `load_batch(dataset, indices)`: the rows on the mesh."""

  def __init__(self, phased: PhasedStep, validate_program=None, load_batch: Callable | None = None):
    self.phased = phased
    self.validate_program = validate_program
    self.load_batch = load_batch

  def run(self, state, batches: StepBatches, rng, run) -> Generated:
    rollout, scored = self.phased.generate_and_score(state, batches.train(), rng, run)
    return Generated(rollout, scored, {})

  abstract = run  # every phase is a program, which the AOT runner compiles

  def validation_samples(self, state, dataset, indices: np.ndarray, rng) -> ValidationSamples:
    scores_N, responses_NxR, response_mask_NxR = jax.device_get(
      self.validate_program(state.actor.weights, state.reward_params, self.load_batch(dataset, indices), rng)
    )
    return ValidationSamples(scores_N, responses_NxR, response_mask_NxR)


class MultiTurn:
  """A host loop of turn programs with the tool calls between turns (`loop`, `multi_turn.MultiTurnGeneration`; None
  ahead of time, where there are no tokenizer and no tools and only `abstract` runs), then the reward program.
  `val_sampling`: validation's sampling (`val_kwargs`); `place`: an abstract tree -> the same in the batch layout."""

  def __init__(self, phased: PhasedStep, loop: MultiTurnGeneration | None, place: Callable, val_sampling: Any = None):
    self.phased = phased
    self.loop = loop
    self.place = place
    self.val_sampling = val_sampling

  def run(self, state, batches: StepBatches, rng, run) -> Generated:
    gen_rng = PPOStep.split_rng(rng)["gen"]
    rollout, metrics = run("gen", self.loop.rollout, state.actor.weights, batches.train(), gen_rng)
    return Generated(rollout, run("reward", self.phased.reward, rollout, state.reward_params), metrics)

  def abstract(self, state, batches: StepBatches, rng, run) -> Generated:
    gen_rng = PPOStep.split_rng(rng)["gen"]
    rollout = abstract_rollout(self.phased.ppo, run, state.actor.weights, batches.train(), gen_rng, self.place)
    return Generated(rollout, run("reward", self.phased.reward, rollout, state.reward_params), {})

  def validation_samples(self, state, dataset, indices: np.ndarray, rng) -> ValidationSamples:
    """The tool agent loop with `val_kwargs`' sampling on the rows' whole prompts (`max_prompt_length` columns)."""
    n = self.phased.ppo.config.actor_rollout_ref.rollout.val_kwargs.n
    repeat = lambda x: np.repeat(np.asarray(x), n, axis=0)
    turn_state, trajectories = self.loop.trajectories(
      state.actor.weights,
      repeat(dataset.input_ids[indices]),
      repeat(dataset.attention_mask[indices]),
      repeat(indices),
      rng,
      self.val_sampling,
      dataset,
    )
    responses_NxR = turn_state.responses
    scores_N = np.zeros(len(responses_NxR), np.float32)  # no reward model with tools (`config.py`)
    infos = trajectory_infos(*self.loop.trajectory_arrays(trajectories))
    return ValidationSamples(scores_N, responses_NxR, turn_state.sequence_mask(), trajectories, infos)


class DynamicSampling:
  """DAPO: rounds of `generation` on `gen_batch_size` prompts until `train_batch_size` groups have non-identical
  rewards (`phased.select_groups`); the kept groups go back to the batch layout (`put`)."""

  def __init__(self, generation, config, pad_token_id: int, put: Callable, place: Callable):
    self.generation = generation
    self.config = config
    self.pad_token_id = pad_token_id
    self.put = put
    self.place = place

  @staticmethod
  def _rounds(batches: StepBatches) -> StepBatches:
    """What the inner mode draws as its step's batch: the next round's."""
    return StepBatches(train=batches.gen_round, gen_round=batches.gen_round)

  def run(self, state, batches: StepBatches, rng, run) -> Generated:
    config = self.config
    filter_groups = config.algorithm.filter_groups
    rounds, metrics = [], {}
    round_batches = self._rounds(batches)
    while True:
      generated = self.generation.run(state, round_batches, jax.random.fold_in(rng, len(rounds)), run)
      rounds.append((generated.rollout, generated.scored))
      metrics = generated.metrics  # the last round's (turns and tool calls of a multi-turn rollout)
      selected = select_groups(rounds, config.data.train_batch_size, filter_groups.metric, self.pad_token_id)
      if selected is not None:
        break
      if 0 < filter_groups.max_num_gen_batches <= len(rounds):
        raise RuntimeError(
          f"dynamic sampling: {len(rounds)} generation rounds (algorithm.filter_groups.max_num_gen_batches="
          f"{filter_groups.max_num_gen_batches}) gave fewer than data.train_batch_size="
          f"{config.data.train_batch_size} groups with non-identical {filter_groups.metric}; every group is "
          "solved or failed alike: check the data, or raise max_num_gen_batches"
        )
    rollout, scored = (self.put(part) for part in selected)
    return Generated(rollout, scored, {"training/num_gen_batches": float(len(rounds)), **metrics})

  def abstract(self, state, batches: StepBatches, rng, run) -> Generated:
    """One round compiled; the kept groups come back from the host: `train_batch_size` groups in the batch layout."""
    generated = self.generation.abstract(state, self._rounds(batches), rng, run)
    rows = self.config.data.train_batch_size * self.config.actor_rollout_ref.rollout.n
    kept = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct((rows,) + tuple(x.shape[1:]) if x.shape else x.shape, x.dtype),
      (generated.rollout, generated.scored),
    )
    return Generated(*self.place(kept), {})

  def validation_samples(self, state, dataset, indices: np.ndarray, rng) -> ValidationSamples:
    return self.generation.validation_samples(state, dataset, indices, rng)


class FusedStep:
  """Every phase in one program (`StepProgram.jit_step`: the state donated): single-turn generation only."""

  def __init__(self, generation: SingleTurn, jitted_step):
    self.generation = generation
    self.jitted_step = jitted_step

  def run(self, state, batches: StepBatches, rng, run):
    # Untimed as a phase: its time is the whole step's (`timing_s/step`).
    state, metrics = run(None, self.jitted_step, state, batches.train(), rng)
    return state, metrics, {}

  def abstract(self, state, batches: StepBatches, rng, run):
    return run("step", self.jitted_step, state, batches.train(), rng)


class GenerateThenTrain:
  """A generation mode, then everything after the reward: one program (`fuse_training`: `trainer.fuse_step`) or
  phase by phase (`PhasedStep.train`, timed one by one)."""

  def __init__(self, generation, phased: PhasedStep, fuse_training: bool):
    self.generation = generation
    self.phased = phased
    self.fuse_training = fuse_training

  def _train(self, state, generated: Generated, rng, run):
    if self.fuse_training:
      return run("train", self.phased.train_on_rollout, state, generated.rollout, generated.scored, rng)
    return self.phased.train(state, generated.rollout, generated.scored, rng, run)

  def run(self, state, batches: StepBatches, rng, run):
    generated = self.generation.run(state, batches, rng, run)
    state, metrics = self._train(state, generated, rng, run)
    return state, metrics, generated.metrics

  def abstract(self, state, batches: StepBatches, rng, run):
    return self._train(state, self.generation.abstract(state, batches, rng, run), rng, run)


def generation_mode(
  config, phased: PhasedStep, *, multi_turn=None, validate_program=None, load_batch=None, val_sampling=None, put=None
):
  """The config's generation mode (single-turn, multi-turn; under dynamic sampling with `algorithm.filter_groups`).
  `multi_turn`: the host loop (`MultiTurnGeneration`; None ahead of time); `put`: host records -> the batch layout."""
  mesh = phased.ppo.layouts.mesh
  place = lambda tree: in_batch_layout(mesh, tree)
  if config.actor_rollout_ref.rollout.multi_turn.enable:
    generation = MultiTurn(phased, multi_turn, place, val_sampling)
  else:
    generation = SingleTurn(phased, validate_program, load_batch)
  if config.algorithm.filter_groups.enable:
    generation = DynamicSampling(generation, config, phased.ppo.sampling.pad_token_id, put, place)
  return generation


def step_mode(fuse_step: bool, generation, phased: PhasedStep, jitted_step):
  """The one place the fused/phased choice is made: with `fuse_step` (`trainer.fuse_step`) a single-turn step is
  one program (`jitted_step`, `StepProgram.jit_step`); a step whose generation needs the host (tool calls between
  turns, dynamic sampling's rounds) or without `fuse_step` generates first, then trains (one program with
  `fuse_step`, else phase by phase)."""
  if fuse_step and isinstance(generation, SingleTurn):
    return FusedStep(generation, jitted_step)
  return GenerateThenTrain(generation, phased, fuse_training=fuse_step)


def actor_update_metric_names(generation, phased: PhasedStep, state, batches: StepBatches, rng) -> tuple[str, ...]:
  """The names of the metrics the actor's update reports, from the phases' abstract outputs (`jax.eval_shape`:
  nothing compiled or run); verl logs none of them in a step whose actor did not update (`critic_warmup`)."""
  outputs = {}

  def shapes(name, program, *args, **unused):
    outputs[name] = jax.eval_shape(program, *args)
    return outputs[name]

  GenerateThenTrain(generation, phased, fuse_training=False).abstract(state, batches, rng, shapes)
  return tuple(outputs["update_actor"][1])
