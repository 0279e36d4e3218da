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

from jaxrlhf import cli
from jaxrlhf.checkpoint import CheckpointError, read_checkpoint
from jaxrlhf.errors import UserError
from jaxrlhf.models.hub import resolve_model_path
from jaxrlhf.trainer.hf_weights import saved_roles, whole_actor, whole_critic, write_hf
from jaxrlhf.validate import check_writable


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
  actor, critic = saved_roles(state)
  # The run's model paths: a snapshot in another machine's hub cache is fetched here (weights only when a role's
  # frozen params are rebuilt from them).
  weights = any(role.rebuilds_frozen for role in (actor, critic) if role is not None)
  for key, section in (
    ("actor_rollout_ref.model.path", config.actor_rollout_ref.model),
    ("critic.model.path", config.critic.model),
  ):
    section.path = resolve_model_path(section.path, f"the checkpoint's {key}", weights=weights)
  if critic_out and critic is None:
    raise CheckpointError(f"--critic_out: the run of --checkpoint {step_dir!r} has no critic (critic.enable was off)")
  tokenizer_dir = os.path.join(os.path.dirname(os.path.abspath(step_dir)), "tokenizer")
  return write_hf(
    whole_actor(actor, config),
    config,
    out_dir,
    critic=whole_critic(critic, config) if critic_out else None,
    critic_out=critic_out,
    tokenizer_dir=tokenizer_dir,
    dtype=dtype,
  )


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
