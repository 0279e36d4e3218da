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

from jaxrlhf.models.decoder import Decoder, abstract_adapters, abstract_params, init_adapters
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

  def _shapes(self) -> tuple[Any, Any]:
    """(params, adapters) as abstract shapes: the critic's adapters with its value head, the backbone without."""
    params = abstract_params(self._initialiser)[0]
    adapters = abstract_adapters(self._initialiser)[0]
    if adapters is not None and self.model.head == "value":
      return split_value_head(params)[0], critic_trained(adapters, params)
    return params, adapters

  def abstract_state(self) -> RoleState:
    """The role's state as abstract arrays in the shardings it lives in between phases (no allocation)."""
    params, adapters = self._shapes()
    abstract = lambda shapes, shardings: jax.tree.map(
      lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), shapes, shardings
    )
    trained = params if adapters is None else adapters
    return RoleState(
      params=abstract(params, self.layouts.stored_params),
      opt_state=abstract(jax.eval_shape(self.tx.init, trained), self.layouts.stored_opt),
      adapters=None if adapters is None else abstract(adapters, self.layouts.adapters),
    )

  def init_state(self, params, key) -> RoleState:
    """A fresh state from the role's whole `params` (in device memory, the train layout): with LoRA fresh
    adapters (B = 0: the model starts as `params`) train, and a critic's value head with them."""
    adapters = None
    if self.lora:
      lora_shardings = self.layouts.adapters["lora"] if self.model.head == "value" else self.layouts.adapters
      adapters = jax.jit(lambda key: init_adapters(self._initialiser, key)[0], out_shardings=lora_shardings)(
        jax.random.fold_in(key, 1)
      )
      if self.model.head == "value":
        adapters, params = critic_trained(adapters, params), split_value_head(params)[0]
    state = RoleState(params=params, opt_state=None, adapters=adapters)
    opt_state = jax.jit(self.tx.init, out_shardings=self.layouts.stored_opt)(state.trained)
    return state.replace(params=jax.device_put(params, self.layouts.stored_params), opt_state=opt_state)
