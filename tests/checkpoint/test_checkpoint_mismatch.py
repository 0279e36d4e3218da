"""A checkpoint that does not fit the run's state names the settings that decide the state (models, LoRA, critic)
and differ from the config it was saved with, and is not called damaged (docs/guarantees.md); an accepted resume
names the hyper-parameters it changed. A tiny hand-made state: no model is built or compiled."""

import json

import jax.numpy as jnp
import pytest

from jaxrlhf.checkpoint import Checkpointer, CheckpointError, config_differences, resume_changes
from jaxrlhf.config import get_base_config
from jaxrlhf.trainer.state import RoleState, TrainState

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _state(width: int, adapters: bool = False) -> TrainState:
  weights = {"w": jnp.ones((2, width))}
  return TrainState(
    step=jnp.int32(3),
    actor=RoleState(params=weights, opt_state={"mu": weights}, adapters={"a": jnp.ones((2, 1))} if adapters else None),
    critic=None,
    ref_params=None,
    reward_params=None,
    kl_coef=jnp.float32(0.1),
    lr_scale=jnp.float32(1.0),
  )


def _config(**changes):
  config = get_base_config()
  config.actor_rollout_ref.model.override_config.hidden_size = 64
  for key, value in changes.items():
    node = config
    *parents, leaf = key.split(".")
    for parent in parents:
      node = node[parent]
    node[leaf] = value
  return config


@pytest.fixture
def saved(tmp_path):
  checkpointer = Checkpointer(str(tmp_path))
  checkpointer.save(3, _state(4), {"step": 3, "config": _config().to_json()})
  checkpointer.close()
  return Checkpointer(str(tmp_path))


def test_a_state_that_does_not_fit_lists_the_state_settings_that_differ(saved, tmp_path):
  changed = _config(
    **{
      "actor_rollout_ref.model.override_config.hidden_size": 32,
      "actor_rollout_ref.actor.optim.weight_decay": 0.1,
      "trainer.resume_mode": "auto",
    }
  )
  for target in (_state(3), _state(4, adapters=True)):  # another shape; another tree (LoRA switched on)
    with pytest.raises(CheckpointError) as error:
      saved.restore(3, target, config=changed)
    assert str(error.value) == (  # weight_decay differs too, but does not decide what the state holds
      f"checkpoint {tmp_path}/global_step_3 does not fit this run's state: 1 setting(s) differ from the "
      "checkpoint's: actor_rollout_ref.model.override_config.hidden_size: 64 in the checkpoint, 32 now"
    )
    assert "damaged" not in str(error.value) and "new trainer.experiment_name" in error.value.hint
  with pytest.raises(
    CheckpointError,
    match=r"2 array\(s\) differ: actor/opt_state/mu/w \(2, 4\) saved, \(2, 3\) now; "
    r"actor/params/w \(2, 4\) saved, \(2, 3\) now$",
  ):
    saved.restore(3, _state(3))  # no config to compare: the arrays say it
  restored, meta = saved.restore(3, _state(4), config=changed)  # what fits restores, whatever the settings
  assert int(restored.step) == 3 and meta["step"] == 3
  saved.close()


def test_config_differences_name_added_and_removed_keys():
  saved = json.loads(_config().to_json())
  current = json.loads(_config(**{"data.max_prompt_length": 1024}).to_json())
  del current["data"]["seed"]
  assert config_differences(saved, current) == [
    "data.max_prompt_length: 512 in the checkpoint, 1024 now",
    "data.seed: 1 in the checkpoint, absent now",
  ]


def test_resume_changes_list_hyper_parameters_not_run_keeping():
  saved = json.loads(_config().to_json())
  changes = {
    "actor_rollout_ref.actor.optim.lr": 3e-4,
    "data.train_batch_size": 16,
    "trainer.total_training_steps": 40,
    "trainer.default_local_dir": "elsewhere",
    "trainer.logger": ("console",),
    "trainer.resume_mode": "auto",
  }
  current = json.loads(_config(**changes).to_json())
  assert resume_changes(saved, current) == [
    "actor_rollout_ref.actor.optim.lr 1e-06 -> 0.0003",
    "data.train_batch_size 1024 -> 16",
    "trainer.total_training_steps None -> 40",
  ]
  assert config_differences(saved, current, state_only=True) == []
