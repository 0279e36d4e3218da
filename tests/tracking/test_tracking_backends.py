"""Each `trainer.logger` backend writes what it should, including non-finite values."""

import glob
import json
import math
import os
import struct
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrlhf import tracking
from jaxrlhf.errors import UserError
from jaxrlhf.tracking import Tracking, plot_metrics, read_metrics


def _step_metrics(step, score):
  return {
    "training/global_step": step,
    "critic/score/mean": jnp.float32(score),  # device scalars must be accepted as they come
    "actor/kl_loss": np.float32(0.01 * step),
    "actor/pg_loss": float("nan") if step == 2 else 0.5,
    "critic/vf_loss": float("inf") if step == 2 else 0.25,
    "perf/total_num_tokens": 1000.0,
    "perf/time_per_step": 2.0,
    "perf/throughput": 62.5,
    "response_length/mean": 12.0,
  }


def _log_two_steps(run):
  run.log(_step_metrics(1, 0.5), step=1)
  run.log(
    {
      **_step_metrics(2, 0.75),
      "val-core/gsm8k/reward/mean@4": 0.6,
      "actor/update_skipped": 1.0,
      "critic/update_skipped": 0.0,
    },
    step=2,
  )


def test_jsonl_writes_null_for_non_finite_and_plots(tmp_path):
  with Tracking(["jsonl"], str(tmp_path), total_steps=2) as run:
    _log_two_steps(run)
  lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
  assert all("NaN" not in line and "Infinity" not in line for line in lines)
  records = read_metrics(str(tmp_path / "metrics.jsonl"))
  assert [r["step"] for r in records] == [1, 2]
  assert records[0]["critic/score/mean"] == 0.5 and records[0]["actor/pg_loss"] == 0.5
  assert records[1]["actor/pg_loss"] is None and records[1]["critic/vf_loss"] is None
  assert records[1]["val-core/gsm8k/reward/mean@4"] == pytest.approx(0.6)
  png = plot_metrics(str(tmp_path / "metrics.jsonl"), str(tmp_path / "metrics.png"))
  assert os.path.getsize(png) > 0


def test_read_metrics_drops_a_final_line_cut_short(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"step": 1, "a": 1.0}\n{"step": 2, "a"')
  assert read_metrics(str(path)) == [{"step": 1, "a": 1.0}]


def test_console_prints_one_concise_line_per_step(tmp_path, capsys):
  with Tracking(["console"], str(tmp_path), total_steps=4, experiment="exp") as run:
    _log_two_steps(run)
    run.write("guard: skipped update at step 2")
  out = capsys.readouterr().out.splitlines()
  assert len(out) == 3
  assert out[0].startswith("step 1/4 eta ")
  assert "reward 0.5" in out[0] and "kl 0.01" in out[0] and "tok/s 500" in out[0] and "2.00s/step" in out[0]
  assert "gsm8k/reward/mean@4 0.6" in out[1] and "actor/update_skipped 1" in out[1]
  assert "critic/update_skipped" not in out[1]  # only events that happened
  assert out[2] == "guard: skipped update at step 2"
  assert not (tmp_path / "metrics.jsonl").exists()


def _tensorboard_scalars(event_file):
  """Reads a TFRecord event file: [len u64][crc u32][Event proto][crc u32] repeated."""
  from tensorboardX.proto import event_pb2

  data = open(event_file, "rb").read()
  scalars, offset = {}, 0
  while offset < len(data):
    (length,) = struct.unpack("<Q", data[offset : offset + 8])
    event = event_pb2.Event.FromString(data[offset + 12 : offset + 12 + length])
    offset += 12 + length + 4
    for value in event.summary.value:
      if value.HasField("simple_value"):
        scalars.setdefault(value.tag, {})[event.step] = value.simple_value
  return scalars


def test_tensorboard_event_file_has_the_scalars(tmp_path):
  with Tracking(["tensorboard"], str(tmp_path), total_steps=2, config={"trainer": {"seed": 1}}) as run:
    _log_two_steps(run)
  (event_file,) = glob.glob(str(tmp_path / "tensorboard" / "events.out.tfevents.*"))
  scalars = _tensorboard_scalars(event_file)
  assert scalars["critic/score/mean"] == {1: 0.5, 2: 0.75}
  assert math.isnan(scalars["actor/pg_loss"][2]) and math.isinf(scalars["critic/vf_loss"][2])
  # `@` is not allowed in TensorBoard tags; the name matches MLflow's.
  assert scalars["val-core/gsm8k/reward/mean_at_4"][2] == pytest.approx(0.6)


def _wandb_records(path):
  """Reads a .wandb file: a 7-byte W&B header, then LevelDB log records in 32 KiB blocks."""
  from wandb.proto import wandb_internal_pb2

  data = open(path, "rb").read()
  assert data[:4] == b":W&B"
  block, offset, pieces, records = 32768, 7, [], []
  while offset + 7 <= len(data):
    left = block - offset % block
    if left < 7:  # block trailer padding
      offset += left
      continue
    length, kind = struct.unpack("<H", data[offset + 4 : offset + 6])[0], data[offset + 6]
    if kind == 0:
      offset += left
      continue
    pieces.append(data[offset + 7 : offset + 7 + length])
    offset += 7 + length
    if kind in (1, 4):  # FULL or LAST
      records.append(wandb_internal_pb2.Record.FromString(b"".join(pieces)))
      pieces = []
  return records


_WANDB_RUN = """
import sys
from jaxrlhf.tracking import Tracking
from tests.tracking.test_tracking_backends import _log_two_steps
with Tracking(["wandb"], sys.argv[1], total_steps=2, config={"trainer": {"seed": 7}}, project="proj",
              experiment="exp") as run:
  _log_two_steps(run)
"""


def test_wandb_offline_run_has_metrics_and_config(tmp_path):
  # In a fresh process: wandb keeps process-wide state (its service and settings singleton), so a run
  # made after other tests in this process can differ from a user's first run (seen once in the suite).
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env = dict(
    os.environ, WANDB_MODE="offline", WANDB_SILENT="true", WANDB_CONSOLE="off", PYTHONPATH=root, JAX_PLATFORMS="cpu"
  )
  subprocess.run([sys.executable, "-c", _WANDB_RUN, str(tmp_path)], cwd=root, env=env, check=True, timeout=300)
  (run_file,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
  history, config, names = {}, {}, set()
  for record in _wandb_records(run_file):
    kind = record.WhichOneof("record_type")
    if kind == "history":
      row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
      history[row["_step"]] = row
    elif kind == "run":
      names.add((record.run.project, record.run.display_name))
      config.update({item.key: json.loads(item.value_json) for item in record.run.config.update})
  assert ("proj", "exp") in names
  assert config["trainer"] == {"seed": 7}
  assert history[1]["critic/score/mean"] == 0.5 and history[2]["critic/score/mean"] == 0.75
  assert history[2]["val-core/gsm8k/reward/mean@4"] == pytest.approx(0.6)


def test_mlflow_file_store_has_metrics_and_params(tmp_path, monkeypatch):
  monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
  monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)  # the logger must opt in to the file store itself
  with Tracking(
    ["mlflow"], str(tmp_path), total_steps=2, config={"trainer": {"seed": 7}}, project="proj", experiment="exp"
  ) as run:
    _log_two_steps(run)
  from mlflow.tracking import MlflowClient

  client = MlflowClient(tracking_uri=f"file:{tmp_path}/mlruns")
  (mlflow_run,) = client.search_runs([client.get_experiment_by_name("proj").experiment_id])
  assert mlflow_run.info.run_name == "exp" and mlflow_run.info.status == "FINISHED"
  assert mlflow_run.data.params["trainer.seed"] == "7"
  history = client.get_metric_history(mlflow_run.info.run_id, "critic/score/mean")
  assert sorted((m.step, m.value) for m in history) == [(1, 0.5), (2, 0.75)]
  (pg_loss,) = [m for m in client.get_metric_history(mlflow_run.info.run_id, "actor/pg_loss") if m.step == 2]
  assert math.isnan(pg_loss.value)
  (val,) = client.get_metric_history(mlflow_run.info.run_id, "val-core/gsm8k/reward/mean_at_4")
  assert val.value == pytest.approx(0.6)


def test_only_process_zero_writes(tmp_path, monkeypatch):
  monkeypatch.setattr(tracking.tracking.jax, "process_index", lambda: 1)
  with Tracking(["console", "jsonl", "tensorboard"], str(tmp_path / "run"), total_steps=2, prometheus_port=0) as run:
    _log_two_steps(run)
  assert run.prometheus_port is None
  assert not (tmp_path / "run").exists()


def test_unknown_logger_names_the_config_key(tmp_path):
  with pytest.raises(ValueError, match="trainer.logger.*'tensorbord'"):
    Tracking(["tensorbord"], str(tmp_path), total_steps=1)


@pytest.mark.parametrize(
  "loggers, port, needle",
  [
    (
      ["console", "wandb"],
      None,
      "trainer.logger 'wandb' needs the wandb package, which is not installed: pip install -e '.[wandb]'",
    ),
    (
      ["tensorboard"],
      None,
      "trainer.logger 'tensorboard' needs the tensorboardX package, which is not installed: "
      "pip install -e '.[loggers]'",
    ),
    (["mlflow"], None, "pip install -e '.[loggers]'"),
    (["jsonl"], 0, "trainer.prometheus_port needs the prometheus_client package"),
  ],
)
def test_a_backend_whose_package_is_missing_names_the_extra_in_one_line(loggers, port, needle, tmp_path, monkeypatch):
  """The package is made unimportable as an uninstalled one is (sys.modules[name] = None); nothing is written."""
  for module in ("wandb", "tensorboardX", "mlflow", "prometheus_client"):
    monkeypatch.setitem(sys.modules, module, None)
  with pytest.raises(UserError) as error:
    tracking.check_installed(loggers, port)
  assert needle in str(error.value) and "\n" not in str(error.value)
  with pytest.raises(UserError, match="pip install"):
    Tracking(loggers, str(tmp_path / "run"), total_steps=1, prometheus_port=port)
  assert not (tmp_path / "run").exists()


def test_console_start_line_says_what_running_the_command_again_does(tmp_path, capsys):
  config = lambda save_freq, resume_mode: {"trainer": {"save_freq": save_freq, "resume_mode": resume_mode}}
  for save_freq, resume_mode, start_step, expected in [
    (
      -1,
      "disable",
      0,
      "steps 1-150; no checkpoints (trainer.save_freq=-1): running it again starts over "
      "(--config.trainer.save_freq=25 --config.trainer.resume_mode=auto make it resumable)",
    ),
    (25, "auto", 0, "steps 1-150; a checkpoint every 25 steps: the same command again resumes from the newest"),
    (25, "disable", 0, "--config.trainer.resume_mode=auto resumes from the newest when run again"),
    (25, "auto", 50, "resuming at step 51 of 150"),
  ]:
    Tracking(["console"], str(tmp_path), total_steps=150, config=config(save_freq, resume_mode), start_step=start_step)
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"{tmp_path}: ") and expected in first, first
