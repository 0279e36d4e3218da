"""Rollout routing replay on a tiny random MoE (issue 47): the rollout-vs-training log-prob gap with and without replay.

The sampler (decode path: one token per step over the KV cache) and the training forward (all tokens at once) compute
the same model in different orders; in bf16 the router's logits differ by rounding, and a token whose top-k experts
are near a tie goes to other experts in the training forward than in the rollout. With replay
(`actor_rollout_ref.rollout.enable_rollout_routing_replay`) the training forward routes by the sampler's record.

Measured: verl's `training/rollout_probs_diff_{max,mean,std}` and `training/rollout_actor_probs_pearson_corr` over the
sampled tokens (`trainer.batch_metrics.rollout_probs_diff`), the share of (token, MoE layer) pairs the training
forward's own router routes elsewhere than the sampler did, and the same gap over the tokens whose routing differs in
some layer. Writes benchmarks/results/routing_replay.json.

  python benchmarks/routing_replay.py [--rows 64] [--new-tokens 48]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from jaxrlhf.models import Decoder, DecoderConfig, init_params
from jaxrlhf.models.decoding import decode_model
from jaxrlhf.models.moe import router_stats
from jaxrlhf.rollout import SamplingParams, generate, token_log_probs
from jaxrlhf.trainer.batch_metrics import rollout_probs_diff
from jaxrlhf.trainer.model_outputs import sequence_inputs

CONFIG = DecoderConfig(  # Qwen3-MoE's block at a tiny size: 16 experts, top-4, normalised top-k weights
  vocab_size=512,
  hidden_size=128,
  intermediate_size=256,
  moe_intermediate_size=64,
  num_hidden_layers=4,
  num_attention_heads=4,
  num_key_value_heads=2,
  head_dim=32,
  qk_norm=True,
  num_experts=16,
  num_experts_per_tok=4,
  norm_topk_prob=True,
  model_type="qwen3_moe",
)


def _params(config: DecoderConfig, seed: int, router_std: float):
  params, _ = init_params(Decoder(config), jax.random.key(seed))
  # a trained router is far from uniform: give the routers spread logits (init is ~uniform over the experts)
  kernel = params["layers"]["mlp"]["gate"]["kernel"]
  params["layers"]["mlp"]["gate"]["kernel"] = jax.random.normal(jax.random.key(seed + 1), kernel.shape) * router_std
  return params


def measure(rows: int, prompt_len: int, new_tokens: int, dtype: str, seed: int = 0, router_std: float = 0.5) -> dict:
  config = dataclasses.replace(CONFIG, dtype=dtype)
  params = _params(config, seed, router_std)
  rng = np.random.RandomState(seed)
  ids = jnp.asarray(rng.randint(1, config.vocab_size, (rows, prompt_len)), jnp.int32)
  mask = jnp.ones_like(ids)
  sampling = SamplingParams(max_new_tokens=new_tokens, eos_token_ids=(-1,), pad_token_id=0, temperature=1.0)
  sample = jax.jit(functools.partial(generate, decode_model(Decoder(config), record_routes=True), sampling=sampling))
  out = sample(params, ids, mask, jax.random.key(seed + 2))
  seq, positions, seq_mask = sequence_inputs(ids, mask, out["responses"])

  @jax.jit
  def training_forward(replay):
    (logits, _), variables = Decoder(config).apply(
      {"params": params}, seq, positions, seq_mask, replay_BxLxYxk=replay, mutable=["intermediates"]
    )
    log_probs = token_log_probs(logits[:, prompt_len - 1 : -1], out["responses"], 1.0)
    return log_probs, router_stats(variables["intermediates"])

  response_mask = out["response_mask"]
  plain, _ = training_forward(None)
  replayed, stats = training_forward(out["rollout_routes"])
  _, _, tokens, elsewhere = stats
  result = {"dtype": dtype, "rows": rows, "prompt_len": prompt_len, "new_tokens": new_tokens}
  result["pairs_routed_elsewhere"] = float(jnp.sum(elsewhere) / jnp.sum(tokens))
  for name, log_probs in (("without_replay", plain), ("with_replay", replayed)):
    gap = rollout_probs_diff(out["rollout_log_probs"], log_probs, response_mask)
    result[name] = {key.split("/")[-1]: float(value) for key, value in gap.items()}
    result[name]["log_prob_abs_diff_max"] = float(
      jnp.max(jnp.where(response_mask > 0, jnp.abs(out["rollout_log_probs"] - log_probs), 0.0))
    )
  return result


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rows", type=int, default=64)
  parser.add_argument("--prompt-len", type=int, default=16)
  parser.add_argument("--new-tokens", type=int, default=48)
  args = parser.parse_args()
  results = [measure(args.rows, args.prompt_len, args.new_tokens, dtype) for dtype in ("float32", "bfloat16")]
  print(json.dumps(results, indent=2))
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "routing_replay.json")
  with open(path, "w") as file:
    json.dump({"device": jax.devices()[0].device_kind, "results": results}, file, indent=2)
    file.write("\n")


if __name__ == "__main__":
  main()
