"""Phased mode (`trainer.fuse_step=False`) and DAPO dynamic sampling: the step's phases as separate
programs, timed one by one.

The phases are the same methods of `PPOStep` the fused program composes, so both modes compute the
same numbers; phased mode adds `timing_s/<phase>` and `timing_per_token_ms/<phase>`. Dynamic sampling
(`algorithm.filter_groups`) needs the host between generation and training: rounds of
generation + reward run until enough prompt groups have non-identical rewards, then the rest of the
step runs on the kept groups.
"""

from __future__ import annotations

import time

import jax
import numpy as np

from jaxrlhf.trainer import records
from jaxrlhf.trainer.ppo_step import PPOStep
from jaxrlhf.trainer.records import Rollout, Scored


class PhasedStep:
  """`PPOStep`'s composition run phase by phase: each phase function jitted once, then given to a runner
  (`timed`, or `jaxrlhf.aot`'s compiling one) as `run(name, program, *args)`."""

  def __init__(self, ppo: PPOStep, state_shardings, replicated_sharding):
    self.ppo = ppo
    self._programs = {}  # a phase's function -> its program
    self._out_shardings = {ppo.finish: (state_shardings, replicated_sharding)}
    self.gen, self.reward = self.program(ppo.rollout), self.program(ppo.score)
    # Everything after the reward in one program (a generation on the host with fuse_step=True: `step_modes`).
    self.train_on_rollout = jax.jit(ppo.train_on_rollout, out_shardings=(state_shardings, replicated_sharding))

  def program(self, fn):
    """The jitted program of phase function `fn` (built once)."""
    if fn not in self._programs:
      shardings = self._out_shardings.get(fn)
      self._programs[fn] = jax.jit(fn) if shardings is None else jax.jit(fn, out_shardings=shardings)
    return self._programs[fn]

  def _phases(self, run):
    return lambda name, fn, *args: run(name, self.program(fn), *args)

  def generate_and_score(self, state, batch, rng, run):
    """Phases gen and reward; `run(name, program, *args)` runs each (see `timed`)."""
    return self.ppo.generate_and_score(state, batch, rng, self._phases(run))

  def train(self, state, rollout, scored, rng, run):
    """Phases old_log_prob, ref, values, adv, update_critic, update_actor, then the new state."""
    return self.ppo.train_on_rollout(state, rollout, scored, rng, self._phases(run))


def timed(timings: dict):
  """A phase runner that runs each program to completion and adds its seconds to `timings[name]`.

  Phases named None (small glue programs) run untimed. `jaxrlhf.aot` passes a runner that compiles
  each program for a target instead of running it.
  """

  def run(name, program, *args):
    if name is None:
      return program(*args)
    start = time.perf_counter()
    out = jax.block_until_ready(program(*args))
    timings[name] = timings.get(name, 0.0) + time.perf_counter() - start
    return out

  return run


def group_is_informative(scores_N: np.ndarray, group_index_N: np.ndarray) -> np.ndarray:
  """Per group (sorted ids): True when its samples' metric is not identical (or it has one sample)."""
  groups = np.unique(group_index_N)
  keep = []
  for g in groups:
    values = scores_N[group_index_N == g]
    keep.append(len(values) == 1 or np.std(values) > 0)
  return np.asarray(keep, bool)


def left_pad_prompts(rollout: Rollout, width: int, pad_token_id: int) -> Rollout:
  """A rollout's prompts (numpy) left-padded to `width` columns: rounds of bucketed prompt widths join."""
  columns = width - rollout.prompts.shape[1]
  if columns == 0:
    return rollout
  return rollout.replace(
    prompts=np.pad(rollout.prompts, ((0, 0), (columns, 0)), constant_values=pad_token_id),
    prompt_mask=np.pad(rollout.prompt_mask, ((0, 0), (columns, 0))),
  )


def select_groups(rounds: list[tuple[Rollout, Scored]], num_groups: int, metric: str, pad_token_id: int = 0):
  """Kept groups of all rounds -> (rollout, scored) records (numpy) of exactly `num_groups` groups.

  Groups keep their order of generation; group ids are renumbered 0..num_groups-1. Rounds whose
  prompts were padded to different widths are left-padded (with `pad_token_id`) to the widest.
  """
  rollout_parts, scored_parts, kept = [], [], 0
  for rollout, scored in rounds:
    rollout, scored = jax.device_get((rollout, scored))
    group_N = np.asarray(rollout.group_index)
    metric_N = np.asarray(scored.scores if metric == "score" else scored.token_level_scores.sum(axis=1))
    informative = group_is_informative(metric_N, group_N)
    for g, keep in zip(np.unique(group_N), informative):
      if keep and kept < num_groups:
        rows = group_N == g
        rollout_parts.append(records.take_rows(rollout, rows))
        scored_parts.append(records.take_rows(scored, rows))
        kept += 1
  if kept < num_groups:
    return None
  width = max(p.prompts.shape[1] for p in rollout_parts)
  rollout = records.concatenate_rows([left_pad_prompts(p, width, pad_token_id) for p in rollout_parts])
  n = len(rollout.group_index) // num_groups
  rollout = rollout.replace(
    group_index=np.repeat(np.arange(num_groups, dtype=np.int32), n),
    decode_steps=np.asarray(max(int(np.asarray(r.decode_steps)) for r, _ in rounds), np.int32),
  )
  return rollout, records.concatenate_rows(scored_parts)
