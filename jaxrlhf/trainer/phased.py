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

from jaxrlhf.trainer import update_loop
from jaxrlhf.trainer.ppo_step import PPOStep


class PhasedStep:
  def __init__(self, ppo: PPOStep, state_shardings, replicated_sharding):
    self.ppo = ppo
    self.gen = jax.jit(ppo.rollout)
    self.reward = jax.jit(ppo.score)
    self.old_log_prob = jax.jit(ppo.old_log_prob)
    self.ref = jax.jit(ppo.ref_log_prob)
    self.values = jax.jit(ppo.critic_values)
    self.adv = jax.jit(ppo.advantages)
    self.update_critic = jax.jit(ppo.update_critic)
    self.update_actor = jax.jit(ppo.update_actor)
    self.data = jax.jit(update_loop.update_data)
    self.finish = jax.jit(ppo.finish, out_shardings=(state_shardings, replicated_sharding))
    # Everything after the reward in one program (DAPO with fuse_step=True).
    self.train_on_rollout = jax.jit(ppo.train_on_rollout, out_shardings=(state_shardings, replicated_sharding))

  def generate_and_score(self, state, batch, rng, run):
    """Phases gen and reward; `run(name, program, *args)` runs each (see `timed`)."""
    rollout = run("gen", self.gen, state.actor_params, batch, self.ppo.split_rng(rng)["gen"], state.actor_adapters)
    return rollout, run("reward", self.reward, rollout, state.reward_params)

  def train(self, state, rollout, scored, rng, run):
    """Phases old_log_prob, ref, values, adv, update_critic, update_actor, then the new state."""
    ppo = self.ppo
    keys = ppo.split_rng(rng)
    old = (
      ppo.old_log_prob(state.actor_params, rollout)
      if ppo.plan.old_in_update  # the update gives them
      else run(
        "old_log_prob",
        self.old_log_prob,
        state.actor_params,
        rollout,
        state.actor_adapters,
        ppo.reference_params(state) if ppo.plan.full_kl_in_reward else None,
      )
    )
    ref = (
      run("ref", self.ref, ppo.reference_params(state), rollout) if ppo.plan.ref_phase else old[1].get("ref_log_prob")
    )
    values = (
      run("values", self.values, state.critic_params, rollout, state.critic_adapters) if ppo.plan.use_critic else None
    )
    adv = run("adv", self.adv, state, rollout, scored, old[0], ref, values, old[1])
    data = run(None, self.data, rollout, old[0], ref, adv)
    critic = None
    if ppo.plan.use_critic:
      critic = run("update_critic", self.update_critic, state, data, values, adv["returns"], keys["critic"])
    actor = run("update_actor", self.update_actor, state, data, keys["actor"])
    return run(None, self.finish, state, rollout, scored, old, ref, values, adv, keys, critic, actor)


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


def left_pad_prompts(rollout: dict, width: int, pad_token_id: int) -> dict:
  """A rollout's prompts (numpy) left-padded to `width` columns: rounds of bucketed prompt widths join."""
  columns = width - rollout["prompts"].shape[1]
  if columns == 0:
    return rollout
  return dict(
    rollout,
    prompts=np.pad(rollout["prompts"], ((0, 0), (columns, 0)), constant_values=pad_token_id),
    prompt_mask=np.pad(rollout["prompt_mask"], ((0, 0), (columns, 0))),
  )


def select_groups(rounds: list[tuple[dict, dict]], num_groups: int, metric: str, pad_token_id: int = 0):
  """Kept groups of all rounds -> (rollout, scored) numpy dicts of exactly `num_groups` groups.

  Groups keep their order of generation; group ids are renumbered 0..num_groups-1. Rounds whose
  prompts were padded to different widths are left-padded (with `pad_token_id`) to the widest.
  """
  rollout_parts, scored_parts, kept = [], [], 0
  for rollout, scored in rounds:
    rollout = jax.device_get(rollout)
    scored = jax.device_get(scored)
    group_N = np.asarray(rollout["group_index"])
    metric_N = np.asarray(scored["scores"] if metric == "score" else scored["token_level_scores"].sum(axis=1))
    informative = group_is_informative(metric_N, group_N)
    for g, keep in zip(np.unique(group_N), informative):
      if keep and kept < num_groups:
        rows = group_N == g
        rollout_parts.append({k: np.asarray(v)[rows] for k, v in rollout.items() if np.ndim(v) > 0})
        scored_parts.append({k: np.asarray(v)[rows] for k, v in scored.items()})
        kept += 1
  if kept < num_groups:
    return None
  width = max(p["prompts"].shape[1] for p in rollout_parts)
  rollout_parts = [left_pad_prompts(p, width, pad_token_id) for p in rollout_parts]
  rollout = {k: np.concatenate([p[k] for p in rollout_parts]) for k in rollout_parts[0]}
  n = len(rollout["group_index"]) // num_groups
  rollout["group_index"] = np.repeat(np.arange(num_groups, dtype=np.int32), n)
  rollout["decode_steps"] = np.asarray(max(int(np.asarray(r["decode_steps"])) for r, _ in rounds), np.int32)
  scored = {k: np.concatenate([p[k] for p in scored_parts]) for k in scored_parts[0]}
  return rollout, scored
