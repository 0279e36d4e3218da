"""LoRA generation: merge the adapters into the weights once per rollout, or decode with them unmerged?

    PYTHONPATH=. JAX_PLATFORMS=cpu python benchmarks/lora_generation.py [--json benchmarks/results/lora_generation.json]

Times one rollout (prompts x n sampled to max_new_tokens, no EOS) of a small decoder on this machine's
default device, both ways, after a warm-up compile: "merged" includes the merge (W + A B alpha / r for
every targeted kernel) inside the timed program, as the trainer's generation phase does it; "unmerged"
applies x W + (x A) B alpha / r in every targeted linear of every decode step. The trainer merges
(`trainer/generation.py`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import jax
import jax.numpy as jnp

from jaxrlhf.models.decoder import Decoder, DecoderConfig, init_adapters, init_params, model_variables
from jaxrlhf.models.decoding import decode_model
from jaxrlhf.models.lora import merge_adapters
from jaxrlhf.rollout import SamplingParams, generate


def _nudged(adapters):
  return jax.tree.map(lambda x: x + 0.01, adapters)  # B nonzero: the unmerged path cannot skip anything


def measure(config: DecoderConfig, batch: int, prompt_len: int, new_tokens: int, repeats: int = 3) -> dict:
  model = Decoder(config)
  params, _ = init_params(model, jax.random.key(0))
  adapters = _nudged(init_adapters(model, jax.random.key(1))[0])
  sampling = SamplingParams(max_new_tokens=new_tokens, eos_token_ids=(-1,), pad_token_id=0)
  prompts = jax.random.randint(jax.random.key(2), (batch, prompt_len), 1, config.vocab_size)
  mask = jnp.ones_like(prompts)

  def rollout(merged: bool):
    def run(params, adapters, rng):
      if merged:
        merged_params = merge_adapters(params, adapters, config.lora_alpha)
        return generate(decode_model(model), merged_params, prompts, mask, rng, sampling)["responses"]
      unmerged = decode_model(model, lambda p: model_variables(p, adapters))
      return generate(unmerged, params, prompts, mask, rng, sampling)["responses"]

    return jax.jit(run)

  results = {}
  for name, merged in (("merged", True), ("unmerged", False)):
    program = rollout(merged)
    jax.block_until_ready(program(params, adapters, jax.random.key(3)))  # compile
    times = []
    for i in range(repeats):
      start = time.perf_counter()
      jax.block_until_ready(program(params, adapters, jax.random.key(4 + i)))
      times.append(time.perf_counter() - start)
    results[name] = min(times)
  return results


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--json", default=None)
  args = parser.parse_args()
  base = DecoderConfig(
    vocab_size=1024,
    hidden_size=256,
    intermediate_size=1024,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    lora_alpha=16.0,
  )
  rows = []
  for rank in (8, 32):
    config = dataclasses.replace(base, lora_rank=rank)
    seconds = measure(config, batch=32, prompt_len=32, new_tokens=64)
    rows.append(
      {
        "device": jax.devices()[0].device_kind,
        "hidden": base.hidden_size,
        "layers": base.num_hidden_layers,
        "rank": rank,
        "batch": 32,
        "prompt": 32,
        "new_tokens": 64,
        **seconds,
        "unmerged_over_merged": seconds["unmerged"] / seconds["merged"],
      }
    )
    print(json.dumps(rows[-1]))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=2)


if __name__ == "__main__":
  main()
