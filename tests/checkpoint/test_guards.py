"""Guards: reward-collapse detection, KL warm-up, the exit of a run stopped by a guard, HF export at save."""

import os
import subprocess
import sys

import jax
import ml_collections
import pytest

from jaxrlhf.trainer import Trainer
from jaxrlhf.trainer.guards import Guard, GuardError
from tests.helpers import small_config, subprocess_env

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _guard(**overrides):
  values = dict(
    enable=True,
    kl_max=0.1,
    reward_drop=0.2,
    reward_window=3,
    lr_backoff=0.5,
    max_rollbacks=1,
    kl_warmup_steps_ratio=0.0,
  )
  return Guard(ml_collections.ConfigDict({**values, **overrides}))


def test_reward_drop_against_moving_average_and_kl_threshold():
  guard = _guard()
  for reward in (0.5, 0.6, 0.7):
    assert guard.check({"critic/score/mean": reward, "actor/kl_loss": 0.01}) is None
  assert guard.check({"critic/score/mean": 0.5}) is None  # 0.5 >= 0.6 - 20% of 0.6 = 0.48
  reason = guard.check({"critic/score/mean": 0.3})
  assert reason and "reward_drop=20%" in reason
  assert "kl_max=0.1" in guard.check({"actor/kl_loss": 0.5})
  assert "kl_max" in guard.check({"actor/reward_kl_penalty": float("nan")})
  guard.record_rollback("first")
  with pytest.raises(GuardError, match="max_rollbacks=1; last cause: second"):
    guard.record_rollback("second")
  assert _guard(enable=False).check({"actor/kl_loss": 99.0}) is None


def test_kl_warmup_turns_the_kl_term_on_later(tmp_path):
  trainer = Trainer(
    small_config(tmp_path, **{"trainer.total_training_steps": 4, "trainer.guard.kl_warmup_steps_ratio": 0.5}),
    devices=jax.devices()[:1],
  )
  coefs = [trainer.train_step(step)["actor/kl_coef"] for step in range(3)]
  assert coefs[0] == coefs[1] == 0.0 and coefs[2] == pytest.approx(0.001)


def test_a_run_stopped_by_guards_exits_non_zero_with_the_reason(tmp_path):
  env = subprocess_env()
  result = subprocess.run(
    [
      sys.executable,
      "train.py",
      "--config",
      "configs/quickstart.py",
      f"--config.trainer.default_local_dir={tmp_path}",
      "--config.trainer.logger=('jsonl',)",
      "--config.trainer.total_training_steps=4",
      "--config.trainer.save_freq=1",
      "--config.trainer.val_before_train=False",
      "--config.trainer.test_freq=-1",
      "--config.trainer.guard.enable=True",
      "--config.trainer.guard.kl_max=1e-6",
      "--config.trainer.guard.max_rollbacks=1",
      "--config.actor_rollout_ref.actor.optim.lr=0.05",
    ],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert result.returncode == 1
  assert "jaxrlhf: stopping: 2 rollbacks exceed trainer.guard.max_rollbacks=1" in result.stderr


def test_save_hf_writes_an_hf_checkpoint_at_every_save(tmp_path):
  import transformers

  trainer = Trainer(
    small_config(
      tmp_path,
      **{
        "trainer.total_training_steps": 1,
        "trainer.save_freq": 1,
        "trainer.save_hf": True,
        "trainer.val_before_train": False,
        "trainer.test_freq": -1,
      },
    ),
    devices=jax.devices()[:1],
  )
  trainer.fit()
  out = os.path.join(trainer.run_dir, "huggingface", "global_step_1")
  model = transformers.AutoModelForCausalLM.from_pretrained(out)
  assert model.config.hidden_size == 64
  assert transformers.AutoTokenizer.from_pretrained(out).eos_token == "<eos>"
  assert transformers.AutoModelForTokenClassification.from_pretrained(os.path.join(out, "critic")).num_labels == 1
