"""Attention kernels: blockwise (online softmax, own backward) equals the whole-matrix XLA attention in fp32,
forward and gradients, with padding, packing, sliding windows (static and per layer), GQA, a cache offset
and lengths the block does not divide; the kernel choice and its fallbacks."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrlhf.models import Decoder, init_params, positions_from_mask
from jaxrlhf.models.attention import (
  auto_attention_impl,
  blockwise_attention,
  choose_kernel,
  decode_attention,
  xla_attention,
)

B, L, K, G, H = 2, 13, 2, 2, 8


def _inputs(seed, keys=L):
  q, k, v = (
    jax.random.normal(key, shape, jnp.float32)
    for key, shape in zip(
      jax.random.split(jax.random.key(seed), 3), [(B, L, K, G, H), (B, keys, K, H), (B, keys, K, H)]
    )
  )
  return q, k, v


def _padded_mask(keys=L):
  # Row 0: 3 left pads, 2 right pads; row 1: no padding.
  mask = np.ones((B, keys), np.int32)
  mask[0, :3] = 0
  mask[0, keys - 2 :] = 0
  return jnp.asarray(mask)


def _compare(q, k, v, offset, kv_mask, segments=None, window=None, window_on=None, block=4, query_valid=None):
  """Forward and the gradients of a weighted sum over valid queries, blockwise vs xla."""
  weights = jax.random.normal(jax.random.key(9), q.shape, jnp.float32)
  if query_valid is not None:
    weights = weights * query_valid[:, :, None, None, None]

  def loss(fn, q, k, v):
    return jnp.sum(fn(q, k, v) * weights)

  xla = lambda q, k, v: xla_attention(q, k, v, offset + jnp.arange(q.shape[1]), kv_mask, segments, window, window_on)
  blockwise = lambda q, k, v: blockwise_attention(q, k, v, offset, kv_mask, segments, window, window_on, block)
  out_x, out_b = xla(q, k, v), blockwise(q, k, v)
  valid = np.ones(q.shape[:2], bool) if query_valid is None else np.asarray(query_valid, bool)
  np.testing.assert_allclose(np.asarray(out_b)[valid], np.asarray(out_x)[valid], atol=1e-5, rtol=1e-5)
  grads_x = jax.grad(lambda *a: loss(xla, *a), argnums=(0, 1, 2))(q, k, v)
  grads_b = jax.grad(lambda *a: loss(blockwise, *a), argnums=(0, 1, 2))(q, k, v)
  for gx, gb in zip(grads_x, grads_b):
    np.testing.assert_allclose(np.asarray(gb), np.asarray(gx), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("block", [4, 5, 13, 64])
def test_blockwise_matches_xla_with_padding_and_gqa(block):
  q, k, v = _inputs(0)
  mask = _padded_mask()
  _compare(q, k, v, 0, mask, block=block, query_valid=mask)


def test_blockwise_matches_xla_with_packed_segments():
  q, k, v = _inputs(1)
  segments = jnp.asarray([[1, 1, 1, 2, 2, 2, 2, 2, 3, 3, 0, 0, 0], [1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2]], jnp.int32)
  _compare(q, k, v, 0, jnp.ones((B, L), jnp.int32), segments, block=4, query_valid=segments > 0)


@pytest.mark.parametrize("window_on", [None, True, False])
def test_blockwise_matches_xla_with_a_sliding_window(window_on):
  q, k, v = _inputs(2)
  mask = _padded_mask()
  flag = None if window_on is None else jnp.asarray(window_on)
  _compare(q, k, v, 0, mask, window=3, window_on=flag, block=4, query_valid=mask)


def test_blockwise_matches_xla_at_a_cache_offset():
  # Queries at sequence indices 5..17 of a 24-column cache (a prefill after 5 cached columns).
  q, k, v = _inputs(3, keys=24)
  mask = jnp.asarray(np.r_[np.zeros(2), np.ones(16), np.zeros(6)][None].repeat(B, 0), jnp.int32)
  _compare(q, k, v, 5, mask, window=6, block=4)


@pytest.mark.parametrize("window,window_on", [(None, None), (4, None), (4, False), (4, True)])
def test_decode_attention_in_the_cache_layout_equals_xla_at_one_query(window, window_on):
  # One query at sequence index 9 over a 13-column cache with padding, read in the cache's [B, K, S, H].
  q, k, v = _inputs(5)
  mask, index = _padded_mask(), 9
  flag = None if window_on is None else jnp.asarray(window_on)
  want = xla_attention(q[:, :1], k, v, jnp.arange(index, index + 1), mask, None, window, flag)[:, 0]
  got = decode_attention(
    q[:, 0], k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), jnp.int32(index), mask, window, flag
  )
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


def test_blockwise_in_bf16_stays_close():
  q, k, v = (x.astype(jnp.bfloat16) for x in _inputs(4))
  mask = _padded_mask()
  index = jnp.arange(L)
  out_x = xla_attention(q, k, v, index, mask).astype(jnp.float32)
  out_b = blockwise_attention(q, k, v, 0, mask, block_size=4).astype(jnp.float32)
  valid = np.asarray(mask, bool)
  np.testing.assert_allclose(np.asarray(out_b)[valid], np.asarray(out_x)[valid], atol=3e-2)


def test_decoder_blockwise_matches_xla_logits_and_gradients(tiny_model_config):
  # A partial sliding window (layers 1.. of 3) inside the layer scan: the per-layer flag path.
  config = dataclasses.replace(
    tiny_model_config, num_hidden_layers=3, sliding_window=4, sliding_window_start_layer=1, attention_impl="xla"
  )
  params, _ = init_params(Decoder(config), jax.random.key(0))
  ids = jax.random.randint(jax.random.key(1), (2, 11), 0, 64)
  mask = jnp.ones_like(ids).at[0, :3].set(0).at[1, 9:].set(0)

  def loss(params, impl):
    model = Decoder(dataclasses.replace(config, attention_impl=impl, attention_block_size=4))
    logits = model.apply({"params": params}, ids, positions_from_mask(mask), mask)[0]
    return jnp.sum(jax.nn.log_softmax(logits) * mask[..., None]), logits

  (loss_x, logits_x), grads_x = jax.value_and_grad(loss, has_aux=True)(params, "xla")
  (loss_b, logits_b), grads_b = jax.value_and_grad(loss, has_aux=True)(params, "blockwise")
  valid = np.asarray(mask, bool)
  np.testing.assert_allclose(np.asarray(logits_b)[valid], np.asarray(logits_x)[valid], atol=1e-5, rtol=1e-5)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5), grads_b, grads_x
  )


def test_kernel_choice_and_fallbacks():
  assert [auto_attention_impl(p) for p in ("cpu", "gpu", "cuda", "tpu")] == ["xla", "cudnn", "cudnn", "splash"]
  bf16 = dict(dtype=jnp.bfloat16, cached=False, packed=False, traced_window=False)
  assert choose_kernel("cudnn", **bf16) == "cudnn" and choose_kernel("splash", **bf16) == "splash"
  assert choose_kernel("cudnn", **{**bf16, "dtype": jnp.float32}) == "blockwise"
  assert choose_kernel("cudnn", **{**bf16, "packed": True}) == "blockwise"
  assert choose_kernel("splash", **{**bf16, "packed": True}) == "splash"
  assert choose_kernel("splash", **{**bf16, "cached": True}) == "blockwise"
  assert choose_kernel("cudnn", **{**bf16, "traced_window": True}) == "blockwise"
  assert choose_kernel("xla", **{**bf16, "cached": True}) == "xla"
  # gpt-oss's learned attention sinks: an extra logit neither vendor kernel takes
  assert choose_kernel("cudnn", **bf16, sinks=True) == choose_kernel("splash", **bf16, sinks=True) == "blockwise"


def test_for_platform_resolves_auto_only(tiny_model_config):
  assert tiny_model_config.for_platform("tpu").attention_impl == "splash"
  assert tiny_model_config.for_platform("cpu").attention_impl == "xla"
  fixed = dataclasses.replace(tiny_model_config, attention_impl="blockwise")
  assert fixed.for_platform("gpu") is fixed
  with pytest.raises(ValueError, match="attention_impl='flash'"):
    dataclasses.replace(tiny_model_config, attention_impl="flash")


@pytest.mark.parametrize("window, packed", [(None, False), (37, False), (None, True)])
def test_splash_kernel_matches_xla_in_interpret_mode(window, packed):
  # The TPU kernel run by Pallas' interpreter on CPU: padding (as segment ids), packing, a window, a length
  # its 128-wide tiles do not divide.
  from jaxrlhf.models.attention import splash_attention

  length, head_dim = 200, 128
  q, k, v = (
    jax.random.normal(key, shape, jnp.float32)
    for key, shape in zip(
      jax.random.split(jax.random.key(5), 3),
      [(B, length, K, G, head_dim), (B, length, K, head_dim)] + [(B, length, K, head_dim)],
    )
  )
  mask = np.ones((B, length), np.int32)
  mask[0, :30], mask[0, 180:] = 0, 0
  segments = None
  if packed:
    mask = np.ones((B, length), np.int32)
    segments = np.zeros((B, length), np.int32)
    segments[:, :90], segments[:, 90:170] = 1, 2
    segments = jnp.asarray(segments)
  mask = jnp.asarray(mask)
  out_s = splash_attention(q, k, v, mask, segments, window, block_size=128, interpret=True)
  out_x = xla_attention(q, k, v, jnp.arange(length), mask, segments, window)
  valid = np.asarray(mask if segments is None else segments, bool) > 0
  np.testing.assert_allclose(np.asarray(out_s)[valid], np.asarray(out_x)[valid], atol=1e-5, rtol=1e-5)
