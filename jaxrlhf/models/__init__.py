"""Flax decoder family (Llama/Qwen2/Qwen3/Mistral), value & reward heads, HF safetensors IO, tokenizers."""

from jaxrlhf.models.decoder import (
    CACHE_LOGICAL_AXES,
    REMAT_POLICIES,
    Decoder,
    DecoderConfig,
    abstract_params,
    cast_floating,
    init_cache,
    init_params,
    last_valid_index,
    params_for,
    positions_from_mask,
    reward_model_scores,
)
from jaxrlhf.models.hf_io import (
    SUPPORTED_ARCHITECTURES,
    SUPPORTED_MODEL_TYPES,
    CheckpointError,
    check_hf_checkpoint,
    compute_settings,
    config_from_hf_dict,
    copy_tokenizer_files,
    critic_config_from,
    hf_config_dict,
    hf_state_dict,
    load_hf_config,
    load_hf_params,
    model_config_from,
    save_hf_checkpoint,
)
from jaxrlhf.models.tokenizer import generation_eos_ids, load_tokenizer, pad_token_id

__all__ = [
    "CACHE_LOGICAL_AXES", "REMAT_POLICIES", "Decoder", "DecoderConfig", "abstract_params", "cast_floating",
    "init_cache", "init_params", "last_valid_index", "params_for", "positions_from_mask", "reward_model_scores",
    "SUPPORTED_ARCHITECTURES", "SUPPORTED_MODEL_TYPES", "CheckpointError", "check_hf_checkpoint", "compute_settings",
    "config_from_hf_dict", "copy_tokenizer_files", "critic_config_from", "hf_config_dict", "hf_state_dict",
    "load_hf_config",
    "load_hf_params", "model_config_from", "save_hf_checkpoint",
    "generation_eos_ids", "load_tokenizer", "pad_token_id",
]
