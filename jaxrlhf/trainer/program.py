"""The compiled step of a config, without data or weights: what the trainer runs and `jaxrlhf.aot` compiles.

`build_program(config, mesh, ...)` turns a resolved config and a mesh into the parameter layouts, the
optimizers, the `PPOStep`, and the train state as abstract arrays (`jax.ShapeDtypeStruct` with their
shardings and memory kinds). The state has one init (`init_train_state`, nanodo's pattern): `jax.eval_shape`
of it is the abstract state, and the trainer jits it into those shardings (`StepProgram.init_state`) from
the base weights it loads; the ahead-of-time tool lowers the same jitted step with the abstract state
instead. One builder for both is what makes the AOT report describe the program the trainer actually runs.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from jaxrlhf.config import SEQUENCE_PARALLEL_KEYS, ConfigError, reward_model_head, sequence_parallel_sizes
from jaxrlhf.models import (
  Decoder,
  DecoderConfig,
  abstract_params,
  compute_settings,
  critic_config_from,
  load_hf_config,
  model_config_from,
)
from jaxrlhf.models.decoder import has_ring_cache
from jaxrlhf.parallel import StepLayouts, batch_sharding, build_step_layouts, replicated
from jaxrlhf.parallel.layouts import activation_sharding
from jaxrlhf.parallel.mesh import fsdp_size
from jaxrlhf.parallel.report import layout_report, per_device_bytes
from jaxrlhf.trainer.judge import JudgeFns
from jaxrlhf.trainer.ppo_step import PPOStep
from jaxrlhf.trainer.state import TrainState, make_lr_schedule, make_optimizer, opt_state_shardings


@dataclasses.dataclass
class StepProgram:
  """Everything static about a config's step on a mesh; `abstract_state` has the trainer's shardings."""

  config: Any
  mesh: Mesh
  model_config: DecoderConfig
  critic_model_config: DecoderConfig
  reward_model_config: DecoderConfig | None
  layouts: StepLayouts
  ppo: PPOStep
  abstract_state: TrainState  # `init`'s output under `jax.eval_shape`, in the state's shardings
  init: Callable  # (base: BaseWeights, actor_key, critic_key) -> TrainState (`init_train_state`)

  @property
  def state_shardings(self) -> TrainState:
    return jax.tree.map(lambda x: x.sharding, self.abstract_state)

  def init_state(self, base: BaseWeights, actor_key, critic_key) -> TrainState:
    """The real state of `abstract_state`: `init` jitted into its shardings (with offload, the params and the
    optimizer state straight into host memory). The base weights are donated: the actor's become its params."""
    init = jax.jit(self.init, out_shardings=self.state_shardings, donate_argnums=0)
    with warnings.catch_warnings():
      # Offloaded weights (host memory) cannot reuse their device-memory base: those are copied, the rest reused.
      warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
      return init(base, actor_key, critic_key)

  @property
  def num_batch_shards(self) -> int:
    return self.mesh.shape["data"] * fsdp_size(self.mesh)

  def jit_admit(self):
    """The warm-up admission of a colocate_async run (`PPOStep.admit`), jitted with the state donated."""
    return jax.jit(
      self.ppo.admit, in_shardings=(self.state_shardings, None), out_shardings=self.state_shardings, donate_argnums=0
    )

  def jit_step(self):
    """The fused step, jitted with the state donated (the trainer's `jitted_step`)."""
    state_shardings, replicated_sharding = self.state_shardings, replicated(self.mesh)
    return jax.jit(
      self.ppo,
      in_shardings=(state_shardings, None, replicated_sharding),
      out_shardings=(state_shardings, replicated_sharding),
      donate_argnums=0,
    )

  def abstract_batch(self, rows: int) -> dict[str, jax.ShapeDtypeStruct]:
    """A batch of `rows` prompts as the data path delivers it (`data.batch_arrays`), in the batch layout.

    At its widest, `max_prompt_length`: batches padded to a shorter bucket (`data.bucket_prompt_lengths`)
    compile smaller programs, so this is the worst case.
    """
    prompt_len = self.config.data.max_prompt_length
    shapes = {
      "input_ids": ((rows, prompt_len), jnp.int32),
      "attention_mask": ((rows, prompt_len), jnp.int32),
      "sample_index": ((rows,), jnp.int32),
    }
    return {
      k: jax.ShapeDtypeStruct(shape, dtype, sharding=batch_sharding(self.mesh, shape))
      for k, (shape, dtype) in shapes.items()
    }

  def abstract_rng(self) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=replicated(self.mesh))

  def layout_report(self) -> str:
    """Mesh, per-layout sharding of each parameter group, per-device bytes (the trainer's start-up report)."""
    state = self.abstract_state
    counts = {
      "actor params": per_device_bytes(state.actor.params),
      "actor params (generation copy)": per_device_bytes(self._generation_copy(), self.layouts.actor_generation),
      "actor optimizer": per_device_bytes(state.actor.opt_state),
      **({"actor LoRA adapters": per_device_bytes(state.actor.adapters)} if state.actor.lora else {}),
      self._cache_label(): self.kv_cache_bytes_per_device(),
    }
    if state.ref_params is not None:
      counts["ref params"] = per_device_bytes(state.ref_params)
    if state.reward_params is not None:  # a scalar reward model's, or a judge's (its LM head)
      name = "judge" if self.ppo.judge is not None else "reward model"
      counts[f"{name} params"] = per_device_bytes(state.reward_params)
    if state.teacher_params is not None:
      counts["teacher params"] = per_device_bytes(state.teacher_params)
    if state.critic is not None:
      counts["critic params"] = per_device_bytes(state.critic.params)
      counts["critic optimizer"] = per_device_bytes(state.critic.opt_state)
      if state.critic.lora:
        counts["critic LoRA adapters + value head"] = per_device_bytes(state.critic.adapters)
    return layout_report(
      self.mesh, {"train": self.layouts.actor_train, "generation": self.layouts.actor_generation}, counts
    )

  def _generation_copy(self):
    """The rollout model's parameters as generation holds them: in the rollout dtype, key/value heads repeated."""
    dtype = jnp.dtype(self.ppo.generation.rollout_dtype)
    cast = lambda x: jax.ShapeDtypeStruct(x.shape, dtype if jnp.issubdtype(x.dtype, jnp.floating) else x.dtype)
    return jax.tree.map(cast, abstract_params(self.ppo.generation.rollout_actor)[0])

  def _cache_label(self) -> str:
    """What the generation cache holds: keys and values, and with Gated DeltaNet layers their conv and recurrent
    state per row (`models.decoder.init_cache`)."""
    config = self.ppo.generation.rollout_actor.config
    if has_ring_cache(config):
      return f"KV cache (sliding layers: a ring of {config.sliding_window} columns)"
    return "KV cache + recurrent state" if "linear_attention" in config.layer_types else "KV cache"

  def kv_cache_bytes_per_device(self) -> int:
    """The rollout's generation cache (keys + values of every attention layer, the conv and recurrent state of
    every Gated DeltaNet layer) on one device, in the generation layout. With
    `rollout.max_num_seqs`: the slots' cache plus the prompt window's (2 x slots rows of each shard, prompt columns
    only; `rollout/slots.py`)."""
    data_cfg, rollout = self.config.data, self.config.actor_rollout_ref.rollout
    # DAPO's dynamic sampling generates gen_batch_size prompts a round.
    prompts = (
      (data_cfg.gen_batch_size or data_cfg.train_batch_size)
      if self.config.algorithm.filter_groups.enable
      else data_cfg.train_batch_size
    )
    rows, prompt_len = prompts * rollout.n, data_cfg.max_prompt_length
    whole = prompt_len + data_cfg.max_response_length
    shards = self.layouts.generation_shards(rows).count
    if rollout.max_num_seqs is None or rollout.max_num_seqs >= rows // shards:
      return self._cache_bytes(rows, whole)
    slots = shards * rollout.max_num_seqs
    return self._cache_bytes(slots, whole) + self._cache_bytes(2 * slots, prompt_len)

  def _cache_bytes(self, rows: int, length: int) -> int:
    """Per-device bytes of the rollout model's generation cache (`init_cache`) for `rows` rows of `length` columns."""
    model = self.ppo.generation.decode_model
    shapes = jax.eval_shape(lambda: model.init_cache(rows, length))
    sizes = jax.tree.map(
      lambda leaf, names: per_device_bytes(
        leaf, activation_sharding(self.mesh, names, leaf.shape, self.layouts.generation_rules)
      ),
      shapes,
      model.cache_axes,
    )
    return sum(jax.tree.leaves(sizes))


def model_configs(config, tokenizer=None) -> tuple[DecoderConfig, DecoderConfig, DecoderConfig | None]:
  """(actor, critic, reward model) configs of a resolved config.

  The critic has the actor's architecture unless `critic.model.path` names another checkpoint; its own
  compute keys (dtype, param_dtype, gradient checkpointing) apply either way.
  """
  model_config = model_config_from(config.actor_rollout_ref.model, tokenizer)
  critic_model_config = critic_config_from(config, model_config, tokenizer)
  # A scalar reward model reads the actor's token ids: it must share the actor's tokenizer (a judge has its own).
  reward_model_config = load_hf_config(config.reward_model.model.path) if config.reward_model.enable else None
  check_layer_kinds(config, model_config, critic_model_config)
  return model_config, critic_model_config, reward_model_config


def teacher_model_config(config, model_config: DecoderConfig) -> DecoderConfig | None:
  """The distillation teacher's config (`distillation.teacher_model.model_path`), None when distillation is off.

  The teacher scores the student's token ids, so both must index the same vocabulary: a teacher of another
  vocabulary size is refused here, before any weight is read (a tokenizer that differs at equal size is the
  user's to rule out, as for the reward model)."""
  if not config.distillation.enabled:
    return None
  path = config.distillation.teacher_model.model_path
  # The actor's compute settings (dtype, attention, layer scan), without LoRA or gradient checkpointing: the
  # teacher only runs forward. Its weights are stored in the rollout's dtype, as verl's teacher engine runs in it.
  model = config.actor_rollout_ref.model
  settings = dict(compute_settings(model), lora_rank=0, remat_policy="none")
  settings["param_dtype"] = config.actor_rollout_ref.rollout.dtype or model.dtype
  teacher = load_hf_config(path, **settings)
  if teacher.vocab_size != model_config.vocab_size:
    raise ConfigError(
      f"distillation.teacher_model.model_path={path!r} has vocab_size={teacher.vocab_size}, the student "
      f"(actor_rollout_ref.model) {model_config.vocab_size}: the teacher must score the student's token ids"
    )
  return teacher


def check_layer_kinds(config, model_config: DecoderConfig, critic_model_config: DecoderConfig) -> None:
  """Start-up check: a model with Gated DeltaNet layers (Qwen3.5's `linear_attention`) neither packs sequences
  nor splits them over devices. Its recurrence runs along the whole row: packed, one sequence's state would flow
  into the next; split by Ulysses, each device would start its part from a zero state."""
  actor_packed = bool(config.actor_rollout_ref.model.use_remove_padding)
  roles = [
    ("actor_rollout_ref", model_config, actor_packed, config.actor_rollout_ref.actor.ulysses_sequence_parallel_size)
  ]
  if config.critic.enable:
    critic_packed = actor_packed or bool(config.critic.model.use_remove_padding)
    roles.append(("critic", critic_model_config, critic_packed, config.critic.ulysses_sequence_parallel_size))
  for section, model, packed, sp in roles:
    if "linear_attention" not in model.layer_types:
      continue
    why = (
      f"the model's Gated DeltaNet layers (layer_types 'linear_attention', {model.model_type}) carry a recurrent "
      "state along each row"
    )
    if packed:
      key = "actor_rollout_ref.model" if section == "actor_rollout_ref" or actor_packed else "critic.model"
      raise ConfigError(
        f"{key}.use_remove_padding=True packs several sequences into one row, but {why}: one sequence's state "
        f"would flow into the next; set {key}.use_remove_padding=False"
      )
    if (sp or 1) > 1:
      key = "actor_rollout_ref.actor" if section == "actor_rollout_ref" else "critic"
      raise ConfigError(
        f"{key}.ulysses_sequence_parallel_size={sp} splits each sequence over devices, but {why}, which "
        f"no device could start from the one before it; set {key}.ulysses_sequence_parallel_size=1"
      )


def check_micro_batches(config, ppo: PPOStep, num_batch_shards: int) -> None:
  """Start-up check: each micro-batch (per device x batch shards) divides its mini-batch."""
  if config.actor_rollout_ref.actor.use_dynamic_bsz:
    return  # micro-batches come from the token budget
  sections = [("actor_rollout_ref.actor", config.actor_rollout_ref.actor)]
  if ppo.plan.use_critic:
    sections.append(("critic", config.critic))
  for path, section in sections:
    try:
      ppo.batcher.micro_rows(section, path)
    except ValueError as e:
      raise ConfigError(
        f"{e} ({path}.ppo_mini_batch_size={section.ppo_mini_batch_size} prompts x "
        f"rollout.n={config.actor_rollout_ref.rollout.n}; mesh data*fsdp={num_batch_shards})"
      ) from None


def check_sequence_parallel(
  config, mesh: Mesh, model_config: DecoderConfig, critic_model_config: DecoderConfig
) -> None:
  """Start-up check: each sequence-parallel model's query heads split over tensor x sp, and its key/value
  heads over tensor (the all-to-all gives each device whole heads; key/value heads fewer than sp per
  tensor shard are repeated, `models.sequence_parallel`)."""
  tensor = mesh.shape["tensor"]
  models = {
    "actor": ("actor_rollout_ref.model", model_config),
    "ref": ("actor_rollout_ref.model", model_config),
    "critic": ("critic.model", critic_model_config),
  }
  for role, size in sequence_parallel_sizes(config).items():
    model_path, model = models[role]
    if size == 1:
      continue
    for name, split in (("num_attention_heads", size * tensor), ("num_key_value_heads", tensor)):
      heads = getattr(model, name)
      if heads % split:
        over = (
          f"config key {SEQUENCE_PARALLEL_KEYS[role]}={size} x mesh.tensor={tensor}"
          if split > tensor
          else (f"mesh.tensor={tensor} (with {SEQUENCE_PARALLEL_KEYS[role]}={size})")
        )
        raise ConfigError(f"{over} must divide {name}={heads} of {model_path} (Ulysses gives each device whole heads)")


@flax.struct.dataclass
class BaseWeights:
  """The weights a run starts from (loaded from their checkpoints, or initialised): what the state init reads."""

  actor: Any  # the actor's whole params, in the train layout
  critic: Any  # the critic's whole params (value head included); None without a critic
  reward: Any  # the reward model's (reward_model.enable; a judge's with its LM head); else None
  teacher: Any = None  # the distillation teacher's (distillation.enabled); else None


def init_train_state(ppo: PPOStep, kl_coef: float, base: BaseWeights, actor_key, critic_key) -> TrainState:
  """A fresh train state from the run's base weights: the one init, traced twice (`StepProgram.abstract_state`
  under `jax.eval_shape`, `StepProgram.init_state` jitted into the state's shardings)."""
  plan = ppo.plan
  return TrainState(
    step=jnp.int32(0),
    actor=ppo.roles["actor"].init(base.actor, actor_key),
    critic=ppo.roles["critic"].init(base.critic, critic_key) if plan.use_critic else None,
    # The reference starts as the actor (with LoRA it is the actor's base, which the actor keeps: no copy).
    ref_params=jax.tree.map(jnp.copy, base.actor) if plan.stores_reference else None,
    reward_params=base.reward,
    teacher_params=base.teacher,
    kl_coef=jnp.float32(kl_coef),
    lr_scale=jnp.float32(1.0),
    carried=ppo.generation.empty_pool() if ppo.generation.carries_rollouts else None,
  )


def state_shardings(ppo: PPOStep, layouts: StepLayouts, mesh: Mesh, has_reward_model: bool) -> TrainState:
  """Where each part of the train state lives between steps (a `TrainState` of shardings)."""
  return TrainState(
    step=replicated(mesh),
    actor=ppo.roles["actor"].state_shardings(),
    critic=ppo.roles["critic"].state_shardings() if ppo.plan.use_critic else None,
    ref_params=layouts.ref_params if ppo.plan.stores_reference else None,
    reward_params=layouts.reward_train if has_reward_model else None,
    teacher_params=layouts.teacher_train,
    kl_coef=replicated(mesh),
    lr_scale=replicated(mesh),
    # The carried pool is replicated: its slots hold max_num_seqs rows, decoded by every device (a per-shard
    # pool, like the slots' `Shards`, is not built yet).
    carried=jax.tree.map(lambda _: replicated(mesh), jax.eval_shape(ppo.generation.empty_pool))
    if ppo.generation.carries_rollouts
    else None,
  )


def build_program(
  config,
  mesh: Mesh,
  *,
  model_config: DecoderConfig,
  critic_model_config: DecoderConfig,
  reward_model_config: DecoderConfig | None,
  reward_fn: Callable,
  eos_token_ids,
  pad_token_id: int,
  total_steps: int,
  judge_fns: JudgeFns | None = None,
  teacher_model_config: DecoderConfig | None = None,
) -> StepProgram:
  """The step of a resolved `config` on `mesh` (see the module docstring). `judge_fns`: a generative reward
  model's host side (`judge.make_judge_fns`)."""
  # attention_impl="auto" follows the mesh's devices: ahead of time they are not this host's.
  platform = mesh.devices.flat[0].platform
  model_config, critic_model_config = model_config.for_platform(platform), critic_model_config.for_platform(platform)
  reward_model_config = reward_model_config.for_platform(platform) if reward_model_config is not None else None
  teacher_model_config = teacher_model_config.for_platform(platform) if teacher_model_config is not None else None
  actor_cfg = config.actor_rollout_ref.actor
  optimizers = {
    "actor": make_optimizer(actor_cfg.optim, actor_cfg.grad_clip),
    "critic": make_optimizer(config.critic.optim, config.critic.grad_clip),
  }
  schedules = {
    "actor": make_lr_schedule(actor_cfg.optim, total_steps),
    "critic": make_lr_schedule(config.critic.optim, total_steps),
  }
  layouts = build_step_layouts(
    config, mesh, model_config, critic_model_config, reward_model_config, teacher_model_config
  )
  # Each optimizer's state is laid out like what it tracks (`RoleLayouts.trained`).
  layouts = layouts.with_optimizers(
    {role: opt_state_shardings(tx, layouts.role(role).trained, replicated(mesh)) for role, tx in optimizers.items()}
  ).with_offload(config)
  check_sequence_parallel(config, mesh, model_config, critic_model_config)
  num_batch_shards = mesh.shape["data"] * fsdp_size(mesh)
  ppo = PPOStep(
    config,
    model_config,
    reward_fn,
    eos_token_ids=eos_token_ids,
    pad_token_id=pad_token_id,
    lr_schedules=schedules,
    optimizers=optimizers,
    layouts=layouts,
    num_batch_shards=num_batch_shards,
    kl_warmup_steps=int(config.trainer.guard.kl_warmup_steps_ratio * total_steps),
    critic_model_config=critic_model_config,
    reward_model_config=reward_model_config,
    judge_fns=judge_fns,
    teacher_model_config=teacher_model_config,
  )
  check_micro_batches(config, ppo, num_batch_shards)
  shardings = state_shardings(ppo, layouts, mesh, reward_model_config is not None)
  init = functools.partial(init_train_state, ppo, config.algorithm.kl_ctrl.kl_coef)
  abstract_params_of = lambda model_config, head: abstract_params(Decoder(model_config, head=head))[0]
  base = BaseWeights(
    actor=abstract_params_of(model_config, "lm"),
    critic=abstract_params_of(critic_model_config, "value") if ppo.plan.use_critic else None,
    reward=(
      abstract_params_of(reward_model_config, reward_model_head(config)) if reward_model_config is not None else None
    ),
    teacher=abstract_params_of(teacher_model_config, "lm") if teacher_model_config is not None else None,
  )
  key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
  abstract_state = jax.tree.map(
    lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
    jax.eval_shape(init, base, key, key),
    shardings,
  )
  return StepProgram(
    config=config,
    mesh=mesh,
    ppo=ppo,
    abstract_state=abstract_state,
    init=init,
    layouts=layouts,
    model_config=model_config,
    critic_model_config=critic_model_config,
    reward_model_config=reward_model_config,
  )
