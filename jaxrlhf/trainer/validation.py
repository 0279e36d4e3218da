"""Validation: the compiled sample program, the rule reward on the host, and verl's validation metrics
(docs/algorithms.md §7 `val-core`, `val-aux`).

The trainer's host loop (`Trainer.validate`) runs `make_validation_fn`'s program over fixed-shape
batches of the validation set, scores the responses with the rule reward on the host (where every
entry the reward function returns is known: `acc`, `pred`, ...), and turns the variables into metrics
with `validation_metrics`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from jaxrlhf.rollout import SamplingParams
from jaxrlhf.trainer import reward
from jaxrlhf.trainer.ppo_step import PPOStep


def make_validation_fn(ppo: PPOStep, sampling: SamplingParams):
  """`validate(actor, reward_params, batch, rng) -> (model_scores_N, responses_NxR, response_mask_NxR)`;
  `actor`: the actor's weights (`RoleState.weights`).

  Each prompt is sampled `val_kwargs.n` times with `sampling`; `model_scores_N` is the reward model's
  score (zeros without one): the rule reward runs on the host afterwards (`Trainer.validate`).
  """

  def validate(actor, reward_params, batch, rng):
    n = ppo.config.actor_rollout_ref.rollout.val_kwargs.n
    prompts_NxP = jnp.repeat(batch["input_ids"], n, axis=0)
    prompt_mask_NxP = jnp.repeat(batch["attention_mask"], n, axis=0)
    generation = ppo.generation
    out = generation.sample(generation.generation_params(actor), prompts_NxP, prompt_mask_NxP, rng, sampling)
    scores_N = reward.model_scores(
      ppo.config.reward_model,
      ppo.reward_model,
      reward_params,
      prompts_NxP,
      prompt_mask_NxP,
      out["responses"],
      out["response_mask"],
    )
    return scores_N, out["responses"], out["response_mask"]

  return validate


def _subset_sizes(n: int) -> list[int]:
  """The sample counts k of best@k / worst@k / maj@k: 2, 4, 8, ... below n, then n (verl's)."""
  sizes, k = [], 2
  while k < n:
    sizes.append(k)
    k *= 2
  return sizes + [n] if n > 1 else []


def _bootstrap_draws(n: int, subset_size: int, num_draws: int = 1000, seed: int = 42) -> np.ndarray:
  """[num_draws, subset_size] indices drawn with replacement; verl reseeds before every bootstrap, so every
  prompt and every statistic draws the same subsets."""
  np.random.seed(seed)
  return np.random.choice(n, size=(num_draws, subset_size), replace=True)


def _majority_value(values_S, preds_S):
  """verl's `calc_maj_val`: the value of the first sample that voted for the most common `pred` (ties:
  the pred seen first)."""
  counts, first_value = {}, {}
  for value, pred in zip(values_S, preds_S):
    counts[pred] = counts.get(pred, 0) + 1
    first_value.setdefault(pred, value)
  return first_value[max(counts, key=counts.get)]


def _prompt_metrics(values_K: np.ndarray, preds_K=None) -> dict[str, float]:
  """One prompt's n samples of one variable: mean@n, std@n, and bootstrap best/worst@k (maj@k with preds)."""
  n = len(values_K)
  metrics = {f"mean@{n}": float(np.mean(values_K))}
  if n > 1:
    metrics[f"std@{n}"] = float(np.std(values_K))
    for k in _subset_sizes(n):
      draws_DxS = _bootstrap_draws(n, k)
      best_D, worst_D = values_K[draws_DxS].max(axis=1), values_K[draws_DxS].min(axis=1)
      metrics.update(
        {
          f"best@{k}/mean": float(best_D.mean()),
          f"best@{k}/std": float(best_D.std()),
          f"worst@{k}/mean": float(worst_D.mean()),
          f"worst@{k}/std": float(worst_D.std()),
        }
      )
      if preds_K is not None:
        majority_D = np.array([_majority_value(values_K[d], [preds_K[i] for i in d]) for d in draws_DxS])
        metrics.update({f"maj@{k}/mean": float(majority_D.mean()), f"maj@{k}/std": float(majority_D.std())})
  return metrics


def validation_metrics(
  data_sources: Sequence[str],
  variables: dict[str, np.ndarray],
  response_mask_NxR: np.ndarray,
) -> dict[str, float]:
  """verl's validation metrics, per data source, averaged over its prompts, for each variable: `reward`
  (the score) and every number the reward function returned beside it (e.g. `acc`). The core variable is
  `acc` when there is one, else `reward`: its mean/maj/best at the largest n are `val-core/<source>/<var>/...`,
  everything else `val-aux/...` (std@n, best/worst@k: a bootstrap over subsets of k of a prompt's n
  samples; maj@k when the reward returns a text `pred`: the majority answer's value). Also
  `val/response_length/mean`.

  variables: name -> [prompts, n] values of each prompt's n samples (numbers; `pred` text, None where
  missing); data_sources: one per prompt.
  """
  preds = variables.get("pred")
  numeric = {
    name: np.asarray(values, np.float64) for name, values in variables.items() if np.asarray(values).dtype != object
  }
  core = "acc" if "acc" in numeric else "reward"
  by_source = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
  for p, source in enumerate(data_sources):
    prompt_preds = None
    if preds is not None and all(pred is not None for pred in preds[p]):
      prompt_preds = list(preds[p])
    for name, values in numeric.items():
      for metric, value in _prompt_metrics(values[p], prompt_preds).items():
        by_source[source][name][metric].append(value)
  n = next(iter(numeric.values())).shape[1]
  metrics = {}
  for source, name_metrics in by_source.items():
    for name, metric_values in name_metrics.items():
      for metric, values in metric_values.items():
        is_core = name == core and metric.startswith(("mean", "maj", "best")) and f"@{n}" in metric
        metrics[f"{'val-core' if is_core else 'val-aux'}/{source}/{name}/{metric}"] = float(np.mean(values))
  metrics["val/response_length/mean"] = float(response_mask_NxR.sum(axis=1).mean())
  return metrics
