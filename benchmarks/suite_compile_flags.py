"""What the test suite's XLA flags cost and save: compile and step time of one fused PPO step per flag set.

    python benchmarks/suite_compile_flags.py [--config small|quickstart] [--steps 3]

Target (issue 30): `make test` in at most 25 minutes on a 2-core machine. Nearly all of a test's time is XLA
compiling programs it then runs a few times on tiny shapes, so the suite (tests/conftest.py) picks the flags that
compile fastest, and the commands tests start (learning runs of hundreds of steps) the ones that step fastest
(tests/helpers.py `subprocess_env`). Each flag set runs in its own process (XLA reads its flags once): build the
trainer on one CPU device, trace and lower its fused step, compile it (timed), then run the first step and
`--steps` more (timed). `pg_loss` after the steps shows the numerics move only by rounding.
Writes benchmarks/results/suite_compile_flags_<config>.json.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAG_SETS = {
  "XLA default (-O2, fusion emitters)": "",
  "-O1 (commands tests start)": "--xla_backend_optimization_level=1",
  "-O1, loop emitters": "--xla_backend_optimization_level=1 --xla_cpu_use_fusion_emitters=false",
  "-O0": "--xla_backend_optimization_level=0",
  "-O0, loop emitters (the suite's own process)": (
    "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
  ),
}


def measure(config_name: str, steps: int) -> dict:
  """In this process (XLA_FLAGS already set): compile and step times of `config_name`'s fused step."""
  import jax

  from jaxrlhf.config import load_config_file
  from jaxrlhf.trainer import Trainer

  sys.path.insert(0, ROOT)
  if config_name == "small":
    from tests.helpers import small_config

    config = small_config(tempfile.mkdtemp())
  else:
    config = load_config_file(os.path.join(ROOT, "configs", "quickstart.py"))
    config.trainer.default_local_dir = tempfile.mkdtemp()
  trainer = Trainer(config, devices=jax.devices()[:1])
  batch = trainer.train_batch(0)
  lowered = trainer.jitted_step.trace(trainer.state, batch, jax.random.key(0)).lower()
  start = time.perf_counter()
  lowered.compile()
  compile_s = time.perf_counter() - start
  start = time.perf_counter()
  trainer.train_step(0)  # compiles again (the jit's own cache), runs once
  first_s = time.perf_counter() - start
  start = time.perf_counter()
  for step in range(1, steps + 1):
    metrics = trainer.train_step(step)
  return {
    "compile_s": compile_s,
    "first_step_s": first_s,
    "step_s": (time.perf_counter() - start) / steps,
    "pg_loss": float(metrics["actor/pg_loss"]),
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", choices=("small", "quickstart"), default="small")
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--_measure", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args._measure:
    print(json.dumps(measure(args.config, args.steps)))
    return
  rows = {}
  print(f"| flags ({args.config} config, 1 CPU device) | compile s | step s | pg_loss after {args.steps + 1} steps |")
  print("|---|---|---|---|")
  for name, flags in FLAG_SETS.items():
    env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    out = subprocess.run(
      [sys.executable, __file__, "--_measure", "--config", args.config, "--steps", str(args.steps)],
      env=env,
      capture_output=True,
      text=True,
      check=True,
    ).stdout
    rows[name] = {"xla_flags": flags, **json.loads(out.strip().splitlines()[-1])}
    r = rows[name]
    print(f"| {name} | {r['compile_s']:.2f} | {r['step_s']:.3f} | {r['pg_loss']:.8g} |", flush=True)
  os.makedirs(os.path.join(ROOT, "benchmarks", "results"), exist_ok=True)
  with open(os.path.join(ROOT, "benchmarks", "results", f"suite_compile_flags_{args.config}.json"), "w") as f:
    json.dump(rows, f, indent=2)


if __name__ == "__main__":
  main()
