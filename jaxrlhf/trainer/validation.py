"""Validation: the compiled sample + score program and the metrics of its scores (SPEC §7 `val-core`,
`val-aux`).

The trainer's host loop (`Trainer.validate`) runs `make_validation_fn`'s program over fixed-shape
batches of the validation set and turns the scores into metrics with `validation_metrics`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence

import jax.numpy as jnp
import numpy as np

from jaxrlhf.rollout import SamplingParams
from jaxrlhf.trainer import reward
from jaxrlhf.trainer.ppo_step import PPOStep


def make_validation_fn(ppo: PPOStep, sampling: SamplingParams, reward_fn: Callable):
  """`validate(actor_params, actor_adapters, reward_params, batch, rng) -> (scores_N, responses_NxR,
  response_mask_NxR)`; `actor_adapters`: LoRA adapters or None.

  Each prompt is sampled `val_kwargs.n` times with `sampling`; `reward_fn` looks rows up in the
  validation set.
  """

  def validate(actor_params, actor_adapters, reward_params, batch, rng):
    n = ppo.config.actor_rollout_ref.rollout.val_kwargs.n
    prompts_NxP = jnp.repeat(batch["input_ids"], n, axis=0)
    prompt_mask_NxP = jnp.repeat(batch["attention_mask"], n, axis=0)
    sample_index_N = jnp.repeat(batch["sample_index"], n, axis=0)
    generation = ppo.generation
    rollout = generation.sample(generation.generation_params(actor_params, actor_adapters), prompts_NxP,
                                prompt_mask_NxP, rng, sampling)
    scores_N, _ = reward.sequence_scores(ppo.config.reward_model, reward_fn, ppo.reward_model, reward_params,
                                         prompts_NxP, prompt_mask_NxP, rollout["responses"], rollout["response_mask"],
                                         sample_index_N)
    return scores_N, rollout["responses"], rollout["response_mask"]

  return validate


def _subset_sizes(n: int) -> list[int]:
  """The sample counts k of best@k / worst@k: 2, 4, 8, ... below n, then n (verl's)."""
  sizes, k = [], 2
  while k < n:
    sizes.append(k)
    k *= 2
  return sizes + [n] if n > 1 else []


def _bootstrap(values_K: np.ndarray, subset_size: int, num_draws: int = 1000, seed: int = 42):
  """Mean and std over `num_draws` subsets of `subset_size` drawn with replacement of (max, min)."""
  np.random.seed(seed)  # verl's seeding: every prompt draws the same subsets of indices
  draws_DxS = values_K[np.random.choice(len(values_K), size=(num_draws, subset_size), replace=True)]
  best_D, worst_D = draws_DxS.max(axis=1), draws_DxS.min(axis=1)
  return (float(best_D.mean()), float(best_D.std())), (float(worst_D.mean()), float(worst_D.std()))


def _prompt_metrics(values_K: np.ndarray) -> dict[str, float]:
  n = len(values_K)
  metrics = {f"mean@{n}": float(np.mean(values_K))}
  if n > 1:
    metrics[f"std@{n}"] = float(np.std(values_K))
    for k in _subset_sizes(n):
      (best_mean, best_std), (worst_mean, worst_std) = _bootstrap(values_K, k)
      metrics.update({f"best@{k}/mean": best_mean, f"best@{k}/std": best_std,
                      f"worst@{k}/mean": worst_mean, f"worst@{k}/std": worst_std})
  return metrics


def validation_metrics(data_sources: Sequence[str], prompt_scores: np.ndarray, response_mask_NxR: np.ndarray,
                       ) -> dict[str, float]:
  """verl's validation metrics, per data source, averaged over its prompts, for the variable `reward`:
  `val-core/<source>/reward/{mean,best}@n...` and `val-aux/<source>/reward/{std@n, best@k, worst@k, ...}`
  (best/worst@k: a bootstrap over subsets of k of a prompt's n samples), and `val/response_length/mean`.

  prompt_scores: [prompts, n], the scores of each prompt's n samples; data_sources: one per prompt.
  """
  by_source = defaultdict(lambda: defaultdict(list))
  for source, values_K in zip(data_sources, np.asarray(prompt_scores, np.float64)):
    for name, value in _prompt_metrics(values_K).items():
      by_source[source][name].append(value)
  n = prompt_scores.shape[1]
  metrics = {}
  for source, name_values in by_source.items():
    for name, values in name_values.items():
      # verl's split: the core variable's mean/best at the largest n are `val-core`, the rest `val-aux`.
      section = "val-core" if name.startswith(("mean", "best")) and f"@{n}" in name else "val-aux"
      metrics[f"{section}/{source}/reward/{name}"] = float(np.mean(values))
  metrics["val/response_length/mean"] = float(response_mask_NxR.sum(axis=1).mean())
  return metrics
