"""Gated DeltaNet (Qwen3.5's linear attention) on CPU: the chunked form against the recurrent form over a long sequence.

    python benchmarks/hybrid_attention.py [--length 4096] [--chunk 64] [--results NAME]

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


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--length", type=int, default=4096)
  parser.add_argument("--chunk", type=int, default=64)
  parser.add_argument("--results", default="hybrid_attention")
  args = parser.parse_args()
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
