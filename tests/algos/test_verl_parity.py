"""jaxrlhf.algos agrees with verl 0.9.1's formulas (NumPy transcription in verl_reference.py) to 1e-5
on random masked inputs with a padding row, for every shared function (verl_parity_cases.py)."""

import numpy as np
import pytest
import verl_parity_cases as parity

SEEDS = (0, 1, 2)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("case", sorted(parity.CASES))
def test_matches_verl(case, seed):
  results = parity.comparisons(case, seed)
  assert results
  failures = []
  for label, ours, want in results:
    assert ours.shape == want.shape, label
    if not np.allclose(ours, want, **parity.TOL):
      failures.append(f"{label}: max |diff| {np.max(np.abs(ours - want)):.3g}")
  assert not failures, "\n".join(failures)


def test_inputs_exercise_the_interesting_paths():
  """The random inputs reach clipping, rejection, IcePop zeroing and zero tails (else parity is vacuous)."""
  labels = {}
  for case in ("policy_losses", "rollout_correction"):
    for label, ours, _ in parity.comparisons(case, 0):
      labels[label] = float(np.max(np.abs(ours)))
  assert labels["policy_loss/vanilla/token-mean/pg_clipfrac"] > 0
  assert labels["policy_loss/dppo_kl/token-mean/pg_clipfrac"] > 0
  assert labels["policy_loss/dppo_tv/token-mean/pg_clipfrac"] > 0
  rejected = [v for k, v in labels.items() if k.endswith("rollout_rs_masked_fraction")]
  assert rejected and all(0 < v < 1 for v in rejected), rejected
  assert (
    0
    < labels[
      "rollout_correction/1:rollout_is=token,rollout_is_threshold=0.8_1.25,"
      "rollout_is_batch_normalize=True/rollout_corr/rollout_is_oob_ratio"
    ]
    < 1
  )


def test_inputs_reach_the_zero_tail_and_multi_turn_holes():
  from jaxrlhf import algos

  x = parity.inputs(0)
  args = (x["rewards"], x["m"], parity.INDEX, x["old"], x["sum_pi_sq"])
  otb = algos.get_adv_estimator("optimal_token_baseline")
  tir = algos.get_adv_estimator("tir_optimal_token_baseline")
  assert np.abs(np.asarray(otb(*args)[0]) - np.asarray(otb(*args, handle_zero_tail=False)[0])).max() > 0.1
  assert np.abs(np.asarray(otb(*args)[0]) - np.asarray(tir(*args)[0])).max() > 0.1  # holes: positions differ
