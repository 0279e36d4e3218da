"""Issue 50, item 1: the SIGTERM SLURM's preemption and `timeout` send goes to the whole process group, the reward
workers and the multiprocessing forkserver that starts them included. Before, the forkserver died of it, its death
read as every worker "exited with status 255", and the run crashed with exit 1 (or, with reward_model.on_error=zero,
scored the step's samples 0), its step in flight not saved.

The first test is the cheap one of the mechanism (no JAX program): the workers and their forkserver get SIGTERM
while a batch is scored, and the batch scores as if nothing happened. The second is the case as a user meets it
(slow: three train.py runs of the quickstart): SIGTERM to the process group of a run scoring with a custom reward
function in worker processes, mid-step; exit 143, the step in flight finished and saved, and the resumed run equal
to one never stopped (its metrics and its final weights).
"""

import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import jax
import pytest

from jaxrlhf import rewards
from jaxrlhf.checkpoint import Checkpointer
from jaxrlhf.rewards import RewardScorer, score_batch
from jaxrlhf.tracking import read_metrics
from jaxrlhf.trainer import Trainer
from tests.checkpoint.test_checkpoint_resume import _leaves_equal, _quickstart_config, _saved_steps, _wait_for
from tests.helpers import ROOT, TIMING_DEPENDENT, subprocess_env

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

# Scores a response 1 when it holds the ground truth. Once the file `arm` beside it exists, each sample first
# touches `in_reward` (a step is being scored now) and takes a little longer, so that a signal lands mid-batch.
REWARD = """
import os, time

_HERE = os.path.dirname(os.path.abspath(__file__))

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if os.path.exists(os.path.join(_HERE, "arm")):
        open(os.path.join(_HERE, "in_reward"), "a").close()
        time.sleep(SLEEP_S)
    return float(str(ground_truth).strip() in solution_str)
"""


def _reward_file(directory, sleep_s):
  path = directory / "reward.py"
  path.write_text(textwrap.dedent(REWARD).replace("SLEEP_S", repr(sleep_s)))
  return path


def test_the_reward_workers_and_their_forkserver_ignore_sigterm_mid_batch(tmp_path):
  path = _reward_file(tmp_path, 0.05)
  scorer = RewardScorer(rewards.load_custom_reward_function(str(path)), num_workers=2, timeout_s=30.0)
  n = 40
  responses, truths = [f"answer {i % 3}" for i in range(n)], ["1"] * n
  expected = [float("1" in r) for r in responses]
  try:
    assert score_batch(scorer, ["src"] * n, responses, truths)[0].tolist() == expected  # the pool is up
    server = multiprocessing.forkserver._forkserver._forkserver_pid
    workers = [worker.process.pid for worker in scorer._pool._workers]
    assert server and len(workers) == 2

    def signal_the_group():  # what killpg does, less this (pytest's) process, once a sample is being scored
      deadline = time.monotonic() + 30
      while not (tmp_path / "in_reward").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
      for pid in (server, *workers):
        os.kill(pid, signal.SIGTERM)

    (tmp_path / "arm").touch()
    signaller = threading.Thread(target=signal_the_group)
    signaller.start()
    scores, _ = score_batch(scorer, ["src"] * n, responses, truths)  # on_error="raise": a lost worker raises
    signaller.join()
    assert (tmp_path / "in_reward").exists() and scores.tolist() == expected
    assert multiprocessing.forkserver._forkserver._forkserver_pid == server  # not restarted: it lived
    os.kill(server, 0)  # alive (raises ProcessLookupError otherwise)
    assert [worker.process.pid for worker in scorer._pool._workers] == workers
    assert all(worker.process.is_alive() for worker in scorer._pool._workers)
  finally:
    scorer.close()


# prm800k's sympy helper process started first (a run scoring prm800k in the trainer's process): the forkserver it
# starts is the one the reward workers get later, so it must ignore SIGTERM too. It once came from a context of its
# own, without the preload that makes the server ignore SIGTERM, and the workers after it read as "exited with
# status 255" when the group got SIGTERM (a CI run where the prm800k tests ran first in the same pytest worker).
SYMPY_HELPER_FIRST = """
import multiprocessing.forkserver, os, signal, time
from jaxrlhf.rewards import prm800k
assert prm800k._HELPER.call(abs, -3) == 3
server = multiprocessing.forkserver._forkserver._forkserver_pid
os.kill(server, signal.SIGTERM)
time.sleep(0.5)
os.kill(server, 0)  # alive (ProcessLookupError otherwise)
print("alive")
"""


def test_the_forkserver_that_prm800k_starts_first_ignores_sigterm_too():
  command = [sys.executable, "-c", SYMPY_HELPER_FIRST]
  done = subprocess.run(command, cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=120)
  assert done.returncode == 0 and done.stdout.strip() == "alive", done.stderr[-2000:]


STEPS = 5


def _train_cmd(run_root, reward):
  return [
    sys.executable,
    "train.py",
    "--config",
    "configs/quickstart.py",
    f"--config.trainer.default_local_dir={run_root}",
    f"--config.custom_reward_function.path={reward}",
    "--config.reward_model.num_workers=2",
    "--config.trainer.logger=('jsonl',)",
    f"--config.trainer.total_training_steps={STEPS}",
    "--config.trainer.save_freq=2",
    "--config.trainer.test_freq=-1",
    "--config.trainer.val_before_train=False",
    "--config.trainer.resume_mode=auto",
    "--config.trainer.plot=False",
    "--config.data.train_max_samples=2048",
  ]


def _records(run_dir):
  """Each training step's record in metrics.jsonl, less what a clock measured."""
  if not os.path.exists(run_dir / "metrics.jsonl"):
    return {}
  return {
    r["step"]: {k: v for k, v in r.items() if not k.startswith(TIMING_DEPENDENT)}
    for r in read_metrics(run_dir / "metrics.jsonl")
    if "training/global_step" in r
  }


@pytest.mark.slow
def test_sigterm_to_the_process_group_mid_step_saves_the_step_exits_143_and_resumes_exactly(tmp_path):
  reward = _reward_file(tmp_path, 0.02)
  uninterrupted, stopped_root = tmp_path / "uninterrupted", tmp_path / "stopped"
  done = subprocess.run(
    _train_cmd(uninterrupted, reward), cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=600
  )
  assert done.returncode == 0, done.stderr[-3000:]

  run_dir = stopped_root / "quickstart" / "recall_ppo"
  process = subprocess.Popen(
    _train_cmd(stopped_root, reward),
    cwd=ROOT,
    env=subprocess_env(),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    start_new_session=True,  # its own process group: train.py, the forkserver and the reward workers
  )
  try:
    _wait_for(process, lambda: 2 in _records(run_dir), "step 2")
    (tmp_path / "arm").touch()  # from now on each sample marks that a step is being scored
    _wait_for(process, lambda: (tmp_path / "in_reward").exists(), "a step's scoring")
    in_flight = max(_records(run_dir)) + 1
    os.killpg(process.pid, signal.SIGTERM)  # as SLURM's preemption and `timeout` send it
    _, stderr = process.communicate(timeout=300)
  finally:
    if process.poll() is None:
      os.killpg(process.pid, signal.SIGKILL)
  (tmp_path / "arm").unlink()
  assert process.returncode == 143, stderr[-3000:]
  stopped = max(_records(run_dir))
  assert in_flight <= stopped < STEPS and sorted(_records(run_dir)) == list(range(1, stopped + 1))
  assert max(_saved_steps(run_dir)) == stopped  # the step in flight finished and was saved
  assert f"train.py: SIGTERM after step {stopped}: saved {run_dir}/global_step_{stopped}" in stderr
  for lost in ("Traceback", "status 255", "RewardFunctionError", "CpuCallback"):
    assert lost not in stderr, stderr[-3000:]

  resumed = subprocess.run(
    _train_cmd(stopped_root, reward), cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=600
  )
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f"resumed from step {stopped}" in resumed.stdout
  expected, got = _records(uninterrupted / "quickstart" / "recall_ppo"), _records(run_dir)
  assert sorted(got) == list(range(1, STEPS + 1))
  for step in got:  # scores included: no sample of the stopped step was scored 0
    assert got[step] == expected[step], step
  a, b = Checkpointer(str(uninterrupted / "quickstart" / "recall_ppo")), Checkpointer(str(run_dir))
  assert a.latest_step() == b.latest_step() == STEPS
  template = Trainer(_quickstart_config(tmp_path), devices=jax.devices()[:1]).state
  _leaves_equal(a.restore(STEPS, template)[0].actor.params, b.restore(STEPS, template)[0].actor.params)
  a.close(), b.close()
