"""Qwen3.5's hybrid layers: generation memory against a dense model (AOT), and Gated DeltaNet's two forms on CPU.

    python benchmarks/hybrid_attention.py [--only cpu|aot] [--length 4096] [--chunk 64] [--results NAME]

AOT (`--only aot`, needs the `aot` extra): the generation phase alone (`python -m jaxrlhf.aot --only gen`) of the
GRPO recipe (`configs/grpo_gsm8k_qwen3_5_4b.py`: 256 prompts x 5, 160 rows per H100 of h100x8, prompts of 512) with
Qwen3.5-9B and with Qwen3-8B, at 4k, 16k and 32k response tokens: the generation cache per device (the layout
report's: KV cache, plus the recurrent state of the 24 Gated DeltaNet layers for Qwen3.5) and the compiled phase's
per-device memory. Writes benchmarks/results/<NAME>_aot.json.

CPU (`--only cpu`):

The chunked form (`models/gated_deltanet.chunk_gated_delta_rule`) is what training, prefill and log-prob forwards
run; the recurrent form (`recurrent_gated_delta_rule`) is a decode step's, one token at a time. Over a whole sequence
the chunked form should be much faster (matmuls over chunks instead of L rank-1 updates in a scan); both must give the
same output (the max difference is reported). Shapes: Qwen3.5's layer (16 key heads, 32 value heads, key and value
head dim 128), batch 1; the forward and the forward + backward, each compiled once, best of 3.

Writes benchmarks/results/<NAME>.json (default hybrid_attention.json) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np

from jaxrlhf.models.gated_deltanet import chunk_gated_delta_rule, recurrent_gated_delta_rule

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _inputs(length: int, key_heads=16, value_heads=32, key_dim=128, value_dim=128, seed=0):
  keys = jax.random.split(jax.random.key(seed), 5)
  q = jax.random.normal(keys[0], (1, length, key_heads, key_dim))
  k = jax.random.normal(keys[1], (1, length, key_heads, key_dim))
  v = jax.random.normal(keys[2], (1, length, value_heads, value_dim))
  g = -jax.nn.softplus(jax.random.normal(keys[3], (1, length, value_heads)))
  beta = jax.nn.sigmoid(jax.random.normal(keys[4], (1, length, value_heads)))
  return q, k, v, g, beta


def _best_of(fn, args, repeats=3) -> tuple[float, float]:
  start = time.perf_counter()
  jax.block_until_ready(fn(*args))
  compile_s = time.perf_counter() - start
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - start)
  return compile_s, best


AOT_MODELS = (("Qwen3.5-9B", "qwen3.5-9b"), ("Qwen3-8B", "qwen3-8b"))
AOT_LENGTHS = (4096, 16384, 32768)
PROMPT = 512


def _aot_gen(model_dir: str, response: int) -> dict:
  """The gen phase of the GRPO recipe with `model_dir` at `response` tokens on h100x8: the cache line of the layout
  report and the compiled program's per-device bytes."""
  with tempfile.TemporaryDirectory() as tmp:
    report = os.path.join(tmp, "report.json")
    command = [
      sys.executable,
      "-m",
      "jaxrlhf.aot",
      "--config",
      os.path.join(ROOT, "configs", "grpo_gsm8k_qwen3_5_4b.py"),
      f"--config.actor_rollout_ref.model.path={os.path.join(ROOT, 'configs', 'models', model_dir)}",
      f"--config.data.max_response_length={response}",
      f"--config.actor_rollout_ref.actor.ppo_max_token_len_per_gpu={PROMPT + response}",
      "--target",
      "h100x8",
      "--only",
      "gen",
      "--json",
      report,
    ]
    run = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if not os.path.exists(report):
      raise RuntimeError(f"{' '.join(command)} failed:\n{run.stderr[-3000:]}")
    with open(report) as f:
      data = json.load(f)
  cache = re.search(r"(KV cache(?: \+ recurrent state)?) ([\d.]+) GiB", run.stdout)
  gen = next(p for p in data["programs"] if p["name"] == "gen")
  return dict(
    cache_label=cache.group(1),
    cache_gib=float(cache.group(2)),
    gen_gib=gen["total_bytes"] / 2**30,
    fits=data["fits"],
    compile_s=gen["compile_seconds"],
  )


def aot_main(results: str):
  rows = []
  for label, model_dir in AOT_MODELS:
    for response in AOT_LENGTHS:
      rows.append(dict(model=label, response=response, **_aot_gen(model_dir, response)))
      print(rows[-1], flush=True)
  print("\n| model | response tokens | generation cache GiB/device | gen phase GiB/device | fits an H100 |")
  print("|---|---|---|---|---|")
  for r in rows:
    fits = "yes" if r["fits"] else "**no**"
    print(f"| {r['model']} | {r['response']} | {r['cache_gib']:.1f} | {r['gen_gib']:.1f} | {fits} |")
  with open(os.path.join(ROOT, "benchmarks", "results", f"{results}_aot.json"), "w") as f:
    json.dump(dict(jax=jax.__version__, target="h100x8", rows_per_device=160, prompt=PROMPT, rows=rows), f, indent=1)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--only", choices=("cpu", "aot"), default=None)
  parser.add_argument("--length", type=int, default=4096)
  parser.add_argument("--chunk", type=int, default=64)
  parser.add_argument("--results", default="hybrid_attention")
  args = parser.parse_args()
  if args.only != "cpu":
    aot_main(args.results)
  if args.only != "aot":
    cpu_main(args)


def cpu_main(args):
  inputs = _inputs(args.length)
  forms = {
    "chunked": lambda *x: chunk_gated_delta_rule(*x, chunk_size=args.chunk),
    "recurrent": lambda *x: recurrent_gated_delta_rule(*x),
  }
  rows, outputs = [], {}
  for name, form in forms.items():
    forward = jax.jit(lambda *x, form=form: form(*x)[0])
    loss = jax.jit(jax.grad(lambda q, k, v, g, beta, form=form: form(q, k, v, g, beta)[0].sum(), argnums=(0, 1, 2)))
    outputs[name] = np.asarray(forward(*inputs))
    for label, fn in (("forward", forward), ("forward + backward", loss)):
      compile_s, seconds = _best_of(fn, inputs)
      rows.append(dict(form=name, pass_=label, seconds=seconds, compile_s=compile_s))
      print(rows[-1], flush=True)
  difference = float(np.abs(outputs["chunked"] - outputs["recurrent"]).max())
  result = dict(
    length=args.length,
    chunk=args.chunk,
    cpu=platform.processor() or platform.machine(),
    jax=jax.__version__,
    rows=rows,
    max_abs_difference=difference,
  )
  print("\n| form | pass | seconds (best of 3) | compile s |\n|---|---|---|---|")
  for r in rows:
    print(f"| {r['form']} | {r['pass_']} | {r['seconds']:.3f} | {r['compile_s']:.1f} |")
  for label in ("forward", "forward + backward"):
    chunked, recurrent = (next(r["seconds"] for r in rows if r["form"] == f and r["pass_"] == label) for f in forms)
    print(f"{label}: recurrent / chunked = {recurrent / chunked:.1f}x")
  print(f"max |chunked - recurrent| = {difference:.2e}")
  with open(os.path.join(ROOT, "benchmarks", "results", f"{args.results}.json"), "w") as f:
    json.dump(result, f, indent=1)


if __name__ == "__main__":
  main()
