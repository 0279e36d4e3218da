"""verl 0.9.1's rollout correction in the step: bypass mode (the sampler's log-probs are the old ones) and
decoupled mode (importance weights and rejection from the old-log-prob phase), fed by the sampler's
log-probs. An fp32 rollout samples from exactly the training policy, so each mode must reproduce the
plain step; a bf16 rollout must not."""

import jax
import numpy as np
import pytest

from jaxrlhf.trainer import Trainer
from tests.helpers import TIMING_DEPENDENT, small_config

CORRECTION = "algorithm.rollout_correction."
STEP_METRICS = ("actor/pg_loss", "actor/ppo_kl", "actor/grad_norm", "critic/vf_loss", "critic/advantages/mean")


def run_step(tmp_path, **overrides):
  # Two epochs: the second sees a moved policy, so old log-probs matter beyond the on-policy shortcut.
  trainer = Trainer(
    small_config(tmp_path, **{"actor_rollout_ref.actor.ppo_epochs": 2, **overrides}), devices=jax.devices()[:1]
  )
  return trainer, trainer.train_step(0)


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
  return run_step(tmp_path_factory.mktemp("plain"))[1]


def assert_same_step(metrics, want, keys=STEP_METRICS):
  for key in keys:
    np.testing.assert_allclose(metrics[key], want[key], rtol=1e-4, atol=1e-5, err_msg=key)


def test_bypass_mode_on_an_fp32_rollout_is_the_plain_step(tmp_path, plain):
  trainer, metrics = run_step(tmp_path, **{CORRECTION + "bypass_mode": True, CORRECTION + "rollout_is": "token"})
  assert trainer.ppo.plan.bypass and not trainer.ppo.plan.old_forward  # no old-log-prob forward at all
  assert "actor/entropy" not in metrics  # as verl: bypass mode has no old-log-prob phase
  assert_same_step(metrics, plain)
  # Diagnostics of the evolving policy against the rollout's, averaged over the updates (the first sees
  # the rollout's own policy, the later ones a moved one).
  assert 0.0 < abs(metrics["rollout_corr/kl"]) < 0.1 and 0.5 < metrics["rollout_corr/rollout_is_mean"] <= 2.0


def test_decoupled_correction_on_an_fp32_rollout_is_the_plain_step(tmp_path, plain):
  _, metrics = run_step(
    tmp_path,
    **{
      CORRECTION + "rollout_is": "token",
      CORRECTION + "rollout_rs": "token_k1",
      CORRECTION + "rollout_rs_threshold": "0.5_2.0",
    },
  )
  assert_same_step(metrics, plain)
  np.testing.assert_allclose(metrics["rollout_corr/rollout_is_mean"], 1.0, atol=1e-5)
  assert metrics["rollout_corr/rollout_rs_masked_fraction"] == 0.0
  np.testing.assert_allclose(metrics["rollout_corr/kl"], 0.0, atol=1e-6)


def test_rejection_leaves_tokens_out_of_the_update(tmp_path, plain):
  """A bf16 rollout differs from the fp32 trainer; a tight k2 bound rejects some tokens, which then
  carry no advantage and no loss."""
  _, metrics = run_step(
    tmp_path,
    **{
      "actor_rollout_ref.rollout.dtype": "bfloat16",
      CORRECTION + "rollout_rs": "token_k2",
      CORRECTION + "rollout_rs_threshold": "1e-6",
    },
  )
  assert 0.0 < metrics["rollout_corr/rollout_rs_masked_fraction"] < 1.0
  assert abs(metrics["rollout_corr/kl"]) > 0.0


@pytest.mark.parametrize("loss_type", ["ppo_clip", "reinforce"])
def test_bypass_mode_of_a_bf16_rollout_fused_equals_phased(tmp_path, loss_type):
  overrides = {
    "actor_rollout_ref.rollout.dtype": "bfloat16",
    CORRECTION + "bypass_mode": True,
    CORRECTION + "loss_type": loss_type,
    CORRECTION + "rollout_is": "sequence",
    CORRECTION + "rollout_is_threshold": "0.5_2.0",
  }
  _, fused = run_step(tmp_path / "fused", **overrides)
  _, phased = run_step(tmp_path / "phased", **overrides, **{"trainer.fuse_step": False})
  assert abs(fused["rollout_corr/kl"]) > 0.0 and "rollout_corr/rollout_is_seq_mean" in fused
  for key, value in fused.items():
    if not key.startswith(TIMING_DEPENDENT):
      np.testing.assert_allclose(phased[key], value, rtol=1e-4, atol=1e-5, err_msg=key)
