"""The LoRA quickstart, as a user runs it: `python train.py --config configs/quickstart_lora.py`. (A file of its own,
not tests/test_quickstart.py's: `make test` gives each file to one worker, and the learning runs of minutes are
spread over the workers this way.)"""

import pytest

from jaxrlhf.tracking.jsonl import read_metrics
from tests.helpers import VAL_KEY, run_train


@pytest.mark.slow
def test_full_lora_quickstart_learns(tmp_path):
  """docs/lora.md's claim: adapters on the layers and the LM head of a frozen random base learn the task
  (0.07 -> 0.81 with the default seed, 300 steps; the run stops once it has gained 0.5)."""
  learned = lambda val: len(val) > 1 and val[-1] >= val[0] + 0.5
  run_train(
    "configs/quickstart_lora.py",
    f"--config.trainer.default_local_dir={tmp_path}",
    "--config.trainer.logger=('jsonl',)",
    stop_when=learned,
  )
  records = read_metrics(tmp_path / "quickstart" / "recall_ppo_lora" / "metrics.jsonl")
  val = [r[VAL_KEY] for r in records if VAL_KEY in r]
  assert val[0] <= 0.2 and val[-1] >= val[0] + 0.5, val
