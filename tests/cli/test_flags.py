"""train.py's `--config.` flags read like verl's `key=value` ones: without --config they apply to verl's
defaults, and a key given twice takes its last value (absl alone appends a repeated flag's values)."""

import pytest

from jaxrlhf.cli import last_override_wins
from tests.cli.test_bad_input import assert_user_error, run_cli


def test_only_the_last_of_a_repeated_config_flag_is_kept_in_place():
  argv = [
    "train.py",
    "--config",
    "c.py",
    "--config.data.train_files=a",
    "--config.trainer.logger=('jsonl',)",
    "--config.data.train_files=b",
    "data.train_files=c",
    "--config.data.train_files_x=d",
  ]
  assert last_override_wins(argv) == [
    "train.py",
    "--config",
    "c.py",
    "--config.trainer.logger=('jsonl',)",
    "--config.data.train_files=b",
    "data.train_files=c",
    "--config.data.train_files_x=d",
  ]


@pytest.mark.parametrize(
  "args, missing",
  [
    # No --config: the flags apply to configs/verl_defaults.py, as key=value overrides do.
    (["--config.data.tokenizer=builtin:recall", "--config.data.train_files=/nonexistent/a.parquet"], "a.parquet"),
    # Repeated: the last wins (before, both files were trained on and the first was checked first).
    (
      [
        "--config.data.tokenizer=builtin:recall",
        "--config.data.train_files=/nonexistent/a.parquet",
        "--config.data.train_files=/nonexistent/b.parquet",
      ],
      "b.parquet",
    ),
    # Both spellings: key=value applies after the --config. flags.
    (
      [
        "--config.data.tokenizer=builtin:recall",
        "--config.data.train_files=/nonexistent/a.parquet",
        "data.train_files=/nonexistent/c.parquet",
      ],
      "c.parquet",
    ),
  ],
)
def test_config_flags_without_config_apply_to_verl_defaults_and_the_last_value_wins(args, missing):
  result = run_cli("train.py", *args)
  assert_user_error(result, "train.py", "data.train_files", f"/nonexistent/{missing}")
