"""Policy-gradient losses keyed by verl's `actor.policy_loss.loss_mode` (docs/algorithms.md §4 "Policy").

Every registered loss has the signature

    fn(old_log_prob, log_prob, advantages, response_mask, *, clip_ratio_low, clip_ratio_high,
       clip_ratio_c, loss_agg_mode, agg_kwargs, rng, [rollout_is_weights,] **mode_kwargs) -> (loss, metrics)

with [N, R] fp32 inputs already zeroed outside the mask. `rollout_is_weights` (verl's decoupled
rollout correction, see `rollout_correction.py`) multiplies the per-token loss before aggregation; a
loss that does not declare it cannot be given one. `agg_kwargs` (global_token_count,
global_seq_count, loss_scale_factor) must be forwarded to `agg_loss`, and `global_token_count`
also normalises the per-token metrics, so that with the mini-batch normalisers every output is
additive over micro-batches. `metrics` holds at least pg_clipfrac, pg_clipfrac_lower and ppo_kl.

The importance ratio is exp(clip(lp - old, -20, 20)) in every mode that forms one (verl 0.9.1 does
not clip in gspo and geo_mean; the clip only matters for ratios beyond e^20 and keeps every mode
finite).
"""

import inspect

import jax
import jax.numpy as jnp

from jaxrlhf.algos.registry import Registry
from jaxrlhf.algos.rollout_correction import (
  ROLLOUT_CORRECTION_CONFIG_KEYS,
  compute_rollout_correction_and_rejection_mask,
)
from jaxrlhf.algos.stats import agg_loss, as_f32, masked_mean, seq_mean, token_mean, zero_masked

POLICY_LOSSES = Registry("policy loss")
register_policy_loss = POLICY_LOSSES.register
get_policy_loss = POLICY_LOSSES.get

AGG_KWARG_NAMES = ("global_token_count", "global_seq_count", "loss_scale_factor")
# Keys of verl's `actor.policy_loss` block, of `actor` itself (SAPO's temperatures) and of
# `algorithm.rollout_correction` (bypass_mode). A trainer may pass all of them whatever the mode; each
# mode receives only those it declares (None values are dropped), any other unknown keyword is a TypeError.
POLICY_LOSS_CONFIG_KEYS = ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef", "dro_beta")
ACTOR_LOSS_CONFIG_KEYS = ("tau_pos", "tau_neg")
MODE_CONFIG_KEYS = POLICY_LOSS_CONFIG_KEYS + ACTOR_LOSS_CONFIG_KEYS + ROLLOUT_CORRECTION_CONFIG_KEYS


def _log_ratio(old_log_prob, log_prob):
  return jnp.clip(log_prob - old_log_prob, -20.0, 20.0)


def _float(x):
  return jnp.asarray(x, jnp.float32)


def _metrics(pg_clipfrac, ppo_kl, pg_clipfrac_lower=0.0):
  return dict(pg_clipfrac=_float(pg_clipfrac), ppo_kl=_float(ppo_kl), pg_clipfrac_lower=_float(pg_clipfrac_lower))


def _weighted(pg_losses_NxR, rollout_is_weights):
  """verl: `pg_losses * rollout_is_weights` when rollout correction supplies weights (constants)."""
  if rollout_is_weights is None:
    return pg_losses_NxR
  return pg_losses_NxR * jax.lax.stop_gradient(as_f32(rollout_is_weights))


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
  old_log_prob,
  log_prob,
  advantages,
  response_mask,
  *,
  clip_ratio_low,
  clip_ratio_high,
  clip_ratio_c,
  loss_agg_mode,
  agg_kwargs,
  rng=None,
  rollout_is_weights=None,
):
  """PPO clipped surrogate with asymmetric clip ("clip-higher") and dual clip for A < 0."""
  del rng
  mask, n_tokens = response_mask, agg_kwargs.get("global_token_count")
  log_ratio_NxR = _log_ratio(old_log_prob, log_prob)
  ratio_NxR = jnp.exp(log_ratio_NxR)
  loss_unclipped_NxR = -advantages * ratio_NxR
  loss_clipped_NxR = -advantages * jnp.clip(ratio_NxR, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
  loss_ppo_NxR = jnp.maximum(loss_unclipped_NxR, loss_clipped_NxR)
  # Dual clip: for A < 0 a huge ratio would give an unbounded loss; cap it at -A * clip_ratio_c.
  loss_dual_NxR = -advantages * clip_ratio_c
  negative_adv_NxR = advantages < 0
  pg_losses_NxR = jnp.where(negative_adv_NxR, jnp.minimum(loss_dual_NxR, loss_ppo_NxR), loss_ppo_NxR)
  pg_loss = agg_loss(_weighted(pg_losses_NxR, rollout_is_weights), mask, loss_agg_mode, **agg_kwargs)
  return pg_loss, _metrics(
    pg_clipfrac=token_mean((loss_clipped_NxR > loss_unclipped_NxR).astype(jnp.float32), mask, n_tokens),
    ppo_kl=token_mean(-log_ratio_NxR, mask, n_tokens),
    pg_clipfrac_lower=token_mean(
      ((loss_ppo_NxR > loss_dual_NxR) & negative_adv_NxR).astype(jnp.float32), mask, n_tokens
    ),
  )


@register_policy_loss("gspo")
def compute_policy_loss_gspo(
  old_log_prob,
  log_prob,
  advantages,
  response_mask,
  *,
  clip_ratio_low,
  clip_ratio_high,
  clip_ratio_c,
  loss_agg_mode,
  agg_kwargs,
  rng=None,
  rollout_is_weights=None,
):
  """GSPO (arXiv 2507.18071): the sequence ratio s = exp(mean_m(lp - old)) replaces the token ratio.

  Per token the ratio is exp(lp - sg(lp) + sg(log s)): value s, gradient s * d lp. Aggregated
  with the configured `loss_agg_mode`, as verl 0.9.1 (the paper's objective is seq-mean-token-mean,
  which verl and we recommend but do not force). pg_clipfrac_lower is 0 (as verl).
  """
  del clip_ratio_c, rng
  mask, n_tokens = response_mask, agg_kwargs.get("global_token_count")
  log_ratio_NxR = _log_ratio(old_log_prob, log_prob)
  log_seq_ratio_N = masked_mean(log_ratio_NxR, mask, axis=-1)
  sg = jax.lax.stop_gradient
  # The sg(log s) term is added last to avoid cancellation error (verl PR 2775); clamp as verl.
  log_token_ratio_NxR = jnp.minimum(log_prob - sg(log_prob) + sg(log_seq_ratio_N)[:, None], 10.0)
  ratio_NxR = jnp.exp(log_token_ratio_NxR)
  loss_unclipped_NxR = -advantages * ratio_NxR
  loss_clipped_NxR = -advantages * jnp.clip(ratio_NxR, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
  pg_losses_NxR = jnp.maximum(loss_unclipped_NxR, loss_clipped_NxR)
  pg_loss = agg_loss(_weighted(pg_losses_NxR, rollout_is_weights), mask, loss_agg_mode, **agg_kwargs)
  return pg_loss, _metrics(
    pg_clipfrac=token_mean((loss_clipped_NxR > loss_unclipped_NxR).astype(jnp.float32), mask, n_tokens),
    ppo_kl=token_mean(-log_ratio_NxR, mask, n_tokens),
  )


@register_policy_loss("gpg")
def compute_policy_loss_gpg(
  old_log_prob,
  log_prob,
  advantages,
  response_mask,
  *,
  clip_ratio_low,
  clip_ratio_high,
  clip_ratio_c,
  loss_agg_mode,
  agg_kwargs,
  rng=None,
  rollout_is_weights=None,
):
  """GPG: plain policy gradient -lp * A (no ratio, no clip)."""
  del clip_ratio_low, clip_ratio_high, clip_ratio_c, rng
  pg_loss = agg_loss(_weighted(-log_prob * advantages, rollout_is_weights), response_mask, loss_agg_mode, **agg_kwargs)
  ppo_kl = token_mean(-_log_ratio(old_log_prob, log_prob), response_mask, agg_kwargs.get("global_token_count"))
  return pg_loss, _metrics(pg_clipfrac=0.0, ppo_kl=ppo_kl)


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
  old_log_prob,
  log_prob,
  advantages,
  response_mask,
  *,
  clip_ratio_low,
  clip_ratio_high,
  clip_ratio_c,
  loss_agg_mode,
  agg_kwargs,
  rng=None,
  rollout_is_weights=None,
):
  """CISPO (MiniMax-M1, arXiv 2506.13585): -sg(clip(ratio, 1-eps_low, 1+eps_high)) * A * lp.

  The clipped weight is a constant, so clipped tokens still get a gradient (unlike PPO).
  pg_clipfrac = fraction of tokens whose weight was clipped; pg_clipfrac_lower is 0, as verl 0.9.1
  reports (CISPO has no dual clip).
  """
  del clip_ratio_c, rng
  mask, n_tokens = response_mask, agg_kwargs.get("global_token_count")
  log_ratio_NxR = _log_ratio(old_log_prob, log_prob)
  ratio_NxR = jnp.exp(log_ratio_NxR)
  weight_NxR = jax.lax.stop_gradient(jnp.clip(ratio_NxR, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high))
  pg_losses_NxR = _weighted(-weight_NxR * advantages * log_prob, rollout_is_weights)
  pg_loss = agg_loss(pg_losses_NxR, mask, loss_agg_mode, **agg_kwargs)
  return pg_loss, _metrics(
    pg_clipfrac=token_mean((weight_NxR != ratio_NxR).astype(jnp.float32), mask, n_tokens),
    ppo_kl=token_mean(-log_ratio_NxR, mask, n_tokens),
  )


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(
  old_log_prob,
  log_prob,
  advantages,
  response_mask,
  *,
  clip_ratio_low,
  clip_ratio_high,
  clip_ratio_c,
  loss_agg_mode,
  agg_kwargs,
  rng=None,
  rollout_is_weights=None,
):
  """GMPO (arXiv 2507.20673): geometric mean of token ratios, clipped per token in log space.

  Per token, the log-ratio is clipped to [-eps_low, eps_high] only on the side that would raise
  the objective (pessimistic, as PPO): log r' = sign(A) * min(sign(A) log r, sign(A) clip(log r)).
  Per row: loss = -mean_m(A) * exp(mean_m(log r')) (times the geometric mean of the row's
  rollout_is_weights when given, as verl); rows are averaged (over rows with a valid token, with
  `global_seq_count` when given). `loss_agg_mode` is ignored, as in verl.
  """
  del clip_ratio_c, loss_agg_mode, rng
  mask, n_tokens = response_mask, agg_kwargs.get("global_token_count")
  log_ratio_NxR = _log_ratio(old_log_prob, log_prob)
  sign_adv_NxR = jnp.sign(advantages)
  log_ratio_clipped_NxR = jnp.clip(log_ratio_NxR, -clip_ratio_low, clip_ratio_high)
  log_ratio_pessimistic_NxR = sign_adv_NxR * jnp.minimum(
    sign_adv_NxR * log_ratio_NxR, sign_adv_NxR * log_ratio_clipped_NxR
  )
  seq_ratio_N = jnp.exp(masked_mean(log_ratio_pessimistic_NxR, mask, axis=-1))
  seq_advantage_N = masked_mean(advantages, mask, axis=-1)
  tokens_per_seq_N = jnp.sum(jnp.asarray(mask, jnp.float32), axis=-1)
  seq_losses_N = -seq_advantage_N * seq_ratio_N
  if rollout_is_weights is not None:
    log_weights_NxR = jnp.log(jax.lax.stop_gradient(as_f32(rollout_is_weights)) + 1e-10)
    seq_losses_N = seq_losses_N * jnp.exp(masked_mean(log_weights_NxR, mask, axis=-1))
  pg_loss = seq_mean(seq_losses_N, tokens_per_seq_N > 0, agg_kwargs.get("global_seq_count"))
  clipped_NxR = log_ratio_NxR != log_ratio_clipped_NxR
  return pg_loss, _metrics(
    pg_clipfrac=token_mean((clipped_NxR & (advantages > 0)).astype(jnp.float32), mask, n_tokens),
    ppo_kl=token_mean(-log_ratio_NxR, mask, n_tokens),
    pg_clipfrac_lower=token_mean((clipped_NxR & (advantages < 0)).astype(jnp.float32), mask, n_tokens),
  )


def _centered_covariance(advantages, log_prob, mask):
  """Per-token (A - mean_m A) * (lp - mean_m lp); only used to *select* tokens, so no gradient."""
  advantages, log_prob = jax.lax.stop_gradient(advantages), jax.lax.stop_gradient(log_prob)
  return (advantages - masked_mean(advantages, mask)) * (log_prob - masked_mean(log_prob, mask))


def _rank(keys_NxR):
  """0-based rank of each element in ascending order of `keys` (ties by position)."""
  order = jnp.argsort(keys_NxR.reshape(-1), stable=True)
  ranks = jnp.zeros(order.shape, jnp.int32).at[order].set(jnp.arange(order.size, dtype=jnp.int32))
  return ranks.reshape(keys_NxR.shape)


def _count_from_ratio(ratio, mask):
  # verl: max(int(ratio * #valid tokens), 1)
  n_valid = jnp.sum(jnp.asarray(mask, jnp.float32))
  return jnp.maximum(jnp.floor(ratio * n_valid), 1.0)


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
  old_log_prob,
  log_prob,
  advantages,
  response_mask,
  *,
  clip_ratio_low,
  clip_ratio_high,
  clip_ratio_c,
  loss_agg_mode,
  agg_kwargs,
  rng=None,
  rollout_is_weights=None,
  clip_cov_ratio=0.0002,
  clip_cov_lb=1.0,
  clip_cov_ub=5.0,
):
  """Clip-Cov (arXiv 2505.22617): PPO clip, plus the gradient of a few high-covariance tokens cut.

  Candidates are valid tokens not already clipped by PPO with clip_cov_lb < cov < clip_cov_ub;
  max(floor(clip_cov_ratio * #valid), 1) of them, drawn uniformly at random with `rng`, get their
  loss multiplied by 0. pg_clipfrac = fraction of detached tokens (as verl). No dual clip.
  """
  del clip_ratio_c
  if rng is None:
    raise ValueError("loss_mode='clip_cov' draws the detached tokens at random: pass a PRNG key as rng=")
  if clip_cov_ratio <= 0:
    raise ValueError(f"policy_loss.clip_cov_ratio must be > 0, got {clip_cov_ratio}")
  mask, n_tokens = response_mask, agg_kwargs.get("global_token_count")
  valid_NxR = jnp.asarray(mask) != 0
  log_ratio_NxR = _log_ratio(old_log_prob, log_prob)
  ratio_NxR = jnp.exp(log_ratio_NxR)
  loss_unclipped_NxR = -advantages * ratio_NxR
  loss_clipped_NxR = -advantages * jnp.clip(ratio_NxR, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
  clipped_by_ppo_NxR = loss_clipped_NxR > loss_unclipped_NxR
  cov_NxR = _centered_covariance(advantages, log_prob, mask)
  candidate_NxR = valid_NxR & ~clipped_by_ppo_NxR & (cov_NxR > clip_cov_lb) & (cov_NxR < clip_cov_ub)
  # A uniformly random subset of the candidates = those with the smallest i.i.d. uniform keys.
  keys_NxR = jnp.where(candidate_NxR, jax.random.uniform(rng, cov_NxR.shape), jnp.inf)
  detached_NxR = candidate_NxR & (_rank(keys_NxR) < _count_from_ratio(clip_cov_ratio, mask))
  pg_losses_NxR = jnp.where(detached_NxR, 0.0, jnp.maximum(loss_unclipped_NxR, loss_clipped_NxR))
  pg_loss = agg_loss(_weighted(pg_losses_NxR, rollout_is_weights), mask, loss_agg_mode, **agg_kwargs)
  return pg_loss, _metrics(
    pg_clipfrac=token_mean(detached_NxR.astype(jnp.float32), mask, n_tokens),
    ppo_kl=token_mean(-log_ratio_NxR, mask, n_tokens),
  )


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
  old_log_prob,
  log_prob,
  advantages,
  response_mask,
  *,
  clip_ratio_low,
  clip_ratio_high,
  clip_ratio_c,
  loss_agg_mode,
  agg_kwargs,
  rng=None,
  rollout_is_weights=None,
  kl_cov_ratio=0.0002,
  ppo_kl_coef=1.0,
):
  """KL-Cov (arXiv 2505.22617): unclipped -A * ratio, plus ppo_kl_coef * |lp - old| on the
  max(floor(kl_cov_ratio * #valid), 1) valid tokens of largest covariance.

  The selection is a deterministic top-k as in verl (ties by position), so `rng` is unused.
  ppo_kl reports mean_m |lp - old|, as verl.
  """
  del clip_ratio_low, clip_ratio_high, clip_ratio_c, rng
  if kl_cov_ratio <= 0:
    raise ValueError(f"policy_loss.kl_cov_ratio must be > 0, got {kl_cov_ratio}")
  mask, n_tokens = response_mask, agg_kwargs.get("global_token_count")
  valid_NxR = jnp.asarray(mask) != 0
  log_ratio_NxR = _log_ratio(old_log_prob, log_prob)
  abs_kl_NxR = jnp.abs(log_ratio_NxR)
  loss_pg_NxR = -advantages * jnp.exp(log_ratio_NxR)
  cov_NxR = _centered_covariance(advantages, log_prob, mask)
  descending_rank_NxR = _rank(jnp.where(valid_NxR, -cov_NxR, jnp.inf))
  penalised_NxR = valid_NxR & (descending_rank_NxR < _count_from_ratio(kl_cov_ratio, mask))
  pg_losses_NxR = jnp.where(penalised_NxR, loss_pg_NxR + ppo_kl_coef * abs_kl_NxR, loss_pg_NxR)
  pg_loss = agg_loss(_weighted(pg_losses_NxR, rollout_is_weights), mask, loss_agg_mode, **agg_kwargs)
  return pg_loss, _metrics(pg_clipfrac=0.0, ppo_kl=token_mean(abs_kl_NxR, mask, n_tokens))


@register_policy_loss("sapo")
def compute_policy_loss_sapo(
  old_log_prob,
  log_prob,
  advantages,
  response_mask,
  *,
  clip_ratio_low,
  clip_ratio_high,
  clip_ratio_c,
  loss_agg_mode,
  agg_kwargs,
  rng=None,
  rollout_is_weights=None,
  tau_pos=1.0,
  tau_neg=1.05,
):
  """SAPO (arXiv 2511.20347): a smooth sigmoid gate instead of a hard clip.

  gate = sigmoid(tau * (ratio - 1)) * 4 / tau with tau = tau_pos where A > 0 else tau_neg
  (`actor.tau_pos` / `actor.tau_neg`, verl's defaults 1.0 / 1.05); loss = -gate * A, aggregated
  seq-mean-token-mean whatever `loss_agg_mode` says, as verl 0.9.1. Both clip fractions are 0.
  """
  del clip_ratio_low, clip_ratio_high, clip_ratio_c, loss_agg_mode, rng
  mask, n_tokens = response_mask, agg_kwargs.get("global_token_count")
  log_ratio_NxR = _log_ratio(old_log_prob, log_prob)
  tau_NxR = jnp.where(advantages > 0, jnp.float32(tau_pos), jnp.float32(tau_neg))
  gate_NxR = jax.nn.sigmoid(tau_NxR * (jnp.exp(log_ratio_NxR) - 1.0)) * (4.0 / tau_NxR)
  pg_losses_NxR = _weighted(-gate_NxR * advantages, rollout_is_weights)
  pg_loss = agg_loss(pg_losses_NxR, mask, "seq-mean-token-mean", **agg_kwargs)
  return pg_loss, _metrics(pg_clipfrac=0.0, ppo_kl=token_mean(-log_ratio_NxR, mask, n_tokens))


@register_policy_loss("dro")
def compute_policy_loss_dro(
  old_log_prob,
  log_prob,
  advantages,
  response_mask,
  *,
  clip_ratio_low,
  clip_ratio_high,
  clip_ratio_c,
  loss_agg_mode,
  agg_kwargs,
  rng=None,
  rollout_is_weights=None,
  dro_beta=None,
):
  """DRO (direct reward optimisation): -(lp * A - 0.5 * beta * (lp - old)^2), beta =
  `policy_loss.dro_beta` (required, > 0, as verl). No ratio, no clip: both clip fractions are 0."""
  del clip_ratio_low, clip_ratio_high, clip_ratio_c, rng
  if dro_beta is None or dro_beta <= 0:
    raise ValueError(f"actor.policy_loss.dro_beta must be a positive value when using DRO, got {dro_beta}")
  mask, n_tokens = response_mask, agg_kwargs.get("global_token_count")
  log_ratio_NxR = log_prob - old_log_prob  # unclipped, as verl: only its square enters, as a penalty
  pg_losses_NxR = -(log_prob * advantages - 0.5 * dro_beta * jnp.square(log_ratio_NxR))
  pg_loss = agg_loss(_weighted(pg_losses_NxR, rollout_is_weights), mask, loss_agg_mode, **agg_kwargs)
  return pg_loss, _metrics(pg_clipfrac=0.0, ppo_kl=token_mean(-log_ratio_NxR, mask, n_tokens))


def _dppo(
  valid_fn,
  old_log_prob,
  log_prob,
  advantages,
  mask,
  *,
  clip_ratio_low,
  clip_ratio_high,
  clip_ratio_c,
  loss_agg_mode,
  agg_kwargs,
  rollout_is_weights,
):
  """DPPO-Binary (arXiv 2602.04879): a token keeps its gradient unless the move of its probability
  (a divergence between old and new, bounded by clip_ratio_low/high) already went in the
  advantage's direction too far; the REINFORCE-style loss -A * sg(min(ratio, clip_ratio_c)) * lp
  uses truncated importance sampling instead of a dual clip (clip_ratio_c: verl's actor value).
  pg_clipfrac = masked tokens; pg_clipfrac_lower = kept tokens whose ratio was truncated (verl)."""
  n_tokens = agg_kwargs.get("global_token_count")
  log_ratio_NxR = _log_ratio(old_log_prob, log_prob)
  ratio_NxR = jnp.exp(log_ratio_NxR)
  sg = jax.lax.stop_gradient
  truncated_ratio_NxR = sg(jnp.minimum(ratio_NxR, clip_ratio_c))
  prob_NxR, old_prob_NxR = sg(jnp.exp(log_prob)), jnp.exp(old_log_prob)
  valid_positive_NxR, valid_negative_NxR = valid_fn(prob_NxR, old_prob_NxR, sg(log_prob), old_log_prob)
  valid_NxR = jnp.where(advantages > 0, valid_positive_NxR, valid_negative_NxR).astype(jnp.float32)
  pg_losses_NxR = _weighted(-advantages * truncated_ratio_NxR * log_prob * valid_NxR, rollout_is_weights)
  pg_loss = agg_loss(pg_losses_NxR, mask, loss_agg_mode, **agg_kwargs)
  return pg_loss, _metrics(
    pg_clipfrac=token_mean(1.0 - valid_NxR, mask, n_tokens),
    ppo_kl=token_mean(-log_ratio_NxR, mask, n_tokens),
    pg_clipfrac_lower=token_mean((ratio_NxR > clip_ratio_c).astype(jnp.float32) * valid_NxR, mask, n_tokens),
  )


@register_policy_loss("dppo_tv")
def compute_policy_loss_dppo_tv(
  old_log_prob,
  log_prob,
  advantages,
  response_mask,
  *,
  clip_ratio_low,
  clip_ratio_high,
  clip_ratio_c,
  loss_agg_mode,
  agg_kwargs,
  rng=None,
  rollout_is_weights=None,
):
  """DPPO-Binary-TV: kept where p - p_old <= clip_ratio_high (A > 0) or >= -clip_ratio_low (A <= 0)."""
  del rng

  def valid(prob, old_prob, unused_log_prob, unused_old_log_prob):
    return (prob - old_prob) <= clip_ratio_high, (prob - old_prob) >= -clip_ratio_low

  return _dppo(
    valid,
    old_log_prob,
    log_prob,
    advantages,
    response_mask,
    clip_ratio_low=clip_ratio_low,
    clip_ratio_high=clip_ratio_high,
    clip_ratio_c=clip_ratio_c,
    loss_agg_mode=loss_agg_mode,
    agg_kwargs=agg_kwargs,
    rollout_is_weights=rollout_is_weights,
  )


@register_policy_loss("dppo_kl")
def compute_policy_loss_dppo_kl(
  old_log_prob,
  log_prob,
  advantages,
  response_mask,
  *,
  clip_ratio_low,
  clip_ratio_high,
  clip_ratio_c,
  loss_agg_mode,
  agg_kwargs,
  rng=None,
  rollout_is_weights=None,
):
  """DPPO-Binary-KL: binary KL(p_old || p) = p_old log(p_old/p) + (1-p_old) log((1-p_old)/(1-p))
  (1e-8 inside the second log, as verl); kept where it is <= clip_ratio_high or p <= p_old (A > 0),
  <= clip_ratio_low or p >= p_old (A <= 0)."""
  del rng

  def valid(prob, old_prob, log_prob_sg, old_log_prob_):
    binary_kl = old_prob * (old_log_prob_ - log_prob_sg) + (1.0 - old_prob) * jnp.log(
      (1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8)
    )
    return (binary_kl <= clip_ratio_high) | (prob <= old_prob), (binary_kl <= clip_ratio_low) | (prob >= old_prob)

  return _dppo(
    valid,
    old_log_prob,
    log_prob,
    advantages,
    response_mask,
    clip_ratio_low=clip_ratio_low,
    clip_ratio_high=clip_ratio_high,
    clip_ratio_c=clip_ratio_c,
    loss_agg_mode=loss_agg_mode,
    agg_kwargs=agg_kwargs,
    rollout_is_weights=rollout_is_weights,
  )


@register_policy_loss("bypass_mode")
def compute_policy_loss_bypass_mode(
  old_log_prob,
  log_prob,
  advantages,
  response_mask,
  *,
  clip_ratio_low,
  clip_ratio_high,
  clip_ratio_c,
  loss_agg_mode,
  agg_kwargs,
  rng=None,
  rollout_is_weights=None,
  loss_type="ppo_clip",
  rollout_is=None,
  rollout_is_threshold=2.0,
  rollout_is_batch_normalize=False,
  rollout_rs=None,
  rollout_rs_threshold=None,
):
  """verl's bypass mode: `old_log_prob` IS the rollout's log-prob (no old-log-prob forward), and
  rollout correction (`algorithm.rollout_correction.*`) runs between it and the training forward.

  Importance weights w = pi_train / pi_rollout (token or sequence level, truncated at the upper
  threshold or IcePop-rejected outside "lower_upper") and the rejection mask (rollout_rs options)
  come from `compute_rollout_correction_and_rejection_mask` on sg(log_prob); rejected tokens leave
  the loss mask. loss_type "ppo_clip": vanilla PPO against the rollout policy (the ratio already
  is the IS correction, so w is not applied, as verl); "reinforce": -A * lp * w aggregated, with
  ppo_kl = mean(rollout - lp). The metrics add verl's `rollout_corr/...` family: they are means
  over the micro-batch, so a trainer averages them over micro-batches (not sums). Weights are
  computed here; `rollout_is_weights` from a decoupled correction is ignored, as verl.
  """
  del rollout_is_weights
  if loss_type not in ("ppo_clip", "reinforce"):
    raise ValueError(f"algorithm.rollout_correction.loss_type must be 'reinforce' or 'ppo_clip', got {loss_type!r}")
  rollout_log_prob = old_log_prob
  weights_NxR, effective_mask_NxR, corr_metrics = compute_rollout_correction_and_rejection_mask(
    jax.lax.stop_gradient(log_prob),
    rollout_log_prob,
    response_mask,
    rollout_is=rollout_is,
    rollout_is_threshold=rollout_is_threshold,
    rollout_is_batch_normalize=rollout_is_batch_normalize,
    rollout_rs=rollout_rs,
    rollout_rs_threshold=rollout_rs_threshold,
  )
  if loss_type == "ppo_clip":
    pg_loss, metrics = compute_policy_loss_vanilla(
      rollout_log_prob,
      log_prob,
      advantages,
      effective_mask_NxR,
      clip_ratio_low=clip_ratio_low,
      clip_ratio_high=clip_ratio_high,
      clip_ratio_c=clip_ratio_c,
      loss_agg_mode=loss_agg_mode,
      agg_kwargs=agg_kwargs,
      rng=rng,
    )
  else:
    pg_losses_NxR = _weighted(-advantages * log_prob, weights_NxR)
    pg_loss = agg_loss(pg_losses_NxR, effective_mask_NxR, loss_agg_mode, **agg_kwargs)
    ppo_kl = token_mean(rollout_log_prob - log_prob, effective_mask_NxR, agg_kwargs.get("global_token_count"))
    metrics = _metrics(pg_clipfrac=0.0, ppo_kl=ppo_kl)
  return pg_loss, {**metrics, **corr_metrics}


def _accepted(fn, kwargs):
  """Drops verl config keys (MODE_CONFIG_KEYS) that `fn` does not declare and those that are None;
  keeps everything else."""
  kwargs = {k: v for k, v in kwargs.items() if not (k in MODE_CONFIG_KEYS and v is None)}
  parameters = inspect.signature(fn).parameters
  if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
    return kwargs
  return {k: v for k, v in kwargs.items() if k in parameters or k not in MODE_CONFIG_KEYS}


def compute_policy_loss(
  old_log_prob,
  log_prob,
  advantages,
  response_mask,
  *,
  loss_mode="vanilla",
  clip_ratio=0.2,
  clip_ratio_low=None,
  clip_ratio_high=None,
  clip_ratio_c=3.0,
  loss_agg_mode="token-mean",
  rng=None,
  rollout_is_weights=None,
  **agg_and_mode_kwargs,
):
  """Policy loss of `loss_mode` -> (loss, metrics) (docs/algorithms.md §1, §4).

  clip_ratio_low/high default to clip_ratio. `agg_and_mode_kwargs` holds the `agg_loss`
  normalisers (global_token_count, global_seq_count, loss_scale_factor; see
  `loss_normalizers`) and mode hyper-parameters (MODE_CONFIG_KEYS: clip_cov_ratio/lb/ub,
  kl_cov_ratio, ppo_kl_coef, dro_beta, tau_pos/tau_neg, the rollout_correction keys).
  `rollout_is_weights` [N, R] (decoupled rollout correction) multiplies the per-token loss.
  Inputs may be bf16; the loss is computed in fp32 and masked positions never matter.
  """
  fn = get_policy_loss(loss_mode)
  if loss_mode in ("vanilla", "bypass_mode") and isinstance(clip_ratio_c, (int, float)) and clip_ratio_c <= 1.0:
    raise ValueError(f"actor.clip_ratio_c (dual-clip lower bound of the ratio) must be > 1, got {clip_ratio_c}")
  agg_kwargs = {k: agg_and_mode_kwargs.pop(k) for k in AGG_KWARG_NAMES if k in agg_and_mode_kwargs}
  agg_kwargs = {k: v for k, v in agg_kwargs.items() if v is not None}
  mode_kwargs = _accepted(fn, agg_and_mode_kwargs)
  if rollout_is_weights is not None:
    mode_kwargs["rollout_is_weights"] = zero_masked(rollout_is_weights, response_mask)
  return fn(
    zero_masked(old_log_prob, response_mask),
    zero_masked(log_prob, response_mask),
    zero_masked(advantages, response_mask),
    response_mask,
    clip_ratio_low=clip_ratio if clip_ratio_low is None else clip_ratio_low,
    clip_ratio_high=clip_ratio if clip_ratio_high is None else clip_ratio_high,
    clip_ratio_c=clip_ratio_c,
    loss_agg_mode=loss_agg_mode,
    agg_kwargs=agg_kwargs,
    rng=rng,
    **mode_kwargs,
  )
