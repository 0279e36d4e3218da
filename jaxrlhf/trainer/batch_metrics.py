"""The batch statistics of one step (docs/algorithms.md §7): scores, rewards, advantages, returns, values, lengths."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrlhf import algos
from jaxrlhf.trainer.records import Advantages, Rollout, Scored


def _stats(prefix: str, x, mask=None) -> dict[str, jax.Array]:
  """`<prefix>/{mean,max,min}` over all of `x`, or over its positions where `mask` > 0."""
  x = x.astype(jnp.float32)
  if mask is None:
    return {f"{prefix}/mean": jnp.mean(x), f"{prefix}/max": jnp.max(x), f"{prefix}/min": jnp.min(x)}
  valid = mask > 0
  return {
    f"{prefix}/mean": algos.masked_mean(x, mask),
    f"{prefix}/max": jnp.max(jnp.where(valid, x, -jnp.inf)),
    f"{prefix}/min": jnp.min(jnp.where(valid, x, jnp.inf)),
  }


def rollout_probs_diff(rollout_log_probs_NxR, actor_log_probs_NxR, mask_NxR) -> dict[str, jax.Array]:
  """verl's rollout-vs-training gap (`verl.utils.debug.metrics.calculate_debug_metrics`), over the sampled tokens:
  |p_actor - p_rollout| of the token probabilities (not log-probs, despite the names) as max / mean / std (unbiased,
  as torch.std), the probabilities' Pearson correlation, and `valid` (0, the rest NaN, with no sampled token)."""
  valid = mask_NxR > 0
  count = jnp.sum(valid.astype(jnp.float32))
  actor, rollout = (jnp.exp(x.astype(jnp.float32)) for x in (actor_log_probs_NxR, rollout_log_probs_NxR))
  diff = jnp.abs(actor - rollout)
  mean = lambda x: jnp.sum(jnp.where(valid, x, 0.0)) / count
  diff_mean, actor_mean, rollout_mean = mean(diff), mean(actor), mean(rollout)
  centred = lambda x, m: jnp.where(valid, x - m, 0.0)
  covariance = jnp.sum(centred(actor, actor_mean) * centred(rollout, rollout_mean))
  spread = jnp.sqrt(jnp.sum(centred(actor, actor_mean) ** 2) * jnp.sum(centred(rollout, rollout_mean) ** 2))
  nan = lambda x: jnp.where(count > 0, x, jnp.nan)
  return {
    "training/rollout_probs_diff_valid": (count > 0).astype(jnp.float32),
    "training/rollout_probs_diff_max": nan(jnp.max(jnp.where(valid, diff, -jnp.inf))),
    "training/rollout_probs_diff_mean": nan(diff_mean),
    "training/rollout_probs_diff_std": nan(jnp.sqrt(jnp.sum(centred(diff, diff_mean) ** 2) / (count - 1))),
    "training/rollout_actor_probs_pearson_corr": nan(covariance / spread),
  }


def batch_metrics(
  rollout: Rollout,
  scored: Scored,
  adv: Advantages,
  values,
  max_prompt_length: int | None = None,
  component_keys: tuple[str, ...] = (),
) -> dict[str, jax.Array]:
  """From the rollout, its scores (`PPOStep.score`), the advantage phase's output and the values (or None).

  GDPO's reward components (`Scored.reward_components`, named by `component_keys`) give verl's
  `gdpo/<key>/{mean,std,max,min}` over the batch.

  `prompt_length/clip_ratio` counts prompts of `max_prompt_length` tokens (None: the padded width), so it
  means the same whether the batch's prompts were padded to a bucket or to the maximum.
  """
  mask_f = rollout.response_mask.astype(jnp.float32)
  lengths_N = rollout.sequence_mask().sum(axis=1)  # verl's: with tool responses in a multi-turn rollout
  prompt_lengths_N = rollout.prompt_mask.sum(axis=1)
  metrics = {}
  metrics.update(_stats("critic/score", scored.scores))
  metrics.update(_stats("critic/rewards", adv.token_level_rewards.sum(axis=1)))
  metrics.update(_stats("critic/advantages", adv.advantages, mask_f))
  metrics.update(_stats("critic/returns", adv.returns, mask_f))
  if values is not None:
    metrics.update(_stats("critic/values", values, mask_f))
    residual_var = algos.masked_var(adv.returns - values, mask_f)
    metrics["critic/vf_explained_var"] = 1.0 - residual_var / (algos.masked_var(adv.returns, mask_f) + 1e-5)
  metrics.update(_stats("response_length", lengths_N))
  metrics["response_length/clip_ratio"] = jnp.mean((lengths_N == mask_f.shape[1]).astype(jnp.float32))
  metrics.update(_stats("prompt_length", prompt_lengths_N))
  metrics["prompt_length/clip_ratio"] = jnp.mean(
    (prompt_lengths_N == (max_prompt_length or rollout.prompt_mask.shape[1])).astype(jnp.float32)
  )
  metrics["perf/total_num_tokens"] = (prompt_lengths_N.sum() + lengths_N.sum()).astype(jnp.float32)
  metrics["perf/decode_steps"] = jnp.asarray(rollout.decode_steps, jnp.float32)
  metrics["reward/num_errors"] = scored.reward_errors.sum()
  metrics["reward/num_null_ground_truth"] = scored.null_ground_truths.sum()
  for key, component_N in zip(component_keys, () if scored.reward_components is None else scored.reward_components):
    metrics.update(
      {
        f"gdpo/{key}/{name}": fn(component_N)
        for name, fn in (("mean", jnp.mean), ("std", jnp.std), ("max", jnp.max), ("min", jnp.min))
      }
    )
  return metrics
