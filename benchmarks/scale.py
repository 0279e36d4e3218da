"""Scale: the recipes users run, compiled ahead of time for the targets they run on (`python -m jaxrlhf.aot`).

One row per (recipe, target): per-device GiB of the compiled step, whether it fits the device, the
step's FLOPs (analytic, all devices), compile seconds on this machine. Then two sweeps:
- per-device bytes of the train state (parameters + optimizer state) as `mesh.fsdp` grows 1 -> 8 -> 64
  (should fall as 1/fsdp; no compile needed, the layouts alone give it);
- compile seconds of the same step with 4, 32 and 80 decoder layers (a loop over layers would keep it flat).

    python benchmarks/scale.py [--only recipes|fsdp|layers] [--timeout 1800] [--results NAME]
        [--extra=--config.actor_rollout_ref.model.attention_impl=xla ...]

Writes benchmarks/results/<NAME>.json (default scale.json) and prints markdown tables for
benchmarks/README.md. `--extra` adds a config override to every compile (a before/after variant: e.g.
`scan_layers=False` or `attention_impl=xla` on the actor and critic).
Needs the `aot` extra (`pip install -e '.[aot]'`).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "configs", "models")

# (row label, recipe, model directory under configs/models, target, extra overrides)
RECIPES = [
  ("Qwen2.5-0.5B PPO", "ppo_gsm8k_qwen2_5_0_5b.py", "qwen2.5-0.5b-instruct", "h100x8", ()),
  ("Qwen2.5-7B PPO", "ppo_gsm8k_qwen2_5_7b.py", "qwen2.5-7b-instruct", "h100x8", ()),
  (
    "Qwen2.5-7B GRPO, response 4096",
    "grpo_gsm8k_qwen2_5_7b.py",
    "qwen2.5-7b-instruct",
    "h100x8",
    ("--config.data.max_response_length=4096",),
  ),
  ("Qwen2.5-32B GRPO", "grpo_gsm8k_qwen2_5_32b.py", "qwen2.5-32b-instruct", "h100:4x8", ()),
  ("Qwen2.5-72B GRPO", "grpo_gsm8k_qwen2_5_72b.py", "qwen2.5-72b-instruct", "h200:8x8", ()),
  ("Llama-3.1-8B PPO", "ppo_gsm8k_llama3_1_8b.py", "llama-3.1-8b-instruct", "v5p-64", ()),
]
LAYER_COUNTS = (4, 32, 80)
FSDP_SIZES = (1, 8, 64)


def aot(recipe: str, model: str, target: str, extra=(), timeout: float = 1800) -> dict:
  """Runs the CLI as a user would; returns its JSON report (+ exit status), or why there is none."""
  with tempfile.TemporaryDirectory() as tmp:
    json_path = os.path.join(tmp, "report.json")
    command = [
      sys.executable,
      "-m",
      "jaxrlhf.aot",
      "--config",
      os.path.join(ROOT, "configs", recipe),
      f"--config.actor_rollout_ref.model.path={os.path.join(MODELS, model)}",
      "--target",
      target,
      "--json",
      json_path,
      *extra,
    ]
    try:
      result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
      return {"error": f"compile did not finish within {timeout:.0f} s"}
    if not os.path.exists(json_path):
      return {"error": (result.stderr.strip().splitlines() or ["no output"])[-1], "returncode": result.returncode}
    with open(json_path) as f:
      report = json.load(f)
    report["returncode"] = result.returncode
    report["stdout"] = result.stdout  # the printed report: layouts, and the largest buffers of a misfit
    return report


def state_bytes(model: str, target: str, fsdp: int) -> dict:
  """Per-device bytes of the GRPO 7B recipe's train state with `mesh.fsdp=fsdp` (the rest on `data`)."""
  code = f"""
import json, sys
from jaxrlhf.aot.targets import parse_target, prepare_environment
target = parse_target({target!r}); prepare_environment(target)
from jaxrlhf.aot.compile import build_abstract_program
from jaxrlhf.config import load_config_file
from jaxrlhf.parallel.report import per_device_bytes
config = load_config_file({os.path.join(ROOT, 'configs', 'grpo_gsm8k_qwen2_5_7b.py')!r})
config.actor_rollout_ref.model.path = {os.path.join(MODELS, model)!r}
config.mesh.data, config.mesh.fsdp, config.mesh.tensor = -1, {fsdp}, 1
config.actor_rollout_ref.rollout.tensor_model_parallel_size = 1
program = build_abstract_program(config, target.devices())
state = program.abstract_state
print(json.dumps({{"params": per_device_bytes(state.actor.params), "optimizer": per_device_bytes(state.actor.opt_state),
                  "reference": per_device_bytes(state.ref_params) if state.ref_params is not None else 0}}))
"""
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
  if result.returncode:
    return {"error": result.stderr.strip().splitlines()[-1]}
  return json.loads(result.stdout.strip().splitlines()[-1])


def gib(n) -> str:
  return f"{n / 1024**3:.1f}"


def recipe_table(rows: list[dict]) -> str:
  lines = [
    "| recipe | target | per-device GiB (peak program) | device GiB | fits | step FLOPs (analytic) | compile s |",
    "|---|---|---|---|---|---|---|",
  ]
  for row in rows:
    report = row["report"]
    if "error" in report:
      lines.append(f"| {row['label']} | {row['target']} | - | - | error: {report['error']} | - | - |")
      continue
    peak = max(report["programs"], key=lambda p: p["total_bytes"])
    lines.append(
      f"| {row['label']} | {row['target']} | {gib(report['peak_bytes_per_device'])} ({peak['name']}) | "
      f"{gib(report['target']['device_memory_bytes'])} | {'yes' if report['fits'] else 'no'} | "
      f"{report['analytic_flops']['total']:.3g} | {report['compile_seconds']:.0f} |"
    )
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--only", choices=["recipes", "fsdp", "layers"], default=None)
  parser.add_argument("--timeout", type=float, default=1800)
  parser.add_argument("--results", default="scale", help="results file name under benchmarks/results/ (no .json)")
  parser.add_argument("--extra", action="append", default=[], help="a config override added to every compile")
  args = parser.parse_args()
  results_path = os.path.join(ROOT, "benchmarks", "results", f"{args.results}.json")
  results = json.load(open(results_path)) if os.path.exists(results_path) else {}
  if args.only in (None, "recipes"):
    rows = []
    for label, recipe, model, target, extra in RECIPES:
      report = aot(recipe, model, target, (*extra, *args.extra), args.timeout)
      print(
        f"{label} on {target}: "
        + (report.get("error") or f"{gib(report['peak_bytes_per_device'])} GiB, fits={report['fits']}"),
        flush=True,
      )
      rows.append(
        {"label": label, "recipe": recipe, "target": target, "overrides": [*extra, *args.extra], "report": report}
      )
    results["recipes"] = rows
    print(recipe_table(rows))
  if args.only in (None, "fsdp"):
    sweep = {fsdp: state_bytes("qwen2.5-7b-instruct", "h100:8x8", fsdp) for fsdp in FSDP_SIZES}
    results["fsdp"] = sweep
    print("| mesh.fsdp (data fills 64) | params GiB/device | optimizer GiB/device | reference GiB/device |")
    print("|---|---|---|---|")
    for fsdp, counts in sweep.items():
      if "error" in counts:
        print(f"| {fsdp} | error: {counts['error']} | | |")
      else:
        print(f"| {fsdp} | {gib(counts['params'])} | {gib(counts['optimizer'])} | {gib(counts['reference'])} |")
  if args.only in (None, "layers"):
    sweep = {}
    for layers in LAYER_COUNTS:
      report = aot(
        "grpo_gsm8k_qwen2_5_0_5b.py",
        "qwen2.5-0.5b-instruct",
        "h100x8",
        (f"--config.actor_rollout_ref.model.override_config.num_hidden_layers={layers}", *args.extra),
        args.timeout,
      )
      sweep[layers] = {
        "compile_seconds": report.get("compile_seconds"),
        "error": report.get("error"),
        "peak_bytes_per_device": report.get("peak_bytes_per_device"),
      }
      print(f"{layers} layers: {sweep[layers]}", flush=True)
    results["layers"] = sweep
  with open(results_path, "w") as f:
    json.dump(results, f, indent=2)


if __name__ == "__main__":
  main()
