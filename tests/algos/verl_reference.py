"""NumPy (float64) transcription of verl 0.9.1's algorithm formulas, function by function, for the
parity comparison (tests/algos/test_verl_parity.py, benchmarks/verl_parity.py).

Read from verl 0.9.1's `trainer/ppo/core_algos.py`, `trainer/ppo/rollout_corr_helper.py` and
`utils/torch_functional.py` (`pip download verl==0.9.1 --no-deps`) and rewritten in NumPy: it keeps
verl's conventions where they differ from ours (masked means add 1e-8 to the count, every row is a
member of its group, outputs are left as verl leaves them), so that a comparison shows exactly
where jaxrlhf agrees. It shares no code with jaxrlhf. Arguments a verl function reads from its
config are plain keyword arguments here, with verl's defaults.
"""

import math
from collections import defaultdict

import numpy as np


def f64(x):
  return np.asarray(x, dtype=np.float64)


# ------------------------------------------------------------------ utils/torch_functional.py
def masked_sum(values, mask, axis=None):
  values, mask = f64(values), f64(mask)
  return (np.where(mask.astype(bool), values, 0.0) * mask).sum(axis=axis)


def masked_mean(values, mask, axis=None):
  return masked_sum(values, mask, axis) / (f64(mask).sum(axis=axis) + 1e-8)


def masked_var(values, mask, unbiased=True):
  mean = masked_mean(values, mask)
  variance = masked_mean((f64(values) - mean) ** 2, mask)
  if unbiased:
    mask_sum = f64(mask).sum()
    if mask_sum <= 1:
      raise ValueError("verl raises for fewer than two valid elements")
    variance = variance * mask_sum / (mask_sum - 1)
  return variance


def masked_whiten(values, mask, shift_mean=True):
  mean, var = masked_mean(values, mask), masked_var(values, mask)
  whitened = (f64(values) - mean) / np.sqrt(var + 1e-8)
  return whitened + mean if not shift_mean else whitened


# ------------------------------------------------------------------ core_algos.agg_loss
def agg_loss(
  loss_mat, loss_mask, loss_agg_mode, dp_size=1, batch_num_tokens=None, global_batch_size=None, loss_scale_factor=None
):
  loss_mat, loss_mask = f64(loss_mat), f64(loss_mask)
  if loss_agg_mode == "token-mean":
    if batch_num_tokens is None:
      batch_num_tokens = loss_mask.sum()
    return masked_sum(loss_mat, loss_mask) / batch_num_tokens * dp_size
  if loss_agg_mode == "token-sum":
    return masked_sum(loss_mat, loss_mask) * dp_size
  if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
    seq_losses = (loss_mat * loss_mask).sum(-1)
    seq_mask = (loss_mask.sum(-1) > 0).astype(np.float64)
    if global_batch_size is None:
      global_batch_size = seq_mask.sum()
    loss = masked_sum(seq_losses, seq_mask) / global_batch_size * dp_size
    if loss_agg_mode == "seq-mean-token-sum-norm":
      loss /= loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
    return loss
  if loss_agg_mode == "seq-mean-token-mean":
    counts = loss_mask.sum(-1)
    seq_losses = (loss_mat * loss_mask).sum(-1) / (counts + 1e-8)
    seq_mask = (counts > 0).astype(np.float64)
    if global_batch_size is None:
      global_batch_size = seq_mask.sum()
    return masked_sum(seq_losses, seq_mask) / global_batch_size * dp_size
  raise ValueError(loss_agg_mode)


# ------------------------------------------------------------------ KL
def kl_penalty_forward(logprob, ref_logprob, name):
  logprob, ref_logprob = f64(logprob), f64(ref_logprob)
  if name in ("kl", "k1"):
    return logprob - ref_logprob
  if name == "abs":
    return np.abs(logprob - ref_logprob)
  if name in ("mse", "k2"):
    return 0.5 * (logprob - ref_logprob) ** 2
  kl = np.clip(ref_logprob - logprob, -20, 20)
  return np.clip(np.exp(kl) - kl - 1, -10, 10)


def kl_penalty(logprob, ref_logprob, name):
  """The value (the straight-through `+` variants have the base estimator's value)."""
  return kl_penalty_forward(logprob, ref_logprob, name[:-1] if name.endswith("+") else name)


# ------------------------------------------------------------------ policy losses
def _clip_ratios(clip_ratio, clip_ratio_low, clip_ratio_high):
  low = clip_ratio if clip_ratio_low is None else clip_ratio_low
  high = clip_ratio if clip_ratio_high is None else clip_ratio_high
  return low, high


def _apply_is(pg_losses, rollout_is_weights):
  return pg_losses if rollout_is_weights is None else pg_losses * f64(rollout_is_weights)


def policy_loss_vanilla(
  old_log_prob,
  log_prob,
  advantages,
  response_mask,
  loss_agg_mode="token-mean",
  clip_ratio=0.2,
  clip_ratio_low=None,
  clip_ratio_high=None,
  clip_ratio_c=3.0,
  rollout_is_weights=None,
  **global_batch_info,
):
  old_log_prob, log_prob, advantages = f64(old_log_prob), f64(log_prob), f64(advantages)
  low, high = _clip_ratios(clip_ratio, clip_ratio_low, clip_ratio_high)
  negative_approx_kl = np.clip(log_prob - old_log_prob, -20, 20)
  ratio = np.exp(negative_approx_kl)
  ppo_kl = masked_mean(-negative_approx_kl, response_mask)
  pg_losses1 = -advantages * ratio
  pg_losses2 = -advantages * np.clip(ratio, 1 - low, 1 + high)
  clip_pg_losses1 = np.maximum(pg_losses1, pg_losses2)
  pg_clipfrac = masked_mean((pg_losses2 > pg_losses1).astype(float), response_mask)
  pg_losses3 = -advantages * clip_ratio_c
  clip_pg_losses2 = np.minimum(pg_losses3, clip_pg_losses1)
  pg_clipfrac_lower = masked_mean((clip_pg_losses1 > pg_losses3) * (advantages < 0), response_mask)
  pg_losses = _apply_is(np.where(advantages < 0, clip_pg_losses2, clip_pg_losses1), rollout_is_weights)
  loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **global_batch_info)
  return loss, dict(pg_clipfrac=pg_clipfrac, ppo_kl=ppo_kl, pg_clipfrac_lower=pg_clipfrac_lower)


def _dppo(
  valid_fn,
  old_log_prob,
  log_prob,
  advantages,
  response_mask,
  loss_agg_mode,
  clip_ratio,
  clip_ratio_low,
  clip_ratio_high,
  clip_ratio_c,
  rollout_is_weights,
  global_batch_info,
):
  old_log_prob, log_prob, advantages = f64(old_log_prob), f64(log_prob), f64(advantages)
  low, high = _clip_ratios(clip_ratio, clip_ratio_low, clip_ratio_high)
  negative_approx_kl = np.clip(log_prob - old_log_prob, -20, 20)
  ratio = np.exp(negative_approx_kl)
  ppo_kl = masked_mean(-negative_approx_kl, response_mask)
  truncated_ratio = np.minimum(ratio, clip_ratio_c)
  prob, old_prob = np.exp(log_prob), np.exp(old_log_prob)
  valid_positive, valid_negative = valid_fn(prob, old_prob, log_prob, old_log_prob, low, high)
  valid = np.where(advantages > 0, valid_positive, valid_negative).astype(float)
  pg_losses = _apply_is(-advantages * truncated_ratio * log_prob * valid, rollout_is_weights)
  loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **global_batch_info)
  return loss, dict(
    pg_clipfrac=masked_mean(1.0 - valid, response_mask),
    ppo_kl=ppo_kl,
    pg_clipfrac_lower=masked_mean((ratio > clip_ratio_c) * valid, response_mask),
  )


def policy_loss_dppo_tv(
  old_log_prob,
  log_prob,
  advantages,
  response_mask,
  loss_agg_mode="token-mean",
  clip_ratio=0.2,
  clip_ratio_low=None,
  clip_ratio_high=None,
  clip_ratio_c=3.0,
  rollout_is_weights=None,
  **global_batch_info,
):
  def valid(prob, old_prob, lp, old, low, high):
    return (prob - old_prob) <= high, (prob - old_prob) >= -low

  return _dppo(
    valid,
    old_log_prob,
    log_prob,
    advantages,
    response_mask,
    loss_agg_mode,
    clip_ratio,
    clip_ratio_low,
    clip_ratio_high,
    clip_ratio_c,
    rollout_is_weights,
    global_batch_info,
  )


def policy_loss_dppo_kl(
  old_log_prob,
  log_prob,
  advantages,
  response_mask,
  loss_agg_mode="token-mean",
  clip_ratio=0.2,
  clip_ratio_low=None,
  clip_ratio_high=None,
  clip_ratio_c=3.0,
  rollout_is_weights=None,
  **global_batch_info,
):
  def valid(prob, old_prob, lp, old, low, high):
    binary_kl = old_prob * (old - lp) + (1 - old_prob) * np.log((1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8))
    return (binary_kl <= high) | (prob <= old_prob), (binary_kl <= low) | (prob >= old_prob)

  return _dppo(
    valid,
    old_log_prob,
    log_prob,
    advantages,
    response_mask,
    loss_agg_mode,
    clip_ratio,
    clip_ratio_low,
    clip_ratio_high,
    clip_ratio_c,
    rollout_is_weights,
    global_batch_info,
  )


def policy_loss_gspo(
  old_log_prob,
  log_prob,
  advantages,
  response_mask,
  loss_agg_mode="seq-mean-token-mean",
  clip_ratio=0.2,
  clip_ratio_low=None,
  clip_ratio_high=None,
  rollout_is_weights=None,
  **global_batch_info,
):
  old_log_prob, log_prob, advantages, response_mask = (
    f64(a) for a in (old_log_prob, log_prob, advantages, response_mask)
  )
  low, high = _clip_ratios(clip_ratio, clip_ratio_low, clip_ratio_high)
  negative_approx_kl = log_prob - old_log_prob
  seq_lengths = np.maximum(response_mask.sum(-1), 1)
  negative_approx_kl_seq = (negative_approx_kl * response_mask).sum(-1) / seq_lengths
  log_seq_importance_ratio = np.minimum(negative_approx_kl_seq[:, None] + 0 * log_prob, 10.0)
  seq_importance_ratio = np.exp(log_seq_importance_ratio)
  pg_losses1 = -advantages * seq_importance_ratio
  pg_losses2 = -advantages * np.clip(seq_importance_ratio, 1 - low, 1 + high)
  pg_losses = _apply_is(np.maximum(pg_losses1, pg_losses2), rollout_is_weights)
  loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **global_batch_info)
  return loss, dict(
    pg_clipfrac=masked_mean((pg_losses2 > pg_losses1).astype(float), response_mask),
    ppo_kl=masked_mean(-negative_approx_kl, response_mask),
    pg_clipfrac_lower=0.0,
  )


def policy_loss_sapo(
  old_log_prob,
  log_prob,
  advantages,
  response_mask,
  loss_agg_mode="seq-mean-token-mean",
  tau_pos=1.0,
  tau_neg=1.05,
  rollout_is_weights=None,
  **global_batch_info,
):
  old_log_prob, log_prob, advantages = f64(old_log_prob), f64(log_prob), f64(advantages)
  negative_approx_kl = np.clip(log_prob - old_log_prob, -20, 20)
  ratio = np.exp(negative_approx_kl)
  taus = np.where(advantages > 0, tau_pos, tau_neg)
  gates = 1.0 / (1.0 + np.exp(-taus * (ratio - 1.0))) * (4.0 / taus)
  pg_losses = _apply_is(-gates * advantages, rollout_is_weights)
  loss = agg_loss(pg_losses, response_mask, "seq-mean-token-mean", **global_batch_info)  # fixed in verl
  return loss, dict(pg_clipfrac=0.0, ppo_kl=masked_mean(-negative_approx_kl, response_mask), pg_clipfrac_lower=0.0)


def policy_loss_gpg(
  old_log_prob,
  log_prob,
  advantages,
  response_mask,
  loss_agg_mode="token-mean",
  rollout_is_weights=None,
  **global_batch_info,
):
  pg_losses = _apply_is(-f64(log_prob) * f64(advantages), rollout_is_weights)
  return agg_loss(pg_losses, response_mask, loss_agg_mode, **global_batch_info), {}


def policy_loss_clip_cov_all(
  old_log_prob,
  log_prob,
  advantages,
  response_mask,
  loss_agg_mode="token-mean",
  clip_ratio=0.2,
  clip_ratio_low=None,
  clip_ratio_high=None,
  clip_cov_lb=1.0,
  clip_cov_ub=5.0,
  **global_batch_info,
):
  """clip_cov with a clip_cov_ratio large enough that every candidate is detached (no random draw)."""
  old_log_prob, log_prob, advantages, response_mask = (
    f64(a) for a in (old_log_prob, log_prob, advantages, response_mask)
  )
  low, high = _clip_ratios(clip_ratio, clip_ratio_low, clip_ratio_high)
  negative_approx_kl = log_prob - old_log_prob
  ratio = np.exp(negative_approx_kl)
  pg_losses1 = -advantages * ratio
  pg_losses2 = -advantages * np.clip(ratio, 1 - low, 1 + high)
  clip_by_origin = (pg_losses2 > pg_losses1) & (response_mask > 0)
  cov_all = (advantages - masked_mean(advantages, response_mask)) * (log_prob - masked_mean(log_prob, response_mask))
  cov_all[response_mask == 0] = -np.inf
  cov_all[clip_by_origin] = -np.inf
  corr = np.where((cov_all < clip_cov_ub) & (cov_all > clip_cov_lb) & (response_mask > 0), 0.0, 1.0)
  pg_losses = np.maximum(pg_losses1, pg_losses2) * corr
  loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **global_batch_info)
  return loss, dict(
    pg_clipfrac=masked_mean((corr == 0).astype(float), response_mask),
    ppo_kl=masked_mean(-negative_approx_kl, response_mask),
  )


def policy_loss_kl_cov(
  old_log_prob,
  log_prob,
  advantages,
  response_mask,
  loss_agg_mode="token-mean",
  kl_cov_ratio=0.0002,
  ppo_kl_coef=1.0,
  **global_batch_info,
):
  old_log_prob, log_prob, advantages, response_mask = (
    f64(a) for a in (old_log_prob, log_prob, advantages, response_mask)
  )
  negative_approx_kl = log_prob - old_log_prob
  abs_kl = np.abs(negative_approx_kl)
  ratio = np.exp(negative_approx_kl)
  pg_losses = -advantages * ratio
  pg_losses_kl = -advantages * ratio + ppo_kl_coef * abs_kl
  valid_idx = np.nonzero((response_mask > 0).reshape(-1))[0]
  adv, logp = advantages.reshape(-1)[valid_idx], log_prob.reshape(-1)[valid_idx]
  if len(adv):
    cov = (adv - adv.mean()) * (logp - logp.mean())
    k = max(1, int(len(cov) * kl_cov_ratio))
    top = valid_idx[np.argsort(-cov, kind="stable")[:k]]
    T = advantages.shape[1]
    pg_losses[top // T, top % T] = pg_losses_kl[top // T, top % T]
  loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **global_batch_info)
  return loss, dict(ppo_kl=masked_mean(abs_kl, response_mask))


def policy_loss_geo_mean(
  old_log_prob,
  log_prob,
  advantages,
  response_mask,
  clip_ratio=0.2,
  clip_ratio_low=None,
  clip_ratio_high=None,
  rollout_is_weights=None,
):
  old_log_prob, log_prob, advantages, response_mask = (
    f64(a) for a in (old_log_prob, log_prob, advantages, response_mask)
  )
  low, high = _clip_ratios(clip_ratio, clip_ratio_low, clip_ratio_high)
  negative_approx_kl = log_prob - old_log_prob
  sgn = np.sign(advantages)
  clamped = np.clip(negative_approx_kl, -low, high)
  kl_min = sgn * np.minimum(sgn * negative_approx_kl, sgn * clamped)
  lengths = response_mask.sum(-1)
  ratio = np.exp((kl_min * response_mask).sum(-1) / (lengths + 1e-8))
  advantage = (advantages * response_mask).sum(-1) / (lengths + 1e-8)
  pg_losses = -advantage * ratio
  if rollout_is_weights is not None:
    pg_losses = pg_losses * np.exp((np.log(f64(rollout_is_weights) + 1e-10) * response_mask).sum(-1) / (lengths + 1e-8))
  clipped = negative_approx_kl != clamped
  return pg_losses.mean(), dict(
    pg_clipfrac=masked_mean(clipped * (advantages > 0), response_mask),
    ppo_kl=masked_mean(-negative_approx_kl, response_mask),
    pg_clipfrac_lower=masked_mean(clipped * (advantages < 0), response_mask),
  )


def policy_loss_dro(
  old_log_prob,
  log_prob,
  advantages,
  response_mask,
  loss_agg_mode="token-mean",
  dro_beta=None,
  rollout_is_weights=None,
  **global_batch_info,
):
  if dro_beta is None or dro_beta <= 0:
    raise ValueError("policy_loss.dro_beta must be a positive value when using DRO")
  log_ratio = f64(log_prob) - f64(old_log_prob)
  pg_losses = _apply_is(-(f64(log_prob) * f64(advantages) - 0.5 * dro_beta * log_ratio**2), rollout_is_weights)
  return agg_loss(pg_losses, response_mask, loss_agg_mode, **global_batch_info), dict(
    ppo_kl=masked_mean(-log_ratio, response_mask)
  )


def policy_loss_cispo(
  old_log_prob,
  log_prob,
  advantages,
  response_mask,
  loss_agg_mode="token-mean",
  clip_ratio=0.2,
  clip_ratio_low=None,
  clip_ratio_high=None,
  rollout_is_weights=None,
  **global_batch_info,
):
  old_log_prob, log_prob, advantages = f64(old_log_prob), f64(log_prob), f64(advantages)
  low, high = _clip_ratios(clip_ratio, clip_ratio_low, clip_ratio_high)
  negative_approx_kl = np.clip(log_prob - old_log_prob, -20, 20)
  ratio = np.exp(negative_approx_kl)
  clipped_ratio = np.clip(ratio, 1 - low, 1 + high)
  pg_losses = _apply_is(-clipped_ratio * advantages * log_prob, rollout_is_weights)
  return agg_loss(pg_losses, response_mask, loss_agg_mode, **global_batch_info), dict(
    pg_clipfrac=masked_mean((ratio != clipped_ratio).astype(float), response_mask),
    ppo_kl=masked_mean(-negative_approx_kl, response_mask),
    pg_clipfrac_lower=0.0,
  )


def policy_loss_bypass_mode(
  old_log_prob,
  log_prob,
  advantages,
  response_mask,
  loss_agg_mode="token-mean",
  loss_type="ppo_clip",
  rollout_is=None,
  rollout_is_threshold=2.0,
  rollout_is_batch_normalize=False,
  rollout_rs=None,
  rollout_rs_threshold=None,
  clip_ratio=0.2,
  clip_ratio_low=None,
  clip_ratio_high=None,
  clip_ratio_c=3.0,
  **global_batch_info,
):
  rollout_log_prob = f64(old_log_prob)
  weights, effective_mask, corr_metrics = compute_rollout_correction_and_rejection_mask(
    log_prob,
    rollout_log_prob,
    response_mask,
    rollout_is,
    rollout_is_threshold,
    rollout_is_batch_normalize,
    rollout_rs,
    rollout_rs_threshold,
  )
  if loss_type == "reinforce":
    pg_losses = -f64(advantages) * f64(log_prob)
    if weights is not None:
      pg_losses = pg_losses * weights
    loss = agg_loss(pg_losses, effective_mask, loss_agg_mode, **global_batch_info)
    metrics = dict(ppo_kl=masked_mean(rollout_log_prob - f64(log_prob), effective_mask))
  else:
    loss, metrics = policy_loss_vanilla(
      rollout_log_prob,
      log_prob,
      advantages,
      effective_mask,
      loss_agg_mode,
      clip_ratio,
      clip_ratio_low,
      clip_ratio_high,
      clip_ratio_c,
      **global_batch_info,
    )
  return loss, {**metrics, **corr_metrics}


def value_loss(
  vpreds, returns, values, response_mask, cliprange_value, loss_agg_mode="token-mean", **global_batch_info
):
  """verl's argument order: (vpreds, returns, values, ...)."""
  vpreds, returns, values = f64(vpreds), f64(returns), f64(values)
  vpredclipped = np.maximum(np.minimum(vpreds, values + cliprange_value), values - cliprange_value)
  vf_losses1, vf_losses2 = (vpreds - returns) ** 2, (vpredclipped - returns) ** 2
  vf_loss = 0.5 * agg_loss(np.maximum(vf_losses1, vf_losses2), response_mask, loss_agg_mode, **global_batch_info)
  return vf_loss, masked_mean((vf_losses2 > vf_losses1).astype(float), response_mask)


# ------------------------------------------------------------------ advantage estimators
def gae(token_level_rewards, values, response_mask, gamma, lam):
  r, v, m = f64(token_level_rewards), f64(values), f64(response_mask)
  next_values, last = 0.0, 0.0
  reversed_adv = []
  for t in reversed(range(r.shape[1])):
    delta = r[:, t] + gamma * next_values - v[:, t]
    last_ = delta + gamma * lam * last
    next_values = v[:, t] * m[:, t] + (1 - m[:, t]) * next_values
    last = last_ * m[:, t] + (1 - m[:, t]) * last
    reversed_adv.append(last)
  advantages = np.stack(reversed_adv[::-1], axis=1)
  returns = advantages + v
  return masked_whiten(advantages, m), returns


def _group_rows(index):
  groups = defaultdict(list)
  for i, idx in enumerate(index):
    groups[int(idx)].append(i)
  return groups


def grpo(token_level_rewards, response_mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True):
  scores = f64(token_level_rewards).sum(-1)
  out = scores.copy()
  for rows in _group_rows(index).values():
    group = scores[rows]
    mean, std = (0.0, 1.0) if len(rows) == 1 else (group.mean(), group.std(ddof=1))
    for i in rows:
      out[i] = (scores[i] - mean) / (std + epsilon) if norm_adv_by_std_in_grpo else scores[i] - mean
  advantages = out[:, None] * f64(response_mask)
  return advantages, advantages


def grpo_vectorized(token_level_rewards, response_mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True):
  scores = f64(token_level_rewards).sum(-1)
  _, g = np.unique(np.asarray(index), return_inverse=True)
  count = np.bincount(g).astype(np.float64)
  mean = np.bincount(g, weights=scores) / np.maximum(count, 1)
  var = np.bincount(g, weights=(scores - mean[g]) ** 2) / np.maximum(count - 1, 1)
  std = np.sqrt(np.maximum(var, 0.0))
  mean, std = np.where(count <= 1, 0.0, mean), np.where(count <= 1, 1.0, std)
  scalars = (scores - mean[g]) / (std[g] + epsilon) if norm_adv_by_std_in_grpo else scores - mean[g]
  advantages = scalars[:, None] * f64(response_mask)
  return advantages, advantages


def gdpo(
  token_level_rewards, response_mask, index, components=None, weights=None, epsilon=1e-6, norm_adv_by_std_in_grpo=True
):
  """`components`: per-sequence scores, placed on each row's last valid token as verl does."""
  m = f64(response_mask)
  if components is None:
    score_list = [f64(token_level_rewards)]
  else:
    last = m.sum(-1).astype(int) - 1  # verl: attention_mask[:, prompt_length:].sum() - 1
    score_list = []
    for component in components:
      scores = np.zeros_like(m)
      scores[np.arange(len(last)), last] = f64(component)
      score_list.append(scores)
  weights = np.ones(len(score_list)) if weights is None else f64(weights)
  total = sum(w * grpo(s, m, index, epsilon, norm_adv_by_std_in_grpo)[0] for w, s in zip(weights, score_list))
  advantages = masked_whiten(total, m) * m
  return advantages, advantages


def grpo_passk(token_level_rewards, response_mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True):
  scores = f64(token_level_rewards).sum(-1)
  advantages = np.zeros_like(scores)
  for rows in _group_rows(index).values():
    rewards = scores[rows]
    if len(rows) < 2:
      raise ValueError("Pass@k requires at least 2 samples per group")
    order = np.argsort(-rewards, kind="stable")  # torch.topk; ties: first (what the test inputs avoid)
    advantage = rewards[order[0]] - rewards[order[1]]
    if norm_adv_by_std_in_grpo:
      advantage = advantage / (rewards.std(ddof=1) + epsilon)
    advantages[rows[order[0]]] = advantage
  advantages = advantages[:, None] * f64(response_mask)
  return advantages, advantages


def reinforce_plus_plus_baseline(token_level_rewards, response_mask, index, epsilon=1e-6):
  m = f64(response_mask)
  scores = f64(token_level_rewards).sum(-1)
  out = scores.copy()
  for rows in _group_rows(index).values():
    mean = 0.0 if len(rows) == 1 else scores[rows].mean()
    for i in rows:
      out[i] = scores[i] - mean
  advantages = np.tile(out[:, None], (1, m.shape[1])) * m
  advantages = masked_whiten(advantages, m) * m
  return advantages, advantages


def rloo(token_level_rewards, response_mask, index, epsilon=1e-6):
  scores = f64(token_level_rewards).sum(-1)
  out = scores.copy()
  for rows in _group_rows(index).values():
    n = len(rows)
    if n > 1:
      mean = scores[rows].mean()
      for i in rows:
        out[i] = scores[i] * n / (n - 1) - mean * n / (n - 1)
  advantages = out[:, None] * f64(response_mask)
  return advantages, advantages


def rloo_vectorized(token_level_rewards, response_mask, index, epsilon=1e-6):
  scores = f64(token_level_rewards).sum(-1)
  _, inv = np.unique(np.asarray(index), return_inverse=True)
  c = np.bincount(inv)[inv].astype(np.float64)
  adv = (c * scores - np.bincount(inv, weights=scores)[inv]) / np.maximum(c - 1, 1) * (c > 1)
  advantages = adv[:, None] * f64(response_mask)
  return advantages, advantages


def opo(token_level_rewards, response_mask, index, epsilon=1e-6):
  m = f64(response_mask)
  lengths, scores = m.sum(-1), f64(token_level_rewards).sum(-1)
  out = scores.copy()
  for rows in _group_rows(index).values():
    baseline = 0.0 if len(rows) == 1 else (lengths[rows] * scores[rows]).sum() / lengths[rows].sum()
    for i in rows:
      out[i] = scores[i] - baseline
  advantages = out[:, None] * m
  return advantages, advantages


def reinforce_plus_plus(token_level_rewards, response_mask, gamma):
  r, m = f64(token_level_rewards), f64(response_mask)
  returns = np.zeros_like(r)
  running = 0.0
  for t in reversed(range(r.shape[1])):
    new_running = r[:, t] + gamma * running
    returns[:, t] = new_running * m[:, t]
    running = new_running * m[:, t] + running * (1 - m[:, t])
  return masked_whiten(returns, m) * m, returns


def remax(token_level_rewards, reward_baselines, response_mask):
  r, m = f64(token_level_rewards), f64(response_mask)
  returns = np.flip(np.cumsum(np.flip(r * m, -1), -1), -1)
  return returns - f64(reward_baselines)[:, None] * m, returns


def gpg(token_level_rewards, response_mask, index, epsilon=1e-6, f_norm=1.0):
  scores = f64(token_level_rewards).sum(-1)
  alpha = len(scores) / max(np.count_nonzero(scores), 1)
  out = scores.copy()
  for rows in _group_rows(index).values():
    mean = 0.0 if len(rows) == 1 else scores[rows].mean()
    for i in rows:
      out[i] = alpha * (scores[i] - mean) / f_norm
  advantages = out[:, None] * f64(response_mask)
  return advantages, advantages


def optimal_token_baseline(
  token_level_rewards,
  response_mask,
  index,
  old_log_probs,
  sum_pi_squared,
  rollout_is_weights=None,
  handle_zero_tail=True,
  epsilon=1e-8,
):
  r, m = f64(token_level_rewards), f64(response_mask)
  returns = np.flip(np.cumsum(np.flip(r * m, -1), -1), -1)
  w = 1 - 2 * np.exp(f64(old_log_probs)) + f64(sum_pi_squared)
  if rollout_is_weights is not None:
    w = w * f64(rollout_is_weights) ** 2
  w_cumulative = np.cumsum(w * m, -1)
  baselines = np.zeros_like(returns)
  for rows in _group_rows(index).values():
    if len(rows) == 1:
      continue
    numerator = (returns[rows] * w_cumulative[rows] * m[rows]).sum(0)
    denominator = (w_cumulative[rows] * m[rows]).sum(0) + epsilon
    baselines[rows] = numerator / denominator
    if handle_zero_tail:
      lengths = m[rows].sum(-1)
      ordered = np.sort(lengths)
      longest = np.nonzero(lengths == ordered[-1])[0]
      if len(longest) == 1 and ordered[-1] > ordered[-2]:
        baselines[rows[longest[0]], int(ordered[-2]) :] = 0.0
  return (returns - baselines) * m, returns


def tir_optimal_token_baseline(
  token_level_rewards,
  response_mask,
  index,
  old_log_probs,
  sum_pi_squared,
  rollout_is_weights=None,
  handle_zero_tail=True,
  epsilon=1e-8,
):
  r, m = f64(token_level_rewards), f64(response_mask)
  token_returns = np.flip(np.cumsum(np.flip(r * m, -1), -1), -1)
  w = 1 - 2 * np.exp(f64(old_log_probs)) + f64(sum_pi_squared)
  if rollout_is_weights is not None:
    w = w * f64(rollout_is_weights) ** 2
  w_cumulative = np.cumsum(w * m, -1)
  lengths = m.sum(-1).astype(int)
  max_length = int(lengths.max()) if len(lengths) else 0
  all_w, all_returns = np.zeros((len(lengths), max_length)), np.zeros((len(lengths), max_length))
  for i, length in enumerate(lengths):
    if length:
      valid = m[i].astype(bool)
      all_w[i, :length], all_returns[i, :length] = w_cumulative[i, valid], token_returns[i, valid]
  groups = defaultdict(list)
  for i, idx in enumerate(index):
    if lengths[i]:
      groups[int(idx)].append(i)
  baselines = np.zeros_like(all_returns)
  for rows in groups.values():
    if len(rows) == 1:
      continue
    baselines[rows] = (all_returns[rows] * all_w[rows]).sum(0) / (all_w[rows].sum(0) + epsilon)
    if handle_zero_tail:
      group_lengths = lengths[rows]
      ordered = np.sort(group_lengths)
      longest = np.nonzero(group_lengths == ordered[-1])[0]
      if len(longest) == 1 and ordered[-1] > ordered[-2]:
        baselines[rows[longest[0]], int(ordered[-2]) :] = 0.0
  all_advantages = all_returns - baselines
  advantages = np.zeros_like(token_returns)
  for i, length in enumerate(lengths):
    if length:
      advantages[i, m[i].astype(bool)] = all_advantages[i, :length]
  return advantages * m, token_returns


# ------------------------------------------------------------------ rollout_corr_helper.py
SAFETY_BOUND = 20.0


def _parse_is_threshold(spec):
  if isinstance(spec, str) and "_" in spec:
    lower, upper = spec.split("_", 1)
    return float(upper), float(lower)
  return float(spec), None


def _parse_rs_thresholds(options, spec):
  specs = [str(spec)] if isinstance(spec, (int, float)) else [p.strip() for p in spec.split(",") if p.strip()]
  if len(specs) == 1 and len(options) > 1:
    specs = specs * len(options)
  out = {}
  for option, s in zip(options, specs):
    if option.endswith("k1"):
      lower, upper = s.split("_", 1) if "_" in s else (str(1.0 / float(s)), s)
      out[option] = (float(lower), float(upper))
    else:
      out[option] = (None, float(s))
  return out


def compute_rollout_correction_weights(
  log_ratio, response_mask, rollout_is="token", rollout_is_threshold=2.0, rollout_is_batch_normalize=False
):
  log_ratio, m = f64(log_ratio), f64(response_mask)
  upper, lower = _parse_is_threshold(rollout_is_threshold)
  if rollout_is == "token":
    log_ratio_for_metrics = log_ratio
    raw = np.exp(np.clip(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))
  else:
    log_ratio_for_metrics = masked_sum(log_ratio, m, axis=-1)[:, None]
    raw = np.broadcast_to(np.exp(np.clip(log_ratio_for_metrics, -SAFETY_BOUND, SAFETY_BOUND)), log_ratio.shape)
  raw = raw * m
  weights = np.minimum(raw, upper) if lower is None else np.where((raw >= lower) & (raw <= upper), raw, 0.0)
  metrics = {}
  metric_lower = 1.0 / upper if lower is None else lower
  if rollout_is == "sequence":
    metrics["rollout_is_max"] = math.exp(min(log_ratio_for_metrics.max(), SAFETY_BOUND))
    metrics["rollout_is_min"] = math.exp(log_ratio_for_metrics.min())
    metrics["rollout_is_mean"] = masked_mean(weights, m)
    metrics["rollout_is_ratio_fraction_high"] = (log_ratio_for_metrics > math.log(upper)).mean()
    metrics["rollout_is_ratio_fraction_low"] = (log_ratio_for_metrics < math.log(metric_lower)).mean()
  else:
    metrics["rollout_is_mean"] = masked_mean(weights, m)
    metrics["rollout_is_ratio_fraction_high"] = masked_mean((raw > upper).astype(float), m)
    metrics["rollout_is_ratio_fraction_low"] = masked_mean((raw < metric_lower).astype(float), m)
    metrics["rollout_is_max"] = np.where(m.astype(bool), weights, -np.inf).max()
    metrics["rollout_is_min"] = np.where(m.astype(bool), weights, np.inf).min()
  if m.sum() > 1:
    clamped = np.clip(weights, 0.0, upper)
    var = masked_mean(clamped**2, m) - masked_mean(clamped, m) ** 2
    metrics["rollout_is_std"] = math.sqrt(max(var, 0.0))
  else:
    metrics["rollout_is_std"] = 0.0
  for_ess = np.clip(weights, 0.0, upper)
  normalised = for_ess / (masked_mean(for_ess, m) + 1e-8)
  metrics["rollout_is_eff_sample_size"] = 1.0 / masked_mean(normalised**2, m)
  seq_mean = masked_mean(weights, m, axis=-1)
  metrics["rollout_is_seq_mean"] = seq_mean.mean()
  metrics["rollout_is_seq_std"] = seq_mean.std(ddof=1) if seq_mean.size > 1 else 0.0
  metrics["rollout_is_seq_max"] = seq_mean.max()
  metrics["rollout_is_seq_min"] = seq_mean.min()
  metrics["rollout_is_seq_max_deviation"] = np.abs(seq_mean - 1.0).max()
  raw_seq_mean = masked_mean(raw, m, axis=-1)
  metrics["rollout_is_seq_fraction_high"] = (raw_seq_mean > upper).mean()
  metrics["rollout_is_seq_fraction_low"] = (raw_seq_mean < metric_lower).mean()
  if lower is not None:
    metrics["rollout_is_oob_ratio"] = masked_mean(((raw < lower) | (raw > upper)).astype(float), m)
  if rollout_is_batch_normalize:
    if rollout_is == "token":
      weights_mean = masked_mean(weights, m)
    else:
      seq_weights = masked_mean(weights, m, axis=-1)
      seq_mask = (m.sum(-1) > 0).astype(float)
      weights_mean = (seq_weights * seq_mask).sum() / max(seq_mask.sum(), 1e-8)
    if weights_mean > 1e-8:
      weights = weights / weights_mean
      metrics["rollout_is_batch_norm_factor"] = weights_mean
    else:
      metrics["rollout_is_batch_norm_factor"] = 1.0
  return weights, metrics


def compute_rollout_rejection_mask(log_ratio, response_mask, rollout_rs, rollout_rs_threshold):
  log_ratio, m = f64(log_ratio), f64(response_mask)
  options = list(dict.fromkeys(o.strip() for o in rollout_rs.split(",") if o.strip()))
  thresholds = _parse_rs_thresholds(options, rollout_rs_threshold)
  safe = np.clip(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)
  stats = {"k1": -safe, "k2": 0.5 * safe**2, "k3": np.exp(safe) - 1.0 - safe}
  mask_bool = m.astype(bool)
  seq_valid = m.sum(-1) > 0
  combined = np.ones_like(m)
  metrics = {}
  for option in options:
    lower, upper = thresholds[option]
    is_k1 = option.endswith("k1")
    lower_log, upper_log = (math.log(lower), math.log(upper)) if is_k1 else (None, None)
    token_stat = stats[option[-2:]]
    if option.startswith("token"):
      per_token, per_seq, level = token_stat, None, "token"
    else:
      if option.startswith("seq_sum"):
        per_seq = masked_sum(token_stat, m, axis=-1)
      elif option.startswith("seq_mean"):
        per_seq = masked_mean(token_stat, m, axis=-1)
      else:
        per_seq = np.where(mask_bool, token_stat, -np.inf).max(-1)
        per_seq = np.where(per_seq == -np.inf, 0.0, per_seq)
      per_token, level = np.broadcast_to(per_seq[:, None], m.shape), "sequence"
    keep = (per_token >= lower_log) & (per_token <= upper_log) if is_k1 else per_token <= upper
    upper_threshold = upper_log if is_k1 else upper
    lower_threshold = lower_log if is_k1 else 0.0
    prefix = f"rollout_rs_{option}"
    seq_values = per_seq if per_seq is not None else masked_mean(per_token, m, axis=-1)
    seq_values_valid = seq_values[seq_valid]
    metrics[f"{prefix}_mean"] = masked_mean(per_token, m)
    if level == "sequence":
      metrics[f"{prefix}_max"], metrics[f"{prefix}_min"] = seq_values_valid.max(), seq_values_valid.min()
      metrics[f"{prefix}_fraction_high"] = (seq_values_valid > upper_threshold).mean()
      metrics[f"{prefix}_fraction_low"] = (seq_values_valid < lower_threshold).mean() if is_k1 else 0.0
    else:
      metrics[f"{prefix}_max"] = np.where(mask_bool, per_token, -np.inf).max()
      metrics[f"{prefix}_min"] = np.where(mask_bool, per_token, np.inf).min()
      metrics[f"{prefix}_fraction_high"] = masked_mean((per_token > upper_threshold).astype(float), m)
      metrics[f"{prefix}_fraction_low"] = masked_mean((per_token < lower_threshold).astype(float), m) if is_k1 else 0.0
    if m.sum() > 1:
      clamped = np.clip(per_token, lower_threshold, upper_threshold)
      var = masked_mean(clamped**2, m) - masked_mean(clamped, m) ** 2
      metrics[f"{prefix}_std"] = math.sqrt(max(var, 0.0))
    else:
      metrics[f"{prefix}_std"] = 0.0
    metrics[f"{prefix}_seq_mean"] = seq_values_valid.mean()
    metrics[f"{prefix}_seq_std"] = seq_values_valid.std(ddof=1) if seq_values_valid.size > 1 else 0.0
    metrics[f"{prefix}_seq_max"] = seq_values_valid.max()
    metrics[f"{prefix}_seq_min"] = seq_values_valid.min()
    metrics[f"{prefix}_seq_max_deviation"] = np.abs(seq_values_valid).max()
    metrics[f"{prefix}_seq_fraction_high"] = (seq_values_valid > upper_threshold).mean()
    if is_k1:
      metrics[f"{prefix}_seq_fraction_low"] = (seq_values_valid < lower_threshold).mean()
    keep_f = keep.astype(float)
    combined = combined * keep_f
    seq_keep = (~(~keep & mask_bool)).all(-1)
    metrics[f"{prefix}_masked_fraction"] = masked_mean(1 - keep_f, m)
    metrics[f"{prefix}_seq_masked_fraction"] = ((1.0 - seq_keep) * seq_valid).sum() / seq_valid.sum()
  metrics["rollout_rs_masked_fraction"] = masked_mean(1 - combined, m)
  final_keep = (combined > 0.5) & mask_bool
  metrics["rollout_rs_seq_masked_fraction"] = (~final_keep & mask_bool).any(-1).astype(float).mean()
  return m * combined, metrics


def compute_offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask):
  lp, rollout, m = f64(old_log_prob), f64(rollout_log_prob), f64(response_mask)
  mean_lp = masked_mean(lp, m, axis=-1)
  mean_rollout = masked_mean(rollout, m, axis=-1)
  log_ratio = lp - rollout
  log_ppl_diff = mean_rollout - mean_lp
  log_ratio_sum = masked_sum(log_ratio, m, axis=-1)
  return {
    "training_ppl": np.exp(-mean_lp).mean(),
    "training_log_ppl": (-mean_lp).mean(),
    "kl": masked_mean(rollout - lp, m),
    "k3_kl": masked_mean(np.exp(log_ratio) - log_ratio - 1, m),
    "rollout_ppl": np.exp(-mean_rollout).mean(),
    "rollout_log_ppl": (-mean_rollout).mean(),
    "log_ppl_diff": log_ppl_diff.mean(),
    "log_ppl_abs_diff": np.abs(log_ppl_diff).mean(),
    "log_ppl_diff_max": log_ppl_diff.max(),
    "log_ppl_diff_min": log_ppl_diff.min(),
    "ppl_ratio": np.exp(log_ppl_diff).mean(),
    "chi2_token": masked_mean(np.exp(np.clip(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)) ** 2, m) - 1.0,
    "chi2_seq": np.exp(2.0 * np.clip(log_ratio_sum, -SAFETY_BOUND, SAFETY_BOUND)).mean() - 1.0,
  }


def compute_rollout_correction_and_rejection_mask(
  old_log_prob,
  rollout_log_prob,
  response_mask,
  rollout_is=None,
  rollout_is_threshold=2.0,
  rollout_is_batch_normalize=False,
  rollout_rs=None,
  rollout_rs_threshold=None,
):
  log_ratio = f64(old_log_prob) - f64(rollout_log_prob)
  metrics, weights = {}, None
  if rollout_is is not None and rollout_is_threshold is not None:
    weights, is_metrics = compute_rollout_correction_weights(
      log_ratio, response_mask, rollout_is, rollout_is_threshold, rollout_is_batch_normalize
    )
    metrics.update(is_metrics)
  mask = f64(response_mask).copy()
  if rollout_rs is not None:
    mask, rs_metrics = compute_rollout_rejection_mask(log_ratio, response_mask, rollout_rs, rollout_rs_threshold)
    metrics.update(rs_metrics)
  metrics.update(compute_offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask))
  return weights, mask, {f"rollout_corr/{k}": float(v) for k, v in metrics.items()}
