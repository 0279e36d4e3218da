"""Decoder family (Llama, Qwen2/2.5, Qwen3, Mistral; Qwen3.5's hybrid stack with `layer_types`; Gemma 3's
interleaved sliding and full attention; gpt-oss): RMSNorm, rotate-half RoPE, GQA attention, SwiGLU (or gelu-tanh) MLP.
Qwen3.5's linear-attention layers are `linear_attention.py`'s; what Gemma 3 sets is listed in `models/gemma3.py`,
gpt-oss's (attention sinks, YaRN, its experts) in `models/gpt_oss.py`.

One module family with config switches instead of one copy per model: biases on q/k/v (Qwen2,
Llama `attention_bias`), on o_proj and the MLP (Llama `attention_bias` / `mlp_bias`), per-head q/k
RMSNorm (Qwen3), an explicit `head_dim`, a sliding attention window (Mistral), Llama-3 / linear RoPE
scaling, tied or untied embeddings.

One backbone serves three heads: the language-model head (actor, reference), a scalar value head
(critic; `score` with a bias, HF `*ForTokenClassification` with num_labels=1, verl's critic format)
and a scalar reward head (`score` without bias, HF `*ForSequenceClassification`). Every parameter
carries logical axis names (`embed`, `heads`, `kv_heads`, `head_dim`, `mlp`, `vocab`); the layouts in
`jaxrlhf.parallel.layouts` map them to mesh axes.

Attention works in two modes with one code path:
- no cache: causal self-attention over the given tokens, keys masked by `kv_mask_BxS` (padding);
- cache: the new keys/values are written at `cache_index` into a preallocated cache and queries attend
  to every cached position <= their own index that `kv_mask_BxS` marks valid; the cache may be longer
  than `kv_mask_BxS` (S), and then only its first S columns are read. A decode step (one token per row) may
  give `cache_index` per row ([B]): each row writes and attends at its own column (the rollout's slots).
Packed rows (`use_remove_padding`, no cache) add `segment_ids_BxL`: several sequences share a row and
attention is block-diagonal causal, a token sees only earlier tokens of its own segment; segment 0 is
padding and sees nothing. Positions then restart in each segment (the caller passes them).
The sliding window, like HF's, counts sequence (cache) indices, not token positions.

Layers. With `scan_layers` (the default) the layers are one `nn.scan` over stacked weights: every
layer parameter has a leading layer axis (logical name `layers`, no mesh axis) under `layers/...`, and
XLA compiles one layer body whatever the depth. Without it they are a Python loop of modules
`layers_0 .. layers_{n-1}` (the layout of checkpoints written before the scan; `stack_layers` /
`unstack_layers` convert between the two). Either way the KV cache is one array per k/v with a
leading layer axis, [layers, B, K, S, H] (`init_cache`); Gemma 3's sliding layers keep a ring of their window's
columns instead ("sliding_k"/"sliding_v", `ring_cache.py`). The layers only read it (each its own slice,
with this call's keys/values written into that copy) and return their new columns; the Decoder writes
all layers' columns into the cache once, after the last layer.
Attention kernels (`attention_impl`: xla, blockwise, cudnn, splash, auto) are in `models/attention.py`.

Shape letters. Array names end in their shape (`logits_BxLxV`); each letter means one thing across
the package:
  B  rows of one model call or decode batch (padded sequences, packed rows, serving slots)
  L  tokens per row in one call (the queries)
  S  a whole sequence: prompt + response (the keys a query may see; in decode, the cache length)
  P  prompt length (left-padded)                R  response length
  N  sequences of a rollout (prompts x n): the trainer's and the algorithms' batch
  M  micro-batch slots of a packing plan        E  EOS token ids
  V  vocabulary   D  hidden (embed)   F  MLP (intermediate)
  Q  query heads = K key/value heads x G query heads per key/value head   H  head dim (H2 = H / 2)
  r  LoRA adapter rank (PEFT's r; lower case as there)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxrlhf.models import gpt_oss, moe, ring_cache
from jaxrlhf.models.activation_layout import ActivationLayout
from jaxrlhf.models.attention import ATTENTION_IMPLS, choose_kernel, decode_attention, kernel_fn, resolve_impl
from jaxrlhf.models.layers import DTYPES as _DTYPES
from jaxrlhf.models.layers import INIT_STD, RMSNorm
from jaxrlhf.models.layers import dense as _linear
from jaxrlhf.models.layers import logical_init as _init
from jaxrlhf.models.linear_attention import GatedDeltaNet
from jaxrlhf.models.lora import COLLECTION as LORA_COLLECTION
from jaxrlhf.models.lora import EMBED_TARGET, HEAD_TARGET, LORA_TARGETS, Embed
from jaxrlhf.models.moe import SparseMoeBlock
from jaxrlhf.models.projection import PROJECTION, project
from jaxrlhf.models.sequence_parallel import SequenceParallel, pad_length
from jaxrlhf.models.stacking import layer_layout, stack_layers, unstack_layers

HEADS = ("lm", "value", "reward")
ROPE_TYPES = ("default", "linear", "llama3", "yarn")
LAYER_TYPES = ("full_attention", "sliding_attention", "linear_attention")
# The MLP's gate activation by HF's name (`hidden_act`, Gemma's `hidden_activation`).
ACTIVATIONS = {"silu": nn.silu, "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True)}
# Gradient checkpointing of each decoder layer: which intermediates the backward pass may keep.
# The projections are custom-VJP calls (`projection.py`), which the dot policies do not recognise as
# dots: those policies also keep them, by their checkpoint name.
_AND_PROJECTIONS = lambda policy: jax.checkpoint_policies.save_from_both_policies(
  policy, jax.checkpoint_policies.save_only_these_names(PROJECTION)
)
REMAT_POLICIES = {  # keyed by config.REMAT_POLICY_NAMES, the names a config may give
  "none": None,  # no rematerialisation
  "full": jax.checkpoint_policies.nothing_saveable,
  "nothing_saveable": jax.checkpoint_policies.nothing_saveable,
  "dots_saveable": _AND_PROJECTIONS(jax.checkpoint_policies.dots_saveable),
  "dots_with_no_batch_dims_saveable": _AND_PROJECTIONS(jax.checkpoint_policies.dots_with_no_batch_dims_saveable),
}


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
  """Hyper-parameters with HF config.json names where HF has one (`hf_io.load_hf_config` maps the rest)."""

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
  dtype: str = "float32"  # compute dtype
  param_dtype: str = "float32"
  model_type: str = "llama"  # HF model_type, written back on export
  qkv_bias: bool = False  # Qwen2 always, Llama/Qwen3 with attention_bias
  o_bias: bool = False  # Llama/Qwen3 attention_bias (Qwen2 never)
  mlp_bias: bool = False  # Llama mlp_bias
  qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k before RoPE
  sliding_window: int | None = None  # keys with index <= query index - window are masked
  sliding_window_start_layer: int = 0  # Qwen2/3 max_window_layers: first layer that uses the window
  rope_type: str = "default"  # one of ROPE_TYPES
  rope_factor: float = 1.0
  rope_low_freq_factor: float = 1.0  # llama3
  rope_high_freq_factor: float = 4.0  # llama3
  rope_original_max_position_embeddings: int = 8192  # llama3, yarn
  rope_beta_fast: float = 32.0  # yarn
  rope_beta_slow: float = 1.0  # yarn
  rope_truncate: bool = True  # yarn: the correction range rounded outwards to whole dims
  rope_attention_factor: float = 1.0  # yarn: cos and sin scaled by it (`hf_io` settles HF's default from factor)
  remat_policy: str = "none"  # one of REMAT_POLICIES
  scan_layers: bool = True  # layers as one nn.scan over stacked weights (False: a Python loop of modules)
  attention_impl: str = "auto"  # one of attention.ATTENTION_IMPLS ("auto": by the device platform)
  attention_block_size: int = 512  # blockwise attention's query and key block
  # LoRA (`models/lora.py`): rank 0 = off; the adapters live in the "lora" collection, beside "params".
  lora_rank: int = 0
  lora_alpha: float = 16.0
  lora_targets: tuple[str, ...] = LORA_TARGETS  # which linears get an adapter (with lora_rank > 0)
  # Hybrid stacks (Qwen3.5): each layer's token mixer by HF's `layer_types` (one of LAYER_TYPES); empty = every layer
  # full attention. The stack scans over groups of one period of the pattern (`layer_pattern`).
  layer_types: tuple[str, ...] = ()
  attn_output_gate: bool = False  # Qwen3.5: q_proj also gives a per-head sigmoid gate on the attention output
  partial_rotary_factor: float = 1.0  # RoPE on the first head_dim x this dims of each head
  norm_offset: bool = False  # every RMSNorm but the gated one scales by (1 + w), w zero-initialised (Qwen3.5)
  # Gated DeltaNet layers (`linear_attention.py`), HF's names.
  linear_num_key_heads: int = 0
  linear_num_value_heads: int = 0
  linear_key_head_dim: int = 0
  linear_value_head_dim: int = 0
  linear_conv_kernel_dim: int = 4
  linear_chunk_size: int = 64  # the chunked form's chunk (training, prefill and log-prob forwards)
  # Mixture of experts (`models/moe.py`; Qwen3-MoE, Qwen3.5-MoE), HF's names: num_experts > 0 makes every layer's
  # feed-forward the routed experts (HF's decoder_sparse_step / mlp_only_layers mixing dense layers in: refused).
  num_experts: int = 0
  num_experts_per_tok: int = 0
  moe_intermediate_size: int = 0
  norm_topk_prob: bool = False
  shared_expert_intermediate_size: int = 0  # Qwen3.5-MoE's shared expert (0: none)
  decoder_sparse_step: int = 1
  mlp_only_layers: tuple[int, ...] = ()
  # The load-balancing loss's weight in the actor's loss (HF adds it only with output_router_logits; 0: off).
  router_aux_loss_coef: float = 0.0
  # Gemma 3 (`models/gemma3.py`), HF's names where HF has one. `sliding_attention` layers of `layer_types` attend
  # within `sliding_window` and rotate by RoPE base `rope_local_base_freq` (default RoPE; None: as the others).
  rope_local_base_freq: float | None = None
  hidden_activation: str = "silu"  # one of ACTIVATIONS
  query_pre_attn_scalar: float | None = None  # scores scaled by its -1/2 power instead of head_dim's (None)
  embed_scale: bool = False  # embeddings times sqrt(hidden_size), that factor rounded to the parameter dtype
  # Gemma's four norms per layer: the attention's output normed (post_attention_layernorm), the MLP's input
  # (pre_feedforward_layernorm) and output (post_feedforward_layernorm); else post_attention_layernorm is the MLP's
  # input norm (Llama).
  sandwich_norms: bool = False
  # gpt-oss (`models/gpt_oss.py`): a learned logit per query head in every softmax's denominator ("sinks"), and
  # its experts' clamped SwiGLU.
  attention_sinks: bool = False
  swiglu_alpha: float = 1.702
  swiglu_limit: float = 7.0
  # Generation: `sliding_attention` layers keep a ring of `sliding_window` columns (`models/ring_cache.py`) instead
  # of the whole length (False: as the full layers, the reference the ring is tested against).
  ring_kv_cache: bool = True

  def __post_init__(self):
    for name, value, allowed in (
      ("dtype", self.dtype, _DTYPES),
      ("param_dtype", self.param_dtype, _DTYPES),
      ("rope_type", self.rope_type, ROPE_TYPES),
      ("remat_policy", self.remat_policy, REMAT_POLICIES),
      ("attention_impl", self.attention_impl, ATTENTION_IMPLS),
      ("hidden_activation", self.hidden_activation, ACTIVATIONS),
    ):
      if value not in allowed:
        raise ValueError(f"model config {name}={value!r} is not supported; expected one of {list(allowed)}")
    if self.attention_block_size < 1:
      raise ValueError(f"model config attention_block_size={self.attention_block_size} must be >= 1")
    if self.layer_types:
      unknown = sorted(set(self.layer_types) - set(LAYER_TYPES))
      if unknown or len(self.layer_types) != self.num_hidden_layers:
        raise ValueError(
          f"model config layer_types={list(self.layer_types)}: expected {self.num_hidden_layers} entries "
          f"(num_hidden_layers), each one of {list(LAYER_TYPES)}"
        )
      if "linear_attention" in self.layer_types and not (
        self.linear_num_key_heads and self.linear_num_value_heads and self.linear_key_head_dim
      ):
        raise ValueError("model config has linear_attention layers but no linear_num_key_heads / linear_* sizes")
      if "sliding_attention" in self.layer_types and (self.sliding_window is None or self.sliding_window_start_layer):
        raise ValueError(
          "model config has sliding_attention layers: it needs a sliding_window, and no sliding_window_start_layer "
          f"(got {self.sliding_window}, {self.sliding_window_start_layer})"
        )

    if self.num_experts:
      if not 0 < self.num_experts_per_tok <= self.num_experts or self.moe_intermediate_size < 1:
        raise ValueError(
          f"model config num_experts={self.num_experts} needs 0 < num_experts_per_tok <= num_experts (got "
          f"{self.num_experts_per_tok}) and moe_intermediate_size >= 1 (got {self.moe_intermediate_size})"
        )
      dense_layers = sorted(
        set(self.mlp_only_layers)
        | {i for i in range(self.num_hidden_layers) if (i + 1) % max(self.decoder_sparse_step, 1)}
      )
      if dense_layers:
        raise ValueError(
          f"model config makes layers {dense_layers[:8]} dense MLPs beside the experts (decoder_sparse_step="
          f"{self.decoder_sparse_step}, mlp_only_layers={list(self.mlp_only_layers)}): a stack that mixes dense and "
          "expert layers is not supported yet; every layer must be an expert layer"
        )

  @property
  def has_linear_attention(self) -> bool:
    return "linear_attention" in self.layer_types

  @property
  def mixer_types(self) -> tuple[str, ...]:
    """Each layer's token mixer (empty: all full attention): `layer_types` with sliding attention counted as
    attention, which differs from the full kind only by its window and RoPE (a per-layer flag, `_layer_windows`)."""
    return tuple("full_attention" if kind == "sliding_attention" else kind for kind in self.layer_types)

  @property
  def rotary_dim(self) -> int:
    """Dims of each head RoPE rotates (the first ones; an even number)."""
    return int(self.resolved_head_dim * self.partial_rotary_factor)

  def for_platform(self, platform: str) -> "DecoderConfig":
    """`attention_impl="auto"` resolved for a device platform ("cpu", "gpu"/"cuda", "tpu"): the compile
    target's, which differs from this process's default backend when compiling ahead of time."""
    if self.attention_impl != "auto":
      return self
    return dataclasses.replace(self, attention_impl=resolve_impl("auto", platform))

  @property
  def resolved_head_dim(self) -> int:
    return self.head_dim or self.hidden_size // self.num_attention_heads

  @classmethod
  def from_dict(cls, values: dict[str, Any]) -> "DecoderConfig":
    names = {f.name for f in dataclasses.fields(cls)}
    missing = [
      n
      for n in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
      )
      if values.get(n) is None
    ]
    if missing:
      raise ValueError(f"model config is missing {missing} (set actor_rollout_ref.model.override_config.<key>)")
    config = cls(**{k: v for k, v in values.items() if k in names and v is not None})
    if config.num_attention_heads % config.num_key_value_heads:
      raise ValueError(
        f"num_attention_heads={config.num_attention_heads} is not a multiple of "
        f"num_key_value_heads={config.num_key_value_heads}"
      )
    return config


def _dot_general_f32(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, **kw):
  """`lax.dot_general` accumulated in and returning fp32 (the language-model head's logits)."""
  del preferred_element_type
  return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision, preferred_element_type=jnp.float32, **kw)


def rope_inv_freq(config: DecoderConfig) -> np.ndarray:
  """Inverse frequencies [head_dim/2] fp32, with the config's scaling (HF `ROPE_INIT_FUNCTIONS`)."""
  head_dim = config.rotary_dim  # partial RoPE: the frequencies of the rotated dims only
  exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
  inv_freq = (1.0 / (np.float32(config.rope_theta) ** exponents)).astype(np.float32)
  if config.rope_type == "linear":
    inv_freq = inv_freq / np.float32(config.rope_factor)
  elif config.rope_type == "llama3":
    # Llama 3.1: long wavelengths slowed down by `factor`, short ones kept, a smooth blend in between.
    factor, low, high = config.rope_factor, config.rope_low_freq_factor, config.rope_high_freq_factor
    old_context = config.rope_original_max_position_embeddings
    low_freq_wavelen, high_freq_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    inv_freq = np.where(is_medium, smoothed, scaled)
  elif config.rope_type == "yarn":
    # YaRN: frequencies past beta_fast rotations over the original context kept, those under beta_slow divided by
    # factor, a linear ramp over the dims in between (HF `_compute_yarn_parameters`).
    base, factor, old_context = config.rope_theta, config.rope_factor, config.rope_original_max_position_embeddings
    correction_dim = lambda rotations: (
      head_dim * math.log(old_context / (rotations * 2 * math.pi)) / (2 * math.log(base))
    )
    low, high = correction_dim(config.rope_beta_fast), correction_dim(config.rope_beta_slow)
    if config.rope_truncate:
      low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    high = high + 0.001 if low == high else high
    ramp = np.clip((np.arange(head_dim // 2, dtype=np.float32) - low) / (high - low), 0, 1).astype(np.float32)
    extrapolation = (1 - ramp).astype(np.float32)
    inv_freq = (inv_freq / np.float32(factor)) * (1 - extrapolation) + inv_freq * extrapolation
  return inv_freq.astype(np.float32)


def local_rope_config(config: DecoderConfig) -> DecoderConfig:
  """The config whose RoPE the sliding layers use (Gemma 3's `rope_local_base_freq`, unscaled)."""
  return dataclasses.replace(config, rope_theta=config.rope_local_base_freq, rope_type="default")


def rope_cos_sin(positions_BxL, config: DecoderConfig):
  """HF rotate-half RoPE tables, fp32: cos/sin of shape [B, L, head_dim]."""
  inv_freq = jnp.asarray(rope_inv_freq(config))
  freqs_BxLxH2 = positions_BxL.astype(jnp.float32)[..., None] * inv_freq
  emb_BxLxH = jnp.concatenate([freqs_BxLxH2, freqs_BxLxH2], axis=-1)
  if config.rope_type == "yarn" and config.rope_attention_factor != 1.0:
    scale = np.float32(config.rope_attention_factor)
    return jnp.cos(emb_BxLxH) * scale, jnp.sin(emb_BxLxH) * scale
  return jnp.cos(emb_BxLxH), jnp.sin(emb_BxLxH)


def apply_rope(x, cos_BxLxH, sin_BxLxH):
  """Rotates queries [B, L, Q, H] or keys [B, L, K, H] by their positions' tables; fp32 math. Tables narrower than
  the head (partial RoPE) rotate its first dims and pass the rest through."""
  rotary = cos_BxLxH.shape[-1]
  if rotary < x.shape[-1]:
    return jnp.concatenate([apply_rope(x[..., :rotary], cos_BxLxH, sin_BxLxH), x[..., rotary:]], axis=-1)
  half = x.shape[-1] // 2
  x1, x2 = x[..., :half], x[..., half:]
  rotated = jnp.concatenate([-x2, x1], axis=-1)
  out = x.astype(jnp.float32) * cos_BxLxH[:, :, None, :] + rotated.astype(jnp.float32) * sin_BxLxH[:, :, None, :]
  return out.astype(x.dtype)


def _pin(layout: ActivationLayout | None):
  """`constrain(x, logical_axes)` of a cache-free call's activation layout; the identity without one."""
  return (lambda x, logical_axes: x) if layout is None else layout.constrain


class Attention(nn.Module):
  config: DecoderConfig
  sliding_window: int | None = None
  layout: ActivationLayout | None = None  # cache-free calls only (`models/activation_layout.py`)

  @nn.compact
  def __call__(
    self,
    x_BxLxD,
    cos_BxLxH,
    sin_BxLxH,
    kv_mask_BxS,
    cache=None,
    cache_index=None,
    segment_ids_BxL=None,
    layer=0,
    window_on=None,
  ):
    """`cache`: the whole stacked cache {"k", "v"} [layers, B, K, S, H], read-only here: this layer attends
    over its slice `layer` with this call's keys and values written in, and returns those (`new_kv`
    {"k", "v"} [B, K, L, H]) for the Decoder to write into the stacked cache once, after every layer.
    `window_on` (traced bool, optional): whether this layer uses the sliding window. Returns
    (out_BxLxD, new_kv or None)."""
    cfg = self.config
    dtype, param_dtype = _DTYPES[cfg.dtype], _DTYPES[cfg.param_dtype]
    num_heads, num_kv, head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.resolved_head_dim
    layout = self.layout if cache is None else None
    dense = lambda features, names, name: _linear(cfg, name, features, ("embed",), names, cfg.qkv_bias)
    if cfg.attn_output_gate:  # each head's query, then its output gate (HF's q_proj rows, head by head)
      q_and_gate_BxLxQx2H = dense((num_heads, 2 * head_dim), ("heads", "head_dim"), "q_proj")(x_BxLxD)
      q_BxLxQxH, gate_BxLxQxH = jnp.split(q_and_gate_BxLxQx2H, 2, axis=-1)
    else:
      q_BxLxQxH = dense((num_heads, head_dim), ("heads", "head_dim"), "q_proj")(x_BxLxD)
    k_BxLxKxH = dense((num_kv, head_dim), ("kv_heads", "head_dim"), "k_proj")(x_BxLxD)
    v_BxLxKxH = dense((num_kv, head_dim), ("kv_heads", "head_dim"), "v_proj")(x_BxLxD)
    if cfg.qk_norm:
      head_norm = lambda name: RMSNorm(
        cfg.rms_norm_eps, dtype, param_dtype, axis_name="head_dim", offset=cfg.norm_offset, name=name
      )
      q_BxLxQxH = head_norm("q_norm")(q_BxLxQxH)
      k_BxLxKxH = head_norm("k_norm")(k_BxLxKxH)
    q_BxLxQxH = apply_rope(q_BxLxQxH, cos_BxLxH, sin_BxLxH)
    k_BxLxKxH = apply_rope(k_BxLxKxH, cos_BxLxH, sin_BxLxH)
    if cfg.query_pre_attn_scalar is not None and cfg.query_pre_attn_scalar != head_dim:
      # Gemma: scores scaled by query_pre_attn_scalar ** -0.5; every kernel divides by sqrt(head_dim), so the
      # queries carry the rest of the factor.
      factor = np.float32(math.sqrt(head_dim / cfg.query_pre_attn_scalar))
      q_BxLxQxH = (q_BxLxQxH.astype(jnp.float32) * factor).astype(q_BxLxQxH.dtype)
    pin = _pin(layout)
    q_BxLxQxH = pin(q_BxLxQxH, ("batch", "length", "heads", "head_dim"))
    k_BxLxKxH = pin(k_BxLxKxH, ("batch", "length", "kv_heads", "head_dim"))
    v_BxLxKxH = pin(v_BxLxKxH, ("batch", "length", "kv_heads", "head_dim"))

    batch, length = x_BxLxD.shape[:2]
    q_BxLxKxGxH = q_BxLxQxH.reshape(batch, length, num_kv, num_heads // num_kv, head_dim)
    if cfg.attention_sinks:  # HF's `sinks` [Q]; read back by `_sinks` in the kernels' calls
      self.param("sinks", _init(nn.initializers.normal(INIT_STD), ("heads",)), (num_heads,), param_dtype)
    if cache is None:
      new_kv = None
      out_BxLxKxGxH = self._attend(
        q_BxLxKxGxH, k_BxLxKxH, v_BxLxKxH, kv_mask_BxS, segment_ids_BxL, window_on, offset=0, cached=False
      )
    elif has_ring_cache(cfg):
      out_BxLxKxGxH, new_kv = self._cached_by_kind(
        q_BxLxKxGxH, k_BxLxKxH, v_BxLxKxH, kv_mask_BxS, cache, cache_index, layer, window_on
      )
    else:
      out_BxLxKxGxH, new_kv = self._cached(
        q_BxLxKxGxH, k_BxLxKxH, v_BxLxKxH, kv_mask_BxS, cache, cache_index, layer, window_on
      )
    out_BxLxQxH = pin(
      out_BxLxKxGxH.reshape(batch, length, num_heads, head_dim), ("batch", "length", "heads", "head_dim")
    )
    if cfg.attn_output_gate:
      out_BxLxQxH = out_BxLxQxH * jax.nn.sigmoid(gate_BxLxQxH.astype(jnp.float32)).astype(out_BxLxQxH.dtype)
    out_BxLxD = _linear(cfg, "o_proj", (cfg.hidden_size,), ("heads", "head_dim"), ("embed",), cfg.o_bias)(out_BxLxQxH)
    return out_BxLxD, new_kv

  def _sinks(self):
    """The learned attention sinks [K, G] fp32 (query head q = k * G + g reads key/value head k), or None."""
    cfg = self.config
    if not cfg.attention_sinks:
      return None
    sinks_Q = nn.unbox(self.get_variable("params", "sinks"))
    return sinks_Q.astype(jnp.float32).reshape(cfg.num_key_value_heads, -1)

  def _cached(
    self, q_BxLxKxGxH, k_BxLxKxH, v_BxLxKxH, kv_mask_BxS, cache, cache_index, layer, window_on, window="layer"
  ):
    """A cached call over the whole-length cache "k"/"v" (its layer `layer`): a decode step or a prefill. Returns
    (out [B, L, K, G, H], new_kv {"k", "v"} [B, K, L, H]: this call's columns, which the Decoder writes)."""
    window = self.sliding_window if window == "layer" else window
    new_kv, layer_kv = _layer_kv(cache, layer, cache_index, k_BxLxKxH, v_BxLxKxH, kv_mask_BxS.shape[1])
    if q_BxLxKxGxH.shape[1] == 1:  # a decode step: one query row, over the cache in its own layout
      out_BxLxKxGxH = decode_attention(
        q_BxLxKxGxH[:, 0], layer_kv["k"], layer_kv["v"], cache_index, kv_mask_BxS, window, window_on, self._sinks()
      )[:, None]
    else:  # a prefill: queries offset into the cache
      keys_BxSxKxH, values_BxSxKxH = (layer_kv[name].transpose(0, 2, 1, 3) for name in "kv")
      out_BxLxKxGxH = self._attend(
        q_BxLxKxGxH,
        keys_BxSxKxH,
        values_BxSxKxH,
        kv_mask_BxS,
        None,
        window_on,
        offset=cache_index,
        cached=True,
        window=window,
      )
    return out_BxLxKxGxH, new_kv

  def _cached_by_kind(self, q_BxLxKxGxH, k_BxLxKxH, v_BxLxKxH, kv_mask_BxS, cache, cache_index, layer, window_on):
    """A cached call with the sliding layers' ring (`ring_cache.py`): a full layer reads and writes the whole-length
    "k"/"v" cache, a sliding one its ring "sliding_k"/"sliding_v"; in the layer scan the layer's traced kind picks
    the branch (`lax.cond`: one runs). `layer`: the index among the attention layers, mapped to the kind's own.
    Returns (out [B, L, K, G, H], new_kv): both kinds' leaves, the other kind's zeros, so that every layer returns
    one structure; a full layer's new columns [B, K, L, H], a sliding layer's new column [B, K, 1, H] (decode) or
    whole new ring [B, K, W, H] (prefill)."""
    cfg, window = self.config, self.config.sliding_window
    batch, length, num_kv, head_dim = k_BxLxKxH.shape
    sliding_N = _sliding_layers(cfg)
    has_full = not sliding_N.all()
    ring_columns = 1 if length == 1 else window

    def zeros(names, columns):
      return {name: jnp.zeros((batch, num_kv, columns, head_dim), cache[name].dtype) for name in names}

    def full(_):
      index = jnp.asarray(np.maximum(np.cumsum(~sliding_N) - 1, 0), jnp.int32)[layer]
      out, new_kv = self._cached(q_BxLxKxGxH, k_BxLxKxH, v_BxLxKxH, kv_mask_BxS, cache, cache_index, index, None, None)
      return out, {**new_kv, **zeros(RING_LEAVES, ring_columns)}

    def sliding(_):
      index = jnp.asarray(np.maximum(np.cumsum(sliding_N) - 1, 0), jnp.int32)[layer]
      ring = {name: _layer_slice(cache[name], index, batch) for name in RING_LEAVES}
      new_kv = {
        name: new.astype(cache[name].dtype).transpose(0, 2, 1, 3)
        for name, new in (("sliding_k", k_BxLxKxH), ("sliding_v", v_BxLxKxH))
      }
      if length == 1:
        out = ring_cache.decode(
          q_BxLxKxGxH[:, 0],
          new_kv["sliding_k"],
          new_kv["sliding_v"],
          ring["sliding_k"],
          ring["sliding_v"],
          kv_mask_BxS,
          cache_index,
          write_columns,
          self._sinks(),
        )[:, None]
      else:
        attend = lambda q, keys, values, mask, offset: self._attend(
          q, keys, values, mask, None, None, offset=offset, cached=True, window=window
        )
        out, new_kv = ring_cache.prefill(
          attend, q_BxLxKxGxH, k_BxLxKxH, v_BxLxKxH, ring["sliding_k"], ring["sliding_v"], kv_mask_BxS, cache_index
        )
      other = zeros(("k", "v"), length) if has_full else {}
      return out, {**other, **new_kv}

    if not has_full:
      return sliding(None)
    if window_on is None:  # a loop of modules: the kind is static
      return sliding(None) if self.sliding_window is not None else full(None)
    return jax.lax.cond(window_on, sliding, full, None)

  def _attend(
    self,
    q_BxLxKxGxH,
    keys_BxSxKxH,
    values_BxSxKxH,
    kv_mask_BxS,
    segment_ids_BxL,
    window_on,
    *,
    offset,
    cached: bool,
    window: int | None | str = "layer",
  ):
    """A cache-free call or a prefill through the configured kernel, as `choose_kernel` settles it for this call.
    Under sequence parallelism the all-to-all gives each device whole sequences for some heads; a Mosaic kernel
    (splash), which XLA cannot partition, runs in a shard_map on each device's rows and heads. `window`: the
    layer's (default), or a static one for a call whose kind is known (the ring cache's branches)."""
    cfg, sinks_KxG = self.config, self._sinks()
    window = self.sliding_window if window == "layer" else window
    kernel = choose_kernel(
      resolve_impl(cfg.attention_impl),
      dtype=_DTYPES[cfg.dtype],
      cached=cached,
      packed=segment_ids_BxL is not None,
      traced_window=window is not None and window_on is not None,
      sinks=sinks_KxG is not None,
    )
    core = kernel_fn(kernel, offset=offset, window=window, block_size=cfg.attention_block_size, sinks_KxG=sinks_KxG)
    layout = None if cached else self.layout
    if isinstance(layout, SequenceParallel) and sinks_KxG is not None:
      raise ValueError(
        "attention sinks (gpt-oss) are not supported with sequence parallelism (ulysses_sequence_parallel_size > 1)"
      )
    if layout is not None and (isinstance(layout, SequenceParallel) or kernel == "splash"):
      return layout.attention(core, q_BxLxKxGxH, keys_BxSxKxH, values_BxSxKxH, kv_mask_BxS, segment_ids_BxL, window_on)
    return core(q_BxLxKxGxH, keys_BxSxKxH, values_BxSxKxH, kv_mask_BxS, segment_ids_BxL, window_on)


def _layer_slice(stacked, layer, batch: int, columns: int | None = None):
  """Layer `layer`'s [B, K, columns, H] of a stacked cache leaf [layers, B, K, S, H] (default: every column)."""
  zero = jnp.zeros((), jnp.int32)
  _, _, kv_heads, length, dim = stacked.shape
  size = (1, batch, kv_heads, length if columns is None else columns, dim)
  return jax.lax.dynamic_slice(stacked, (jnp.asarray(layer, jnp.int32), zero, zero, zero, zero), size)[0]


def _layer_kv(cache, layer, cache_index, k_BxLxKxH, v_BxLxKxH, num_keys: int):
  """This layer's first `num_keys` (S = len(kv_mask)) cache columns with the call's keys and values written in at
  `cache_index`. Returns (new_kv {"k", "v"} [B, K, L, H] in the cache's dtype, layer_kv {"k", "v"} [B, K, S, H]).

  Only those S columns are read: a cache allocated longer (for later decode segments) costs this call nothing
  beyond them. The stacked cache is not written here: written per layer inside the layer scan (its slice taken
  out, updated, put back), XLA moved every layer's whole slice several times per decode step, most of a small
  model's decode time."""
  new_kv, layer_kv = {}, {}
  for name, new_BxLxKxH in (("k", k_BxLxKxH), ("v", v_BxLxKxH)):
    stacked = cache[name]
    new_kv[name] = new_BxLxKxH.astype(stacked.dtype).transpose(0, 2, 1, 3)
    old_BxKxSxH = _layer_slice(stacked, layer, k_BxLxKxH.shape[0], num_keys)
    layer_kv[name] = write_columns(old_BxKxSxH, new_kv[name], cache_index, batch_axis=0, length_axis=2)
  return new_kv, layer_kv


def write_columns(x, new, index, *, batch_axis: int, length_axis: int):
  """`new` written into `x` from column `index` of the length axis on: one index for every row (a scalar, a
  `dynamic_update_slice`), or one per row ([B], one new column each: a decode step whose rows are at different
  points, the rollout's slots in `rollout/slots.py`; a scatter of (row, column) pairs)."""
  index = jnp.asarray(index, jnp.int32)
  if index.ndim == 0:
    return jax.lax.dynamic_update_slice(x, new, tuple(index if a == length_axis else 0 for a in range(x.ndim)))
  at = [slice(None)] * x.ndim
  at[batch_axis], at[length_axis] = jnp.arange(x.shape[batch_axis]), index
  # Advanced indices on two axes put their (row) axis first in the indexed result, [B, the other axes], unless the
  # two axes are adjacent: then it stays where they were.
  rows = jnp.take(new, 0, axis=length_axis)
  if abs(batch_axis - length_axis) > 1:
    rows = jnp.moveaxis(rows, batch_axis - (batch_axis > length_axis), 0)
  return x.at[tuple(at)].set(rows, unique_indices=True, indices_are_sorted=True)


class MLP(nn.Module):
  config: DecoderConfig
  layout: ActivationLayout | None = None

  @nn.compact
  def __call__(self, x_BxLxD):
    cfg = self.config
    pin = _pin(self.layout)
    dense = lambda features, names, name: _linear(cfg, name, (features,), names[:1], names[1:], cfg.mlp_bias)
    # The largest activations of a layer ([B, L, F], F ~ 5 D): split by rows (and F over tensor), never copied.
    gate_BxLxF = pin(dense(cfg.intermediate_size, ("embed", "mlp"), "gate_proj")(x_BxLxD), ("batch", "length", "mlp"))
    up_BxLxF = pin(dense(cfg.intermediate_size, ("embed", "mlp"), "up_proj")(x_BxLxD), ("batch", "length", "mlp"))
    activation = ACTIVATIONS[cfg.hidden_activation]
    return dense(cfg.hidden_size, ("mlp", "embed"), "down_proj")(activation(gate_BxLxF) * up_BxLxF)


class DecoderLayer(nn.Module):
  """One layer, called as a scan body: (x, layer index, window flag, replayed routes, *shared inputs) -> (x,
  (new_kv, routes)); the Python loop calls it the same way. `new_kv`: the keys and values this call adds to the
  cache (`Attention`), None without a cache; `routes` [B, L, k]: the experts each token was routed to, with
  `record_routes` (else None). `replay_BxLxk` (or None): recorded routes the experts route by (`moe.route`)."""

  config: DecoderConfig
  sliding_window: int | None = None
  layout: ActivationLayout | None = None  # cache-free calls only
  kind: str = "full_attention"  # the token mixer, one of LAYER_TYPES
  record_routes: bool = False

  @nn.compact
  def __call__(
    self,
    x_BxLxD,
    layer,
    window_on,
    replay_BxLxk,
    cos_BxLxH,
    sin_BxLxH,
    kv_mask_BxS,
    cache=None,
    cache_index=None,
    segment_ids_BxL=None,
    local_rope=None,
  ):
    """`local_rope`: the sliding layers' own RoPE tables (cos, sin) [B, L, H] (Gemma 3), or None."""
    cfg = self.config
    layout = self.layout if cache is None else None
    # Pinned at both ends of every layer (the scan body's carry): the residual stream stays split by rows
    # (and by length under sequence parallelism), in the forward and, through the constraint's transpose,
    # in the backward.
    pin = _pin(layout)
    x_BxLxD = pin(x_BxLxD, ("batch", "length", "embed"))
    norm = lambda name: RMSNorm(
      cfg.rms_norm_eps, _DTYPES[cfg.dtype], _DTYPES[cfg.param_dtype], offset=cfg.norm_offset, name=name
    )
    if self.kind == "linear_attention":  # `layer`: its index among the linear layers (their cache's layer axis)
      attn_BxLxD, new_kv = GatedDeltaNet(cfg, name="linear_attn")(
        norm("input_layernorm")(x_BxLxD), kv_mask_BxS, cache, cache_index, layer
      )
    else:  # `layer`: its index among the attention layers
      if local_rope is not None and self.sliding_window is not None:  # this layer's kind decides its RoPE
        sliding = True if window_on is None else window_on
        cos_BxLxH, sin_BxLxH = (
          jnp.where(sliding, local, full) for local, full in zip(local_rope, (cos_BxLxH, sin_BxLxH))
        )
      attn_BxLxD, new_kv = Attention(cfg, self.sliding_window, layout, name="self_attn")(
        norm("input_layernorm")(x_BxLxD),
        cos_BxLxH,
        sin_BxLxH,
        kv_mask_BxS,
        cache,
        cache_index,
        segment_ids_BxL,
        layer,
        window_on,
      )
    if cfg.sandwich_norms:
      attn_BxLxD = norm("post_attention_layernorm")(attn_BxLxD)
    x_BxLxD = pin(x_BxLxD + attn_BxLxD, ("batch", "length", "embed"))
    routes_BxLxk = None
    mlp_norm = norm("pre_feedforward_layernorm" if cfg.sandwich_norms else "post_attention_layernorm")
    if cfg.num_experts:  # load-balancing statistics over a cache-free call's tokens (its kv mask is theirs)
      valid_BxL = kv_mask_BxS if cache is None else None
      moe_layout = None if layout is None or isinstance(layout, SequenceParallel) else layout  # SP: XLA partitions it
      block = gpt_oss.GptOssMLP if cfg.model_type == gpt_oss.MODEL_TYPE else SparseMoeBlock
      mlp_BxLxD, routes_BxLxk = block(cfg, moe_layout, name="mlp")(mlp_norm(x_BxLxD), valid_BxL, replay_BxLxk)
    else:
      mlp_BxLxD = MLP(cfg, layout, name="mlp")(mlp_norm(x_BxLxD))
    if cfg.sandwich_norms:
      mlp_BxLxD = norm("post_feedforward_layernorm")(mlp_BxLxD)
    x_BxLxD = x_BxLxD + mlp_BxLxD
    return pin(x_BxLxD, ("batch", "length", "embed")), (new_kv, routes_BxLxk if self.record_routes else None)


def layer_pattern(config: DecoderConfig) -> tuple[str, ...]:
  """The token mixers of one group: the shortest period of `mixer_types` (Qwen3.5: three linear, one full), which
  the stack scans over; one full-attention layer for a model without `layer_types` or with attention layers only
  (Gemma 3's sliding and full layers are one scan, with a per-layer window flag)."""
  types = config.mixer_types or ("full_attention",)
  for period in range(1, len(types) + 1):
    if len(types) % period == 0 and types == types[:period] * (len(types) // period):
      return types[:period]
  return types


def _kind_index(pattern: tuple[str, ...], group, position: int):
  """Layer `position` of group `group`'s index among the layers of its kind (the kind's cache layer axis)."""
  kind = pattern[position]
  return group * pattern.count(kind) + pattern[:position].count(kind)


class LayerGroup(nn.Module):
  """One period of a hybrid stack's layer kinds (`layer_pattern`), called as a scan body: (x, group, window flag,
  replayed routes [period, ...] or None, *shared inputs) -> (x, ({kind: the new cache of its layers [count in the
  group, ...]}, the group's routes [period, B, L, k] or None)), as `DecoderLayer`'s."""

  config: DecoderConfig
  sliding_window: int | None = None
  layout: ActivationLayout | None = None
  record_routes: bool = False

  @nn.compact
  def __call__(self, x_BxLxD, group, window_on, replay_PxBxLxk, *shared):
    pattern = layer_pattern(self.config)
    layer_class = _layer_class(self.config)
    new, routes = {kind: [] for kind in pattern}, []
    for position, kind in enumerate(pattern):
      layer = layer_class(self.config, self.sliding_window, self.layout, kind, self.record_routes, name=f"{position}")
      replay_BxLxk = None if replay_PxBxLxk is None else replay_PxBxLxk[position]
      x_BxLxD, (state, routes_BxLxk) = layer(
        x_BxLxD, _kind_index(pattern, group, position), window_on, replay_BxLxk, *shared
      )
      new[kind].append(state)
      routes.append(routes_BxLxk)
    routes_PxBxLxk = jnp.stack(routes) if self.record_routes else None
    if any(state is None for states in new.values() for state in states):
      return x_BxLxD, (None, routes_PxBxLxk)
    stacked = {kind: jax.tree.map(lambda *x: jnp.stack(x), *states) for kind, states in new.items()}
    return x_BxLxD, (stacked, routes_PxBxLxk)


def _layer_class(config: DecoderConfig):
  policy = REMAT_POLICIES[config.remat_policy]
  if policy is None:
    return DecoderLayer
  # Inside a scan the loop boundary already keeps XLA from merging the recomputation into the forward.
  return nn.remat(DecoderLayer, policy=policy, prevent_cse=not config.scan_layers)


def _sliding_layers(config: DecoderConfig) -> np.ndarray:
  """Which layers attend within the sliding window [layers] bool: the `sliding_attention` ones of `layer_types`
  (Gemma 3), else those from `sliding_window_start_layer` on (Qwen2's `max_window_layers`; Mistral: all)."""
  if config.sliding_window is None:
    return np.zeros(config.num_hidden_layers, bool)
  if "sliding_attention" in config.layer_types:
    return np.array([kind == "sliding_attention" for kind in config.layer_types])
  return np.arange(config.num_hidden_layers) >= config.sliding_window_start_layer


def _layer_windows(config: DecoderConfig):
  """(static window or None, per-layer flag [layers] bool or None): the flag only when the window covers
  some layers but not all (Qwen2 `max_window_layers`, Gemma 3's interleaving), the one case a scan cannot make
  static."""
  sliding_N = _sliding_layers(config)
  if not sliding_N.any():
    return None, None
  if sliding_N.all():
    return config.sliding_window, None
  return config.sliding_window, jnp.asarray(sliding_N)


class Decoder(nn.Module):
  """Backbone plus one head.

  head="lm": returns (logits_BxLxV fp32, cache); head="value" / "reward": returns (scores_BxL fp32, cache)
  (a reward model's score of a sequence is the score at its last valid token: `reward_model_scores`).
  `positions_BxL` are token positions (left padding makes them differ per row); `kv_mask_BxS` marks
  valid keys: the attention mask without cache, the validity of the cache's first S columns with one.
  `segment_ids_BxL` (packed rows, no cache): block-diagonal causal attention within each segment id > 0.
  `return_hidden`: the final normed hidden states x_BxLxD (compute dtype) instead of the head's output,
  for callers that apply `head_outputs` to some positions only.
  `layout`: where a cache-free call's activations live on the mesh (`models/activation_layout.py`),
  pinned at every layer's boundaries; None (one device, or decode) pins nothing. A `SequenceParallel`
  layout also splits each sequence over the mesh's `sp` axis (Ulysses, `models/sequence_parallel.py`);
  a length it does not divide is padded (masked) and cut back.
  """

  config: DecoderConfig
  head: str = "lm"
  layout: ActivationLayout | None = None

  @property
  def sequence_parallel(self) -> SequenceParallel | None:
    return self.layout if isinstance(self.layout, SequenceParallel) else None

  @nn.compact
  def __call__(
    self,
    input_ids_BxL,
    positions_BxL,
    kv_mask_BxS,
    cache=None,
    cache_index=None,
    segment_ids_BxL=None,
    return_hidden: bool = False,
    replay_BxLxYxk=None,
  ):
    cfg = self.config
    if self.head not in HEADS:
      raise ValueError(f"Decoder head={self.head!r} is not one of {HEADS}")
    if segment_ids_BxL is not None and cache is not None:
      raise ValueError("segment_ids_BxL (packed rows) is for cache-free calls only")
    dtype, param_dtype = _DTYPES[cfg.dtype], _DTYPES[cfg.param_dtype]
    layout = self.layout if cache is None else None  # decode never splits its sequence nor pins a layout
    sp = layout if isinstance(layout, SequenceParallel) else None
    pin = _pin(layout)
    length = input_ids_BxL.shape[1]
    if sp is not None:
      padded = sp.padded_length(length)
      input_ids_BxL, positions_BxL, kv_mask_BxS = (
        pad_length(x, padded) for x in (input_ids_BxL, positions_BxL, kv_mask_BxS)
      )
      segment_ids_BxL = None if segment_ids_BxL is None else pad_length(segment_ids_BxL, padded)
    embed = Embed(
      cfg.vocab_size,
      cfg.hidden_size,
      dtype,
      param_dtype,
      _init(nn.initializers.normal(INIT_STD), ("vocab", "embed")),
      lora_rank=cfg.lora_rank if EMBED_TARGET in cfg.lora_targets else 0,
      lora_alpha=cfg.lora_alpha,
      name=EMBED_TARGET,
    )
    x_BxLxD = embed(input_ids_BxL)
    if cfg.embed_scale:  # Gemma: sqrt(D) in the weights' dtype (bf16 weights make sqrt(3072) 55.5), as HF
      x_BxLxD = x_BxLxD * jnp.asarray(np.float32(math.sqrt(cfg.hidden_size)), param_dtype).astype(dtype)
    # RoPE from the global positions, before any split: each length shard keeps its tokens' own angles.
    cos_BxLxH, sin_BxLxH = rope_cos_sin(positions_BxL, cfg)
    x_BxLxD = pin(x_BxLxD, ("batch", "length", "embed"))
    cos_BxLxH, sin_BxLxH = (pin(x, ("batch", "length", "head_dim")) for x in (cos_BxLxH, sin_BxLxH))
    local_rope = None
    if cfg.rope_local_base_freq is not None:
      local_rope = tuple(
        pin(x, ("batch", "length", "head_dim")) for x in rope_cos_sin(positions_BxL, local_rope_config(cfg))
      )
    layer_class = _layer_class(cfg)
    shared = (cos_BxLxH, sin_BxLxH, kv_mask_BxS, cache, cache_index, segment_ids_BxL, local_rope)
    pattern = layer_pattern(cfg)
    # Rollout routing replay: a cache with "routes" records each token's experts per layer; `replay_BxLxYxk` routes by
    # recorded ones (`moe.route`). Both with the layer axis first, as the layers are scanned.
    record = cache is not None and ROUTES in cache
    replay_YxBxLxk = None
    if replay_BxLxYxk is not None:
      if not cfg.num_experts:
        raise ValueError("replay_BxLxYxk (rollout routing replay) is for a model with experts (num_experts > 0)")
      if sp is not None:
        replay_BxLxYxk = pad_length(replay_BxLxYxk, padded)
      replay_YxBxLxk = jnp.moveaxis(replay_BxLxYxk, 2, 0)
    if cfg.has_linear_attention and (segment_ids_BxL is not None or sp is not None):
      raise ValueError(
        "packed rows and sequence parallelism are not supported with linear_attention layers (their recurrence "
        "would cross a packed sequence's boundary or a length shard)"
      )
    if cfg.scan_layers and len(pattern) == 1:
      window, window_on_N = _layer_windows(cfg)
      scanned = lambda x: nn.broadcast if x is None else 0
      layers = nn.scan(
        layer_class,
        variable_axes={"params": 0, LORA_COLLECTION: 0, "intermediates": 0},
        split_rngs={"params": True},
        in_axes=(0, scanned(window_on_N), scanned(replay_YxBxLxk)) + (nn.broadcast,) * len(shared),
        length=cfg.num_hidden_layers,
        metadata_params={nn.PARTITION_NAME: "layers"},
      )
      x_BxLxD, (new_kv, routes_YxBxLxk) = layers(cfg, window, layout, pattern[0], record, name="layers")(
        x_BxLxD, jnp.arange(cfg.num_hidden_layers, dtype=jnp.int32), window_on_N, replay_YxBxLxk, *shared
      )
      new_state = None if new_kv is None else {pattern[0]: new_kv}
    elif cfg.scan_layers:  # a hybrid stack: one scan over groups of one period each
      if cfg.sliding_window is not None:
        raise ValueError("a sliding window is not supported with layer_types of several kinds")
      groups = cfg.num_hidden_layers // len(pattern)
      stack = nn.scan(
        LayerGroup,
        variable_axes={"params": 0, LORA_COLLECTION: 0, "intermediates": 0},
        split_rngs={"params": True},
        in_axes=(0, nn.broadcast, nn.broadcast if replay_YxBxLxk is None else 0) + (nn.broadcast,) * len(shared),
        length=groups,
        metadata_params={nn.PARTITION_NAME: "layers"},
      )
      replay_GxPxBxLxk = (  # [layers, ...] -> [groups, a group's layers, ...]
        None if replay_YxBxLxk is None else replay_YxBxLxk.reshape((groups, len(pattern)) + replay_YxBxLxk.shape[1:])
      )
      x_BxLxD, (grouped, routes_GxPxBxLxk) = stack(cfg, None, layout, record, name="layers")(
        x_BxLxD, jnp.arange(groups, dtype=jnp.int32), None, replay_GxPxBxLxk, *shared
      )
      # [groups, count in a group, ...] -> [layers of the kind, ...], in layer order
      flat = lambda tree: jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), tree)
      new_state = None if grouped is None else flat(grouped)
      routes_YxBxLxk = None if routes_GxPxBxLxk is None else flat(routes_GxPxBxLxk)
    else:
      types = cfg.mixer_types or pattern * cfg.num_hidden_layers
      per_layer, routes = {kind: [] for kind in set(types)}, []
      sliding_N = _sliding_layers(cfg)
      for i, kind in enumerate(types):
        window = cfg.sliding_window if sliding_N[i] else None
        index = types[:i].count(kind)
        replay_BxLxk = None if replay_YxBxLxk is None else replay_YxBxLxk[i]
        x_BxLxD, (state, routes_BxLxk) = layer_class(cfg, window, layout, kind, record, name=f"layers_{i}")(
          x_BxLxD, index, None, replay_BxLxk, *shared
        )
        per_layer[kind].append(state)
        routes.append(routes_BxLxk)
      new_state = (
        None if cache is None else {k: jax.tree.map(lambda *x: jnp.stack(x), *v) for k, v in per_layer.items()}
      )
      routes_YxBxLxk = jnp.stack(routes) if record else None
    new_cache = None
    if cache is not None:
      new_cache = dict(cache)
      if "full_attention" in new_state:  # every layer's new columns [layers, B, K, L, H] written at once, in place
        batch_axis, length_axis = CACHE_LOGICAL_AXES.index("batch"), CACHE_LOGICAL_AXES.index("length")
        new_kv = new_state["full_attention"]
        if has_ring_cache(cfg):  # the attention layers' outputs by kind (`Attention._cached_by_kind`)
          sliding_N = _sliding_layers(cfg)
          new_kv = {
            name: x[np.flatnonzero(~sliding_N if name in ("k", "v") else sliding_N)] for name, x in new_kv.items()
          }
          new_cache.update({name: _write_ring(cache[name], new_kv[name], cache_index) for name in RING_LEAVES})
        new_cache.update(
          {
            name: write_columns(cache[name], new_kv[name], cache_index, batch_axis=batch_axis, length_axis=length_axis)
            for name in ("k", "v")
            if name in cache
          }
        )
      if "linear_attention" in new_state:  # whole states: a linear layer's conv and recurrent state after the call
        new_cache.update(new_state["linear_attention"])
      if record:  # each token's experts at its column, as its keys and values
        batch_axis, length_axis = ROUTES_LOGICAL_AXES.index("batch"), ROUTES_LOGICAL_AXES.index("length")
        new_cache[ROUTES] = write_columns(
          cache[ROUTES],
          routes_YxBxLxk.astype(cache[ROUTES].dtype),
          cache_index,
          batch_axis=batch_axis,
          length_axis=length_axis,
        )
    x_BxLxD = RMSNorm(cfg.rms_norm_eps, dtype, param_dtype, offset=cfg.norm_offset, name="norm")(x_BxLxD)
    x_BxLxD = pin(x_BxLxD, ("batch", "length", "embed"))
    if sp is not None:
      x_BxLxD = x_BxLxD[:, :length]
    if return_hidden:
      return x_BxLxD, new_cache
    if self.is_initializing():
      self._create_head_params(x_BxLxD, embed)
    adapters = nn.unbox(self.variables[LORA_COLLECTION]) if self.has_variable(LORA_COLLECTION, HEAD_TARGET) else None
    return head_outputs(cfg, self.head, nn.unbox(self.variables["params"]), x_BxLxD, adapters), new_cache

  def _create_head_params(self, x_BxLxD, embed):
    """The head's parameters (with their logical axes); its math is `head_outputs`, shared with callers
    that apply the head to hidden states themselves (response positions only, in chunks)."""
    cfg, param_dtype = self.config, _DTYPES[self.config.param_dtype]
    if self.head in ("value", "reward"):
      nn.Dense(
        1,
        use_bias=self.head == "value",
        param_dtype=param_dtype,
        name="score",
        kernel_init=_init(nn.initializers.normal(INIT_STD), ("embed", None)),
        bias_init=_init(nn.initializers.zeros_init(), (None,)),
      )(x_BxLxD)
    elif not cfg.tie_word_embeddings:  # with LoRA on "lm_head" its adapter too (lora_A [D, r], lora_B [r, V])
      _linear(cfg, HEAD_TARGET, (cfg.vocab_size,), ("embed",), ("vocab",), False)(x_BxLxD)


def head_outputs(config: DecoderConfig, head: str, params, hidden_xD, adapters=None):
  """The head on final (normed) hidden states [..., D]: "lm" -> logits [..., V], "value" / "reward" ->
  scores [...]; fp32 either way. `params`: the Decoder's parameters (only the head's are read);
  `adapters`: the LoRA adapters, of which only an LM head's (target "lm_head") is read.

  The LM head multiplies in the compute dtype and accumulates in fp32 (tied: by the embedding); the
  scalar heads run in fp32.
  """
  dims = (((hidden_xD.ndim - 1,), (0,)), ((), ()))
  if head in ("value", "reward"):
    score = params["score"]
    scores_x1 = jax.lax.dot_general(hidden_xD.astype(jnp.float32), score["kernel"].astype(jnp.float32), dims)
    if "bias" in score:
      scores_x1 = scores_x1 + score["bias"].astype(jnp.float32)
    return scores_x1[..., 0]
  dtype = _DTYPES[config.dtype]
  if config.tie_word_embeddings:  # x @ embedding.T: contract with the embedding's D axis, no transpose
    embedding_VxD = params["embed_tokens"]["embedding"].astype(dtype)
    return _dot_general_f32(hidden_xD.astype(dtype), embedding_VxD, (((hidden_xD.ndim - 1,), (1,)), ((), ())))
  logits_xV = project(hidden_xD.astype(dtype), params["lm_head"]["kernel"].astype(dtype), out_dtype=jnp.float32)
  if adapters is not None and HEAD_TARGET in adapters:  # unmerged (training): x W + (x A) B * alpha / r
    lora_A_Dxr, lora_B_rxV = (adapters[HEAD_TARGET][name].astype(dtype) for name in ("lora_A", "lora_B"))
    hidden_xr = project(hidden_xD.astype(dtype), lora_A_Dxr)
    scale = config.lora_alpha / lora_A_Dxr.shape[-1]
    logits_xV = logits_xV + scale * project(hidden_xr, lora_B_rxV, out_dtype=jnp.float32)
  return logits_xV


# The KV cache's axes: [layers, B, K, S, H]. Heads before length is the layout GPU attention reads; with
# [.., S, K, H] XLA:GPU relayouts the whole stacked cache once more (a second copy of it in memory).
CACHE_LOGICAL_AXES = ("layers", "batch", "kv_heads", "length", "head_dim")


# Rollout routing replay's record in the cache: the experts each token was routed to, [layers, B, S, k]
# (`moe.route_dtype`; the k axis has no logical name: never split).
ROUTES = "routes"
ROUTES_LOGICAL_AXES = ("layers", "batch", "length", None)

LINEAR_CACHE_LOGICAL_AXES = {  # a Gated DeltaNet layer's state (`linear_attention.py`): no length axis
  "conv": ("layers", "batch", "conv_channels", "conv_window"),
  "recurrent": ("layers", "batch", "linear_heads", "linear_key_dim", "linear_value_dim"),
}


RING_LEAVES = ("sliding_k", "sliding_v")  # the sliding layers' ring (`ring_cache.py`), axes RING_LOGICAL_AXES


def has_ring_cache(config: DecoderConfig) -> bool:
  """Whether the sliding layers keep a ring of `sliding_window` columns (`ring_cache.py`): `sliding_attention`
  layers (Gemma 3) with `ring_kv_cache`."""
  return config.ring_kv_cache and "sliding_attention" in config.layer_types


def _layers_of(config: DecoderConfig, kind: str) -> int:
  """Layers with a cache of `kind`'s: "full_attention" (whole-length keys and values; the sliding layers too
  without a ring), "sliding_attention" (a ring), "linear_attention"."""
  if has_ring_cache(config) and kind != "linear_attention":
    return config.layer_types.count(kind)
  return (config.mixer_types or ("full_attention",) * config.num_hidden_layers).count(kind)


def _write_ring(ring, new, cache_index):
  """The stacked ring [layers, B, K, W, H] after a call: its new column [layers, B, K, 1, H] written at slot
  cache_index mod W (a decode step), or the whole new ring [layers, B, K, W, H] (a prefill)."""
  width = ring.shape[3]
  if new.shape[3] == width:
    return new.astype(ring.dtype)
  slot = jnp.asarray(cache_index, jnp.int32) % width
  return write_columns(ring, new, slot, batch_axis=1, length_axis=3)


def cache_axes(config: DecoderConfig, record_routes: bool = False) -> dict:
  """The logical axes of each leaf of `init_cache`'s tree: what generation reads of the cache to move its rows
  ("batch") and columns ("length") without knowing what a layer keeps (`models/decoding.py`)."""
  axes = {}
  if _layers_of(config, "full_attention"):
    axes.update(k=CACHE_LOGICAL_AXES, v=CACHE_LOGICAL_AXES)
  if has_ring_cache(config):
    axes.update({name: ring_cache.RING_LOGICAL_AXES for name in RING_LEAVES})
  if _layers_of(config, "linear_attention"):
    axes.update(LINEAR_CACHE_LOGICAL_AXES)
  if record_routes:
    axes[ROUTES] = ROUTES_LOGICAL_AXES
  return axes


def init_cache(config: DecoderConfig, batch: int, max_length: int, record_routes: bool = False):
  """The zeroed per-layer state of `batch` rows: for full-attention layers keys and values {'k', 'v'}, each
  [layers, B, kv_heads, S, head_dim] (`CACHE_LOGICAL_AXES`; one layout, scan or loop); for linear-attention layers
  their conv inputs {'conv'} [layers, B, channels, kernel - 1] and recurrent state {'recurrent'} [layers, B,
  value heads, key dim, value dim] in fp32 (`LINEAR_CACHE_LOGICAL_AXES`). The layer axis counts the layers of the
  leaf's kind. `record_routes` (a model with experts; rollout routing replay): also {'routes'} [layers, B, S, k],
  the experts each written token was routed to (`ROUTES_LOGICAL_AXES`), `moe.no_route` where none was written."""
  dtype = _DTYPES[config.dtype]
  cache = {}
  if record_routes:
    if not config.num_experts:
      raise ValueError("record_routes (rollout routing replay) needs a model with experts (num_experts > 0)")
    shape = (config.num_hidden_layers, batch, max_length, config.num_experts_per_tok)
    cache[ROUTES] = jnp.full(shape, moe.no_route(config.num_experts), moe.route_dtype(config.num_experts))
  if full := _layers_of(config, "full_attention"):
    sizes = dict(
      layers=full,
      batch=batch,
      kv_heads=config.num_key_value_heads,
      length=max_length,
      head_dim=config.resolved_head_dim,
    )
    shape = tuple(sizes[axis] for axis in CACHE_LOGICAL_AXES)
    cache.update(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype))
  if has_ring_cache(config):  # W columns whatever max_length: a prompt's ring moves into a longer cache whole
    shape = (_layers_of(config, "sliding_attention"), batch, config.num_key_value_heads, config.sliding_window)
    cache.update({name: jnp.zeros(shape + (config.resolved_head_dim,), dtype) for name in RING_LEAVES})
  if linear := _layers_of(config, "linear_attention"):
    key_dim = config.linear_num_key_heads * config.linear_key_head_dim
    channels = 2 * key_dim + config.linear_num_value_heads * config.linear_value_head_dim
    cache["conv"] = jnp.zeros((linear, batch, channels, config.linear_conv_kernel_dim - 1), dtype)
    cache["recurrent"] = jnp.zeros(
      (linear, batch, config.linear_num_value_heads, config.linear_key_head_dim, config.linear_value_head_dim),
      jnp.float32,
    )
  return cache


def kv_heads_repeated(config: DecoderConfig, repeat: int) -> DecoderConfig:
  """`config` with `repeat` copies of each key/value head: the model that reads `repeat_kv_heads`' weights."""
  group = config.num_attention_heads // config.num_key_value_heads
  if group % repeat:
    raise ValueError(f"{repeat} copies of each key/value head must divide its {group} query heads")
  return dataclasses.replace(config, num_key_value_heads=config.num_key_value_heads * repeat)


def repeat_kv_heads(params, config: DecoderConfig, repeat: int):
  """`params` of `config` (lm head) with each key/value head repeated `repeat` times: the same model as
  `kv_heads_repeated(config, repeat)`, whose key/value heads then split over more devices.

  Head k's copies are k * repeat .. k * repeat + repeat - 1, so query head q, which reads head q // G, reads
  copy q // (G / repeat) of it: the same keys and values (as the Ulysses path repeats them,
  `models/sequence_parallel.py`). `repeat` must divide G. Every weight with a `kv_heads` axis is repeated
  (k/v projections and their biases); nothing else changes.
  """
  if repeat == 1:
    return params
  _, logical = abstract_params(Decoder(dataclasses.replace(config, lora_rank=0), head="lm"))
  return jax.tree.map(
    lambda names, x: jnp.repeat(x, repeat, axis=names.index("kv_heads")) if "kv_heads" in names else x,
    logical,
    params,
    is_leaf=lambda x: isinstance(x, tuple),
  )


def params_for(config: DecoderConfig, params):
  """`params` in the layer layout of `config` (`scan_layers`), converting a tree in the other one
  (e.g. from a checkpoint written before the layer scan)."""
  layout = layer_layout(params)
  if config.scan_layers and layout == "unstacked":
    return stack_layers(params)
  if not config.scan_layers and layout == "stacked":
    return unstack_layers(params)
  return params


def positions_from_mask(mask_BxL):
  """Positions of left-padded rows: 0 at the first real token (pads get 0 too)."""
  return jnp.maximum(jnp.cumsum(mask_BxL.astype(jnp.int32), axis=-1) - 1, 0)


def last_valid_index(mask_BxL):
  """Index of each row's rightmost valid token (right or left padding alike); 0 for an empty row."""
  index_L = jnp.arange(mask_BxL.shape[-1], dtype=jnp.int32)
  return jnp.argmax(jnp.where(mask_BxL > 0, index_L, -1), axis=-1)


def reward_model_scores(model: Decoder, params, input_ids_BxL, attention_mask_BxL):
  """Reward model (head="reward") score of each sequence at its last valid token: [B] fp32."""
  if model.head != "reward":
    raise ValueError(f"reward_model_scores needs a Decoder with head='reward', got head={model.head!r}")
  mask_BxL = attention_mask_BxL.astype(jnp.int32)
  scores_BxL, _ = model.apply({"params": params}, input_ids_BxL, positions_from_mask(mask_BxL), mask_BxL)
  return jnp.take_along_axis(scores_BxL, last_valid_index(mask_BxL)[:, None], axis=-1)[:, 0]


def cast_floating(params, dtype: str):
  """The tree with every floating leaf in `dtype` ("float32" | "bfloat16"); other leaves as they are.

  Generation in bf16 casts the weights once per rollout with this, so no decode step converts them.
  """
  target = _DTYPES[dtype]
  return jax.tree.map(lambda x: x.astype(target) if jnp.issubdtype(x.dtype, jnp.floating) else x, params)


def _logical_axes(boxed):
  return jax.tree.map(lambda b: tuple(b.names), boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))


def _without_adapters(model: Decoder) -> Decoder:
  """The same model with LoRA off: its weights must not depend on the adapters (their init draws keys)."""
  if not model.config.lora_rank:
    return model
  return Decoder(dataclasses.replace(model.config, lora_rank=0), head=model.head)


def init_params(model: Decoder, rng, seq_len: int = 8):
  """Returns (params, logical_axes): raw arrays and a same-shaped tree of logical-axis tuples.

  The same weights for a key whether or not the config has LoRA (the adapters: `init_adapters`)."""
  ids = jnp.zeros((1, seq_len), jnp.int32)
  boxed = _without_adapters(model).init(rng, ids, positions_from_mask(jnp.ones_like(ids)), jnp.ones_like(ids))
  return nn.unbox(boxed["params"]), _logical_axes(boxed["params"])


def abstract_params(model: Decoder, seq_len: int = 8):
  """Shapes and logical axes without allocating: for building shardings before init."""
  boxed = jax.eval_shape(
    lambda: model.init(
      jax.random.key(0),
      jnp.zeros((1, seq_len), jnp.int32),
      jnp.zeros((1, seq_len), jnp.int32),
      jnp.ones((1, seq_len), jnp.int32),
    )["params"]
  )
  return nn.unbox(boxed), _logical_axes(boxed)


def _init_variables(model: Decoder, rng, seq_len: int):
  ids = jnp.zeros((1, seq_len), jnp.int32)
  return model.init(rng, ids, positions_from_mask(jnp.ones_like(ids)), jnp.ones_like(ids))


def init_adapters(model: Decoder, rng, seq_len: int = 8):
  """Fresh LoRA adapters (`config.lora_rank` > 0; A random, B zero): (adapters, logical_axes).

  Under jit only the "lora" collection is computed: the base's init is dead code XLA drops.
  """
  boxed = _init_variables(model, rng, seq_len)[LORA_COLLECTION]
  return nn.unbox(boxed), _logical_axes(boxed)


def abstract_adapters(model: Decoder, seq_len: int = 8):
  """The adapters' shapes and logical axes without allocating (None, None without LoRA)."""
  if not model.config.lora_rank:
    return None, None
  boxed = jax.eval_shape(lambda: _init_variables(model, jax.random.key(0), seq_len)[LORA_COLLECTION])
  return nn.unbox(boxed), _logical_axes(boxed)


def model_variables(params, adapters=None) -> dict:
  """What `Decoder.apply` takes: the params, plus the LoRA adapters when given (None: the base model)."""
  return {"params": params} if adapters is None else {"params": params, LORA_COLLECTION: adapters}
