"""`train.py --distributed`: two processes on localhost (gloo CPU collectives) train one mesh together."""

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import free_port, subprocess_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_two_processes_train_one_mesh(tmp_path):
  env = subprocess_env(devices=2, JAX_COORDINATOR_ADDRESS=f"localhost:{free_port()}")
  command = [
    sys.executable,
    "train.py",
    "--config",
    "configs/quickstart.py",
    "--distributed",
    "--num_processes=2",
    "--config.mesh.fsdp=-1",
    "--config.trainer.total_training_steps=2",
    "--config.trainer.test_freq=2",
    "--config.trainer.save_freq=-1",
    "--config.data.train_batch_size=8",
    "--config.actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "--config.trainer.logger=('console','jsonl')",
  ]
  workers = [
    subprocess.Popen(
      command + [f"--process_id={i}", f"--config.trainer.default_local_dir={tmp_path / f'process{i}'}"],
      cwd=ROOT,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for i in range(2)
  ]
  outputs = [w.communicate(timeout=900)[0] for w in workers]
  for w, out in zip(workers, outputs):
    assert w.returncode == 0, out[-3000:]
  assert "on 4 cpu device(s)" in outputs[0]  # one mesh over both processes' devices
  metrics = [json.loads(line) for line in open(tmp_path / "process0" / "quickstart" / "recall_ppo" / "metrics.jsonl")]
  assert [m["training/global_step"] for m in metrics if "training/global_step" in m] == [1, 2]


@pytest.mark.slow
def test_two_processes_run_multi_turn_rollouts_each_calling_the_tools_of_its_own_rows(tmp_path):
  """The tool quickstart over two processes: every process runs the turn loop over every row, the tool calls of
  the rows it holds, and gets the others' outcomes; training and validation go on alike in both."""
  env = subprocess_env(devices=2, JAX_COORDINATOR_ADDRESS=f"localhost:{free_port()}")
  command = [
    sys.executable,
    "train.py",
    "--config",
    "configs/quickstart_tools.py",
    "--distributed",
    "--num_processes=2",
    "--config.mesh.fsdp=-1",
    "--config.trainer.total_training_steps=2",
    "--config.trainer.test_freq=2",
    "--config.trainer.save_freq=-1",
    "--config.data.train_batch_size=8",
    "--config.data.val_batch_size=16",
    "--config.data.val_max_samples=32",
    "--config.actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "--config.trainer.logger=('console','jsonl')",
  ]
  workers = [
    subprocess.Popen(
      command + [f"--process_id={i}", f"--config.trainer.default_local_dir={tmp_path / f'process{i}'}"],
      cwd=ROOT,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for i in range(2)
  ]
  outputs = [w.communicate(timeout=900)[0] for w in workers]
  for w, out in zip(workers, outputs):
    assert w.returncode == 0, out[-3000:]
  run = tmp_path / "process0" / "quickstart" / "lookup_tools_grpo"
  metrics = [json.loads(line) for line in open(run / "metrics.jsonl")]
  steps = [m for m in metrics if "training/global_step" in m]
  assert [m["training/global_step"] for m in steps] == [1, 2]
  # The trajectories' metrics are over every row (each process's `tools/*` counts count the calls it ran).
  assert all(m["num_turns/mean"] >= 2 and "tool_call_counts/mean" in m for m in steps)
  assert "val-aux/num_turns/mean" in steps[-1]
