"""`Tracking`: fans one step's metrics out to the backends named in `trainer.logger`."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import jax
import numpy as np

from jaxrlhf.errors import missing_extra

LOGGERS = ("console", "jsonl", "wandb", "tensorboard", "mlflow")
# The package each optional backend imports and the pyproject extra that installs it.
_PACKAGES = {
  "wandb": ("wandb", "wandb"),
  "tensorboard": ("tensorboardX", "loggers"),
  "mlflow": ("mlflow", "loggers"),
}


def check_installed(loggers: Sequence[str], prometheus_port: int | None) -> None:
  """Raises a one-line UserError naming the extra to install for a selected backend whose package is missing
  (run before anything heavy: the backends themselves open only once training starts)."""
  needs = [(*_PACKAGES[name], f"trainer.logger {name!r}") for name in loggers if name in _PACKAGES]
  if prometheus_port is not None:
    needs.append(("prometheus_client", "loggers", "trainer.prometheus_port"))
  for module, extra, what in needs:
    if (error := missing_extra(module, extra, what)) is not None:
      raise error


def _plain(value):
  """A Python scalar (or nested list for arrays), so every backend sees the same thing."""
  value = np.asarray(value)
  return value.item() if value.ndim == 0 else value.tolist()


def start_line(config: Mapping, run_dir: str, start_step: int, total_steps: int) -> str:
  """The console's first line: where the run writes, which steps it runs, and what running it again does."""
  trainer = config["trainer"]
  if start_step > 0:
    return f"{run_dir}: resuming at step {start_step + 1} of {total_steps}"
  line = f"{run_dir}: steps 1-{total_steps}"
  if trainer["save_freq"] <= 0:
    freq = max(total_steps // 6, 1)
    return (
      f"{line}; no checkpoints (trainer.save_freq={trainer['save_freq']}): running it again starts over "
      f"(--config.trainer.save_freq={freq} --config.trainer.resume_mode=auto make it resumable)"
    )
  line += f"; a checkpoint every {trainer['save_freq']} steps"
  if trainer["resume_mode"] == "auto":
    return f"{line}: the same command again resumes from the newest (trainer.resume_mode=auto)"
  return f"{line}; --config.trainer.resume_mode=auto resumes from the newest when run again"


def _config_dict(config) -> dict | None:
  if config is None:
    return None
  return config.to_dict() if hasattr(config, "to_dict") else dict(config)


class Tracking:
  """Writes each step to every selected backend; use as a context manager or call `close()`.

  `prometheus_port` (None = off) serves the headline gauges at http://<host>:<port>/metrics;
  port 0 picks a free port, readable afterwards as `tracking.prometheus_port`.
  """

  def __init__(
    self,
    loggers: Sequence[str],
    run_dir: str,
    *,
    total_steps: int,
    config=None,
    project: str = "jaxrlhf",
    experiment: str = "run",
    prometheus_port: int | None = None,
    start_step: int = 0,
  ):
    unknown = [name for name in loggers if name not in LOGGERS]
    if unknown:
      raise ValueError(f"config key 'trainer.logger' has unknown logger(s) {unknown}; known: {LOGGERS}")
    check_installed(loggers, prometheus_port)
    self.is_writer = jax.process_index() == 0
    self.loggers = tuple(loggers)
    self.run_dir = run_dir
    self.metrics_path = os.path.join(run_dir, "metrics.jsonl")
    self.prometheus_port = None
    self._backends = []
    self._console = None
    if not self.is_writer:
      return
    os.makedirs(run_dir, exist_ok=True)
    config_dict = _config_dict(config)
    try:
      for name in self.loggers:
        self._backends.append(
          self._open(
            name,
            total_steps=total_steps,
            config=config_dict,
            project=project,
            experiment=experiment,
            start_step=start_step,
          )
        )
      if prometheus_port is not None:
        from jaxrlhf.tracking.prometheus import PrometheusExporter

        exporter = PrometheusExporter(prometheus_port)
        self.prometheus_port = exporter.port
        self._backends.append(exporter)
    except BaseException:
      self.close(failed=True)
      raise
    if self._console is not None and "save_freq" in (config_dict or {}).get("trainer", {}):
      self._console.write(start_line(config_dict, run_dir, start_step, total_steps))

  def _open(self, name, *, total_steps, config, project, experiment, start_step):
    # Imports are local so that a run pays only for the backends it selected.
    if name == "console":
      from jaxrlhf.tracking.console import ConsoleLogger

      self._console = ConsoleLogger(total_steps=total_steps, experiment=experiment, start_step=start_step)
      return self._console
    if name == "jsonl":
      from jaxrlhf.tracking.jsonl import JsonlLogger

      return JsonlLogger(self.metrics_path, start_step=start_step)
    if name == "wandb":
      from jaxrlhf.tracking.wandb_logger import WandbLogger

      return WandbLogger(self.run_dir, project=project, experiment=experiment, config=config)
    if name == "tensorboard":
      from jaxrlhf.tracking.tensorboard_logger import TensorboardLogger

      return TensorboardLogger(os.path.join(self.run_dir, "tensorboard"), config=config, start_step=start_step)
    from jaxrlhf.tracking.mlflow_logger import MlflowLogger

    return MlflowLogger(self.run_dir, project=project, experiment=experiment, config=config)

  def log(self, metrics: Mapping[str, object], step: int) -> None:
    if not self.is_writer:
      return
    record = {key: _plain(value) for key, value in metrics.items()}
    for backend in self._backends:
      backend.log(record, step)

  def write(self, message: str) -> None:
    """A console line (e.g. a guard event) that does not break the progress bar."""
    if self.is_writer and self._console is not None:
      self._console.write(message)

  def close(self, failed: bool = False) -> None:
    backends, self._backends = self._backends, []
    for backend in reversed(backends):
      backend.close(failed)

  def __enter__(self) -> Tracking:
    return self

  def __exit__(self, exc_type, exc, traceback) -> None:
    self.close(failed=exc_type is not None)
