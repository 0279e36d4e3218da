"""The math of Qwen3.5's Gated DeltaNet linear-attention layer, as pure JAX functions.

The layer module (projections, weights, cache) calls these; they hold no parameters. Each mirrors a
function of transformers' `modeling_qwen3_5.py` and keeps its name and argument names:
  chunk_gated_delta_rule      torch_chunk_gated_delta_rule      (prefill and training: chunked parallel form)
  recurrent_gated_delta_rule  torch_recurrent_gated_delta_rule  (decoding one token at a time; the cross-check)
  l2norm                      l2norm
  causal_conv1d               causal_conv1d_fn (no state) and causal_conv1d_update (with a state)
  gated_rms_norm              Qwen3_5RMSNormGated

The gated delta rule. Per value head, with q_t, k_t L2-normalised (`use_qk_l2norm`), q_t scaled by
K**-0.5, decay g_t <= 0 (log space) and write strength beta_t in (0, 1), the state S_t [K, V] follows
  S'_t = exp(g_t) S_{t-1}                                      (decay)
  S_t  = S'_t + k_t (beta_t (v_t - S'_t^T k_t))^T             (delta rule: write the correction only)
  o_t  = S_t^T q_t
Key heads serve Hv / Hk consecutive value heads (grouped value attention, HF's `repeat_interleave`).
The chunked form computes the same thing a chunk of T tokens at a time: inside a chunk a unit lower
triangular system (the UT transform) condenses the T delta updates into matmuls, and a `lax.scan` over
chunks carries S. Math is in fp32 whatever the input dtype; outputs come back in the input dtype, the
final state in fp32 (as HF's).

Masks. `valid_BxL` (bool, optional) marks the tokens that exist. An invalid token leaves every state
exactly as it was and its output is zeros: its q, k, v, g and beta are replaced by 0 (exp(g) = 1: no
decay; beta = 0: no write), and whatever they held, NaN included, is never read. Valid tokens see the
sequence as if the invalid ones were removed. This is how a padded, finished or paused row keeps its
state while the batch moves on. For the causal conv, an invalid token's input never enters the conv
state, and a valid token's window is the previous W-1 *valid* inputs (state first); see
`causal_conv1d`. HF instead zeroes padded hidden states before the projections
(`apply_mask_to_padding_states`): that is the caller's business.

Shape letters here (this module's own: K and V are head dims as HF's k_head_dim / v_head_dim, not the
package legend's key/value heads and vocabulary of `models/decoder.py`):
  B rows   L tokens   Hk key (and query) heads   Hv value heads   K key head dim   V value head dim
  C conv channels   W conv kernel width (W1 = W - 1)   Nc chunks   T tokens per chunk (`chunk_size`)
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

# fp32 matmuls at full precision: GPUs would otherwise run them in TF32, and the UT transform's inverse and
# the state carried over thousands of tokens are what HF (torch, TF32 off) computes in true fp32.
_HIGHEST = jax.lax.Precision.HIGHEST


def _einsum(spec, *operands):
  return jnp.einsum(spec, *operands, precision=_HIGHEST)


def l2norm(x, eps=1e-6):
  """x / sqrt(sum(x^2) + eps) over the last axis (HF's and FLA's l2norm)."""
  return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def _prepare(q_BxLxHkxK, k_BxLxHkxK, v_BxLxHvxV, g_BxLxHv, beta_BxLxHv, use_qk_l2norm, valid_BxL):
  """fp32 inputs with the key heads repeated to the value heads, q/k normalised, q scaled, invalid tokens muted."""
  q_BxLxHkxK, k_BxLxHkxK, v_BxLxHvxV, g_BxLxHv, beta_BxLxHv = (
    x.astype(jnp.float32) for x in (q_BxLxHkxK, k_BxLxHkxK, v_BxLxHvxV, g_BxLxHv, beta_BxLxHv)
  )
  if valid_BxL is not None:
    # g = 0: no decay; beta = 0 and k = 0: no write, and later tokens of the chunk read nothing through this one;
    # q = 0: its output is zeros. `where` on the raw inputs (before the l2norm), not a product, so that garbage
    # (even NaN) at invalid tokens reaches neither the state nor the gradients.
    valid_BxLx1 = valid_BxL[:, :, None]
    q_BxLxHkxK, k_BxLxHkxK, v_BxLxHvxV = (
      jnp.where(valid_BxLx1[..., None], x, 0.0) for x in (q_BxLxHkxK, k_BxLxHkxK, v_BxLxHvxV)
    )
    g_BxLxHv, beta_BxLxHv = (jnp.where(valid_BxLx1, x, 0.0) for x in (g_BxLxHv, beta_BxLxHv))
  heads_per_key = v_BxLxHvxV.shape[2] // k_BxLxHkxK.shape[2]
  q_BxLxHvxK, k_BxLxHvxK = (jnp.repeat(x, heads_per_key, axis=2) for x in (q_BxLxHkxK, k_BxLxHkxK))
  if use_qk_l2norm:
    q_BxLxHvxK, k_BxLxHvxK = l2norm(q_BxLxHvxK), l2norm(k_BxLxHvxK)
  q_BxLxHvxK = q_BxLxHvxK * q_BxLxHvxK.shape[-1] ** -0.5
  return q_BxLxHvxK, k_BxLxHvxK, v_BxLxHvxV, g_BxLxHv, beta_BxLxHv


def _initial_state(initial_state_BxHvxKxV, batch, heads, key_dim, value_dim):
  if initial_state_BxHvxKxV is None:
    return jnp.zeros((batch, heads, key_dim, value_dim), jnp.float32)
  return initial_state_BxHvxKxV.astype(jnp.float32)


@jax.custom_vjp
def unit_lower_inverse(a_xTxT):
  """(I + strictly_lower(a))^-1 for a batch of T x T matrices, in matmuls only.

  With N = -strictly_lower(a), nilpotent (N^T = 0), the inverse is I + N + ... + N^(T-1) = (I + N)(I + N^2)(I + N^4)
  ..., ceil(log2 T) squarings and products. A triangular solve would do the same work, but on CPU it is a LAPACK call
  (OpenBLAS threads inside XLA's) that was seen to hang a training step; this is plain XLA on every platform. The
  gradient is the inverse's own (`_unit_lower_inverse_backward`), two matmuls, not autodiff through the squarings.
  """
  size = a_xTxT.shape[-1]
  eye_TxT = jnp.eye(size, dtype=jnp.float32)
  power_xTxT = -jnp.where(_strictly_lower(size), a_xTxT, 0.0)
  inverse_xTxT = eye_TxT + power_xTxT
  for _ in range(max(0, math.ceil(math.log2(size)) - 1)):
    power_xTxT = _einsum("...ij,...jk->...ik", power_xTxT, power_xTxT)
    inverse_xTxT = _einsum("...ij,...jk->...ik", inverse_xTxT, eye_TxT + power_xTxT)
  return inverse_xTxT


def _strictly_lower(size):
  return jnp.tril(jnp.ones((size, size), bool), -1)


def _unit_lower_inverse_forward(a_xTxT):
  inverse_xTxT = unit_lower_inverse(a_xTxT)
  return inverse_xTxT, inverse_xTxT


def _unit_lower_inverse_backward(inverse_xTxT, cotangent_xTxT):
  """With A = I + strictly_lower(a) and Y = A^-1: dY = -Y dA Y, so dL/dA = -Y^T (dL/dY) Y^T, read on a's strict
  lower triangle (the only part of a the forward reads). Autodiff through the squarings took 12 matmuls and kept
  every power for the backward: on the CPU quickstart's shapes that was half the delta rule's backward."""
  left_xTxT = _einsum("...ji,...jk->...ik", inverse_xTxT, cotangent_xTxT)
  grad_xTxT = -_einsum("...ik,...lk->...il", left_xTxT, inverse_xTxT)
  return (jnp.where(_strictly_lower(grad_xTxT.shape[-1]), grad_xTxT, 0.0),)


unit_lower_inverse.defvjp(_unit_lower_inverse_forward, _unit_lower_inverse_backward)


def chunk_gated_delta_rule(
  q_BxLxHkxK,
  k_BxLxHkxK,
  v_BxLxHvxV,
  g_BxLxHv,
  beta_BxLxHv,
  *,
  chunk_size=64,
  initial_state_BxHvxKxV=None,
  use_qk_l2norm=True,
  valid_BxL=None,
):
  """The gated delta rule over L tokens, chunk by chunk (HF's torch_chunk_gated_delta_rule).

  Returns (out_BxLxHvxV in q's dtype, final_state_BxHvxKxV in fp32). `initial_state_BxHvxKxV` None is
  zeros. L need not be a multiple of `chunk_size`: the tail is padded with tokens that change nothing.
  Differentiable (matmuls and a scan).
  """
  batch, length, _, key_dim = k_BxLxHkxK.shape
  heads, value_dim = v_BxLxHvxV.shape[-2:]
  q_BxLxHvxK, k_BxLxHvxK, v_BxLxHvxV32, g_BxLxHv, beta_BxLxHv = _prepare(
    q_BxLxHkxK, k_BxLxHkxK, v_BxLxHvxV, g_BxLxHv, beta_BxLxHv, use_qk_l2norm, valid_BxL
  )
  pad = (-length) % chunk_size
  chunks = (length + pad) // chunk_size

  def chunked(x_BxLxHvx_):  # [B, L, Hv, ...] -> [B, Hv, Nc, T, ...], zero-padded (g = beta = k = 0: a no-op token)
    x = jnp.pad(x_BxLxHvx_, [(0, 0), (0, pad)] + [(0, 0)] * (x_BxLxHvx_.ndim - 2))
    x = x.reshape(batch, chunks, chunk_size, *x.shape[2:])
    return jnp.moveaxis(x, 3, 1)

  q_BxHvxNcxTxK, k_BxHvxNcxTxK, v_BxHvxNcxTxV = (chunked(x) for x in (q_BxLxHvxK, k_BxLxHvxK, v_BxLxHvxV32))
  g_BxHvxNcxT, beta_BxHvxNcxT = (chunked(x) for x in (g_BxLxHv, beta_BxLxHv))
  v_beta_BxHvxNcxTxV = v_BxHvxNcxTxV * beta_BxHvxNcxT[..., None]
  k_beta_BxHvxNcxTxK = k_BxHvxNcxTxK * beta_BxHvxNcxT[..., None]

  # cum_decay[t]: log of the decay from the start of the chunk through token t.
  cum_decay_BxHvxNcxT = jnp.cumsum(g_BxHvxNcxT, axis=-1)
  # pairwise_decay[i, j] = exp(cum_decay_i - cum_decay_j) for j <= i; masked before the exp, which would overflow.
  causal_TxT = jnp.tril(jnp.ones((chunk_size, chunk_size), bool))
  log_pairwise_BxHvxNcxTxT = cum_decay_BxHvxNcxT[..., :, None] - cum_decay_BxHvxNcxT[..., None, :]
  pairwise_decay_BxHvxNcxTxT = jnp.exp(jnp.where(causal_TxT, log_pairwise_BxHvxNcxTxT, -jnp.inf))
  ut_system_BxHvxNcxTxT = _einsum("...ik,...jk->...ij", k_beta_BxHvxNcxTxK, k_BxHvxNcxTxK) * pairwise_decay_BxHvxNcxTxT
  intra_chunk_attn_BxHvxNcxTxT = (
    _einsum("...ik,...jk->...ij", q_BxHvxNcxTxK, k_BxHvxNcxTxK) * pairwise_decay_BxHvxNcxTxT
  )
  decayed_k_beta_BxHvxNcxTxK = k_beta_BxHvxNcxTxK * jnp.exp(cum_decay_BxHvxNcxT)[..., None]
  # The UT transform: (I + strictly_lower(ut_system))^-1 applied to the beta-weighted values and decayed keys (only
  # the strict lower triangle is read: a unit diagonal, as HF's triangular solve).
  inverse_BxHvxNcxTxT = unit_lower_inverse(ut_system_BxHvxNcxTxT)
  new_values_BxHvxNcxTxV, k_cumdecay_BxHvxNcxTxK = (
    _einsum("...ij,...jd->...id", inverse_BxHvxNcxTxT, x) for x in (v_beta_BxHvxNcxTxV, decayed_k_beta_BxHvxNcxTxK)
  )
  # Decays applied once, outside the scan: the query reads the state decayed to its token, the key writes the
  # state decayed to the end of the chunk.
  decayed_q_BxHvxNcxTxK = q_BxHvxNcxTxK * jnp.exp(cum_decay_BxHvxNcxT)[..., None]
  decayed_k_BxHvxNcxTxK = k_BxHvxNcxTxK * jnp.exp(cum_decay_BxHvxNcxT[..., -1:] - cum_decay_BxHvxNcxT)[..., None]
  chunk_decay_BxHvxNc = jnp.exp(cum_decay_BxHvxNcxT[..., -1])

  def step(state_BxHvxKxV, chunk):
    q_BxHvxTxK, k_BxHvxTxK, new_values_BxHvxTxV, k_cumdecay_BxHvxTxK, attn_BxHvxTxT, decay_BxHv = chunk
    v_new_BxHvxTxV = new_values_BxHvxTxV - _einsum("bhtk,bhkv->bhtv", k_cumdecay_BxHvxTxK, state_BxHvxKxV)
    out_BxHvxTxV = _einsum("bhtk,bhkv->bhtv", q_BxHvxTxK, state_BxHvxKxV) + _einsum(
      "bhts,bhsv->bhtv", attn_BxHvxTxT, v_new_BxHvxTxV
    )
    state_BxHvxKxV = state_BxHvxKxV * decay_BxHv[..., None, None] + _einsum(
      "bhtk,bhtv->bhkv", k_BxHvxTxK, v_new_BxHvxTxV
    )
    return state_BxHvxKxV, out_BxHvxTxV

  per_chunk = tuple(
    jnp.moveaxis(x, 2, 0)
    for x in (
      decayed_q_BxHvxNcxTxK,
      decayed_k_BxHvxNcxTxK,
      new_values_BxHvxNcxTxV,
      k_cumdecay_BxHvxNcxTxK,
      intra_chunk_attn_BxHvxNcxTxT,
      chunk_decay_BxHvxNc,
    )
  )
  state_BxHvxKxV = _initial_state(initial_state_BxHvxKxV, batch, heads, key_dim, value_dim)
  final_state_BxHvxKxV, out_NcxBxHvxTxV = jax.lax.scan(step, state_BxHvxKxV, per_chunk)
  out_BxLxHvxV = jnp.moveaxis(out_NcxBxHvxTxV, 2, 3).transpose(1, 0, 2, 3, 4).reshape(batch, -1, heads, value_dim)
  return out_BxLxHvxV[:, :length].astype(q_BxLxHkxK.dtype), final_state_BxHvxKxV


def recurrent_gated_delta_rule(
  q_BxLxHkxK,
  k_BxLxHkxK,
  v_BxLxHvxV,
  g_BxLxHv,
  beta_BxLxHv,
  *,
  initial_state_BxHvxKxV=None,
  use_qk_l2norm=True,
  valid_BxL=None,
):
  """The gated delta rule token by token (HF's torch_recurrent_gated_delta_rule): a `lax.scan` over L.

  The decode step (L = 1 with the cached state) and the reference for the chunked form. Same arguments
  and returns as `chunk_gated_delta_rule`, without `chunk_size`.
  """
  batch, _, _, key_dim = k_BxLxHkxK.shape
  heads, value_dim = v_BxLxHvxV.shape[-2:]
  per_token = tuple(
    jnp.moveaxis(x, 1, 0)
    for x in _prepare(q_BxLxHkxK, k_BxLxHkxK, v_BxLxHvxV, g_BxLxHv, beta_BxLxHv, use_qk_l2norm, valid_BxL)
  )

  def step(state_BxHvxKxV, token):
    q_BxHvxK, k_BxHvxK, v_BxHvxV, g_BxHv, beta_BxHv = token
    state_BxHvxKxV = state_BxHvxKxV * jnp.exp(g_BxHv)[..., None, None]
    kv_mem_BxHvxV = _einsum("bhkv,bhk->bhv", state_BxHvxKxV, k_BxHvxK)
    delta_BxHvxV = (v_BxHvxV - kv_mem_BxHvxV) * beta_BxHv[..., None]
    state_BxHvxKxV = state_BxHvxKxV + k_BxHvxK[..., :, None] * delta_BxHvxV[..., None, :]
    return state_BxHvxKxV, _einsum("bhkv,bhk->bhv", state_BxHvxKxV, q_BxHvxK)

  state_BxHvxKxV = _initial_state(initial_state_BxHvxKxV, batch, heads, key_dim, value_dim)
  final_state_BxHvxKxV, out_LxBxHvxV = jax.lax.scan(step, state_BxHvxKxV, per_token)
  return jnp.moveaxis(out_LxBxHvxV, 0, 1).astype(q_BxLxHkxK.dtype), final_state_BxHvxKxV


def causal_conv1d(x_BxLxC, weight_CxW, *, conv_state_BxCxW1=None, valid_BxL=None):
  """Depthwise causal conv over L then SiLU, no bias (HF's causal_conv1d_fn / causal_conv1d_update, activation silu).

  Token t's output is silu(sum_w weight[c, w] * window[w]), where the window is the W inputs ending at
  token t: the previous W-1 inputs, read from `conv_state_BxCxW1` (oldest first, zeros when None) where x
  has fewer, then token t. Returns (out_BxLxC in x's dtype, new_conv_state_BxCxW1 in x's dtype): the new
  state is the last W-1 inputs of (old state, x), the conv state HF's cache keeps (HF keeps W columns; its
  last W-1 are this state).

  `valid_BxL` (bool): invalid tokens are skipped as if removed from x. They never enter the state and are
  never in a window; a row with no valid token keeps its state unchanged; an invalid token's output is
  zeros. So the new state is the last W-1 entries of (old state, the valid tokens of x in order).
  """
  batch, length, channels = x_BxLxC.shape
  width = weight_CxW.shape[-1]
  if conv_state_BxCxW1 is None:
    conv_state_BxCxW1 = jnp.zeros((batch, channels, width - 1), x_BxLxC.dtype)
  # The old state followed by the inputs: S = W-1 + L positions.
  inputs_BxSxC = jnp.concatenate([jnp.swapaxes(conv_state_BxCxW1, 1, 2).astype(x_BxLxC.dtype), x_BxLxC], axis=1)
  if valid_BxL is None:
    sequence_BxSxC = inputs_BxSxC
    new_state_BxW1xC = inputs_BxSxC[:, length:]
  else:
    # Compact each row: the state, then its valid tokens in order, then zeros. Invalid tokens are sent past the
    # end (dropped); token t's window then ends at its rank among the valid tokens.
    valid_count_BxL = jnp.cumsum(valid_BxL, axis=1)
    token_destination_BxL = jnp.where(valid_BxL, width - 2 + valid_count_BxL, inputs_BxSxC.shape[1])
    state_destination_BxW1 = jnp.broadcast_to(jnp.arange(width - 1), (batch, width - 1))
    destination_BxS = jnp.concatenate([state_destination_BxW1, token_destination_BxL], axis=1)
    rows_Bx1 = jnp.arange(batch)[:, None]
    sequence_BxSxC = jnp.zeros_like(inputs_BxSxC).at[rows_Bx1, destination_BxS].set(inputs_BxSxC, mode="drop")
    # The last W-1 entries of the compacted sequence: positions valid_count .. valid_count + W-2.
    state_positions_BxW1 = valid_count_BxL[:, -1:] + jnp.arange(width - 1)
    new_state_BxW1xC = jnp.take_along_axis(sequence_BxSxC, state_positions_BxW1[:, :, None], axis=1)
  sequence_BxSxC32 = sequence_BxSxC.astype(jnp.float32)
  weight_CxW32 = weight_CxW.astype(jnp.float32)
  # conv_BxLxC[i]: the window ending at (compacted) token i, sequence position W-1+i.
  conv_BxLxC = sum(sequence_BxSxC32[:, w : w + length] * weight_CxW32[:, w] for w in range(width))
  out_BxLxC = jax.nn.silu(conv_BxLxC)
  if valid_BxL is not None:
    rank_BxL = jnp.maximum(valid_count_BxL - 1, 0)
    out_BxLxC = jnp.take_along_axis(out_BxLxC, rank_BxL[:, :, None], axis=1)
    out_BxLxC = jnp.where(valid_BxL[:, :, None], out_BxLxC, 0.0)
  return out_BxLxC.astype(x_BxLxC.dtype), jnp.swapaxes(new_state_BxW1xC, 1, 2)


def gated_rms_norm(x_xV, gate_xV, weight_V, eps):
  """Qwen3_5RMSNormGated: weight * rmsnorm(x) * silu(gate), normalised over the last axis.

  The weight multiplies plainly (initialised to ones), unlike the model's other RMSNorms, which scale by
  (1 + weight). As HF: the normalised x is cast back to x's dtype before the weight, the gate is applied in
  fp32, and the result is in x's dtype.
  """
  x_xV32 = x_xV.astype(jnp.float32)
  variance_x1 = jnp.mean(x_xV32 * x_xV32, axis=-1, keepdims=True)
  normed_xV = weight_V * (x_xV32 * jax.lax.rsqrt(variance_x1 + eps)).astype(x_xV.dtype)
  return (normed_xV * jax.nn.silu(gate_xV.astype(jnp.float32))).astype(x_xV.dtype)
