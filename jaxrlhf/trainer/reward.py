"""The bridge from token ids inside the compiled step to Python rule rewards on the host.

One `jax.pure_callback` per batch: decode every response (batched), look each row's data_source,
ground truth and extra_info up by its `sample_index` in the host-side dataset, and score the whole
batch with `jaxrlhf.rewards.score_batch`.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxrlhf import rewards
from jaxrlhf.data import PromptDataset


def decode_responses(tokenizer, responses_NxR: np.ndarray, response_mask_NxR: np.ndarray) -> list[str]:
  rows = [ids[mask > 0].tolist() for ids, mask in zip(np.asarray(responses_NxR), np.asarray(response_mask_NxR))]
  return tokenizer.batch_decode(rows, skip_special_tokens=True)


def make_reward_fn(tokenizer, dataset: PromptDataset, compute_score_fn: Callable | None = None):
  """Returns `reward_fn(responses_NxR, response_mask_NxR, sample_index_N) -> scores_N` (jittable)."""

  def host_score(responses_NxR, response_mask_NxR, sample_index_N):
    texts = decode_responses(tokenizer, responses_NxR, response_mask_NxR)
    rows = np.asarray(sample_index_N).tolist()
    scores_N, _ = rewards.score_batch(
        compute_score_fn,
        [dataset.data_sources[i] for i in rows],
        texts,
        [dataset.ground_truths[i] for i in rows],
        [dataset.extra_infos[i] for i in rows])
    return scores_N.astype(np.float32)

  def reward_fn(responses_NxR, response_mask_NxR, sample_index_N):
    result = jax.ShapeDtypeStruct((responses_NxR.shape[0],), jnp.float32)
    return jax.pure_callback(host_score, result, responses_NxR, response_mask_NxR, sample_index_N,
                             vmap_method="sequential")

  return reward_fn
