"""Phase `adv` (docs/algorithms.md §5): the KL penalty in the reward (+ controller update), verl's rollout
correction (decoupled mode), then the configured advantage estimator. The math is `jaxrlhf.algos`'s;
this composes it in verl's order.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxrlhf import algos
from jaxrlhf.trainer.records import Advantages, OldLogProbs, Rollout, Scored


def advantages(
  algo,
  *,
  decoupled_correction: bool,
  kl_coef,
  kl_gate,
  rollout: Rollout,
  scored: Scored,
  old: OldLogProbs,
  ref_log_probs,
  values,
) -> Advantages:
  """`algo`: the `algorithm` config section; `kl_gate`: 0.0 during the KL warm-up, else 1.0; `old`: the
  old-log-prob phase's record (its `sum_pi_squared` feeds the optimal token baselines, `full_kl` the full KL)."""
  old_log_probs = old.log_probs
  metrics = {}
  token_level_rewards = scored.token_level_scores
  response_mask, rollout_is_weights = rollout.response_mask, None
  next_kl_coef = kl_coef
  if algo.use_kl_in_reward:
    token_level_rewards, next_kl_coef, current_kl = algos.apply_kl_penalty(
      token_level_rewards,
      old_log_probs,
      ref_log_probs,
      rollout.response_mask,
      kl_coef,
      kl_penalty_type=algo.kl_penalty,
      kl_ctrl_type=algo.kl_ctrl.type,
      target_kl=algo.kl_ctrl.target_kl,
      horizon=algo.kl_ctrl.horizon,
      kl_gate=kl_gate,
      full_kl_NxR=old.full_kl,
    )
    metrics["actor/reward_kl_penalty"] = current_kl
    metrics["actor/reward_kl_penalty_coeff"] = kl_coef
  if decoupled_correction:
    # As verl: rejected tokens leave the response mask for the estimator and both updates.
    correction = algo.rollout_correction
    rollout_is_weights, response_mask, correction_metrics = algos.compute_rollout_correction_and_rejection_mask(
      old_log_probs,
      rollout.rollout_log_probs,
      response_mask,
      **{key: correction[key] for key in algos.ROLLOUT_CORRECTION_CONFIG_KEYS if key != "loss_type"},
    )
    response_mask = response_mask.astype(rollout.response_mask.dtype)
    metrics.update(correction_metrics)
  advantages_NxR, returns_NxR = algos.compute_advantage(
    algo.adv_estimator,
    token_level_rewards=token_level_rewards,
    response_mask=response_mask.astype(jnp.float32),
    values=values,
    index=rollout.group_index,
    reward_baselines=scored.reward_baselines,
    gamma=algo.gamma,
    lam=algo.lam,
    norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo,
    old_log_probs=old_log_probs,
    sum_pi_squared=old.sum_pi_squared,
    rollout_is_weights=rollout_is_weights,
    reward_components=scored.reward_components,
    reward_weights=algo.gdpo_reward_weights,
  )
  return Advantages(
    advantages=advantages_NxR,
    returns=returns_NxR,
    token_level_rewards=token_level_rewards,
    response_mask=response_mask,
    kl_coef=next_kl_coef,
    metrics=metrics,
    rollout_is_weights=rollout_is_weights,
  )
