"""jaxrlhf.algos against the NumPy transcription of verl 0.9.1 (verl_reference.py), one case per
shared function, on random masked inputs. Used by tests/algos/test_verl_parity.py (pytest) and
benchmarks/verl_parity.py (a table of the largest differences over many seeds).

Each case yields (label, ours, verl's) pairs of arrays or scalars that must agree to 1e-5.
Conventions of the comparison (where jaxrlhf deliberately differs from verl, docs/config.md):
- rows without a valid response token are padding in jaxrlhf (verl never has them): estimators and
  the rollout-correction metrics are compared with verl run on the real rows only, and our outputs
  on padding rows must be exactly 0;
- per-token outputs are compared on valid tokens; ours must be 0 elsewhere (verl leaves values there);
- losses and their metrics are compared on the whole batch, padding rows included: verl's own
  aggregation already ignores them (geo_mean excepted: verl's plain row mean counts them);
- a loss over an empty mask is 0 here, NaN in verl's token-mean (0/0): compared with 0.
"""

import algos_numpy_reference as ours_ref
import numpy as np
import verl_reference as verl

from jaxrlhf import algos

B, T = 10, 12
EMPTY_ROW = 2
# groups of 3, 4 and 3 rows; the padding row sits in the first group
INDEX = np.array([7, 7, 7, 3, 3, 3, 3, 11, 11, 11], np.int32)
# the same with a singleton group (estimators that allow one)
INDEX_WITH_SINGLETON = np.array([7, 7, 7, 3, 3, 3, 3, 11, 11, 5], np.int32)
TOL = dict(rtol=1e-5, atol=1e-5)


def inputs(seed):
  rng = np.random.default_rng(1000 + seed)
  m = ours_ref.random_batch(rng, B, T, empty_rows=[EMPTY_ROW])  # prefixes with interior holes
  old = (-np.abs(rng.normal(size=(B, T))) - 0.02).astype(np.float32)
  lp = np.minimum(old + rng.normal(size=(B, T)) * 0.4, -1e-3).astype(np.float32)
  rollout = np.minimum(lp + rng.normal(size=(B, T)) * 0.15, -1e-3).astype(np.float32)
  adv = rng.normal(size=(B, T)).astype(np.float32)
  values = rng.normal(size=(B, T)).astype(np.float32)
  rewards = np.zeros((B, T), np.float32)
  rewards += rng.normal(size=(B, T)).astype(np.float32) * (rng.random((B, T)) < 0.3)  # process rewards
  rewards *= m  # verl's outcome estimators sum rewards over every position, ours over valid tokens only
  sum_pi_sq = np.clip(np.exp(2 * old) + rng.random((B, T)) * 0.3, 0, 1).astype(np.float32)
  components = rng.normal(size=(2, B)).astype(np.float32)
  baselines = rng.normal(size=B).astype(np.float32)
  return dict(
    m=m,
    old=old,
    lp=lp,
    rollout=rollout,
    adv=adv,
    values=values,
    rewards=rewards,
    sum_pi_sq=sum_pi_sq,
    components=components,
    baselines=baselines,
  )


def _real(m):
  return m.sum(-1) > 0


def _tokens(label, ours, want, m, real=None):
  """Per-token comparison on valid tokens (of the real rows), and ours exactly 0 off the mask."""
  ours = np.asarray(ours, np.float64)
  yield label + "/off-mask-is-0", np.where(m == 0, ours, 0.0), np.zeros_like(ours)
  if real is None:
    yield label, np.where(m > 0, ours, 0.0), np.where(m > 0, want, 0.0)
  else:
    yield label, np.where(m[real] > 0, ours[real], 0.0), np.where(m[real] > 0, want, 0.0)


def _metrics(label, ours, want, keys=None):
  for key in sorted(want if keys is None else keys):
    yield f"{label}/{key}", np.asarray(ours[key], np.float64), np.asarray(want[key], np.float64)


# ------------------------------------------------------------------ cases
def case_agg_loss(x):
  loss, m = x["adv"] * x["lp"], x["m"]
  for mode in algos.LOSS_AGG_MODES:
    yield f"agg_loss/{mode}", algos.agg_loss(loss, m, mode), verl.agg_loss(loss, m, mode)
    yield (
      f"agg_loss/{mode}/loss_scale_factor=7",
      algos.agg_loss(loss, m, mode, loss_scale_factor=7.0),
      verl.agg_loss(loss, m, mode, loss_scale_factor=7),
    )
    # global normalisation over micro-batches: verl's batch_num_tokens / global_batch_size (the real rows)
    norms = algos.loss_normalizers(m, mode, loss_scale_factor=5.0)
    ours = sum(float(algos.agg_loss(loss[s], m[s], mode, **norms)) for s in (slice(0, 3), slice(3, 10)))
    want = sum(
      verl.agg_loss(
        loss[s], m[s], mode, batch_num_tokens=m.sum(), global_batch_size=_real(m).sum(), loss_scale_factor=5.0
      )
      for s in (slice(0, 3), slice(3, 10))
    )
    yield f"agg_loss/{mode}/micro-batches", ours, want


def case_kl(x):
  for name in algos.KL_PENALTY_TYPES:
    if name == "full":
      continue
    yield f"kl_penalty/{name}", algos.kl_penalty(x["lp"], x["old"], name), verl.kl_penalty(x["lp"], x["old"], name)


POLICY_CASES = {
  # loss_mode: (our kwargs, verl function, verl kwargs)
  "vanilla": (
    dict(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0),
    verl.policy_loss_vanilla,
    dict(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0),
  ),
  "gspo": (
    dict(clip_ratio_low=0.0003, clip_ratio_high=0.0004),
    verl.policy_loss_gspo,
    dict(clip_ratio_low=0.0003, clip_ratio_high=0.0004),
  ),
  "sapo": (dict(tau_pos=1.0, tau_neg=1.05), verl.policy_loss_sapo, dict(tau_pos=1.0, tau_neg=1.05)),
  "gpg": (dict(), verl.policy_loss_gpg, dict()),
  "cispo": (
    dict(clip_ratio_low=0.2, clip_ratio_high=0.28),
    verl.policy_loss_cispo,
    dict(clip_ratio_low=0.2, clip_ratio_high=0.28),
  ),
  "dro": (dict(dro_beta=0.3), verl.policy_loss_dro, dict(dro_beta=0.3)),
  "dppo_tv": (
    dict(clip_ratio_low=0.1, clip_ratio_high=0.15, clip_ratio_c=3.0),
    verl.policy_loss_dppo_tv,
    dict(clip_ratio_low=0.1, clip_ratio_high=0.15, clip_ratio_c=3.0),
  ),
  "dppo_kl": (
    dict(clip_ratio_low=0.02, clip_ratio_high=0.05, clip_ratio_c=1.5),
    verl.policy_loss_dppo_kl,
    dict(clip_ratio_low=0.02, clip_ratio_high=0.05, clip_ratio_c=1.5),
  ),
  "kl_cov": (dict(kl_cov_ratio=0.1, ppo_kl_coef=0.5), verl.policy_loss_kl_cov, dict(kl_cov_ratio=0.1, ppo_kl_coef=0.5)),
  "clip_cov": (
    dict(clip_cov_ratio=1.0, clip_cov_lb=0.05, clip_cov_ub=5.0),
    verl.policy_loss_clip_cov_all,
    dict(clip_cov_lb=0.05, clip_cov_ub=5.0),
  ),
}


def case_policy_losses(x):
  import jax

  m = x["m"]
  weights = np.exp(np.clip(x["lp"] - x["rollout"], -1, 1)).astype(np.float32)
  for loss_mode, (our_kwargs, verl_fn, verl_kwargs) in POLICY_CASES.items():
    for mode in algos.LOSS_AGG_MODES:
      for with_weights in (False, True):
        if with_weights and loss_mode in ("kl_cov", "clip_cov"):
          continue  # covered without weights; their weights path is the shared multiply
        extra = dict(rollout_is_weights=weights) if with_weights else {}
        loss, metrics = algos.compute_policy_loss(
          x["old"],
          x["lp"],
          x["adv"],
          m,
          loss_mode=loss_mode,
          loss_agg_mode=mode,
          rng=jax.random.key(0),
          **our_kwargs,
          **extra,
        )
        want_loss, want_metrics = verl_fn(x["old"], x["lp"], x["adv"], m, loss_agg_mode=mode, **verl_kwargs, **extra)
        label = f"policy_loss/{loss_mode}/{mode}" + ("/rollout_is_weights" if with_weights else "")
        yield label, loss, want_loss
        yield from _metrics(label, metrics, want_metrics)
  # geo_mean: verl averages rows with a plain mean (padding rows counted): compare on the real rows
  real = _real(m)
  for with_weights in (False, True):
    extra = dict(rollout_is_weights=weights) if with_weights else {}
    loss, metrics = algos.compute_policy_loss(
      x["old"], x["lp"], x["adv"], m, loss_mode="geo_mean", clip_ratio_low=0.2, clip_ratio_high=0.28, **extra
    )
    want_loss, want_metrics = verl.policy_loss_geo_mean(
      x["old"][real],
      x["lp"][real],
      x["adv"][real],
      m[real],
      clip_ratio_low=0.2,
      clip_ratio_high=0.28,
      **{k: v[real] for k, v in extra.items()},
    )
    label = "policy_loss/geo_mean" + ("/rollout_is_weights" if with_weights else "")
    yield label, loss, want_loss
    yield from _metrics(label, metrics, want_metrics)


ROLLOUT_CORRECTION_CASES = [
  dict(rollout_is="token", rollout_is_threshold=2.0),
  dict(rollout_is="token", rollout_is_threshold="0.8_1.25", rollout_is_batch_normalize=True),
  dict(rollout_is="sequence", rollout_is_threshold=3.0, rollout_is_batch_normalize=True),
  dict(rollout_is="sequence", rollout_is_threshold="0.3_4.0"),
  dict(rollout_rs="token_k1", rollout_rs_threshold="0.8_1.2"),
  dict(rollout_rs="token_k2,token_k3", rollout_rs_threshold="0.02"),
  dict(rollout_rs="seq_sum_k1,seq_mean_k2", rollout_rs_threshold="1.5,0.01"),
  dict(
    rollout_rs="seq_sum_k3,seq_mean_k1,seq_mean_k3,seq_max_k2,seq_max_k3",
    rollout_rs_threshold="0.1,0.97_1.03,0.01,0.05,0.08",
  ),
  dict(rollout_is="token", rollout_is_threshold=1.5, rollout_rs="seq_sum_k2", rollout_rs_threshold="0.05"),
]


def case_rollout_correction(x):
  m, real = x["m"], _real(x["m"])
  for i, config in enumerate(ROLLOUT_CORRECTION_CASES):
    weights, mask, metrics = algos.compute_rollout_correction_and_rejection_mask(x["lp"], x["rollout"], m, **config)
    want_weights, want_mask, want_metrics = verl.compute_rollout_correction_and_rejection_mask(
      x["lp"][real], x["rollout"][real], m[real], **config
    )
    label = f"rollout_correction/{i}:" + ",".join(f"{k}={v}" for k, v in config.items())
    assert set(metrics) == set(want_metrics), set(metrics) ^ set(want_metrics)
    if want_weights is not None:
      yield from _tokens(label + "/weights", weights, want_weights, m, real)
    yield from _tokens(label + "/mask", mask, want_mask, m, real)
    yield from _metrics(label, metrics, want_metrics)
  for loss_type in ("ppo_clip", "reinforce"):
    for config in ROLLOUT_CORRECTION_CASES[1::3]:
      loss, metrics = algos.compute_policy_loss(
        x["rollout"], x["lp"], x["adv"], m, loss_mode="bypass_mode", clip_ratio_high=0.28, loss_type=loss_type, **config
      )
      label = f"policy_loss/bypass_mode/{loss_type}/" + ",".join(f"{k}={v}" for k, v in config.items())
      # the loss over the whole batch (padding rows are outside every mask)
      want_loss, want_pg_metrics = verl.policy_loss_bypass_mode(
        x["rollout"], x["lp"], x["adv"], m, clip_ratio_high=0.28, loss_type=loss_type, **config
      )
      if np.isnan(want_loss):  # every token rejected: verl divides 0 by 0, an empty mask gives 0 here
        yield label + "/all-rejected-is-0", loss, 0.0
      else:
        yield label, loss, want_loss
      yield from _metrics(
        label, metrics, want_pg_metrics, keys=[k for k in want_pg_metrics if not k.startswith("rollout_corr/")]
      )
      _, want_metrics = verl.policy_loss_bypass_mode(
        x["rollout"][real], x["lp"][real], x["adv"][real], m[real], clip_ratio_high=0.28, loss_type=loss_type, **config
      )
      yield from _metrics(label, metrics, want_metrics, keys=[k for k in want_metrics if k.startswith("rollout_corr/")])


def case_value_loss(x):
  m = x["m"]
  vpreds = x["values"] + x["adv"] * 0.5
  for mode in algos.LOSS_AGG_MODES:
    loss, clipfrac = algos.compute_value_loss(vpreds, x["values"], x["lp"], m, 0.3, loss_agg_mode=mode)
    want_loss, want_clipfrac = verl.value_loss(vpreds, x["lp"], x["values"], m, 0.3, loss_agg_mode=mode)
    yield f"value_loss/{mode}", loss, want_loss
    yield f"value_loss/{mode}/vf_clipfrac", clipfrac, want_clipfrac


def case_advantages(x):
  m, r, real = x["m"], x["rewards"], _real(x["m"])
  gamma, lam = 0.9, 0.8
  on_real = lambda a: a[real]  # noqa: E731
  for index in (INDEX, INDEX_WITH_SINGLETON):
    kw = dict(
      token_level_rewards=r,
      response_mask=m,
      index=index,
      values=x["values"],
      reward_baselines=x["baselines"],
      gamma=gamma,
      lam=lam,
      old_log_probs=x["old"],
      sum_pi_squared=x["sum_pi_sq"],
    )
    rr, mm, ii = r[real], m[real], index[real]
    want = {
      "gae": verl.gae(rr, on_real(x["values"]), mm, gamma, lam),
      "grpo": verl.grpo(rr, mm, ii),
      "grpo_vectorized": verl.grpo_vectorized(rr, mm, ii),
      "rloo": verl.rloo(rr, mm, ii),
      "rloo_vectorized": verl.rloo_vectorized(rr, mm, ii),
      "reinforce_plus_plus": verl.reinforce_plus_plus(rr, mm, gamma),
      "reinforce_plus_plus_baseline": verl.reinforce_plus_plus_baseline(rr, mm, ii),
      "remax": verl.remax(rr, on_real(x["baselines"]), mm),
      "opo": verl.opo(rr, mm, ii),
      "gpg": verl.gpg(rr, mm, ii),
      "gdpo": verl.gdpo(rr, mm, ii),
      "optimal_token_baseline": verl.optimal_token_baseline(rr, mm, ii, on_real(x["old"]), on_real(x["sum_pi_sq"])),
      "tir_optimal_token_baseline": verl.tir_optimal_token_baseline(
        rr, mm, ii, on_real(x["old"]), on_real(x["sum_pi_sq"])
      ),
    }
    if index is INDEX:  # pass@k needs two samples per group (verl raises)
      want["grpo_passk"] = verl.grpo_passk(rr, mm, ii)
    for name, (want_adv, want_ret) in want.items():
      adv, ret = algos.compute_advantage(name, **kw)
      label = f"advantage/{name}" + ("/singleton" if index is INDEX_WITH_SINGLETON else "")
      yield label + "/padding-row-is-0", np.asarray(adv)[~real], np.zeros_like(np.asarray(adv)[~real])
      yield from _tokens(label + "/advantages", adv, want_adv, m, real)
      yield from _tokens(label + "/returns", ret, want_ret, m, real)
  # gdpo with reward components and weights; the no-std variants
  for norm in (True, False):
    adv, _ = algos.compute_advantage(
      "gdpo",
      token_level_rewards=r,
      response_mask=m,
      index=INDEX,
      reward_components={"format": x["components"][0], "acc": x["components"][1]},
      reward_weights=(1.0, 0.5),
      norm_adv_by_std_in_grpo=norm,
    )
    want_adv, _ = verl.gdpo(
      r[real],
      m[real],
      INDEX[real],
      components=x["components"][:, real],
      weights=[1.0, 0.5],
      norm_adv_by_std_in_grpo=norm,
    )
    yield from _tokens(f"advantage/gdpo/components/norm={norm}", adv, want_adv, m, real)
    for name, fn in (("grpo", verl.grpo), ("grpo_passk", verl.grpo_passk)):
      adv, _ = algos.compute_advantage(
        name, token_level_rewards=r, response_mask=m, index=INDEX, norm_adv_by_std_in_grpo=norm
      )
      want_adv, _ = fn(r[real], m[real], INDEX[real], norm_adv_by_std_in_grpo=norm)
      yield from _tokens(f"advantage/{name}/norm={norm}", adv, want_adv, m, real)
  # optimal token baselines with rollout IS weights and without the zero-tail rule
  weights = np.exp(np.clip(x["lp"] - x["rollout"], -1, 1)).astype(np.float32)
  for name, fn in (
    ("optimal_token_baseline", verl.optimal_token_baseline),
    ("tir_optimal_token_baseline", verl.tir_optimal_token_baseline),
  ):
    for tail in (True, False):
      estimator = algos.get_adv_estimator(name)
      adv, _ = estimator(r, m, INDEX, x["old"], x["sum_pi_sq"], rollout_is_weights=weights, handle_zero_tail=tail)
      want_adv, _ = fn(
        r[real],
        m[real],
        INDEX[real],
        x["old"][real],
        x["sum_pi_sq"][real],
        rollout_is_weights=weights[real],
        handle_zero_tail=tail,
      )
      yield from _tokens(f"advantage/{name}/rollout_is_weights/handle_zero_tail={tail}", adv, want_adv, m, real)


CASES = {
  "agg_loss": case_agg_loss,
  "kl": case_kl,
  "policy_losses": case_policy_losses,
  "rollout_correction": case_rollout_correction,
  "value_loss": case_value_loss,
  "advantages": case_advantages,
}


def comparisons(case, seed):
  """[(label, ours as float64 array, verl's as float64 array)] of one case on one seed."""
  return [
    (label, np.asarray(ours, np.float64), np.asarray(want, np.float64))
    for label, ours, want in CASES[case](inputs(seed))
  ]
