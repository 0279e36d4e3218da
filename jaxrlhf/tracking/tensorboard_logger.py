"""TensorBoard event files under <run_dir>/tensorboard, written by tensorboardX (no TensorFlow needed)."""

from __future__ import annotations

import json

from jaxrlhf.tracking.record import restricted_name, scalars


class TensorboardLogger:
  def __init__(self, log_dir: str, *, config: dict | None, start_step: int = 0):
    from tensorboardX import SummaryWriter

    # A resumed run writes the steps after its checkpoint again: TensorBoard hides the old events of
    # steps >= purge_step, so each step shows once.
    self._writer = SummaryWriter(logdir=log_dir, purge_step=start_step + 1 if start_step > 0 else None)
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
