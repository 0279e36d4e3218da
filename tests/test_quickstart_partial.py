"""The partial-rollout quickstart, as a user runs it: `python train.py --config configs/quickstart_partial.py`. (A file
of its own: `make test` gives each file to one worker, and the learning runs of minutes are spread over the workers
this way.)"""

import pytest

from jaxrlhf.tracking.jsonl import read_metrics
from tests.helpers import VAL_KEY, run_train

TARGET = 0.95


@pytest.mark.slow
def test_partial_rollout_quickstart_learns(tmp_path):
  """configs/quickstart_partial.py (trainer.v1.trainer_mode=colocate_async: groups carried across steps, trained one
  step stale or more) learns as the default does: TARGET by step 75 here (0.965 at step 75, 2026-12-07). It stops
  once there."""
  run_train(
    "configs/quickstart_partial.py",
    f"--config.trainer.default_local_dir={tmp_path}",
    "--config.trainer.logger=('jsonl',)",
    "--config.trainer.log_val_generations=0",
    stop_when=lambda val: bool(val) and val[-1] >= TARGET,
  )
  records = read_metrics(tmp_path / "quickstart" / "recall_ppo_partial" / "metrics.jsonl")
  val = [r[VAL_KEY] for r in records if VAL_KEY in r]
  assert val[0] <= 0.2 and val[-1] >= TARGET, val
  train = [r for r in records if "training/global_step" in r]
  assert (
    max(r["rollout/staleness_max"] for r in train) >= 1 and min(r["rollout/carried_trajectories"] for r in train) > 0
  )
