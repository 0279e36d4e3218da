"""PPO step throughput on this machine: fused (one program) vs phased (one program per phase).

Target (issue 7): fused >= phased in tokens/s/device. Reports tokens/s/device, MFU (actor FLOPs over
step time x measured peak), and the phased mode's per-phase breakdown, for a ~25M and a ~100M
parameter Qwen2-shaped decoder (vocab 32000) on the built-in task with 64-token responses.

    python benchmarks/ppo_step.py [--sizes 25M 100M] [--steps 3] [--response_length 64]

Writes benchmarks/results/ppo_step.json and prints a markdown table for benchmarks/README.md.
"""

import argparse
import json
import os
import statistics
import tempfile

import jax

from jaxrlhf.config import load_config_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = {  # hidden, intermediate, layers, heads, kv heads
  "25M": (384, 1024, 6, 6, 2),
  "100M": (768, 2048, 8, 12, 4),
}
PHASES = ("gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor")


def quickstart_config():
  return load_config_file(os.path.join(ROOT, "configs", "quickstart.py"))


def run(size: str, fused: bool, steps: int, response_length: int, run_dir: str) -> dict:
  from jaxrlhf.trainer import Trainer

  hidden, intermediate, layers, heads, kv_heads = SIZES[size]
  config = quickstart_config()
  model = config.actor_rollout_ref.model.override_config
  model.vocab_size, model.hidden_size, model.intermediate_size = 32000, hidden, intermediate
  model.num_hidden_layers, model.num_attention_heads, model.num_key_value_heads = layers, heads, kv_heads
  model.tie_word_embeddings, model.max_position_embeddings = True, 256
  config.data.max_response_length = response_length
  config.data.train_batch_size, config.actor_rollout_ref.rollout.n = 8, 2
  config.actor_rollout_ref.actor.ppo_mini_batch_size = 4
  config.trainer.fuse_step = fused
  config.trainer.default_local_dir = run_dir
  config.trainer.logger = ("jsonl",)
  trainer = Trainer(config)
  records = [trainer.train_step(step) for step in range(steps)]
  steady = records[1:]
  result = {
    "size": size,
    "mode": "fused" if fused else "phased",
    "params": trainer.actor_num_params,
    "first_step_s (compile)": round(records[0]["timing_s/step"], 2),
    "step_s": round(statistics.median(r["timing_s/step"] for r in steady), 3),
    "tokens_per_s_per_device": round(statistics.median(r["perf/throughput"] for r in steady), 1),
    # fused: the whole step's MFU (no update-phase time); phased: the actor update's, as verl
    "mfu": round(statistics.median(r["perf/mfu/step" if fused else "perf/mfu/actor"] for r in steady), 4),
    "peak_flops_per_device": trainer.peak_flops,
  }
  if not fused:
    result["phases_s"] = {p: round(statistics.median(r.get(f"timing_s/{p}", 0.0) for r in steady), 3) for p in PHASES}
  return result


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--sizes", nargs="+", default=list(SIZES))
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--response_length", type=int, default=64)
  args = parser.parse_args()
  results = []
  with tempfile.TemporaryDirectory() as tmp:
    for size in args.sizes:
      for fused in (True, False):
        result = run(size, fused, args.steps, args.response_length, os.path.join(tmp, f"{size}{fused}"))
        print(json.dumps(result), flush=True)
        results.append(result)
  machine = f"{os.cpu_count()} CPU cores, jax {jax.__version__}, {jax.devices()[0].device_kind}"
  os.makedirs(os.path.join(ROOT, "benchmarks", "results"), exist_ok=True)
  with open(os.path.join(ROOT, "benchmarks", "results", "ppo_step.json"), "w") as f:
    json.dump({"machine": machine, "results": results}, f, indent=2)
  print(f"\n{machine}\n")
  print("| model | mode | step s | tokens/s/device | MFU | compile s |")
  print("|---|---|---|---|---|---|")
  for r in results:
    print(
      f"| {r['size']} ({r['params'] / 1e6:.0f}M) | {r['mode']} | {r['step_s']} | {r['tokens_per_s_per_device']} "
      f"| {r['mfu']:.2%} | {r['first_step_s (compile)']} |"
    )
  by = {(r["size"], r["mode"]): r for r in results}
  for size in args.sizes:
    ratio = by[(size, "fused")]["tokens_per_s_per_device"] / by[(size, "phased")]["tokens_per_s_per_device"]
    print(
      f"\n{size}: fused / phased throughput = {ratio:.2f}x; phased breakdown (s): {by[(size, 'phased')]['phases_s']}"
    )


if __name__ == "__main__":
  main()
