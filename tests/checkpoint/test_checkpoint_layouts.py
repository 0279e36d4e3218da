"""Checkpoints written before the trained roles had one state type (each role's params, optimizer state and
adapters at the top level of the state: `actor_params`, `actor_opt_state`, ...) restore into today's
`TrainState` (`actor: RoleState`, `critic: RoleState | None`), full or LoRA, and read as today's layout.
A tiny hand-made state saved exactly as that code saved it: no model is built or compiled."""

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from jaxrlhf.checkpoint import Checkpointer, read_checkpoint
from jaxrlhf.config import get_base_config
from jaxrlhf.trainer.state import RoleState, TrainState, make_optimizer

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@flax.struct.dataclass
class EarlierTrainState:
  """The train state as checkpoints before the role state type hold it (its fields, in its order)."""

  step: Any
  actor_params: Any
  actor_opt_state: Any
  actor_adapters: Any
  critic_params: Any
  critic_opt_state: Any
  critic_adapters: Any
  ref_params: Any
  reward_params: Any
  kl_coef: Any
  lr_scale: Any


def _arrays(seed: int, *shape):
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


def _adam_state(seed: int, *shape):
  """An optimizer state as the trainer's (`state.make_optimizer`): a tuple of named tuples, moments set."""
  state = make_optimizer(get_base_config().critic.optim, 1.0).init({"w": jnp.zeros(shape)})
  return jax.tree.map(lambda x: x + _arrays(seed, *x.shape) if x.ndim else x + seed, state)


def _save_earlier(path, *, actor_lora: bool, critic: bool, critic_lora: bool = False) -> EarlierTrainState:
  """Saves step 4 as the earlier code did: frozen params (a LoRA role's, the reference) saved as None."""
  actor_adapters = {"a": _arrays(2, 3, 1)} if actor_lora else None
  critic_adapters = {"lora": {"a": _arrays(5, 3, 1)}, "head": {"score": _arrays(6, 3, 1)}} if critic_lora else None
  state = EarlierTrainState(
    step=jnp.int32(4),
    actor_params=None if actor_lora else {"w": _arrays(1, 3, 4)},
    actor_opt_state=_adam_state(3, 3, 1 if actor_lora else 4),
    actor_adapters=actor_adapters,
    critic_params={"w": _arrays(4, 3, 2)} if critic and not critic_lora else None,
    critic_opt_state=_adam_state(7, 3, 2) if critic else None,
    critic_adapters=critic_adapters,
    ref_params=None,
    reward_params=None,
    kl_coef=jnp.float32(0.25),
    lr_scale=jnp.float32(0.5),
  )
  checkpointer = Checkpointer(str(path))
  config = get_base_config().to_json()
  checkpointer._manager.save(  # what `Checkpointer.save` wrote then
    4,
    args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave({"step": 4, "config": config})),
  )
  checkpointer.close()
  return state


def _target(saved: EarlierTrainState, *, base=None, backbone=None) -> TrainState:
  """Today's state of the same run (zeros); `base`/`backbone`: a LoRA role's frozen params, rebuilt."""
  zeros = lambda tree: jax.tree.map(jnp.zeros_like, tree)
  critic = None
  if saved.critic_opt_state is not None:
    critic = RoleState(
      params=backbone if saved.critic_adapters is not None else zeros(saved.critic_params),
      opt_state=zeros(saved.critic_opt_state),
      adapters=zeros(saved.critic_adapters),
    )
  return TrainState(
    step=jnp.int32(0),
    actor=RoleState(
      params=base if saved.actor_adapters is not None else zeros(saved.actor_params),
      opt_state=zeros(saved.actor_opt_state),
      adapters=zeros(saved.actor_adapters),
    ),
    critic=critic,
    ref_params=None,
    reward_params=None,
    kl_coef=jnp.float32(0),
    lr_scale=jnp.float32(1),
  )


def _equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  jax.tree.map(np.testing.assert_array_equal, a, b)


def test_a_full_fine_tuning_checkpoint_with_a_critic_restores_into_role_states(tmp_path):
  saved = _save_earlier(tmp_path, actor_lora=False, critic=True)
  restored, meta = Checkpointer(str(tmp_path)).restore(4, _target(saved))
  assert meta["step"] == 4 and int(restored.step) == 4 and float(restored.kl_coef) == 0.25
  _equal(restored.actor, RoleState(params=saved.actor_params, opt_state=saved.actor_opt_state))
  _equal(restored.critic, RoleState(params=saved.critic_params, opt_state=saved.critic_opt_state))
  state, _, _ = read_checkpoint(str(tmp_path / "global_step_4"))
  assert set(state["actor"]) >= {"params", "opt_state"} and "actor_params" not in state
  np.testing.assert_array_equal(state["critic"]["params"]["w"], saved.critic_params["w"])


def test_lora_checkpoints_restore_their_adapters_and_keep_the_rebuilt_frozen_params(tmp_path):
  saved = _save_earlier(tmp_path, actor_lora=True, critic=True, critic_lora=True)
  base, backbone = {"w": _arrays(8, 3, 4)}, {"w": _arrays(9, 3, 2)}
  restored, _ = Checkpointer(str(tmp_path)).restore(4, _target(saved, base=base, backbone=backbone))
  _equal(restored.actor, RoleState(params=base, opt_state=saved.actor_opt_state, adapters=saved.actor_adapters))
  _equal(restored.critic, RoleState(params=backbone, opt_state=saved.critic_opt_state, adapters=saved.critic_adapters))
  state, _, _ = read_checkpoint(str(tmp_path / "global_step_4"))
  assert not state["actor"]["params"] and state["actor"]["adapters"]


def test_a_run_without_a_critic_restores_with_none(tmp_path):
  saved = _save_earlier(tmp_path, actor_lora=False, critic=False)
  restored, _ = Checkpointer(str(tmp_path)).restore(4, _target(saved))
  assert restored.critic is None
  _equal(restored.actor.params, saved.actor_params)
  assert read_checkpoint(str(tmp_path / "global_step_4"))[0]["critic"] is None
