"""Packed rows: segment ids make attention block-diagonal causal, so each sequence reads as if alone."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrlhf.models import Decoder
from jaxrlhf.models.decoder import init_cache, init_params


@pytest.mark.parametrize("variant", ["plain", "qwen3_window"])
def test_segment_attention_equals_each_sequence_alone(tiny_model_config, variant):
  config = tiny_model_config
  if variant == "qwen3_window":
    config = dataclasses.replace(config, qk_norm=True, qkv_bias=True, sliding_window=3)
  model = Decoder(config, head="lm")
  params, _ = init_params(model, jax.random.key(0))
  rng = np.random.default_rng(0)
  lengths = [5, 2, 7, 1]  # two packed rows of 8: [5, 2, pad] and [7, 1]
  sequences = [rng.integers(1, config.vocab_size, size=n) for n in lengths]
  layout = [[0, 1], [2, 3]]
  ids, positions, segments = np.zeros((2, 8), np.int32), np.zeros((2, 8), np.int32), np.zeros((2, 8), np.int32)
  where = {}
  for row, members in enumerate(layout):
    offset = 0
    for i in members:
      n = lengths[i]
      ids[row, offset : offset + n] = sequences[i]
      positions[row, offset : offset + n] = np.arange(n)
      segments[row, offset : offset + n] = i + 1
      where[i] = (row, offset)
      offset += n
  packed, _ = model.apply(
    {"params": params},
    jnp.asarray(ids),
    jnp.asarray(positions),
    jnp.asarray(segments > 0, jnp.int32),
    segment_ids_BxL=jnp.asarray(segments),
  )
  assert np.all(np.isfinite(np.asarray(packed)))  # the padding segment attends nothing, yet stays finite
  for i, seq in enumerate(sequences):
    alone, _ = model.apply(
      {"params": params}, jnp.asarray(seq)[None], jnp.arange(len(seq))[None], jnp.ones((1, len(seq)), jnp.int32)
    )
    row, offset = where[i]
    np.testing.assert_allclose(packed[row, offset : offset + len(seq)], alone[0], atol=1e-5, rtol=1e-5)


def test_segments_refuse_a_cache(tiny_model_config):
  model = Decoder(tiny_model_config, head="value")
  params, _ = init_params(model, jax.random.key(0))
  ones = jnp.ones((1, 4), jnp.int32)
  cache = init_cache(tiny_model_config, 1, 4)
  with pytest.raises(ValueError, match="segment_ids_BxL"):
    model.apply({"params": params}, ones, ones, ones, cache, 0, segment_ids_BxL=ones)
