"""Issue 50's smaller items, each at the function that decides it (no step is compiled): a logger listed twice, a
comma list for trainer.logger, config.json of a refused resume, max_actor_ckpt_to_keep=0, what on_error=zero
failed on, a failed save's half-written folder, a damaged checkpoint's message, the null ground truth warning and
the closing `done:` line."""

import json
import logging
import os

import jax
import numpy as np
import pytest

from jaxrlhf import checkpoint as checkpoint_module
from jaxrlhf import verl_compat
from jaxrlhf.checkpoint import Checkpointer, CheckpointError
from jaxrlhf.config import get_base_config, resolve_config, validate_config
from jaxrlhf.data import PromptDataset
from jaxrlhf.rewards import ERROR_KEY, RewardScorer, score_batch
from jaxrlhf.trainer import Trainer
from jaxrlhf.trainer.reward import warn_null_ground_truths
from jaxrlhf.trainer.validation import validation_summary
from tests.cli.test_bad_input import assert_user_error, run_cli
from tests.helpers import small_config

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


# ----- trainer.logger -----------------------------------------------------------------------------


def test_a_logger_listed_twice_is_used_once_with_a_warning(tmp_path, caplog):
  """Each listed logger wrote every record: `["console","jsonl","jsonl"]` wrote metrics.jsonl's rows twice."""
  config = small_config(tmp_path, **{"trainer.logger": ("console", "jsonl", "jsonl", "console")})
  with caplog.at_level(logging.WARNING):
    resolved = resolve_config(config)
  assert tuple(resolved.trainer.logger) == ("console", "jsonl")
  warnings = [r.getMessage() for r in caplog.records if "trainer.logger" in r.getMessage()]
  assert warnings == ["trainer.logger lists console, jsonl more than once: using each logger once"]


def test_a_comma_list_for_trainer_logger_is_refused_with_the_tuple_syntax_as_hint(tmp_path):
  result = run_cli(
    "train.py", "--config", "configs/quickstart.py", f"--config.trainer.default_local_dir={tmp_path}",
    "--config.trainer.logger=console,jsonl",
  )  # fmt: skip
  assert_user_error(result, "train.py", "'trainer.logger'", "'console,jsonl'", "tuple of names")
  assert """--config.trainer.logger="('console', 'jsonl')\"""" in result.lines("train.py")[1]


# ----- checkpoints ------------------------------------------------------------------------------


def test_a_refused_resume_leaves_the_run_directorys_config_json_as_it_was(tmp_path):
  """config.json is written once the resume is accepted: a refused one left the rejected config beside the
  checkpoints it does not describe. No step is compiled: the checkpoint is the initial state."""
  config = small_config(tmp_path, **{"trainer.resume_mode": "auto"})
  first = Trainer(config, devices=jax.devices()[:1])
  checkpointer = Checkpointer(first.run_dir)
  first.save(checkpointer, 1)
  checkpointer.close()
  first.run_lock.release()
  saved = json.dumps(first.config.to_dict(), default=str)
  config_json = os.path.join(first.run_dir, "config.json")
  with open(config_json, "w") as f:  # what the first run's fit() wrote
    f.write(saved)

  changed = small_config(tmp_path, **{"trainer.resume_mode": "auto"})
  changed.actor_rollout_ref.model.override_config.hidden_size = 32
  with pytest.raises(CheckpointError, match="does not fit this run's state") as error:
    Trainer(changed, devices=jax.devices()[:1]).fit()
  assert "override_config.hidden_size: 64 in the checkpoint, 32 now" in str(error.value)
  assert "default_local_dir" not in str(error.value)  # only the settings that decide the state
  with open(config_json) as f:
    assert f.read() == saved


def test_max_actor_ckpt_to_keep_0_keeps_every_checkpoint_as_in_verl(tmp_path):
  config = small_config(tmp_path, **{"trainer.max_actor_ckpt_to_keep": 0})
  validate_config(config)  # was refused (">= 1")
  for bad in (-1,):
    with pytest.raises(Exception, match="max_actor_ckpt_to_keep"):
      validate_config(small_config(tmp_path, **{"trainer.max_actor_ckpt_to_keep": bad}))
  kept = lambda *overrides: verl_compat.plan(list(overrides), get_base_config()).assignments.get(
    "trainer.max_actor_ckpt_to_keep"
  )
  assert kept("trainer.max_actor_ckpt_to_keep=0", "trainer.max_critic_ckpt_to_keep=1") is None  # 0: all
  assert kept("trainer.max_actor_ckpt_to_keep=2", "trainer.max_critic_ckpt_to_keep=0") is None
  assert kept("trainer.max_actor_ckpt_to_keep=2", "trainer.max_critic_ckpt_to_keep=1") == 2


def test_a_failed_save_removes_its_half_written_folder_or_names_it_in_the_hint(tmp_path, monkeypatch):
  """On a full disk Orbax's global_step_N.orbax-checkpoint-tmp holds the space a retry needs."""
  checkpointer = Checkpointer(str(tmp_path))
  unfinished = tmp_path / "global_step_3.orbax-checkpoint-tmp-1700000000"
  other = tmp_path / "global_step_2.orbax-checkpoint-tmp-1600000000"  # another step's: not this save's to remove
  for folder in (unfinished, other):
    (folder / "state").mkdir(parents=True)
    (folder / "state" / "data").write_bytes(b"x" * 1024)
  with pytest.raises(CheckpointError) as error:
    with checkpointer._save_failure(3):
      raise OSError(28, "No space left on device")
  assert str(error.value).startswith(f"saving checkpoint {tmp_path}/global_step_3 failed: ")
  assert not unfinished.exists() and other.exists()
  assert error.value.hint == "free space (or fix the path) and start again with trainer.resume_mode=auto"

  (unfinished / "state").mkdir(parents=True)
  monkeypatch.setattr(checkpoint_module.shutil, "rmtree", lambda *args, **kwargs: None)  # cannot remove it
  with pytest.raises(CheckpointError) as error:
    with checkpointer._save_failure(3):
      raise OSError(28, "No space left on device")
  assert error.value.hint.startswith(f"remove the half-written {unfinished}, free space")
  checkpointer.close()


def test_a_damaged_checkpoints_message_ends_in_tensorstores_words_not_a_pybind11_repr():
  tensorstore = ValueError(
    'OUT_OF_RANGE: Error reading "actor.params.w/0" in OCDBT database at local file "/run/global_step_2/state/": '
    "Unexpected end of data [source locations='tensorstore/kvstore/ocdbt/io/indirect_data_writer.cc:180'] "
    "See full TensorStore details for more."
  )
  try:
    try:
      raise tensorstore
    except ValueError as inner:
      raise RuntimeError(
        "Failed to restore: <built-in method read of PyCapsule object at 0x7f3a2c1d5e40>, <bound method"
      ) from inner
  except RuntimeError as outer:
    with pytest.raises(CheckpointError) as error:
      with checkpoint_module._unreadable_as_checkpoint_error("/run/global_step_2"):
        raise outer
  message = str(error.value)
  assert message == (
    "checkpoint /run/global_step_2 cannot be read (a truncated or damaged file?): ValueError: OUT_OF_RANGE: Error "
    'reading "actor.params.w/0" in OCDBT database at local file "/run/global_step_2/state/": Unexpected end of '
    "data [source locations='tensorstore/kvstore/ocdbt/io/indirect_data_writer.cc:180']"
  )
  assert "PyCapsule" not in message and "See full" not in message


# ----- rewards ------------------------------------------------------------------------------------


def test_on_error_zero_says_what_failed_once_a_batch(caplog):
  """It scored the sample 0 and counted it (reward/num_errors) but discarded the error's text."""

  def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "bad":
      raise ValueError(f"cannot parse {ground_truth!r}")
    return 1.0

  scorer = RewardScorer(compute_score, num_workers=0)
  with caplog.at_level(logging.WARNING):
    scores, extras = score_batch(scorer, ["a", "b", "c", "d"], ["ok", "bad", "ok", "bad"], ["1"] * 4, on_error="zero")
  assert scores.tolist() == [1.0, 0.0, 1.0, 0.0] and extras[ERROR_KEY].tolist() == [0.0, 1.0, 0.0, 1.0]
  warnings = [r.getMessage() for r in caplog.records if "on_error=zero" in r.getMessage()]
  assert warnings == [
    "reward: 2 of 4 samples failed and scored 0 (reward_model.on_error=zero); the first, sample 1 "
    "(data_source='b'): ValueError: cannot parse '1'"
  ]


def test_the_null_ground_truth_warning_names_the_files_rows_and_says_the_metric_counts_samples(caplog):
  """It said "row 3" (of the dataset, not of a file) and "counts them" of a metric that counts samples."""
  truths = ["1", None, "2", float("nan")]
  places = [f"/data/train.parquet row {i}" for i in range(4)]
  dataset = PromptDataset(
    np.zeros((4, 1), np.int32), np.ones((4, 1), np.int32), ["gsm8k"] * 4, truths, [{}] * 4, places=places
  )
  with caplog.at_level(logging.WARNING):
    warn_null_ground_truths(dataset)
  (message,) = [r.getMessage() for r in caplog.records if "null reward_model.ground_truth" in r.getMessage()]
  assert "2 of 4 data rows" in message
  assert "/data/train.parquet row 1 (data_source 'gsm8k'), /data/train.parquet row 3 (data_source 'gsm8k')" in message
  assert "counts their samples (actor_rollout_ref.rollout.n per row), not rows" in message


# ----- the closing line ---------------------------------------------------------------------------


def test_the_done_line_summary_has_no_nan_no_arrow_for_one_value_and_nothing_without_validation():
  key = "val-core/jaxrlhf/recall/reward/mean@1"
  # validated at steps 2 and 4, not before training: the first record has no value ('nan -> ...' before)
  history = [{"step": 1}, {"step": 2, key: 0.25}, {"step": 3}, {"step": 4, key: 0.875}]
  assert validation_summary(history) == f"{key}: 0.250 -> 0.875"
  assert validation_summary(history[:2]) == f"{key}: 0.250"  # one validation: one value, not '0.250 -> 0.250'
  assert validation_summary([{"step": 1}, {"step": 2}]) == ""  # train.py then ends the line without '; '
