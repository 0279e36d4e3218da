"""The actor's and the critic's loss on one micro-batch (docs/algorithms.md §3-4), composed from `algos`.

Both have the update loop's signature `loss(trained, aux, micro, normalizers, rng) -> (loss, (metrics, rows))`;
`normalizers` are the mini-batch's (`algos.loss_normalizers`), so micro-batch losses add up. `rows`: per-row
outputs ([rows, R]) that later epochs read (`update_loop.ppo_update`), usually none.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrlhf import algos
from jaxrlhf.models import moe
from jaxrlhf.trainer.distillation import TEACHER_TOPK_IDS, Distillation
from jaxrlhf.trainer.model_outputs import REPLAYED, ModelOutputs


def actor_loss(
  trained,
  aux,
  micro,
  normalizers,
  rng,
  *,
  outputs: ModelOutputs,
  actor,
  on_policy: bool,
  rollout_correction=None,
  first_epoch: bool = False,
  distillation: Distillation | None = None,
):
  """Policy loss - entropy bonus (+ KL loss to the reference). `actor`: the actor's config section.

  `trained` (what is differentiated): the actor's `RoleState.trained`. aux: per-step values; `frozen` is the
  rest of its weights (`RoleState.frozen`); `kl_gate` is 0 during the KL warm-up, else 1; `ref_params` (the reference
  policy's weights) when `kl_loss_type="full"`: the exact KL over the vocabulary needs its logits.
  `on_policy` (one epoch, one mini-batch): the current log-prob (stopped) is the old one, so the ratio
  is exactly 1, as in verl. `rollout_correction` (`algorithm.rollout_correction`, bypass mode): the
  loss is verl's `bypass_mode` with those settings, whatever `policy_loss.loss_mode` says (as verl).
  Decoupled correction weights arrive in the micro-batch (`rollout_is_weights`).
  `first_epoch` (`PhasePlan.old_in_update`): the update's first epoch, on the rollout policy's weights. Its
  log-probs (stopped) are the old ones, and go out per row (`rows["old_log_probs"]`) for the later
  epochs, with the entropy as verl's `actor/entropy` (the old-log-prob phase's metric otherwise).
  `distillation` (`distillation.enabled`): the teacher's outputs ride in the micro-batch; the PPO loss above gains
  the distillation term, or gives way to it without `use_task_rewards` (`Distillation.loss`, as verl).
  """
  mask = micro["response_mask"]
  weights = aux["frozen"].with_trained(trained, None)
  full_kl = actor.use_kl_loss and actor.kl_loss_type == "full"
  out = outputs.token_outputs(
    weights.params,
    micro,
    ("entropy",),
    adapters=weights.adapters,
    ref_params=aux["ref_params"] if full_kl else None,
    router_stats=True,
    replay=True,
    teacher_topk_ids=micro[TEACHER_TOPK_IDS] if distillation is not None and distillation.uses_topk else None,
  )
  log_prob, entropy = out["log_prob"], out["entropy"]
  old_log_prob = jax.lax.stop_gradient(log_prob) if on_policy or first_epoch else micro["old_log_probs"]
  correction = (
    {} if rollout_correction is None else {key: rollout_correction[key] for key in algos.ROLLOUT_CORRECTION_CONFIG_KEYS}
  )
  pg_loss, pg_metrics = algos.compute_policy_loss(
    old_log_prob,
    log_prob,
    micro["advantages"],
    mask,
    loss_mode="bypass_mode" if rollout_correction is not None else actor.policy_loss.loss_mode,
    clip_ratio=actor.clip_ratio,
    clip_ratio_low=actor.clip_ratio_low,
    clip_ratio_high=actor.clip_ratio_high,
    clip_ratio_c=actor.clip_ratio_c,
    loss_agg_mode=actor.loss_agg_mode,
    rng=rng,
    rollout_is_weights=micro.get("rollout_is_weights"),
    **normalizers,
    **correction,
    **{key: actor.policy_loss[key] for key in algos.POLICY_LOSS_CONFIG_KEYS},
    **{key: actor[key] for key in algos.ACTOR_LOSS_CONFIG_KEYS},
  )
  entropy_loss = algos.agg_loss(entropy, mask, actor.loss_agg_mode, **normalizers)
  loss = pg_loss - actor.entropy_coeff * entropy_loss
  metrics = {
    "actor/pg_loss": pg_loss,
    "actor/entropy_loss": entropy_loss,
    "actor/pg_clipfrac": pg_metrics["pg_clipfrac"],
    "actor/pg_clipfrac_lower": pg_metrics["pg_clipfrac_lower"],
    "actor/ppo_kl": pg_metrics["ppo_kl"],
    # bypass mode: verl's rollout_corr/ family, each a mean over this micro-batch (see update_loop)
    **{key: value for key, value in pg_metrics.items() if key.startswith("rollout_corr/")},
  }
  rows = {}
  if first_epoch:
    metrics["actor/entropy"] = entropy_loss
    rows["old_log_probs"] = old_log_prob
  if actor.use_kl_loss:
    kl = out["full_kl"] if full_kl else algos.kl_penalty(log_prob, micro["ref_log_probs"], actor.kl_loss_type)
    kl_loss = algos.agg_loss(kl, mask, actor.loss_agg_mode, **normalizers)
    loss = loss + aux["kl_gate"] * actor.kl_loss_coef * kl_loss
    metrics["actor/kl_loss"] = kl_loss
  if distillation is not None:
    loss, distill_metrics = distillation.loss(out, micro, old_log_prob, loss, normalizers, actor.loss_agg_mode)
    metrics.update(distill_metrics)
  if "router_stats" in out:  # experts: HF's load-balancing loss, this micro-batch's share of the mini-batch's
    share = jnp.sum(mask.astype(jnp.float32)) / jnp.maximum(normalizers["global_token_count"], 1.0)
    aux_loss = moe.load_balancing_loss(*out["router_stats"][:3])
    loss = loss + outputs.actor.config.router_aux_loss_coef * share * aux_loss
    load_E = jnp.sum(out["router_stats"][0], axis=0)  # tokens routed to each expert, over the layers
    metrics["actor/moe_aux_loss"] = share * aux_loss
    metrics["actor/moe_expert_load_max"] = share * jnp.max(load_E) / jnp.maximum(jnp.mean(load_E), 1.0)
    if REPLAYED in micro or REPLAYED in micro.get("packed", {}):  # rollout routing replay: (token, layer) pairs the
      # replayed routes send elsewhere than the update's own router would
      _, _, tokens_Y, differ_Y = out["router_stats"]
      metrics["actor/moe_replay_route_mismatch"] = share * jnp.sum(differ_Y) / jnp.maximum(jnp.sum(tokens_Y), 1.0)
  return loss, (metrics, rows)


def critic_loss(trained, aux, micro, normalizers, unused_rng, *, outputs: ModelOutputs, critic):
  """Clipped value loss. `critic`: the critic's config section.

  `trained` (what is differentiated): the critic's `RoleState.trained`; aux["frozen"]: the rest of its
  weights (`RoleState.frozen`)."""
  weights = aux["frozen"].with_trained(trained, None)
  vpreds = outputs.values(weights.params, micro, weights.adapters)
  vf_loss, vf_clipfrac = algos.compute_value_loss(
    vpreds,
    micro["values"],
    micro["returns"],
    micro["response_mask"],
    critic.cliprange_value,
    loss_agg_mode=critic.loss_agg_mode,
    **normalizers,
  )
  # vpred_mean is a per-token mean: normalise it like the loss so micro-batches add up.
  vpred_mean = algos.agg_loss(
    vpreds, micro["response_mask"], "token-mean", global_token_count=normalizers["global_token_count"]
  )
  metrics = {"critic/vf_loss": vf_loss, "critic/vf_clipfrac": vf_clipfrac, "critic/vpred_mean": vpred_mean}
  return vf_loss, (metrics, {})
