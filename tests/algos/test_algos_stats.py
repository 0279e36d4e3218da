"""masked_* statistics, agg_loss and the micro-batch global-normalisation contract (docs/algorithms.md §1, §4)."""

import algos_numpy_reference as ref
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrlhf import algos

TOL = dict(rtol=1e-6, atol=1e-6)
SHAPES = [(1, 1), (3, 7), (8, 16), (5, 33)]


@pytest.mark.parametrize("shape", SHAPES)
def test_masked_stats_match_numpy(shape):
  rng = np.random.default_rng(sum(shape))
  x = rng.normal(size=shape).astype(np.float32) * 3 + 1
  m = ref.random_batch(rng, *shape, empty_rows=[0] if shape[0] > 1 else [])
  np.testing.assert_allclose(algos.masked_mean(x, m), ref.masked_mean(x, m), **TOL)
  np.testing.assert_allclose(algos.masked_sum(x, m), (x * m).astype(np.float64).sum(), **TOL)
  np.testing.assert_allclose(algos.masked_var(x, m), ref.masked_var(x, m), **TOL)
  np.testing.assert_allclose(algos.masked_var(x, m, unbiased=False), ref.masked_var(x, m, False), **TOL)
  for shift in (True, False):
    got = algos.masked_whiten(x, m, shift_mean=shift)
    np.testing.assert_allclose(got * m, ref.masked_whiten(x, m, shift) * m, rtol=1e-5, atol=1e-5)


def test_masked_mean_axis():
  rng = np.random.default_rng(1)
  x = rng.normal(size=(4, 6)).astype(np.float32)
  m = ref.random_batch(rng, 4, 6, empty_rows=[2])
  got = algos.masked_mean(x, m, axis=-1)
  want = [ref.masked_mean(x[b], m[b]) for b in range(4)]
  np.testing.assert_allclose(got, want, **TOL)
  assert got[2] == 0


def test_hand_computed_whiten():
  x = np.array([[1.0, 2.0, 3.0, 100.0]], np.float32)
  m = np.array([[1, 1, 1, 0]], np.float32)
  # mean 2, unbiased var 1 -> (x-2)/sqrt(1+1e-8)
  np.testing.assert_allclose(algos.masked_whiten(x, m)[0, :3], [-1, 0, 1], **TOL)
  np.testing.assert_allclose(algos.masked_var(x, m), 1.0, **TOL)


def test_empty_and_single_masks_give_zero_not_nan():
  x = jnp.array([[1.0, jnp.nan, jnp.inf]])
  empty = jnp.zeros((1, 3))
  single = jnp.array([[1.0, 0.0, 0.0]])
  for fn in (algos.masked_mean, algos.masked_sum, algos.masked_var):
    assert fn(x, empty) == 0
  assert algos.masked_var(x, single) == 0
  np.testing.assert_array_equal(algos.masked_whiten(x, single)[0, 0], 0.0)
  for mode in algos.LOSS_AGG_MODES:
    assert algos.agg_loss(x, empty, mode) == 0
  # gradients stay finite for an all-masked batch and garbage padding
  g = jax.grad(lambda y: algos.agg_loss(y, empty, "seq-mean-token-mean"))(x)
  assert np.all(np.isfinite(g))


@pytest.mark.parametrize("mode", algos.LOSS_AGG_MODES)
@pytest.mark.parametrize("shape", SHAPES)
def test_agg_loss_matches_numpy(mode, shape):
  rng = np.random.default_rng(7 + sum(shape))
  loss = rng.normal(size=shape).astype(np.float32)
  m = ref.random_batch(rng, *shape, empty_rows=[1] if shape[0] > 2 else [])
  np.testing.assert_allclose(algos.agg_loss(loss, m, mode), ref.agg_loss(loss, m, mode), **TOL)
  np.testing.assert_allclose(
    jax.jit(algos.agg_loss, static_argnums=2)(loss, m, mode), ref.agg_loss(loss, m, mode), **TOL
  )


def test_agg_loss_hand_computed():
  loss = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]], np.float32)
  m = np.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]], np.float32)
  assert np.isclose(algos.agg_loss(loss, m, "token-mean"), 7 / 3)
  assert np.isclose(algos.agg_loss(loss, m, "seq-mean-token-sum"), (3 + 4) / 2)
  assert np.isclose(algos.agg_loss(loss, m, "seq-mean-token-mean"), (1.5 + 4) / 2)
  assert np.isclose(algos.agg_loss(loss, m, "token-sum"), 7)
  # verl 0.9.1: token sums averaged over the 2 rows with a valid token, / loss_scale_factor (default T = 3)
  assert np.isclose(algos.agg_loss(loss, m, "seq-mean-token-sum-norm"), 7 / 2 / 3)
  assert np.isclose(algos.agg_loss(loss, m, "seq-mean-token-sum-norm", loss_scale_factor=7.0), 0.5)


def test_agg_loss_unknown_mode():
  with pytest.raises(ValueError, match="token-mean"):
    algos.agg_loss(jnp.ones((2, 2)), jnp.ones((2, 2)), "token-max")


def test_loss_normalizers():
  m = np.array([[1, 1, 0], [0, 0, 0], [1, 0, 1]], np.float32)
  norms = algos.loss_normalizers(m, "token-mean")
  assert float(norms["global_token_count"]) == 4 and float(norms["global_seq_count"]) == 2
  assert float(norms["loss_scale_factor"]) == 3  # None = the padded response length, as verl
  norms = algos.loss_normalizers(m, "seq-mean-token-sum-norm", loss_scale_factor=512)
  assert float(norms["loss_scale_factor"]) == 512


@pytest.mark.parametrize("mode", algos.LOSS_AGG_MODES)
@pytest.mark.parametrize("n_micro", [2, 4])
def test_micro_batch_sum_equals_unsplit_loss_and_grad(mode, n_micro):
  rng = np.random.default_rng(3)
  B, T = 8, 12
  loss_param = rng.normal(size=(B, T)).astype(np.float32)
  m = ref.random_batch(rng, B, T, empty_rows=[0, 5])  # an all-padding row inside a micro-batch
  weight = rng.normal(size=(B, T)).astype(np.float32)

  def full(p):
    return algos.agg_loss(jnp.square(p) * weight, m, mode)

  norms = algos.loss_normalizers(m, mode)

  def split(p):
    total = 0.0
    for p_mb, w_mb, m_mb in zip(*(np.split(a, n_micro) for a in (p, weight, m))):
      total = total + algos.agg_loss(jnp.square(p_mb) * w_mb, m_mb, mode, **norms)
    return total

  def split_jnp(p):  # same as split but differentiable w.r.t. the whole array
    parts = jnp.split(p, n_micro)
    return sum(
      algos.agg_loss(jnp.square(pp) * w, mm, mode, **norms)
      for pp, w, mm in zip(parts, np.split(weight, n_micro), np.split(m, n_micro))
    )

  np.testing.assert_allclose(split(loss_param), full(loss_param), **TOL)
  np.testing.assert_allclose(jax.grad(split_jnp)(loss_param), jax.grad(full)(loss_param), **TOL)


def test_bf16_inputs_computed_in_fp32():
  rng = np.random.default_rng(5)
  x = jnp.asarray(rng.normal(size=(4, 8)), jnp.bfloat16)
  m = ref.random_batch(rng, 4, 8)
  got = algos.agg_loss(x, m, "token-mean")
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(got, ref.agg_loss(np.asarray(x, np.float32), m, "token-mean"), **TOL)


def test_vmap():
  rng = np.random.default_rng(9)
  x = rng.normal(size=(3, 4, 5)).astype(np.float32)
  m = np.stack([ref.random_batch(rng, 4, 5) for _ in range(3)])
  got = jax.vmap(algos.masked_whiten)(x, m)
  for i in range(3):
    np.testing.assert_allclose(got[i], algos.masked_whiten(x[i], m[i]), **TOL)
