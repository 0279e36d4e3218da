"""examples/data_preprocess/{gsm8k,math}.py run as real scripts on small files written here."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jaxrlhf.rewards import default_compute_score

REPO = Path(__file__).resolve().parents[2]
GSM8K_SCRIPT = REPO / "examples" / "data_preprocess" / "gsm8k.py"
MATH_SCRIPT = REPO / "examples" / "data_preprocess" / "math.py"
GSM8K_SUFFIX = 'Let\'s think step by step and output the final answer after "####".'
MATH_SUFFIX = "Let's think step by step and output the final answer within \\boxed{}."

GSM8K_TRAIN = [
  {
    "question": "Natalia sold 48 clips in April and half as many in May. How many in total?",
    "answer": "In May she sold 48/2 = <<48/2=24>>24 clips.\n48+24 = <<48+24=72>>72\n#### 72",
  },
  {
    "question": "A car costs $1,250 more than a bike costing $250. What does the car cost?",
    "answer": "1,250 + 250 = 1,500\n#### 1,500",
  },
  {"question": "What is 3 - 8?", "answer": "3 - 8 = -5\n#### -5"},
]
GSM8K_TEST = [{"question": "What is 0.5 + 1?", "answer": "#### 1.5"}]
MATH_ROWS = [
  {
    "problem": "Compute $\\frac{2}{4}$.",
    "solution": "It is $\\boxed{\\frac{1}{2}}$.",
    "level": "Level 1",
    "type": "Algebra",
  },
  {
    "problem": "Find $x$ with $x^2=9$, $x>0$.",
    "solution": "First $\\boxed{-3}$ is out; so $\\boxed{3}$.",
    "level": "Level 2",
    "type": "Algebra",
  },
]


def write_jsonl(path, rows):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def write_parquet(path, rows):
  path.parent.mkdir(parents=True, exist_ok=True)
  pq.write_table(pa.Table.from_pylist(rows), path)


def run_script(script, *args, cwd=None):
  return subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True, cwd=cwd)


def test_gsm8k_from_jsonl(tmp_path):
  write_jsonl(tmp_path / "raw" / "train.jsonl", GSM8K_TRAIN)
  write_jsonl(tmp_path / "raw" / "test.jsonl", GSM8K_TEST)
  result = run_script(GSM8K_SCRIPT, "--local_dir", tmp_path / "raw", "--output_dir", tmp_path / "out")
  assert result.returncode == 0, result.stderr

  train = pq.read_table(tmp_path / "out" / "train.parquet")
  assert train.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
  assert pa.types.is_list(train.schema.field("prompt").type)
  assert pa.types.is_struct(train.schema.field("reward_model").type)
  rows = train.to_pylist()
  assert [row["reward_model"] for row in rows] == [
    {"style": "rule", "ground_truth": "72"},
    {"style": "rule", "ground_truth": "1500"},
    {"style": "rule", "ground_truth": "-5"},
  ]
  first = rows[0]
  assert first["data_source"] == "openai/gsm8k"
  assert first["ability"] == "math"
  assert first["prompt"] == [{"role": "user", "content": GSM8K_TRAIN[0]["question"] + " " + GSM8K_SUFFIX}]
  assert first["extra_info"] == {
    "split": "train",
    "index": 0,
    "answer": GSM8K_TRAIN[0]["answer"],
    "question": GSM8K_TRAIN[0]["question"],
  }
  assert [row["extra_info"]["index"] for row in rows] == [0, 1, 2]
  # The reference solutions score 1 under the reward the rows select.
  for raw, row in zip(GSM8K_TRAIN, rows):
    assert default_compute_score(row["data_source"], raw["answer"], row["reward_model"]["ground_truth"]) == 1.0

  test = pq.read_table(tmp_path / "out" / "test.parquet").to_pylist()
  assert [(r["extra_info"]["split"], r["reward_model"]["ground_truth"]) for r in test] == [("test", "1.5")]


def test_gsm8k_from_hub_style_parquet_layout(tmp_path):
  # The Hub's openai/gsm8k: main/ and socratic/ each with train-/test- shards.
  for variant in ("main", "socratic"):
    write_parquet(tmp_path / "gsm8k" / variant / "train-00000-of-00001.parquet", GSM8K_TRAIN)
    write_parquet(tmp_path / "gsm8k" / variant / "test-00000-of-00001.parquet", GSM8K_TEST)

  mixed = run_script(GSM8K_SCRIPT, "--local_dir", tmp_path / "gsm8k", "--output_dir", tmp_path / "mixed")
  assert mixed.returncode != 0
  assert "several folders" in mixed.stderr and "socratic" in mixed.stderr
  assert "Traceback" not in mixed.stderr
  assert not (tmp_path / "mixed").exists()

  # verl's old --local_dataset_path / --local_save_dir spellings are accepted too.
  result = run_script(
    GSM8K_SCRIPT, "--local_dataset_path", tmp_path / "gsm8k" / "main", "--local_save_dir", tmp_path / "out"
  )
  assert result.returncode == 0, result.stderr
  assert pq.read_table(tmp_path / "out" / "train.parquet").num_rows == 3
  assert pq.read_table(tmp_path / "out" / "test.parquet").num_rows == 1


def test_math_from_parquet_keeps_extra_columns(tmp_path):
  write_parquet(tmp_path / "data" / "train-00000-of-00001.parquet", MATH_ROWS)
  write_parquet(tmp_path / "data" / "test-00000-of-00001.parquet", MATH_ROWS[:1])
  # Run from inside the scripts' folder: math.py must not shadow the stdlib math module.
  result = run_script(
    MATH_SCRIPT, "--local_dir", tmp_path / "data", "--output_dir", tmp_path / "out", cwd=MATH_SCRIPT.parent
  )
  assert result.returncode == 0, result.stderr

  rows = pq.read_table(tmp_path / "out" / "train.parquet").to_pylist()
  assert [row["reward_model"]["ground_truth"] for row in rows] == ["\\frac{1}{2}", "3"]
  first = rows[0]
  assert first["data_source"] == "DigitalLearningGmbH/MATH-lighteval"
  assert first["prompt"] == [{"role": "user", "content": MATH_ROWS[0]["problem"] + " " + MATH_SUFFIX}]
  assert first["extra_info"] == {
    "split": "train",
    "index": 0,
    "answer": MATH_ROWS[0]["solution"],
    "question": MATH_ROWS[0]["problem"],
  }
  assert (first["level"], first["type"]) == ("Level 1", "Algebra")
  for raw, row in zip(MATH_ROWS, rows):
    assert default_compute_score(row["data_source"], raw["solution"], row["reward_model"]["ground_truth"]) == 1.0
  assert pq.read_table(tmp_path / "out" / "test.parquet").num_rows == 1


def test_math_single_file_with_split_and_data_source(tmp_path):
  write_jsonl(tmp_path / "math500.jsonl", MATH_ROWS)
  result = run_script(
    MATH_SCRIPT,
    "--local_dir",
    tmp_path / "math500.jsonl",
    "--split",
    "test",
    "--data_source",
    "HuggingFaceH4/MATH-500",
    "--output_dir",
    tmp_path / "out",
  )
  assert result.returncode == 0, result.stderr
  assert sorted(os.listdir(tmp_path / "out")) == ["test.parquet"]
  rows = pq.read_table(tmp_path / "out" / "test.parquet").to_pylist()
  assert {row["data_source"] for row in rows} == {"HuggingFaceH4/MATH-500"}
  assert [row["extra_info"]["split"] for row in rows] == ["test", "test"]


@pytest.mark.parametrize(
  "script,files,expected",
  [
    # Each bad split sits next to a good one, which must not be written either.
    (GSM8K_SCRIPT, {"train.jsonl": [{"question": "q"}], "test.jsonl": GSM8K_TEST}, ["train.jsonl", "'answer'"]),
    (
      GSM8K_SCRIPT,
      {"train.jsonl": [{"question": "q", "answer": "no marker"}], "test.jsonl": GSM8K_TEST},
      ["train.jsonl", "row 0"],
    ),
    (
      MATH_SCRIPT,
      {"train.jsonl": MATH_ROWS, "test.jsonl": [{"problem": "p", "solution": "no box"}]},
      ["test.jsonl", "'solution'"],
    ),
    (GSM8K_SCRIPT, {"data.jsonl": GSM8K_TRAIN}, ["no split files"]),
    (GSM8K_SCRIPT, {}, ["does not exist"]),
  ],
)
def test_bad_input_fails_clearly_and_writes_nothing(tmp_path, script, files, expected):
  raw = tmp_path / "raw"
  for name, rows in files.items():
    write_jsonl(raw / name, rows)
  result = run_script(script, "--local_dir", raw, "--output_dir", tmp_path / "out")
  assert result.returncode != 0
  assert "Traceback" not in result.stderr
  for fragment in expected:
    assert fragment in result.stderr
  assert not (tmp_path / "out").exists()
