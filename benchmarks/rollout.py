"""Rollout throughput: jaxrlhf `generate` vs Hugging Face transformers `generate`, side by side.

    python benchmarks/rollout.py [--batches 1 8 32] [--dtypes float32 bfloat16] [--prompt_len 128]
        [--new_tokens 256] [--skip_hf]

One random ~25M-parameter Qwen2-shaped model is saved in HF format and loaded by both sides (ours
through `jaxrlhf.models.load_hf_params`), so weights and prompts are identical. Each dtype runs both
sides in that dtype: HF `from_pretrained(dtype=...)`, ours with the weights cast once and the model's
compute dtype set (what `actor_rollout_ref.rollout.dtype` does in the trainer). Both decode greedily
and produce exactly `new_tokens` tokens (HF: min_new_tokens = max_new_tokens; ours: an EOS id outside
the vocabulary). Each side runs once to warm up, then the best of two timed runs counts; compile
time is measured apart. The roofline measures this machine's matmul FLOP/s (per dtype, as XLA runs
it: bf16 x bf16 -> fp32) and memory bandwidth, and bounds a decode step by
max(2 * params * batch / FLOP/s, (weight + KV-cache bytes) / bandwidth).

Prints a markdown table and writes benchmarks/results/rollout.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import platform
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

REPEATS = 2  # each side: the best of this many timed runs, after a warm-up run
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = dict(
  vocab_size=32000,
  hidden_size=384,
  intermediate_size=1024,
  num_hidden_layers=8,
  num_attention_heads=6,
  num_key_value_heads=2,
  max_position_embeddings=1024,
  tie_word_embeddings=True,
  rope_theta=1e6,
  rms_norm_eps=1e-6,
  bos_token_id=None,
  eos_token_id=None,
  pad_token_id=0,
)


def measure_roofline(dtype: str, seconds: float = 1.0):
  """(matmul FLOP/s in `dtype`, memory bandwidth bytes/s) of this machine, measured with XLA ops."""
  n = 1024
  a = jnp.ones((n, n), dtype)
  matmul = jax.jit(lambda a: jnp.matmul(a, a, preferred_element_type=jnp.float32))
  matmul(a).block_until_ready()
  count, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    matmul(a).block_until_ready()
    count += 1
  flops = 2 * n**3 * count / (time.perf_counter() - start)
  big = jnp.ones((64 * 2**20,), jnp.float32)  # 256 MiB: far beyond the caches
  reduce = jax.jit(lambda x: jnp.sum(x))
  reduce(big).block_until_ready()
  count, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    reduce(big).block_until_ready()
    count += 1
  bandwidth = big.nbytes * count / (time.perf_counter() - start)
  return flops, bandwidth


def build_checkpoint(path: str):
  import torch
  import transformers

  torch.manual_seed(0)
  model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**MODEL)).eval()
  model.save_pretrained(path)
  return sum(p.numel() for p in model.parameters())


def run_hf(path: str, prompts_BxP: np.ndarray, new_tokens: int, dtype: str) -> tuple[float, np.ndarray]:
  import torch
  import transformers

  model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
  ids = torch.tensor(prompts_BxP, dtype=torch.long)
  kwargs = dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0, eos_token_id=1)
  with torch.no_grad():
    model.generate(
      ids[:, :8], max_new_tokens=2, min_new_tokens=2, **{**kwargs, "attention_mask": torch.ones_like(ids[:, :8])}
    )
    seconds = []
    for _ in range(REPEATS):
      start = time.perf_counter()
      out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kwargs)
      seconds.append(time.perf_counter() - start)
  return min(seconds), out[:, prompts_BxP.shape[1] :].numpy()


def run_jax(path: str, prompts_BxP: np.ndarray, new_tokens: int, dtype: str) -> tuple[float, float, np.ndarray]:
  from jaxrlhf.models import Decoder, cast_floating, load_hf_config, load_hf_params
  from jaxrlhf.models.decoding import decode_model
  from jaxrlhf.rollout import SamplingParams, generate

  config = dataclasses.replace(load_hf_config(path), dtype=dtype)
  params = cast_floating(load_hf_params(path, config), dtype)
  model = Decoder(config)
  sampling = SamplingParams(
    max_new_tokens=new_tokens, eos_token_ids=(config.vocab_size,), pad_token_id=0, do_sample=False
  )
  fn = jax.jit(functools.partial(generate, decode_model(model), sampling=sampling))
  ids = jnp.asarray(prompts_BxP)
  mask = jnp.ones_like(ids)
  start = time.perf_counter()
  compiled = fn.lower(params, prompt_ids_BxP=ids, prompt_mask_BxP=mask, rng=jax.random.key(0)).compile()
  compile_s = time.perf_counter() - start
  jax.block_until_ready(compiled(params, prompt_ids_BxP=ids, prompt_mask_BxP=mask, rng=jax.random.key(0)))  # warm-up
  seconds = []
  for _ in range(REPEATS):
    start = time.perf_counter()
    out = compiled(params, prompt_ids_BxP=ids, prompt_mask_BxP=mask, rng=jax.random.key(0))
    responses = np.asarray(jax.block_until_ready(out)["responses"])
    seconds.append(time.perf_counter() - start)
  return min(seconds), compile_s, responses


def roofline_tokens_per_s(
  num_params: int, batch: int, prompt_len: int, new_tokens: int, flops: float, bandwidth: float, dtype: str
) -> float:
  """Best possible new tokens/s of a decode step bounded by compute or by reading weights + mean KV cache."""
  cfg = MODEL
  head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
  mean_context = prompt_len + new_tokens / 2
  width = np.dtype(jnp.dtype(dtype)).itemsize
  kv_bytes = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * width * mean_context * batch
  step_s = max(2 * num_params * batch / flops, (width * num_params + kv_bytes) / bandwidth)
  return batch / step_s


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
  parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
  parser.add_argument("--prompt_len", type=int, default=128)
  parser.add_argument("--new_tokens", type=int, default=256)
  parser.add_argument("--skip_hf", action="store_true")
  parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "rollout.json"))
  args = parser.parse_args()

  import torch

  torch.set_num_threads(os.cpu_count() or 1)
  machine = {}
  for dtype in args.dtypes:
    flops, bandwidth = measure_roofline(dtype)
    machine[dtype] = dict(matmul_flops=flops, bandwidth_bytes_per_s=bandwidth)
    print(
      f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
      f"matmul {flops / 1e9:.1f} GFLOP/s {dtype}, memory {bandwidth / 1e9:.1f} GB/s"
    )
  rows = []
  with tempfile.TemporaryDirectory() as path:
    num_params = build_checkpoint(path)
    print(f"model: Qwen2-shaped, {num_params / 1e6:.1f}M parameters, jax {jax.__version__}, torch {torch.__version__}")
    for dtype in args.dtypes:
      for batch in args.batches:
        prompts_BxP = np.random.RandomState(batch).randint(2, MODEL["vocab_size"], (batch, args.prompt_len))
        jax_s, compile_s, jax_tokens = run_jax(path, prompts_BxP, args.new_tokens, dtype)
        new = batch * args.new_tokens
        row = dict(
          dtype=dtype,
          batch=batch,
          jax_tokens_per_s=new / jax_s,
          jax_seconds=jax_s,
          compile_seconds=compile_s,
          roofline_tokens_per_s=roofline_tokens_per_s(
            num_params,
            batch,
            args.prompt_len,
            args.new_tokens,
            machine[dtype]["matmul_flops"],
            machine[dtype]["bandwidth_bytes_per_s"],
            dtype,
          ),
        )
        row["roofline_fraction"] = row["jax_tokens_per_s"] / row["roofline_tokens_per_s"]
        if not args.skip_hf:
          hf_s, hf_tokens = run_hf(path, prompts_BxP, args.new_tokens, dtype)
          row.update(
            hf_tokens_per_s=new / hf_s,
            hf_seconds=hf_s,
            speedup=hf_s / jax_s,
            greedy_tokens_match=float(np.mean(hf_tokens == jax_tokens)),
          )
        rows.append(row)
        print(json.dumps(row))

  print(
    "\n| dtype | batch | jaxrlhf tok/s | HF tok/s | speed-up | compile s | roofline tok/s | of roofline | "
    "same greedy tokens |"
  )
  print("|---|---|---|---|---|---|---|---|---|")
  for r in rows:
    print(
      f"| {r['dtype']} | {r['batch']} | {r['jax_tokens_per_s']:.0f} | "
      f"{r.get('hf_tokens_per_s', float('nan')):.0f} | "
      f"{r.get('speedup', float('nan')):.1f}x | {r['compile_seconds']:.1f} | {r['roofline_tokens_per_s']:.0f} | "
      f"{100 * r['roofline_fraction']:.0f}% | {100 * r.get('greedy_tokens_match', float('nan')):.0f}% |"
    )
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(
      dict(
        machine=dict(cores=os.cpu_count(), **machine),
        model=dict(MODEL, num_params=num_params),
        prompt_len=args.prompt_len,
        new_tokens=args.new_tokens,
        rows=rows,
      ),
      f,
      indent=1,
    )


if __name__ == "__main__":
  main()
