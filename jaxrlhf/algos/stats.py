"""Masked statistics and loss aggregation (docs/algorithms.md §1 masked_*, §4 `loss_agg_mode`).

Everything here is computed in fp32 whatever the input dtype, and is masked: a position whose
mask is 0 never influences a result, even if it holds inf/NaN (padding may hold garbage log-probs).
An empty mask yields 0, never NaN, so all-padding micro-batches are harmless.

Exact global normalisation (docs/algorithms.md §4, as verl 0.9.1's `global_batch_info`): a mini-batch is split
into micro-batches for gradient accumulation. `loss_normalizers` computes the denominators once on
the whole mini-batch (verl: `batch_num_tokens`, `global_batch_size`, `loss_scale_factor`); passing
them to `agg_loss` on every micro-batch makes the micro-batch losses (and their gradients) *sum* to
the loss of the unsplit mini-batch, so the trainer accumulates with `+`, not with means of means.
verl also multiplies by `dp_size` because DDP averages gradients over ranks; a jitted global batch
sums, so no such factor appears here.
"""

from typing import Optional

import jax.numpy as jnp

LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def as_f32(x):
  """Casts to fp32: bf16 inputs are accepted but all math runs in fp32 (docs/architecture.md "Numerics")."""
  return jnp.asarray(x).astype(jnp.float32)


def _mask_f32(mask):
  return jnp.asarray(mask).astype(jnp.float32)


def zero_masked(values, mask):
  """fp32 values with masked positions set to 0, so that garbage (inf/NaN) in padding can reach
  neither a loss value nor, through a 0 * NaN chain-rule product, a gradient."""
  return jnp.where(_mask_f32(mask) != 0, as_f32(values), 0.0)


def _safe_denominator(count):
  # Division by a zero count would give NaN values *and* NaN gradients (even behind a `where`),
  # so the denominator itself is made safe; the numerator is 0 in that case anyway.
  return jnp.where(count > 0, count, 1.0)


def masked_sum(values, mask, axis=None):
  """sum(values * mask); masked positions are dropped with `where` so inf/NaN padding is inert."""
  values, mask = as_f32(values), _mask_f32(mask)
  return jnp.sum(jnp.where(mask != 0, values * mask, 0.0), axis=axis)


def masked_mean(values, mask, axis=None):
  """sum(values*mask)/sum(mask) over `axis`; 0 where the mask is empty (verl adds 1e-8 instead)."""
  count = jnp.sum(_mask_f32(mask), axis=axis)
  return masked_sum(values, mask, axis) / _safe_denominator(count)


def masked_var(values, mask, unbiased=True):
  """Variance over all masked elements, Bessel-corrected when `unbiased` (as verl).

  verl raises for fewer than 2 valid elements; inside jit we cannot, so the variance is 0 there
  (one element has no spread), which makes `masked_whiten` map it to exactly 0.
  """
  values, mask = as_f32(values), _mask_f32(mask)
  mean = masked_mean(values, mask)
  variance = masked_mean(jnp.square(values - mean), mask)
  if unbiased:
    count = jnp.sum(mask)
    variance = jnp.where(count > 1, variance * count / _safe_denominator(count - 1), 0.0)
  return variance


def masked_whiten(values, mask, shift_mean=True):
  """(values - mean) * rsqrt(var + 1e-8) with masked mean and unbiased masked variance (verl).

  Masked positions are transformed too (as in verl) but do not influence the statistics.
  """
  values = as_f32(values)
  mean = masked_mean(values, mask)
  var = masked_var(values, mask)
  whitened = (values - mean) * jnp.reciprocal(jnp.sqrt(var + 1e-8))
  if not shift_mean:
    whitened = whitened + mean
  return whitened


def _check_mode(loss_agg_mode):
  if loss_agg_mode not in LOSS_AGG_MODES:
    raise ValueError(f"Invalid loss_agg_mode: {loss_agg_mode!r}; expected one of {list(LOSS_AGG_MODES)}")


def loss_normalizers(loss_mask, loss_agg_mode="token-mean", loss_scale_factor: Optional[float] = None):
  """Global denominators of a whole mini-batch, to pass to `agg_loss` on each of its micro-batches.

  Returns dict(global_token_count=number of valid tokens, global_seq_count=number of rows with at
  least one valid token, loss_scale_factor=the `seq-mean-token-sum-norm` divisor: the given value,
  or the mini-batch's padded response length R when None, as verl). All three are always returned
  as fp32 scalars (the pytree structure then does not depend on the mode, and losses such as
  geo_mean aggregate by sequence whatever the configured mode).
  """
  _check_mode(loss_agg_mode)
  mask = _mask_f32(loss_mask)
  scale = mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
  return dict(
    global_token_count=jnp.sum(mask),
    global_seq_count=jnp.sum((jnp.sum(mask, axis=-1) > 0).astype(jnp.float32)),
    loss_scale_factor=jnp.asarray(scale, jnp.float32),
  )


def token_mean(values, mask, global_token_count=None):
  """Masked mean over all tokens, divided by `global_token_count` when given (then additive over
  micro-batches). Used for the loss's token-mean mode and for every per-token metric."""
  if global_token_count is None:
    return masked_mean(values, mask)
  return masked_sum(values, mask) / _safe_denominator(as_f32(global_token_count))


def seq_mean(per_seq_N, seq_valid_N, global_seq_count=None):
  """Mean of a per-sequence quantity over rows with >=1 valid token (global count when given)."""
  per_seq_N, seq_valid_N = as_f32(per_seq_N), _mask_f32(seq_valid_N)
  count = jnp.sum(seq_valid_N) if global_seq_count is None else as_f32(global_seq_count)
  return masked_sum(per_seq_N, seq_valid_N) / _safe_denominator(count)


def agg_loss(
  loss_mat,
  loss_mask,
  loss_agg_mode,
  *,
  global_token_count=None,
  global_seq_count=None,
  loss_scale_factor: Optional[float] = None,
):
  """Aggregates a [N, R] per-token loss into a scalar (docs/algorithms.md §4, verl 0.9.1's `agg_loss`).

  With S = global_seq_count or the number of rows with a valid token:
  - token-mean: sum(L*m) / (global_token_count or sum(m))
  - token-sum: sum(L*m)
  - seq-mean-token-sum: sum over rows of sum_t(L*m), / S
  - seq-mean-token-mean: sum over rows of sum_t(L*m)/sum_t(m), / S
  - seq-mean-token-sum-norm: sum(L*m) / S / (loss_scale_factor or the padded length R)
  Rows without a valid token contribute nothing and are not counted (as verl 0.9.1).
  """
  _check_mode(loss_agg_mode)
  loss_mask = _mask_f32(loss_mask)
  if loss_agg_mode == "token-mean":
    return token_mean(loss_mat, loss_mask, global_token_count)
  if loss_agg_mode == "token-sum":
    return masked_sum(loss_mat, loss_mask)
  tokens_per_seq_N = jnp.sum(loss_mask, axis=-1)
  seq_losses_N = masked_sum(loss_mat, loss_mask, axis=-1)
  if loss_agg_mode == "seq-mean-token-mean":
    seq_losses_N = seq_losses_N / _safe_denominator(tokens_per_seq_N)
  loss = seq_mean(seq_losses_N, tokens_per_seq_N > 0, global_seq_count)
  if loss_agg_mode == "seq-mean-token-sum-norm":
    loss = loss / (loss_mask.shape[-1] if loss_scale_factor is None else as_f32(loss_scale_factor))
  return loss
