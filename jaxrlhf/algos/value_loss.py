"""Clipped value-function loss of the PPO critic (docs/algorithms.md §4 "Value")."""

import jax.numpy as jnp

from jaxrlhf.algos.stats import agg_loss, as_f32, token_mean


def compute_value_loss(
  vpreds,
  values,
  returns,
  response_mask,
  cliprange_value,
  loss_agg_mode="token-mean",
  **agg_kwargs,
):
  """(vf_loss, vf_clipfrac) with
  vclip = clip(vpreds, values - c, values + c);
  vf_loss = 0.5 * agg(max((vpreds-ret)^2, (vclip-ret)^2)); vf_clipfrac = mean_m[(vclip-ret)^2 > (vpreds-ret)^2].

  Argument order is (vpreds, values, returns), as in docs/algorithms.md §1; verl's function takes
  (vpreds, returns, values): call by keyword when porting. `agg_kwargs` (global_token_count, global_seq_count,
  loss_scale_factor) go to `agg_loss`; `global_token_count` also normalises vf_clipfrac so that it
  is additive over micro-batches like the loss.
  """
  vpreds_NxR, values_NxR, returns_NxR = as_f32(vpreds), as_f32(values), as_f32(returns)
  vpred_clipped_NxR = jnp.clip(vpreds_NxR, values_NxR - cliprange_value, values_NxR + cliprange_value)
  unclipped_NxR = jnp.square(vpreds_NxR - returns_NxR)
  clipped_NxR = jnp.square(vpred_clipped_NxR - returns_NxR)
  vf_loss = 0.5 * agg_loss(jnp.maximum(unclipped_NxR, clipped_NxR), response_mask, loss_agg_mode, **agg_kwargs)
  vf_clipfrac = token_mean(
    (clipped_NxR > unclipped_NxR).astype(jnp.float32), response_mask, agg_kwargs.get("global_token_count")
  )
  return vf_loss, vf_clipfrac
