"""PPO algorithm library (docs/algorithms.md §1-4): KL estimators and controllers, advantage estimators,
policy/value losses and loss aggregation, as pure, jittable JAX functions on [N, R] arrays.

Names follow verl's `core_algos`, and the registries are keyed by verl's config strings. This
package imports no model, rollout or trainer code.
"""

from jaxrlhf.algos.advantages import (
    ADV_ESTIMATORS,
    compute_advantage,
    compute_gae_advantage_return,
    compute_gdpo_outcome_advantage,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_optimal_token_baseline_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
    compute_tir_optimal_token_baseline_advantage,
    get_adv_estimator,
    register_adv_estimator,
)
from jaxrlhf.algos.kl import (
    KL_PENALTY_TYPES,
    adaptive_kl_update,
    entropy_from_logits,
    fixed_kl_update,
    full_kl,
    kl_penalty,
    sum_pi_squared_from_logits,
)
from jaxrlhf.algos.policy_loss import (
    ACTOR_LOSS_CONFIG_KEYS,
    MODE_CONFIG_KEYS,
    POLICY_LOSS_CONFIG_KEYS,
    POLICY_LOSSES,
    compute_policy_loss,
    compute_policy_loss_bypass_mode,
    compute_policy_loss_cispo,
    compute_policy_loss_clip_cov,
    compute_policy_loss_dppo_kl,
    compute_policy_loss_dppo_tv,
    compute_policy_loss_dro,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_kl_cov,
    compute_policy_loss_sapo,
    compute_policy_loss_vanilla,
    get_policy_loss,
    register_policy_loss,
)
from jaxrlhf.algos.reward_shaping import (
    KL_CONTROLLERS,
    apply_kl_penalty,
    overlong_penalty,
    place_scores_on_last_token,
)
from jaxrlhf.algos.rollout_correction import (
    ROLLOUT_CORRECTION_CONFIG_KEYS,
    ROLLOUT_RS_OPTIONS,
    compute_offpolicy_metrics,
    compute_rollout_correction_and_rejection_mask,
    compute_rollout_correction_weights,
    compute_rollout_rejection_mask,
)
from jaxrlhf.algos.stats import (
    LOSS_AGG_MODES,
    agg_loss,
    loss_normalizers,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)
from jaxrlhf.algos.value_loss import compute_value_loss

__all__ = [
    "ACTOR_LOSS_CONFIG_KEYS", "ADV_ESTIMATORS", "KL_CONTROLLERS", "KL_PENALTY_TYPES", "LOSS_AGG_MODES",
    "MODE_CONFIG_KEYS", "POLICY_LOSSES", "POLICY_LOSS_CONFIG_KEYS", "ROLLOUT_CORRECTION_CONFIG_KEYS",
    "ROLLOUT_RS_OPTIONS", "adaptive_kl_update", "agg_loss", "apply_kl_penalty", "compute_advantage",
    "compute_gae_advantage_return", "compute_gdpo_outcome_advantage", "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage", "compute_grpo_passk_outcome_advantage", "compute_offpolicy_metrics",
    "compute_opo_outcome_advantage", "compute_optimal_token_baseline_advantage", "compute_policy_loss",
    "compute_policy_loss_bypass_mode", "compute_policy_loss_cispo", "compute_policy_loss_clip_cov",
    "compute_policy_loss_dppo_kl", "compute_policy_loss_dppo_tv", "compute_policy_loss_dro",
    "compute_policy_loss_geo_mean", "compute_policy_loss_gpg", "compute_policy_loss_gspo",
    "compute_policy_loss_kl_cov", "compute_policy_loss_sapo", "compute_policy_loss_vanilla",
    "compute_reinforce_plus_plus_baseline_outcome_advantage", "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage", "compute_rloo_outcome_advantage", "compute_rloo_vectorized_outcome_advantage",
    "compute_rollout_correction_and_rejection_mask", "compute_rollout_correction_weights",
    "compute_rollout_rejection_mask", "compute_tir_optimal_token_baseline_advantage", "compute_value_loss",
    "entropy_from_logits", "fixed_kl_update", "full_kl", "get_adv_estimator", "get_policy_loss", "kl_penalty",
    "loss_normalizers", "masked_mean", "masked_sum", "masked_var", "masked_whiten", "overlong_penalty",
    "place_scores_on_last_token", "register_adv_estimator", "register_policy_loss", "sum_pi_squared_from_logits",
]
