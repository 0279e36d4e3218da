"""Validation: the compiled sample + score program and the metrics of its scores (SPEC §7 `val-core`).

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
  """`validate(actor_params, reward_params, batch, rng) -> (scores_N, responses_NxR, response_mask_NxR)`.

  Each prompt is sampled `val_kwargs.n` times with `sampling`; `reward_fn` looks rows up in the
  validation set.
  """

  def validate(actor_params, reward_params, batch, rng):
    n = ppo.config.actor_rollout_ref.rollout.val_kwargs.n
    prompts_NxP = jnp.repeat(batch["input_ids"], n, axis=0)
    prompt_mask_NxP = jnp.repeat(batch["attention_mask"], n, axis=0)
    sample_index_N = jnp.repeat(batch["sample_index"], n, axis=0)
    generation = ppo.generation
    rollout = generation.sample(generation.generation_params(actor_params), prompts_NxP, prompt_mask_NxP, rng,
                                sampling)
    scores_N, _ = reward.sequence_scores(ppo.config.reward_model, reward_fn, ppo.reward_model, reward_params,
                                         prompts_NxP, prompt_mask_NxP, rollout["responses"], rollout["response_mask"],
                                         sample_index_N)
    return scores_N, rollout["responses"], rollout["response_mask"]

  return validate


def validation_metrics(data_sources: Sequence[str], prompt_scores: np.ndarray, response_mask_NxR: np.ndarray,
                       ) -> dict[str, float]:
  """`val-core/<data_source>/reward/mean@n` and `val/response_length/mean`.

  prompt_scores: [prompts, n], the scores of each prompt's n samples; data_sources: one per prompt.
  """
  n = prompt_scores.shape[1]
  by_source = defaultdict(list)
  for source, row_scores in zip(data_sources, prompt_scores):
    by_source[source].append(row_scores)
  metrics = {f"val-core/{source}/reward/mean@{n}": float(np.mean(rows)) for source, rows in by_source.items()}
  metrics["val/response_length/mean"] = float(response_mask_NxR.sum(axis=1).mean())
  return metrics
