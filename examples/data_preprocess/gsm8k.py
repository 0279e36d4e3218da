"""Convert a local copy of GSM8K into verl's parquet row format (docs/algorithms.md §8); no network access.

    python examples/data_preprocess/gsm8k.py --local_dir ~/raw/gsm8k/main --output_dir ~/data/gsm8k

``--local_dir`` is a directory holding ``train*`` / ``test*`` files (.jsonl, .json or .parquet, e.g.
the Hub's ``main/train-00000-of-00001.parquet``), or one such file. Each row needs ``question`` and
``answer`` (ending in ``#### N``). Writes ``train.parquet`` / ``test.parquet`` with columns
``data_source, prompt, ability, reward_model, extra_info`` exactly as verl's preprocessing emits.

This module also holds the reading/writing shared with ``math.py`` next to it.
"""

import os
import sys

# math.py lives in this directory: keep it from shadowing the stdlib `math` for every import below.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != _HERE]

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
from typing import Any, Callable, Optional, Sequence  # noqa: E402

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
SPLITS = ("train", "test")
SUFFIXES = (".jsonl", ".json", ".parquet")

_ANSWER_RE = re.compile(r"#### (-?[0-9.,]+)")


def extract_ground_truth(answer: str) -> Optional[str]:
  """The number after the first ``#### `` with commas removed, as verl's gsm8k preprocessing."""
  match = _ANSWER_RE.search(answer)
  return None if match is None else match.group(1).replace(",", "")


def find_split_files(local_dir: str, split: Optional[str] = None) -> dict[str, list[str]]:
  """``{split: [files]}`` for a directory (``train*`` / ``test*`` files) or a single file."""
  path = os.path.abspath(os.path.expanduser(local_dir))
  if os.path.isfile(path):
    name = os.path.basename(path)
    split = split or next((s for s in SPLITS if name.startswith(s)), None)
    if split is None:
      raise ValueError(
        f"cannot tell the split of {path!r} from its name (expected it to start with one of {SPLITS}); pass --split"
      )
    return {split: [path]}
  if not os.path.isdir(path):
    raise FileNotFoundError(f"--local_dir {path!r} does not exist")

  found: dict[str, list[str]] = {}
  for root, dirs, files in os.walk(path):
    dirs.sort()
    for name in sorted(files):
      file_split = next((s for s in SPLITS if name.startswith(s)), None)
      if file_split and name.endswith(SUFFIXES) and (split is None or split == file_split):
        found.setdefault(file_split, []).append(os.path.join(root, name))
  if not found:
    raise FileNotFoundError(
      f"no split files under {path!r}: expected files named {[s + '*' for s in SPLITS]} ending in {SUFFIXES}"
    )
  folders = sorted({os.path.dirname(f) for files in found.values() for f in files})
  if len(folders) > 1:
    # e.g. the Hub's gsm8k holds both main/ and socratic/: never silently mix two variants.
    raise ValueError(f"split files under {path!r} come from several folders {folders}; pass one of them as --local_dir")
  return found


def read_records(path: str, required_columns: Sequence[str]) -> list[dict[str, Any]]:
  """Rows of a .parquet / .jsonl / .json file; raises naming the file if a column is missing."""
  if path.endswith(".parquet"):
    records = pq.read_table(path).to_pylist()
  else:
    with open(path, encoding="utf-8") as handle:
      text = handle.read()
    records = None
    if path.endswith(".json"):
      try:
        loaded = json.loads(text)
        records = loaded if isinstance(loaded, list) else None
      except json.JSONDecodeError:
        pass
    if records is None:
      records = []
      for line_number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
          continue
        try:
          records.append(json.loads(line))
        except json.JSONDecodeError as error:
          raise ValueError(f"{path}:{line_number}: not valid JSON ({error})") from None
  for row_number, record in enumerate(records):
    if not isinstance(record, dict):
      raise ValueError(f"{path}: row {row_number} is a {type(record).__name__}, expected a JSON object")
    missing = [column for column in required_columns if column not in record]
    if missing:
      raise ValueError(
        f"{path}: row {row_number} lacks column(s) {missing}; expected {list(required_columns)}, found {sorted(record)}"
      )
  return records


def make_row(
  data_source: str, split: str, index: int, question: str, answer: str, ground_truth: str, instruction: str
) -> dict[str, Any]:
  """One row in verl's format (docs/algorithms.md §8)."""
  return {
    "data_source": data_source,
    "prompt": [{"role": "user", "content": question + " " + instruction}],
    "ability": "math",
    "reward_model": {"style": "rule", "ground_truth": ground_truth},
    "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
  }


def convert(
  argv: Optional[Sequence[str]],
  *,
  description: str,
  default_output_dir: str,
  default_data_source: str,
  question_column: str,
  answer_column: str,
  ground_truth_fn: Callable[[str], Optional[str]],
  instruction: str,
  row_fn: Callable[..., dict[str, Any]] = make_row,
) -> dict[str, str]:
  """The whole CLI: read every split, convert, and only then write; returns ``{split: parquet path}``.
  ``row_fn``: one row from ``make_row``'s arguments (the multi-turn variant adds a system prompt and tool kwargs)."""
  parser = argparse.ArgumentParser(description=description)
  parser.add_argument(
    "--local_dir",
    "--local_dataset_path",
    dest="local_dir",
    required=True,
    help="directory with train*/test* .jsonl/.json/.parquet files, or one such file",
  )
  parser.add_argument(
    "--output_dir",
    "--local_save_dir",
    dest="output_dir",
    default=default_output_dir,
    help="where train.parquet / test.parquet are written",
  )
  parser.add_argument(
    "--split",
    choices=SPLITS,
    default=None,
    help="convert only this split (needed for a single file whose name does not say)",
  )
  parser.add_argument(
    "--data_source", default=default_data_source, help="data_source written on every row; selects the reward function"
  )
  args = parser.parse_args(argv)

  tables: dict[str, pa.Table] = {}
  for split, files in sorted(find_split_files(args.local_dir, args.split).items()):
    rows = []
    for path in files:
      for record in read_records(path, (question_column, answer_column)):
        question, answer = str(record[question_column]), str(record[answer_column])
        ground_truth = ground_truth_fn(answer)
        if ground_truth is None:
          raise ValueError(
            f"{path}: row {len(rows)} of split {split!r}: no final answer found in column "
            f"{answer_column!r}: {answer[-200:]!r}"
          )
        row = row_fn(args.data_source, split, len(rows), question, answer, ground_truth, instruction)
        # Other columns (MATH's level/type) are kept, as verl's datasets.map keeps them.
        row.update({k: v for k, v in record.items() if k not in (question_column, answer_column, *row)})
        rows.append(row)
    tables[split] = pa.Table.from_pylist(rows)

  output_dir = os.path.abspath(os.path.expanduser(args.output_dir))
  os.makedirs(output_dir, exist_ok=True)
  written = {}
  for split, table in tables.items():
    written[split] = os.path.join(output_dir, f"{split}.parquet")
    pq.write_table(table, written[split])
    print(f"wrote {table.num_rows} {split} rows to {written[split]}")
  return written


def main(argv: Optional[Sequence[str]] = None) -> dict[str, str]:
  return convert(
    argv,
    description=__doc__.splitlines()[0],
    default_output_dir="~/data/gsm8k",
    default_data_source=DATA_SOURCE,
    question_column="question",
    answer_column="answer",
    ground_truth_fn=extract_ground_truth,
    instruction=INSTRUCTION,
  )


if __name__ == "__main__":
  try:
    main()
  except (OSError, ValueError) as error:  # bad input: one clear line, no traceback
    sys.exit(f"error: {error}")
