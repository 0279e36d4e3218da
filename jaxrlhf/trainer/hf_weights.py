"""A run's weights as Hugging Face checkpoints: what each trained role starts from, and the roles written out.

`actor_base_params` / `critic_base_params`: the weights a run starts from (its HF checkpoint, or initialised from
`trainer.seed`), which the trainer loads and a reader of a LoRA checkpoint rebuilds the frozen params from (a
checkpoint does not hold them: `RoleState.saved`). `saved_roles` reads the trained roles out of a checkpoint's tree,
`whole_actor` / `whole_critic` put their frozen params back, and `write_hf` writes them whole (`RoleState.merged`).
`trainer.save_hf` (the trainer) and `python -m jaxrlhf.export` (a checkpoint) write through `write_hf`;
`python -m jaxrlhf.generate` reads a checkpoint's actor the same way.
"""

from __future__ import annotations

import os

import jax

from jaxrlhf.errors import CheckpointError
from jaxrlhf.models import (
  Decoder,
  copy_tokenizer_files,
  critic_config_from,
  init_params,
  load_hf_params,
  model_config_from,
  save_hf_checkpoint,
)
from jaxrlhf.models.hub import hub_id_of
from jaxrlhf.models.lora import save_peft_adapter, split_value_head
from jaxrlhf.trainer.state import RoleState

LORA_ADAPTER_DIR = "lora_adapter"  # under the export directory: a LoRA run's adapters in PEFT's layout


def init_keys(config):
  """(actor key, critic key) that a run's from-scratch weights are initialised with (`trainer.seed`)."""
  return tuple(jax.random.split(jax.random.key(config.trainer.seed)))


def actor_base_params(config, model_config, shardings=None):
  """The actor's weights a run starts from: its HF checkpoint, or initialised from `trainer.seed`.

  With LoRA these stay frozen (the base), so a checkpoint does not hold them: its reader rebuilds them (`whole_actor`).
  """
  path = config.actor_rollout_ref.model.path
  if path:
    return load_hf_params(path, model_config, head="lm", shardings=shardings)
  init = lambda key: init_params(Decoder(model_config, head="lm"), key)[0]
  return jax.jit(init, out_shardings=shardings)(init_keys(config)[0])


def critic_base_params(config, critic_config, shardings=None):
  """The critic's weights a run starts from: its HF checkpoint (verl's critic format, or a causal LM whose
  value head is initialised fresh from `trainer.seed`), or all of it initialised from `trainer.seed`.

  With critic LoRA the backbone stays frozen, so a checkpoint does not hold it: its reader rebuilds it (`whole_critic`).
  `shardings`: the whole critic's, value head included.
  """
  path = config.critic.model.path or config.actor_rollout_ref.model.path
  critic_key = init_keys(config)[1]
  if path:
    return load_hf_params(path, critic_config, head="value", shardings=shardings, rng=critic_key)
  init = lambda key: init_params(Decoder(critic_config, head="value"), key)[0]
  return jax.jit(init, out_shardings=shardings)(critic_key)


def write_hf(
  actor: RoleState,
  config,
  out_dir: str,
  *,
  critic: RoleState | None = None,
  critic_out: str | None = None,
  tokenizer_dir: str | None = None,
  dtype: str | None = None,
) -> str:
  """Writes the actor (and the critic when `critic_out`) of a run with `config` in HF format.

  A run started from an HF checkpoint keeps that checkpoint's other config keys, tokenizer and
  generation config; a from-scratch run gets the tokenizer files from `tokenizer_dir`. Each role is written
  whole (`RoleState.merged`): with LoRA base + adapters merged (a critic's with its trained value head), and
  the actor's adapters also alone in `out_dir`/lora_adapter in PEFT's layout
  (`peft.PeftModel.from_pretrained(base, that_dir)`).
  """
  actor_model = config.actor_rollout_ref.model
  model_config = model_config_from(actor_model)
  merged = actor.merged(model_config.lora_alpha)
  save_hf_checkpoint(merged, model_config, out_dir, head="lm", dtype=dtype, source_dir=actor_model.path or None)
  save_peft_adapter(  # nothing without LoRA
    actor.adapters,
    model_config,
    os.path.join(out_dir, LORA_ADAPTER_DIR),
    base_model_name_or_path=hub_id_of(actor_model.path) or actor_model.path,
  )
  if not actor_model.path and tokenizer_dir and os.path.isdir(tokenizer_dir):
    copy_tokenizer_files(tokenizer_dir, out_dir)
  if critic_out:
    if critic is None:
      raise CheckpointError("the run has no critic (critic.enable was off)")
    critic_config = critic_config_from(config, model_config)
    save_hf_checkpoint(
      critic.merged(critic_config.lora_alpha, head="value"),
      critic_config,
      critic_out,
      head="value",
      dtype=dtype,
      source_dir=config.critic.model.path or actor_model.path or None,
    )
  return out_dir


def saved_roles(state: dict) -> tuple[RoleState, RoleState | None]:
  """The actor's and the critic's (None: the run had none) states in a checkpoint's tree (`read_checkpoint`), as
  saved (`RoleState.saved`): frozen params that `whole_actor` / `whole_critic` rebuild are left out."""
  critic = state.get("critic")
  return RoleState.from_saved(state["actor"]), RoleState.from_saved(critic) if critic else None


def whole_actor(actor: RoleState, config) -> RoleState:
  """A checkpoint's actor with its frozen params: a LoRA run's base, rebuilt from its source."""
  return actor.with_frozen(lambda: actor_base_params(config, model_config_from(config.actor_rollout_ref.model)))


def whole_critic(critic: RoleState, config) -> RoleState:
  """A checkpoint's critic with its frozen params: a LoRA critic's backbone, rebuilt from its source (its saved
  trained part holds the adapters and the value head)."""

  def backbone():
    critic_config = critic_config_from(config, model_config_from(config.actor_rollout_ref.model))
    return split_value_head(critic_base_params(config, critic_config))[0]

  return critic.with_frozen(backbone)
