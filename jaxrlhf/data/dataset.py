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
from collections.abc import Iterator, Sequence

import grain
import numpy as np

from jaxrlhf.data.builtin import builtin_rows
from jaxrlhf.errors import UserError


class DataError(UserError, ValueError):
  """A data file, row or column is not what the trainer expects; the message names it."""


def read_lines(path: str, where: str | None = None) -> Iterator[tuple[int, str]]:
  """(line number, text) of each line of a UTF-8 text file. Bytes that are not UTF-8 are a DataError naming the
  file (`where`, default its path) and their byte offset, not a UnicodeDecodeError from the middle of a read."""
  offset = 0
  with open(path, "rb") as f:
    for line_no, raw in enumerate(f, 1):
      try:
        text = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise DataError(
          f"{where or path}: not UTF-8: byte {raw[e.start]:#04x} at byte offset {offset + e.start} (line {line_no})",
          hint="save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)",
        ) from None
      yield line_no, text
      offset += len(raw)


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
    for line_no, line in read_lines(path):
      if line.strip():
        try:
          rows.append(json.loads(line))
        except json.JSONDecodeError as e:
          raise DataError(f"{path}:{line_no}: not valid JSON ({e})") from e
    return rows
  raise DataError(f"data file {path!r}: expected a .parquet, .jsonl or builtin:<task>:<split> path")


def _file_list(files: str | Sequence[str]) -> list[str]:
  files = [files] if isinstance(files, str) else [f for f in files if f]
  if not files:
    raise DataError("no data files given (data.train_files / data.val_files are empty)")
  return files


def _rows_and_places(files: str | Sequence[str]) -> tuple[list[dict], list[str]]:
  """Every row of `files` in order, and where each one is ('train.parquet row 3') for messages."""
  rows, places = [], []
  for path in _file_list(files):
    file_rows = _read_file(path)
    rows.extend(file_rows)
    places.extend(f"{path} row {i}" for i in range(len(file_rows)))
  return rows, places


def load_rows(files: str | Sequence[str]) -> list[dict]:
  return _rows_and_places(files)[0]


def _messages(row: dict, prompt_key: str, where: str):
  if prompt_key not in row:
    raise DataError(f"{where}: missing column {prompt_key!r} (data.prompt_key); columns: {sorted(row)}")
  prompt = row[prompt_key]
  if isinstance(prompt, str):
    return [{"role": "user", "content": prompt}]
  if isinstance(prompt, (list, tuple)) and all(isinstance(m, dict) and "content" in m for m in prompt):
    return list(prompt)
  raise DataError(
    f"{where}: column {prompt_key!r} must be a string or a list of chat messages "
    f"({{'role', 'content'}}), got {type(prompt).__name__}"
  )


def encode_prompts(tokenizer, conversations, tools=None, chat_template_kwargs=None) -> list[list[int]]:
  """Token ids of each conversation as the model is prompted with it: the chat template with the generation prompt
  (or, without a template, the contents one per line). Rendered and tokenized as one batch: a call per row spent
  twice as long in Python (10 s for the quickstart's 20,000 rows). `tools`: OpenAI function schemas the template
  renders (multi-turn rollouts, as verl's `apply_chat_template(..., tools=)`); `chat_template_kwargs`: the template's
  other arguments (verl's `data.apply_chat_template_kwargs`, e.g. Qwen3's `enable_thinking=False`)."""
  if not conversations:
    return []
  if getattr(tokenizer, "chat_template", None):
    kwargs = {**(chat_template_kwargs or {}), **({"tools": list(tools)} if tools else {})}
    texts = tokenizer.apply_chat_template(list(conversations), add_generation_prompt=True, tokenize=False, **kwargs)
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
    return ids[:head] + ids[len(ids) - (max_len - head) :]
  raise DataError(
    f"{where}: prompt has {len(ids)} tokens > data.max_prompt_length={max_len} "
    "(set data.truncation to left|right|middle or data.filter_overlong_prompts=True)"
  )


@dataclasses.dataclass
class PromptDataset:
  """Tokenized, left-padded prompts plus the host-side fields rewards need."""

  input_ids: np.ndarray  # [N, P] int32
  attention_mask: np.ndarray  # [N, P] int32
  data_sources: list[str]
  ground_truths: list
  extra_infos: list
  num_filtered: int = 0  # rows dropped by `filter_overlong_prompts`
  num_read: int = 0  # rows the files hold, when `max_samples` kept fewer (0: every row was kept)
  places: list = dataclasses.field(default_factory=list)  # where each row is ('train.parquet row 3'), for messages

  def place(self, index: int) -> str:
    """Where row `index` came from ('train.parquet row 3'); 'row <index>' for a dataset built without places."""
    return self.places[index] if index < len(self.places) else f"row {index}"

  def __len__(self) -> int:
    return len(self.data_sources)

  def sampling_note(self, key: str, max_samples_key: str) -> str | None:
    """What `data.train_max_samples` (`max_samples_key`) did to the rows of `key` (None: every row kept)."""
    if not self.num_read:
      return None
    kept = len(self) + self.num_filtered
    return f"{key}: {max_samples_key}={kept} uses {kept} of its {self.num_read} rows"

  def filtering_note(self, key: str) -> str | None:
    """What `data.filter_overlong_prompts` did to the rows of `key` (None: nothing dropped)."""
    if not self.num_filtered:
      return None
    return (
      f"{key}: data.filter_overlong_prompts dropped {self.num_filtered} of {len(self) + self.num_filtered} "
      f"rows (longer than data.max_prompt_length={self.input_ids.shape[1]}); {len(self)} left"
    )


def build_dataset(
  files,
  tokenizer,
  *,
  max_prompt_length: int,
  prompt_key: str = "prompt",
  reward_fn_key: str = "data_source",
  truncation: str = "error",
  filter_overlong_prompts: bool = False,
  tools=None,
  chat_template_kwargs=None,
  max_samples: int = -1,
  shuffle: bool = True,
  seed: int | None = None,
) -> PromptDataset:
  """`tools`: the tool schemas of a multi-turn rollout, rendered into each prompt by the chat template.
  `max_samples` (verl's `data.train_max_samples`/`val_max_samples`): keep that many rows, chosen before anything is
  tokenized or filtered: with `shuffle` a random subset (`seed`), in the order drawn, else the first ones; <= 0 keeps
  every row."""
  rows, places = _rows_and_places(files)
  num_read = len(rows)
  if 0 < max_samples < num_read:
    chosen = np.random.default_rng(seed).choice(num_read, max_samples, replace=False) if shuffle else range(max_samples)
    rows, places = [rows[i] for i in chosen], [places[i] for i in chosen]
  pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
  ids_list, sources, truths, extras, kept_places = [], [], [], [], []
  filtered = 0
  encoded = encode_prompts(
    tokenizer,
    [_messages(row, prompt_key, where) for row, where in zip(rows, places)],
    tools=tools,
    chat_template_kwargs=chat_template_kwargs,
  )
  for row, ids, where in zip(rows, encoded, places):
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
    kept_places.append(where)
  if not ids_list:
    raise DataError(
      f"{', '.join(_file_list(files))}: no rows left (read {len(rows)}, data.filter_overlong_prompts "
      f"dropped {filtered} longer than data.max_prompt_length={max_prompt_length})"
    )
  input_ids = np.full((len(ids_list), max_prompt_length), pad_id, np.int32)
  attention_mask = np.zeros((len(ids_list), max_prompt_length), np.int32)
  for i, ids in enumerate(ids_list):
    if ids:
      input_ids[i, -len(ids) :] = ids
      attention_mask[i, -len(ids) :] = 1
  num_read = num_read if len(rows) < num_read else 0  # 0: every row kept
  return PromptDataset(input_ids, attention_mask, sources, truths, extras, filtered, num_read, kept_places)


class BatchSchedule:
  """Batch k of the run = rows order[k*B:(k+1)*B] of epoch k // batches_per_epoch (drop_last)."""

  def __init__(
    self,
    num_rows: int,
    batch_size: int,
    *,
    seed: int,
    shuffle: bool = True,
    key: str = "data.train_batch_size",
    num_dropped: int = 0,
  ):
    """`key` names the batch size in errors; `num_dropped`: rows `data.filter_overlong_prompts` removed."""
    if batch_size > num_rows:
      read = (
        f"; {num_rows + num_dropped} read, {num_dropped} dropped by data.filter_overlong_prompts" if num_dropped else ""
      )
      raise DataError(f"{key}={batch_size} is larger than the dataset ({num_rows} rows{read})")
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
    raise DataError(
      f"a batch of {len(indices)} rows does not split over {process_count} processes "
      "(make data.train_batch_size x rollout.n a multiple of the process count)"
    )
  share = len(indices) // process_count
  return indices[process_index * share : (process_index + 1) * share]


def longest_prompt(dataset: PromptDataset, indices: np.ndarray) -> int:
  """Tokens in the longest prompt of the rows `indices`."""
  return int(dataset.attention_mask[indices].sum(axis=1).max())


def batch_arrays(dataset: PromptDataset, indices: np.ndarray, prompt_width: int | None = None) -> dict[str, np.ndarray]:
  """The rows `indices`, their prompts left-padded to `prompt_width` tokens (None: `max_prompt_length`).

  Prompts are left-padded, so a narrower batch is the last `prompt_width` columns; it must hold the
  longest prompt of the rows (`longest_prompt`).
  """
  width = dataset.input_ids.shape[1] if prompt_width is None else prompt_width
  if not longest_prompt(dataset, indices) <= width <= dataset.input_ids.shape[1]:
    raise ValueError(
      f"prompt_width={width} must lie between the batch's longest prompt "
      f"({longest_prompt(dataset, indices)}) and max_prompt_length ({dataset.input_ids.shape[1]})"
    )
  columns = slice(dataset.input_ids.shape[1] - width, None)
  return {
    "input_ids": dataset.input_ids[indices, columns],
    "attention_mask": dataset.attention_mask[indices, columns],
    "sample_index": indices.astype(np.int32),
  }
