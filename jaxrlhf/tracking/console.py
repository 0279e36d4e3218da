"""Console: a tqdm bar (step, ETA, reward, KL, tokens/s) and one concise line per logged step.

The bar draws only on a TTY; the per-step line always goes through `tqdm.write`, so log files
collected from a non-interactive job still show progress.
"""

from __future__ import annotations

import datetime
import math
import time

from jaxrlhf.tracking.record import is_number, kl, tokens_per_second


def _is_guard_event(key: str) -> bool:
  return key.startswith("guard/") or key.endswith("/update_skipped")


def _format(value: float) -> str:
  return f"{value:.4g}" if math.isfinite(value) else str(value)


class ConsoleLogger:
  def __init__(self, *, total_steps: int, experiment: str, start_step: int = 0):
    from tqdm.auto import tqdm

    self._total = total_steps
    self._start_step = start_step
    self._start_time = time.monotonic()
    # disable=None: no bar when stderr is not a TTY (the per-step lines carry the progress there).
    self._bar = tqdm(
      total=total_steps,
      initial=start_step,
      desc=experiment,
      unit="step",
      dynamic_ncols=True,
      mininterval=0.5,
      disable=None,
    )

  def _headline(self, record: dict) -> dict[str, str]:
    fields = {}
    if is_number(record.get("critic/score/mean")):
      fields["reward"] = _format(record["critic/score/mean"])
    if (value := kl(record)) is not None:
      fields["kl"] = _format(value)
    if (value := tokens_per_second(record)) is not None:
      fields["tok/s"] = f"{value:.0f}" if math.isfinite(value) else str(value)
    return fields

  def _eta(self, global_step: int) -> str:
    done = global_step - self._start_step
    if done <= 0:
      return "?"
    seconds = (time.monotonic() - self._start_time) / done * max(self._total - global_step, 0)
    return str(datetime.timedelta(seconds=round(seconds)))

  def log(self, record: dict, step: int) -> None:
    parts = []
    if "training/global_step" in record:
      global_step = int(record["training/global_step"])
      headline = self._headline(record)
      self._bar.set_postfix(headline, refresh=False)
      if global_step > self._bar.n:
        self._bar.update(global_step - self._bar.n)  # update() keeps tqdm's rate and ETA estimates
      else:  # a guard rollback moves backwards
        self._bar.n = global_step
        self._bar.refresh()
      parts.append(f"step {global_step}/{self._total} eta {self._eta(global_step)}")
      parts += [f"{name} {value}" for name, value in headline.items()]
      if is_number(record.get("perf/time_per_step")):
        parts.append(f"{record['perf/time_per_step']:.2f}s/step")
    else:
      parts.append(f"step {step}")
    # Validation scores and guard events are rare and matter, so they join the line when present.
    parts += [
      f"{key.removeprefix('val-core/')} {_format(value)}"
      for key, value in record.items()
      if key.startswith("val-core/") and is_number(value)
    ]
    parts += [
      f"{key} {_format(value)}"
      for key, value in record.items()
      if _is_guard_event(key) and is_number(value) and value != 0
    ]
    if len(parts) > 1 or "training/global_step" in record:
      self.write(" | ".join(parts))

  def write(self, message: str) -> None:
    self._bar.write(message)

  def close(self, failed: bool = False) -> None:
    self._bar.close()
