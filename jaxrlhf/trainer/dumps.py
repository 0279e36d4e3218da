"""verl's generation dumps: `trainer.rollout_data_dir` (each step's rollouts) and `trainer.validation_data_dir` (each
validation's samples), one `<dir>/<step>.jsonl` per step, one line per sample with verl's fields: `input` (the prompt),
`output` (the response), `gts` (the ground truth), `score`, `step`, and each entry the reward function returned.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np


def prompt_texts(tokenizer, dataset, rows: Sequence[int]) -> list[str]:
  """The prompts of dataset rows `rows` as text, without padding or special tokens (verl decodes them so)."""
  ids = [dataset.input_ids[row][dataset.attention_mask[row] > 0].tolist() for row in rows]
  return tokenizer.batch_decode(ids, skip_special_tokens=True)


def write_generations(folder: str, step: int, inputs, outputs, ground_truths, scores, extras: dict) -> str:
  """Writes `<folder>/<step>.jsonl` (replacing it, as verl does) and returns its path."""
  os.makedirs(folder, exist_ok=True)
  columns = {"input": list(inputs), "output": list(outputs), "gts": list(ground_truths), "score": list(scores)}
  columns["step"] = [step] * len(columns["input"])
  for key, values in extras.items():
    if len(values) == len(columns["input"]):
      columns[key] = list(values)
  path = os.path.join(folder, f"{step}.jsonl")
  with open(path, "w") as file:
    for i in range(len(columns["input"])):
      row = {key: _plain(values[i]) for key, values in columns.items()}
      file.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
  return path


class RolloutDump:
  """Collects a training step's scored rollouts (the reward callback adds them) and writes them after the step."""

  def __init__(self, folder: str):
    self.folder = folder
    self.rows: list[tuple] = []  # (input, output, gts, score, extras)

  def add(self, inputs, outputs, ground_truths, scores, extras: dict) -> None:
    for i, row in enumerate(zip(inputs, outputs, ground_truths, scores)):
      self.rows.append((*row, {key: values[i] for key, values in extras.items() if len(values) == len(inputs)}))

  def write(self, step: int) -> None:
    rows, self.rows = self.rows, []
    if not rows:
      return
    keys = sorted({key for row in rows for key in row[4]})
    extras = {key: [row[4].get(key) for row in rows] for key in keys}
    write_generations(self.folder, step, *zip(*(row[:4] for row in rows)), extras)


def _plain(value):
  if isinstance(value, np.generic):
    return value.item()
  if isinstance(value, np.ndarray):
    return value.tolist()
  return value
