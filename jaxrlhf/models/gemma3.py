"""The Gemma 3 family (`transformers.models.gemma3`): what differs from the dense decoder, in one place.

- config: `gemma3_text` (`Gemma3ForCausalLM`) and `gemma3` (`Gemma3ForConditionalGeneration`, whose `text_config` is
  the text model's) -> `DecoderConfig` fields: `layer_types` (five `sliding_attention` layers per `full_attention`
  one in the released models), the sliding window, two RoPE bases (`rope_parameters` per layer type in transformers
  v5; `rope_theta` + `rope_scaling` and `rope_local_base_freq` in v4 files), zero-centred (1 + w) RMSNorms
  everywhere (q/k norm included), four norms per layer (`sandwich_norms`), embeddings scaled by sqrt(hidden_size),
  the gelu-tanh MLP and scores scaled by `query_pre_attn_scalar`; and back, for export (as `gemma3_text`). Logit
  soft-capping (Gemma 2's; None in every Gemma 3 release) and bidirectional attention are refused.
- weights: a `Gemma3ForConditionalGeneration` checkpoint holds the text model under `language_model.model.` (the
  released files; `model.language_model.` as Qwen3.5 also read) beside its vision tower and projector, skipped.
"""

from __future__ import annotations

from typing import Any

MODEL_TYPE = "gemma3_text"
MULTIMODAL_TYPE = "gemma3"
MULTIMODAL_ARCHITECTURES = ("Gemma3ForConditionalGeneration", "Gemma3ForSequenceClassification")
TEXT_ARCHITECTURES = ("Gemma3ForCausalLM", "Gemma3TextForSequenceClassification", "Gemma3ForTokenClassification")
TEXT_PREFIX = "language_model.model."  # the text model's tensors in a released Gemma3ForConditionalGeneration file
VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")
# Gemma3TextConfig's defaults: released `gemma3` config.json files write only what differs from them.
DEFAULTS = dict(
  vocab_size=262_208,
  hidden_size=2304,
  intermediate_size=9216,
  num_hidden_layers=26,
  num_attention_heads=8,
  num_key_value_heads=4,
  head_dim=256,
  hidden_activation="gelu_pytorch_tanh",
  max_position_embeddings=131_072,
  rms_norm_eps=1e-6,
  attention_bias=False,
  query_pre_attn_scalar=256,
  sliding_window=4096,
)
SLIDING_WINDOW_PATTERN = 6  # v4 files without layer_types: every 6th layer is full attention
DEFAULT_THETA = {"full_attention": 1_000_000.0, "sliding_attention": 10_000.0}


class UnsupportedGemma3(ValueError):
  """A Gemma 3 config this family cannot represent (hf_io turns it into a CheckpointError naming the file)."""


def text_config(hf: dict[str, Any]) -> dict[str, Any]:
  """The text model's config.json dict with Gemma3TextConfig's defaults filled in: `gemma3`'s `text_config` (with
  the outer tie_word_embeddings, True by default), or a `gemma3_text` dict; anything else as is."""
  if hf.get("model_type") == MULTIMODAL_TYPE:
    text = dict(hf.get("text_config") or {})
    text["tie_word_embeddings"] = hf.get("tie_word_embeddings", True)
    text["model_type"] = MODEL_TYPE
    text["architectures"] = hf.get("architectures")
  elif hf.get("model_type") == MODEL_TYPE:
    text = dict(hf)
    text.setdefault("tie_word_embeddings", True)
  else:
    return hf
  for key, value in DEFAULTS.items():
    if text.get(key) is None:
      text[key] = value
  return text


def layer_types(hf: dict[str, Any]) -> tuple[str, ...]:
  layers = int(hf["num_hidden_layers"])
  if hf.get("layer_types"):
    return tuple(hf["layer_types"])
  pattern = int(hf.get("sliding_window_pattern") or hf.get("_sliding_window_pattern") or SLIDING_WINDOW_PATTERN)
  return tuple("sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers))


def rope_by_layer_type(hf: dict[str, Any]) -> dict[str, dict[str, Any]]:
  """{"full_attention": ..., "sliding_attention": ...} RoPE parameters, each with its rope_theta, from v5's per-type
  `rope_parameters` or v4's `rope_theta` + `rope_scaling` (the full layers') and `rope_local_base_freq`."""
  params = dict(hf.get("rope_parameters") or {})
  if params and all(isinstance(v, dict) for v in params.values()):
    full, sliding = dict(params.get("full_attention") or {}), dict(params.get("sliding_attention") or {})
  else:
    full = {**dict(hf.get("rope_scaling") or {}), **params}
    sliding = {"rope_type": "default"}
    if hf.get("rope_theta") is not None:
      full.setdefault("rope_theta", hf["rope_theta"])
    if hf.get("rope_local_base_freq") is not None:
      sliding["rope_theta"] = hf["rope_local_base_freq"]
  for kind, rope in (("full_attention", full), ("sliding_attention", sliding)):
    rope.setdefault("rope_theta", DEFAULT_THETA[kind])
    rope.setdefault("rope_type", rope.pop("type", "default"))
  return {"full_attention": full, "sliding_attention": sliding}


def config_fields(hf: dict[str, Any]) -> dict[str, Any]:
  """Gemma 3's `DecoderConfig` fields from a text config dict (`text_config`), RoPE aside: `hf_io` reads the full
  layers' RoPE from `rope_by_layer_type(hf)["full_attention"]` as any family's. Raises UnsupportedGemma3."""
  for key in ("final_logit_softcapping", "attn_logit_softcapping"):
    if hf.get(key) is not None:
      raise UnsupportedGemma3(f"{key}={hf[key]} is not supported (Gemma 3 releases set it to null)")
  if hf.get("use_bidirectional_attention"):
    raise UnsupportedGemma3("use_bidirectional_attention=True is not supported (causal language models only)")
  sliding = rope_by_layer_type(hf)["sliding_attention"]
  if sliding["rope_type"] != "default":
    raise UnsupportedGemma3(f"sliding_attention rope_type={sliding['rope_type']!r} is not supported (only default)")
  bias = bool(hf.get("attention_bias", False))
  return dict(
    layer_types=layer_types(hf),
    sliding_window=int(hf["sliding_window"]),
    rope_local_base_freq=float(sliding["rope_theta"]),
    hidden_activation=hf["hidden_activation"],
    query_pre_attn_scalar=float(hf["query_pre_attn_scalar"]),
    embed_scale=True,
    sandwich_norms=True,
    norm_offset=True,
    qk_norm=True,
    qkv_bias=bias,
    o_bias=bias,
  )


def hf_config_fields(config, full_rope: dict[str, Any]) -> dict[str, Any]:
  """What a `gemma3_text` config.json holds beyond the dense decoder's keys; `full_rope`: the full layers' RoPE
  parameters as the dense decoder writes them (rope_type, rope_theta and the scaling's keys)."""
  scalar = config.query_pre_attn_scalar
  return dict(
    layer_types=list(config.layer_types),
    sliding_window=config.sliding_window,
    rope_parameters={
      "full_attention": full_rope,
      "sliding_attention": {"rope_type": "default", "rope_theta": config.rope_local_base_freq},
    },
    hidden_activation=config.hidden_activation,
    query_pre_attn_scalar=int(scalar) if float(scalar).is_integer() else scalar,
    attention_bias=config.qkv_bias,
    final_logit_softcapping=None,
    attn_logit_softcapping=None,
    use_bidirectional_attention=False,
  )


def config_problems(config) -> list[str]:
  """Why `config` cannot be written as a gemma3_text checkpoint (empty when it can)."""
  problems = []
  if not (config.qk_norm and config.norm_offset and config.sandwich_norms and config.embed_scale):
    problems.append("gemma3 has q/k norm, (1 + w) norms, four norms per layer and scaled embeddings, always")
  if config.rope_local_base_freq is None or config.query_pre_attn_scalar is None or not config.layer_types:
    problems.append("gemma3 needs rope_local_base_freq, query_pre_attn_scalar and layer_types")
  if set(config.layer_types) - {"sliding_attention", "full_attention"}:
    problems.append("gemma3 has sliding_attention and full_attention layers only")
  if config.qkv_bias != config.o_bias or config.mlp_bias or config.attn_output_gate or config.num_experts:
    problems.append("gemma3 has one attention_bias for q/k/v and o, no MLP bias, no output gate, no experts")
  return problems
