"""Long-tail rollouts: sync vs partial rollout vs one-step-off (`trainer.v1.trainer_mode`), side by side in one run.

    python benchmarks/long_tail.py [--steps 8] [--prompts 16] [--n 4] [--slots 64] [--results NAME]

Target (issue 51): >= 1.5x fewer decode loop steps per trained trajectory for partial rollout than sync.

The generation phase of `steps` trainer steps, each training `prompts` x n trajectories, with the weights fixed (what
is measured is the decode loop's work, which the weights do not change):
- sync: each step's batch decoded to its end in `slots` slots (`generate_in_slots`, the sync step's sampler with
  `rollout.max_num_seqs`);
- partial: `rollout/partial.py`'s pool with one warm-up batch, `stop="enough"`: a step decodes until `prompts` groups
  have finished and carries the rest (colocate_async, `partial_rollout=True`);
- one-step-off: the same pool, `stop="all"`: every admitted group to its end, the step trains on the previous
  step's batch (`partial_rollout=False`).

Length distribution: a random model (vocab 2048) whose EOS logit is raised so that a row stops with probability
1/`mean_length` per token: geometric lengths clipped at the limit, most responses short and a few at the limit, the
shape of GSM8K/DAPO rollouts (defaults: mean 32, limit 128: median ~22, ~1.8% of rows at the limit, and the longest
of a 64-row batch near the limit). Reported per mode: decode loop steps per trained trajectory, rows computed (loop
steps x slots) per trained token, wall time of the compiled generation per trained token (2-core CPU: a step's cost
follows the rows it computes; on a GPU it follows the loop steps), trained response tokens, staleness.
Each mode runs its steps twice; the second pass (compiled, same numbers) is timed.

Writes benchmarks/results/<NAME>.json (default long_tail.json) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def biased_model(mean_length: float):
  """A random decoder whose EOS (id 1) has probability ~1/mean_length per token."""
  from jaxrlhf.models import Decoder, DecoderConfig, init_params
  from jaxrlhf.models.decoding import decode_model

  config = DecoderConfig(
    vocab_size=2048,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
  )
  model = Decoder(config)
  params, _ = init_params(model, jax.random.key(0))
  stop = 1.0 / mean_length
  bias = math.log(stop * (config.vocab_size - 1) / (1 - stop))

  def apply_fn(p, ids, positions, kv_mask, cache=None, index=None):
    logits, cache = model.apply({"params": p}, ids, positions, kv_mask, cache, index)
    return logits.at[..., 1].add(bias), cache

  return dataclasses.replace(decode_model(model), apply=apply_fn), params


def batches(steps: int, prompts: int, prompt_len: int):
  """Batches 0 .. steps (one more than steps: the pool's warm-up batch), as the data path gives them."""
  out = []
  for b in range(steps + 1):
    ids = jax.random.randint(jax.random.key(100 + b), (prompts, prompt_len), 2, 2048)
    out.append((ids, jnp.ones_like(ids), jnp.arange(prompts, dtype=jnp.int32) + prompts * b))
  return out


def run_sync(model, params, data, sampling, n: int, slots: int, steps: int):
  from jaxrlhf.rollout import generate_in_slots

  @jax.jit
  def step(ids, mask, rng):
    out = generate_in_slots(
      model, params, jnp.repeat(ids, n, axis=0), jnp.repeat(mask, n, axis=0), rng, sampling, slots=slots
    )
    return out["num_steps"], out["response_mask"].sum()

  def one_pass():
    loop_steps, tokens = 0, 0
    for k in range(steps):
      s, t = jax.device_get(step(*data[k][:2], jax.random.fold_in(jax.random.key(7), k)))
      loop_steps, tokens = loop_steps + int(s), tokens + int(t)
    return loop_steps, tokens, [0.0]

  return one_pass


def run_pool(model, params, data, sampling, n: int, slots: int, steps: int, stop: str):
  from jaxrlhf.rollout import partial as pr

  prompts, prompt_len = data[0][0].shape
  need = prompts

  @jax.jit
  def step(pool, ids, mask, index, k):
    pool = pr.admit(pool, ids, mask, index, k, 0)
    pool, loop_steps, _ = pr.decode_pool(model, params, pool, jax.random.key(7), sampling, step=k, need=need, stop=stop)
    pool, taken = pr.take_trainable(pool, k, need)
    return pool, loop_steps, taken["response_mask"].sum(), taken["staleness"]

  def one_pass():
    pool = pr.empty_pool(
      model,
      groups=2 * prompts,
      n=n,
      prompt_len=prompt_len,
      response_len=sampling.max_new_tokens,
      slots=slots,
      pad_token_id=0,
    )
    pool = pr.admit(pool, *data[0], 0, 0)  # the warm-up batch
    loop_steps, tokens, staleness = 0, 0, []
    for k in range(steps):
      pool, s, t, stale = step(pool, *data[k + 1], jnp.int32(k))
      s, t, stale = jax.device_get((s, t, stale))  # the pool stays on the device
      loop_steps, tokens = loop_steps + int(s), tokens + int(t)
      staleness.extend(np.asarray(stale).tolist())
    return loop_steps, tokens, staleness

  return one_pass


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--steps", type=int, default=8)
  parser.add_argument("--prompts", type=int, default=16)
  parser.add_argument("--n", type=int, default=4)
  parser.add_argument("--slots", type=int, default=64)
  parser.add_argument("--prompt_len", type=int, default=16)
  parser.add_argument("--response_len", type=int, default=128)
  parser.add_argument("--mean_length", type=float, default=32.0)
  parser.add_argument("--results", default="long_tail")
  args = parser.parse_args()
  from jaxrlhf.rollout import SamplingParams

  model, params = biased_model(args.mean_length)
  sampling = SamplingParams(max_new_tokens=args.response_len, eos_token_ids=(1,), pad_token_id=0, decode_segments=1)
  data = batches(args.steps, args.prompts, args.prompt_len)
  common = (model, params, data, sampling, args.n, args.slots, args.steps)
  modes = {
    "sync": run_sync(*common),
    "partial": run_pool(*common, stop="enough"),
    "one-step-off": run_pool(*common, stop="all"),
  }
  trajectories = args.steps * args.prompts * args.n
  rows = []
  for name, one_pass in modes.items():
    one_pass()  # compiles
    start = time.perf_counter()
    loop_steps, tokens, staleness = one_pass()
    wall = time.perf_counter() - start
    rows.append(
      dict(
        mode=name,
        loop_steps=loop_steps,
        steps_per_trajectory=loop_steps / trajectories,
        rows_computed_per_token=loop_steps * args.slots / tokens,
        trained_tokens=tokens,
        wall_s=wall,
        ms_per_trained_token=1000 * wall / tokens,
        staleness_mean=float(np.mean(staleness)),
        staleness_max=int(np.max(staleness)),
      )
    )
    print(rows[-1], flush=True)
  sync = rows[0]
  for row in rows:
    row["fewer_steps_than_sync"] = sync["steps_per_trajectory"] / row["steps_per_trajectory"]
    row["faster_per_token_than_sync"] = sync["ms_per_trained_token"] / row["ms_per_trained_token"]
  print(
    "| mode | decode loop steps / trained trajectory | vs sync | rows computed / trained token | ms / trained token "
    "| vs sync | trained tokens | staleness mean / max |\n|---|---|---|---|---|---|---|---|"
  )
  for r in rows:
    print(
      f"| {r['mode']} | {r['steps_per_trajectory']:.3f} | {r['fewer_steps_than_sync']:.2f}x | "
      f"{r['rows_computed_per_token']:.2f} | {r['ms_per_trained_token']:.3f} | {r['faster_per_token_than_sync']:.2f}x "
      f"| {r['trained_tokens']} | {r['staleness_mean']:.2f} / {r['staleness_max']} |"
    )
  path = os.path.join(ROOT, "benchmarks", "results", f"{args.results}.json")
  with open(path, "w") as f:
    json.dump(dict(args=vars(args), device=str(jax.devices()[0].device_kind), modes=rows), f, indent=2)


if __name__ == "__main__":
  main()
