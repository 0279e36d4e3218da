"""From sequence scores to the token-level rewards the advantage estimators read (docs/algorithms.md §2, §3).

The step composes these in order: `overlong_penalty` (DAPO's soft length penalty, added to each
sequence's score), `place_scores_on_last_token` (verl's `token_level_scores`: the score sits on the
last response token), then `apply_kl_penalty` (verl's name: the KL to the reference subtracted from
every token when `algorithm.use_kl_in_reward`, and the KL controller's update of the coefficient).
"""

import jax
import jax.numpy as jnp

from jaxrlhf.algos.kl import adaptive_kl_update, fixed_kl_update, kl_penalty
from jaxrlhf.algos.stats import masked_mean

KL_CONTROLLERS = ("fixed", "adaptive")


def overlong_penalty(lengths_N, max_response_length: int, buffer_len: int, penalty_factor: float):
  """DAPO: 0 up to `max_response_length - buffer_len` tokens, then linear down to -penalty_factor at the max."""
  expected = max_response_length - buffer_len
  return jnp.minimum(-(lengths_N - expected) / buffer_len * penalty_factor, 0.0)


def place_scores_on_last_token(scores_N, response_mask_NxR):
  """[N] sequence scores -> [N, R] fp32, each score on its row's last response token, 0 elsewhere.

  The last token is the mask's last 1: length - 1 for a response contiguous from position 0, the policy's last
  token of a multi-turn response (tool tokens are 0 in its mask). An empty response scores nothing.
  """
  width = response_mask_NxR.shape[1]
  last_N = width - 1 - jnp.argmax(response_mask_NxR[:, ::-1] > 0, axis=1)
  last_NxR = jax.nn.one_hot(last_N, width)
  return last_NxR * scores_N[:, None] * response_mask_NxR.astype(jnp.float32)


def apply_kl_penalty(
  token_level_scores_NxR,
  old_log_prob_NxR,
  ref_log_prob_NxR,
  response_mask_NxR,
  kl_coef,
  *,
  kl_penalty_type: str,
  kl_ctrl_type: str = "fixed",
  target_kl: float = 0.0,
  horizon: float = 1.0,
  kl_gate=1.0,
  full_kl_NxR=None,
):
  """token_level_rewards = token_level_scores - kl_gate * beta * KL per token, and the controller
  (docs/algorithms.md §2).

  `kl_gate` gates the penalty (1, or 0 during a KL warm-up). `kl_penalty_type="full"` reads the exact
  per-token KL over the vocabulary from `full_kl_NxR` (`full_kl` of both policies' logits) instead of
  an estimate from the sampled token's log-probs. Returns (token_level_rewards_NxR,
  new kl_coef, current_kl): current_kl is the mean over sequences of each sequence's token-mean KL,
  what the adaptive controller tracks (and verl logs as `actor/reward_kl_penalty`).
  """
  if kl_ctrl_type not in KL_CONTROLLERS:
    raise ValueError(f"algorithm.kl_ctrl.type={kl_ctrl_type!r}; expected one of {list(KL_CONTROLLERS)}")
  mask_f = response_mask_NxR.astype(jnp.float32)
  if kl_penalty_type == "full":
    if full_kl_NxR is None:
      raise ValueError("kl_penalty_type='full' needs full_kl_NxR: the exact KL from both policies' logits")
    kl_NxR = full_kl_NxR * mask_f
  else:
    kl_NxR = kl_penalty(old_log_prob_NxR, ref_log_prob_NxR, kl_penalty_type) * mask_f
  token_level_rewards_NxR = token_level_scores_NxR - kl_gate * kl_coef * kl_NxR
  current_kl = jnp.mean(masked_mean(kl_NxR, mask_f, axis=-1))
  num_sequences = mask_f.shape[0]
  if kl_ctrl_type == "adaptive":
    new_kl_coef = adaptive_kl_update(kl_coef, current_kl, num_sequences, target_kl, horizon)
  else:
    new_kl_coef = fixed_kl_update(kl_coef, current_kl, num_sequences)
  return token_level_rewards_NxR, new_kl_coef, current_kl
