"""The decoder's activations pinned to the batch layout (`models/activation_layout.py`) change where they live,
never what they are; the layout is the train rules' (`parallel.layouts`) for activations."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from jaxrlhf.models.activation_layout import ActivationLayout
from jaxrlhf.models.attention import splash_attention, xla_attention
from jaxrlhf.models.decoder import Decoder, init_params, positions_from_mask
from jaxrlhf.parallel.layouts import TRAIN_RULES, activation_sharding
from jaxrlhf.parallel.mesh import make_mesh

LOGICAL = [
  ("batch", "length", "mlp"),
  ("batch", "length", "heads", "head_dim"),
  ("batch", "length", "kv_heads", "head_dim"),
  ("batch", "length", "vocab"),
  ("batch", "length", None),
]


@pytest.mark.parametrize("shape, sp", [((1, 8, 1), 1), ((2, 2, 2), 1), ((1, 4, 2), 1), ((1, 4, 2), 2)])
def test_spec_is_the_train_rules_for_activations(shape, sp):
  """Rows over (data, fsdp[, sp]) and heads / mlp / vocab over tensor where they divide, as
  `activation_sharding` (the embed dim, which the train rules split for parameters, is whole)."""
  mesh = make_mesh(shape, sequence_parallel=sp)
  layout = ActivationLayout(mesh)
  for rows in (8, 6, 3):
    for logical_axes in LOGICAL:
      x = jax.ShapeDtypeStruct((rows, 5, 4, 16)[: len(logical_axes)], jnp.float32)
      want = activation_sharding(mesh, logical_axes, x.shape, TRAIN_RULES).spec
      assert layout.spec(x, logical_axes) == PartitionSpec(*want, *[None] * (len(logical_axes) - len(want)))
  assert layout.spec(jnp.zeros((8, 5, 32)), ("batch", "length", "embed"))[2] is None


def test_one_device_mesh_pins_nothing():
  layout = ActivationLayout(make_mesh((1, 1, 1), jax.devices()[:1]))
  x = jnp.ones((2, 3, 4))
  assert layout.constrain(x, ("batch", "length", "embed")) is x


@pytest.mark.parametrize("scan_layers", [True, False])
@pytest.mark.parametrize("packed", [False, True])
def test_decoder_with_layout_equals_without(tiny_model_config, scan_layers, packed):
  """fp32 logits and gradients with the activations pinned on a (data 2, fsdp 2, tensor 2) mesh equal the
  unconstrained model's; padded rows through xla attention, packed ones through blockwise."""
  config = dataclasses.replace(
    tiny_model_config,
    scan_layers=scan_layers,
    remat_policy="full",
    attention_impl="blockwise" if packed else "xla",
    attention_block_size=4,
  )
  params, _ = init_params(Decoder(config), jax.random.key(0))
  ids_BxL = jax.random.randint(jax.random.key(1), (8, 12), 0, config.vocab_size)
  mask_BxL = jnp.asarray(np.tile([0] * 3 + [1] * 9, (8, 1)), jnp.int32)
  positions_BxL, segments_BxL = positions_from_mask(mask_BxL), None
  if packed:
    segments_BxL = jnp.asarray(np.tile([1] * 5 + [2] * 5 + [0] * 2, (8, 1)), jnp.int32)
    positions_BxL = jnp.asarray(np.tile(list(range(5)) * 2 + [0, 0], (8, 1)), jnp.int32)
    mask_BxL = (segments_BxL > 0).astype(jnp.int32)
  layout = ActivationLayout(make_mesh((2, 2, 2)))

  def loss(params, model):
    logits_BxLxV, _ = model.apply({"params": params}, ids_BxL, positions_BxL, mask_BxL, segment_ids_BxL=segments_BxL)
    return jnp.sum(jnp.where(mask_BxL[..., None] > 0, jax.nn.log_softmax(logits_BxLxV), 0.0) ** 2), logits_BxLxV

  grad = lambda model: jax.jit(jax.value_and_grad(lambda p: loss(p, model), has_aux=True))(params)
  (_, want), want_grads = grad(Decoder(config))
  (_, got), got_grads = grad(Decoder(config, layout=layout))
  valid = np.asarray(mask_BxL)[..., None] > 0
  np.testing.assert_allclose(np.where(valid, got, 0), np.where(valid, want, 0), atol=1e-5, rtol=1e-5)
  # fp32 sums over rows in another order (per device, then across): equal to ~1e-6 of each gradient's scale.
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(b).max()), got_grads, want_grads
  )


@pytest.mark.parametrize("packed", [False, True])
def test_splash_in_the_layouts_shard_map_matches_xla(packed):
  """The Pallas kernel (interpreted on CPU) run per device on its rows and key/value heads, on 8 devices."""
  rows, length, kv_heads, group, head_dim = 4, 160, 2, 2, 128
  q, k, v = (
    jax.random.normal(key, shape, jnp.float32)
    for key, shape in zip(
      jax.random.split(jax.random.key(3), 3),
      [(rows, length, kv_heads, group, head_dim)] + [(rows, length, kv_heads, head_dim)] * 2,
    )
  )
  mask_BxL = np.ones((rows, length), np.int32)
  mask_BxL[0, :20] = 0
  segments_BxL = None
  if packed:
    segments_BxL = np.zeros((rows, length), np.int32)
    segments_BxL[:, :70], segments_BxL[:, 70:150] = 1, 2
    mask_BxL = (segments_BxL > 0).astype(np.int32)
    segments_BxL = jnp.asarray(segments_BxL)
  mask_BxL = jnp.asarray(mask_BxL)
  layout = ActivationLayout(make_mesh((1, 4, 2)))

  def core(q, k, v, kv_mask, segment_ids, window_on):
    assert q.shape[:3] == (1, length, 1)  # one row and one key/value head per device
    return splash_attention(q, k, v, kv_mask, segment_ids, block_size=128, interpret=True)

  got = jax.jit(lambda *a: layout.attention(core, *a, None))(q, k, v, mask_BxL, segments_BxL)
  want = xla_attention(q, k, v, jnp.arange(length), mask_BxL, segments_BxL)
  valid = np.asarray(mask_BxL, bool)
  np.testing.assert_allclose(np.asarray(got)[valid], np.asarray(want)[valid], atol=1e-5, rtol=1e-5)
