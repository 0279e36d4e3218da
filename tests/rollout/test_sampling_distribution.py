"""Sampling is correct in distribution: chi-square of many draws vs softmax(logits / T) restricted by top-k/top-p."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxrlhf.rollout import SamplingParams, choose_tokens

LOGITS_V = np.array([2.0, 1.5, 1.2, 0.9, 0.3, 0.0, -0.5, -1.5], np.float32)
NUM_SAMPLES = 40_000


def expected_probs(temperature, top_k, top_p):
  """Reference restriction in plain numpy: top-k by rank, then the smallest prefix with mass >= top_p."""
  scaled = LOGITS_V.astype(np.float64) / temperature
  probs = np.exp(scaled - scaled.max())
  probs /= probs.sum()
  order = np.argsort(-probs)
  kept = np.zeros(len(probs), bool)
  kept[order[: top_k if top_k > 0 else len(probs)]] = True
  restricted = np.where(kept, probs, 0) / probs[kept].sum()
  mass = 0.0
  nucleus = np.zeros(len(probs), bool)
  for token in order:
    if not kept[token] or mass >= top_p:
      break
    nucleus[token] = True
    mass += restricted[token]
  final = np.where(nucleus, restricted, 0)
  return final / final.sum()


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, -1, 1.0), (0.7, 3, 1.0), (1.5, -1, 0.8), (1.2, 5, 0.75)])
def test_empirical_frequencies_match_restricted_softmax(temperature, top_k, top_p):
  sampling = SamplingParams(
    max_new_tokens=1, eos_token_ids=(0,), pad_token_id=0, temperature=temperature, top_k=top_k, top_p=top_p
  )
  logits_BxV = jnp.broadcast_to(jnp.asarray(LOGITS_V), (NUM_SAMPLES, len(LOGITS_V)))
  # Per-row keys: the engine's path (one key per slot).
  keys_B = jax.random.split(jax.random.key(1234), NUM_SAMPLES)
  tokens_B = np.asarray(jax.jit(lambda logits, key: choose_tokens(logits, key, sampling))(logits_BxV, keys_B))
  counts = np.bincount(tokens_B, minlength=len(LOGITS_V))
  probs = expected_probs(temperature, top_k, top_p)
  assert counts[probs == 0].sum() == 0, f"sampled a token outside top-k/top-p: {counts}"
  support = probs > 0
  assert support.sum() >= 2
  statistic, p_value = stats.chisquare(counts[support], counts.sum() * probs[support] / probs[support].sum())
  assert p_value > 1e-3, (counts, NUM_SAMPLES * probs, statistic)
  # The test has power: the same draws reject a distribution with another temperature.
  wrong = expected_probs(temperature * 1.5, -1, 1.0)[support]
  assert stats.chisquare(counts[support], counts.sum() * wrong / wrong.sum()).pvalue < 1e-6


def test_one_key_for_the_batch_samples_the_same_distribution():
  sampling = SamplingParams(max_new_tokens=1, eos_token_ids=(0,), pad_token_id=0, temperature=0.9, top_k=4)
  logits_BxV = jnp.broadcast_to(jnp.asarray(LOGITS_V), (NUM_SAMPLES, len(LOGITS_V)))
  tokens_B = np.asarray(
    jax.jit(lambda logits, key: choose_tokens(logits, key, sampling))(logits_BxV, jax.random.key(7))
  )
  counts = np.bincount(tokens_B, minlength=len(LOGITS_V))
  probs = expected_probs(0.9, 4, 1.0)
  assert counts[probs == 0].sum() == 0
  assert stats.chisquare(counts[probs > 0], counts.sum() * probs[probs > 0] / probs[probs > 0].sum()).pvalue > 1e-3
