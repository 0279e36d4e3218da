"""Policy losses, value loss and their registry (docs/algorithms.md §4)."""

import algos_numpy_reference as ref
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrlhf import algos

TOL = dict(rtol=1e-6, atol=1e-6)
SHAPES = [(1, 1), (4, 9), (8, 16)]


def _inputs(seed, shape, spread=0.5):
  rng = np.random.default_rng(seed)
  old = -np.abs(rng.normal(size=shape)).astype(np.float32)
  lp = (old + rng.normal(size=shape) * spread).astype(np.float32)
  adv = rng.normal(size=shape).astype(np.float32)
  m = ref.random_batch(rng, *shape, empty_rows=[1] if shape[0] > 2 else [])
  return old, lp, adv, m


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("clips", [(0.2, 0.2, 3.0), (0.1, 0.4, 1.5)])
def test_vanilla_matches_numpy(shape, clips):
  old, lp, adv, m = _inputs(sum(shape), shape, spread=1.0)
  lo, hi, c = clips
  for mode in algos.LOSS_AGG_MODES:
    loss, metrics = algos.compute_policy_loss(
      old, lp, adv, m, clip_ratio=0.2, clip_ratio_low=lo, clip_ratio_high=hi, clip_ratio_c=c, loss_agg_mode=mode
    )
    want, want_metrics = ref.policy_vanilla(old, lp, adv, m, lo, hi, c, mode)
    np.testing.assert_allclose(loss, want, err_msg=mode, **TOL)
    for key in ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"):
      np.testing.assert_allclose(metrics[key], want_metrics[key], err_msg=key, **TOL)


def test_vanilla_hand_computed():
  old = np.zeros((1, 4), np.float32)
  lp = np.log(np.array([[1.5, 0.5, 4.0, 1.1]], np.float32))
  adv = np.array([[1.0, -1.0, -1.0, 2.0]], np.float32)
  m = np.ones((1, 4), np.float32)
  loss, metrics = algos.compute_policy_loss(old, lp, adv, m)
  # token 0: A>0, ratio 1.5 -> clipped at 1.2 -> -1.2; token 1: A<0, ratio .5 -> max(.5, .8) = .8;
  # token 2: A<0, ratio 4 -> lc = 4 > dual cap 3 -> 3; token 3: unclipped -2.2
  np.testing.assert_allclose(loss, (-1.2 + 0.8 + 3.0 - 2.2) / 4, **TOL)
  np.testing.assert_allclose(metrics["pg_clipfrac"], 2 / 4, **TOL)
  np.testing.assert_allclose(metrics["pg_clipfrac_lower"], 1 / 4, **TOL)


@pytest.mark.parametrize("lo,hi", [(0.2, 0.2), (0.2, 0.28)])
def test_vanilla_gradient_is_zero_exactly_where_clipped(lo, hi):
  old, lp, adv, m = _inputs(11, (8, 16), spread=1.0)
  c = 3.0
  grad = jax.grad(
    lambda x: algos.compute_policy_loss(old, x, adv, m, clip_ratio_low=lo, clip_ratio_high=hi, clip_ratio_c=c)[0]
  )(lp)
  ratio = np.exp(np.clip(lp.astype(np.float64) - old, -20, 20))
  clipped_high = (adv > 0) & (ratio > 1 + hi)  # clip-higher: upside capped for good actions
  clipped_low = (adv < 0) & (ratio < 1 - lo)
  dual_clipped = (adv < 0) & (ratio > c)  # dual clip caps the loss of bad actions
  no_grad = clipped_high | clipped_low | dual_clipped | (m == 0)
  assert no_grad.any() and (~no_grad).any() and dual_clipped.any() and clipped_high.any()
  np.testing.assert_array_equal(np.asarray(grad)[no_grad], 0.0)
  assert np.all(np.asarray(grad)[~no_grad & (adv != 0)] != 0)
  # where it flows it is the unclipped PPO gradient -A * ratio / N
  free = ~no_grad
  np.testing.assert_allclose(np.asarray(grad)[free], (-adv * ratio / m.sum())[free], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("shape", SHAPES)
def test_other_modes_match_numpy(shape):
  old, lp, adv, m = _inputs(3 + sum(shape), shape)
  lo, hi = 0.2, 0.28
  common = dict(clip_ratio_low=lo, clip_ratio_high=hi)
  for mode in algos.LOSS_AGG_MODES:
    np.testing.assert_allclose(
      algos.compute_policy_loss(old, lp, adv, m, loss_mode="gpg", loss_agg_mode=mode)[0],
      ref.policy_gpg(old, lp, adv, m, mode),
      **TOL,
    )
    np.testing.assert_allclose(
      algos.compute_policy_loss(old, lp, adv, m, loss_mode="cispo", loss_agg_mode=mode, **common)[0],
      ref.policy_cispo(old, lp, adv, m, lo, hi, mode),
      **TOL,
    )
    np.testing.assert_allclose(
      algos.compute_policy_loss(
        old, lp, adv, m, loss_mode="kl_cov", loss_agg_mode=mode, kl_cov_ratio=0.1, ppo_kl_coef=0.5
      )[0],
      ref.policy_kl_cov(old, lp, adv, m, 0.1, 0.5, mode),
      **TOL,
    )
    # gspo follows loss_agg_mode (verl 0.9.1); geo_mean aggregates by sequence whatever it says (as verl)
    np.testing.assert_allclose(
      algos.compute_policy_loss(old, lp, adv, m, loss_mode="gspo", loss_agg_mode=mode, **common)[0],
      ref.policy_gspo(old, lp, adv, m, lo, hi, mode),
      **TOL,
    )
    np.testing.assert_allclose(
      algos.compute_policy_loss(old, lp, adv, m, loss_mode="geo_mean", loss_agg_mode=mode, **common)[0],
      ref.policy_geo_mean(old, lp, adv, m, lo, hi),
      **TOL,
    )


def test_gspo_sequence_ratio_gradient():
  old, lp, adv, m = _inputs(21, (4, 6), spread=0.05)
  adv = np.repeat(adv[:, :1], 6, axis=1)  # sequence-level advantages, as GSPO assumes
  grad = jax.grad(lambda x: algos.compute_policy_loss(old, x, adv, m, loss_mode="gspo", clip_ratio=10.0)[0])(lp)
  # unclipped, token-mean: loss = sum_bt -A_b s_b / N, d/dlp_bt = -A_b s_b / N (the sequence ratio's
  # gradient flows through each token's own log-prob only)
  lengths = m.sum(-1)
  s = np.exp([(((lp - old) * m)[b].sum() / max(lengths[b], 1)) for b in range(4)])
  want = -adv * s[:, None] / m.sum() * m
  np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-7)


def test_cispo_keeps_gradient_of_clipped_tokens():
  old, lp, adv, m = _inputs(5, (4, 8), spread=1.0)
  grad = jax.grad(lambda x: algos.compute_policy_loss(old, x, adv, m, loss_mode="cispo")[0])(lp)
  w = np.clip(np.exp(lp.astype(np.float64) - old), 0.8, 1.2)
  np.testing.assert_allclose(grad, -w * adv * m / m.sum(), rtol=1e-5, atol=1e-7)


def test_cispo_reports_no_lower_clip_fraction_as_verl():
  old = np.zeros((1, 3), np.float32)
  lp = np.log(np.array([[0.5, 1.0, 2.0]], np.float32))  # ratios below, inside and above [0.8, 1.2]
  _, metrics = algos.compute_policy_loss(old, lp, -np.ones((1, 3), np.float32), np.ones((1, 3)), loss_mode="cispo")
  np.testing.assert_allclose([metrics["pg_clipfrac"], metrics["pg_clipfrac_lower"]], [2 / 3, 0.0], **TOL)


def test_new_losses_hand_computed():
  old = np.log(np.array([[0.5, 0.5]], np.float32))
  lp = np.log(np.array([[0.8, 0.4]], np.float32))
  adv = np.array([[1.0, -1.0]], np.float32)
  m = np.ones((1, 2), np.float32)
  ratio = np.array([1.6, 0.8])
  # sapo: gate = sigmoid(tau (r - 1)) * 4 / tau, loss = -gate * A, seq-mean-token-mean
  gate = 1 / (1 + np.exp(-np.array([1.0, 1.05]) * (ratio - 1))) * 4 / np.array([1.0, 1.05])
  loss, _ = algos.compute_policy_loss(old, lp, adv, m, loss_mode="sapo")
  np.testing.assert_allclose(loss, np.mean(-gate * adv[0]), **TOL)
  # dro: -(lp A - beta/2 (lp - old)^2)
  loss, _ = algos.compute_policy_loss(old, lp, adv, m, loss_mode="dro", dro_beta=0.5)
  want = -(lp[0] * adv[0] - 0.25 * np.log(ratio) ** 2)
  np.testing.assert_allclose(loss, want.mean(), **TOL)
  with pytest.raises(ValueError, match="dro_beta"):
    algos.compute_policy_loss(old, lp, adv, m, loss_mode="dro")
  # dppo_tv: token 0 moved p by +0.3 > 0.2 with A > 0: masked; token 1 by -0.1 >= -0.2: kept
  loss, metrics = algos.compute_policy_loss(old, lp, adv, m, loss_mode="dppo_tv")
  np.testing.assert_allclose(loss, (0 + 1.0 * 0.8 * lp[0, 1]) / 2, **TOL)
  np.testing.assert_allclose(metrics["pg_clipfrac"], 0.5, **TOL)


def test_geo_mean_hand_computed():
  old = np.zeros((1, 2), np.float32)
  lp = np.array([[0.5, -0.1]], np.float32)
  adv = np.ones((1, 2), np.float32)
  loss, metrics = algos.compute_policy_loss(old, lp, adv, np.ones((1, 2)), loss_mode="geo_mean", clip_ratio=0.2)
  np.testing.assert_allclose(loss, -np.exp((0.2 - 0.1) / 2), **TOL)  # 0.5 clipped to 0.2
  np.testing.assert_allclose(metrics["pg_clipfrac"], 0.5, **TOL)


def test_clip_cov_detaches_random_high_covariance_tokens():
  old, lp, adv, m = _inputs(8, (8, 16), spread=0.05)
  adv = adv * 4  # make covariances reach (lb, ub) = (1, 5)
  kwargs = dict(loss_mode="clip_cov", clip_cov_lb=1.0, clip_cov_ub=5.0)
  # with a large ratio every candidate is detached: deterministic, compare with numpy
  loss_all, metrics_all = algos.compute_policy_loss(
    old, lp, adv, m, rng=jax.random.key(0), clip_cov_ratio=0.9, **kwargs
  )
  lp64, adv64 = lp.astype(np.float64), adv.astype(np.float64)
  ratio = np.exp(lp64 - old)
  l1, l2 = -adv64 * ratio, -adv64 * np.clip(ratio, 0.8, 1.2)
  cov = (adv64 - ref.masked_mean(adv64, m)) * (lp64 - ref.masked_mean(lp64, m))
  candidates = (m > 0) & ~(l2 > l1) & (cov > 1.0) & (cov < 5.0)
  assert 2 < candidates.sum() < 0.9 * m.sum()
  np.testing.assert_allclose(loss_all, ref.agg_loss(np.maximum(l1, l2) * ~candidates, m, "token-mean"), **TOL)
  np.testing.assert_allclose(metrics_all["pg_clipfrac"], candidates.sum() / m.sum(), **TOL)
  # a small ratio detaches exactly max(floor(ratio * n), 1) of them, chosen by the key
  n_detach = max(int(0.02 * m.sum()), 1)
  losses = set()
  for seed in range(6):
    loss, metrics = algos.compute_policy_loss(old, lp, adv, m, rng=jax.random.key(seed), clip_cov_ratio=0.02, **kwargs)
    np.testing.assert_allclose(metrics["pg_clipfrac"] * m.sum(), n_detach, rtol=1e-6)
    losses.add(round(float(loss), 6))
  assert len(losses) > 1
  again = algos.compute_policy_loss(old, lp, adv, m, rng=jax.random.key(0), clip_cov_ratio=0.02, **kwargs)[0]
  assert again == algos.compute_policy_loss(old, lp, adv, m, rng=jax.random.key(0), clip_cov_ratio=0.02, **kwargs)[0]
  with pytest.raises(ValueError, match="rng"):
    algos.compute_policy_loss(old, lp, adv, m, loss_mode="clip_cov")


def test_kl_cov_defaults_penalise_one_token():
  old, lp, adv, m = _inputs(9, (4, 8))
  loss = algos.compute_policy_loss(old, lp, adv, m, loss_mode="kl_cov")[0]
  np.testing.assert_allclose(loss, ref.policy_kl_cov(old, lp, adv, m, 0.0002, 1.0, "token-mean"), **TOL)


@pytest.mark.parametrize("mode", algos.LOSS_AGG_MODES)
@pytest.mark.parametrize("shape", SHAPES)
def test_value_loss_matches_numpy(mode, shape):
  rng = np.random.default_rng(sum(shape))
  values = rng.normal(size=shape).astype(np.float32)
  vpreds = (values + rng.normal(size=shape)).astype(np.float32)
  returns = rng.normal(size=shape).astype(np.float32)
  m = ref.random_batch(rng, *shape, empty_rows=[0] if shape[0] > 2 else [])
  loss, clipfrac = algos.compute_value_loss(vpreds, values, returns, m, 0.5, loss_agg_mode=mode)
  want_loss, want_clipfrac = ref.value_loss(vpreds, values, returns, m, 0.5, mode)
  np.testing.assert_allclose(loss, want_loss, **TOL)
  np.testing.assert_allclose(clipfrac, want_clipfrac, **TOL)


def test_value_loss_hand_computed():
  vpreds, values, returns = (np.array([[x, y]], np.float32) for x, y in ((2.0, 0.1), (0.0, 0.0), (1.0, 0.0)))
  loss, clipfrac = algos.compute_value_loss(vpreds, values, returns, np.ones((1, 2)), 0.5)
  # token 0: vclip 0.5, max((2-1)^2, (0.5-1)^2) = 1; token 1: unclipped 0.01 -> 0.5 * mean = 0.2525
  np.testing.assert_allclose(loss, 0.5 * (1.0 + 0.01) / 2, **TOL)
  np.testing.assert_allclose(clipfrac, 0.0, **TOL)
  loss, clipfrac = algos.compute_value_loss(
    np.array([[0.0]]), np.array([[1.0]]), np.array([[0.0]]), np.ones((1, 1)), 0.2
  )
  np.testing.assert_allclose([loss, clipfrac], [0.5 * 0.64, 1.0], **TOL)


@pytest.mark.parametrize(
  "loss_mode,agg_mode",
  [("vanilla", mode) for mode in algos.LOSS_AGG_MODES]
  + [
    ("cispo", "token-mean"),
    ("gspo", "seq-mean-token-sum-norm"),
    ("geo_mean", "token-mean"),
    ("sapo", "token-mean"),
    ("dppo_kl", "seq-mean-token-mean"),
    ("dppo_tv", "token-sum"),
    ("dro", "token-mean"),
    ("bypass_mode", "token-mean"),
  ],
)
def test_micro_batches_sum_to_mini_batch_loss_grad_and_metrics(loss_mode, agg_mode):
  old, lp, adv, m = _inputs(13, (8, 10), spread=1.0)
  m[3] = 0
  norms = algos.loss_normalizers(m, agg_mode)

  mode_kwargs = dict(dro_beta=0.1)  # a config key other modes ignore

  def full(x):
    return algos.compute_policy_loss(old, x, adv, m, loss_mode=loss_mode, loss_agg_mode=agg_mode, **mode_kwargs)

  def split(x):
    total, metrics = 0.0, {}
    for sl in (slice(0, 2), slice(2, 5), slice(5, 8)):  # uneven micro-batches
      loss, mt = algos.compute_policy_loss(
        old[sl], x[sl], adv[sl], m[sl], loss_mode=loss_mode, loss_agg_mode=agg_mode, **norms, **mode_kwargs
      )
      total = total + loss
      metrics = {k: metrics.get(k, 0.0) + v for k, v in mt.items()}
    return total, metrics

  # jitted: one compile each instead of eager op-by-op compiles of the gradient (test speed)
  (loss_full, metrics_full), (loss_split, metrics_split) = jax.jit(full)(lp), jax.jit(split)(lp)
  np.testing.assert_allclose(loss_split, loss_full, **TOL)
  for key in ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"):  # rollout_corr/* are per-micro-batch means
    np.testing.assert_allclose(metrics_split[key], metrics_full[key], err_msg=key, **TOL)
  grad_split = jax.jit(jax.grad(lambda x: split(x)[0]))(lp)
  np.testing.assert_allclose(grad_split, jax.jit(jax.grad(lambda x: full(x)[0]))(lp), **TOL)

  vpreds = lp * 2
  vfull = algos.compute_value_loss(vpreds, old, adv, m, 0.2, agg_mode)
  vsplit = [
    algos.compute_value_loss(vpreds[s], old[s], adv[s], m[s], 0.2, agg_mode, **norms)
    for s in (slice(0, 3), slice(3, 8))
  ]
  np.testing.assert_allclose(np.sum(vsplit, axis=0), vfull, **TOL)


@pytest.mark.parametrize("loss_mode", sorted(algos.POLICY_LOSSES.names()))
def test_all_modes_jit_vmap_grad_bf16(loss_mode):
  old, lp, adv, m = _inputs(17, (4, 8))
  key = jax.random.key(1)

  def fn(o, x, a, mm):
    return algos.compute_policy_loss(o, x, a, mm, loss_mode=loss_mode, rng=key, clip_cov_ratio=0.1, dro_beta=0.1)

  eager, _ = fn(old, lp, adv, m)
  jitted, metrics = jax.jit(fn)(old, lp, adv, m)
  np.testing.assert_allclose(jitted, eager, **TOL)
  assert {"pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"} <= set(metrics)
  grad = jax.jit(jax.grad(lambda x: fn(old, x, adv, m)[0]))(lp)
  assert np.all(np.isfinite(grad)) and np.all(np.asarray(grad)[m == 0] == 0)
  stacked = [np.stack([a, a[::-1]]) for a in (old, lp, adv, m)]
  batched, _ = jax.jit(jax.vmap(fn))(*stacked)
  np.testing.assert_allclose(batched[0], eager, **TOL)
  np.testing.assert_allclose(batched[1], fn(old[::-1], lp[::-1], adv[::-1], m[::-1])[0], **TOL)
  bf16 = [jnp.asarray(a, jnp.bfloat16) for a in (old, lp, adv)]
  loss_bf16, _ = fn(*bf16, m)
  assert loss_bf16.dtype == jnp.float32
  np.testing.assert_allclose(loss_bf16, fn(*(np.asarray(a, np.float32) for a in bf16), m)[0], **TOL)


def test_registry_errors_and_custom_loss():
  with pytest.raises(ValueError, match="vanilla"):
    algos.compute_policy_loss(
      jnp.zeros((1, 1)), jnp.zeros((1, 1)), jnp.zeros((1, 1)), jnp.ones((1, 1)), loss_mode="nope"
    )
  with pytest.raises(ValueError, match="already registered"):
    algos.register_policy_loss("vanilla")(lambda *a, **k: None)
  with pytest.raises(ValueError, match="clip_ratio_c"):
    algos.compute_policy_loss(
      jnp.zeros((1, 1)), jnp.zeros((1, 1)), jnp.zeros((1, 1)), jnp.ones((1, 1)), clip_ratio_c=1.0
    )

  @algos.register_policy_loss("test_only_reinforce")
  def reinforce(old_log_prob, log_prob, advantages, response_mask, *, loss_agg_mode, agg_kwargs, scale=1.0, **unused):
    loss = algos.agg_loss(-scale * log_prob * advantages, response_mask, loss_agg_mode, **agg_kwargs)
    return loss, dict(pg_clipfrac=0.0, pg_clipfrac_lower=0.0, ppo_kl=0.0)

  old, lp, adv, m = _inputs(2, (3, 4))
  loss, _ = algos.compute_policy_loss(old, lp, adv, m, loss_mode="test_only_reinforce", scale=2.0)
  np.testing.assert_allclose(loss, 2 * ref.policy_gpg(old, lp, adv, m, "token-mean"), **TOL)
  # verl policy_loss config keys a mode does not use are dropped; a typo is an error
  algos.compute_policy_loss(old, lp, adv, m, clip_cov_ratio=0.1, kl_cov_ratio=None)
  with pytest.raises(TypeError):
    algos.compute_policy_loss(old, lp, adv, m, clip_ratio_hihg=0.3)
