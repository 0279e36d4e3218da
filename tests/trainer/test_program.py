"""The step program's model configs: which section's keys reach which model."""

from jaxrlhf.config import resolve_config
from jaxrlhf.trainer.program import model_configs
from tests.helpers import small_config


def test_critic_compute_keys_apply_without_its_own_path(tmp_path):
  config = small_config(
    tmp_path,
    **{
      "critic.model.dtype": "bfloat16",
      "critic.model.enable_gradient_checkpointing": True,
      "critic.model.remat_policy": "dots_saveable",
    },
  )
  actor, critic, reward = model_configs(resolve_config(config))
  assert (actor.dtype, actor.remat_policy) == ("float32", "none")
  assert (critic.dtype, critic.remat_policy) == ("bfloat16", "dots_saveable")
  # Otherwise the actor's architecture: the critic starts from the same backbone.
  assert (critic.hidden_size, critic.num_hidden_layers, critic.vocab_size) == (
    actor.hidden_size,
    actor.num_hidden_layers,
    actor.vocab_size,
  )
  assert reward is None


def test_validation_metrics_follow_verl():
  import numpy as np

  from jaxrlhf.trainer.validation import validation_metrics

  scores = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])  # 3 prompts x n=2
  metrics = validation_metrics(["a", "a", "b"], {"reward": scores}, np.ones((6, 4)))
  assert metrics["val-core/a/reward/mean@2"] == 0.75 and metrics["val-core/b/reward/mean@2"] == 0.0
  assert metrics["val-aux/a/reward/std@2"] == 0.25  # std 0.5 and 0, averaged over a's prompts
  # best@2 of [1, 0]: at least one 1 in 2 draws with replacement, 3/4 of the time; [1, 1] always.
  assert abs(metrics["val-core/a/reward/best@2/mean"] - (0.75 + 1.0) / 2) < 0.03
  assert abs(metrics["val-aux/a/reward/worst@2/mean"] - (0.25 + 1.0) / 2) < 0.03
  assert "val-core/a/reward/best@2/std" in metrics and metrics["val/response_length/mean"] == 4.0
  one = validation_metrics(["a"], {"reward": np.array([[0.5]])}, np.ones((1, 2)))
  assert set(one) == {"val-core/a/reward/mean@1", "val/response_length/mean"}


def _verl_majority(values, preds, k, seed=42, draws=1000):
  """verl 0.9.1's maj@k, written out: bootstrap subsets, the first value of the most-voted pred."""
  import numpy as np

  np.random.seed(seed)
  picks = np.random.choice(len(values), size=(draws, k), replace=True)
  out = []
  for pick in picks:
    votes = {}
    for i in pick:
      votes.setdefault(preds[i], []).append(values[i])
    out.append(max(votes.items(), key=lambda item: len(item[1]))[1][0])
  return float(np.mean(out)), float(np.std(out))


def test_validation_core_variable_is_acc_and_majority_votes_on_pred():
  """verl: with an `acc` from the reward it is the core variable (reward goes to val-aux); with a text
  `pred`, maj@k bootstraps the majority answer's value."""
  import numpy as np

  from jaxrlhf.trainer.validation import validation_metrics

  reward = np.array([[1.0, 0.1, 1.0, 0.1], [0.1, 0.1, 1.0, 0.1]])
  acc = (reward == 1.0).astype(np.float32)
  pred = np.array([["7", "3", "7", "5"], ["2", "2", "9", "2"]], dtype=object)
  metrics = validation_metrics(["s", "s"], {"reward": reward, "acc": acc, "pred": pred}, np.ones((8, 3)))
  assert metrics["val-core/s/acc/mean@4"] == 0.375
  assert "val-aux/s/reward/mean@4" in metrics and "val-core/s/reward/mean@4" not in metrics
  assert not any("/pred/" in key for key in metrics)  # text is what is voted on, not a variable
  for k, section in ((2, "val-aux"), (4, "val-core")):
    want = [_verl_majority(acc[p], list(pred[p]), k) for p in range(2)]
    np.testing.assert_allclose(metrics[f"{section}/s/acc/maj@{k}/mean"], np.mean([w[0] for w in want]), atol=1e-9)
    np.testing.assert_allclose(metrics[f"{section}/s/acc/maj@{k}/std"], np.mean([w[1] for w in want]), atol=1e-9)
  # Majority of prompt 1 is "2" (acc 0): maj@4 is well below best@4.
  assert metrics["val-core/s/acc/maj@4/mean"] < metrics["val-core/s/acc/best@4/mean"]
