"""Weights & Biases: one run per `Tracking`, named <project>/<experiment>, with the config attached.

`WANDB_MODE=offline` keeps everything under <run_dir>/wandb (the tests use it); `disabled` logs nothing.
"""

from __future__ import annotations

from jaxrlhf.tracking.record import scalars


class WandbLogger:
  def __init__(self, run_dir: str, *, project: str, experiment: str, config: dict | None):
    import wandb

    self._run = wandb.init(project=project, name=experiment, dir=run_dir, config=config)

  def log(self, record: dict, step: int) -> None:
    self._run.log(scalars(record), step=step)

  def close(self, failed: bool = False) -> None:
    self._run.finish(exit_code=1 if failed else 0)
