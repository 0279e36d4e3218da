"""The train state (a pytree) and the optimizer: AdamW with clipping, lr by trainer step.

The learning rate follows verl: one scheduler step per trainer step (not per mini-batch), warmup
then constant or cosine down to `min_lr_ratio * lr`. AdamW is written as
`clip_by_global_norm -> scale_by_adam -> add_decayed_weights` and the step applies `-lr * update`,
so the schedule is a pure function of the step carried in the state.
"""

from __future__ import annotations

import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # trainer steps done (int32)
  actor_params: Any
  actor_opt_state: Any
  critic_params: Any  # None without a critic
  critic_opt_state: Any
  ref_params: Any  # None when no KL term needs the reference policy
  reward_params: Any  # the reward model's (reward_model.enable), frozen; else None
  kl_coef: jax.Array  # KL-in-reward coefficient beta, updated by the KL controller
  lr_scale: jax.Array  # multiplies both learning-rate schedules; guards lower it after a rollback


def make_optimizer(optim, grad_clip: float) -> optax.GradientTransformation:
  b1, b2 = optim.betas
  return optax.chain(
      optax.clip_by_global_norm(grad_clip),
      optax.scale_by_adam(b1=b1, b2=b2, eps=optim.eps),
      optax.add_decayed_weights(optim.weight_decay),
  )


def make_lr_schedule(optim, total_steps: int):
  """lr as a jittable function of the trainer step."""
  warmup = optim.lr_warmup_steps
  if warmup is None or warmup < 0:
    warmup = int(optim.lr_warmup_steps_ratio * total_steps)
  base, floor = optim.lr, optim.lr * optim.min_lr_ratio

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    warm = base * jnp.minimum(1.0, (step + 1) / max(warmup, 1)) if warmup > 0 else base
    if optim.lr_scheduler_type == "cosine":
      progress = jnp.clip((step - warmup) / max(total_steps - warmup, 1), 0.0, 1.0)
      decayed = floor + (base - floor) * 0.5 * (1.0 + jnp.cos(math.pi * progress))
      return jnp.where(step < warmup, warm, decayed)
    return jnp.where(step < warmup, warm, base) if warmup > 0 else jnp.asarray(base, jnp.float32)

  return schedule


def opt_state_shardings(tx, param_shardings, replicated_sharding):
  """Optimizer state laid out like the params it tracks (moments); scalars (count) replicated."""
  abstract_params = jax.tree.map(lambda s: jax.ShapeDtypeStruct((1,), jnp.float32), param_shardings)
  abstract_state = jax.eval_shape(tx.init, abstract_params)
  return optax.tree_map_params(tx, lambda _, sharding: sharding, abstract_state, param_shardings,
                               transform_non_params=lambda _: replicated_sharding)


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
