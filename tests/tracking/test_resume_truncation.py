"""On resume, appending loggers are cut back to the resumed step: each step is logged once, nothing deleted."""

import json

from jaxrlhf.tracking import Tracking, read_metrics, truncate_jsonl


def _write(path, steps, partial=False):
  with open(path, "w") as f:
    for step in steps:
      f.write(json.dumps({"step": step, "x": float(step)}) + "\n")
    if partial:
      f.write('{"step": 9, "x"')  # a write cut short by a killed process


def test_truncate_keeps_steps_up_to_the_checkpoint_and_moves_the_rest_aside(tmp_path):
  path = tmp_path / "metrics.jsonl"
  _write(path, [0, 1, 2, 3, 4], partial=True)
  assert truncate_jsonl(str(path), 2) == 3
  assert [r["step"] for r in read_metrics(str(path))] == [0, 1, 2]
  dropped = (tmp_path / "metrics.dropped.jsonl").read_text().splitlines()
  assert [json.loads(line)["step"] for line in dropped[:2]] == [3, 4] and dropped[2] == '{"step": 9, "x"'
  assert truncate_jsonl(str(path), 2) == 0  # nothing past step 2 any more
  assert truncate_jsonl(str(tmp_path / "absent.jsonl"), 2) == 0


def test_a_resumed_tracking_appends_after_the_resumed_step_and_a_fresh_one_starts_empty(tmp_path):
  _write(tmp_path / "metrics.jsonl", [1, 2, 3])
  with Tracking(("jsonl",), str(tmp_path), total_steps=4, start_step=2) as tracking:
    tracking.log({"x": 30.0}, step=3)
  assert [(r["step"], r["x"]) for r in read_metrics(str(tmp_path / "metrics.jsonl"))] == [(1, 1.0), (2, 2.0), (3, 30.0)]
  with Tracking(("jsonl",), str(tmp_path), total_steps=4, start_step=0) as tracking:
    tracking.log({"x": 10.0}, step=1)
  assert [r["step"] for r in read_metrics(str(tmp_path / "metrics.jsonl"))] == [1]
  assert [r["step"] for r in read_metrics(str(tmp_path / "metrics.dropped.jsonl"))] == [3, 1, 2, 3]


def test_a_resumed_run_validating_at_its_checkpoint_step_keeps_one_record_for_that_step(tmp_path):
  """A resume validates at the step it continues from (trainer.val_before_train), which already has a record: the
  validation joins that record (the README's "each step appears once"); later steps append as usual, and two
  records of one later step (a guard's two rollbacks at one step) stay two: nothing logged is overwritten."""
  _write(tmp_path / "metrics.jsonl", [0, 1, 2])
  with Tracking(("jsonl",), str(tmp_path), total_steps=4, start_step=2) as tracking:
    tracking.log({"val": 0.5}, step=2)
    tracking.log({"x": 3.0}, step=3)
    tracking.log({"x": 4.0}, step=3)
  records = read_metrics(str(tmp_path / "metrics.jsonl"))
  assert [r["step"] for r in records] == [0, 1, 2, 3, 3]
  assert records[2] == {"step": 2, "x": 2.0, "val": 0.5} and [r["x"] for r in records[3:]] == [3.0, 4.0]
