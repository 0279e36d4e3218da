"""The gpt-oss family (`transformers.models.gpt_oss`): what differs from the dense decoder and Qwen3-MoE, in one place.

- config: `gpt_oss` (`GptOssForCausalLM`) -> `DecoderConfig` fields: `layer_types` alternating `sliding_attention`
  (window 128 in the releases) and `full_attention`, q/k/v/o biases (`attention_bias`), learned attention sinks
  (`attention_sinks`: a logit per query head in every softmax's denominator, `models/attention.py`), YaRN RoPE
  (`decoder.rope_inv_freq`), and experts in every layer (`num_local_experts`, `num_experts_per_tok`, the experts'
  `intermediate_size`); and back, for export. MXFP4-quantised checkpoints (a `quantization_config`) are refused:
  they are read dequantised (bf16) only.
- the experts block (`GptOssMLP`, HF's `GptOssMLP`): a router with a bias whose top-k logits are softmaxed among
  themselves (HF's order: top-k, then softmax, so the weights sum to 1), experts with biases and HF's fused
  `gate_up_proj` [E, D, 2F] whose even columns are the gate and odd ones the up projection, `down_proj` [E, F, D],
  and the clamped SwiGLU (up + 1) * g * sigmoid(alpha g), g = min(gate, limit), up clipped to [-limit, limit].
  The dropless grouped matmul, the load-balancing statistics and rollout routing replay are `moe.py`'s.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxrlhf.models import moe
from jaxrlhf.models.layers import DTYPES, INIT_STD, logical_init

MODEL_TYPE = "gpt_oss"
# GptOssConfig's defaults (gpt-oss-20b's, RoPE aside) where a config.json leaves a key out.
DEFAULTS = dict(
  num_hidden_layers=36,
  num_local_experts=128,
  vocab_size=201_088,
  hidden_size=2880,
  intermediate_size=2880,
  head_dim=64,
  num_attention_heads=64,
  num_key_value_heads=8,
  sliding_window=128,
  max_position_embeddings=131_072,
  rms_norm_eps=1e-5,
  num_experts_per_tok=4,
  swiglu_alpha=1.702,
  swiglu_limit=7.0,
  attention_bias=True,
  tie_word_embeddings=False,
  router_aux_loss_coef=0.001,
)
DEFAULT_ROPE = {
  "rope_type": "yarn",
  "rope_theta": 150_000.0,
  "factor": 32.0,
  "beta_fast": 32.0,
  "beta_slow": 1.0,
  "truncate": False,
  "original_max_position_embeddings": 4096,
}
# The experts' parameters by HF's names (no `.weight`: HF keeps them as bare tensors), with their logical axes.
EXPERT_AXES = {
  "gate_up_proj": ("experts", "expert_embed", "expert_mlp"),
  "gate_up_proj_bias": ("experts", "expert_mlp"),
  "down_proj": ("experts", "expert_mlp", "expert_embed"),
  "down_proj_bias": ("experts", "expert_embed"),
}


class UnsupportedGptOss(ValueError):
  """A gpt-oss config this family cannot represent (hf_io turns it into a CheckpointError naming the file)."""


def text_config(hf: dict[str, Any]) -> dict[str, Any]:
  """A `gpt_oss` config.json dict with GptOssConfig's defaults filled in (anything else as is). Raises
  UnsupportedGptOss for an MXFP4-quantised checkpoint."""
  if hf.get("model_type") != MODEL_TYPE:
    return hf
  if hf.get("quantization_config"):
    method = (hf["quantization_config"] or {}).get("quant_method", "?")
    raise UnsupportedGptOss(
      f"quantization_config (quant_method={method!r}): MXFP4-quantised gpt-oss weights cannot be trained; use a "
      "dequantised bf16 checkpoint (transformers: GptOssForCausalLM.from_pretrained(path, quantization_config="
      "Mxfp4Config(dequantize=True)).save_pretrained(out))"
    )
  hf = dict(hf)
  for key, value in DEFAULTS.items():
    if hf.get(key) is None:
      hf[key] = value
  rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or DEFAULT_ROPE)
  rope.setdefault("rope_theta", hf.get("rope_theta", DEFAULT_ROPE["rope_theta"]))
  hf["rope_parameters"] = rope
  hf.pop("rope_scaling", None)
  return hf


def layer_types(hf: dict[str, Any]) -> tuple[str, ...]:
  if hf.get("layer_types"):
    return tuple(hf["layer_types"])
  return tuple("sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(int(hf["num_hidden_layers"])))


def config_fields(hf: dict[str, Any]) -> dict[str, Any]:
  """gpt-oss's `DecoderConfig` fields from a `text_config(hf)` dict, RoPE aside (hf_io reads `rope_parameters`)."""
  if hf.get("hidden_act", "silu") != "silu":
    raise UnsupportedGptOss(f"hidden_act={hf['hidden_act']!r} is not supported (the experts' clamped SwiGLU only)")
  bias = bool(hf["attention_bias"])
  return dict(
    layer_types=layer_types(hf),
    sliding_window=int(hf["sliding_window"]),
    attention_sinks=True,
    qkv_bias=bias,
    o_bias=bias,
    num_experts=int(hf["num_local_experts"]),
    num_experts_per_tok=int(hf["num_experts_per_tok"]),
    moe_intermediate_size=int(hf["intermediate_size"]),
    swiglu_alpha=float(hf["swiglu_alpha"]),
    swiglu_limit=float(hf["swiglu_limit"]),
    router_aux_loss_coef=float(hf["router_aux_loss_coef"]) if hf.get("output_router_logits") else 0.0,
  )


def hf_config_fields(config) -> dict[str, Any]:
  """What a `gpt_oss` config.json holds beyond the dense decoder's keys (RoPE: hf_io's `rope_parameters`)."""
  return dict(
    layer_types=list(config.layer_types),
    sliding_window=config.sliding_window,
    attention_bias=config.qkv_bias,
    num_local_experts=config.num_experts,
    num_experts_per_tok=config.num_experts_per_tok,
    intermediate_size=config.moe_intermediate_size,
    swiglu_alpha=config.swiglu_alpha,
    swiglu_limit=config.swiglu_limit,
    output_router_logits=config.router_aux_loss_coef > 0,
    router_aux_loss_coef=config.router_aux_loss_coef or 0.001,
  )


def config_problems(config) -> list[str]:
  """Why `config` cannot be written as a gpt_oss checkpoint (empty when it can)."""
  problems = []
  if not (config.attention_sinks and config.num_experts and config.layer_types):
    problems.append("gpt_oss has attention sinks, experts in every layer and layer_types, always")
  if set(config.layer_types) - {"sliding_attention", "full_attention"}:
    problems.append("gpt_oss has sliding_attention and full_attention layers only")
  if (
    config.qkv_bias != config.o_bias
    or config.qk_norm
    or config.sandwich_norms
    or config.shared_expert_intermediate_size
  ):
    problems.append("gpt_oss has one attention_bias for q/k/v and o, no q/k norm, two norms a layer, no shared expert")
  return problems


def route(logits_TxE, top_k: int, replay_Txk=None):
  """(weights [T, k] fp32, experts [T, k] int32, probabilities [T, E] fp32) of router logits, HF's order: the top-k
  logits, softmaxed among themselves. `replay_Txk`: recorded experts (`moe.route`'s convention), whose logits are
  softmaxed instead. The probabilities (softmax over every expert) are the load-balancing loss's, as HF's."""
  logits_TxE = logits_TxE.astype(jnp.float32)
  top_Txk, experts_Txk = jax.lax.top_k(logits_TxE, top_k)
  if replay_Txk is not None:
    replay_Txk = replay_Txk.astype(jnp.int32)
    recorded_Tx1 = jnp.all(replay_Txk < logits_TxE.shape[-1], axis=-1, keepdims=True)
    experts_Txk = jnp.where(recorded_Tx1, replay_Txk, experts_Txk)
    top_Txk = jnp.take_along_axis(logits_TxE, experts_Txk, axis=-1)
  return jax.nn.softmax(top_Txk, axis=-1), experts_Txk.astype(jnp.int32), jax.nn.softmax(logits_TxE, axis=-1)


def clamped_swiglu(gate_up_Px2F, alpha: float, limit: float):
  """HF's `GptOssExperts._apply_gate`: even columns the gate, odd ones the up projection."""
  gate_PxF, up_PxF = gate_up_Px2F[:, ::2], gate_up_Px2F[:, 1::2]
  gate_PxF = jnp.minimum(gate_PxF, limit)
  up_PxF = jnp.clip(up_PxF, -limit, limit)
  return (up_PxF + 1) * (gate_PxF * jax.nn.sigmoid(gate_PxF * alpha))


def clamped_swiglu_experts(x_TxD, experts_Txk, weights_Txk, kernels, *, alpha: float, limit: float):
  """The dropless experts of gpt-oss without their output bias (`GptOssMLP` adds it): `moe.grouped_experts` around
  (x gate_up + b) -> clamped SwiGLU -> down, `kernels` {gate_up_proj [E, D, 2F], gate_up_proj_bias [E, 2F], down_proj
  [E, F, D]} in the compute dtype; [T, D] fp32."""

  def expert_fn(x_PxD, group_sizes_E, expert_P):
    grouped = lambda lhs, rhs: moe.grouped_matmul(lhs, rhs, group_sizes_E)
    gate_up_Px2F = grouped(x_PxD, kernels["gate_up_proj"]) + jnp.take(kernels["gate_up_proj_bias"], expert_P, axis=0)
    return grouped(clamped_swiglu(gate_up_Px2F, alpha, limit), kernels["down_proj"])

  dtype, num_experts = kernels["down_proj"].dtype, kernels["down_proj"].shape[0]
  return moe.grouped_experts(x_TxD, experts_Txk, weights_Txk, expert_fn, dtype, num_experts)


class GptOssMLP(nn.Module):
  """x [B, L, D] -> (the experts' output [B, L, D], the experts each token was routed to [B, L, k] int32), as
  `moe.SparseMoeBlock` (its `valid_BxL` and `replay_BxLxk` alike). Parameters by HF's names: `router/{kernel,bias}`
  and `experts/{gate_up_proj,gate_up_proj_bias,down_proj,down_proj_bias}`."""

  config: Any  # the model's DecoderConfig
  layout: Any = None  # a cache-free call's ActivationLayout: the experts then run on each device's own tokens

  @nn.compact
  def __call__(self, x_BxLxD, valid_BxL=None, replay_BxLxk=None):
    cfg = self.config
    dtype = DTYPES[cfg.dtype]
    batch, length, hidden = x_BxLxD.shape
    x_TxD = x_BxLxD.reshape(-1, hidden)
    router_DxE, router_bias_E = Router(cfg, name="router")()
    logits_TxE = x_TxD.astype(jnp.float32) @ router_DxE.astype(jnp.float32) + router_bias_E.astype(jnp.float32)
    top_k = cfg.num_experts_per_tok
    replay_Txk = None if replay_BxLxk is None else replay_BxLxk.reshape(-1, top_k)
    weights_Txk, experts_Txk, probs_TxE = route(logits_TxE, top_k, replay_Txk)
    if valid_BxL is not None:
      native_Txk = None if replay_Txk is None else jax.lax.top_k(logits_TxE, top_k)[1]
      stats = moe.load_balance_stats(experts_Txk, probs_TxE, valid_BxL.reshape(-1), native_Txk)
      self.sow("intermediates", moe.STATS, stats)
    weights = {name: w.astype(dtype) for name, w in Experts(cfg, name="experts")().items()}
    out_bias_ExD = weights.pop("down_proj_bias")
    local = functools.partial(clamped_swiglu_experts, alpha=cfg.swiglu_alpha, limit=cfg.swiglu_limit)
    out_TxD = moe.run_experts(self.layout, local, x_TxD.astype(dtype), experts_Txk, weights_Txk, weights, EXPERT_AXES)
    # The output bias once per pair, outside the per-device experts (whose tensor parts are summed): sum_j w_j b_{e_j}.
    for j in range(top_k):
      out_TxD = out_TxD + (jnp.take(out_bias_ExD, experts_Txk[:, j], axis=0) * weights_Txk[:, j, None].astype(dtype))
    return out_TxD.astype(dtype).reshape(batch, length, hidden), experts_Txk.reshape(batch, length, -1)


class Router(nn.Module):
  """The router's `kernel` [D, E] and `bias` [E] (HF's `router.weight` [E, D], transposed, and `router.bias`)."""

  config: Any

  @nn.compact
  def __call__(self):
    cfg, param_dtype = self.config, DTYPES[self.config.param_dtype]
    kernel = self.param(
      "kernel",
      logical_init(nn.initializers.normal(INIT_STD), ("embed", None)),
      (cfg.hidden_size, cfg.num_experts),
      param_dtype,
    )
    bias = self.param("bias", logical_init(nn.initializers.zeros_init(), ("experts",)), (cfg.num_experts,), param_dtype)
    return kernel, bias


class Experts(nn.Module):
  """Every expert's fused weights and biases in HF's layout, {name: [E, ...]} (`EXPERT_AXES`)."""

  config: Any

  @nn.compact
  def __call__(self):
    cfg, param_dtype = self.config, DTYPES[self.config.param_dtype]
    sizes = {"experts": cfg.num_experts, "expert_embed": cfg.hidden_size}
    shapes = {
      name: tuple(
        2 * cfg.moe_intermediate_size
        if (a == "expert_mlp" and "gate_up" in name)
        else sizes.get(a, cfg.moe_intermediate_size)
        for a in axes
      )
      for name, axes in EXPERT_AXES.items()
    }
    init = lambda name: nn.initializers.zeros_init() if name.endswith("_bias") else nn.initializers.normal(INIT_STD)
    return {
      name: self.param(name, logical_init(init(name), axes), shapes[name], param_dtype)
      for name, axes in EXPERT_AXES.items()
    }
