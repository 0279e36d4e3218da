"""The README's main job, run the way a user runs it: `python train.py --config configs/quickstart.py`.

The full quickstart must learn on any CPU, not only on the one it was tuned on (issue 36: with the earlier
settings one AVX2 machine stopped at 0.711). Floating-point differences between CPUs move the trajectory as a
different seed does; benchmarks/quickstart_robustness.py sweeps seeds and XLA numerics, and here two runs stand
for two CPUs: the default one, and seed 3, which stopped at 0.789 with the earlier settings. Both must reach TARGET.
"""

import json
import os
import re

import pytest

from jaxrlhf.config import load_config_file
from tests.helpers import VAL_KEY, run_train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = 0.95
FULL_RUNS = {"default": (), "seed3": ("--config.trainer.seed=3", "--config.data.seed=3")}


def _run_quickstart(tmp_path, *flags, config="quickstart.py", stop_when=None):
  return run_train(f"configs/{config}", f"--config.trainer.default_local_dir={tmp_path}", *flags, stop_when=stop_when)


def _records(run_dir):
  with open(run_dir / "metrics.jsonl") as f:
    return [json.loads(line) for line in f]


@pytest.mark.slow
@pytest.mark.parametrize("name", FULL_RUNS)
def test_full_quickstart_reaches_target_on_two_cpus(name, tmp_path):
  """The default run goes to its end (the user's run: every step is checked, and the files it names); the other
  stops once its validation reward reaches TARGET (step 75 of 150 in benchmarks/README.md "Quickstart robustness").
  (A run whose trainer.logger has no 'jsonl' writes no metrics.jsonl and its last line says so: the verl script
  in tests/cli/test_verl_compat.py, trainer.logger='["console"]'.)"""
  stop_when = None if name == "default" else (lambda val: bool(val) and val[-1] >= TARGET)
  result = _run_quickstart(tmp_path, *FULL_RUNS[name], stop_when=stop_when)
  run_dir = tmp_path / "quickstart" / "recall_ppo"
  records = _records(run_dir)
  val = [r[VAL_KEY] for r in records if VAL_KEY in r]
  assert val[0] <= 0.2 and val[-1] >= TARGET, (name, val)
  if name != "default":
    return
  # The default run is also the user's: every step's metrics, the plot and the console.
  config = load_config_file(os.path.join(ROOT, "configs", "quickstart.py")).trainer
  steps = config.total_training_steps
  train = [r for r in records if "training/global_step" in r]
  assert [r["step"] for r in train] == list(range(1, steps + 1))
  for record in train:
    for key in ("critic/score/mean", "actor/kl_loss", "actor/pg_loss", "critic/vf_loss", "perf/throughput"):
      assert key in record and record[key] == record[key] and abs(record[key]) < 1e6, (key, record.get(key))
  assert (run_dir / "metrics.png").stat().st_size > 10_000
  assert f"step {steps}/{steps}" in result.stdout and "reward" in result.stdout  # a concise console line per step
  last_line = result.stdout.strip().splitlines()[-1]
  assert last_line.startswith(f"done: {steps + 1} records in {run_dir}/metrics.jsonl"), last_line
  # The last line gives the validation reward before and after.
  before, after = map(float, re.search(re.escape(VAL_KEY) + r": ([0-9.]+) -> ([0-9.]+)", last_line).groups())
  assert before == pytest.approx(val[0], abs=1e-3) and after == pytest.approx(val[-1], abs=1e-3), last_line
  # The validation samples: the first log_val_generations of each validation.
  with open(run_dir / "val_generations.jsonl") as f:
    samples = [json.loads(line) for line in f]
  validated = range(0, steps + 1, config.test_freq)
  assert [s["step"] for s in samples] == [step for step in validated for _ in range(config.log_val_generations)]
  assert samples[0]["prompt"].startswith("<|user|>") and set(samples[0]) >= {"response", "ground_truth", "score"}
