"""Real Orbax checkpoints: round trip, resume across meshes, keep-N, one run stopped by Ctrl-C, SIGTERM and SIGKILL
in turn and resumed each time (against one uninterrupted run), guards."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from jaxrlhf.checkpoint import Checkpointer, CheckpointError, split_step_dir
from jaxrlhf.config import load_config_file
from jaxrlhf.tracking import read_metrics
from jaxrlhf.trainer import Trainer
from jaxrlhf.trainer.guards import GuardError
from tests.helpers import TIMING_DEPENDENT, small_config, subprocess_env

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _leaves_equal(a, b):
  jax.tree.map(
    lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), jax.device_get(a), jax.device_get(b)
  )


def test_round_trip_and_resume_onto_another_mesh(tmp_path):
  mesh_a = {"mesh.data": 1, "mesh.fsdp": 8, "mesh.tensor": 1}
  trainer = Trainer(small_config(tmp_path, **mesh_a))
  trainer.train_step(0)
  checkpointer = Checkpointer(str(tmp_path / "ckpt"))
  trainer.save(checkpointer, 1)
  checkpointer.wait()
  assert checkpointer.all_steps() == [1] and os.path.isdir(tmp_path / "ckpt" / "global_step_1")

  other = Trainer(small_config(tmp_path, **{"mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2}))
  restored, meta = checkpointer.restore(1, other.state)
  checkpointer.close()
  assert meta["step"] == 1 and json.loads(meta["config"])["mesh"]["fsdp"] == 8
  _leaves_equal(restored.actor.params, trainer.state.actor.params)
  _leaves_equal(restored.critic.opt_state, trainer.state.critic.opt_state)
  assert int(restored.step) == 1 and float(restored.kl_coef) == float(trainer.state.kl_coef)
  spec = lambda tree: [x.sharding.spec for x in jax.tree.leaves(tree)]
  assert spec(restored.actor.params) == spec(other.state.actor.params)  # the new mesh's layout


def test_keep_n_prunes_old_checkpoints(tmp_path):
  trainer = Trainer(small_config(tmp_path), devices=jax.devices()[:1])
  checkpointer = Checkpointer(str(tmp_path / "ckpt"), max_to_keep=2)
  for step in (1, 2, 3):
    trainer.save(checkpointer, step)
  checkpointer.close()
  assert sorted(os.listdir(tmp_path / "ckpt")) == ["global_step_2", "global_step_3"]


def test_unfinished_checkpoint_is_ignored_and_bad_paths_are_named(tmp_path):
  os.makedirs(tmp_path / "run" / "global_step_7.orbax-checkpoint-tmp-123")
  assert Checkpointer(str(tmp_path / "run")).latest_step() is None
  with pytest.raises(CheckpointError, match="global_step_<N>"):
    split_step_dir(str(tmp_path / "run"))
  with pytest.raises(CheckpointError, match="does not exist"):
    split_step_dir(str(tmp_path / "run" / "global_step_3"))


STEPS = 8  # room for three stops, each after a save every 2 steps, and a last run to the end


def _train_cmd(run_root):
  return [
    sys.executable,
    "train.py",
    "--config",
    "configs/quickstart.py",
    f"--config.trainer.default_local_dir={run_root}",
    "--config.trainer.logger=('jsonl',)",
    f"--config.trainer.total_training_steps={STEPS}",
    "--config.trainer.save_freq=2",
    "--config.trainer.test_freq=-1",
    "--config.trainer.val_before_train=False",
    "--config.trainer.resume_mode=auto",
    "--config.trainer.plot=False",
    "--config.data.train_max_samples=2048",  # of 19,744 recall prompts: enough for 8 steps of 128, tokenized fast
  ]


def _start(run_root):
  """train.py in the background, as a shell started it: a suite run in the background by a non-interactive shell
  (`make test &`) ignores SIGINT, and an ignored signal stays ignored across exec (the run would not stop at
  Ctrl-C); a handled one is reset to its default there."""
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    return subprocess.Popen(
      _train_cmd(run_root), cwd=ROOT, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
  finally:
    signal.signal(signal.SIGINT, previous)


def _wait_for(process, condition, what):
  deadline = time.time() + 300
  while not condition():
    assert process.poll() is None, f"train.py ended before {what}: {process.communicate()[1][-3000:]}"
    assert time.time() < deadline, f"no {what} in 300 s"
    time.sleep(0.05)


def _training_steps(run_dir):
  if not os.path.exists(run_dir / "metrics.jsonl"):
    return []
  return [
    int(r["training/global_step"]) for r in read_metrics(run_dir / "metrics.jsonl") if "training/global_step" in r
  ]


def _saved_steps(run_dir):
  if not os.path.isdir(run_dir):
    return []
  return sorted(int(name.rsplit("_", 1)[1]) for name in os.listdir(run_dir) if re.fullmatch(r"global_step_\d+", name))


def _records(run_root):
  """The last record of each step in metrics.jsonl, less what a clock measured."""
  records = read_metrics(os.path.join(run_root, "quickstart", "recall_ppo", "metrics.jsonl"))
  return {
    r["step"]: {k: v for k, v in r.items() if not k.startswith(TIMING_DEPENDENT)}
    for r in records
    if "training/global_step" in r
  }


@pytest.fixture(scope="module")
def uninterrupted_run(tmp_path_factory):
  """`_train_cmd`'s steps without a stop: what the interrupted and resumed run below must reproduce."""
  root = tmp_path_factory.mktemp("uninterrupted")
  subprocess.run(_train_cmd(root), cwd=ROOT, env=subprocess_env(), check=True, capture_output=True, timeout=600)
  return root


@pytest.mark.slow
def test_ctrl_c_then_sigterm_then_sigkill_each_resume_to_the_uninterrupted_run(uninterrupted_run, tmp_path):
  """One run stopped three ways, each resumed by `trainer.resume_mode=auto`: Ctrl-C after a save, SIGTERM (saves
  the last finished step, exit 143), SIGKILL after a save; then it runs to the end. Its metrics, one record per step,
  and its final weights are those of the run never stopped."""
  run_dir = tmp_path / "quickstart" / "recall_ppo"

  # Ctrl-C once step 3 is logged after the save at step 2: step 3 would be in metrics.jsonl twice unless cut.
  process = _start(tmp_path)
  _wait_for(process, lambda: 2 in _saved_steps(run_dir) and 3 in _training_steps(run_dir), "step 3 after a save")
  process.send_signal(signal.SIGINT)
  _, stderr = process.communicate(timeout=300)
  assert process.returncode == 130 and "train.py: interrupted" in stderr and "Traceback" not in stderr, stderr[-3000:]
  saved, logged = max(_saved_steps(run_dir)), max(_training_steps(run_dir))
  assert saved < logged

  # SIGTERM as soon as the resumed run logs a step (it cut the Ctrl-C'd run's steps past the save first).
  process = _start(tmp_path)
  dropped_path = run_dir / "metrics.dropped.jsonl"
  cut = lambda: os.path.exists(dropped_path) and _training_steps(run_dir) == list(range(1, saved + 1))
  _wait_for(process, cut, "the cut of the steps past the save")  # seconds before the first step: it compiles
  _wait_for(process, lambda: max(_training_steps(run_dir)) > saved, "a resumed step")
  process.send_signal(signal.SIGTERM)
  _, stderr = process.communicate(timeout=300)
  assert process.returncode == 143, stderr[-3000:]
  assert [r["step"] for r in read_metrics(dropped_path)] == list(range(saved + 1, logged + 1))
  stopped = max(_training_steps(run_dir))
  assert saved < stopped < STEPS and _training_steps(run_dir) == list(range(1, stopped + 1))
  assert (
    f"train.py: SIGTERM after step {stopped}: saved {run_dir}/global_step_{stopped}; "
    "trainer.resume_mode=auto continues from it" in stderr
  )
  assert "Traceback" not in stderr

  # SIGKILL as soon as the next periodic save is complete (Orbax renames its folder to global_step_N last).
  process = _start(tmp_path)
  _wait_for(process, lambda: max(_saved_steps(run_dir)) > stopped, "a save after the SIGTERM's")
  process.send_signal(signal.SIGKILL)
  process.communicate(timeout=300)

  finished = subprocess.run(
    _train_cmd(tmp_path), cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=600
  )
  assert finished.returncode == 0, finished.stderr[-3000:]
  assert _training_steps(run_dir) == list(range(1, STEPS + 1))
  expected, resumed = _records(uninterrupted_run), _records(tmp_path)
  assert sorted(resumed) == list(range(1, STEPS + 1))
  for step in resumed:
    assert resumed[step] == expected[step], step
  final = lambda root: Checkpointer(str(root / "quickstart" / "recall_ppo"))
  a, b = final(uninterrupted_run), final(tmp_path)
  assert a.latest_step() == b.latest_step() == STEPS
  template = Trainer(_quickstart_config(tmp_path), devices=jax.devices()[:1]).state
  _leaves_equal(a.restore(STEPS, template)[0].actor.params, b.restore(STEPS, template)[0].actor.params)
  a.close(), b.close()


def _quickstart_config(tmp_path):
  config = load_config_file(os.path.join(ROOT, "configs", "quickstart.py"))
  config.trainer.default_local_dir = str(tmp_path / "template")
  return config


def test_non_finite_gradients_skip_the_update(tmp_path):
  trainer = Trainer(small_config(tmp_path), devices=jax.devices()[:1])
  # A poisoned batch: every reward is NaN, so advantages, losses and gradients are NaN.
  nan = lambda responses, mask, index: jax.numpy.full(responses.shape[:1], jax.numpy.nan)
  trainer.ppo.reward_fn = lambda *args: (nan(*args), nan(*args) * 0, nan(*args) * 0, nan(*args)[None][:0])
  before = jax.device_get(trainer.state.actor.params)
  metrics = trainer.train_step(0)
  assert metrics["actor/update_skipped"] == 1.0 and metrics["critic/update_skipped"] == 1.0
  _leaves_equal(trainer.state.actor.params, before)


def test_kl_blow_up_rolls_back_with_halved_lr_then_stops(tmp_path):
  config = small_config(
    tmp_path,
    **{
      "trainer.total_training_steps": 6,
      "trainer.save_freq": 1,
      "trainer.test_freq": -1,
      "trainer.val_before_train": False,
      "trainer.guard.enable": True,
      "trainer.guard.kl_max": 1e-4,
      "trainer.guard.max_rollbacks": 2,
      "actor_rollout_ref.actor.optim.lr": 0.05,
    },
  )
  trainer = Trainer(config, devices=jax.devices()[:1])
  with pytest.raises(GuardError, match="max_rollbacks=2"):
    trainer.fit()
  with open(os.path.join(trainer.run_dir, "metrics.jsonl")) as f:
    events = [r for r in map(json.loads, f) if r.get("guard/rollback")]
  assert [r["guard/lr_scale"] for r in events] == [0.5, 0.25]
  assert all("actor/kl_loss" in r and r["actor/kl_loss"] > 1e-4 for r in events)
