"""Llama-style decoder: RMSNorm, rotate-half RoPE, GQA attention, SwiGLU MLP, optional KV cache.

One backbone serves three heads: the language-model head (actor, reference), a scalar value head
(critic, named `score` as in HF token classification) and, later, a reward head. Every parameter
carries logical axis names (`embed`, `heads`, `kv_heads`, `head_dim`, `mlp`, `vocab`); the layouts in
`jaxrlhf.parallel.layouts` map them to mesh axes.

Attention works in two modes with one code path:
- no cache: causal self-attention over the given tokens, keys masked by `kv_mask_BxS` (padding);
- cache: the new keys/values are written at `cache_index` into a preallocated cache of length S and
  queries attend to every cached position <= their own index that `kv_mask_BxS` marks valid.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
_MASK_VALUE = -1e9  # finite, so a query with no valid key (a left pad) gives no NaN


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
  """Hyper-parameters with HF config.json names."""
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_hidden_layers: int
  num_attention_heads: int
  num_key_value_heads: int
  head_dim: int | None = None
  rope_theta: float = 10000.0
  rms_norm_eps: float = 1e-6
  tie_word_embeddings: bool = False
  max_position_embeddings: int = 2048
  dtype: str = "float32"
  param_dtype: str = "float32"

  @property
  def resolved_head_dim(self) -> int:
    return self.head_dim or self.hidden_size // self.num_attention_heads

  @classmethod
  def from_dict(cls, values: dict[str, Any]) -> "DecoderConfig":
    names = {f.name for f in dataclasses.fields(cls)}
    missing = [n for n in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                           "num_attention_heads", "num_key_value_heads") if values.get(n) is None]
    if missing:
      raise ValueError(f"model config is missing {missing} (set actor_rollout_ref.model.override_config.<key>)")
    config = cls(**{k: v for k, v in values.items() if k in names and v is not None})
    if config.num_attention_heads % config.num_key_value_heads:
      raise ValueError(f"num_attention_heads={config.num_attention_heads} is not a multiple of "
                       f"num_key_value_heads={config.num_key_value_heads}")
    return config


def _init(init_fn, names):
  return nn.with_logical_partitioning(init_fn, names)


class RMSNorm(nn.Module):
  eps: float
  dtype: Any
  param_dtype: Any

  @nn.compact
  def __call__(self, x):
    weight = self.param("weight", _init(nn.initializers.ones, ("embed",)), (x.shape[-1],), self.param_dtype)
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return (x32 * weight.astype(jnp.float32)).astype(self.dtype)


def rope_cos_sin(positions_BxL, head_dim: int, theta: float):
  """HF rotate-half RoPE tables, fp32: cos/sin of shape [B, L, head_dim]."""
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  freqs_BxLxH2 = positions_BxL.astype(jnp.float32)[..., None] * inv_freq
  emb_BxLxH = jnp.concatenate([freqs_BxLxH2, freqs_BxLxH2], axis=-1)
  return jnp.cos(emb_BxLxH), jnp.sin(emb_BxLxH)


def apply_rope(x_BxLxNxH, cos_BxLxH, sin_BxLxH):
  half = x_BxLxNxH.shape[-1] // 2
  x1, x2 = x_BxLxNxH[..., :half], x_BxLxNxH[..., half:]
  rotated = jnp.concatenate([-x2, x1], axis=-1)
  x32 = x_BxLxNxH.astype(jnp.float32)
  out = x32 * cos_BxLxH[:, :, None, :] + rotated.astype(jnp.float32) * sin_BxLxH[:, :, None, :]
  return out.astype(x_BxLxNxH.dtype)


class Attention(nn.Module):
  config: DecoderConfig

  @nn.compact
  def __call__(self, x_BxLxD, cos_BxLxH, sin_BxLxH, kv_mask_BxS, cache=None, cache_index=None):
    cfg = self.config
    dtype, param_dtype = _DTYPES[cfg.dtype], _DTYPES[cfg.param_dtype]
    num_heads, num_kv, head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.resolved_head_dim
    dense = lambda features, names, name: nn.DenseGeneral(
        features, use_bias=False, dtype=dtype, param_dtype=param_dtype, name=name,
        kernel_init=_init(nn.initializers.normal(0.02), names))
    q_BxLxNxH = dense((num_heads, head_dim), ("embed", "heads", "head_dim"), "q_proj")(x_BxLxD)
    k_BxLxKxH = dense((num_kv, head_dim), ("embed", "kv_heads", "head_dim"), "k_proj")(x_BxLxD)
    v_BxLxKxH = dense((num_kv, head_dim), ("embed", "kv_heads", "head_dim"), "v_proj")(x_BxLxD)
    q_BxLxNxH = apply_rope(q_BxLxNxH, cos_BxLxH, sin_BxLxH)
    k_BxLxKxH = apply_rope(k_BxLxKxH, cos_BxLxH, sin_BxLxH)

    batch, length = x_BxLxD.shape[:2]
    if cache is None:
      keys_BxSxKxH, values_BxSxKxH = k_BxLxKxH, v_BxLxKxH
      query_index_L = jnp.arange(length)
      new_cache = None
    else:
      zero = jnp.zeros((), jnp.int32)
      start = (zero, cache_index.astype(jnp.int32), zero, zero)
      keys_BxSxKxH = jax.lax.dynamic_update_slice(cache["k"], k_BxLxKxH.astype(cache["k"].dtype), start)
      values_BxSxKxH = jax.lax.dynamic_update_slice(cache["v"], v_BxLxKxH.astype(cache["v"].dtype), start)
      query_index_L = cache_index + jnp.arange(length)
      new_cache = {"k": keys_BxSxKxH, "v": values_BxSxKxH}
    key_index_S = jnp.arange(keys_BxSxKxH.shape[1])

    group = num_heads // num_kv
    q_BxLxKxGxH = q_BxLxNxH.reshape(batch, length, num_kv, group, head_dim)
    scores_BxKxGxLxS = jnp.einsum("blkgh,bskh->bkgls", q_BxLxKxGxH, keys_BxSxKxH.astype(dtype),
                                  preferred_element_type=jnp.float32) / jnp.sqrt(head_dim).astype(jnp.float32)
    allowed_BxLxS = (key_index_S[None, None, :] <= query_index_L[None, :, None]) & (kv_mask_BxS[:, None, :] > 0)
    scores_BxKxGxLxS = jnp.where(allowed_BxLxS[:, None, None], scores_BxKxGxLxS, _MASK_VALUE)
    probs_BxKxGxLxS = jax.nn.softmax(scores_BxKxGxLxS, axis=-1).astype(dtype)
    out_BxLxKxGxH = jnp.einsum("bkgls,bskh->blkgh", probs_BxKxGxLxS, values_BxSxKxH.astype(dtype))
    out_BxLxNxH = out_BxLxKxGxH.reshape(batch, length, num_heads, head_dim)
    out_BxLxD = nn.DenseGeneral(
        cfg.hidden_size, axis=(-2, -1), use_bias=False, dtype=dtype, param_dtype=param_dtype, name="o_proj",
        kernel_init=_init(nn.initializers.normal(0.02), ("heads", "head_dim", "embed")))(out_BxLxNxH)
    return out_BxLxD, new_cache


class MLP(nn.Module):
  config: DecoderConfig

  @nn.compact
  def __call__(self, x_BxLxD):
    cfg = self.config
    dtype, param_dtype = _DTYPES[cfg.dtype], _DTYPES[cfg.param_dtype]
    dense = lambda features, names, name: nn.Dense(
        features, use_bias=False, dtype=dtype, param_dtype=param_dtype, name=name,
        kernel_init=_init(nn.initializers.normal(0.02), names))
    gate_BxLxF = dense(cfg.intermediate_size, ("embed", "mlp"), "gate_proj")(x_BxLxD)
    up_BxLxF = dense(cfg.intermediate_size, ("embed", "mlp"), "up_proj")(x_BxLxD)
    return dense(cfg.hidden_size, ("mlp", "embed"), "down_proj")(nn.silu(gate_BxLxF) * up_BxLxF)


class DecoderLayer(nn.Module):
  config: DecoderConfig

  @nn.compact
  def __call__(self, x_BxLxD, cos_BxLxH, sin_BxLxH, kv_mask_BxS, cache=None, cache_index=None):
    cfg = self.config
    norm = lambda name: RMSNorm(cfg.rms_norm_eps, _DTYPES[cfg.dtype], _DTYPES[cfg.param_dtype], name=name)
    attn_BxLxD, new_cache = Attention(cfg, name="self_attn")(
        norm("input_layernorm")(x_BxLxD), cos_BxLxH, sin_BxLxH, kv_mask_BxS, cache, cache_index)
    x_BxLxD = x_BxLxD + attn_BxLxD
    x_BxLxD = x_BxLxD + MLP(cfg, name="mlp")(norm("post_attention_layernorm")(x_BxLxD))
    return x_BxLxD, new_cache


class Decoder(nn.Module):
  """Backbone plus one head.

  head="lm": returns (logits_BxLxV fp32, cache); head="value": returns (values_BxL fp32, cache).
  `positions_BxL` are token positions (left padding makes them differ per row); `kv_mask_BxS` marks
  valid keys: the attention mask without cache, the whole cache's validity with one.
  """
  config: DecoderConfig
  head: str = "lm"

  @nn.compact
  def __call__(self, input_ids_BxL, positions_BxL, kv_mask_BxS, cache=None, cache_index=None):
    cfg = self.config
    dtype, param_dtype = _DTYPES[cfg.dtype], _DTYPES[cfg.param_dtype]
    embed = nn.Embed(cfg.vocab_size, cfg.hidden_size, dtype=dtype, param_dtype=param_dtype,
                     embedding_init=_init(nn.initializers.normal(0.02), ("vocab", "embed")),
                     name="embed_tokens")
    x_BxLxD = embed(input_ids_BxL)
    cos_BxLxH, sin_BxLxH = rope_cos_sin(positions_BxL, cfg.resolved_head_dim, cfg.rope_theta)
    new_cache = [] if cache is not None else None
    for i in range(cfg.num_hidden_layers):
      x_BxLxD, layer_cache = DecoderLayer(cfg, name=f"layers_{i}")(
          x_BxLxD, cos_BxLxH, sin_BxLxH, kv_mask_BxS,
          None if cache is None else cache[i], cache_index)
      if cache is not None:
        new_cache.append(layer_cache)
    x_BxLxD = RMSNorm(cfg.rms_norm_eps, dtype, param_dtype, name="norm")(x_BxLxD)

    if self.head == "value":
      values_BxLx1 = nn.Dense(1, use_bias=False, dtype=jnp.float32, param_dtype=param_dtype, name="score",
                              kernel_init=_init(nn.initializers.normal(0.02), ("embed", None)))(
                                  x_BxLxD.astype(jnp.float32))
      return values_BxLx1[..., 0], new_cache
    if cfg.tie_word_embeddings:
      logits_BxLxV = embed.attend(x_BxLxD)
    else:
      logits_BxLxV = nn.Dense(cfg.vocab_size, use_bias=False, dtype=dtype, param_dtype=param_dtype,
                              name="lm_head",
                              kernel_init=_init(nn.initializers.normal(0.02), ("embed", "vocab")))(x_BxLxD)
    return logits_BxLxV.astype(jnp.float32), new_cache


def init_cache(config: DecoderConfig, batch: int, max_length: int):
  """Zeroed KV cache: one {'k','v'} [B, S, kv_heads, head_dim] pair per layer."""
  shape = (batch, max_length, config.num_key_value_heads, config.resolved_head_dim)
  dtype = _DTYPES[config.dtype]
  return [{"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)} for _ in range(config.num_hidden_layers)]


CACHE_LOGICAL_AXES = ("batch", "length", "kv_heads", "head_dim")


def positions_from_mask(mask_BxL):
  """Positions of left-padded rows: 0 at the first real token (pads get 0 too)."""
  return jnp.maximum(jnp.cumsum(mask_BxL.astype(jnp.int32), axis=-1) - 1, 0)


def init_params(model: Decoder, rng, seq_len: int = 8):
  """Returns (params, logical_axes): raw arrays and a same-shaped tree of logical-axis tuples."""
  ids = jnp.zeros((1, seq_len), jnp.int32)
  boxed = model.init(rng, ids, positions_from_mask(jnp.ones_like(ids)), jnp.ones_like(ids))["params"]
  logical_axes = jax.tree.map(lambda b: tuple(b.names), boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))
  return nn.unbox(boxed), logical_axes


def abstract_params(model: Decoder, seq_len: int = 8):
  """Shapes and logical axes without allocating: for building shardings before init."""
  boxed = jax.eval_shape(
      lambda: model.init(jax.random.key(0), jnp.zeros((1, seq_len), jnp.int32),
                         jnp.zeros((1, seq_len), jnp.int32), jnp.ones((1, seq_len), jnp.int32))["params"])
  logical_axes = jax.tree.map(lambda b: tuple(b.names), boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))
  shapes = nn.unbox(boxed)
  return shapes, logical_axes
