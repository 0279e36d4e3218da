"""metrics.jsonl: one JSON object per step, `{"step": N, <metric>: value, ...}`.

A resumed run validates at the step it resumes from (`trainer.val_before_train`), which already has its
record: the first log call of a run, for the step the file ends at, joins that record. Later calls for one
step stay records of their own (a guard's rollbacks, two in a row at one step, are two events).

Non-finite numbers (NaN, ±inf) are written as `null`: strict JSON has no NaN, and readers in other
languages choke on Python's `NaN` token. `read_metrics` therefore returns None for them.

A run that resumes from step N writes steps N+1... again, so the file is first cut back to the records
of steps <= N (`truncate_jsonl`; a fresh run, N = 0, starts an empty file). What is cut is not deleted:
it is appended to `<name>.dropped.jsonl` beside it.
"""

from __future__ import annotations

import json
import logging
import math
import os

log = logging.getLogger(__name__)


def _json_safe(value):
  if isinstance(value, float) and not math.isfinite(value):
    return None
  if isinstance(value, list):
    return [_json_safe(item) for item in value]
  return value


def truncate_jsonl(path: str, last_step: int) -> int:
  """Cuts `path` back to its records with `"step"` <= `last_step` (and drops an unfinished last line).

  The records cut go to `<path without .jsonl>.dropped.jsonl`, in their order; returns how many.
  """
  if not os.path.exists(path):
    return 0
  with open(path, encoding="utf-8") as f:
    lines = f.read().split("\n")
  kept, dropped = [], []
  for line in lines[:-1]:  # anything after the last newline is a write cut short
    if line.strip():
      try:
        step = json.loads(line).get("step")
      except (json.JSONDecodeError, AttributeError):
        step = None
      (kept if isinstance(step, (int, float)) and step <= last_step else dropped).append(line)
  if lines[-1].strip():
    dropped.append(lines[-1])
  if not dropped:
    return 0
  with open(os.path.splitext(path)[0] + ".dropped.jsonl", "a", encoding="utf-8") as f:
    f.writelines(line + "\n" for line in dropped)
  partial = path + ".tmp"
  with open(partial, "w", encoding="utf-8") as f:
    f.writelines(line + "\n" for line in kept)
  os.replace(partial, path)  # atomic: an interruption leaves the old file or the new one
  why = f"after step {last_step}, which this run writes again" if last_step >= 0 else "of an earlier run"
  log.warning("%s: moved %d record(s) %s to %s", path, len(dropped), why, os.path.splitext(path)[0] + ".dropped.jsonl")
  return len(dropped)


class JsonlLogger:
  def __init__(self, path: str, start_step: int = 0):
    """Appends to `path` after cutting it back to the steps before `start_step` (a fresh run: nothing)."""
    truncate_jsonl(path, start_step if start_step > 0 else -1)
    self._file = open(path, "a+", encoding="utf-8")
    # The file's last record and where its line starts: the first log call, for its step, rewrites that line merged.
    self._last: dict | None = None
    self._last_offset = 0
    self._file.seek(0)
    offset = 0
    for line in self._file:
      if line.strip():
        self._last, self._last_offset = json.loads(line), offset
      offset += len(line.encode("utf-8"))

  def log(self, record: dict, step: int) -> None:
    record = {"step": step, **{key: _json_safe(value) for key, value in record.items()}}
    if self._last is not None and self._last.get("step") == step:
      record = {**self._last, **record}
      self._file.truncate(self._last_offset)
    self._file.seek(0, os.SEEK_END)
    self._last = None  # only the record the run resumed at is joined
    self._file.write(json.dumps(record, allow_nan=False) + "\n")
    self._file.flush()

  def close(self, failed: bool = False) -> None:
    self._file.close()


def read_metrics(path: str) -> list[dict]:
  """The records of a metrics.jsonl; a final line cut short by a killed process is dropped."""
  with open(path) as f:
    lines = f.read().split("\n")
  # Anything after the last newline is an unfinished write; every earlier line must parse.
  return [json.loads(line) for line in lines[:-1] if line.strip()]
