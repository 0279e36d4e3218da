"""trainer.v1.trainer_mode=colocate_async (partial rollouts carried across steps, `rollout/partial.py`) in the
trainer: the pool is part of the train state, so a run stopped after a checkpoint and resumed equals the run that
never stopped; the step logs staleness, carried trajectories and slot utilisation; what it cannot carry is refused."""

import os
import shutil

import jax
import numpy as np
import pytest

from jaxrlhf.config import ConfigError, resolve_config
from jaxrlhf.trainer.trainer import Trainer
from tests.helpers import TIMING_DEPENDENT, small_config

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PARTIAL = {
  "trainer.v1.trainer_mode": "colocate_async",
  "actor_rollout_ref.rollout.max_num_seqs": 4,
  "data.max_response_length": 5,
  "trainer.total_training_steps": 4,
  "trainer.save_freq": 2,
  "trainer.val_before_train": False,
  "trainer.test_freq": -1,
  "trainer.resume_mode": "auto",
  "trainer.plot": False,
}


def _untimed(history):
  return [{k: v for k, v in record.items() if not k.startswith(TIMING_DEPENDENT)} for record in history]


def test_resumed_run_equals_the_run_that_never_stopped(tmp_path):
  config = small_config(tmp_path, **PARTIAL)
  whole = Trainer(config, devices=jax.devices()[:1])
  history = _untimed(whole.fit())
  run_dir = whole.run_dir
  assert [r["step"] for r in history] == [1, 2, 3, 4]
  # Rows were carried from one step into the next, and trained one step stale.
  assert all(r["rollout/carried_trajectories"] > 0 for r in history)
  assert max(r["rollout/staleness_max"] for r in history) >= 1
  assert all(0 < r["rollout/slot_utilization"] <= 1 for r in history)
  # Stopped after the save at step 2: its last checkpoint gone, the run resumes there, pool and all.
  shutil.rmtree(os.path.join(run_dir, "global_step_4"))
  resumed = Trainer(config, devices=jax.devices()[:1])
  again = _untimed(resumed.fit())
  assert [r["step"] for r in again] == [3, 4]
  for got, want in zip(again, history[2:]):
    assert got.keys() == want.keys()
    for key in want:
      np.testing.assert_array_equal(got[key], want[key], err_msg=key)


@pytest.mark.parametrize(
  "overrides, key",
  [
    ({"trainer.v1.trainer_mode": "separate_async"}, "trainer.v1.trainer_mode"),
    ({"trainer.v1.trainer_mode": "colocate_async"}, "actor_rollout_ref.rollout.max_num_seqs"),
    (
      {
        "trainer.v1.trainer_mode": "colocate_async",
        "actor_rollout_ref.rollout.max_num_seqs": 4,
        "trainer.fuse_step": 0,
      },
      "trainer.fuse_step",
    ),
    ({"trainer.v1.sampler.max_off_policy_strategy": "keep"}, "trainer.v1.sampler.max_off_policy_strategy"),
  ],
)
def test_what_cannot_be_carried_is_refused_by_key(tmp_path, overrides, key):
  if overrides.get("trainer.fuse_step") == 0:
    overrides = dict(overrides, **{"trainer.fuse_step": False})
  with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
    resolve_config(small_config(tmp_path, **overrides))
