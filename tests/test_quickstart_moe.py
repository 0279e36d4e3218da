"""The mixture-of-experts quickstart, as a user runs it: `python train.py --config configs/quickstart_moe.py`. (A file
of its own: `make test` gives each file to one worker, and the learning runs of minutes are spread over the workers
this way.)"""

import pytest

from jaxrlhf.tracking.jsonl import read_metrics
from tests.helpers import VAL_KEY, run_train


@pytest.mark.slow
def test_full_moe_quickstart_learns_with_balanced_experts(tmp_path):
  """configs/quickstart_moe.py: the tiny Qwen3-MoE model (8 experts, 2 per token) learns the task (greedy validation
  >= 0.95, issue 47's bar; the run stops once it gets there) with its experts kept in use by the load-balancing loss
  (2.0 = top-k when routing is uniform; the busiest expert under twice the mean load)."""
  learned = lambda val: bool(val) and val[-1] >= 0.95
  run_train(
    "configs/quickstart_moe.py",
    f"--config.trainer.default_local_dir={tmp_path}",
    "--config.trainer.logger=('jsonl',)",
    stop_when=learned,
  )
  records = read_metrics(tmp_path / "quickstart" / "recall_ppo_moe" / "metrics.jsonl")
  val = [r[VAL_KEY] for r in records if VAL_KEY in r]
  assert val[0] <= 0.2 and val[-1] >= 0.95, val
  last = [r for r in records if "actor/moe_aux_loss" in r][-1]
  assert 2.0 <= last["actor/moe_aux_loss"] < 2.5 and last["actor/moe_expert_load_max"] < 2.0, last
