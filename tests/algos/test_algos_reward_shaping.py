"""Sequence scores -> token-level rewards: DAPO's overlong penalty, score placement, KL in the reward
(docs/algorithms.md §2-3)."""

import algos_numpy_reference as ref
import numpy as np
import pytest

from jaxrlhf import algos


def _mask(lengths, length):
  return (np.arange(length)[None, :] < np.asarray(lengths)[:, None]).astype(np.int32)


def test_overlong_penalty_matches_dapo():
  lengths = np.array([0, 5, 6, 7, 8, 10])
  got = algos.overlong_penalty(lengths, max_response_length=10, buffer_len=4, penalty_factor=1.0)
  np.testing.assert_allclose(got, ref.overlong_penalty(lengths, 10, 4, 1.0), rtol=1e-6)
  np.testing.assert_allclose(got, [0, 0, 0, -0.25, -0.5, -1.0], rtol=1e-6)  # free up to 10 - 4 tokens


def test_scores_sit_on_the_last_response_token():
  mask = _mask([3, 1, 0, 5], 5)
  scores = np.array([1.0, -2.0, 7.0, 0.5], np.float32)
  got = np.asarray(algos.place_scores_on_last_token(scores, mask))
  np.testing.assert_allclose(got, ref.place_scores(scores, mask))
  assert got[2].sum() == 0  # an empty response scores nothing


def test_a_multi_turn_score_sits_on_the_policys_last_token():
  # Tool tokens are 0 in the loss mask: the score goes on the last 1, past the holes (verl's last valid token).
  mask = np.array([[1, 1, 0, 0, 0, 1, 1, 0], [1, 0, 0, 0, 0, 0, 0, 1], [1, 1, 1, 0, 0, 0, 0, 0]], np.int32)
  got = np.asarray(algos.place_scores_on_last_token(np.array([0.5, 2.0, -1.0], np.float32), mask))
  want = np.zeros(mask.shape, np.float32)
  want[0, 6], want[1, 7], want[2, 2] = 0.5, 2.0, -1.0
  np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("ctrl", ["fixed", "adaptive"])
@pytest.mark.parametrize("name", ["kl", "low_var_kl", "mse"])
def test_apply_kl_penalty_matches_numpy(ctrl, name):
  rng = np.random.default_rng(0)
  mask = _mask([4, 7, 1, 6], 7)
  scores_tok = ref.place_scores(rng.normal(size=4), mask).astype(np.float32)
  lp = -np.abs(rng.normal(size=(4, 7))).astype(np.float32)
  ref_lp = -np.abs(rng.normal(size=(4, 7))).astype(np.float32)
  for scale in (1.0, 0.0):  # 0: the KL warm-up gate
    rewards, coef, current = algos.apply_kl_penalty(
      scores_tok,
      lp,
      ref_lp,
      mask,
      np.float32(0.05),
      kl_penalty_type=name,
      kl_ctrl_type=ctrl,
      target_kl=0.1,
      horizon=100.0,
      kl_gate=scale,
    )
    want = ref.apply_kl_penalty(scores_tok, lp, ref_lp, mask, 0.05, name, ctrl, 0.1, 100.0, scale)
    np.testing.assert_allclose(rewards, want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(coef, want[1], rtol=1e-6)
    np.testing.assert_allclose(current, want[2], rtol=1e-5)
  assert np.all(np.asarray(rewards)[mask == 0] == 0)


def test_unknown_kl_controller_is_named():
  with pytest.raises(ValueError, match="kl_ctrl.type='pid'"):
    algos.apply_kl_penalty(
      np.zeros((1, 2)),
      np.zeros((1, 2)),
      np.zeros((1, 2)),
      np.ones((1, 2)),
      0.1,
      kl_penalty_type="kl",
      kl_ctrl_type="pid",
    )
