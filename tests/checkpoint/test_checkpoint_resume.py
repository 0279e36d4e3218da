"""Real Orbax checkpoints: round trip, resume across meshes, keep-N, resume after SIGKILL, SIGTERM and Ctrl-C (each
against one uninterrupted run), guards."""

import json
import os
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


def _train_cmd(run_root, *flags):
  return [
    sys.executable,
    "train.py",
    "--config",
    "configs/quickstart.py",
    f"--config.trainer.default_local_dir={run_root}",
    "--config.trainer.logger=('jsonl',)",
    "--config.trainer.total_training_steps=6",
    "--config.trainer.save_freq=2",
    "--config.trainer.test_freq=-1",
    "--config.trainer.val_before_train=False",
    "--config.trainer.resume_mode=auto",
    "--config.trainer.plot=False",
    *flags,
  ]


def _records(run_root):
  with open(os.path.join(run_root, "quickstart", "recall_ppo", "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f]
  return {r["step"]: r for r in records if "training/global_step" in r}  # last record per step wins


def _training_steps(run_dir):
  return [
    int(r["training/global_step"]) for r in read_metrics(run_dir / "metrics.jsonl") if "training/global_step" in r
  ]


@pytest.fixture(scope="module")
def uninterrupted_run(tmp_path_factory):
  """`_train_cmd`'s 6 steps without a stop: what each interrupted and resumed run below must reproduce (one run for
  the module; a save changes no metric, so the runs saving every 4 steps compare with it too)."""
  root = tmp_path_factory.mktemp("uninterrupted")
  subprocess.run(_train_cmd(root), cwd=ROOT, env=subprocess_env(), check=True, capture_output=True, timeout=600)
  return root


def test_sigkill_after_a_save_then_auto_resume_reproduces_the_run(uninterrupted_run, tmp_path):
  env = subprocess_env()
  straight = uninterrupted_run

  killed = tmp_path / "killed"
  process = subprocess.Popen(
    _train_cmd(killed), cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
  )
  run_dir = killed / "quickstart" / "recall_ppo"
  deadline = time.time() + 600
  while not (run_dir / "global_step_2").is_dir() and process.poll() is None and time.time() < deadline:
    time.sleep(0.05)
  process.send_signal(signal.SIGKILL)
  process.wait()
  assert (run_dir / "global_step_2").is_dir()
  subprocess.run(_train_cmd(killed), cwd=ROOT, env=env, check=True, capture_output=True, timeout=600)

  expected, resumed = _records(straight), _records(killed)
  assert sorted(resumed) == sorted(expected) == list(range(1, 7))
  for step in range(3, 7):
    for key, value in expected[step].items():
      if key.startswith(TIMING_DEPENDENT):
        continue
      assert resumed[step][key] == value, (step, key)
  final = lambda root: Checkpointer(str(root / "quickstart" / "recall_ppo"))
  a, b = final(straight), final(killed)
  assert a.latest_step() == b.latest_step() == 6
  template = Trainer(_quickstart_config(tmp_path), devices=jax.devices()[:1]).state
  _leaves_equal(a.restore(6, template)[0].actor.params, b.restore(6, template)[0].actor.params)
  a.close(), b.close()


_COMPARED = ("actor/", "critic/", "response_length/", "training/")


def _compared(run_root):
  """The training metrics of each record metrics.jsonl holds for a step, in order."""
  rows = read_metrics(os.path.join(run_root, "quickstart", "recall_ppo", "metrics.jsonl"))
  return [{k: v for k, v in row.items() if k.startswith(_COMPARED)} for row in rows if "training/global_step" in row]


@pytest.mark.slow
def test_sigterm_saves_the_last_finished_step_and_the_resumed_run_matches_an_uninterrupted_one(
  uninterrupted_run, tmp_path
):
  flags = ("--config.trainer.save_freq=4",)  # no periodic save before step 4: the one at the stop is SIGTERM's
  interrupted_root = tmp_path / "interrupted"
  run_dir = interrupted_root / "quickstart" / "recall_ppo"
  process = subprocess.Popen(
    _train_cmd(interrupted_root, *flags),
    cwd=ROOT,
    env=subprocess_env(),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  deadline = time.time() + 300
  while process.poll() is None and time.time() < deadline:  # SIGTERM once step 2 is logged (no save before 4)
    if os.path.exists(run_dir / "metrics.jsonl") and 2 in _training_steps(run_dir):
      break
    time.sleep(0.05)
  process.send_signal(signal.SIGTERM)
  _, stderr = process.communicate(timeout=300)
  assert process.returncode == 143, stderr[-3000:]
  stopped = max(_training_steps(run_dir))
  assert 2 <= stopped < 6
  assert (
    f"train.py: SIGTERM after step {stopped}: saved {run_dir}/global_step_{stopped}; "
    "trainer.resume_mode=auto continues from it" in stderr
  )
  assert "Traceback" not in stderr

  resumed = subprocess.run(
    _train_cmd(interrupted_root, *flags), cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=600
  )
  assert resumed.returncode == 0, resumed.stderr[-3000:]

  assert _training_steps(run_dir) == [1, 2, 3, 4, 5, 6]
  assert _compared(interrupted_root) == _compared(uninterrupted_run)


@pytest.mark.slow
def test_ctrl_c_after_a_save_then_resume_logs_each_step_once(uninterrupted_run, tmp_path):
  run_dir = tmp_path / "quickstart" / "recall_ppo"
  # A suite started in the background by a non-interactive shell (`make test &`) ignores SIGINT, and an ignored
  # signal stays ignored across exec: the run would never stop. A handled one is reset to its default there.
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    process = subprocess.Popen(
      _train_cmd(tmp_path),
      cwd=ROOT,
      env=subprocess_env(),
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
  finally:
    signal.signal(signal.SIGINT, previous)
  deadline = time.time() + 300
  # Interrupt once step 3 is logged after the save at step 2: step 3 is then in metrics.jsonl twice unless cut.
  while process.poll() is None and time.time() < deadline:
    if (
      (run_dir / "global_step_2").is_dir()
      and os.path.exists(run_dir / "metrics.jsonl")
      and 3 in _training_steps(run_dir)
    ):
      break
    time.sleep(0.05)
  process.send_signal(signal.SIGINT)
  _, stderr = process.communicate(timeout=300)
  assert process.returncode == 130 and "train.py: interrupted" in stderr and "Traceback" not in stderr, stderr[-3000:]
  saved = max(int(name.rsplit("_", 1)[1]) for name in os.listdir(run_dir) if name.startswith("global_step_"))
  assert 3 in _training_steps(run_dir) and saved < max(_training_steps(run_dir))

  resumed = subprocess.run(
    _train_cmd(tmp_path), cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=600
  )
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert _training_steps(run_dir) == [1, 2, 3, 4, 5, 6]
  dropped = read_metrics(os.path.join(run_dir, "metrics.dropped.jsonl"))
  assert [r["step"] for r in dropped] == list(range(saved + 1, saved + 1 + len(dropped))) and dropped
  assert _compared(tmp_path) == _compared(uninterrupted_run)


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
