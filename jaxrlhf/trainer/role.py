"""A trained role (the actor, the critic): everything static about it, built once per program.

`TrainedRole` holds the role's config section, its train-layout model, optimizer and lr schedule, whether
it trains LoRA adapters, whether its micro-batches are packed, and where its state lives (`RoleLayouts`).
Its state is one type, `trainer.state.RoleState` (params, opt_state, adapters; `trained` is what the
optimizer updates). Whatever differs between full fine-tuning and LoRA is answered here and in `RoleState`:
the step composes both roles the same way (docs/architecture.md "The trained roles").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import optax

from jaxrlhf.models.decoder import Decoder, init_adapters
from jaxrlhf.models.lora import critic_trained, split_value_head
from jaxrlhf.parallel.step_layouts import RoleLayouts
from jaxrlhf.trainer.state import RoleState

ROLE_PATHS = {"actor": "actor_rollout_ref.actor", "critic": "critic"}  # config paths of the trained sections


@dataclasses.dataclass(frozen=True, eq=False)
class TrainedRole:
  name: str  # "actor" or "critic"
  section: Any  # its config section (ROLE_PATHS)
  model: Decoder  # in the train layout (its activation layout and sequence-parallel split)
  tx: optax.GradientTransformation
  lr_schedule: Callable  # lr of the role's own update count (`state.make_lr_schedule`)
  packed: bool  # micro-batches packed (`PhasePlan.actor_packed` / `critic_packed`)
  sequence_parallel: int  # Ulysses size
  layouts: RoleLayouts

  @property
  def path(self) -> str:
    return ROLE_PATHS[self.name]

  @property
  def lora(self) -> bool:
    return bool(self.model.config.lora_rank)

  @property
  def _initialiser(self) -> Decoder:
    """The model without its activation layout: what builds (or describes) its weights."""
    return Decoder(self.model.config, head=self.model.head)

  def init(self, params, key) -> RoleState:
    """A fresh state from the role's whole `params` (a critic's with its value head): with LoRA fresh adapters
    (B = 0: the model starts as `params`) train, and a critic's value head with them. Traceable: the program's
    state init (`program.init_train_state`) gives both the abstract state and the real one from it."""
    adapters = None
    if self.lora:
      adapters = init_adapters(self._initialiser, jax.random.fold_in(key, 1))[0]
      if self.model.head == "value":
        adapters, params = critic_trained(adapters, params), split_value_head(params)[0]
    state = RoleState(params=params, opt_state=None, adapters=adapters)
    return state.replace(opt_state=self.tx.init(state.trained))

  def state_shardings(self) -> RoleState:
    """Where the role's state lives between phases (params and optimizer state in host memory when offloaded)."""
    return RoleState(
      params=self.layouts.stored_params,
      opt_state=self.layouts.stored_opt,
      adapters=self.layouts.adapters if self.lora else None,
    )
