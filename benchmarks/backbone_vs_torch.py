"""Per-FLOP speed of this CPU for the work an update does: jaxrlhf (XLA:CPU) against torch (TRL's side).

`vs_trl.py` times whole RL steps; where its ratio moves from one CPU to another, this says why. It times
one backbone forward + backward (the sum of the final hidden states as the loss, no head) of the same
local HF checkpoint on the same [rows, tokens] batch, fp32, two threads, in separate processes that
alternate, and one GEMM of the update's most common shape ([tokens, hidden] x [hidden, intermediate]):
- `torch`: `transformers`' Qwen2 model in eager mode, in the TRL venv `vs_trl.py` makes (torch's CPU
  GEMMs are oneDNN / MKL);
- `jaxrlhf` variants: the layer scan with and without gradient checkpointing (`vs_trl.py` checkpoints),
  a Python loop of layers (`scan_layers=False`), and XLA:CPU's YNNPACK dot fusions turned off (XLA_FLAGS).

    python benchmarks/backbone_vs_torch.py [--model 21.7M | --model_dir HF_DIR] [--rounds 3] [--reps 8] [--rows 8]
        [--tokens 128] [--results NAME]

GFLOP/s are model FLOPs (`jaxrlhf.trainer.flops.update_flops`, checkpointing's recomputed forward not
counted) over the median time. Writes benchmarks/results/backbone_vs_torch.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name -> (jaxrlhf model overrides, XLA_FLAGS); "torch" is the other side.
VARIANTS = {
  "torch": None,
  "jaxrlhf scan": ({"scan_layers": True, "remat_policy": "none"}, ""),
  "jaxrlhf scan + checkpointing": ({"scan_layers": True, "remat_policy": "full"}, ""),
  "jaxrlhf loop": ({"scan_layers": False, "remat_policy": "none"}, ""),
  "jaxrlhf loop + checkpointing": ({"scan_layers": False, "remat_policy": "full"}, ""),
  "jaxrlhf scan + checkpointing, no YNN dots": (
    {"scan_layers": True, "remat_policy": "full"},
    "--xla_cpu_experimental_ynn_fusion_type=",
  ),
}


def _time(fn, reps: int) -> list[float]:
  fn()  # compile / warm up
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return times


def jax_worker(model_dir: str, overrides: dict, rows: int, tokens: int, reps: int) -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np

  from jaxrlhf.models.decoder import Decoder
  from jaxrlhf.models.hf_io import load_hf_config, load_hf_params
  from jaxrlhf.trainer.flops import update_flops

  config = load_hf_config(model_dir, attention_impl="xla", **overrides)
  params = load_hf_params(model_dir, config)
  model = Decoder(config, head="lm")
  ids = jnp.asarray(np.random.RandomState(0).randint(2, config.vocab_size, (rows, tokens)), jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(tokens), (rows, tokens))
  mask = jnp.ones((rows, tokens), bool)

  def loss(p):
    hidden, _ = model.apply({"params": p}, ids, positions, mask, return_hidden=True)
    return jnp.sum(hidden)

  grad = jax.jit(jax.grad(loss))
  a = jnp.ones((rows * tokens, config.hidden_size), jnp.float32)
  b = jnp.ones((config.hidden_size, config.intermediate_size), jnp.float32)
  gemm = jax.jit(lambda a, b: a @ b)
  flops = update_flops(
    config, prompt_tokens=rows * tokens, response_tokens=0, num_sequences=rows, epochs=1, head="value"
  )
  return {
    "fwd_bwd_s": _time(lambda: jax.block_until_ready(grad(params)), reps),
    "gemm_s": _time(lambda: jax.block_until_ready(gemm(a, b)), reps * 4),
    "model_flops": flops,
    "gemm_flops": 2.0 * a.shape[0] * a.shape[1] * b.shape[1],
  }


def torch_worker(model_dir: str, rows: int, tokens: int, reps: int) -> dict:
  import torch
  from transformers import AutoModelForCausalLM

  torch.set_num_threads(2)
  backbone = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).model
  config = backbone.config
  ids = torch.randint(2, config.vocab_size, (rows, tokens), generator=torch.Generator().manual_seed(0))

  def step():
    backbone.zero_grad(set_to_none=True)
    backbone(input_ids=ids).last_hidden_state.sum().backward()

  a = torch.ones(rows * tokens, config.hidden_size)
  b = torch.ones(config.hidden_size, config.intermediate_size)
  return {"fwd_bwd_s": _time(step, reps), "gemm_s": _time(lambda: a @ b, reps * 4)}


def run_variant(name: str, args) -> dict:
  worker_args = [
    "--worker",
    name,
    "--model_dir",
    args.model_dir,
    "--rows",
    str(args.rows),
    "--tokens",
    str(args.tokens),
    "--reps",
    str(args.reps),
  ]
  env = dict(os.environ, PYTHONPATH=ROOT)
  if name == "torch":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import vs_trl

    python = vs_trl.trl_python(vs_trl.TRL_VERSIONS["grpo"])
  else:
    python = sys.executable
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=VARIANTS[name][1])
  out = subprocess.run(
    [python, os.path.abspath(__file__), *worker_args], env=env, check=True, capture_output=True, text=True
  ).stdout
  return json.loads(out.strip().splitlines()[-1])


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--model", default="21.7M", help="a model name of vs_trl.py (built there on first use)")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--reps", type=int, default=8, help="timed forward + backward passes per process")
  parser.add_argument("--rows", type=int, default=8)
  parser.add_argument("--tokens", type=int, default=128)
  parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
  parser.add_argument("--worker", choices=list(VARIANTS))
  parser.add_argument("--model_dir", help="a local HF checkpoint instead of a vs_trl.py model")
  parser.add_argument("--results", default="backbone_vs_torch", help="results file name (benchmarks/results)")
  args = parser.parse_args()
  if args.worker == "torch":
    print(json.dumps(torch_worker(args.model_dir, args.rows, args.tokens, args.reps)))
    return
  if args.worker:
    print(json.dumps(jax_worker(args.model_dir, VARIANTS[args.worker][0], args.rows, args.tokens, args.reps)))
    return

  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import vs_trl

  if args.model_dir:  # a local HF checkpoint, e.g. SmolLM2 as benchmarks/real_model.py fetches it
    args.model = os.path.basename(os.path.normpath(args.model_dir))
  else:
    work_dir = os.path.join(vs_trl.VENVS, "work")
    vs_trl.prepare(work_dir, [args.model])
    args.model_dir = os.path.join(work_dir, f"model_{args.model}")
  runs = []
  for round_index in range(args.rounds):
    order = args.variants if round_index % 2 == 0 else args.variants[::-1]  # alternate who goes first
    for name in order:
      result = run_variant(name, args)
      result.update(variant=name, round=round_index, load=vs_trl.load_average())
      runs.append(result)
      print(
        json.dumps({k: (round(statistics.median(v), 4) if isinstance(v, list) else v) for k, v in result.items()}),
        flush=True,
      )
  flops = next(r for r in runs if "model_flops" in r)
  table = []
  for name in args.variants:
    mine = [r for r in runs if r["variant"] == name]
    fwd_bwd = statistics.median(statistics.median(r["fwd_bwd_s"]) for r in mine)
    gemm = statistics.median(min(r["gemm_s"]) for r in mine)
    table.append(
      {
        "variant": name,
        "fwd_bwd_s": round(fwd_bwd, 4),
        "fwd_bwd_gflops": round(flops["model_flops"] / fwd_bwd / 1e9, 1),
        "gemm_gflops": round(flops["gemm_flops"] / gemm / 1e9, 1),
        "rounds_s": [round(statistics.median(r["fwd_bwd_s"]), 3) for r in mine],
      }
    )
  settings = {k: getattr(args, k) for k in ("model", "rounds", "reps", "rows", "tokens", "variants")}
  vs_trl.write_results(args.results, settings, table=table, runs=runs)
  print("| side | fwd+bwd s (rounds) | model GFLOP/s | GEMM GFLOP/s (best) |")
  print("|---|---|---|---|")
  for r in table:
    print(
      f"| {r['variant']} | {r['fwd_bwd_s']} ({', '.join(map(str, r['rounds_s']))}) | {r['fwd_bwd_gflops']} | "
      f"{r['gemm_gflops']} |"
    )


if __name__ == "__main__":
  main()
