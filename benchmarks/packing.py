"""Packing that never costs (issue 20): the old-log-prob phase and the actor update, padded vs packed
(`use_remove_padding`), on uniform full-length sequences (nothing to remove) and on varied lengths.

Target: packed <= padded (within noise) on uniform lengths, and faster where lengths vary.

    python benchmarks/packing.py [--rounds 3] [--dynamic_bsz]

The 21.7M-parameter Qwen2-shaped model of benchmarks/vs_trl.py (vocab 32000, hidden 384, 6 layers), fp32,
16 sequences of 64 prompt + 64 response tokens, mini-batches of 8, micro-batches of 4 sequences (or the
token budget of 4 sequences with --dynamic_bsz). Runs alternate padded / packed per round; medians.
Writes benchmarks/results/packing.json.
"""

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxrlhf.config import get_base_config, resolve_config  # noqa: E402
from jaxrlhf.models import Decoder, DecoderConfig  # noqa: E402
from jaxrlhf.models.decoder import init_params  # noqa: E402
from jaxrlhf.parallel import StepLayouts  # noqa: E402
from jaxrlhf.trainer import PPOStep  # noqa: E402
from jaxrlhf.trainer.records import Rollout  # noqa: E402
from jaxrlhf.trainer.state import RoleState, TrainState, make_optimizer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT_LEN = RESPONSE_LEN = 64
ROWS = 16
MODEL = DecoderConfig(
  vocab_size=32000,
  hidden_size=384,
  intermediate_size=1024,
  num_hidden_layers=6,
  num_attention_heads=6,
  num_key_value_heads=2,
  tie_word_embeddings=True,
)


def make_step(packed: bool, dynamic_bsz: bool) -> PPOStep:
  config = get_base_config()
  config.data.train_batch_size, config.data.max_prompt_length = ROWS // 2, PROMPT_LEN
  config.data.max_response_length = RESPONSE_LEN
  actor = config.actor_rollout_ref.actor
  actor.ppo_mini_batch_size, actor.ppo_micro_batch_size_per_gpu, actor.ppo_epochs = 4, 2, 1
  actor.use_dynamic_bsz, actor.ppo_max_token_len_per_gpu = dynamic_bsz, 4 * (PROMPT_LEN + RESPONSE_LEN)
  config.actor_rollout_ref.model.use_remove_padding = packed
  config.actor_rollout_ref.rollout.n = 2
  config.critic.enable = False
  config.algorithm.adv_estimator = "grpo"
  config = resolve_config(config)
  optimizers = {
    "actor": make_optimizer(config.actor_rollout_ref.actor.optim, 1.0),
    "critic": make_optimizer(config.critic.optim, 1.0),
  }
  constant = lambda step: jnp.float32(1e-6)
  return PPOStep(
    config,
    MODEL,
    reward_fn=None,
    eos_token_ids=(1,),
    pad_token_id=0,
    lr_schedules={"actor": constant, "critic": constant},
    optimizers=optimizers,
    layouts=StepLayouts(),
  )


def make_rollout(uniform: bool, seed: int = 0) -> dict:
  """Left-padded prompts and right-padded responses: all full length, or lengths uniform in 1..max."""
  rng = np.random.default_rng(seed)
  prompt_lengths = np.full(ROWS, PROMPT_LEN) if uniform else rng.integers(8, PROMPT_LEN + 1, ROWS)
  response_lengths = np.full(ROWS, RESPONSE_LEN) if uniform else rng.integers(1, RESPONSE_LEN + 1, ROWS)
  prompt_mask = (np.arange(PROMPT_LEN)[None] >= PROMPT_LEN - prompt_lengths[:, None]).astype(np.int32)
  response_mask = (np.arange(RESPONSE_LEN)[None] < response_lengths[:, None]).astype(np.int32)
  prompts = rng.integers(2, MODEL.vocab_size, (ROWS, PROMPT_LEN)) * prompt_mask
  responses = rng.integers(2, MODEL.vocab_size, (ROWS, RESPONSE_LEN)) * response_mask
  as_jax = lambda x: jnp.asarray(x, jnp.int32)
  return {
    "prompts": as_jax(prompts),
    "prompt_mask": as_jax(prompt_mask),
    "responses": as_jax(responses),
    "response_mask": as_jax(response_mask),
  }


def programs(step: PPOStep, params, rollout):
  """(old_log_prob, update_actor) as jitted thunks over fixed inputs."""
  old_log_prob = jax.jit(step.old_log_prob)
  update = jax.jit(step.update_actor)
  weights = RoleState(params=params, opt_state=None)
  rows, width = rollout["responses"].shape
  record = Rollout(
    **rollout,
    rollout_log_probs=jnp.zeros((rows, width), jnp.float32),
    sample_index=jnp.arange(rows, dtype=jnp.int32),
    group_index=jnp.arange(rows, dtype=jnp.int32),
    decode_steps=jnp.int32(width),
  )
  log_probs = old_log_prob(weights, record).log_probs
  state = TrainState(
    step=jnp.int32(0),
    actor=weights.replace(opt_state=step.roles["actor"].tx.init(params)),
    critic=None,
    ref_params=None,
    reward_params=None,
    kl_coef=jnp.float32(0.0),
    lr_scale=jnp.float32(1.0),
  )
  advantages = jax.random.normal(jax.random.key(1), rollout["responses"].shape) * rollout["response_mask"]
  data = dict(rollout, old_log_probs=log_probs, advantages=advantages)
  return {
    "old_log_prob": lambda: old_log_prob(weights, record),
    "update_actor": lambda: update(state, data, jax.random.key(2)),
  }


def timed(thunk) -> float:
  start = time.perf_counter()
  jax.block_until_ready(thunk())
  return time.perf_counter() - start


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--dynamic_bsz", action="store_true")
  args = parser.parse_args()
  params = init_params(Decoder(MODEL, head="lm"), jax.random.key(0))[0]
  results = {}
  for uniform in (True, False):
    rollout = make_rollout(uniform)
    tokens = int(rollout["prompt_mask"].sum() + rollout["response_mask"].sum())
    runs = {
      mode: programs(make_step(mode == "packed", args.dynamic_bsz), params, rollout) for mode in ("padded", "packed")
    }
    for thunks in runs.values():
      for thunk in thunks.values():
        timed(thunk)  # compile
    seconds = {(mode, phase): [] for mode in runs for phase in runs[mode]}
    for _ in range(args.rounds):
      for mode, thunks in runs.items():  # alternating
        for phase, thunk in thunks.items():
          seconds[(mode, phase)].append(timed(thunk))
    lengths = "uniform" if uniform else "varied"
    for (mode, phase), values in seconds.items():
      results[f"{lengths}/{phase}/{mode}"] = round(statistics.median(values), 4)
    results[f"{lengths}/tokens"] = tokens
    print(json.dumps({k: v for k, v in results.items() if k.startswith(lengths)}), flush=True)
  print(f"\nload average: {os.getloadavg()}")
  print("| lengths | phase | padded s | packed s | packed / padded |")
  print("|---|---|---|---|---|")
  for lengths in ("uniform", "varied"):
    for phase in ("old_log_prob", "update_actor"):
      padded, packed = results[f"{lengths}/{phase}/padded"], results[f"{lengths}/{phase}/packed"]
      print(
        f"| {lengths} ({results[f'{lengths}/tokens']} tokens) | {phase} | {padded} | {packed} | {packed / padded:.2f} |"
      )
  os.makedirs(os.path.join(ROOT, "benchmarks", "results"), exist_ok=True)
  with open(os.path.join(ROOT, "benchmarks", "results", "packing.json"), "w") as f:
    json.dump({"dynamic_bsz": args.dynamic_bsz, "load_average": os.getloadavg(), "results": results}, f, indent=2)


if __name__ == "__main__":
  main()
