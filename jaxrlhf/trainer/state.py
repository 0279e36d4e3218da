"""The train state (a pytree) and the optimizer: AdamW with clipping, lr by trainer step.

The learning rate follows verl: one scheduler step per trainer step (not per mini-batch), linear
warm-up from 0, then constant or cosine down to `min_lr_ratio * lr`. AdamW is written as
`clip_by_global_norm -> scale_by_adam -> add_decayed_weights` and the step applies `-lr * update`,
so the schedule is a pure function of the step carried in the state.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from jaxrlhf.models.lora import merged_params


@flax.struct.dataclass
class RoleState:
  """A trained role's state (the actor's or the critic's): its weights, what trains and its optimizer.

  Without LoRA the params train. With LoRA (`lora_rank > 0`) `params` are frozen and `adapters` train:
  the actor's base (also the reference policy: adapters off) and its adapters (fp32); the critic's
  backbone (no value head) and {"lora": adapters (fp32), "head": {"score": the value head}}
  (`models.lora.critic_trained`). `opt_state` tracks `trained`.
  """

  params: Any
  opt_state: Any
  adapters: Any = None  # None without LoRA

  @property
  def lora(self) -> bool:
    return self.adapters is not None

  @property
  def trained(self):
    """What the optimizer updates: the params, or with LoRA the adapters."""
    return self.adapters if self.lora else self.params

  @property
  def weights(self) -> RoleState:
    """The role's weights alone (no optimizer state): what a forward phase reads."""
    return self.replace(opt_state=None)

  @property
  def frozen(self) -> RoleState:
    """The weights around what trains, which a loss puts back (`frozen.with_trained(trained, None)`): without
    LoRA nothing, with LoRA the frozen params (and the adapters, small, which the loss replaces)."""
    return self.replace(opt_state=None) if self.lora else RoleState(params=None, opt_state=None)

  def reference(self, ref_params):
    """The reference policy's params, this being the actor's state: with LoRA its frozen base (run without the
    adapters), else `ref_params`, the reference's own copy."""
    return self.params if self.lora else ref_params

  def with_trained(self, trained, opt_state) -> RoleState:
    """This state after an update of `trained` (`self.trained`'s new value) and the optimizer."""
    return self.replace(opt_state=opt_state, **{"adapters" if self.lora else "params": trained})

  def saved(self) -> RoleState:
    """What a checkpoint holds: frozen params are rebuilt from their source, not saved."""
    return self.replace(params=None) if self.lora else self

  @classmethod
  def from_saved(cls, saved: dict) -> RoleState:
    """A `saved()` state in the tree `checkpoint.read_checkpoint` gives ({"params", "opt_state", "adapters"})."""
    return cls(params=saved.get("params"), opt_state=saved.get("opt_state"), adapters=saved.get("adapters") or None)

  @property
  def rebuilds_frozen(self) -> bool:
    """Whether a reader of its checkpoint rebuilds frozen params from the model's source (`with_frozen`): with
    LoRA, whose base is not saved."""
    return self.lora

  def with_frozen(self, frozen_params: Callable[[], Any]) -> RoleState:
    """A restored `saved()` state made whole: with LoRA its frozen params are `frozen_params()` (the run's own,
    rebuilt from their source), which is called only then."""
    return self.replace(params=frozen_params()) if self.lora else self

  def merged(self, lora_alpha: float, head: str = "lm"):
    """The role's whole weights as one params tree, what export writes and `jaxrlhf.generate` runs: with LoRA the
    adapters merged into the frozen params (a critic's, `head="value"`, with its trained value head)."""
    return merged_params(self.params, self.adapters, lora_alpha, head)


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # trainer steps done (int32)
  actor: RoleState
  critic: RoleState | None  # None without a critic
  ref_params: Any  # None when no KL term needs the reference policy, and with LoRA (the base is the reference)
  reward_params: Any  # the reward model's (reward_model.enable), frozen; else None
  kl_coef: jax.Array  # KL-in-reward coefficient beta, updated by the KL controller
  lr_scale: jax.Array  # multiplies both learning-rate schedules; guards lower it after a rollback
  teacher_params: Any = None  # the distillation teacher's (distillation.enabled), frozen; else None
  # trainer.v1.trainer_mode=colocate_async: the rollout carried between steps (`rollout.partial.RolloutPool`:
  # prompts, tokens, behaviour log-probs, slot cache, policy versions); None in sync mode.
  carried: Any = None

  def role(self, name: str) -> RoleState | None:
    """The state of trained role `name` ("actor" or "critic")."""
    return getattr(self, name)


def make_optimizer(optim, grad_clip: float) -> optax.GradientTransformation:
  b1, b2 = optim.betas
  return optax.chain(
    optax.clip_by_global_norm(grad_clip),
    optax.scale_by_adam(b1=b1, b2=b2, eps=optim.eps),
    optax.add_decayed_weights(optim.weight_decay),
  )


def make_lr_schedule(optim, total_steps: int):
  """lr as a jittable function of the 0-based scheduler step, as verl's schedulers (docs/algorithms.md §7).

  Warm-up: lr * step / warmup_steps, so step 0 has lr 0; `lr_warmup_steps <= 0` falls back to
  int(lr_warmup_steps_ratio * total_steps) warm-up steps. Then constant, or cosine (verl's form):
  lr * max(min_lr_ratio, cos(2 pi num_cycles progress) * (1 - min_lr_ratio) / 2 + (1 + min_lr_ratio) / 2)
  with progress = (step - warmup) / max(1, total_steps - warmup).
  """
  warmup = optim.lr_warmup_steps
  if warmup is None or warmup <= 0:
    warmup = int(optim.lr_warmup_steps_ratio * total_steps)
  base, min_ratio = optim.lr, optim.min_lr_ratio or 0.0
  num_cycles = optim.num_cycles

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    warm = step / max(warmup, 1)
    if optim.lr_scheduler_type == "cosine":
      progress = (step - warmup) / max(total_steps - warmup, 1)
      after = jnp.maximum(
        min_ratio, jnp.cos(math.pi * num_cycles * 2.0 * progress) * (1.0 - min_ratio) * 0.5 + (1.0 + min_ratio) * 0.5
      )
    else:
      after = jnp.ones_like(step)
    return base * jnp.where(step < warmup, warm, after)

  return schedule


def opt_state_shardings(tx, param_shardings, replicated_sharding):
  """Optimizer state laid out like the params it tracks (moments); scalars (count) replicated."""
  abstract_params = jax.tree.map(lambda s: jax.ShapeDtypeStruct((1,), jnp.float32), param_shardings)
  abstract_state = jax.eval_shape(tx.init, abstract_params)
  return optax.tree_map_params(
    tx,
    lambda _, sharding: sharding,
    abstract_state,
    param_shardings,
    transform_non_params=lambda _: replicated_sharding,
  )


def apply_gradients(tx, params, opt_state, grads, lr):
  """One AdamW update; a non-finite gradient norm skips the update (params and moments unchanged).

  Returns (params, opt_state, grad_norm, skipped) with skipped = 1.0 for a skipped update.
  """
  grad_norm = optax.tree.norm(grads)
  updates, new_opt_state = tx.update(grads, opt_state, params)
  new_params = jax.tree.map(lambda p, u: (p - lr * u).astype(p.dtype), params, updates)
  finite = jnp.isfinite(grad_norm)
  keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
  return keep(new_params, params), keep(new_opt_state, opt_state), grad_norm, 1.0 - finite.astype(jnp.float32)
