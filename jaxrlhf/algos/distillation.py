"""On-policy distillation losses keyed by verl's `distillation.distillation_loss.loss_mode` (docs/algorithms.md
"On-policy distillation").

The student samples; a frozen teacher scores the sampled tokens. Two families, as verl 0.9.1:
- single-sample estimators of the reverse KL(student || teacher) at the sampled token (`kl`/`k1`, `abs`,
  `mse`/`k2`, `low_var_kl`/`k3`): `kl_penalty(student_log_prob, teacher_log_prob, mode)`, the KL
  penalty's own estimators;
- `forward_kl_topk`: the forward KL(teacher || student) over the teacher's top-k tokens at each position,
  sum_k p_t(k) (log p_t(k) - log q_s(k)), floored at 0 (the top-k masses do not sum to 1, so the truncated
  sum can go negative). The student's log-probs are gathered at the teacher's ids from its chunked LM head.

The per-token losses then go through verl's clamp (`loss_max_clamp`: to [-c, c]) and either straight into
the aggregated loss (a supervised loss) or, with `use_policy_gradient`, into the vanilla PPO loss as a
per-token advantage `-sg(loss)` (the KL as a reward). Pure functions on [N, R] (and [N, R, K]) arrays;
fp32 math.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrlhf.algos.kl import kl_penalty
from jaxrlhf.algos.policy_loss import compute_policy_loss
from jaxrlhf.algos.stats import agg_loss, as_f32, zero_masked

DISTILLATION_ESTIMATOR_MODES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
DISTILLATION_TOPK_MODES = ("forward_kl_topk",)
DISTILLATION_LOSS_MODES = DISTILLATION_ESTIMATOR_MODES + DISTILLATION_TOPK_MODES


def uses_topk(loss_mode: str) -> bool:
  """Whether `loss_mode` reads the teacher's top-k log-probs (else the sampled token's log-prob)."""
  if loss_mode not in DISTILLATION_LOSS_MODES:
    raise ValueError(f"Unknown distillation loss_mode {loss_mode!r}; expected one of {list(DISTILLATION_LOSS_MODES)}")
  return loss_mode in DISTILLATION_TOPK_MODES


def topk_log_probs(logits_BxLxV, k: int):
  """(log-probs [B, L, k], ids [B, L, k] int32) of the k most likely tokens of softmax(logits), fp32.
  Called on one chunk of the LM head's positions at a time, so [B, L, V] is one chunk's logits."""
  z_BxLxV = as_f32(logits_BxLxV)
  top_BxLxK, ids_BxLxK = jax.lax.top_k(z_BxLxV, k)
  return top_BxLxK - jax.nn.logsumexp(z_BxLxV, axis=-1, keepdims=True), ids_BxLxK.astype(jnp.int32)


def gather_log_probs(logits_BxLxV, ids_BxLxK):
  """log softmax(logits) at `ids`: [B, L, K], fp32 (verl's `log_softmax(x).gather(ids)`, without the
  [B, L, V] log-softmax)."""
  z_BxLxV = as_f32(logits_BxLxV)
  picked_BxLxK = jnp.take_along_axis(z_BxLxV, ids_BxLxK, axis=-1)
  return picked_BxLxK - jax.nn.logsumexp(z_BxLxV, axis=-1, keepdims=True)


def topk_overlap_count(logits_BxLxV, teacher_ids_BxLxK):
  """How many of the teacher's top-k ids are also among the student's top-k: [B, L] int32 (verl's overlap
  diagnostic, arXiv:2604.13016)."""
  _, student_ids_BxLxK = jax.lax.top_k(as_f32(logits_BxLxV), teacher_ids_BxLxK.shape[-1])
  same_BxLxKxK = teacher_ids_BxLxK[..., :, None] == student_ids_BxLxK[..., None, :]
  return jnp.sum(jnp.any(same_BxLxKxK, axis=-1), axis=-1).astype(jnp.int32)


def forward_kl_topk(student_topk_log_probs, teacher_topk_log_probs, log_prob_min_clamp: float | None = None):
  """Per-token forward KL over the teacher's top-k -> dict(losses, student_mass, teacher_mass), each [N, R].

  `student_topk_log_probs`: the student's log-probs at the teacher's top-k ids [N, R, K]. The masses (the
  probability each distribution puts on those k ids) are taken before `log_prob_min_clamp` floors both
  log-probs; the loss is sum_k exp(t) (t - s) on the floored values, then floored at 0 (as verl).
  """
  student, teacher = as_f32(student_topk_log_probs), as_f32(teacher_topk_log_probs)
  student_mass, teacher_mass = jnp.sum(jnp.exp(student), axis=-1), jnp.sum(jnp.exp(teacher), axis=-1)
  if log_prob_min_clamp is not None:
    student, teacher = jnp.maximum(student, log_prob_min_clamp), jnp.maximum(teacher, log_prob_min_clamp)
  losses = jnp.maximum(jnp.sum(jnp.exp(teacher) * (teacher - student), axis=-1), 0.0)
  return dict(losses=losses, student_mass=student_mass, teacher_mass=teacher_mass)


def distillation_token_losses(loss_mode: str, log_prob, teacher_log_prob):
  """The estimator modes' per-token loss [N, R]: `kl_penalty(student, teacher, loss_mode)` (no
  `log_prob_min_clamp`: verl applies it to the top-k mode only)."""
  if uses_topk(loss_mode):
    raise ValueError(f"loss_mode {loss_mode!r} reads top-k log-probs: call forward_kl_topk")
  return kl_penalty(log_prob, teacher_log_prob, loss_mode)


def compute_distillation_loss(
  token_losses,
  response_mask,
  *,
  loss_agg_mode: str = "token-mean",
  loss_max_clamp: float | None = None,
  use_policy_gradient: bool = False,
  log_prob=None,
  old_log_prob=None,
  clip_ratio: float = 0.2,
  clip_ratio_low: float | None = None,
  clip_ratio_high: float | None = None,
  clip_ratio_c: float = 3.0,
  **normalizers,
):
  """The distillation term of the actor loss from per-token losses [N, R] -> (loss, metrics), verl 0.9.1's
  `distillation_loss`.

  `loss_min`/`loss_max` (over valid tokens) are read before `loss_max_clamp` clamps to [-c, c] (both sides:
  k1 can be negative). Without `use_policy_gradient` the loss is `agg_loss` of the clamped losses, which
  carry the gradient. With it, the vanilla PPO loss of `log_prob` against `old_log_prob` with advantages
  -sg(clamped losses) (the Thinking Machines recipe: the reverse KL as a per-token reward); its metrics
  come back as pg_clipfrac, pg_clipfrac_lower and ppo_kl. `normalizers`: `agg_loss`'s mini-batch denominators.
  """
  mask = jnp.asarray(response_mask) != 0
  token_losses = as_f32(token_losses)
  metrics = {
    "loss_min": jnp.min(jnp.where(mask, token_losses, jnp.inf)),
    "loss_max": jnp.max(jnp.where(mask, token_losses, -jnp.inf)),
  }
  if loss_max_clamp is not None:
    token_losses = jnp.clip(token_losses, -loss_max_clamp, loss_max_clamp)
  if not use_policy_gradient:
    return agg_loss(zero_masked(token_losses, mask), mask, loss_agg_mode, **normalizers), metrics
  loss, pg_metrics = compute_policy_loss(
    old_log_prob,
    log_prob,
    -jax.lax.stop_gradient(token_losses),
    mask,
    loss_mode="vanilla",
    clip_ratio=clip_ratio,
    clip_ratio_low=clip_ratio_low,
    clip_ratio_high=clip_ratio_high,
    clip_ratio_c=clip_ratio_c,
    loss_agg_mode=loss_agg_mode,
    **normalizers,
  )
  return loss, {**metrics, **pg_metrics}


def combine_with_policy_loss(
  policy_loss, distillation_loss, *, use_task_rewards: bool, distillation_loss_coef: float = 1.0
):
  """verl's `distillation_ppo_loss`: with task rewards, the PPO loss + coef * the distillation term; without,
  the distillation term alone (coefficient 1)."""
  if use_task_rewards:
    return policy_loss + distillation_loss_coef * distillation_loss
  return distillation_loss
