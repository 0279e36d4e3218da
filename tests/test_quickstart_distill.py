"""The distillation quickstart as a user runs it (issue 52): the recall quickstart trains a teacher, then
`configs/quickstart_distill.py` distills a fresh student from it with no task reward in its loss.

Both runs stop once they have shown their part: the teacher at 0.95 greedy validation (its SIGTERM checkpoint is
exported in HF format, `trainer.save_hf`), the student at 0.95 too (step 20 of 50 here, against the PPO
quickstart's step 100: docs/quickstarts.md)."""

import glob

import pytest

from jaxrlhf.tracking.jsonl import read_metrics
from tests.helpers import VAL_KEY, run_train

TARGET = 0.95


@pytest.mark.slow
def test_distilled_student_reaches_target(tmp_path):
  reached = lambda val: bool(val) and val[-1] >= TARGET
  teacher_root, student_root = tmp_path / "teacher", tmp_path / "student"
  teacher_root.mkdir(), student_root.mkdir()
  run_train(
    "configs/quickstart.py",
    f"--config.trainer.default_local_dir={teacher_root}",
    "--config.trainer.logger=('jsonl',)",
    "--config.trainer.save_freq=1000",  # no periodic checkpoint: the one SIGTERM writes
    "--config.trainer.save_hf=True",
    stop_when=reached,
  )
  (teacher_path,) = glob.glob(str(teacher_root / "quickstart" / "recall_ppo" / "huggingface" / "global_step_*"))
  run_train(
    "configs/quickstart_distill.py",
    f"--config.trainer.default_local_dir={student_root}",
    f"--config.distillation.teacher_model.model_path={teacher_path}",
    "--config.trainer.logger=('jsonl',)",
    stop_when=reached,
  )
  records = read_metrics(student_root / "quickstart" / "recall_distill" / "metrics.jsonl")
  val = [r[VAL_KEY] for r in records if VAL_KEY in r]
  assert val[0] <= 0.2 and val[-1] >= TARGET, val
  train = [r for r in records if "distillation/loss" in r]
  # The student's loss is the distillation term alone: it falls as the student meets the teacher.
  assert train[-1]["distillation/loss"] < 0.5 * train[0]["distillation/loss"], [r["distillation/loss"] for r in train]
  assert all("distillation/teacher_mass" in r and "distillation/overlap_ratio" in r for r in train)
