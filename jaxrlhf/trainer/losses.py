"""The actor's and the critic's loss on one micro-batch (SPEC §3-§4), composed from `algos`.

Both have the update loop's signature `loss(params, aux, micro, normalizers, rng) -> (loss, metrics)`;
`normalizers` are the mini-batch's (`algos.loss_normalizers`), so micro-batch losses add up.
"""

from __future__ import annotations

import jax

from jaxrlhf import algos
from jaxrlhf.trainer.model_outputs import ModelOutputs


def actor_loss(params, aux, micro, normalizers, rng, *, outputs: ModelOutputs, actor, on_policy: bool):
  """Policy loss - entropy bonus (+ KL loss to the reference). `actor`: the actor's config section.

  aux: per-step values; `kl_gate` is 0 during the KL warm-up, else 1; with LoRA `base_params` is the
  frozen base and `params` (what is differentiated) are the adapters. `on_policy` (one epoch, one
  mini-batch): the current log-prob (stopped) is the old one, so the ratio is exactly 1, as in verl.
  """
  mask = micro["response_mask"]
  base, adapters = (aux["base_params"], params) if "base_params" in aux else (params, None)
  log_prob, entropy = outputs.log_probs(base, micro, adapters=adapters)
  old_log_prob = jax.lax.stop_gradient(log_prob) if on_policy else micro["old_log_probs"]
  pg_loss, pg_metrics = algos.compute_policy_loss(
      old_log_prob, log_prob, micro["advantages"], mask,
      loss_mode=actor.policy_loss.loss_mode, clip_ratio=actor.clip_ratio, clip_ratio_low=actor.clip_ratio_low,
      clip_ratio_high=actor.clip_ratio_high, clip_ratio_c=actor.clip_ratio_c,
      loss_agg_mode=actor.loss_agg_mode, rng=rng, **normalizers,
      **{key: actor.policy_loss[key] for key in algos.POLICY_LOSS_CONFIG_KEYS},
      **{key: actor[key] for key in algos.ACTOR_LOSS_CONFIG_KEYS})
  entropy_loss = algos.agg_loss(entropy, mask, actor.loss_agg_mode, **normalizers)
  loss = pg_loss - actor.entropy_coeff * entropy_loss
  metrics = {"actor/pg_loss": pg_loss, "actor/entropy_loss": entropy_loss,
             "actor/pg_clipfrac": pg_metrics["pg_clipfrac"],
             "actor/pg_clipfrac_lower": pg_metrics["pg_clipfrac_lower"],
             "actor/ppo_kl": pg_metrics["ppo_kl"]}
  if actor.use_kl_loss:
    kl = algos.kl_penalty(log_prob, micro["ref_log_probs"], actor.kl_loss_type)
    kl_loss = algos.agg_loss(kl, mask, actor.loss_agg_mode, **normalizers)
    loss = loss + aux["kl_gate"] * actor.kl_loss_coef * kl_loss
    metrics["actor/kl_loss"] = kl_loss
  return loss, metrics


def critic_loss(params, unused_aux, micro, normalizers, unused_rng, *, outputs: ModelOutputs, critic):
  """Clipped value loss. `critic`: the critic's config section."""
  vpreds = outputs.values(params, micro)
  vf_loss, vf_clipfrac = algos.compute_value_loss(
      vpreds, micro["values"], micro["returns"], micro["response_mask"], critic.cliprange_value,
      loss_agg_mode=critic.loss_agg_mode, **normalizers)
  # vpred_mean is a per-token mean: normalise it like the loss so micro-batches add up.
  vpred_mean = algos.agg_loss(vpreds, micro["response_mask"], "token-mean",
                              global_token_count=normalizers["global_token_count"])
  return vf_loss, {"critic/vf_loss": vf_loss, "critic/vf_clipfrac": vf_clipfrac, "critic/vpred_mean": vpred_mean}
