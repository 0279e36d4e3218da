"""Rollout correction (verl 0.9.1 `rollout_corr_helper`): importance weights and rejection between
the rollout's log-probs and the training forward's (docs/algorithms.md §4 `bypass_mode`).

The sampler and the trainer compute log-probs of the same tokens with different numerics (e.g.
`rollout.dtype=bfloat16` against fp32 training), so pi_rollout != pi_train. With
log_ratio = log pi_train - log pi_rollout:
- importance weights (`rollout_is` = "token" | "sequence"): w = exp(clip(log_ratio, +-20)) per token,
  or exp(clip(sum_t log_ratio, +-20)) per sequence; a float threshold truncates w at it (TIS), a
  "lower_upper" string zeroes w outside [lower, upper] (IcePop); optionally renormalised to mean 1;
- rejection (`rollout_rs`, comma-separated options, all must pass): a token or a whole sequence
  leaves the loss mask when a divergence estimate exceeds its threshold. k1 = -log_ratio (bounds
  are ratios: "lower_upper", or one upper u meaning [1/u, u]), k2 = log_ratio^2 / 2,
  k3 = exp(log_ratio) - 1 - log_ratio; `token_k*` per token, `seq_{sum,mean}_k*` over the row,
  `seq_max_k{2,3}` the row's largest token value;
- metrics: verl's `rollout_corr/...` names (IS statistics, rejection fractions, off-policy
  diagnostics: KL, perplexities, chi^2).
Thresholds and options are static config values, parsed in Python; everything else is jittable.
Sequence statistics run over rows with at least one valid token (verl averages over all rows; it
never has empty rows, ours are padding).
"""

import math
from typing import Optional

import jax
import jax.numpy as jnp

from jaxrlhf.algos.stats import as_f32, masked_mean, masked_sum, zero_masked

SAFETY_BOUND = 20.0
ROLLOUT_RS_OPTIONS = (
  "token_k1",
  "token_k2",
  "token_k3",
  "seq_sum_k1",
  "seq_sum_k2",
  "seq_sum_k3",
  "seq_mean_k1",
  "seq_mean_k2",
  "seq_mean_k3",
  "seq_max_k2",
  "seq_max_k3",
)
# Keys of verl's `algorithm.rollout_correction` that shape the math (bypass_mode itself is a switch).
ROLLOUT_CORRECTION_CONFIG_KEYS = (
  "loss_type",
  "rollout_is",
  "rollout_is_threshold",
  "rollout_is_batch_normalize",
  "rollout_rs",
  "rollout_rs_threshold",
)


def _config_error(key, message):
  return ValueError(f"algorithm.rollout_correction.{key}: {message}")


def parse_rollout_is_threshold(spec):
  """(upper, lower or None) from a float (truncation) or a "lower_upper" string (IcePop)."""
  if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
    raise _config_error("rollout_is_threshold", f"expected a float or a 'lower_upper' string, got {spec!r}")
  lower = None
  try:
    if isinstance(spec, str) and "_" in spec:
      lower_text, upper_text = spec.strip().split("_", 1)
      lower, upper = float(lower_text), float(upper_text)
    else:
      upper = float(spec)
  except ValueError as error:
    raise _config_error("rollout_is_threshold", f"cannot read {spec!r}") from error
  if upper <= 0 or (lower is not None and not 0 < lower <= upper):
    raise _config_error("rollout_is_threshold", f"bounds must be positive with lower <= upper, got {spec!r}")
  return upper, lower


def parse_rollout_rs(rollout_rs, rollout_rs_threshold):
  """[(option, lower, upper)]: k1 options get (lower, upper) ratio bounds, the others (None, upper)."""
  if not isinstance(rollout_rs, str):
    raise _config_error("rollout_rs", f"expected comma-separated options, got {rollout_rs!r}")
  options = list(dict.fromkeys(o.strip() for o in rollout_rs.split(",") if o.strip()))
  for option in options:
    if option not in ROLLOUT_RS_OPTIONS:
      raise _config_error("rollout_rs", f"unknown option {option!r}; expected some of {list(ROLLOUT_RS_OPTIONS)}")
  if not options:
    raise _config_error("rollout_rs", "no option given")
  if rollout_rs_threshold is None or isinstance(rollout_rs_threshold, bool):
    raise _config_error("rollout_rs_threshold", f"needed with rollout_rs={rollout_rs!r}")
  specs = [p.strip() for p in str(rollout_rs_threshold).split(",") if p.strip()]
  if len(specs) == 1:
    specs = specs * len(options)
  if len(specs) != len(options):
    raise _config_error("rollout_rs_threshold", f"give one threshold or one per option ({len(options)})")
  parsed = []
  for option, spec in zip(options, specs):
    try:
      if option.endswith("k1"):
        lower_text, upper_text = spec.split("_", 1) if "_" in spec else (str(1.0 / float(spec)), spec)
        lower, upper = float(lower_text), float(upper_text)
      elif "_" in spec:
        raise _config_error("rollout_rs_threshold", f"{option} takes one upper bound, got {spec!r}")
      else:
        lower, upper = None, float(spec)
    except ValueError as error:
      if "rollout_correction" in str(error):
        raise
      raise _config_error("rollout_rs_threshold", f"cannot read {spec!r} for {option}") from error
    if upper <= 0 or (lower is not None and not 0 < lower <= upper):
      raise _config_error("rollout_rs_threshold", f"{option}: bounds must be positive, lower <= upper ({spec!r})")
    parsed.append((option, lower, upper))
  return parsed


def _rows(response_mask_NxR):
  return jnp.sum(as_f32(response_mask_NxR), axis=-1) > 0


def _row_mean(x_N, rows_N):
  return masked_mean(x_N, rows_N)


def _row_max(x_N, rows_N):
  return jnp.where(jnp.any(rows_N), jnp.max(jnp.where(rows_N, x_N, -jnp.inf)), 0.0)


def _row_min(x_N, rows_N):
  return jnp.where(jnp.any(rows_N), jnp.min(jnp.where(rows_N, x_N, jnp.inf)), 0.0)


def _row_std(x_N, rows_N):
  """Unbiased std over the rows (torch.std); 0 for fewer than two rows."""
  n = jnp.sum(rows_N.astype(jnp.float32))
  mean = _row_mean(x_N, rows_N)
  var = masked_sum(jnp.square(x_N - mean), rows_N) / jnp.maximum(n - 1.0, 1.0)
  return jnp.where(n > 1, jnp.sqrt(var), 0.0)


def _token_max(x_NxR, mask_NxR):
  valid = as_f32(mask_NxR) != 0
  return jnp.where(jnp.any(valid), jnp.max(jnp.where(valid, x_NxR, -jnp.inf)), 0.0)


def _token_min(x_NxR, mask_NxR):
  valid = as_f32(mask_NxR) != 0
  return jnp.where(jnp.any(valid), jnp.min(jnp.where(valid, x_NxR, jnp.inf)), 0.0)


def _clamped_std(x_NxR, mask_NxR, low, high):
  """Population std of c = clip(x, low, high) over the valid tokens (0 for fewer than two).

  verl computes sqrt(max(E[c^2] - E[c]^2, 0)); the two-pass E[(c - E[c])^2] is the same number
  without the fp32 cancellation (which made the value depend on the padding, ~1e-5 where c is constant).
  """
  clamped = jnp.clip(x_NxR, low, high)
  var = masked_mean(jnp.square(clamped - masked_mean(clamped, mask_NxR)), mask_NxR)
  return jnp.where(jnp.sum(as_f32(mask_NxR)) > 1, jnp.sqrt(var), 0.0)


def compute_rollout_correction_weights(
  log_ratio, response_mask, rollout_is="token", rollout_is_threshold=2.0, rollout_is_batch_normalize=False
):
  """(weights [N, R], metrics): truncated (TIS) or IcePop importance weights, 0 off the mask."""
  if rollout_is not in ("token", "sequence"):
    raise _config_error("rollout_is", f"expected 'token', 'sequence' or None, got {rollout_is!r}")
  upper, lower = parse_rollout_is_threshold(rollout_is_threshold)
  mask = as_f32(response_mask)
  log_ratio = zero_masked(log_ratio, mask)
  rows = _rows(mask)
  if rollout_is == "token":
    raw = jnp.exp(jnp.clip(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)) * mask
  else:
    log_ratio_sum_N = jnp.sum(log_ratio, axis=-1)
    raw = jnp.exp(jnp.clip(log_ratio_sum_N, -SAFETY_BOUND, SAFETY_BOUND))[:, None] * mask
  if lower is None:
    weights = jnp.minimum(raw, upper)
  else:
    weights = jnp.where((raw >= lower) & (raw <= upper), raw, 0.0)
  metric_lower = 1.0 / upper if lower is None else lower
  metrics = {}
  if rollout_is == "sequence":
    metrics["rollout_is_max"] = jnp.exp(jnp.minimum(_row_max(log_ratio_sum_N, rows), SAFETY_BOUND))
    metrics["rollout_is_min"] = jnp.exp(_row_min(log_ratio_sum_N, rows))
    metrics["rollout_is_mean"] = masked_mean(weights, mask)
    metrics["rollout_is_ratio_fraction_high"] = _row_mean(log_ratio_sum_N > math.log(upper), rows)
    metrics["rollout_is_ratio_fraction_low"] = _row_mean(log_ratio_sum_N < math.log(metric_lower), rows)
  else:
    metrics["rollout_is_mean"] = masked_mean(weights, mask)
    metrics["rollout_is_ratio_fraction_high"] = masked_mean(raw > upper, mask)
    metrics["rollout_is_ratio_fraction_low"] = masked_mean(raw < metric_lower, mask)
    metrics["rollout_is_max"] = _token_max(weights, mask)
    metrics["rollout_is_min"] = _token_min(weights, mask)
  metrics["rollout_is_std"] = _clamped_std(weights, mask, 0.0, upper)
  for_ess = jnp.clip(weights, 0.0, upper)
  normalised = for_ess / (masked_mean(for_ess, mask) + 1e-8)
  second_moment = masked_mean(jnp.square(normalised), mask)
  metrics["rollout_is_eff_sample_size"] = jnp.where(
    second_moment > 0, 1.0 / jnp.where(second_moment > 0, second_moment, 1.0), 0.0
  )
  seq_weights_N = masked_mean(weights, mask, axis=-1)
  metrics["rollout_is_seq_mean"] = _row_mean(seq_weights_N, rows)
  metrics["rollout_is_seq_std"] = _row_std(seq_weights_N, rows)
  metrics["rollout_is_seq_max"] = _row_max(seq_weights_N, rows)
  metrics["rollout_is_seq_min"] = _row_min(seq_weights_N, rows)
  metrics["rollout_is_seq_max_deviation"] = _row_max(jnp.abs(seq_weights_N - 1.0), rows)
  raw_seq_N = masked_mean(raw, mask, axis=-1)
  metrics["rollout_is_seq_fraction_high"] = _row_mean(raw_seq_N > upper, rows)
  metrics["rollout_is_seq_fraction_low"] = _row_mean(raw_seq_N < metric_lower, rows)
  if lower is not None:
    metrics["rollout_is_oob_ratio"] = masked_mean((raw < lower) | (raw > upper), mask)
  weights = jax.lax.stop_gradient(weights)  # weights change the measure, not the objective
  if rollout_is_batch_normalize:
    weights_mean = masked_mean(weights, mask) if rollout_is == "token" else _row_mean(seq_weights_N, rows)
    usable = weights_mean > 1e-8
    weights = jnp.where(usable, weights / jnp.where(usable, weights_mean, 1.0), weights)
    metrics["rollout_is_batch_norm_factor"] = jnp.where(usable, weights_mean, 1.0)
  return weights, metrics


def compute_rollout_rejection_mask(log_ratio, response_mask, rollout_rs, rollout_rs_threshold):
  """(response_mask with rejected tokens/sequences at 0, metrics); every option must pass."""
  options = parse_rollout_rs(rollout_rs, rollout_rs_threshold)
  mask = as_f32(response_mask)
  valid = mask != 0
  rows = _rows(mask)
  log_ratio = jnp.clip(zero_masked(log_ratio, mask), -SAFETY_BOUND, SAFETY_BOUND)
  token_stats = {"k1": -log_ratio, "k2": 0.5 * jnp.square(log_ratio), "k3": jnp.exp(log_ratio) - 1.0 - log_ratio}
  keep_all = jnp.ones_like(mask)
  metrics = {}
  for option, lower, upper in options:
    estimator = option[-2:]
    is_k1 = estimator == "k1"
    upper_threshold = math.log(upper) if is_k1 else upper
    lower_threshold = math.log(lower) if is_k1 else 0.0
    per_token = token_stats[estimator]
    if option.startswith("token"):
      stat_NxR, seq_N = per_token, masked_mean(per_token, mask, axis=-1)
    else:
      if option.startswith("seq_sum"):
        seq_N = masked_sum(per_token, mask, axis=-1)
      elif option.startswith("seq_mean"):
        seq_N = masked_mean(per_token, mask, axis=-1)
      else:
        seq_N = _row_max_over_tokens(per_token, mask)
      stat_NxR = jnp.broadcast_to(seq_N[:, None], mask.shape)
    keep_NxR = stat_NxR <= upper_threshold
    if is_k1:
      keep_NxR = keep_NxR & (stat_NxR >= lower_threshold)
    prefix = f"rollout_rs_{option}"
    metrics[f"{prefix}_mean"] = masked_mean(stat_NxR, mask)
    if option.startswith("token"):
      metrics[f"{prefix}_max"] = _token_max(stat_NxR, mask)
      metrics[f"{prefix}_min"] = _token_min(stat_NxR, mask)
      metrics[f"{prefix}_fraction_high"] = masked_mean(stat_NxR > upper_threshold, mask)
      low = masked_mean(stat_NxR < lower_threshold, mask)
    else:
      metrics[f"{prefix}_max"] = _row_max(seq_N, rows)
      metrics[f"{prefix}_min"] = _row_min(seq_N, rows)
      metrics[f"{prefix}_fraction_high"] = _row_mean(seq_N > upper_threshold, rows)
      low = _row_mean(seq_N < lower_threshold, rows)
    metrics[f"{prefix}_fraction_low"] = low if is_k1 else jnp.float32(0.0)
    metrics[f"{prefix}_std"] = _clamped_std(stat_NxR, mask, lower_threshold, upper_threshold)
    metrics[f"{prefix}_seq_mean"] = _row_mean(seq_N, rows)
    metrics[f"{prefix}_seq_std"] = _row_std(seq_N, rows)
    metrics[f"{prefix}_seq_max"] = _row_max(seq_N, rows)
    metrics[f"{prefix}_seq_min"] = _row_min(seq_N, rows)
    metrics[f"{prefix}_seq_max_deviation"] = _row_max(jnp.abs(seq_N), rows)
    metrics[f"{prefix}_seq_fraction_high"] = _row_mean(seq_N > upper_threshold, rows)
    if is_k1:
      metrics[f"{prefix}_seq_fraction_low"] = _row_mean(seq_N < lower_threshold, rows)
    keep_f = keep_NxR.astype(jnp.float32)
    keep_all = keep_all * keep_f
    metrics[f"{prefix}_masked_fraction"] = masked_mean(1.0 - keep_f, mask)
    metrics[f"{prefix}_seq_masked_fraction"] = _row_mean(jnp.any(~keep_NxR & valid, axis=-1), rows)
  metrics["rollout_rs_masked_fraction"] = masked_mean(1.0 - keep_all, mask)
  metrics["rollout_rs_seq_masked_fraction"] = _row_mean(jnp.any((keep_all <= 0.5) & valid, axis=-1), rows)
  return mask * keep_all, metrics


def _row_max_over_tokens(x_NxR, mask_NxR):
  valid = as_f32(mask_NxR) != 0
  row_max_N = jnp.max(jnp.where(valid, x_NxR, -jnp.inf), axis=-1)
  return jnp.where(jnp.any(valid, axis=-1), row_max_N, 0.0)


def compute_offpolicy_metrics(log_prob, rollout_log_prob, response_mask):
  """Off-policy diagnostics between the training (`log_prob`) and rollout policies (verl names)."""
  mask = as_f32(response_mask)
  rows = _rows(mask)
  log_prob, rollout_log_prob = zero_masked(log_prob, mask), zero_masked(rollout_log_prob, mask)
  log_ratio = log_prob - rollout_log_prob
  mean_log_prob_N = masked_mean(log_prob, mask, axis=-1)
  mean_rollout_log_prob_N = masked_mean(rollout_log_prob, mask, axis=-1)
  log_ppl_diff_N = mean_rollout_log_prob_N - mean_log_prob_N
  log_ratio_sum_N = jnp.sum(log_ratio, axis=-1)
  return {
    "training_ppl": _row_mean(jnp.exp(-mean_log_prob_N), rows),
    "training_log_ppl": _row_mean(-mean_log_prob_N, rows),
    "kl": masked_mean(rollout_log_prob - log_prob, mask),
    "k3_kl": masked_mean(jnp.exp(log_ratio) - log_ratio - 1.0, mask),
    "rollout_ppl": _row_mean(jnp.exp(-mean_rollout_log_prob_N), rows),
    "rollout_log_ppl": _row_mean(-mean_rollout_log_prob_N, rows),
    "log_ppl_diff": _row_mean(log_ppl_diff_N, rows),
    "log_ppl_abs_diff": _row_mean(jnp.abs(log_ppl_diff_N), rows),
    "log_ppl_diff_max": _row_max(log_ppl_diff_N, rows),
    "log_ppl_diff_min": _row_min(log_ppl_diff_N, rows),
    "ppl_ratio": _row_mean(jnp.exp(log_ppl_diff_N), rows),
    "chi2_token": masked_mean(jnp.square(jnp.exp(jnp.clip(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))), mask) - 1.0,
    "chi2_seq": _row_mean(jnp.exp(2.0 * jnp.clip(log_ratio_sum_N, -SAFETY_BOUND, SAFETY_BOUND)), rows) - 1.0,
  }


def compute_rollout_correction_and_rejection_mask(
  log_prob,
  rollout_log_prob,
  response_mask,
  *,
  rollout_is: Optional[str] = None,
  rollout_is_threshold=2.0,
  rollout_is_batch_normalize: bool = False,
  rollout_rs: Optional[str] = None,
  rollout_rs_threshold=None,
):
  """verl's unified entry point: (weights [N, R] or None, response mask after rejection, metrics).

  `log_prob` is the training policy's (the old-log-prob phase in decoupled mode, the current
  forward in bypass mode; pass it through stop_gradient). Metrics carry the `rollout_corr/` prefix.
  Weights are None when `rollout_is` is None; the mask is unchanged when `rollout_rs` is None.
  """
  log_prob, rollout_log_prob = as_f32(log_prob), as_f32(rollout_log_prob)
  mask = as_f32(response_mask)
  log_ratio = log_prob - rollout_log_prob
  metrics, weights = {}, None
  if rollout_is is not None and rollout_is_threshold is not None:
    weights, is_metrics = compute_rollout_correction_weights(
      log_ratio, mask, rollout_is, rollout_is_threshold, rollout_is_batch_normalize
    )
    metrics.update(is_metrics)
  new_mask = mask
  if rollout_rs is not None:
    new_mask, rs_metrics = compute_rollout_rejection_mask(log_ratio, mask, rollout_rs, rollout_rs_threshold)
    metrics.update(rs_metrics)
  metrics.update(compute_offpolicy_metrics(log_prob, rollout_log_prob, mask))
  metrics = {f"rollout_corr/{k}": jnp.asarray(v, jnp.float32) for k, v in metrics.items()}
  return weights, new_mask, metrics
