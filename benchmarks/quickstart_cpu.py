"""Quickstart wall-clock benchmark. Target (issue 2): `make train` under 5 minutes on a 2-core CPU,
compile included, with the greedy validation reward rising by >= 0.5.

    python benchmarks/quickstart_cpu.py [--steps N]

Prints and writes benchmarks/results/quickstart_cpu.json: set-up time, first-step time (compile),
median step time after it, tokens/s, validation time, total wall, and the reward at start and end.
"""

import argparse
import json
import os
import platform
import statistics
import tempfile
import time

import jax

from jaxrlhf.config import load_config_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--steps", type=int, default=300)
  args = parser.parse_args()
  config = load_config_file(os.path.join(ROOT, "configs", "quickstart.py"))
  config.trainer.total_training_steps = args.steps
  config.trainer.logger = ("jsonl",)
  config.trainer.plot = False

  from jaxrlhf.trainer import Trainer

  with tempfile.TemporaryDirectory() as run_dir:
    config.trainer.default_local_dir = run_dir
    start = time.perf_counter()
    trainer = Trainer(config)
    setup_s = time.perf_counter() - start
    t = time.perf_counter()
    val0 = trainer.validate()
    first_val_s = time.perf_counter() - t
    step_times, tokens = [], []
    for step in range(args.steps):
      metrics = trainer.train_step(step)
      step_times.append(metrics["timing_s/step"])
      tokens.append(metrics["perf/total_num_tokens"])
    t = time.perf_counter()
    val1 = trainer.validate()
    val_s = time.perf_counter() - t
    total_s = time.perf_counter() - start
  key = next(k for k in val0 if k.startswith("val-core/"))
  steady = step_times[1:]
  result = {
    "machine": f"{platform.machine()} {os.cpu_count()} cpus, jax {jax.__version__}, {jax.devices()[0].platform}",
    "steps": args.steps,
    "setup_s": round(setup_s, 2),
    "first_validation_s (compile)": round(first_val_s, 2),
    "first_step_s (compile)": round(step_times[0], 2),
    "median_step_s": round(statistics.median(steady), 4),
    "tokens_per_s": round(sum(tokens[1:]) / sum(steady), 1),
    "validation_s": round(val_s, 3),
    "total_s": round(total_s, 1),
    "target_total_s": 300,
    "val_reward_start": val0[key],
    "val_reward_end": val1[key],
  }
  print(json.dumps(result, indent=2))
  os.makedirs(os.path.join(ROOT, "benchmarks", "results"), exist_ok=True)
  with open(os.path.join(ROOT, "benchmarks", "results", "quickstart_cpu.json"), "w") as f:
    json.dump(result, f, indent=2)


if __name__ == "__main__":
  main()
