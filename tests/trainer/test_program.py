"""The step program's model configs: which section's keys reach which model."""

from jaxrlhf.config import resolve_config
from jaxrlhf.trainer.program import model_configs
from tests.helpers import small_config


def test_critic_compute_keys_apply_without_its_own_path(tmp_path):
  config = small_config(tmp_path, **{"critic.model.dtype": "bfloat16",
                                     "critic.model.enable_gradient_checkpointing": True,
                                     "critic.model.remat_policy": "dots_saveable"})
  actor, critic, reward = model_configs(resolve_config(config))
  assert (actor.dtype, actor.remat_policy) == ("float32", "none")
  assert (critic.dtype, critic.remat_policy) == ("bfloat16", "dots_saveable")
  # Otherwise the actor's architecture: the critic starts from the same backbone.
  assert (critic.hidden_size, critic.num_hidden_layers, critic.vocab_size) == (
      actor.hidden_size, actor.num_hidden_layers, actor.vocab_size)
  assert reward is None


def test_validation_metrics_follow_verl():
  import numpy as np
  from jaxrlhf.trainer.validation import validation_metrics
  scores = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])  # 3 prompts x n=2
  metrics = validation_metrics(["a", "a", "b"], scores, np.ones((6, 4)))
  assert metrics["val-core/a/reward/mean@2"] == 0.75 and metrics["val-core/b/reward/mean@2"] == 0.0
  assert metrics["val-aux/a/reward/std@2"] == 0.25  # std 0.5 and 0, averaged over a's prompts
  # best@2 of [1, 0]: at least one 1 in 2 draws with replacement, 3/4 of the time; [1, 1] always.
  assert abs(metrics["val-core/a/reward/best@2/mean"] - (0.75 + 1.0) / 2) < 0.03
  assert abs(metrics["val-aux/a/reward/worst@2/mean"] - (0.25 + 1.0) / 2) < 0.03
  assert "val-core/a/reward/best@2/std" in metrics and metrics["val/response_length/mean"] == 4.0
  one = validation_metrics(["a"], np.array([[0.5]]), np.ones((1, 2)))
  assert set(one) == {"val-core/a/reward/mean@1", "val/response_length/mean"}
