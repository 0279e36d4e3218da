"""The multi-turn CPU quickstart, as a user runs it: `python train.py --config configs/quickstart_tools.py` teaches
a from-scratch policy to call the `lookup` tool and answer with what it returned (GRPO). Its validation reward
(`acc`) and its tool-call success rate both rise, and verl's multi-turn metrics are logged."""

import json
import os

import pytest

from tests.helpers import ROOT, run_train

ACC = "val-core/jaxrlhf/lookup/acc/mean@1"
# The run stops once its validation reaches TARGET (SIGTERM, exit 143): seed 1 at step 150 of 200 (0.90; 1.0 at 175).
TARGET = 0.8


@pytest.mark.slow
def test_the_tool_quickstart_learns_to_call_the_tool_and_use_its_answer(tmp_path):
  run_train(
    os.path.join(ROOT, "configs", "quickstart_tools.py"),
    f"--config.trainer.default_local_dir={tmp_path}",
    "--config.trainer.logger=('console','jsonl')",
    stop_when=lambda val: bool(val) and val[-1] >= TARGET,
    val_key=ACC,
  )
  with open(tmp_path / "quickstart" / "lookup_tools_grpo" / "metrics.jsonl") as f:
    records = [json.loads(line) for line in f]
  val = [r[ACC] for r in records if ACC in r]
  steps = [r for r in records if "tool_calls/success_rate" in r]
  assert val[0] == 0.0 and val[-1] >= TARGET, val
  assert steps[0]["tool_calls/success_rate"] < 0.3 and steps[-1]["tool_calls/success_rate"] >= 0.95
  for key in ("num_turns/mean", "num_turns/max", "tool_call_counts/mean", "tool_errors/mean", "timing_s/tool_calls"):
    assert key in steps[-1], key
  assert steps[-1]["num_turns/mean"] > 3.9  # call, tool reply, answer: verl counts 4 turns
  validations = [r for r in records if "val-aux/tool_calls/success_rate" in r]
  assert validations[-1]["val-aux/tool_calls/success_rate"] >= 0.95
