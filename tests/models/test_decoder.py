import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrlhf.models import Decoder, DecoderConfig, init_cache, init_params, positions_from_mask


def _forward(model, params, ids, mask):
  return jax.jit(model.apply)({"params": params}, ids, positions_from_mask(mask), mask)[0]


@pytest.fixture(scope="module")
def lm(tiny_model_config):
  model = Decoder(tiny_model_config)
  params, logical = init_params(model, jax.random.key(0))
  return model, params, logical


def test_forward_shapes_and_logical_axes(lm, tiny_model_config):
  model, params, logical = lm
  ids = jnp.zeros((3, 7), jnp.int32)
  logits, cache = model.apply({"params": params}, ids, positions_from_mask(jnp.ones_like(ids)), jnp.ones_like(ids))
  assert logits.shape == (3, 7, tiny_model_config.vocab_size) and logits.dtype == jnp.float32
  assert cache is None
  # Scanned layers: one stacked leaf per parameter, the layer axis first.
  assert logical["layers"]["self_attn"]["q_proj"]["kernel"] == ("layers", "embed", "heads", "head_dim")
  assert logical["layers"]["self_attn"]["k_proj"]["kernel"] == ("layers", "embed", "kv_heads", "head_dim")
  assert logical["layers"]["mlp"]["down_proj"]["kernel"] == ("layers", "mlp", "embed")
  assert logical["embed_tokens"]["embedding"] == ("vocab", "embed")
  assert params["layers"]["self_attn"]["k_proj"]["kernel"].shape == (2, 32, 2, 8)  # GQA: 2 kv heads of 4


def test_loop_layout_has_one_module_per_layer(tiny_model_config):
  config = dataclasses.replace(tiny_model_config, scan_layers=False)
  params, logical = init_params(Decoder(config), jax.random.key(0))
  assert logical["layers_1"]["self_attn"]["q_proj"]["kernel"] == ("embed", "heads", "head_dim")
  assert params["layers_0"]["self_attn"]["k_proj"]["kernel"].shape == (32, 2, 8)


def test_causal_mask_future_tokens_do_not_change_past_logits(lm):
  model, params, _ = lm
  ids = jax.random.randint(jax.random.key(1), (2, 9), 0, 64)
  mask = jnp.ones_like(ids)
  changed = ids.at[:, 5:].set((ids[:, 5:] + 7) % 64)
  a, b = _forward(model, params, ids, mask), _forward(model, params, changed, mask)
  np.testing.assert_array_equal(np.asarray(a[:, :5]), np.asarray(b[:, :5]))
  assert not np.allclose(a[:, 5:], b[:, 5:])


def test_left_padding_does_not_change_valid_logits(lm):
  model, params, _ = lm
  ids = jax.random.randint(jax.random.key(2), (1, 6), 0, 64)
  plain = _forward(model, params, ids, jnp.ones_like(ids))
  padded_ids = jnp.concatenate([jnp.full((1, 3), 0, jnp.int32), ids], axis=1)
  padded_mask = jnp.concatenate([jnp.zeros((1, 3), jnp.int32), jnp.ones_like(ids)], axis=1)
  padded = _forward(model, params, padded_ids, padded_mask)
  np.testing.assert_allclose(padded[:, 3:], plain, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("tied", [False, True])
def test_kv_cache_decode_matches_full_forward(tiny_model_config, tied):
  config = dataclasses.replace(tiny_model_config, tie_word_embeddings=tied)
  model = Decoder(config)
  params, _ = init_params(model, jax.random.key(3))
  assert ("lm_head" in params) is not tied
  batch, prompt_len, total = 3, 5, 11
  ids = jax.random.randint(jax.random.key(4), (batch, total), 0, config.vocab_size)
  mask = jnp.ones((batch, total), jnp.int32).at[0, :2].set(0).at[1, :4].set(0)  # left padding
  full = _forward(model, params, ids, mask)

  cache = init_cache(config, batch, total)
  kv_mask = jnp.concatenate([mask[:, :prompt_len], jnp.zeros((batch, total - prompt_len), jnp.int32)], axis=1)
  positions = positions_from_mask(mask)
  apply = jax.jit(model.apply)
  prefill, cache = apply(
    {"params": params}, ids[:, :prompt_len], positions[:, :prompt_len], kv_mask, cache, jnp.int32(0)
  )
  pieces = [prefill]
  for t in range(prompt_len, total):
    kv_mask = kv_mask.at[:, t].set(1)
    step_logits, cache = apply(
      {"params": params}, ids[:, t : t + 1], positions[:, t : t + 1], kv_mask, cache, jnp.int32(t)
    )
    pieces.append(step_logits)
  incremental = jnp.concatenate(pieces, axis=1)
  valid = np.asarray(mask, bool)
  assert np.abs(np.asarray(incremental - full))[valid].max() <= 1e-5


def test_value_head_shape(tiny_model_config):
  critic = Decoder(tiny_model_config, head="value")
  params, logical = init_params(critic, jax.random.key(5))
  ids = jnp.ones((2, 4), jnp.int32)
  values, _ = critic.apply({"params": params}, ids, positions_from_mask(jnp.ones_like(ids)), jnp.ones_like(ids))
  assert values.shape == (2, 4) and values.dtype == jnp.float32
  assert "lm_head" not in params and logical["score"]["kernel"] == ("embed", None)


def test_config_errors_name_the_key():
  with pytest.raises(ValueError, match="num_key_value_heads"):
    DecoderConfig.from_dict(
      dict(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2)
    )
  with pytest.raises(ValueError, match="multiple of num_key_value_heads"):
    DecoderConfig.from_dict(
      dict(
        vocab_size=8,
        hidden_size=12,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=3,
        num_key_value_heads=2,
      )
    )
