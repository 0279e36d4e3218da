"""The step's modes (`trainer/step_modes.py`): the one place the fused/phased choice is made, and a critic warm-up
step's metrics (the actor's update metrics dropped on the host, their names from the phases' abstract outputs)."""

import jax

from jaxrlhf.trainer import Trainer
from jaxrlhf.trainer.step_modes import DynamicSampling, FusedStep, GenerateThenTrain, MultiTurn, SingleTurn, step_mode
from tests.helpers import small_config


def test_only_a_single_turn_step_with_fuse_step_is_one_program():
  single, multi = SingleTurn(phased=None), MultiTurn(phased=None, loop=None, place=None)
  rounds = DynamicSampling(single, config=None, pad_token_id=0, put=None, place=None)
  assert isinstance(step_mode(True, single, None, "jitted"), FusedStep)
  for fuse_step, generation in [(False, single), (True, multi), (False, multi), (True, rounds), (False, rounds)]:
    step = step_mode(fuse_step, generation, None, "jitted")
    assert isinstance(step, GenerateThenTrain) and step.fuse_training == fuse_step and step.generation is generation


def test_a_critic_warm_up_step_logs_no_actor_update_metrics(tmp_path):
  """verl updates the actor once critic_warmup <= step (from 1): with warm-up 2 step 0 only trains the critic."""
  trainer = Trainer(small_config(tmp_path, **{"trainer.critic_warmup": 2}), devices=jax.devices()[:1])
  assert isinstance(trainer.step_mode, FusedStep)
  warm, updated = trainer.train_step(0), trainer.train_step(1)
  actor_update = {key for key in updated if key.startswith("actor/")} - set(warm)
  assert {"actor/pg_loss", "actor/grad_norm", "actor/lr"} <= actor_update
  assert "actor/entropy" in warm and "critic/vf_loss" in warm  # the old log-prob phase and the critic ran
