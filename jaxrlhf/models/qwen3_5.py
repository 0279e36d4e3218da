"""The Qwen3.5 family (`transformers.models.qwen3_5`, and `qwen3_5_moe`: the same layers with experts in place of the
MLP, `models/moe.py`): what differs from the dense decoder, in one place.

- config: `qwen3_5_text` (`Qwen3_5ForCausalLM`) and `qwen3_5` (`Qwen3_5ForConditionalGeneration`, whose
  `text_config` is the text model's) -> `DecoderConfig` fields: `layer_types` (Gated DeltaNet `linear_attention`
  layers, `models/linear_attention.py`, beside `full_attention`), the gated attention (q_proj doubled into the
  query and a sigmoid output gate), partial RoPE, q/k norm, zero-centred (1 + w) RMSNorms and the linear layers'
  sizes; and back, for export (always as `qwen3_5_text`: the text model is what is trained).
- weights: a `Qwen3_5ForConditionalGeneration` checkpoint holds the text model under `model.language_model.`
  beside its vision tower (`model.visual.`), which is skipped.
"""

from __future__ import annotations

from typing import Any

TEXT_MODEL_TYPES = ("qwen3_5_text", "qwen3_5_moe_text")
MULTIMODAL_TEXT = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}  # model_type -> its text model's
MULTIMODAL_ARCHITECTURES = ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration")
TEXT_PREFIX = "model.language_model."  # the text model's tensors in a Qwen3_5ForConditionalGeneration checkpoint
VISION_PREFIXES = ("model.visual.",)
LINEAR_KEYS = (
  "linear_num_key_heads",
  "linear_num_value_heads",
  "linear_key_head_dim",
  "linear_value_head_dim",
  "linear_conv_kernel_dim",
)


def text_config(hf: dict[str, Any]) -> dict[str, Any]:
  """The text model's config.json dict: `qwen3_5`'s (`qwen3_5_moe`'s) `text_config` (with the outer
  tie_word_embeddings), or as is."""
  if hf.get("model_type") not in MULTIMODAL_TEXT:
    return hf
  text = dict(hf.get("text_config") or {})
  text.setdefault("tie_word_embeddings", hf.get("tie_word_embeddings", False))
  text["model_type"] = MULTIMODAL_TEXT[hf["model_type"]]
  text["architectures"] = hf.get("architectures")
  return text


def config_fields(hf: dict[str, Any]) -> dict[str, Any]:
  """The hybrid fields of `DecoderConfig` from a text config dict (`text_config`)."""
  layer_types = tuple(hf.get("layer_types") or ())
  if not layer_types:
    interval = int(hf.get("full_attention_interval", 4))
    layers = int(hf["num_hidden_layers"])
    layer_types = tuple("full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers))
  fields = {key: int(hf[key]) for key in LINEAR_KEYS if hf.get(key) is not None}
  rope = dict(hf.get("rope_parameters") or {})
  return dict(
    layer_types=layer_types,
    attn_output_gate=True,
    qk_norm=True,
    norm_offset=True,
    partial_rotary_factor=float(rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))),
    qkv_bias=bool(hf.get("attention_bias", False)),
    o_bias=bool(hf.get("attention_bias", False)),
    **fields,
  )


def hf_config_fields(config) -> dict[str, Any]:
  """What a `qwen3_5_text` config.json holds beyond the dense decoder's keys."""
  return dict(
    layer_types=list(config.layer_types),
    attention_bias=config.qkv_bias,
    rope_parameters={
      "rope_type": "default",
      "rope_theta": config.rope_theta,
      "partial_rotary_factor": config.partial_rotary_factor,
    },
    **{key: getattr(config, key) for key in LINEAR_KEYS},
  )


def config_problems(config) -> list[str]:
  """Why `config` cannot be written as a qwen3_5_text checkpoint (empty when it can)."""
  problems = []
  if not (config.attn_output_gate and config.qk_norm and config.norm_offset):
    problems.append("qwen3_5 has the gated attention, q/k norm and (1 + w) norms, always")
  if config.qkv_bias != config.o_bias:
    problems.append("qwen3_5 has one attention_bias for q/k/v and o")
  if config.rope_type != "default" or config.sliding_window or config.mlp_bias:
    problems.append("qwen3_5 has default RoPE, no sliding window and no MLP bias")
  return problems
