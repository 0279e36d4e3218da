"""Export a training checkpoint's actor (and critic) as Hugging Face checkpoints.

    python -m jaxrlhf.export --checkpoint runs/proj/exp/global_step_40 --out exported/actor \
        [--critic_out exported/critic] [--dtype bfloat16] [--overwrite] [-v]

The actor is written as a causal LM (config.json + safetensors) that
`transformers.AutoModelForCausalLM.from_pretrained` loads (a LoRA run's adapters merged in, and also
alone in PEFT's layout under `<out>/lora_adapter`); the critic as a token-classification
model with one label (verl's critic format; a LoRA critic's adapters merged in, with its trained value
head). When the run started from an HF checkpoint, that checkpoint's tokenizer and generation config
files are copied alongside (nothing else from it); the built-in tokenizer of a from-scratch run is copied
from the run directory.

An output directory that already holds files is refused unless `--overwrite` is given (then its
config.json, weights and tokenizer files are replaced and any other file in it is left alone).
"""

from __future__ import annotations

import argparse
import os

import jax

from jaxrlhf import cli
from jaxrlhf.checkpoint import CheckpointError, read_checkpoint
from jaxrlhf.errors import UserError
from jaxrlhf.models import (
  Decoder,
  copy_tokenizer_files,
  critic_config_from,
  init_params,
  load_hf_params,
  model_config_from,
  save_hf_checkpoint,
)
from jaxrlhf.models.hub import hub_id_of, resolve_model_path
from jaxrlhf.models.lora import critic_params_with, merge_adapters, save_peft_adapter, split_value_head
from jaxrlhf.validate import check_writable

LORA_ADAPTER_DIR = "lora_adapter"  # under the export directory: a LoRA run's adapters in PEFT's layout


def init_keys(config):
  """(actor key, critic key) that a run's from-scratch weights are initialised with (`trainer.seed`)."""
  return tuple(jax.random.split(jax.random.key(config.trainer.seed)))


def actor_base_params(config, model_config, shardings=None):
  """The actor's weights a run starts from: its HF checkpoint, or initialised from `trainer.seed`.

  With LoRA these stay frozen (the base), so a checkpoint does not hold them: export rebuilds them here.
  """
  path = config.actor_rollout_ref.model.path
  if path:
    return load_hf_params(path, model_config, head="lm", shardings=shardings)
  init = lambda key: init_params(Decoder(model_config, head="lm"), key)[0]
  return jax.jit(init, out_shardings=shardings)(init_keys(config)[0])


def critic_base_params(config, critic_config, shardings=None):
  """The critic's weights a run starts from: its HF checkpoint (verl's critic format, or a causal LM whose
  value head is initialised fresh from `trainer.seed`), or all of it initialised from `trainer.seed`.

  With critic LoRA the backbone stays frozen, so a checkpoint does not hold it: export rebuilds it here.
  `shardings`: the whole critic's, value head included.
  """
  path = config.critic.model.path or config.actor_rollout_ref.model.path
  critic_key = init_keys(config)[1]
  if path:
    return load_hf_params(path, critic_config, head="value", shardings=shardings, rng=critic_key)
  init = lambda key: init_params(Decoder(critic_config, head="value"), key)[0]
  return jax.jit(init, out_shardings=shardings)(critic_key)


def write_hf(
  actor_params,
  config,
  out_dir: str,
  *,
  actor_adapters=None,
  critic_params=None,
  critic_adapters=None,
  critic_out: str | None = None,
  tokenizer_dir: str | None = None,
  dtype: str | None = None,
) -> str:
  """Writes the actor (and the critic when `critic_out`) of a run with `config` in HF format.

  A run started from an HF checkpoint keeps that checkpoint's other config keys, tokenizer and
  generation config; a from-scratch run gets the tokenizer files from `tokenizer_dir`. With LoRA
  (`actor_adapters`) the weights written are base + adapters merged, and the adapters alone go to
  `out_dir`/lora_adapter in PEFT's layout (`peft.PeftModel.from_pretrained(base, that_dir)`). With critic
  LoRA (`critic_adapters`: {"lora", "head"}) `critic_params` is the frozen backbone and the critic written
  is backbone + adapters merged + the trained value head.
  """
  actor_model = config.actor_rollout_ref.model
  model_config = model_config_from(actor_model)
  merged = merge_adapters(actor_params, actor_adapters, model_config.lora_alpha)
  save_hf_checkpoint(merged, model_config, out_dir, head="lm", dtype=dtype, source_dir=actor_model.path or None)
  if actor_adapters is not None:
    save_peft_adapter(
      actor_adapters,
      model_config,
      os.path.join(out_dir, LORA_ADAPTER_DIR),
      base_model_name_or_path=hub_id_of(actor_model.path) or actor_model.path,
    )
  if not actor_model.path and tokenizer_dir and os.path.isdir(tokenizer_dir):
    copy_tokenizer_files(tokenizer_dir, out_dir)
  if critic_out:
    if critic_params is None:
      raise CheckpointError("the run has no critic (critic.enable was off)")
    critic_config = critic_config_from(config, model_config)
    if critic_adapters is not None:
      critic_params = critic_params_with(critic_params, critic_adapters, critic_config.lora_alpha)
    save_hf_checkpoint(
      critic_params,
      critic_config,
      critic_out,
      head="value",
      dtype=dtype,
      source_dir=config.critic.model.path or actor_model.path or None,
    )
  return out_dir


def check_out_dir(flag: str, path: str, overwrite: bool) -> None:
  """Refuses to write into a directory that holds files, unless `overwrite`, or one that cannot be written."""
  if os.path.exists(path) and not os.path.isdir(path):
    raise UserError(f"{flag} {path!r} is a file, not a directory")
  check_writable(f"{flag} {path!r}", path)
  if os.path.isdir(path) and os.listdir(path) and not overwrite:
    shown = sorted(os.listdir(path))
    raise UserError(
      f"{flag} {path!r} is not empty (it holds {', '.join(shown[:4])}"
      f"{', ...' if len(shown) > 4 else ''}); nothing was written",
      hint="pick a new directory, or pass --overwrite to replace its config.json, weights and "
      "tokenizer files (other files are left alone)",
    )


def export_checkpoint(
  step_dir: str, out_dir: str, critic_out: str | None = None, dtype: str | None = None, overwrite: bool = False
):
  for flag, path in (("--out", out_dir), ("--critic_out", critic_out)):
    if path:
      check_out_dir(flag, path, overwrite)
  state, _, config = read_checkpoint(step_dir, key="--checkpoint")
  # The run's model paths: a snapshot in another machine's hub cache is fetched here (weights only for a LoRA
  # run, whose frozen base is rebuilt from them).
  actor, critic = state["actor"], state.get("critic")
  lora = bool(actor.get("adapters") or (critic and critic.get("adapters")))
  for key, section in (
    ("actor_rollout_ref.model.path", config.actor_rollout_ref.model),
    ("critic.model.path", config.critic.model),
  ):
    section.path = resolve_model_path(section.path, f"the checkpoint's {key}", weights=lora)
  if critic_out and not critic:
    raise CheckpointError(f"--critic_out: the run of --checkpoint {step_dir!r} has no critic (critic.enable was off)")
  tokenizer_dir = os.path.join(os.path.dirname(os.path.abspath(step_dir)), "tokenizer")
  actor_params, actor_adapters = checkpoint_actor(state, config)
  critic_params, critic_adapters = checkpoint_critic(state, config) if critic_out else (None, None)
  return write_hf(
    actor_params,
    config,
    out_dir,
    actor_adapters=actor_adapters,
    critic_params=critic_params,
    critic_adapters=critic_adapters,
    critic_out=critic_out,
    tokenizer_dir=tokenizer_dir,
    dtype=dtype,
  )


def checkpoint_actor(state: dict, config):
  """(params, adapters or None) of a checkpoint's actor; a LoRA run's base is rebuilt from its source."""
  adapters = state["actor"].get("adapters")
  if not adapters:
    return state["actor"]["params"], None
  return actor_base_params(config, model_config_from(config.actor_rollout_ref.model)), adapters


def checkpoint_critic(state: dict, config):
  """(params, trained part or None) of a checkpoint's critic; a LoRA critic's backbone is rebuilt from its
  source (its saved trained part holds the adapters and the value head)."""
  trained = state["critic"].get("adapters")
  if not trained:
    return state["critic"]["params"], None
  critic_config = critic_config_from(config, model_config_from(config.actor_rollout_ref.model))
  return split_value_head(critic_base_params(config, critic_config))[0], trained


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m jaxrlhf.export", description=__doc__.splitlines()[0])
  parser.add_argument("--checkpoint", required=True, help="a global_step_N checkpoint directory")
  parser.add_argument("--out", required=True, help="output directory for the actor (causal LM)")
  parser.add_argument("--critic_out", default=None, help="output directory for the critic (token classification)")
  parser.add_argument(
    "--dtype", default=None, choices=("float32", "bfloat16"), help="weights dtype (default: as trained)"
  )
  parser.add_argument(
    "--overwrite",
    action="store_true",
    help="write into non-empty output directories (replaces config.json, weights, tokenizer files)",
  )
  cli.add_verbose_flag(parser)
  args = parser.parse_args(argv)
  cli.run(
    parser.prog,
    export_checkpoint,
    args.checkpoint,
    args.out,
    args.critic_out,
    args.dtype,
    args.overwrite,
    verbose=args.verbose,
  )
  print(f"exported {args.checkpoint} -> {args.out}" + (f", critic -> {args.critic_out}" if args.critic_out else ""))


if __name__ == "__main__":
  main()
