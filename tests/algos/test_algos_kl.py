"""KL estimators, full KL, entropy and the KL controllers (docs/algorithms.md §2, §4)."""

import algos_numpy_reference as ref
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrlhf import algos

TOL = dict(rtol=1e-6, atol=1e-6)
BASES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


def _logprobs(seed, shape=(4, 9), scale=1.0):
  rng = np.random.default_rng(seed)
  lp = -np.abs(rng.normal(size=shape)).astype(np.float32) * scale
  ref_lp = -np.abs(rng.normal(size=shape)).astype(np.float32) * scale
  return lp, ref_lp


@pytest.mark.parametrize("name", BASES)
def test_kl_estimators_match_numpy(name):
  for seed, scale in ((0, 1.0), (1, 30.0)):  # scale 30 exercises the k3 clips
    lp, ref_lp = _logprobs(seed, scale=scale)
    np.testing.assert_allclose(
      algos.kl_penalty(lp, ref_lp, name), ref.kl_penalty(lp, ref_lp, name), rtol=1e-6, atol=1e-5 * scale
    )


def test_kl_hand_computed():
  lp, ref_lp = jnp.array([-1.0]), jnp.array([-2.0])
  assert np.isclose(algos.kl_penalty(lp, ref_lp, "k1")[0], 1.0)
  assert np.isclose(algos.kl_penalty(lp, ref_lp, "k2")[0], 0.5)
  assert np.isclose(algos.kl_penalty(lp, ref_lp, "k3")[0], np.exp(-1.0) + 1.0 - 1.0)
  assert np.isclose(algos.kl_penalty(ref_lp, lp, "abs")[0], 1.0)


@pytest.mark.parametrize("name", BASES)
def test_straight_through_value_of_base_gradient_of_k2(name):
  lp, ref_lp = _logprobs(2)
  value = algos.kl_penalty(lp, ref_lp, name + "+")
  np.testing.assert_allclose(value, algos.kl_penalty(lp, ref_lp, name), **TOL)
  weights = np.random.default_rng(3).normal(size=lp.shape).astype(np.float32)
  for argnum in (0, 1):
    g_plus = jax.grad(lambda a, b: jnp.sum(weights * algos.kl_penalty(a, b, name + "+")), argnum)(lp, ref_lp)
    g_k2 = jax.grad(lambda a, b: jnp.sum(weights * algos.kl_penalty(a, b, "k2")), argnum)(lp, ref_lp)
    np.testing.assert_allclose(g_plus, g_k2, **TOL)
  # and k2's gradient is the log-ratio, independent of the estimator reported
  g = jax.grad(lambda a: jnp.sum(algos.kl_penalty(a, ref_lp, name + "+")))(lp)
  np.testing.assert_allclose(g, lp - ref_lp, **TOL)


def test_full_and_unknown_kl_raise_clear_errors():
  with pytest.raises(ValueError, match="full_kl"):
    algos.kl_penalty(jnp.zeros(2), jnp.zeros(2), "full")
  with pytest.raises(ValueError, match="low_var_kl"):
    algos.kl_penalty(jnp.zeros(2), jnp.zeros(2), "k4")


@pytest.mark.parametrize("shape", [(1, 1, 2), (3, 5, 11), (2, 4, 64)])
def test_full_kl_equals_vocab_sum(shape):
  rng = np.random.default_rng(shape[-1])
  logits = rng.normal(size=shape).astype(np.float32) * 3
  ref_logits = rng.normal(size=shape).astype(np.float32) * 3
  np.testing.assert_allclose(algos.full_kl(logits, ref_logits), ref.full_kl(logits, ref_logits), **TOL)
  np.testing.assert_allclose(algos.full_kl(logits, logits), 0.0, atol=1e-6)
  # E_pi[k1] over the vocabulary is the full KL: consistency with the sampled-token estimators
  logp = jax.nn.log_softmax(logits)
  logq = jax.nn.log_softmax(ref_logits)
  np.testing.assert_allclose(
    jnp.sum(jnp.exp(logp) * algos.kl_penalty(logp, logq, "k1"), -1), algos.full_kl(logits, ref_logits), **TOL
  )


def test_full_kl_and_entropy_bf16_in_fp32():
  rng = np.random.default_rng(4)
  logits = jnp.asarray(rng.normal(size=(2, 3, 17)) * 4, jnp.bfloat16)
  ref_logits = jnp.asarray(rng.normal(size=(2, 3, 17)) * 4, jnp.bfloat16)
  kl = algos.full_kl(logits, ref_logits)
  ent = algos.entropy_from_logits(logits)
  assert kl.dtype == ent.dtype == jnp.float32
  np.testing.assert_allclose(
    kl, ref.full_kl(np.asarray(logits, np.float32), np.asarray(ref_logits, np.float32)), rtol=1e-5, atol=1e-5
  )
  np.testing.assert_allclose(ent, ref.entropy(np.asarray(logits, np.float32)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(1, 2), (3, 7), (2, 3, 50)])
def test_entropy_matches_numpy(shape):
  rng = np.random.default_rng(len(shape))
  logits = rng.normal(size=shape).astype(np.float32) * 2
  np.testing.assert_allclose(algos.entropy_from_logits(logits), ref.entropy(logits), **TOL)
  np.testing.assert_allclose(algos.entropy_from_logits(np.zeros(shape, np.float32)), np.log(shape[-1]), **TOL)
  # large logits must not overflow
  assert np.all(np.isfinite(algos.entropy_from_logits(logits * 1e4)))


def test_fixed_controller():
  assert algos.fixed_kl_update(0.001) == 0.001
  assert algos.fixed_kl_update(0.001, current_kl=5.0, n_steps=64) == 0.001


def _adaptive_numpy(coef, kls, n_steps, target, horizon):
  out = []
  for kl in kls:
    err = min(max(kl / target - 1, -0.2), 0.2)
    coef = coef * (1 + err * n_steps / horizon)
    out.append(coef)
  return out


def test_adaptive_controller_sequence_and_checkpoint_roundtrip(tmp_path):
  kls = [0.05, 0.1, 0.3, 0.11, 0.0, 1.0, 0.09, 0.2]
  want = _adaptive_numpy(0.001, kls, 256, 0.1, 10000)
  update = jax.jit(lambda s, kl: dict(kl_coef=algos.adaptive_kl_update(s["kl_coef"], kl, 256, 0.1, 10000)))

  state, got = dict(kl_coef=jnp.float32(0.001)), []
  for i, kl in enumerate(kls):
    state = update(state, jnp.float32(kl))
    got.append(float(state["kl_coef"]))
    if i == 3:  # checkpoint-like save/restore of the pytree mid-sequence
      leaves, treedef = jax.tree_util.tree_flatten(state)
      np.savez(tmp_path / "ckpt.npz", *[np.asarray(x) for x in leaves])
      with np.load(tmp_path / "ckpt.npz") as f:
        restored = [jnp.asarray(f[f"arr_{j}"]) for j in range(len(leaves))]
      state = jax.tree_util.tree_unflatten(treedef, restored)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  # the clip at +-0.2 is active for kl = 0.3, 0.0, 1.0
  assert np.isclose(want[2] / want[1], 1 + 0.2 * 256 / 10000)
