"""The step's layouts end to end: built from the config and the mesh, applied inside the compiled step.

One step's round trip (docs/architecture.md "Mesh and layouts"):

    train layout: params FSDP+TP (`actor_train`), batch over (data, fsdp)
      -> rollout:  `to_generation(params)`        key/value heads repeated `generation_kv_repeat` times,
                                                   gathered over fsdp's data-parallel part, split over
                                                   the rollout TP devices (tensor x fsdp's rollout_tp)
                   `to_generation_batch(prompts)`  batch over the generation rules' batch axes
                   `constrain_cache(cache)`        KV cache by batch and (repeated) kv-heads
      -> the rest: `to_train(responses, ...)`      back to the train batch layout; the gathered
                                                   generation copy dies with the rollout
Offload (`memory_kind='pinned_host'`): `fetch(tree, layouts.ref_device)` brings the reference, the
actor's parameters or its optimizer state into device memory for a phase that uses them,
`fetch(tree, layouts.actor_opt_host)` returns the updated state; between phases they stay on the host.
`StepLayouts()` (no mesh) constrains nothing: the single-device step.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import jax
from jax.sharding import Mesh

from jaxrlhf.models.decoder import (
  CACHE_LOGICAL_AXES,
  Decoder,
  abstract_adapters,
  abstract_params,
  kv_heads_repeated,
  repeat_kv_heads,
)
from jaxrlhf.models.lora import critic_trained, split_value_head
from jaxrlhf.parallel.layouts import (
  GENERATION_KV_STAGING_RULES,
  GENERATION_STAGING_RULES,
  TRAIN_RULES,
  ShardingError,
  activation_sharding,
  batch_sharding,
  generation_kv_repeat,
  generation_rules,
  logical_to_shardings,
)
from jaxrlhf.parallel.mesh import ROLLOUT_TP_KEY


@dataclasses.dataclass(frozen=True)
class StepLayouts:
  mesh: Mesh | None = None
  actor_train: Any = None  # trees of NamedSharding, one per parameter
  actor_generation: Any = None  # of the rollout model's parameters (key/value heads repeated)
  # The steps from the train layout to `actor_generation` (`layouts.GENERATION_STAGING_RULES`): before the
  # key/value heads are repeated (only with copies; the other weights as in training), and after.
  actor_kv_staging: Any = None
  actor_generation_staging: Any = None
  actor_adapters: Any = None  # LoRA adapters in the train layout (None without LoRA)
  critic_train: Any = None  # the critic's whole tree, value head included
  # Critic LoRA: {"lora": adapters, "head": value head} in the train layout (`TrainState.critic_adapters`);
  # the frozen backbone is `critic_train` without the head (`critic_params`). None without critic LoRA.
  critic_adapters: Any = None
  reward_train: Any = None
  generation_rules: tuple = ()
  # Copies of each key/value head in the generation layout (1, or more where the rollout TP devices
  # outnumber the heads: `layouts.generation_kv_repeat`); the rollout model has K x this many.
  generation_kv_repeat: int = 1
  # Offload: device-memory shardings to fetch into, host ones to return to (None: nothing offloaded).
  ref_device: Any = None
  actor_device: Any = None
  actor_host: Any = None
  actor_opt_device: Any = None
  actor_opt_host: Any = None

  def _constrain(self, tree, sharding_of):
    if self.mesh is None:
      return tree
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, sharding_of(x.shape)), tree)

  def to_generation(self, params, model_config):
    """The actor's parameters (of `model_config`) in the generation layout, key/value heads repeated
    (`generation_kv_repeat`); XLA inserts the all-to-alls and all-gathers."""
    constrain = jax.lax.with_sharding_constraint
    if self.actor_kv_staging is not None:
      params = constrain(params, self.actor_kv_staging)
    params = repeat_kv_heads(params, model_config, self.generation_kv_repeat)
    if self.actor_generation is None:
      return params
    return constrain(constrain(params, self.actor_generation_staging), self.actor_generation)

  def to_generation_batch(self, tree):
    return self._constrain(tree, lambda shape: batch_sharding(self.mesh, shape, dict(self.generation_rules)["batch"]))

  def constrain_cache(self, cache):
    return self._constrain(
      cache, lambda shape: activation_sharding(self.mesh, CACHE_LOGICAL_AXES, shape, self.generation_rules)
    )

  def to_train(self, tree):
    """Batch-major arrays in the train batch layout (leading dim over data x fsdp where it divides)."""
    return self._constrain(tree, lambda shape: batch_sharding(self.mesh, shape))

  def pin_gradients(self, grads, role: str):
    """Gradients in the train layout of what `role` ("actor" or "critic") trains: its parameters, or with
    LoRA its adapters (and the critic's value head). `update_loop.minibatch_gradients` pins each
    micro-batch's and their sum: with the activations split by rows XLA otherwise sums each layer's weight
    gradient whole on every device."""
    shardings = (
      self.critic_optimized
      if role == "critic"
      else (self.actor_train if self.actor_adapters is None else self.actor_adapters)
    )
    if self.mesh is None or shardings is None:
      return grads
    return jax.lax.with_sharding_constraint(grads, shardings)

  @staticmethod
  def fetch(tree, shardings):
    """Moves an offloaded tree into device memory (or back to host); identity without offload."""
    return tree if shardings is None else jax.device_put(tree, shardings)

  def with_offload(self, config, actor_opt_shardings) -> StepLayouts:
    """Adds the pairs the `param_offload` / `optimizer_offload` keys ask for, where the devices can."""
    rollout_ref = config.actor_rollout_ref
    wanted = {
      "ref": rollout_ref.ref.fsdp_config.param_offload,
      "actor": rollout_ref.actor.fsdp_config.param_offload,
      "actor_opt": rollout_ref.actor.fsdp_config.optimizer_offload,
    }
    if not any(wanted.values()):
      return self
    kinds = {m.kind for m in self.mesh.devices.flat[0].addressable_memories()}
    if "pinned_host" not in kinds:
      logging.warning(
        "offload requested (%s) but %s devices have no 'pinned_host' memory (only %s); "
        "keeping everything in device memory",
        [k for k, v in wanted.items() if v],
        self.mesh.devices.flat[0].platform,
        sorted(kinds),
      )
      return self
    on = lambda tree, kind: jax.tree.map(lambda s: s.with_memory_kind(kind), tree)
    offload = {}
    if wanted["ref"]:
      offload["ref_device"] = on(self.actor_train, "device")
    if wanted["actor"]:
      offload["actor_device"] = on(self.actor_train, "device")
      offload["actor_host"] = on(self.actor_train, "pinned_host")
    if wanted["actor_opt"]:
      offload["actor_opt_device"] = on(actor_opt_shardings, "device")
      offload["actor_opt_host"] = on(actor_opt_shardings, "pinned_host")
    return dataclasses.replace(self, **offload)

  @property
  def actor_params(self):
    """Where the actor's parameters live between phases: the train layout, on the host when offloaded."""
    return self.actor_host or self.actor_train

  @property
  def critic_params(self):
    """Where `TrainState.critic_params` lives: the whole critic, or with LoRA its backbone (no value head)."""
    return self.critic_train if self.critic_adapters is None else split_value_head(self.critic_train)[0]

  @property
  def critic_optimized(self):
    """What the critic's optimizer tracks: its params, or with LoRA its adapters and value head."""
    return self.critic_train if self.critic_adapters is None else self.critic_adapters

  @property
  def ref_params(self):
    """Where the reference policy lives between steps: the train layout, in host memory when offloaded."""
    if self.ref_device is None:
      return self.actor_train
    return jax.tree.map(lambda s: s.with_memory_kind("pinned_host"), self.actor_train)


def build_step_layouts(config, mesh: Mesh, model_config, critic_model_config, reward_model_config) -> StepLayouts:
  """Train and generation shardings of every model of `config` on `mesh` (offload is added by `with_offload`)."""

  def train_shardings(decoder_config, head):
    shapes, logical = abstract_params(Decoder(decoder_config, head=head))
    return logical_to_shardings(logical, shapes, mesh, TRAIN_RULES)

  gen_rules = generation_rules(mesh, config.actor_rollout_ref.rollout.tensor_model_parallel_size)
  kv_repeat = generation_kv_repeat(mesh, model_config.num_attention_heads, model_config.num_key_value_heads)
  actor_shapes, actor_logical = abstract_params(Decoder(model_config, head="lm"))
  rollout_shapes, rollout_logical = abstract_params(Decoder(kv_heads_repeated(model_config, kv_repeat), head="lm"))
  try:
    actor_generation = logical_to_shardings(rollout_logical, rollout_shapes, mesh, gen_rules)
  except ShardingError as e:
    raise ShardingError(
      f"{e} (the generation layout of {ROLLOUT_TP_KEY}={config.actor_rollout_ref.rollout.tensor_model_parallel_size})"
    ) from None
  actor_train = logical_to_shardings(actor_logical, actor_shapes, mesh, TRAIN_RULES)
  actor_kv_staging = None
  if kv_repeat > 1:
    kv_gathered = logical_to_shardings(actor_logical, actor_shapes, mesh, GENERATION_KV_STAGING_RULES)
    actor_kv_staging = jax.tree.map(
      lambda names, gathered, train: gathered if "kv_heads" in names else train,
      actor_logical,
      kv_gathered,
      actor_train,
      is_leaf=lambda x: isinstance(x, tuple),
    )
  # Adapters follow their kernel's rules (A [D, r] over fsdp like the kernel's D); the rank is replicated.
  adapter_shapes, adapter_logical = abstract_adapters(Decoder(model_config, head="lm"))
  critic_train = train_shardings(critic_model_config, "value")
  critic_adapters = None
  if config.critic.enable and critic_model_config.lora_rank:
    critic_adapter_shapes, critic_adapter_logical = abstract_adapters(Decoder(critic_model_config, head="value"))
    critic_adapters = critic_trained(
      logical_to_shardings(critic_adapter_logical, critic_adapter_shapes, mesh, TRAIN_RULES), critic_train
    )
  return StepLayouts(
    actor_adapters=(
      logical_to_shardings(adapter_logical, adapter_shapes, mesh, TRAIN_RULES) if adapter_shapes is not None else None
    ),
    mesh=mesh,
    actor_train=actor_train,
    actor_generation=actor_generation,
    actor_kv_staging=actor_kv_staging,
    actor_generation_staging=logical_to_shardings(rollout_logical, rollout_shapes, mesh, GENERATION_STAGING_RULES),
    critic_train=critic_train,
    critic_adapters=critic_adapters,
    reward_train=train_shardings(reward_model_config, "reward") if reward_model_config is not None else None,
    generation_rules=gen_rules,
    generation_kv_repeat=kv_repeat,
  )
