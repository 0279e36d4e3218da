"""Advantage estimators, their registry and `compute_advantage` (docs/algorithms.md §3)."""

import algos_numpy_reference as ref
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrlhf import algos

TOL = dict(rtol=1e-6, atol=1e-6)
# (B, T, group ids): singletons, a group of 3 with a padding row, ties, unsorted and large ids
CASES = [
  (1, 1, [0]),
  (6, 5, [3, 3, 7, 7, 7, 1]),
  (8, 12, [0, 0, 0, 0, 1, 1, 1, 1]),
  (9, 7, [5, 900, 5, 2, 900, 5, 2, 2, 11]),
]


def _batch(seed, B, T, empty_rows=(1,), binary=False):
  rng = np.random.default_rng(seed)
  m = ref.random_batch(rng, B, T, empty_rows=[r for r in empty_rows if r < B])
  if binary:  # outcome rewards on the last valid token, with ties within groups
    r = np.zeros((B, T), np.float32)
    last = np.maximum(m.shape[1] - 1 - np.argmax(m[:, ::-1], axis=1), 0)
    r[np.arange(B), last] = rng.integers(0, 2, size=B)
    r += (rng.random((B, T)) < 0.2) * 5.0 * (1 - m)  # garbage in the padding
  else:
    r = rng.normal(size=(B, T)).astype(np.float32)
  values = rng.normal(size=(B, T)).astype(np.float32)
  return r.astype(np.float32), values, m


def _token_inputs(values):
  """old_log_probs and sum_pi_squared for the optimal token baselines, derived from `values`."""
  values = jnp.asarray(values, jnp.float32)
  old = -jnp.abs(values) - 0.05  # jnp: also called on tracers
  return old, jnp.clip(jnp.exp(2 * old) + 0.3 * jnp.abs(jnp.sin(values)), 0.0, 1.0)


def _run_all(r, values, m, index, baselines, gamma=0.9, lam=0.8, norm=True):
  out = {}
  old, sum_pi_sq = _token_inputs(values)
  for name in algos.ADV_ESTIMATORS.names():
    if name.startswith("test_only"):
      continue
    out[name] = algos.compute_advantage(
      name,
      token_level_rewards=r,
      response_mask=m,
      values=values,
      index=index,
      reward_baselines=baselines,
      gamma=gamma,
      lam=lam,
      norm_adv_by_std_in_grpo=norm,
      old_log_probs=old,
      sum_pi_squared=sum_pi_sq,
    )
  return out


def _reference_all(r, values, m, index, baselines, gamma=0.9, lam=0.8, norm=True):
  same = lambda a: (a, a)  # noqa: E731
  old, sum_pi_sq = _token_inputs(values)
  return dict(
    grpo_vectorized=same(ref.grpo(r, m, index, norm)),
    rloo_vectorized=same(ref.rloo_vectorized(r, m, index)),
    gdpo=same(ref.gdpo(r, m, index, norm=norm)),
    optimal_token_baseline=ref.optimal_token_baseline(r, m, index, old, sum_pi_sq),
    tir_optimal_token_baseline=ref.optimal_token_baseline(r, m, index, old, sum_pi_sq, tir=True),
    gae=ref.gae(r, values, m, gamma, lam),
    grpo=same(ref.grpo(r, m, index, norm)),
    grpo_passk=same(ref.grpo_passk(r, m, index, norm)),
    rloo=same(ref.rloo(r, m, index)),
    reinforce_plus_plus=ref.reinforce_pp(r, m, gamma),
    reinforce_plus_plus_baseline=same(ref.reinforce_pp_baseline(r, m, index)),
    remax=ref.remax(r, m, baselines),
    opo=same(ref.opo(r, m, index)),
    gpg=same(ref.gpg(r, m, index)),
  )


@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize("B,T,index", CASES)
def test_estimators_match_numpy(B, T, index, binary):
  r, values, m = _batch(B * T, B, T, binary=binary)
  index = np.asarray(index, np.int32)
  baselines = np.linspace(-1, 1, B).astype(np.float32)
  got = _run_all(r, values, m, index, baselines)
  want = _reference_all(r, values, m, index, baselines)
  assert set(got) == set(want)
  for name, fn, ref_fn in (
    ("grpo", algos.compute_grpo_outcome_advantage, ref.grpo),
    ("grpo_passk", algos.compute_grpo_passk_outcome_advantage, ref.grpo_passk),
  ):
    got[name + "_no_std"] = fn(r, m, index, norm_adv_by_std_in_grpo=False)
    want[name + "_no_std"] = (ref_fn(r, m, index, norm=False),) * 2
  for name in want:
    for g, w in zip(got[name], want[name]):
      # whitened estimators divide by a batch std: allow fp32 rounding of that division
      tol = (
        dict(rtol=2e-6, atol=2e-6)
        if name in ("gae", "reinforce_plus_plus", "gdpo", "reinforce_plus_plus_baseline")
        else TOL
      )
      assert g.shape == (B, T) and g.dtype == jnp.float32
      np.testing.assert_allclose(g, w, err_msg=name, **tol)


def test_gae_hand_computed():
  # one row, T=3, reward 1 at the end, values .5 .5 .5, gamma=lam=1, last token masked
  r = np.array([[0.0, 1.0, 9.0]], np.float32)
  v = np.array([[0.5, 0.5, 9.0]], np.float32)
  m = np.array([[1.0, 1.0, 0.0]], np.float32)
  adv, ret = algos.compute_gae_advantage_return(r, v, m, 1.0, 1.0)
  # raw advantages: t1: 1 - .5 = .5; t0: 0 + .5 - .5 + .5 = .5 -> returns 1, 1; whitened: var 0 -> 0
  np.testing.assert_allclose(ret, [[1.0, 1.0, 0.0]], **TOL)
  np.testing.assert_allclose(adv, [[0.0, 0.0, 0.0]], **TOL)
  adv, ret = algos.compute_gae_advantage_return(r, v, m, 0.5, 1.0)
  # t1: .5; t0: 0 + .5*.5 - .5 + .5*.5 = 0 -> returns .5, 1.0; whitened: mean .25, unbiased var .125
  np.testing.assert_allclose(ret, [[0.5, 1.0, 0.0]], **TOL)
  np.testing.assert_allclose(adv[0, :2], np.array([-0.25, 0.25]) / np.sqrt(0.125 + 1e-8), rtol=1e-6)


def test_grpo_hand_computed():
  r = np.array([[1.0], [0.0], [1.0], [0.5]], np.float32)
  m = np.ones((4, 1), np.float32)
  adv, ret = algos.compute_grpo_outcome_advantage(r, m, np.array([0, 0, 1, 2], np.int32))
  np.testing.assert_allclose(
    adv[:, 0], [0.5 / (np.sqrt(0.5) + 1e-6), -0.5 / (np.sqrt(0.5) + 1e-6), 1.0 / (1 + 1e-6), 0.5 / (1 + 1e-6)], **TOL
  )
  adv, _ = algos.compute_grpo_outcome_advantage(r, m, np.array([0, 0, 1, 2]), norm_adv_by_std_in_grpo=False)
  np.testing.assert_allclose(adv[:, 0], [0.5, -0.5, 1.0, 0.5], **TOL)
  adv, _ = algos.compute_grpo_passk_outcome_advantage(r, m, np.array([0, 0, 0, 0]), norm_adv_by_std_in_grpo=False)
  np.testing.assert_allclose(adv[:, 0], [0.0, 0.0, 0.0, 0.0], **TOL)  # tie at the top: 1 - 1
  adv, _ = algos.compute_rloo_outcome_advantage(r, m, np.array([0, 0, 0, 1]))
  np.testing.assert_allclose(adv[:, 0], [0.5, -1.0, 0.5, 0.5], **TOL)


def test_compute_advantage_dispatch_errors():
  r, values, m = _batch(0, 4, 3)
  with pytest.raises(ValueError, match="needs `values`"):
    algos.compute_advantage("gae", token_level_rewards=r, response_mask=m)
  with pytest.raises(ValueError, match="needs `index`"):
    algos.compute_advantage("grpo", token_level_rewards=r, response_mask=m)
  with pytest.raises(ValueError, match="needs `reward_baselines`"):
    algos.compute_advantage("remax", token_level_rewards=r, response_mask=m)
  with pytest.raises(ValueError, match="grpo_passk"):
    algos.compute_advantage("ppo", token_level_rewards=r, response_mask=m)
  with pytest.raises(ValueError, match="already registered"):
    algos.register_adv_estimator("grpo")(lambda **k: None)

  @algos.register_adv_estimator("test_only_raw_score")
  def raw(token_level_rewards, response_mask):
    return token_level_rewards * response_mask, token_level_rewards * response_mask

  assert algos.get_adv_estimator("test_only_raw_score") is raw
  adv, _ = algos.compute_advantage("test_only_raw_score", token_level_rewards=r, response_mask=m, index=None)
  np.testing.assert_allclose(adv, r * m)


def test_jit_vmap_grad_bf16():
  B, T = 6, 5
  r, values, m = _batch(3, B, T)
  index = np.array([3, 3, 7, 7, 7, 1], np.int32)
  baselines = np.zeros(B, np.float32)

  def run(rr, vv, mm, ii):
    return {k: v[0] for k, v in _run_all(rr, vv, mm, ii, baselines).items()}

  eager = run(r, values, m, index)
  jitted = jax.jit(run)(r, values, m, index)
  batched = jax.jit(jax.vmap(run))(*(np.stack([a[::-1], a]) for a in (r, values, m, index)))
  for name in eager:
    np.testing.assert_allclose(jitted[name], eager[name], err_msg=name, **TOL)
    np.testing.assert_allclose(batched[name][1], eager[name], err_msg=name, **TOL)
  grads = jax.jit(jax.grad(lambda rr: sum(jnp.sum(v) for v in run(rr, values, m, index).values())))(r)
  assert np.all(np.asarray(grads) == 0)  # advantages are constants of the update
  bf16 = run(jnp.asarray(r, jnp.bfloat16), jnp.asarray(values, jnp.bfloat16), m, index)
  want = run(
    np.asarray(jnp.asarray(r, jnp.bfloat16), np.float32),
    np.asarray(jnp.asarray(values, jnp.bfloat16), np.float32),
    m,
    index,
  )
  for name in eager:
    assert bf16[name].dtype == jnp.float32
    np.testing.assert_allclose(bf16[name], want[name], err_msg=name, **TOL)


def test_reinforce_plus_plus_carries_the_return_through_masked_spans():
  # multi-turn: token 1 is an observation (mask 0); the final reward must still reach token 0 (verl 0.9.1)
  r = np.array([[0.0, 0.0, 0.0, 1.0]], np.float32)
  m = np.array([[1.0, 0.0, 1.0, 1.0]], np.float32)
  _, returns = algos.compute_reinforce_plus_plus_outcome_advantage(r, m, gamma=0.5)
  np.testing.assert_allclose(returns, [[0.25, 0.0, 0.5, 1.0]], **TOL)


def test_new_estimators_need_their_inputs():
  r, values, m = _batch(0, 4, 3)
  with pytest.raises(ValueError, match="needs `old_log_probs`"):
    algos.compute_advantage("optimal_token_baseline", token_level_rewards=r, response_mask=m, index=np.zeros(4))
  with pytest.raises(ValueError, match="needs `sum_pi_squared`"):
    algos.compute_advantage(
      "tir_optimal_token_baseline",
      token_level_rewards=r,
      response_mask=m,
      index=np.zeros(4),
      old_log_probs=-np.ones((4, 3)),
    )
  with pytest.raises(ValueError, match="gdpo_reward_weights"):
    algos.compute_advantage(
      "gdpo",
      token_level_rewards=r,
      response_mask=m,
      index=np.zeros(4),
      reward_components=np.ones((2, 4)),
      reward_weights=(1.0,),
    )


def test_gdpo_normalises_each_component_on_its_own():
  # component "acc" is 100x larger than "format": summed first (GRPO) it would drown "format"
  m = np.ones((4, 2), np.float32)
  index = np.zeros(4, np.int32)
  acc, fmt = np.array([100.0, 0.0, 100.0, 0.0]), np.array([0.0, 0.0, 1.0, 1.0])
  adv, _ = algos.compute_gdpo_outcome_advantage(m * 0, m, index, reward_components={"acc": acc, "format": fmt})
  # each component normalises to +-0.866 (std of two 1s and two 0s is 0.577); rows 2 > 0 = 3 > 1 after whitening
  assert adv[2, 0] > adv[0, 0] > adv[3, 0] > adv[1, 0]
  np.testing.assert_allclose(adv[0, 0], -adv[3, 0], **TOL)
