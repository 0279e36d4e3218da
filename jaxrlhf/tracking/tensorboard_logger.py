"""TensorBoard event files under <run_dir>/tensorboard, written by tensorboardX (no TensorFlow needed)."""

from __future__ import annotations

import json

from jaxrlhf.tracking.record import restricted_name, scalars


class TensorboardLogger:
  def __init__(self, log_dir: str, *, config: dict | None):
    from tensorboardX import SummaryWriter
    self._writer = SummaryWriter(logdir=log_dir)
    if config is not None:
      # Indented so TensorBoard's markdown renders it as a code block.
      text = json.dumps(config, indent=2, sort_keys=True, default=str)
      self._writer.add_text("config", "\n".join("    " + line for line in text.splitlines()), 0)

  def log(self, record: dict, step: int) -> None:
    for key, value in scalars(record).items():
      self._writer.add_scalar(restricted_name(key), value, step)
    # Flushed each step so a live TensorBoard sees it and a crash loses nothing.
    self._writer.flush()

  def close(self, failed: bool = False) -> None:
    self._writer.close()
