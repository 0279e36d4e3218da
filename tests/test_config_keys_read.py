"""Honest config (verl parity): every leaf of the config tree is read by the code or refused.

Two short runs (`Trainer.fit`, validation, checkpoints; one with most switches on, one DAPO run with
dynamic sampling in bypass mode, resumed from a path) record every key the code reads from the resolved
config. A key neither run reads must be in `jaxrlhf.config.NOT_IMPLEMENTED` (refused unless default) or
in `READ_ELSEWHERE` below, which names the module that reads it in a mode these runs do not cover; the
test checks that module reads it.
"""

import os
import re

import jax
import pytest
from ml_collections import config_dict

from jaxrlhf.config import NOT_IMPLEMENTED
from jaxrlhf.trainer import Trainer
from tests.helpers import small_config

ROOT = os.path.join(os.path.dirname(__file__), "..")

# key -> (module that reads it, the mode it is read in)
READ_ELSEWHERE = {
  "reward_model.model.path": ("jaxrlhf/trainer/program.py", "a reward model (reward_model.enable)"),
  "reward_model.combine_with_rule": ("jaxrlhf/trainer/reward.py", "a reward model"),
  "reward_model.generative": ("jaxrlhf/trainer/reward.py", "a reward model"),
  # A generative reward model's (tests/trainer/test_judge.py runs one).
  "reward_model.judge": ("jaxrlhf/trainer/judge.py", "a judge (reward_model.generative)"),
  "reward_model.rollout": ("jaxrlhf/trainer/judge.py", "a judge (reward_model.generative)"),
  "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": ("jaxrlhf/trainer/update_loop.py", "use_dynamic_bsz"),
  "trainer.resume_from_path": ("jaxrlhf/trainer/trainer.py", "resume_mode=resume_path"),
  "trainer.total_epochs": ("jaxrlhf/trainer/trainer.py", "total_training_steps=None"),
  "trainer.guard.lr_backoff": ("jaxrlhf/trainer/trainer.py", "a guard rolls back"),
  "trainer.guard.max_rollbacks": ("jaxrlhf/trainer/guards.py", "a guard rolls back"),
  "trainer.guard.reward_drop": ("jaxrlhf/trainer/guards.py", "a reward window's worth of steps"),
  "actor_rollout_ref.rollout.multi_turn": ("jaxrlhf/trainer/multi_turn.py", "multi-turn rollouts (its enable)"),
  "distillation.teacher_model.model_path": ("jaxrlhf/trainer/program.py", "distillation.enabled"),
  # A section read whole: every key under it.
  "distillation.distillation_loss": ("jaxrlhf/trainer/distillation.py", "distillation.enabled (Distillation)"),
  "critic.model.override_config": ("jaxrlhf/models/hf_io.py", "a critic checkpoint of its own (critic.model.path)"),
}


def _explained(key):
  return key in NOT_IMPLEMENTED or any(key == k or key.startswith(k + ".") for k in READ_ELSEWHERE)


RUNS = {
  "most switches": {
    "algorithm.use_kl_in_reward": True,
    "algorithm.kl_penalty": "low_var_kl",
    "algorithm.kl_ctrl.type": "adaptive",
    "actor_rollout_ref.model.enable_gradient_checkpointing": True,
    "critic.model.enable_gradient_checkpointing": True,
    "reward_model.overlong_buffer.enable": True,
    "reward_model.overlong_buffer.len": 2,
    "trainer.guard.enable": True,
    "trainer.save_freq": 1,
    "trainer.test_freq": 1,
    "trainer.save_hf": True,
    "trainer.total_training_steps": 1,
    "algorithm.rollout_correction.rollout_is": "token",
    "algorithm.rollout_correction.rollout_rs": "token_k1",
    "algorithm.rollout_correction.rollout_rs_threshold": "0.5_2.0",
    "algorithm.rollout_correction.rollout_is_batch_normalize": True,
  },
  "dapo bypass": {
    "algorithm.adv_estimator": "grpo",
    "algorithm.filter_groups.enable": True,
    "algorithm.filter_groups.max_num_gen_batches": 3,
    "algorithm.rollout_correction.bypass_mode": True,
    "algorithm.rollout_correction.loss_type": "reinforce",
    "trainer.total_training_steps": 1,
    "actor_rollout_ref.rollout.temperature": 3.0,
  },
}


def _record_reads(monkeypatch):
  """(reads, unpatched __getitem__): every (id(node), key) read by attribute or subscript, except while
  the whole tree is serialised (a checkpoint's or a logger's copy of the config reads nothing).

  A read node is kept alive to the end of the test: once freed, its id may be reused by a node of a later
  config, which would then count as read (it did: `reward_model.model.path` took the id of a run's freed
  `model` node, whose `path` had been read)."""
  reads, serialising, alive = set(), [], {}
  getitem, getattr_, to_dict = (
    config_dict.ConfigDict.__getitem__,
    config_dict.ConfigDict.__getattr__,
    config_dict.ConfigDict.to_dict,
  )
  is_root = lambda node: "actor_rollout_ref" in node._fields and "trainer" in node._fields

  def recording_getitem(self, key):
    if not serialising:
      reads.add((id(self), key))
      alive[id(self)] = self
    return getitem(self, key)

  def recording_getattr(self, key):
    if not key.startswith("_") and not serialising:
      reads.add((id(self), key))
      alive[id(self)] = self
    return getattr_(self, key)

  def whole_tree_to_dict(self, *args, **kwargs):
    root = is_root(self)
    serialising.extend([root] if root else [])
    try:
      return to_dict(self, *args, **kwargs)
    finally:
      if root:
        serialising.pop()

  monkeypatch.setattr(config_dict.ConfigDict, "__getitem__", recording_getitem)
  monkeypatch.setattr(config_dict.ConfigDict, "__getattr__", recording_getattr)
  monkeypatch.setattr(config_dict.ConfigDict, "to_dict", whole_tree_to_dict)
  return reads, getitem


def _leaves(node, getitem, prefix=""):
  for key in node.keys():
    value = getitem(node, key)
    if isinstance(value, config_dict.ConfigDict) and len(value.keys()):
      yield from _leaves(value, getitem, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}", (id(node), key)


@pytest.mark.slow
def test_every_config_key_is_read_or_refused(tmp_path, monkeypatch):
  reward_file = tmp_path / "reward.py"
  reward_file.write_text(
    "def my_score(data_source, solution_str, ground_truth, extra_info=None):\n"
    "    return float(len(solution_str) % 2)  # varies within a group: dynamic sampling keeps it\n"
  )
  reads, getitem = _record_reads(monkeypatch)
  unread = None
  for name, overrides in RUNS.items():
    overrides = {
      **overrides,
      "custom_reward_function.path": str(reward_file),
      "custom_reward_function.name": "my_score",
    }
    trainer = Trainer(
      small_config(tmp_path / name.replace(" ", "_"), **{"mesh.fsdp": 1, **overrides}), devices=jax.devices()[:1]
    )
    trainer.fit()
    run_unread = {path for path, read in _leaves(trainer.config, getitem) if read not in reads}
    unread = run_unread if unread is None else unread & run_unread
  unexplained = sorted(key for key in unread if not _explained(key))
  assert not unexplained, f"config keys nothing reads (read them, or refuse them in NOT_IMPLEMENTED): {unexplained}"
  for key, (module, mode) in READ_ELSEWHERE.items():
    source = open(os.path.join(ROOT, module)).read()
    assert re.search(rf"\.{key.split('.')[-1]}\b", source), f"{module} does not read {key} ({mode})"
  # Nothing stale: a key listed here that a run does read belongs in neither table.
  stale = [k for k in READ_ELSEWHERE if not any(key == k or key.startswith(k + ".") for key in unread)]
  assert not stale, stale
