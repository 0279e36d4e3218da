"""`PhasePlan.from_config` as a table: config keys -> which phases run (no compile)."""

import types

import pytest

from jaxrlhf.config import get_base_config, resolve_config
from jaxrlhf.trainer.phase_plan import PhasePlan

NO_LORA = types.SimpleNamespace(lora_rank=0)
LORA = types.SimpleNamespace(lora_rank=8)
GRPO = {"algorithm.adv_estimator": "grpo"}
ONE_MINI_BATCH = {"actor_rollout_ref.actor.ppo_mini_batch_size": 1024}


def plan(overrides, actor=NO_LORA, critic=NO_LORA) -> PhasePlan:
  config = get_base_config()
  for key, value in overrides.items():
    node = config
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return PhasePlan.from_config(resolve_config(config), actor, critic)


# (overrides, LoRA actor, the fields expected; others unchecked)
TABLE = [
  (
    {},
    False,
    dict(
      use_critic=True,
      use_reference=False,
      ref_phase=False,
      stores_reference=False,
      old_forward=True,
      bypass=False,
      on_policy=False,
      old_in_update=False,
      actor_warmup_steps=0,
    ),
  ),
  (GRPO, False, dict(use_critic=False, use_reference=False, old_forward=True)),
  ({**GRPO, **ONE_MINI_BATCH}, False, dict(on_policy=True, old_in_update=True)),
  (
    {**GRPO, **ONE_MINI_BATCH, "actor_rollout_ref.actor.ppo_epochs": 2},
    False,
    dict(on_policy=False, old_in_update=True),
  ),
  (
    {**GRPO, **ONE_MINI_BATCH, "actor_rollout_ref.model.use_remove_padding": True},
    False,
    dict(actor_packed=True, critic_packed=True, old_in_update=False),
  ),
  (
    {**GRPO, "actor_rollout_ref.actor.use_kl_loss": True},
    False,
    dict(use_reference=True, stores_reference=True, ref_phase=True, full_kl_loss=False),
  ),
  (
    {**GRPO, "actor_rollout_ref.actor.use_kl_loss": True},
    True,
    dict(use_reference=True, stores_reference=False, ref_phase=True, actor_lora=True),
  ),
  (
    {**GRPO, "actor_rollout_ref.actor.use_kl_loss": True, "actor_rollout_ref.actor.kl_loss_type": "full"},
    False,
    dict(full_kl_loss=True, full_kl_in_reward=False, ref_phase=True),
  ),
  (
    {"algorithm.use_kl_in_reward": True, "algorithm.kl_penalty": "full"},
    False,
    dict(use_reference=True, full_kl_in_reward=True, ref_phase=False, old_forward=True),
  ),
  ({**GRPO, **ONE_MINI_BATCH, "algorithm.use_kl_in_reward": True}, False, dict(ref_phase=True, old_in_update=False)),
  (
    {**GRPO, "algorithm.rollout_correction.bypass_mode": True},
    False,
    dict(bypass=True, old_forward=False, on_policy=False, decoupled_correction=False),
  ),
  (
    {**GRPO, "algorithm.rollout_correction.rollout_is": "token"},
    False,
    dict(bypass=False, decoupled_correction=True, old_forward=True),
  ),
  (
    {"algorithm.adv_estimator": "optimal_token_baseline", "algorithm.rollout_correction.bypass_mode": True},
    False,
    dict(sum_pi_squared=True, old_forward=True),
  ),
  ({"trainer.critic_warmup": 3}, False, dict(actor_warmup_steps=2)),
  ({"trainer.critic_warmup": 1}, False, dict(actor_warmup_steps=0)),
  ({**GRPO, "trainer.critic_warmup": 3}, False, dict(actor_warmup_steps=0)),  # no critic to warm up
]


@pytest.mark.parametrize("overrides, actor_lora, expected", TABLE)
def test_plan_from_config(overrides, actor_lora, expected):
  got = plan(overrides, actor=LORA if actor_lora else NO_LORA)
  assert {name: getattr(got, name) for name in expected} == expected


def test_the_actor_updates_from_verl_step_critic_warmup():
  """verl counts steps from 1 and updates the actor once critic_warmup <= step: 0-based step 2 for warm-up 3.
  The host's metrics (actor losses dropped, `perf/mfu/actor`) and the compiled update read this one rule."""
  warm = plan({"trainer.critic_warmup": 3})
  assert [warm.actor_updates_at(step) for step in range(4)] == [False, False, True, True]
  assert all(plan({}).actor_updates_at(step) for step in range(3))
