"""On-policy distillation in the step (docs/algorithms.md "On-policy distillation"): verl's `distillation.*` read
once, the teacher's phase, and the term the actor loss adds.

The teacher is a frozen model of its own architecture with the student's vocabulary, in the train layout like
the reference policy (`TrainState.teacher_params`). Phase `teacher` runs it forward over the rollout (after the
reward, beside the reference): the log-prob of each sampled token, or for `forward_kl_topk` its top-k log-probs
and ids, by chunks of the LM head. The actor loss then compares the student's own log-probs (or its log-probs at
the teacher's ids) with them per micro-batch (`Distillation.loss`), through `jaxrlhf.algos.distillation`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxrlhf import algos

# What the teacher phase adds to the update's per-row data.
TEACHER_LOG_PROBS = "teacher_log_probs"  # [N, R]: the estimator modes
TEACHER_TOPK_LOG_PROBS = "teacher_topk_log_probs"  # [N, R, K]: forward_kl_topk
TEACHER_TOPK_IDS = "teacher_topk_ids"  # [N, R, K] int32


@dataclasses.dataclass(frozen=True)
class Distillation:
  """`distillation.distillation_loss.*`, read once (None when `distillation.enabled` is off)."""

  loss_mode: str
  topk: int
  use_task_rewards: bool
  distillation_loss_coef: float
  loss_max_clamp: float | None
  log_prob_min_clamp: float | None
  use_policy_gradient: bool
  clip_ratio: float
  clip_ratio_low: float
  clip_ratio_high: float

  @classmethod
  def from_config(cls, config) -> Distillation | None:
    if not config.distillation.enabled:
      return None
    loss = config.distillation.distillation_loss
    return cls(**{field.name: loss[field.name] for field in dataclasses.fields(cls)})

  @property
  def uses_topk(self) -> bool:
    return algos.uses_topk(self.loss_mode)

  def teacher_data(self, out: dict) -> dict:
    """The teacher phase's outputs (`ModelOutputs.teacher_outputs`) under the update data's names."""
    if self.uses_topk:
      return {TEACHER_TOPK_LOG_PROBS: out["topk_log_probs"], TEACHER_TOPK_IDS: out["topk_ids"]}
    return {TEACHER_LOG_PROBS: out["log_prob"]}

  def loss(self, student: dict, micro: dict, old_log_prob, policy_loss, normalizers: dict, loss_agg_mode: str):
    """(the actor's loss with the distillation term, metrics) from one micro-batch.

    `student`: the actor's token outputs ("log_prob", and for forward_kl_topk "topk_log_probs" at the teacher's
    ids and "topk_overlap"); `policy_loss`: the PPO loss (policy, entropy, KL) that `use_task_rewards` keeps.
    Metrics by verl's names (`distillation/*`); token means are normalised by the mini-batch's token count, so
    they add up over micro-batches like the loss."""
    mask = micro["response_mask"]
    valid = jnp.asarray(mask) != 0
    token_mean = lambda x: jnp.sum(jnp.where(valid, x, 0.0)) / jnp.maximum(normalizers["global_token_count"], 1.0)
    metrics = {}
    if self.uses_topk:
      kl = algos.forward_kl_topk(student["topk_log_probs"], micro[TEACHER_TOPK_LOG_PROBS], self.log_prob_min_clamp)
      token_losses = kl["losses"]
      metrics["distillation/student_mass"] = token_mean(kl["student_mass"])
      metrics["distillation/teacher_mass"] = token_mean(kl["teacher_mass"])
      metrics["distillation/overlap_ratio"] = token_mean(student["topk_overlap"].astype(jnp.float32)) / self.topk
    else:
      token_losses = algos.distillation_token_losses(self.loss_mode, student["log_prob"], micro[TEACHER_LOG_PROBS])
      metrics["distillation/abs_loss"] = token_mean(jnp.abs(token_losses))
    distill_loss, distill_metrics = algos.compute_distillation_loss(
      token_losses,
      mask,
      loss_agg_mode=loss_agg_mode,
      loss_max_clamp=self.loss_max_clamp,
      use_policy_gradient=self.use_policy_gradient,
      log_prob=student["log_prob"],
      old_log_prob=jax.lax.stop_gradient(old_log_prob),
      clip_ratio=self.clip_ratio,
      clip_ratio_low=self.clip_ratio_low,
      clip_ratio_high=self.clip_ratio_high,
      **normalizers,
    )
    metrics.update({f"distillation/{name}": value for name, value in distill_metrics.items()})
    metrics["distillation/loss"] = distill_loss
    loss = algos.combine_with_policy_loss(
      policy_loss,
      distill_loss,
      use_task_rewards=self.use_task_rewards,
      distillation_loss_coef=self.distillation_loss_coef,
    )
    return loss, metrics
