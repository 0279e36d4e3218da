"""Rewards: rule scorers by data_source (GSM8K, MATH, exact match), user reward files, batch scoring.

Pure Python/NumPy: nothing here imports JAX, models or the trainer, so scorers run in a host
callback and in plain scripts alike.
"""

from jaxrlhf.rewards.batch import ERROR_KEY, RewardFunctionError, score_batch
from jaxrlhf.rewards.custom import get_compute_score_fn, load_custom_reward_function
from jaxrlhf.rewards.registry import (
    UnknownDataSourceError,
    default_compute_score,
    get_reward_fn,
    register_reward,
    registered_data_sources,
    unregister_reward,
)

__all__ = [
    "ERROR_KEY",
    "RewardFunctionError",
    "UnknownDataSourceError",
    "default_compute_score",
    "get_compute_score_fn",
    "get_reward_fn",
    "load_custom_reward_function",
    "register_reward",
    "registered_data_sources",
    "score_batch",
    "unregister_reward",
]
