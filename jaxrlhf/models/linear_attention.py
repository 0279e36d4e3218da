"""Qwen3.5's linear-attention layer kind: Gated DeltaNet (`transformers.models.qwen3_5`, `Qwen3_5GatedDeltaNet`).

in_proj_qkv -> causal depthwise conv (SiLU) -> per-head L2-normalised q, k and v; in_proj_b -> beta = sigmoid;
in_proj_a with A_log and dt_bias -> the decay g = -exp(A_log) softplus(a + dt_bias); the gated delta rule
(`gated_deltanet.py`: the chunked form over several tokens, the recurrent one for one token with a state); a gated
RMSNorm with in_proj_z; out_proj.

Its state between tokens (`decoder.init_cache`, leaves "conv" and "recurrent", one slice per linear layer): the
conv's last kernel - 1 inputs and the [value heads, key dim, value dim] recurrent state, with no length axis. A
token whose column `kv_mask_BxS` does not mark (left padding, a finished or paused row) changes neither and adds
nothing, as HF's zeroed padding states do at the start of a row (docs/architecture.md, "Adding a layer kind").
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxrlhf.models.gated_deltanet import (
  causal_conv1d,
  chunk_gated_delta_rule,
  gated_rms_norm,
  recurrent_gated_delta_rule,
)
from jaxrlhf.models.layers import DTYPES, INIT_STD, dense, logical_init


def token_validity(kv_mask_BxS, cache_index, length: int):
  """[B, L] bool: whether each of a call's L tokens is written (its column marked in `kv_mask_BxS`). Without a
  cache the mask is the call's own ([B, L]); with one, the columns from `cache_index` (a scalar, or one per row
  with L = 1); a column past the mask's end is not written."""
  if cache_index is None:
    return kv_mask_BxS[:, :length] > 0
  width = kv_mask_BxS.shape[1]
  columns = jnp.asarray(cache_index, jnp.int32)
  columns_BxL = (columns[:, None] if columns.ndim else columns) + jnp.arange(length)[None, :]
  columns_BxL = jnp.broadcast_to(columns_BxL, (kv_mask_BxS.shape[0], length))
  marked_BxL = jnp.take_along_axis(kv_mask_BxS, jnp.minimum(columns_BxL, width - 1), axis=1) > 0
  return marked_BxL & (columns_BxL < width)


class GatedDeltaNet(nn.Module):
  """One linear-attention layer. `cache`: the model's whole cache (this layer reads and returns its slice `layer`
  of "conv" and "recurrent"). Returns (out_BxLxD, {"conv", "recurrent"} of this layer, or None without a cache)."""

  config: object  # DecoderConfig

  @nn.compact
  def __call__(self, x_BxLxD, kv_mask_BxS, cache=None, cache_index=None, layer=0):
    cfg = self.config
    dtype, param_dtype = DTYPES[cfg.dtype], DTYPES[cfg.param_dtype]
    key_heads, value_heads = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    key_dim, value_dim = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    channels = 2 * key_heads * key_dim + value_heads * value_dim
    batch, length, _ = x_BxLxD.shape
    valid_BxL = token_validity(kv_mask_BxS, cache_index, length)
    x_BxLxD = jnp.where(valid_BxL[:, :, None], x_BxLxD, 0).astype(x_BxLxD.dtype)

    project = lambda features, names, name: dense(cfg, name, features, ("embed",), names, False)(x_BxLxD)
    qkv_BxLxC = project((channels,), ("conv_channels",), "in_proj_qkv")
    z_BxLxHvxV = project((value_heads, value_dim), ("linear_heads", "linear_value_dim"), "in_proj_z")
    b_BxLxHv = project((value_heads,), ("linear_heads",), "in_proj_b")
    a_BxLxHv = project((value_heads,), ("linear_heads",), "in_proj_a")
    conv_init = nn.initializers.normal(INIT_STD * 10)
    conv_weight_CxW = Weight(
      (channels, cfg.linear_conv_kernel_dim), ("conv_channels", "conv_window"), conv_init, param_dtype, name="conv1d"
    )()
    heads_param = lambda name, init: self.param(
      name, logical_init(init, ("linear_heads",)), (value_heads,), param_dtype
    )
    dt_bias_Hv, A_log_Hv = heads_param("dt_bias", nn.initializers.ones), heads_param("A_log", _a_log_init)

    state = None if cache is None else {name: cache[name][layer] for name in ("conv", "recurrent")}
    # Several tokens (a training forward, a prefill) are padded only before or after their valid ones, whose zeroed
    # inputs then equal a conv over the valid tokens alone: the plain conv, without compacting each row. One token
    # (a decode step) may be a paused or finished row's: the mask keeps its conv state.
    conv_BxLxC, conv_state = causal_conv1d(
      qkv_BxLxC,
      conv_weight_CxW.astype(dtype),
      conv_state_BxCxW1=None if state is None else state["conv"],
      valid_BxL=valid_BxL if length == 1 else None,
    )
    q_BxLxC, k_BxLxC, v_BxLxC = jnp.split(conv_BxLxC, [key_heads * key_dim, 2 * key_heads * key_dim], axis=-1)
    q_BxLxHkxK = q_BxLxC.reshape(batch, length, key_heads, key_dim)
    k_BxLxHkxK = k_BxLxC.reshape(batch, length, key_heads, key_dim)
    v_BxLxHvxV = v_BxLxC.reshape(batch, length, value_heads, value_dim)
    beta_BxLxHv = jax.nn.sigmoid(b_BxLxHv.astype(jnp.float32))
    g_BxLxHv = -jnp.exp(A_log_Hv.astype(jnp.float32)) * jax.nn.softplus(
      a_BxLxHv.astype(jnp.float32) + dt_bias_Hv.astype(jnp.float32)
    )
    rule_inputs = (q_BxLxHkxK, k_BxLxHkxK, v_BxLxHvxV, g_BxLxHv, beta_BxLxHv)
    initial = None if state is None else state["recurrent"]
    if state is not None and length == 1:  # a decode step
      out_BxLxHvxV, recurrent = recurrent_gated_delta_rule(
        *rule_inputs, initial_state_BxHvxKxV=initial, use_qk_l2norm=True, valid_BxL=valid_BxL
      )
    else:
      out_BxLxHvxV, recurrent = chunk_gated_delta_rule(
        *rule_inputs,
        chunk_size=min(cfg.linear_chunk_size, length),  # a shorter call pads no further than its own length
        initial_state_BxHvxKxV=initial,
        use_qk_l2norm=True,
        valid_BxL=valid_BxL,
      )
    # The gated norm's weight multiplies plainly (ones), unlike the model's (1 + w) norms.
    norm_weight_V = Weight((value_dim,), ("linear_value_dim",), nn.initializers.ones, param_dtype, name="norm")()
    core_BxLxHvxV = gated_rms_norm(
      out_BxLxHvxV.astype(dtype), z_BxLxHvxV, norm_weight_V.astype(dtype), cfg.rms_norm_eps
    )
    out_BxLxD = dense(cfg, "out_proj", (cfg.hidden_size,), ("linear_heads", "linear_value_dim"), ("embed",), False)(
      core_BxLxHvxV
    )
    new_state = None if cache is None else {"conv": conv_state, "recurrent": recurrent.astype(jnp.float32)}
    return out_BxLxD, new_state


def _a_log_init(key, shape, dtype):
  """log(A) with A ~ U(1, 16): HF draws A from U(0.01, 16) (a decay rate per value head)."""
  return jnp.log(jax.random.uniform(key, shape, jnp.float32, 1.0, 16.0)).astype(dtype)


class Weight(nn.Module):
  """A module holding one parameter "weight": HF's `conv1d.weight` (here [channels, kernel], without HF's middle
  axis of 1) and the gated norm's `norm.weight`."""

  shape: tuple
  names: tuple
  initializer: object
  param_dtype: object

  @nn.compact
  def __call__(self):
    return self.param("weight", logical_init(self.initializer, self.names), self.shape, self.param_dtype)
