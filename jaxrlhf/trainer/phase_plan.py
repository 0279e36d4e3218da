"""Which phases the PPO step runs, and how: every switch read once from the config (docs/algorithms.md §5).

`PPOStep` composes the phases; this says which of them run for a config, so the choices are in one
place and the step reads as the composition alone.
"""

from __future__ import annotations

import dataclasses

# Advantage estimators that need sum(pi^2) over the vocabulary from the old-log-prob phase.
OTB_ESTIMATORS = ("optimal_token_baseline", "tir_optimal_token_baseline")


@dataclasses.dataclass(frozen=True)
class PhasePlan:
  use_critic: bool  # phases values and update_critic
  use_reference: bool  # a reference policy is needed (KL loss or KL in the reward)
  # LoRA: the actor trains adapters over a frozen base, and the base (adapters off) is the reference
  # policy, so no copy of the weights is stored for it.
  actor_lora: bool
  # Critic LoRA: the critic trains adapters and its value head over a frozen backbone.
  critic_lora: bool
  stores_reference: bool
  # Exact KL over the vocabulary ("full") needs both policies' logits in one place: the old-log-prob
  # phase runs the reference too (for the reward; it then yields the reference log-probs as well, so
  # there is no separate ref phase), and the actor loss runs it per micro-batch.
  full_kl_in_reward: bool
  full_kl_loss: bool
  ref_phase: bool
  # verl 0.9.1's rollout correction between the sampler's log-probs and the trainer's. Bypass mode: the
  # rollout's log-probs are the old ones (no old-log-prob forward unless a statistic or the full KL needs
  # it) and the `bypass_mode` loss corrects per micro-batch. Decoupled mode (rollout_is / rollout_rs set):
  # weights and rejection from the old-log-prob phase's log-probs, once per batch, before the estimator.
  bypass: bool
  decoupled_correction: bool
  old_forward: bool
  sum_pi_squared: bool  # the old-log-prob phase also gives sum(pi^2) (optimal token baselines)
  # Performance switches (`packing`): the critic follows the actor's (or its own model's) packing.
  actor_packed: bool
  critic_packed: bool
  # One epoch over one mini-batch: the old log-probs equal the current ones (in bypass mode they are the
  # rollout's, never on-policy by construction).
  on_policy: bool
  # One mini-batch per epoch and nothing before the update reads the old log-probs (no KL in the reward,
  # no rollout correction, no optimal token baseline): the update's first epoch runs on the rollout
  # policy's weights, so its forward gives the old log-probs (and verl's `actor/entropy`) and the
  # old-log-prob forward is not run. Packed updates keep the phase.
  old_in_update: bool
  # verl counts steps from 1 and updates the actor once `critic_warmup <= step`: the actor skips this
  # many steps (0-based), and its learning rate schedule starts at its own step 0 after them.
  actor_warmup_steps: int

  def actor_updates_at(self, step: int) -> bool:
    """Whether the actor updates at 0-based trainer step `step` (the one place the warm-up is read on the host)."""
    return step >= self.actor_warmup_steps

  @classmethod
  def from_config(cls, config, model_config, critic_model_config) -> PhasePlan:
    """`model_config` / `critic_model_config`: the actor's and critic's `DecoderConfig` (LoRA by rank)."""
    actor_lora, critic_lora = model_config.lora_rank > 0, critic_model_config.lora_rank > 0
    actor, algo = config.actor_rollout_ref.actor, config.algorithm
    correction = algo.rollout_correction
    use_reference = bool(actor.use_kl_loss or algo.use_kl_in_reward)
    full_kl_in_reward = bool(algo.use_kl_in_reward and algo.kl_penalty == "full")
    bypass = bool(correction.bypass_mode)
    sum_pi_squared = algo.adv_estimator in OTB_ESTIMATORS
    actor_packed = bool(config.actor_rollout_ref.model.use_remove_padding)
    decoupled_correction = not bypass and (correction.rollout_is is not None or correction.rollout_rs is not None)
    one_mini_batch = actor.ppo_mini_batch_size == config.data.train_batch_size
    actor_warmup_steps = max(config.trainer.critic_warmup - 1, 0) if config.critic.enable else 0
    return cls(
      use_critic=bool(config.critic.enable),
      use_reference=use_reference,
      actor_lora=actor_lora,
      critic_lora=critic_lora and bool(config.critic.enable),
      stores_reference=use_reference and not actor_lora,
      full_kl_in_reward=full_kl_in_reward,
      full_kl_loss=bool(actor.use_kl_loss and actor.kl_loss_type == "full"),
      ref_phase=use_reference and not full_kl_in_reward,
      bypass=bypass,
      decoupled_correction=decoupled_correction,
      old_forward=not bypass or full_kl_in_reward or sum_pi_squared,
      sum_pi_squared=sum_pi_squared,
      actor_packed=actor_packed,
      critic_packed=actor_packed or bool(config.critic.model.use_remove_padding),
      on_policy=actor.ppo_epochs == 1 and one_mini_batch and not bypass,
      old_in_update=(
        one_mini_batch
        and not (bypass or decoupled_correction or sum_pi_squared or actor_packed)
        and not algo.use_kl_in_reward
        and actor_warmup_steps == 0
      ),
      actor_warmup_steps=actor_warmup_steps,
    )
