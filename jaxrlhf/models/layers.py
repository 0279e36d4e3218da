"""Building blocks every layer kind shares: dtypes, initialisers with logical axes, the projection (with its LoRA
adapter when the config targets it) and RMSNorm. The decoder (`decoder.py`) and the layer kinds of other families
(`linear_attention.py`) build from these, so neither imports the other's modules."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxrlhf.models.lora import Linear

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
INIT_STD = 0.02  # std of every fresh kernel and embedding (HF's `initializer_range` default)


def logical_init(init_fn, names):
  return nn.with_logical_partitioning(init_fn, names)


def dense(cfg, name: str, features, in_names, out_names, use_bias: bool) -> Linear:
  """A projection of a decoder layer (`cfg`: the model's `DecoderConfig`); an adapter on it when LoRA targets
  `name`."""
  return Linear(
    tuple(features),
    tuple(in_names),
    tuple(out_names),
    use_bias,
    DTYPES[cfg.dtype],
    DTYPES[cfg.param_dtype],
    nn.initializers.normal(INIT_STD),
    lora_rank=cfg.lora_rank if name in cfg.lora_targets else 0,
    lora_alpha=cfg.lora_alpha,
    name=name,
  )


class RMSNorm(nn.Module):
  """x / rms(x) * w in fp32, cast to `dtype`. `offset`: scale by (1 + w), w zero-initialised (Qwen3.5's
  zero-centred norm), instead of w initialised to ones."""

  eps: float
  dtype: Any
  param_dtype: Any
  axis_name: str = "embed"
  offset: bool = False

  @nn.compact
  def __call__(self, x):
    init = nn.initializers.zeros_init() if self.offset else nn.initializers.ones
    weight = self.param("weight", logical_init(init, (self.axis_name,)), (x.shape[-1],), self.param_dtype)
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    scale = weight.astype(jnp.float32) + (1.0 if self.offset else 0.0)
    return (x32 * scale).astype(self.dtype)
