"""Flax decoder family, value head and (later) HF safetensors IO."""

from jaxrlhf.models.decoder import (
    CACHE_LOGICAL_AXES,
    Decoder,
    DecoderConfig,
    abstract_params,
    init_cache,
    init_params,
    positions_from_mask,
)

__all__ = ["CACHE_LOGICAL_AXES", "Decoder", "DecoderConfig", "abstract_params", "init_cache", "init_params",
           "positions_from_mask"]
