"""verl-format prompt datasets: read rows, apply the chat template, left-pad, batch deterministically.

Rows come from parquet (pyarrow), jsonl, or a built-in task (`builtin:<task>:<split>`). Every row
becomes a left-padded prompt of `max_prompt_length` tokens (a batch may keep only the columns its longest
prompt needs, `batch_arrays(prompt_width=...)`); the row's position in the dataset
(`sample_index`) is what travels with the batch into the compiled step, where the reward callback
looks the ground truth up on the host. Batch order comes from grain: a seeded shuffle per epoch,
`drop_last`, and batch `k` is a pure function of (seed, k), so resuming needs only the step.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence

import grain
import numpy as np

from jaxrlhf.data.builtin import builtin_rows
from jaxrlhf.errors import UserError


class DataError(UserError, ValueError):
  """A data file, row or column is not what the trainer expects; the message names it."""


def _read_file(path: str) -> list[dict]:
  if path.startswith("builtin:"):
    return builtin_rows(path)
  if not os.path.exists(path):
    raise DataError(f"data file {path!r} does not exist")
  if path.endswith(".parquet"):
    import pyarrow.parquet as pq
    return pq.read_table(path).to_pylist()
  if path.endswith(".jsonl") or path.endswith(".json"):
    rows = []
    with open(path) as f:
      for line_no, line in enumerate(f, 1):
        if line.strip():
          try:
            rows.append(json.loads(line))
          except json.JSONDecodeError as e:
            raise DataError(f"{path}:{line_no}: not valid JSON ({e})") from e
    return rows
  raise DataError(f"data file {path!r}: expected a .parquet, .jsonl or builtin:<task>:<split> path")


def load_rows(files: str | Sequence[str]) -> list[dict]:
  files = [files] if isinstance(files, str) else [f for f in files if f]
  if not files:
    raise DataError("no data files given (data.train_files / data.val_files are empty)")
  rows = []
  for path in files:
    rows.extend(_read_file(path))
  return rows


def _messages(row: dict, prompt_key: str, where: str):
  if prompt_key not in row:
    raise DataError(f"{where}: missing column {prompt_key!r} (data.prompt_key); columns: {sorted(row)}")
  prompt = row[prompt_key]
  if isinstance(prompt, str):
    return [{"role": "user", "content": prompt}]
  if isinstance(prompt, (list, tuple)) and all(isinstance(m, dict) and "content" in m for m in prompt):
    return list(prompt)
  raise DataError(f"{where}: column {prompt_key!r} must be a string or a list of chat messages "
                  f"({{'role', 'content'}}), got {type(prompt).__name__}")


def encode_prompts(tokenizer, conversations) -> list[list[int]]:
  """Token ids of each conversation as the model is prompted with it: the chat template with the generation prompt
  (or, without a template, the contents one per line). Rendered and tokenized as one batch: a call per row spent
  twice as long in Python (10 s for the quickstart's 20,000 rows)."""
  if not conversations:
    return []
  if getattr(tokenizer, "chat_template", None):
    texts = tokenizer.apply_chat_template(list(conversations), add_generation_prompt=True, tokenize=False)
  else:
    texts = ["\n".join(m["content"] for m in messages) for messages in conversations]
  return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def encode_prompt(tokenizer, messages) -> list[int]:
  return encode_prompts(tokenizer, [messages])[0]


def _truncate(ids: list[int], max_len: int, mode: str, where: str) -> list[int]:
  if len(ids) <= max_len:
    return ids
  if mode == "left":
    return ids[-max_len:]
  if mode == "right":
    return ids[:max_len]
  if mode == "middle":
    head = max_len // 2
    return ids[:head] + ids[len(ids) - (max_len - head):]
  raise DataError(f"{where}: prompt has {len(ids)} tokens > data.max_prompt_length={max_len} "
                  "(set data.truncation to left|right|middle or data.filter_overlong_prompts=True)")


@dataclasses.dataclass
class PromptDataset:
  """Tokenized, left-padded prompts plus the host-side fields rewards need."""
  input_ids: np.ndarray  # [N, P] int32
  attention_mask: np.ndarray  # [N, P] int32
  data_sources: list[str]
  ground_truths: list
  extra_infos: list
  num_filtered: int = 0

  def __len__(self) -> int:
    return len(self.data_sources)


def build_dataset(files, tokenizer, *, max_prompt_length: int, prompt_key: str = "prompt",
                  reward_fn_key: str = "data_source", truncation: str = "error",
                  filter_overlong_prompts: bool = False) -> PromptDataset:
  rows = load_rows(files)
  pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
  ids_list, sources, truths, extras = [], [], [], []
  filtered = 0
  encoded = encode_prompts(tokenizer, [_messages(row, prompt_key, f"{files} row {i}") for i, row in enumerate(rows)])
  for i, (row, ids) in enumerate(zip(rows, encoded)):
    where = f"{files} row {i}"
    if len(ids) > max_prompt_length and filter_overlong_prompts:
      filtered += 1
      continue
    ids_list.append(_truncate(ids, max_prompt_length, truncation, where))
    if reward_fn_key not in row:
      raise DataError(f"{where}: missing column {reward_fn_key!r} (data.reward_fn_key)")
    sources.append(row[reward_fn_key])
    reward_model = row.get("reward_model") or {}
    if "ground_truth" not in reward_model:
      raise DataError(f"{where}: missing 'reward_model.ground_truth'")
    truths.append(reward_model["ground_truth"])
    extras.append(row.get("extra_info") or {})
  if not ids_list:
    raise DataError(f"{files}: no rows left (read {len(rows)}, dropped {filtered} longer than "
                    f"data.max_prompt_length={max_prompt_length})")
  input_ids = np.full((len(ids_list), max_prompt_length), pad_id, np.int32)
  attention_mask = np.zeros((len(ids_list), max_prompt_length), np.int32)
  for i, ids in enumerate(ids_list):
    if ids:
      input_ids[i, -len(ids):] = ids
      attention_mask[i, -len(ids):] = 1
  return PromptDataset(input_ids, attention_mask, sources, truths, extras, filtered)


class BatchSchedule:
  """Batch k of the run = rows order[k*B:(k+1)*B] of epoch k // batches_per_epoch (drop_last)."""

  def __init__(self, num_rows: int, batch_size: int, *, seed: int, shuffle: bool = True):
    if batch_size > num_rows:
      raise DataError(f"data.train_batch_size={batch_size} is larger than the dataset ({num_rows} rows)")
    self.num_rows, self.batch_size = num_rows, batch_size
    self.batches_per_epoch = num_rows // batch_size
    source = grain.MapDataset.range(num_rows)
    self._order = source.shuffle(seed=seed).repeat() if shuffle else source.repeat()

  def indices(self, step: int) -> np.ndarray:
    epoch, k = divmod(step, self.batches_per_epoch)
    start = epoch * self.num_rows + k * self.batch_size
    return np.asarray([self._order[start + j] for j in range(self.batch_size)], np.int32)

  def epoch_of(self, step: int) -> int:
    return step // self.batches_per_epoch


def process_rows(indices: np.ndarray, process_index: int, process_count: int) -> np.ndarray:
  """This process's contiguous share of a global batch (multi-host: each host reads only its rows)."""
  if len(indices) % process_count:
    raise DataError(f"a batch of {len(indices)} rows does not split over {process_count} processes "
                    "(make data.train_batch_size x rollout.n a multiple of the process count)")
  share = len(indices) // process_count
  return indices[process_index * share:(process_index + 1) * share]


def longest_prompt(dataset: PromptDataset, indices: np.ndarray) -> int:
  """Tokens in the longest prompt of the rows `indices`."""
  return int(dataset.attention_mask[indices].sum(axis=1).max())


def batch_arrays(dataset: PromptDataset, indices: np.ndarray, prompt_width: int | None = None
                 ) -> dict[str, np.ndarray]:
  """The rows `indices`, their prompts left-padded to `prompt_width` tokens (None: `max_prompt_length`).

  Prompts are left-padded, so a narrower batch is the last `prompt_width` columns; it must hold the
  longest prompt of the rows (`longest_prompt`).
  """
  width = dataset.input_ids.shape[1] if prompt_width is None else prompt_width
  if not longest_prompt(dataset, indices) <= width <= dataset.input_ids.shape[1]:
    raise ValueError(f"prompt_width={width} must lie between the batch's longest prompt "
                     f"({longest_prompt(dataset, indices)}) and max_prompt_length ({dataset.input_ids.shape[1]})")
  columns = slice(dataset.input_ids.shape[1] - width, None)
  return {"input_ids": dataset.input_ids[indices, columns],
          "attention_mask": dataset.attention_mask[indices, columns], "sample_index": indices.astype(np.int32)}
