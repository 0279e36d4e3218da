"""The step's layouts end to end: built from the config and the mesh, applied inside the compiled step.

One step's round trip (docs/architecture.md "Mesh and layouts"):

    train layout: params FSDP+TP (`actor_train`), batch over (data, fsdp)
      -> rollout:  `to_generation(params)`        key/value heads repeated `generation_kv_repeat` times,
                                                   gathered over fsdp's data-parallel part, split over
                                                   the rollout TP devices (tensor x fsdp's rollout_tp)
                   `to_generation_batch(prompts)`  batch over the generation rules' batch axes
                   `constrain_cache(cache)`        KV cache by batch and (repeated) kv-heads
                   `generation_shards(rows)`       the batch's blocks, for generation in slots
      -> the rest: `to_train(responses, ...)`      back to the train batch layout; the gathered
                                                   generation copy dies with the rollout
A trained role's state (the actor's, the critic's) has its own `RoleLayouts`: its params, what trains with
LoRA, its optimizer state. Offload (`memory_kind='pinned_host'`): `RoleLayouts.on_device` brings a role's
params and optimizer state into device memory for a phase that uses them, `RoleLayouts.store` returns the
updated ones; `fetch(tree, layouts.ref_device)` the reference. Between phases they stay on the host.
`StepLayouts()` (no mesh) constrains nothing: the single-device step.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrlhf.config import reward_model_head
from jaxrlhf.models.decoder import (
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
from jaxrlhf.rollout.slots import Shards


def fetch(tree, shardings):
  """Moves an offloaded tree into device memory (or back to host); identity for `shardings` None."""
  return tree if shardings is None else jax.device_put(tree, shardings)


def _on(tree, kind: str):
  return jax.tree.map(lambda s: s.with_memory_kind(kind), tree)


@dataclasses.dataclass(frozen=True)
class RoleLayouts:
  """Where a trained role's state (`trainer.state.RoleState`) lives: trees of NamedSharding in the train layout.

  `params`: its weights (a LoRA critic's: the backbone, without the value head); `adapters`: with LoRA what
  trains (the actor's adapters; the critic's {"lora", "head"}), else None; `opt`: the optimizer state of what
  trains. With offload (`fsdp_config.param_offload` / `optimizer_offload`) the params and the optimizer state
  live in pinned host memory between phases (`params_host`, `opt_host`); LoRA adapters are never offloaded.
  """

  params: Any = None
  adapters: Any = None
  opt: Any = None
  params_host: Any = None
  opt_host: Any = None

  @classmethod
  def of(cls, model: Decoder, mesh: Mesh, params) -> RoleLayouts:
    """The layouts of a role of `model` (its config and head) on `mesh`, from `params`, the whole model's train
    shardings: with LoRA also its adapters', which follow their kernels' rules (A [D, r] over fsdp like the
    kernel's D; the rank replicated), and a critic's value head among what trains."""
    shapes, logical = abstract_adapters(model)
    if shapes is None:
      return cls(params=params)
    adapters = logical_to_shardings(logical, shapes, mesh, TRAIN_RULES)
    if model.head == "value":
      return cls(params=split_value_head(params)[0], adapters=critic_trained(adapters, params))
    return cls(params=params, adapters=adapters)

  @property
  def trained(self):
    """The layout of what the optimizer updates: the params, or with LoRA the adapters."""
    return self.params if self.adapters is None else self.adapters

  @property
  def params_device(self):
    """Where a phase fetches the params into (None: they stay in device memory anyway)."""
    return None if self.params_host is None else self.params

  def reference_device(self, ref_device):
    """Where a phase fetches the reference policy's params into, this being the actor's layouts: with LoRA the
    reference is the actor's base (`RoleState.reference`), fetched like it; else its own copy, into `ref_device`."""
    return ref_device if self.adapters is None else self.params_device

  @property
  def stored_params(self):
    """Where the params live between phases: in host memory when offloaded."""
    return self.params_host or self.params

  @property
  def stored_opt(self):
    """Where the optimizer state lives between updates: in host memory when offloaded."""
    return self.opt_host or self.opt

  def on_device(self, state):
    """A `RoleState` with its params (and optimizer state, if it holds one) in device memory for a phase."""
    opt_device = None if self.opt_host is None or state.opt_state is None else self.opt
    return state.replace(params=fetch(state.params, self.params_device), opt_state=fetch(state.opt_state, opt_device))

  def store(self, state, trained, opt_state):
    """`state` after an update: the new `trained` and optimizer state, back where they live between phases."""
    trained_host = self.params_host if self.adapters is None else None
    return state.with_trained(fetch(trained, trained_host), fetch(opt_state, self.opt_host))

  def offloaded(self, params: bool, optimizer: bool) -> RoleLayouts:
    """With the host copies the two `fsdp_config` keys ask for (the optimizer's needs `opt` set)."""
    return dataclasses.replace(
      self,
      params_host=_on(self.params, "pinned_host") if params else None,
      opt_host=_on(self.opt, "pinned_host") if optimizer else None,
    )


@dataclasses.dataclass(frozen=True)
class MeshShards(Shards):
  """A mesh's generation shards: the batch axes that split the batch (every cache and row array is split by
  exactly those, whatever else its size would allow), key/value heads as the generation rules say; `map` runs
  in a `shard_map`, so each device updates its own slots from its own rows."""

  mesh: Any = None
  batch_axes: tuple = ()
  rules: tuple = ()

  def _batch_entry(self):
    return None if not self.batch_axes else self.batch_axes[0] if len(self.batch_axes) == 1 else self.batch_axes

  def _cache_spec(self, shape, names) -> PartitionSpec:
    spec = list(activation_sharding(self.mesh, names, shape, self.rules).spec)
    spec += [None] * (len(shape) - len(spec))
    spec[names.index("batch")] = self._batch_entry()
    return PartitionSpec(*spec)

  def _row_spec(self, shape) -> PartitionSpec:
    return PartitionSpec(self._batch_entry(), *([None] * (len(shape) - 1)))

  def constrain_cache(self, cache, cache_axes):
    pin = lambda x, names: jax.lax.with_sharding_constraint(
      x, NamedSharding(self.mesh, self._cache_spec(x.shape, names))
    )
    return jax.tree.map(pin, cache, cache_axes)

  def map(self, fn, cache_axes, cache, rows, const_caches, const_rows):
    cache_specs = lambda tree: jax.tree.map(lambda x, names: self._cache_spec(x.shape, names), tree, cache_axes)
    row_specs = lambda tree: jax.tree.map(lambda x: self._row_spec(x.shape), tree)
    const_specs = None if const_caches is None else cache_specs(const_caches)
    in_specs = (cache_specs(cache), row_specs(rows), const_specs, row_specs(const_rows))
    # The vma check is off: the local update's loops and scatters carry no varying-axis annotations.
    return jax.shard_map(fn, mesh=self.mesh, in_specs=in_specs, out_specs=in_specs[:2], check_vma=False)(
      cache, rows, const_caches, const_rows
    )


@dataclasses.dataclass(frozen=True)
class StepLayouts:
  mesh: Mesh | None = None
  actor_train: Any = None  # trees of NamedSharding, one per parameter: the actor's (also the reference's)
  actor_generation: Any = None  # of the rollout model's parameters (key/value heads repeated)
  # The steps from the train layout to `actor_generation` (`layouts.GENERATION_STAGING_RULES`): before the
  # key/value heads are repeated (only with copies; the other weights as in training), and after.
  actor_kv_staging: Any = None
  actor_generation_staging: Any = None
  critic_train: Any = None  # the critic's whole tree, value head included
  actor: RoleLayouts = RoleLayouts()  # the trained roles' state
  critic: RoleLayouts = RoleLayouts()
  reward_train: Any = None  # the reward model's (a scalar head, or a judge's LM head: `reward_model_head`)
  # A judge's (`reward_model.generative`) rollout model's parameters in the generation layout, its key/value heads
  # repeated `judge_kv_repeat` times as the actor's are.
  judge_generation: Any = None
  judge_kv_repeat: int = 1
  teacher_train: Any = None  # the distillation teacher's (frozen, the train layout, as the reference)
  generation_rules: tuple = ()
  # Copies of each key/value head in the generation layout (1, or more where the rollout TP devices
  # outnumber the heads: `layouts.generation_kv_repeat`); the rollout model has K x this many.
  generation_kv_repeat: int = 1
  ref_device: Any = None  # with the reference offloaded: its device-memory shardings to fetch into

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

  def judge_to_generation(self, params, model_config):
    """A judge's parameters (of `model_config`, train layout) in the generation layout (`judge_generation`). One
    constraint: a judge's weights move once per step, before its replies are decoded."""
    params = repeat_kv_heads(params, model_config, self.judge_kv_repeat)
    if self.judge_generation is None:
      return params
    return jax.lax.with_sharding_constraint(params, self.judge_generation)

  def to_generation_batch(self, tree):
    return self._constrain(tree, lambda shape: batch_sharding(self.mesh, shape, dict(self.generation_rules)["batch"]))

  def generation_shards(self, rows: int) -> Shards:
    """The blocks `to_generation_batch` splits a batch of `rows` into (the devices of the batch axes that divide
    it; shard d holds rows [d rows / D, (d + 1) rows / D)), for generation in slots (`rollout/slots.py`)."""
    if self.mesh is None:
      return Shards()
    axes = batch_sharding(self.mesh, (rows,), dict(self.generation_rules)["batch"]).spec[0]
    axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    return MeshShards(math.prod(self.mesh.shape[axis] for axis in axes), self.mesh, axes, self.generation_rules)

  def constrain_cache(self, cache, cache_axes):
    """The model's generation cache (leaves with logical axes `cache_axes`, `DecodeModel.cache_axes`) pinned in
    the generation layout."""
    if self.mesh is None:
      return cache
    pin = lambda x, names: jax.lax.with_sharding_constraint(
      x, activation_sharding(self.mesh, names, x.shape, self.generation_rules)
    )
    return jax.tree.map(pin, cache, cache_axes)

  def to_train(self, tree):
    """Batch-major arrays in the train batch layout (leading dim over data x fsdp where it divides)."""
    return self._constrain(tree, lambda shape: batch_sharding(self.mesh, shape))

  def role(self, name: str) -> RoleLayouts:
    return getattr(self, name)

  def pin_gradients(self, grads, role: str):
    """Gradients in the train layout of what `role` ("actor" or "critic") trains (`RoleLayouts.trained`).
    `update_loop.minibatch_gradients` pins each micro-batch's and their sum: with the activations split by
    rows XLA otherwise sums each layer's weight gradient whole on every device."""
    shardings = self.role(role).trained
    if self.mesh is None or shardings is None:
      return grads
    return jax.lax.with_sharding_constraint(grads, shardings)

  fetch = staticmethod(fetch)

  def with_optimizers(self, opt_shardings: dict) -> StepLayouts:
    """With each role's optimizer-state shardings (`opt_shardings`: role -> tree)."""
    roles = {role: dataclasses.replace(self.role(role), opt=opt) for role, opt in opt_shardings.items()}
    return dataclasses.replace(self, **roles)

  def with_offload(self, config) -> StepLayouts:
    """Adds the host copies the `param_offload` / `optimizer_offload` keys ask for, where the devices can."""
    rollout_ref, critic = config.actor_rollout_ref, config.critic.model.fsdp_config
    actor = rollout_ref.actor.fsdp_config
    wanted = {
      "ref": rollout_ref.ref.fsdp_config.param_offload,
      "actor": actor.param_offload,
      "actor_opt": actor.optimizer_offload,
      "critic": critic.param_offload,
      "critic_opt": critic.optimizer_offload,
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
    return dataclasses.replace(
      self,
      ref_device=_on(self.actor_train, "device") if wanted["ref"] else None,
      actor=self.actor.offloaded(wanted["actor"], wanted["actor_opt"]),
      critic=self.critic.offloaded(wanted["critic"], wanted["critic_opt"]),
    )

  @property
  def offloaded(self) -> bool:
    """Whether anything lives in host memory between phases."""
    roles = (self.actor, self.critic)
    return self.ref_device is not None or any(r.params_host is not None or r.opt_host is not None for r in roles)

  @property
  def ref_params(self):
    """Where the reference policy lives between steps: the train layout, in host memory when offloaded."""
    if self.ref_device is None:
      return self.actor_train
    return _on(self.actor_train, "pinned_host")


def build_step_layouts(
  config, mesh: Mesh, model_config, critic_model_config, reward_model_config, teacher_model_config=None
) -> StepLayouts:
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
  judge_generation, judge_kv_repeat = None, 1
  if reward_model_config is not None and config.reward_model.generative:
    judge_kv_repeat = generation_kv_repeat(
      mesh, reward_model_config.num_attention_heads, reward_model_config.num_key_value_heads
    )
    judge_shapes, judge_logical = abstract_params(
      Decoder(kv_heads_repeated(reward_model_config, judge_kv_repeat), head="lm")
    )
    judge_generation = logical_to_shardings(judge_logical, judge_shapes, mesh, gen_rules)
  critic_train = train_shardings(critic_model_config, "value")
  critic = RoleLayouts(params=critic_train)
  if config.critic.enable:
    critic = RoleLayouts.of(Decoder(critic_model_config, head="value"), mesh, critic_train)
  return StepLayouts(
    mesh=mesh,
    actor_train=actor_train,
    actor_generation=actor_generation,
    actor_kv_staging=actor_kv_staging,
    actor_generation_staging=logical_to_shardings(rollout_logical, rollout_shapes, mesh, GENERATION_STAGING_RULES),
    critic_train=critic_train,
    actor=RoleLayouts.of(Decoder(model_config, head="lm"), mesh, actor_train),
    critic=critic,
    reward_train=(
      train_shardings(reward_model_config, reward_model_head(config)) if reward_model_config is not None else None
    ),
    judge_generation=judge_generation,
    judge_kv_repeat=judge_kv_repeat,
    teacher_train=train_shardings(teacher_model_config, "lm") if teacher_model_config is not None else None,
    generation_rules=gen_rules,
    generation_kv_repeat=kv_repeat,
  )
