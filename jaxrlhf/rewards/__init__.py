"""Rewards: rule scorers by data_source (verl's, registry.py), user reward files, batch scoring in
the trainer's process or in worker processes (parallel, a time limit per sample, crashes contained).

Pure Python/NumPy: nothing here imports JAX, models or the trainer, so scorers run in a host
callback, in plain scripts and in reward worker processes alike.
"""

from jaxrlhf.rewards.batch import ERROR_KEY, RewardFunctionError, RewardScorer, score_batch
from jaxrlhf.rewards.custom import RewardSource, get_compute_score_fn, load_custom_reward_function
from jaxrlhf.rewards.registry import (
  UnknownDataSourceError,
  default_compute_score,
  get_reward_fn,
  register_reward,
  registered_data_sources,
  unregister_reward,
)
from jaxrlhf.rewards.workers import RewardWorkerError, default_num_workers

__all__ = [
  "ERROR_KEY",
  "RewardFunctionError",
  "RewardScorer",
  "RewardSource",
  "RewardWorkerError",
  "UnknownDataSourceError",
  "default_compute_score",
  "default_num_workers",
  "get_compute_score_fn",
  "get_reward_fn",
  "load_custom_reward_function",
  "register_reward",
  "registered_data_sources",
  "score_batch",
  "unregister_reward",
]
