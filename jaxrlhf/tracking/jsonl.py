"""metrics.jsonl: one JSON object per `Tracking.log` call, `{"step": N, <metric>: value, ...}`.

Non-finite numbers (NaN, ±inf) are written as `null`: strict JSON has no NaN, and readers in other
languages choke on Python's `NaN` token. `read_metrics` therefore returns None for them.
"""

from __future__ import annotations

import json
import math


def _json_safe(value):
  if isinstance(value, float) and not math.isfinite(value):
    return None
  if isinstance(value, list):
    return [_json_safe(item) for item in value]
  return value


class JsonlLogger:
  def __init__(self, path: str):
    self._file = open(path, "a")

  def log(self, record: dict, step: int) -> None:
    line = json.dumps({"step": step, **{key: _json_safe(value) for key, value in record.items()}}, allow_nan=False)
    self._file.write(line + "\n")
    self._file.flush()

  def close(self, failed: bool = False) -> None:
    self._file.close()


def read_metrics(path: str) -> list[dict]:
  """The records of a metrics.jsonl; a final line cut short by a killed process is dropped."""
  with open(path) as f:
    lines = f.read().split("\n")
  # Anything after the last newline is an unfinished write; every earlier line must parse.
  return [json.loads(line) for line in lines[:-1] if line.strip()]
