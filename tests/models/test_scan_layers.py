"""Layers as a scan over stacked weights equal the Python loop of modules (fp32, remat on): logits, values and
gradients for padded and packed calls, cached prefill + decode; the layer-layout conversions."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrlhf.models import Decoder, init_cache, init_params, positions_from_mask
from jaxrlhf.models.decoder import params_for
from jaxrlhf.models.stacking import layer_layout, stack_layers, unstack_layers


def _close(a, b, tol=1e-5):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=tol, rtol=tol), a, b)


@pytest.fixture(scope="module", params=["none", "full"])
def pair(request, tiny_model_config):
  """(loop model, scan model, loop params, the same params stacked)."""
  config = dataclasses.replace(tiny_model_config, num_hidden_layers=3, remat_policy=request.param, attention_impl="xla")
  loop, scan = Decoder(dataclasses.replace(config, scan_layers=False)), Decoder(config)
  params, _ = init_params(loop, jax.random.key(0))
  return loop, scan, params, stack_layers(params)


def test_init_layouts_and_conversions(pair):
  loop, scan, params, stacked = pair
  scan_shapes = jax.tree.map(lambda x: x.shape, init_params(scan, jax.random.key(0))[0])
  assert jax.tree.map(lambda x: x.shape, stacked) == scan_shapes
  assert layer_layout(params) == "unstacked" and layer_layout(stacked) == "stacked"
  jax.tree.map(np.testing.assert_array_equal, unstack_layers(stacked), params)
  assert params_for(scan.config, params).keys() == stacked.keys()
  assert params_for(loop.config, stacked).keys() == params.keys()


def test_padded_logits_and_gradients_match(pair):
  loop, scan, params, stacked = pair
  ids = jax.random.randint(jax.random.key(1), (2, 9), 0, 64)
  mask = jnp.ones_like(ids).at[0, :3].set(0).at[1, 7:].set(0)

  def loss(model, params):
    logits = model.apply({"params": params}, ids, positions_from_mask(mask), mask)[0]
    return jnp.sum(jax.nn.log_softmax(logits) * mask[..., None]), logits

  (_, logits_loop), grads_loop = jax.value_and_grad(lambda p: loss(loop, p), has_aux=True)(params)
  (_, logits_scan), grads_scan = jax.value_and_grad(lambda p: loss(scan, p), has_aux=True)(stacked)
  _close(logits_scan, logits_loop)
  _close(grads_scan, stack_layers(grads_loop))


def test_packed_values_and_gradients_match(tiny_model_config):
  config = dataclasses.replace(tiny_model_config, num_hidden_layers=3, remat_policy="dots_saveable")
  loop = Decoder(dataclasses.replace(config, scan_layers=False), head="value")
  scan = Decoder(config, head="value")
  params, _ = init_params(loop, jax.random.key(2))
  ids = jax.random.randint(jax.random.key(3), (1, 12), 0, 64)
  segments = jnp.asarray([[1, 1, 1, 1, 2, 2, 2, 2, 2, 0, 0, 0]], jnp.int32)
  positions = jnp.asarray([[0, 1, 2, 3, 0, 1, 2, 3, 4, 0, 0, 0]], jnp.int32)
  valid = (segments > 0).astype(jnp.float32)

  def loss(model, params):
    values = model.apply({"params": params}, ids, positions, jnp.ones_like(ids), segment_ids_BxL=segments)[0]
    return jnp.sum(values * valid), values

  (_, values_loop), grads_loop = jax.value_and_grad(lambda p: loss(loop, p), has_aux=True)(params)
  (_, values_scan), grads_scan = jax.value_and_grad(lambda p: loss(scan, p), has_aux=True)(stack_layers(params))
  _close(values_scan, values_loop)
  _close(grads_scan, stack_layers(grads_loop))


def test_cached_prefill_and_decode_match(pair):
  loop, scan, params, stacked = pair
  batch, prompt_len, total = 2, 5, 9
  ids = jax.random.randint(jax.random.key(4), (batch, total), 0, 64)
  mask = jnp.ones((batch, total), jnp.int32).at[0, :2].set(0)
  positions = positions_from_mask(mask)
  kv_mask = mask.at[:, prompt_len:].set(0)
  outputs = {}
  for name, model, p in (("loop", loop, params), ("scan", scan, stacked)):
    apply = jax.jit(model.apply)
    logits, cache = apply(
      {"params": p},
      ids[:, :prompt_len],
      positions[:, :prompt_len],
      kv_mask,
      init_cache(model.config, batch, total),
      jnp.int32(0),
    )
    steps = [logits]
    for t in range(prompt_len, total):
      step_mask = mask.at[:, t + 1 :].set(0)
      logits, cache = apply({"params": p}, ids[:, t : t + 1], positions[:, t : t + 1], step_mask, cache, jnp.int32(t))
      steps.append(logits)
    outputs[name] = (steps, cache)
  _close(outputs["scan"][0], outputs["loop"][0])
  assert outputs["scan"][1]["k"].shape == (3, batch, 2, total, 8)  # [layers, B, K, S, H]
  _close(outputs["scan"][1], outputs["loop"][1])
