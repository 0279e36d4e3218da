"""Multi-host on one machine: 2 processes x 2 CPU devices (jax.distributed, gloo) equal 1 process x 4."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import free_port, subprocess_env

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multihost_worker.py")


@pytest.mark.slow
def test_two_processes_match_one_process_with_the_same_devices(tmp_path):
  env = subprocess_env()
  port = str(free_port())
  workers = [
    subprocess.Popen(
      [sys.executable, WORKER, str(i), "2", port, "2", str(tmp_path / "multi"), str(tmp_path)],
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for i in range(2)
  ]
  single = subprocess.run(
    [
      sys.executable,
      WORKER,
      "0",
      "1",
      "0",
      "4",
      str(tmp_path / "single"),
      str(tmp_path / "single_run"),
    ],  # its own run directory: it runs beside the other two
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  outputs = [w.communicate(timeout=600)[0] for w in workers]
  assert single.returncode == 0, single.stderr[-2000:]
  for w, out in zip(workers, outputs):
    assert w.returncode == 0, out[-2000:]
  load = lambda name: json.load(open(tmp_path / name))
  expected, first, second = load("single.0.json"), load("multi.0.json"), load("multi.1.json")
  assert first == second  # every process sees the same global metrics
  for key, value in expected.items():
    np.testing.assert_allclose(first[key], value, rtol=1e-4, atol=1e-5, err_msg=key)
