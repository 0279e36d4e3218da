"""Export a training checkpoint's actor (and critic) as Hugging Face checkpoints.

    python -m jaxrlhf.export --checkpoint runs/proj/exp/global_step_40 --out exported/actor \
        [--critic_out exported/critic] [--dtype bfloat16]

The actor is written as a causal LM (config.json + safetensors) that
`transformers.AutoModelForCausalLM.from_pretrained` loads; the critic as a token-classification
model with one label (verl's critic format). When the run started from an HF checkpoint, that
checkpoint's tokenizer and generation config are copied alongside; the built-in tokenizer of a
from-scratch run is copied from the run directory.
"""

from __future__ import annotations

import argparse
import os
import shutil

from jaxrlhf.checkpoint import CheckpointError, read_checkpoint
from jaxrlhf.models import model_config_from, save_hf_checkpoint


def write_hf(actor_params, config, out_dir: str, *, critic_params=None, critic_out: str | None = None,
             tokenizer_dir: str | None = None, dtype: str | None = None) -> str:
  """Writes the actor (and the critic when `critic_out`) of a run with `config` in HF format.

  A run started from an HF checkpoint keeps that checkpoint's other config keys, tokenizer and
  generation config; a from-scratch run gets the tokenizer files from `tokenizer_dir`.
  """
  actor_model = config.actor_rollout_ref.model
  model_config = model_config_from(actor_model)
  save_hf_checkpoint(actor_params, model_config, out_dir, head="lm", dtype=dtype, source_dir=actor_model.path or None)
  if not actor_model.path and tokenizer_dir and os.path.isdir(tokenizer_dir):
    for name in os.listdir(tokenizer_dir):
      shutil.copy(os.path.join(tokenizer_dir, name), out_dir)
  if critic_out:
    if critic_params is None:
      raise CheckpointError("the run has no critic (critic.enable was off)")
    critic_model = config.critic.model
    critic_config = model_config_from(critic_model) if critic_model.path else model_config
    save_hf_checkpoint(critic_params, critic_config, critic_out, head="value", dtype=dtype,
                       source_dir=critic_model.path or actor_model.path or None)
  return out_dir


def export_checkpoint(step_dir: str, out_dir: str, critic_out: str | None = None, dtype: str | None = None):
  state, _, config = read_checkpoint(step_dir)
  tokenizer_dir = os.path.join(os.path.dirname(os.path.abspath(step_dir)), "tokenizer")
  return write_hf(state["actor_params"], config, out_dir, critic_params=state.get("critic_params"),
                  critic_out=critic_out, tokenizer_dir=tokenizer_dir, dtype=dtype)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--checkpoint", required=True, help="a global_step_N checkpoint directory")
  parser.add_argument("--out", required=True, help="output directory for the actor (causal LM)")
  parser.add_argument("--critic_out", default=None, help="output directory for the critic (token classification)")
  parser.add_argument("--dtype", default=None, choices=("float32", "bfloat16"), help="weights dtype (default: as trained)")
  args = parser.parse_args(argv)
  try:
    export_checkpoint(args.checkpoint, args.out, args.critic_out, args.dtype)
  except (CheckpointError, ValueError) as e:
    parser.exit(2, f"jaxrlhf.export: error: {e}\n")
  print(f"exported {args.checkpoint} -> {args.out}" + (f", critic -> {args.critic_out}" if args.critic_out else ""))


if __name__ == "__main__":
  main()
