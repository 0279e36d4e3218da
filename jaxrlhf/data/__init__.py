"""verl-format datasets, chat templates, deterministic batching, built-in synthetic tasks."""

from jaxrlhf.data.dataset import (
  BatchSchedule,
  DataError,
  PromptDataset,
  batch_arrays,
  build_dataset,
  encode_prompt,
  load_rows,
  longest_prompt,
  process_rows,
)

__all__ = [
  "BatchSchedule",
  "DataError",
  "PromptDataset",
  "batch_arrays",
  "build_dataset",
  "encode_prompt",
  "load_rows",
  "longest_prompt",
  "process_rows",
]
