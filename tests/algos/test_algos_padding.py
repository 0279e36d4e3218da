"""Property: appending masked tokens / masked rows (holding garbage) never changes a result
(docs/algorithms.md, preamble: "padding never changes a result"), for every estimator, loss, metric and statistic."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxrlhf import algos

B, T, EXTRA_N, EXTRA_T = 4, 5, 2, 3  # fixed shapes keep the compiled-op cache warm across examples


@jax.jit  # two fixed shapes: two compiles, then every example runs fast
def _all_results(old, lp, adv, values, r, m, index, baselines):
  out = {}
  sum_pi_squared = jax.nn.sigmoid(values)  # any values in (0, 1)
  for name in (
    "gae",
    "grpo",
    "grpo_passk",
    "rloo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "opo",
    "gpg",
    "gdpo",
    "grpo_vectorized",
    "rloo_vectorized",
    "optimal_token_baseline",
    "tir_optimal_token_baseline",
  ):
    out[name] = algos.compute_advantage(
      name,
      token_level_rewards=r,
      response_mask=m,
      values=values,
      index=index,
      reward_baselines=baselines,
      gamma=0.9,
      lam=0.7,
      old_log_probs=old,
      sum_pi_squared=sum_pi_squared,
    )
  out["gdpo_components"] = algos.compute_advantage(
    "gdpo",
    token_level_rewards=r,
    response_mask=m,
    index=index,
    reward_components=(baselines, baselines**2),
    reward_weights=(1.0, 0.5),
  )
  for loss_mode in (
    "vanilla",
    "gspo",
    "gpg",
    "cispo",
    "geo_mean",
    "kl_cov",
    "clip_cov",
    "sapo",
    "dro",
    "dppo_tv",
    "dppo_kl",
    "bypass_mode",
  ):
    # clip_cov_ratio=1 detaches every candidate, so its random draw does not depend on the shape
    out[loss_mode + "_loss"] = algos.compute_policy_loss(
      old,
      lp,
      adv,
      m,
      loss_mode=loss_mode,
      clip_ratio_high=0.28,
      rng=jax.random.key(0),
      clip_cov_ratio=1.0,
      clip_cov_lb=-1.0,
      kl_cov_ratio=0.3,
      dro_beta=0.2,
      rollout_is="token",
      rollout_is_threshold="0.5_2.0",
      rollout_rs="seq_mean_k2",
      rollout_rs_threshold="0.1",
      loss_type="reinforce",
      rollout_is_weights=None if loss_mode == "bypass_mode" else jnp.exp(jnp.clip(lp - old, -1, 1)),
    )
  for mode in algos.LOSS_AGG_MODES:
    out["agg_" + mode] = algos.agg_loss(lp * adv, m, mode, loss_scale_factor=7.0)
    out["value_" + mode] = algos.compute_value_loss(lp, old, adv, m, 0.2, mode, loss_scale_factor=7.0)
  # masked_whiten transforms masked positions too (as verl): compare it on valid ones only
  out["stats"] = (algos.masked_mean(adv, m), algos.masked_var(adv, m), jnp.where(m > 0, algos.masked_whiten(adv, m), 0))
  out["kl"] = jnp.where(m > 0, algos.kl_penalty(lp, old, "k3+"), 0)
  out["grad"] = jax.grad(lambda x: algos.compute_policy_loss(old, x, adv, m, clip_ratio_c=2.0)[0])(lp)
  return out


@st.composite
def padded_batches(draw):
  seed = draw(st.integers(0, 2**31 - 1))
  rng = np.random.default_rng(seed)
  lengths = np.array(draw(st.lists(st.integers(0, T), min_size=B, max_size=B)))  # 0 = an all-padding row
  m = (np.arange(T)[None] < lengths[:, None]).astype(np.float32)
  index = np.array(draw(st.lists(st.integers(0, 3), min_size=B, max_size=B)), np.int32)
  binary = draw(st.booleans())
  arrays = {
    "old": -np.abs(rng.normal(size=(B, T))).astype(np.float32),
    "adv": rng.normal(size=(B, T)).astype(np.float32),
    "values": rng.normal(size=(B, T)).astype(np.float32),
    "r": (rng.integers(0, 2, size=(B, T)) if binary else rng.normal(size=(B, T))).astype(np.float32),
  }
  arrays["lp"] = (arrays["old"] + rng.normal(size=(B, T)) * 0.5).astype(np.float32)
  baselines = rng.normal(size=B).astype(np.float32)
  garbage = draw(st.sampled_from([0.0, 1e3, np.inf, np.nan]))
  padded = {}
  for key, a in arrays.items():
    # garbage in the masked positions of the original block, and in the appended padding
    a_garbage = np.where(m > 0, a, rng.normal(size=a.shape) * 1e2)
    p = np.full((B + EXTRA_N, T + EXTRA_T), garbage, np.float32)
    p[:B, :T] = a_garbage
    padded[key] = p
  pm = np.zeros((B + EXTRA_N, T + EXTRA_T), np.float32)
  pm[:B, :T] = m
  pindex = np.concatenate([index, rng.integers(0, 4, size=EXTRA_N).astype(np.int32)])
  pbaselines = np.concatenate([baselines, np.full(EXTRA_N, 5.0, np.float32)])
  return (arrays, m, index, baselines), (padded, pm, pindex, pbaselines)


@settings(max_examples=25, deadline=None)
@given(padded_batches())
def test_padding_never_changes_a_result(batches):
  (arrays, m, index, baselines), (padded, pm, pindex, pbaselines) = batches
  base = _all_results(**arrays, m=m, index=index, baselines=baselines)
  pad = _all_results(**padded, m=pm, index=pindex, baselines=pbaselines)
  for key in base:
    for x, y in zip(jax.tree.leaves(base[key]), jax.tree.leaves(pad[key])):
      x, y = np.asarray(x), np.asarray(y)
      if x.ndim == 2:  # per-token outputs: equal on the original block, exactly 0 on the padding
        assert np.all(y[B:] == 0) and np.all(y[:, T:] == 0), key
        y = y[:B, :T]
      # whitened estimators divide by a batch std: fp32 summation order (the padding) shows at ~1e-6
      tol = (
        1e-5
        if key in ("gae", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "gdpo", "gdpo_components")
        else 1e-6
      )
      np.testing.assert_allclose(y, x, rtol=tol, atol=tol, err_msg=key)
