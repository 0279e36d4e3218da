"""Hugging Face checkpoints in and out: config.json <-> DecoderConfig, *.safetensors <-> param trees.

Reading never runs checkpoint code (no `trust_remote_code`) and never unpickles (`.bin` weights are
refused). Each tensor is read once on the host with `safetensors.safe_open(framework="numpy")`,
converted to our layout (HF linears are [out, in]; ours are [in, out], with q/k/v/o split into
[embed, heads, head_dim]) and placed straight into its target sharding with
`jax.make_array_from_callback`, so each device receives only its slice and the host holds one tensor
at a time, never a copy of the model per device. Scanned layers (`scan_layers`) stack HF's per-layer
tensors `model.layers.<i>.*` along a leading axis of one leaf `layers/...`: each layer is placed on its
own, then the device stacks them; export slices the stacked leaf back into per-layer tensors.

Heads and HF classes: head="lm" <-> `*ForCausalLM`, head="value" <-> `*ForTokenClassification`
(num_labels=1, `score.weight` + `score.bias`: verl's critic format), head="reward" <->
`*ForSequenceClassification` (num_labels=1, `score.weight`).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import math
import os
import re
import shutil
from typing import Any

import jax
import ml_dtypes
import numpy as np

from jaxrlhf.config import resolve_target_modules
from jaxrlhf.errors import CheckpointError
from jaxrlhf.models import gemma3, gpt_oss, qwen3_5
from jaxrlhf.models.decoder import ACTIVATIONS, HEADS, INIT_STD, Decoder, DecoderConfig, abstract_params, params_for

log = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES = {
  "llama": "Llama",
  "qwen2": "Qwen2",
  "qwen3": "Qwen3",
  "mistral": "Mistral",
  "qwen3_5_text": "Qwen3_5",  # the hybrid family (`models/qwen3_5.py`); `qwen3_5` checkpoints load as their text model
  "qwen3_moe": "Qwen3Moe",  # mixture of experts (`models/moe.py`)
  "qwen3_5_moe_text": "Qwen3_5Moe",  # the hybrid family with experts and a shared expert; also `qwen3_5_moe`'s text
  "gemma3_text": "Gemma3",  # interleaved sliding and full attention (`models/gemma3.py`); also `gemma3`'s text model
  "gpt_oss": "GptOss",  # sliding/full layers, attention sinks, YaRN, biased clamped experts (`models/gpt_oss.py`)
}
HEAD_ARCHITECTURE_SUFFIX = {
  "lm": "ForCausalLM",
  "value": "ForTokenClassification",
  "reward": "ForSequenceClassification",
}
SUPPORTED_ARCHITECTURES = (
  tuple(prefix + suffix for prefix in SUPPORTED_MODEL_TYPES.values() for suffix in HEAD_ARCHITECTURE_SUFFIX.values())
  + qwen3_5.MULTIMODAL_ARCHITECTURES
  + gemma3.MULTIMODAL_ARCHITECTURES
  + gemma3.TEXT_ARCHITECTURES
)
# A multimodal checkpoint's text model: its tensors' prefix in place of `model.` (Qwen3.5 and Gemma 3 files written
# by transformers v5; Gemma 3's released files), and the towers beside it, which are skipped.
TEXT_MODEL_PREFIXES = (qwen3_5.TEXT_PREFIX, gemma3.TEXT_PREFIX)
VISION_PREFIXES = qwen3_5.VISION_PREFIXES + gemma3.VISION_PREFIXES
_NUMPY_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}
_PICKLE_PATTERNS = ("pytorch_model*.bin", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")
_INDEX_FILE = "model.safetensors.index.json"
# Tensors some checkpoints carry that we recompute or do not use.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# Besides config.json and the weights, what a model directory needs: the tokenizer and generation config.
MODEL_DIR_FILES = (
  "generation_config.json",
  "tokenizer.json",
  "tokenizer_config.json",
  "special_tokens_map.json",
  "added_tokens.json",
  "vocab.json",
  "merges.txt",
  "vocab.txt",
  "tokenizer.model",
  "spiece.model",
  "chat_template.jinja",
  "chat_template.json",
)
TOKENIZER_SUFFIXES = (".tiktoken",)


# ----- config ------------------------------------------------------------------------------------


def _read_json(path: str) -> dict[str, Any]:
  try:
    with open(path) as f:
      return json.load(f)
  except FileNotFoundError:
    raise CheckpointError(f"{path} not found: a Hugging Face checkpoint directory needs a config.json") from None
  except json.JSONDecodeError as e:
    raise CheckpointError(f"{path} is not valid JSON: {e}") from None


def _rope_fields(hf: dict[str, Any], where: str, partial_rotary: bool = False, yarn: bool = False) -> dict[str, Any]:
  """RoPE settings from transformers-v5 `rope_parameters` or v4 `rope_theta` + `rope_scaling`; YaRN where `yarn` (the
  families whose export writes it back: gpt_oss)."""
  params = dict(hf.get("rope_parameters") or {})
  if params and all(isinstance(v, dict) for v in params.values()):
    raise CheckpointError(f"{where}: per-layer-type rope_parameters {sorted(params)} are not supported")
  scaling = dict(hf.get("rope_scaling") or {})
  merged = {**scaling, **params}
  theta = merged.get("rope_theta", hf.get("rope_theta"))
  rope_type = merged.get("rope_type", merged.get("type")) or "default"
  fields: dict[str, Any] = {"rope_theta": float(theta) if theta is not None else 10000.0, "rope_type": rope_type}
  partial = merged.get("partial_rotary_factor", hf.get("partial_rotary_factor"))
  if partial not in (None, 1, 1.0) and not partial_rotary:
    raise CheckpointError(f"{where}: partial_rotary_factor={partial} is not supported (only 1.0)")
  if rope_type == "default":
    return fields
  if rope_type == "linear":
    return {**fields, "rope_factor": float(merged["factor"])}
  if rope_type == "llama3":
    try:
      return {
        **fields,
        "rope_factor": float(merged["factor"]),
        "rope_low_freq_factor": float(merged["low_freq_factor"]),
        "rope_high_freq_factor": float(merged["high_freq_factor"]),
        "rope_original_max_position_embeddings": int(
          merged.get("original_max_position_embeddings", hf.get("max_position_embeddings", 8192))
        ),
      }
    except KeyError as e:
      raise CheckpointError(f"{where}: llama3 rope scaling is missing {e.args[0]!r}") from None
  if rope_type == "yarn" and yarn:
    return {**fields, **_yarn_fields(merged, hf, where)}
  supported = "default, linear, llama3" + (", yarn" if yarn else "")
  raise CheckpointError(f"{where}: rope_type={rope_type!r} is not supported; supported: {supported}")


def _yarn_fields(rope: dict[str, Any], hf: dict[str, Any], where: str) -> dict[str, Any]:
  """YaRN's fields (HF `_compute_yarn_parameters`): its attention factor as HF settles it when not given."""
  if rope.get("original_max_position_embeddings") is None:
    raise CheckpointError(f"{where}: yarn rope scaling is missing 'original_max_position_embeddings'")
  old_context = int(rope["original_max_position_embeddings"])
  factor = rope.get("factor")
  factor = float(factor) if factor is not None else hf["max_position_embeddings"] / old_context
  mscale = lambda scale, m=1.0: 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0
  attention_factor = rope.get("attention_factor")
  if attention_factor is None:
    m, m_all = rope.get("mscale"), rope.get("mscale_all_dim")
    attention_factor = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
  return {
    "rope_factor": factor,
    "rope_original_max_position_embeddings": old_context,
    "rope_beta_fast": float(rope.get("beta_fast") or 32),
    "rope_beta_slow": float(rope.get("beta_slow") or 1),
    "rope_truncate": bool(rope.get("truncate", True)),
    "rope_attention_factor": float(attention_factor),
  }


MOE_MODEL_TYPES = ("qwen3_moe", "qwen3_5_moe_text")
_MOE_KEYS = ("num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size", "decoder_sparse_step")


def _moe_fields(hf: dict[str, Any], model_type: str) -> dict[str, Any]:
  """The experts' fields of a mixture-of-experts config (`models/moe.py`); the load-balancing loss's coefficient
  only where HF would add the loss (`output_router_logits`)."""
  if model_type not in MOE_MODEL_TYPES:
    return {}
  fields = {key: int(hf[key]) for key in _MOE_KEYS if hf.get(key) is not None}
  experts = hf.get("num_experts", hf.get("num_local_experts"))
  return dict(
    fields,
    num_experts=int(experts) if experts is not None else None,
    norm_topk_prob=bool(hf.get("norm_topk_prob", model_type == "qwen3_5_moe_text")),
    mlp_only_layers=tuple(int(i) for i in hf.get("mlp_only_layers") or ()),
    router_aux_loss_coef=float(hf.get("router_aux_loss_coef", 0.001)) if hf.get("output_router_logits") else 0.0,
  )


def _moe_config_keys(config: DecoderConfig) -> dict[str, Any]:
  """The experts' keys of an exported config.json (`_moe_fields` backwards)."""
  keys = dict(
    num_experts=config.num_experts,
    num_experts_per_tok=config.num_experts_per_tok,
    moe_intermediate_size=config.moe_intermediate_size,
    norm_topk_prob=config.norm_topk_prob,
    decoder_sparse_step=config.decoder_sparse_step,
    mlp_only_layers=list(config.mlp_only_layers),
    output_router_logits=config.router_aux_loss_coef > 0,
    router_aux_loss_coef=config.router_aux_loss_coef or 0.001,
  )
  if config.model_type == "qwen3_5_moe_text":
    keys.update(shared_expert_intermediate_size=config.shared_expert_intermediate_size)
    keys.pop("decoder_sparse_step"), keys.pop("mlp_only_layers"), keys.pop("norm_topk_prob")
  return keys


def _sliding_window_fields(hf: dict[str, Any], model_type: str, where: str) -> dict[str, Any]:
  window = hf.get("sliding_window")
  if model_type == "mistral":
    return {"sliding_window": int(window)} if window else {}
  if model_type in ("qwen2", "qwen3", "qwen3_moe"):
    layer_types = hf.get("layer_types")
    if layer_types and "sliding_attention" in layer_types:
      start = layer_types.index("sliding_attention")
      if any(t != "sliding_attention" for t in layer_types[start:]) or not window:
        raise CheckpointError(
          f"{where}: layer_types {layer_types} (sliding window {window}) are not supported: "
          "only sliding attention on a final run of layers"
        )
      return {"sliding_window": int(window), "sliding_window_start_layer": start}
    if hf.get("use_sliding_window") and window and not layer_types:
      return {"sliding_window": int(window), "sliding_window_start_layer": int(hf.get("max_window_layers", 0))}
  return {}


# Families close to a supported one, refused saying what they add that jaxrlhf does not build yet.
_GEMMA4 = (
  "Gemma 4's text model adds per-layer inputs (a second embedding of vocab_size_per_layer_input tokens into "
  "hidden_size_per_layer_input features per layer, gated into every layer's output), layers that reuse an earlier "
  "layer's keys and values (num_kv_shared_layers), and optionally an experts block (enable_moe_block) and a "
  "double-wide MLP; Gemma 3 (gemma3_text, gemma3) loads"
)
NOT_YET = {"gemma4": _GEMMA4, "gemma4_text": _GEMMA4}


def config_from_hf_dict(hf: dict[str, Any], where: str = "config.json", **overrides) -> DecoderConfig:
  """DecoderConfig from the contents of an HF config.json; `overrides` set our own fields (dtype, ...)."""
  hf = gemma3.text_config(qwen3_5.text_config(hf))  # a multimodal checkpoint: its text model
  try:
    hf = gpt_oss.text_config(hf)
  except gpt_oss.UnsupportedGptOss as e:
    raise CheckpointError(f"{where}: {e}") from None
  model_type = hf.get("model_type")
  if model_type in NOT_YET:
    raise CheckpointError(f"{where}: model_type={model_type!r} is not supported yet: {NOT_YET[model_type]}")
  if model_type not in SUPPORTED_MODEL_TYPES:
    raise CheckpointError(
      f"{where}: model_type={model_type!r} is not supported; supported model types: {sorted(SUPPORTED_MODEL_TYPES)}"
    )
  architectures = hf.get("architectures") or []
  unknown = [a for a in architectures if a not in SUPPORTED_ARCHITECTURES]
  if unknown:
    raise CheckpointError(
      f"{where}: architectures {unknown} are not supported; supported architectures: {list(SUPPORTED_ARCHITECTURES)}"
    )
  activation_key = "hidden_activation" if model_type == gemma3.MODEL_TYPE else "hidden_act"
  if hf.get(activation_key, "silu") not in ACTIVATIONS:
    raise CheckpointError(
      f"{where}: {activation_key}={hf[activation_key]!r} is not supported; one of {list(ACTIVATIONS)}"
    )
  family: dict[str, Any] = {}
  rope_source = hf
  if model_type == gemma3.MODEL_TYPE:
    try:
      family = gemma3.config_fields(hf)
    except gemma3.UnsupportedGemma3 as e:
      raise CheckpointError(f"{where}: {e}") from None
    rope_source = {"rope_parameters": gemma3.rope_by_layer_type(hf)["full_attention"]}
  elif model_type == gpt_oss.MODEL_TYPE:
    try:
      family = gpt_oss.config_fields(hf)
    except gpt_oss.UnsupportedGptOss as e:
      raise CheckpointError(f"{where}: {e}") from None
  head_dim = hf.get("head_dim")
  if head_dim is None and model_type == "qwen3":
    head_dim = 128  # Qwen3Config's default
  if head_dim is None and hf.get("hidden_size") and hf.get("num_attention_heads"):
    head_dim = hf["hidden_size"] // hf["num_attention_heads"]  # explicit, so a config equals its export's
  attention_bias = bool(hf.get("attention_bias", False))
  fields: dict[str, Any] = dict(
    vocab_size=hf.get("vocab_size"),
    hidden_size=hf.get("hidden_size"),
    intermediate_size=hf.get("intermediate_size") or hf.get("moe_intermediate_size"),  # qwen3_5_moe has none
    num_hidden_layers=hf.get("num_hidden_layers"),
    num_attention_heads=hf.get("num_attention_heads"),
    num_key_value_heads=hf.get("num_key_value_heads") or hf.get("num_attention_heads"),
    head_dim=head_dim,
    rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
    tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
    max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
    model_type=model_type,
    qkv_bias=True if model_type == "qwen2" else attention_bias and model_type != "mistral",
    o_bias=attention_bias and model_type in ("llama", "qwen3", "qwen3_moe"),
    mlp_bias=bool(hf.get("mlp_bias", False)) and model_type == "llama",
    qk_norm=model_type in ("qwen3", "qwen3_moe"),
    **_rope_fields(
      rope_source,
      where,
      partial_rotary=model_type in qwen3_5.TEXT_MODEL_TYPES,
      yarn=model_type == gpt_oss.MODEL_TYPE,
    ),
    **_sliding_window_fields(hf, model_type, where),
    **_moe_fields(hf, model_type),
  )
  if model_type in qwen3_5.TEXT_MODEL_TYPES:
    fields.update(qwen3_5.config_fields(hf))
  fields.update(family)
  fields.update(overrides)
  try:
    return DecoderConfig.from_dict(fields)
  except (TypeError, ValueError) as e:
    raise CheckpointError(f"{where}: {e}") from None


def load_hf_config(path: str, **overrides) -> DecoderConfig:
  """Reads `path/config.json`; `overrides` set fields HF does not have (dtype, param_dtype, remat_policy)."""
  config_path = os.path.join(path, "config.json")
  return config_from_hf_dict(_read_json(config_path), config_path, **overrides)


def compute_settings(model) -> dict[str, Any]:
  """A model section's compute keys as DecoderConfig fields: dtype, param_dtype, remat_policy, scan_layers,
  attention_impl, attention_block_size, the LoRA keys (the last three default as DecoderConfig's when a config saved
  before they existed lacks them)."""
  defaults = {f.name: f.default for f in dataclasses.fields(DecoderConfig)}
  layout = {key: model.get(key, defaults[key]) for key in ("scan_layers", "attention_impl", "attention_block_size")}
  layout["linear_chunk_size"] = model.get("linear_attention_chunk_size", defaults["linear_chunk_size"])
  # LoRA: rank 0 (off) for a config saved before the keys existed.
  lora = dict(
    lora_rank=model.get("lora_rank", 0),
    lora_alpha=float(model.get("lora_alpha", 16)),
    lora_targets=resolve_target_modules(model.get("target_modules", "all-linear")),
  )
  return dict(
    dtype=model.dtype,
    param_dtype=model.param_dtype,
    remat_policy=model.remat_policy if model.enable_gradient_checkpointing else "none",
    **layout,
    **lora,
  )


def model_config_from(model, tokenizer=None) -> DecoderConfig:
  """A model section (actor_rollout_ref.model or critic.model) -> DecoderConfig.

  With `path`: the checkpoint's config.json, then any non-empty override_config key on top.
  Without: override_config alone (a model initialised from scratch).
  """
  overrides = {k: v for k, v in model.override_config.to_dict().items() if v is not None}
  extra = compute_settings(model)
  if model.path:
    config_path = os.path.join(model.path, "config.json")
    if not os.path.exists(config_path):
      raise CheckpointError(
        f"model path {model.path!r} has no config.json (expected a Hugging Face checkpoint directory)"
      )
    model_config = config_from_hf_dict({**_read_json(config_path), **overrides}, where=config_path, **extra)
  elif overrides.get("model_type", "llama") != "llama":  # a from-scratch model of another family: its config.json
    model_config = config_from_hf_dict(overrides, where="actor_rollout_ref.model.override_config", **extra)
  else:
    model_config = DecoderConfig.from_dict({**overrides, **extra})
  if tokenizer is not None and len(tokenizer) > model_config.vocab_size:
    raise CheckpointError(
      f"the model's vocab_size={model_config.vocab_size} is smaller than the tokenizer's {len(tokenizer)} tokens"
    )
  return model_config


def critic_config_from(config, actor_config: DecoderConfig, tokenizer=None) -> DecoderConfig:
  """The critic's DecoderConfig of a run's config: the actor's architecture (`actor_config`) unless
  `critic.model.path` names another checkpoint; the critic's own compute and LoRA keys either way."""
  actor_model, critic_model = config.actor_rollout_ref.model, config.critic.model
  if critic_model.path and critic_model.path != actor_model.path:
    return model_config_from(critic_model, tokenizer)
  return dataclasses.replace(actor_config, **compute_settings(critic_model))


def hf_config_dict(
  config: DecoderConfig, head: str = "lm", base: dict[str, Any] | None = None, dtype: str | None = None
) -> dict[str, Any]:
  """An HF config.json dict for `config` (v4 `rope_theta`/`rope_scaling` form, which v4 and v5 both read).

  `base` (e.g. the source checkpoint's config) keeps keys we do not model: token ids, names, ...
  """
  _check_head(head)
  model_type = config.model_type
  if model_type not in SUPPORTED_MODEL_TYPES:
    raise CheckpointError(f"model_type={model_type!r} cannot be exported; supported: {sorted(SUPPORTED_MODEL_TYPES)}")
  problems = []
  if model_type == "qwen2" and (not config.qkv_bias or config.o_bias or config.mlp_bias):
    problems.append("qwen2 needs qkv_bias=True, o_bias=False, mlp_bias=False")
  if model_type in ("llama", "qwen3", "qwen3_moe") and config.qkv_bias != config.o_bias:
    problems.append(f"{model_type} has one attention_bias for q/k/v and o (qkv_bias == o_bias)")
  if model_type != "llama" and config.mlp_bias:
    problems.append(f"{model_type} has no mlp_bias")
  if model_type == "mistral" and (config.qkv_bias or config.o_bias):
    problems.append("mistral has no attention biases")
  if model_type in qwen3_5.TEXT_MODEL_TYPES:
    problems.extend(qwen3_5.config_problems(config))
  elif model_type == gemma3.MODEL_TYPE:
    problems.extend(gemma3.config_problems(config))
  elif model_type == gpt_oss.MODEL_TYPE:
    problems.extend(gpt_oss.config_problems(config))
  elif config.qk_norm != (model_type in ("qwen3", "qwen3_moe")):
    problems.append("q/k norm exists in qwen3 and qwen3_moe only, and always")
  if config.layer_types and model_type not in qwen3_5.TEXT_MODEL_TYPES + (gemma3.MODEL_TYPE, gpt_oss.MODEL_TYPE):
    problems.append("layers of several kinds exist in qwen3_5_text, qwen3_5_moe_text, gemma3_text and gpt_oss only")
  if config.attention_sinks and model_type != gpt_oss.MODEL_TYPE:
    problems.append("attention sinks exist in gpt_oss only")
  if config.rope_type == "yarn" and model_type != gpt_oss.MODEL_TYPE:
    problems.append("yarn RoPE is written for gpt_oss only")
  gemma_fields = ("rope_local_base_freq", "query_pre_attn_scalar", "embed_scale", "sandwich_norms")
  if model_type != gemma3.MODEL_TYPE and (
    config.hidden_activation != "silu" or any(getattr(config, name) for name in gemma_fields)
  ):
    problems.append(f"a gelu-tanh MLP and {', '.join(gemma_fields)} exist in gemma3_text only")
  if bool(config.num_experts) != (model_type in MOE_MODEL_TYPES + (gpt_oss.MODEL_TYPE,)):
    problems.append(f"experts exist in {', '.join(MOE_MODEL_TYPES)} and gpt_oss only, and always")
  if config.shared_expert_intermediate_size and model_type != "qwen3_5_moe_text":
    problems.append("a shared expert exists in qwen3_5_moe_text only")
  if config.sliding_window and model_type == "llama":
    problems.append("llama has no sliding window")
  if config.sliding_window and model_type == "mistral" and config.sliding_window_start_layer:
    problems.append("mistral's sliding window covers every layer")
  if problems:
    raise CheckpointError(f"config cannot be written as HF model_type={model_type!r}: " + "; ".join(problems))

  hf = {
    k: v
    for k, v in _text_base(base).items()
    if k
    not in (
      "rope_parameters",
      "rope_scaling",
      "auto_map",
      "num_labels",
      "id2label",
      "label2id",
      "layer_types",
      "num_local_experts",  # HF v5's name of num_experts, written below
      "torch_dtype",
      "dtype",
      "transformers_version",
    )
  }
  hf.update(
    architectures=[SUPPORTED_MODEL_TYPES[model_type] + HEAD_ARCHITECTURE_SUFFIX[head]],
    model_type=model_type,
    vocab_size=config.vocab_size,
    hidden_size=config.hidden_size,
    intermediate_size=config.intermediate_size,
    num_hidden_layers=config.num_hidden_layers,
    num_attention_heads=config.num_attention_heads,
    num_key_value_heads=config.num_key_value_heads,
    head_dim=config.resolved_head_dim,
    hidden_act="silu",
    rms_norm_eps=config.rms_norm_eps,
    tie_word_embeddings=config.tie_word_embeddings,
    max_position_embeddings=config.max_position_embeddings,
    rope_theta=config.rope_theta,
    torch_dtype=dtype or config.param_dtype,
  )
  if config.rope_type == "linear":
    hf["rope_scaling"] = {"rope_type": "linear", "factor": config.rope_factor}
  elif config.rope_type == "llama3":
    hf["rope_scaling"] = {
      "rope_type": "llama3",
      "factor": config.rope_factor,
      "low_freq_factor": config.rope_low_freq_factor,
      "high_freq_factor": config.rope_high_freq_factor,
      "original_max_position_embeddings": config.rope_original_max_position_embeddings,
    }
  else:
    hf["rope_scaling"] = None
  if model_type in ("llama", "qwen3", "qwen3_moe"):
    hf["attention_bias"] = config.qkv_bias
  if model_type == "llama":
    hf["mlp_bias"] = config.mlp_bias
  if model_type == "mistral":
    hf["sliding_window"] = config.sliding_window
  if model_type in qwen3_5.TEXT_MODEL_TYPES:
    hf.pop("rope_theta")
    hf.pop("rope_scaling")
    hf.update(qwen3_5.hf_config_fields(config))
  if model_type == gemma3.MODEL_TYPE:
    full_rope = {"rope_type": "default", **(hf.pop("rope_scaling") or {}), "rope_theta": hf.pop("rope_theta")}
    hf.pop("hidden_act")
    hf.update(gemma3.hf_config_fields(config, full_rope))
    if head == "reward":
      hf["architectures"] = ["Gemma3TextForSequenceClassification"]
  if model_type in MOE_MODEL_TYPES:
    hf.update(_moe_config_keys(config))
  if model_type == gpt_oss.MODEL_TYPE:
    rope = {"rope_type": config.rope_type, "rope_theta": hf.pop("rope_theta"), **(hf.pop("rope_scaling") or {})}
    if config.rope_type == "yarn":
      rope.update(
        factor=config.rope_factor,
        beta_fast=config.rope_beta_fast,
        beta_slow=config.rope_beta_slow,
        truncate=config.rope_truncate,
        original_max_position_embeddings=config.rope_original_max_position_embeddings,
        attention_factor=config.rope_attention_factor,
      )
    hf.update(gpt_oss.hf_config_fields(config), rope_parameters=rope)
  if model_type in ("qwen2", "qwen3", "qwen3_moe"):
    hf["use_sliding_window"] = config.sliding_window is not None
    hf["sliding_window"] = config.sliding_window
    hf["max_window_layers"] = config.sliding_window_start_layer if config.sliding_window else config.num_hidden_layers
  if head != "lm":
    hf["id2label"] = {"0": "LABEL_0"}
    hf["label2id"] = {"LABEL_0": 0}
  return hf


def _text_base(base: dict[str, Any] | None) -> dict[str, Any]:
  """A multimodal checkpoint's config.json as its text model's (what the export is): the `text_config`'s keys over
  the outer ones (token ids), without the sub-configs, which a text model's config cannot hold."""
  base = dict(base or {})
  text = base.pop("text_config", None) or {}
  base.pop("vision_config", None)
  return {**base, **text}


# ----- the name map ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _TensorSpec:
  hf_name: str
  path: tuple[str, ...]  # key path in our param tree
  kind: str  # "copy" | "linear" (HF [out,in] <-> ours [in,out]) | "in_heads" | "out_heads"
  layer: int | None = None  # scanned layers: this HF tensor is slice `layer` of the stacked leaf at `path`
  expert: int | None = None  # an expert's projection: slice `expert` of the (layer's) [E, ...] leaf

  def slice_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of this tensor's slice of a leaf of `shape` (less the stacked layer and the expert axes)."""
    return shape[(self.layer is not None) + (self.expert is not None) :]


def _check_head(head: str):
  if head not in HEADS:
    raise ValueError(f"head={head!r} is not one of {HEADS}")


def _flatten(tree, prefix=()):
  for key, value in tree.items():
    if isinstance(value, dict):
      yield from _flatten(value, prefix + (key,))
    else:
      yield prefix + (key,), value


def _tensor_specs(shapes) -> list[_TensorSpec]:
  """One spec per HF tensor: a leaf of our param tree (flattened), or one layer's slice of a stacked leaf
  (`layers/...`, scanned layers), with its HF name; an expert's projection is one expert's slice of that
  (`mlp/experts/gate_proj/kernel` [layers, E, D, F] -> HF's `mlp.experts.{e}.gate_proj.weight` [F, D] per layer)."""
  specs = []
  for spec in _leaf_specs(shapes):
    if ".mlp.experts." not in spec.hf_name or spec.path[-1] in gpt_oss.EXPERT_AXES:  # gpt-oss's: all experts in one
      specs.append(spec)
      continue
    experts = _flatten_shape(shapes, spec.path)[spec.layer is not None]
    head, tail = spec.hf_name.split(".mlp.experts.")
    specs.extend(dataclasses.replace(spec, hf_name=f"{head}.mlp.experts.{e}.{tail}", expert=e) for e in range(experts))
  return specs


def _flatten_shape(shapes, path: tuple[str, ...]) -> tuple[int, ...]:
  node = shapes
  for key in path:
    node = node[key]
  return tuple(node.shape)


def _leaf_specs(shapes) -> list[_TensorSpec]:
  specs = []
  # A hybrid stack scans groups of `period` layers (`decoder.layer_pattern`): layer j of group g is HF's g * period + j.
  grouped = "layers" in shapes and all(name.isdigit() for name in shapes["layers"])
  period = len(shapes["layers"]) if grouped else 1
  for path, shaped in _flatten(shapes):
    module, leaf = path[:-1], path[-1]
    hf_leaf = "weight" if leaf in ("kernel", "embedding", "weight") else leaf if leaf in _NAMED_LEAVES else "bias"
    layers: list[int | None] = [None]
    if module[0] == "layers" and grouped:
      position, layers = int(module[1]), list(range(shaped.shape[0]))
      hf_module = "model.layers.{}" + "".join("." + m for m in module[2:])
      name = module[-1]
      specs.extend(
        _TensorSpec(f"{hf_module.format(g * period + position)}.{hf_leaf}", path, _kind(name, leaf), g) for g in layers
      )
      continue
    if module[0] == "layers":
      layers = list(range(shaped.shape[0]))
      hf_module = "model.layers.{}" + "".join("." + m for m in module[1:])
    elif module[0].startswith("layers_"):
      hf_module = "model.layers." + module[0][len("layers_") :] + "".join("." + m for m in module[1:])
    elif module[0] in ("embed_tokens", "norm"):
      hf_module = "model." + module[0]
    else:  # lm_head, score
      hf_module = module[0]
    kind = _kind(module[-1], leaf)
    specs.extend(_TensorSpec(f"{hf_module.format(layer)}.{hf_leaf}", path, kind, layer) for layer in layers)
  return specs


# Parameters HF names as they are (no weight/bias): Gated DeltaNet's, gpt-oss's attention sinks and fused experts.
_NAMED_LEAVES = ("A_log", "dt_bias", "sinks") + tuple(gpt_oss.EXPERT_AXES)


def _kind(name: str, leaf: str) -> str:
  """How module `name`'s leaf maps to its HF tensor (`_TensorSpec.kind`)."""
  if name == "conv1d":
    return "conv"
  if leaf == "embedding" or "norm" in name or leaf == "weight":
    return "copy"
  if name in ("q_proj", "k_proj", "v_proj", "in_proj_z"):
    return "in_heads"
  if name in ("o_proj", "out_proj"):
    return "out_heads" if leaf == "kernel" else "copy"
  return "linear" if leaf == "kernel" else "copy"


def _hf_shape(spec: _TensorSpec, shape: tuple[int, ...]) -> tuple[int, ...]:
  """The HF tensor's shape for our leaf (of one layer: `shape` without the stacked layer axis)."""
  leaf = spec.path[-1]
  if spec.kind == "linear":
    return shape[::-1]
  if spec.kind == "in_heads":  # ours [D, N, H] / bias [N, H]; HF [N*H, D] / [N*H]
    return (shape[1] * shape[2], shape[0]) if leaf == "kernel" else (shape[0] * shape[1],)
  if spec.kind == "out_heads":  # ours [N, H, D]; HF [D, N*H]
    return (shape[2], shape[0] * shape[1])
  if spec.kind == "conv":  # ours [C, W]; HF's depthwise Conv1d [C, 1, W]
    return (shape[0], 1, shape[1])
  return tuple(shape)


def _to_ours(spec: _TensorSpec, array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
  if spec.kind == "linear":
    return array.T
  if spec.kind == "in_heads":
    return (array.T if array.ndim == 2 else array).reshape(shape)
  if spec.kind == "out_heads":
    return array.T.reshape(shape)
  if spec.kind == "conv":
    return array.reshape(shape)
  return array


def _to_hf(spec: _TensorSpec, array: np.ndarray) -> np.ndarray:
  if spec.kind == "linear":
    return array.T
  if spec.kind == "in_heads":
    return array.reshape(array.shape[0], -1).T if array.ndim == 3 else array.reshape(-1)
  if spec.kind == "out_heads":
    return array.reshape(-1, array.shape[-1]).T
  if spec.kind == "conv":
    return array[:, None, :]
  return array


# ----- reading -----------------------------------------------------------------------------------


def refuse_pickled_weights(path: str) -> None:
  """Raises if `path` has pickle-based weights and no safetensors (we never unpickle)."""
  if glob.glob(os.path.join(path, "*.safetensors")):
    return
  pickled = sorted(
    {os.path.basename(file) for pattern in _PICKLE_PATTERNS for file in glob.glob(os.path.join(path, pattern))}
  )
  if pickled:
    raise CheckpointError(
      f"{path} holds pickled PyTorch weights {pickled}; jaxrlhf never unpickles checkpoints. Convert them to "
      "safetensors first, e.g. in a trusted environment: AutoModelForCausalLM.from_pretrained(path)"
      ".save_pretrained(path, safe_serialization=True)"
    )
  raise CheckpointError(f"{path} has no *.safetensors weight files")


def _weight_files(path: str) -> dict[str, str]:
  """HF tensor name -> safetensors file, from the index if there is one, else from the files' headers."""
  from safetensors import safe_open

  refuse_pickled_weights(path)
  index_path = os.path.join(path, _INDEX_FILE)
  if os.path.exists(index_path):
    weight_map = _read_json(index_path).get("weight_map")
    if not isinstance(weight_map, dict):
      raise CheckpointError(f"{index_path} has no 'weight_map'")
    files = {name: os.path.join(path, file) for name, file in weight_map.items()}
    for file in sorted(set(files.values())):
      if not os.path.exists(file):
        raise CheckpointError(f"{index_path} lists {os.path.basename(file)}, which is not in {path}")
    return files
  files = {}
  # `consolidated*.safetensors` (Mistral's own naming) duplicates the HF-named files next to it.
  for file in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
    if os.path.basename(file).startswith("consolidated"):
      continue
    with safe_open(file, framework="numpy") as f:
      files.update({name: file for name in f.keys()})
  return files


def _place(array: np.ndarray, sharding):
  if sharding is None:
    return jax.device_put(array)
  # Each device's callback slices only its shard out of the one host copy.
  return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])


@dataclasses.dataclass
class _ReadPlan:
  """What `load_hf_params` reads: tensor specs by file, our shapes, and whether the value head is fresh."""

  specs: list
  files: dict[str, str]
  shape_of: dict
  fresh_head: bool | str


def _read_plan(path: str, config: DecoderConfig, head: str, warn_unused: bool = True) -> _ReadPlan:
  """Checks the checkpoint at `path` against `config` from the safetensors headers alone (no tensor is read).

  Raises CheckpointError for missing tensors, a tensor whose shape differs from the config's, and
  layers beyond `num_hidden_layers` (a config.json that would silently train a truncated model).
  """
  from safetensors import safe_open

  _check_head(head)
  shapes, _ = abstract_params(Decoder(config, head=head))
  specs = _tensor_specs(shapes)
  files = _weight_files(path)
  shape_of = dict(_flatten(shapes))
  text_prefix = next((p for p in TEXT_MODEL_PREFIXES if any(name.startswith(p) for name in files)), None)
  if text_prefix is not None:  # a multimodal (*ForConditionalGeneration) checkpoint
    specs = [dataclasses.replace(s, hf_name=_text_model_name(s.hf_name, text_prefix)) for s in specs]
    vision = [n for n in files if n.startswith(VISION_PREFIXES)]
    if vision:
      log.info("%s: the vision tower's %d tensors are skipped (the text model is trained)", path, len(vision))
    files = {n: f for n, f in files.items() if not n.startswith(VISION_PREFIXES)}

  missing = [s.hf_name for s in specs if s.hf_name not in files]
  fresh_head = head == "value" and set(missing) <= {"score.weight", "score.bias"} and "score.weight" in missing
  if fresh_head:
    log.info("%s has no value head (score.weight): the critic starts from a fresh one", path)
    specs = [s for s in specs if s.path[0] != "score"]
    missing = []
  elif head == "value" and missing == ["score.bias"]:
    specs = [s for s in specs if s.hf_name != "score.bias"]  # a bias-free head: ours starts at zero
    missing = []
    fresh_head = "bias"
  if missing:
    shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
    raise CheckpointError(
      f"{path} is missing tensor(s) {shown} (needed for head={head!r}, "
      f"tie_word_embeddings={config.tie_word_embeddings})"
    )
  layer_name = re.compile(r"(?:language_model\.)?model\.(?:language_model\.)?layers\.(\d+)\.")
  layers = sorted({int(m.group(1)) for n in files if (m := layer_name.match(n))})
  if layers and layers[-1] >= config.num_hidden_layers:
    raise CheckpointError(
      f"{path} holds {layers[-1] + 1} decoder layers but its config sets num_hidden_layers="
      f"{config.num_hidden_layers}: training would silently drop layers {config.num_hidden_layers}.."
      f"{layers[-1]} (fix config.json, or override_config.num_hidden_layers)"
    )

  for file in sorted({files[spec.hf_name] for spec in specs}):
    with safe_open(file, framework="numpy") as f:
      for spec in specs:
        if files[spec.hf_name] != file:
          continue
        expected = _hf_shape(spec, spec.slice_shape(tuple(shape_of[spec.path].shape)))
        found = tuple(f.get_slice(spec.hf_name).get_shape())
        if found != expected:
          raise CheckpointError(
            f"tensor {spec.hf_name} in {file} has shape {list(found)}, but the config expects {list(expected)}"
          )

  used = {s.hf_name for s in specs}
  unused = [
    n
    for n in files
    if n not in used
    and not n.endswith(_IGNORED_SUFFIXES)
    and not (n == "lm_head.weight" and (config.tie_word_embeddings or head != "lm"))
  ]
  if unused and warn_unused:
    log.warning("%s: %d tensor(s) not used for head=%r: %s", path, len(unused), head, unused[:8])
  return _ReadPlan(specs, files, shape_of, fresh_head)


def _text_model_name(hf_name: str, prefix: str) -> str:
  """A text model tensor's name in a multimodal checkpoint whose text model is under `prefix` (`model.` ->
  `model.language_model.`; Gemma 3's released files: `language_model.model.`, and `language_model.lm_head.`)."""
  if hf_name.startswith("model."):
    return prefix + hf_name[len("model.") :]
  if hf_name.startswith("lm_head.") and prefix == gemma3.TEXT_PREFIX:
    return "language_model." + hf_name
  return hf_name


def check_hf_checkpoint(path: str, config: DecoderConfig, *, head: str = "lm") -> None:
  """Raises CheckpointError unless `load_hf_params(path, config, head=head)` can read every tensor it needs.

  Reads only the safetensors headers: the validation pass runs it before any weight is loaded.
  """
  _read_plan(path, config, head, warn_unused=False)  # load_hf_params says it, once


def _layer_sharding(sharding):
  """The sharding of one layer of a stacked leaf: its NamedSharding without the leading layer axis."""
  if isinstance(sharding, jax.sharding.NamedSharding):
    spec = tuple(sharding.spec)[1:]
    return jax.sharding.NamedSharding(
      sharding.mesh, jax.sharding.PartitionSpec(*spec), memory_kind=sharding.memory_kind
    )
  return sharding


def _stack_placed(layers: list, sharding):
  """One stacked leaf from its layers, each already on device in `_layer_sharding(sharding)`: the device
  holds the layers and the stack of one leaf at a time, the host never the whole stack."""
  if sharding is None:
    return jax.numpy.stack(layers)
  return jax.jit(lambda *xs: jax.numpy.stack(xs), out_shardings=sharding)(*layers)


def load_hf_params(
  path: str, config: DecoderConfig, *, head: str = "lm", shardings=None, dtype: str | None = None, rng=None
):
  """Reads the checkpoint at `path` into our param tree for `Decoder(config, head)`.

  shardings: None (default device) or a tree like the params of `jax.sharding.Sharding`s (e.g. from
    `jaxrlhf.parallel.logical_to_shardings`); each tensor goes straight into its sharding.
  dtype: parameter dtype ("float32" | "bfloat16"); default `config.param_dtype`.
  rng: key for a fresh value head when the checkpoint has none (an actor checkpoint used for the
    critic, as verl does); default key 0. A reward model's head must be in the checkpoint.
  """
  from safetensors import safe_open

  _check_head(head)
  dtype = dtype or config.param_dtype
  if dtype not in _NUMPY_DTYPES:
    raise ValueError(f"dtype={dtype!r} is not one of {list(_NUMPY_DTYPES)}")
  np_dtype = _NUMPY_DTYPES[dtype]
  plan = _read_plan(path, config, head)
  sharding_of = dict(_flatten(shardings)) if shardings is not None else {}

  flat: dict[tuple[str, ...], Any] = {}
  by_file: dict[str, list[_TensorSpec]] = {}
  for spec in plan.specs:
    by_file.setdefault(plan.files[spec.hf_name], []).append(spec)
  layer_slices: dict[tuple[str, ...], dict[int, Any]] = {}
  expert_slices: dict[tuple, dict[int, np.ndarray]] = {}  # (path, layer) -> the experts read so far, on the host
  for file, file_specs in sorted(by_file.items()):
    with safe_open(file, framework="numpy") as f:
      for spec in file_specs:
        full_shape = tuple(plan.shape_of[spec.path].shape)
        shape = spec.slice_shape(full_shape)
        array = np.ascontiguousarray(_to_ours(spec, f.get_tensor(spec.hf_name), shape).astype(np_dtype))
        if spec.expert is not None:  # a layer's experts stacked (and placed) once all are read, then freed
          experts = expert_slices.setdefault((spec.path, spec.layer), {})
          experts[spec.expert] = array
          if len(experts) < full_shape[spec.layer is not None]:
            continue
          array = np.stack([experts[e] for e in range(len(experts))])
          del expert_slices[(spec.path, spec.layer)]
        if spec.layer is None:
          flat[spec.path] = _place(array, sharding_of.get(spec.path))
        else:
          layer_slices.setdefault(spec.path, {})[spec.layer] = _place(
            array, _layer_sharding(sharding_of.get(spec.path))
          )
  for path in list(layer_slices):
    slices = layer_slices.pop(path)  # the layers are freed once stacked
    flat[path] = _stack_placed([slices[i] for i in range(len(slices))], sharding_of.get(path))

  if plan.fresh_head:
    d = config.hidden_size
    rng = jax.random.key(0) if rng is None else rng
    fresh = {
      ("score", "kernel"): np.asarray(INIT_STD * jax.random.normal(rng, (d, 1), np.float32)),
      ("score", "bias"): np.zeros((1,), np.float32),
    }
    for key, value in fresh.items():
      if key not in flat:
        flat[key] = _place(value.astype(np_dtype), sharding_of.get(key))
  return _unflatten(flat)


def _unflatten(flat: dict[tuple[str, ...], Any]):
  tree: dict[str, Any] = {}
  for path, value in flat.items():
    node = tree
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value
  return tree


# ----- writing -----------------------------------------------------------------------------------


def _to_host(array) -> np.ndarray:
  if isinstance(array, jax.Array) and not array.is_fully_addressable:
    from jax.experimental import multihost_utils

    array = multihost_utils.process_allgather(array, tiled=True)
  return np.asarray(jax.device_get(array))


def hf_state_dict(params, config: DecoderConfig, head: str = "lm", dtype: str | None = None) -> dict[str, np.ndarray]:
  """Our param tree -> {HF tensor name: numpy array} (HF layout)."""
  _check_head(head)
  np_dtype = _NUMPY_DTYPES[dtype or config.param_dtype]
  shapes, _ = abstract_params(Decoder(config, head=head))
  flat = dict(_flatten(params_for(config, params)))
  shape_of = dict(_flatten(shapes))
  tensors = {}
  host: dict[tuple[str, ...], np.ndarray] = {}  # one stacked leaf on the host at a time
  for spec in _tensor_specs(shapes):
    if spec.path not in flat:
      raise CheckpointError(f"params have no {'/'.join(spec.path)} (HF {spec.hf_name}) for head={head!r}")
    expected = tuple(shape_of[spec.path].shape)
    if spec.path not in host:
      host = {spec.path: _to_host(flat[spec.path])}
    value = host[spec.path]
    if tuple(value.shape) != expected:
      raise CheckpointError(
        f"param {'/'.join(spec.path)} has shape {list(value.shape)}, but the config expects {list(expected)}"
      )
    if spec.layer is not None:
      value = value[spec.layer]
    if spec.expert is not None:
      value = value[spec.expert]
    tensors[spec.hf_name] = np.ascontiguousarray(_to_hf(spec, value).astype(np_dtype))
  return tensors


def save_hf_checkpoint(
  params,
  config: DecoderConfig,
  out_dir: str,
  *,
  head: str = "lm",
  dtype: str | None = None,
  source_dir: str | None = None,
  max_shard_size: int = 5 * 2**30,
) -> str:
  """Writes config.json + model.safetensors (sharded with an index above `max_shard_size` bytes).

  `transformers.AutoModelForCausalLM` (head="lm"), `AutoModelForTokenClassification` ("value") or
  `AutoModelForSequenceClassification` ("reward") load the result. `source_dir`: the checkpoint the
  run started from; its config.json keys we do not model (token ids, ...) are kept and its tokenizer
  and generation_config files are copied. Only process 0 writes. Returns `out_dir`.
  """
  from safetensors.numpy import save_file

  tensors = hf_state_dict(params, config, head, dtype)
  if jax.process_index() != 0:
    return out_dir
  os.makedirs(out_dir, exist_ok=True)
  base = _read_json(os.path.join(source_dir, "config.json")) if source_dir else None
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(hf_config_dict(config, head, base, dtype), f, indent=2)

  shards: list[dict[str, np.ndarray]] = [{}]
  size = 0
  for name, array in tensors.items():
    if shards[-1] and size + array.nbytes > max_shard_size:
      shards.append({})
      size = 0
    shards[-1][name] = array
    size += array.nbytes
  for stale in glob.glob(os.path.join(out_dir, "*.safetensors")) + glob.glob(os.path.join(out_dir, _INDEX_FILE)):
    os.remove(stale)
  if len(shards) == 1:
    save_file(shards[0], os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
  else:
    weight_map = {}
    for i, shard in enumerate(shards):
      file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
      save_file(shard, os.path.join(out_dir, file), metadata={"format": "pt"})
      weight_map.update({name: file for name in shard})
    with open(os.path.join(out_dir, _INDEX_FILE), "w") as f:
      json.dump(
        {"metadata": {"total_size": sum(a.nbytes for a in tensors.values())}, "weight_map": weight_map}, f, indent=2
      )

  if source_dir:
    copy_tokenizer_files(source_dir, out_dir)
  return out_dir


def copy_tokenizer_files(source_dir: str, out_dir: str) -> list[str]:
  """Copies the tokenizer and generation-config files of `source_dir` (nothing else: no data, no weights)."""
  copied = []
  for file in sorted(os.listdir(source_dir)):
    source = os.path.join(source_dir, file)
    if os.path.isfile(source) and (file in MODEL_DIR_FILES or file.endswith(TOKENIZER_SUFFIXES)):
      shutil.copy2(source, os.path.join(out_dir, file))
      copied.append(file)
  return copied
