"""Generation in `rollout.max_num_seqs` slots against the whole batch at once: memory (AOT) and work (CPU).

    python benchmarks/rollout_slots.py [--only cpu|aot] [--phases] [--results NAME]

Targets (issue: generation memory bounded by `max_num_seqs`):
- AOT (`python -m jaxrlhf.aot`, per-device GiB of the fused step, and of the generation phase with
  `--phases`): Qwen2.5-7B GRPO at 4096 and 8192 response tokens on h100x8 and Qwen2.5-72B GRPO on h200:8x8,
  for max_num_seqs unset (the whole batch) and = the rows of a generation shard, 1/2, 1/4 of them. The 8192
  row must fit.
- CPU: one batch whose response lengths are skewed like GSM8K answers (most short, a few at the limit; a
  random model with its EOS logit raised so that a row stops with probability ~1/`mean` per token, lengths
  geometric and clipped at the limit). Static batch vs slots: loop steps, steps x slots (decode rows computed),
  useful tokens, slot utilization (useful / rows computed) and wall time of the compiled call (best of 3 after
  a warm-up). On a GPU a decode step costs about the same for any number of live rows (it reads the weights
  and the cache once), so there the wall time follows the loop steps, not the rows computed.

Writes benchmarks/results/<NAME>.json (default rollout_slots.json) and prints markdown tables.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

ROWS_PER_SHARD = 160  # the three recipes generate 256 prompts x 5 over 8 generation shards
# (label, recipe, model, target, overrides). At 8192 the recipe's micro-batch token budget (6144) is below one
# sequence (512 + 8192): one sequence per micro-batch.
AOT_ROWS = [
  (
    "Qwen2.5-7B GRPO, response 4096",
    "grpo_gsm8k_qwen2_5_7b.py",
    "qwen2.5-7b-instruct",
    "h100x8",
    ("--config.data.max_response_length=4096",),
  ),
  (
    "Qwen2.5-7B GRPO, response 8192",
    "grpo_gsm8k_qwen2_5_7b.py",
    "qwen2.5-7b-instruct",
    "h100x8",
    ("--config.data.max_response_length=8192", "--config.actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8704"),
  ),
  ("Qwen2.5-72B GRPO", "grpo_gsm8k_qwen2_5_72b.py", "qwen2.5-72b-instruct", "h200:8x8", ()),
]
SLOT_SETTINGS = [None, ROWS_PER_SHARD, ROWS_PER_SHARD // 2, ROWS_PER_SHARD // 4]
GIB = 2**30


def run_aot(phases: bool, only: str | None = None) -> list[dict]:
  from scale import aot  # benchmarks/scale.py: the CLI as a user runs it, its JSON report

  rows = []
  for label, recipe, model, target, overrides in AOT_ROWS:
    if only and only not in label:
      continue
    for slots in SLOT_SETTINGS:
      extra = list(overrides)
      if slots is not None:
        extra.append(f"--config.actor_rollout_ref.rollout.max_num_seqs={slots}")
      row = dict(recipe=label, target=target, max_num_seqs=slots)
      for mode in ("fused", "phases") if phases else ("fused",):
        report = aot(recipe, model, target, tuple(extra) + (("--phases",) if mode == "phases" else ()))
        if "error" in report:
          row[f"{mode}_error"] = report["error"]
          continue
        if mode == "fused":
          row.update(
            fused_gib=report["peak_bytes_per_device"] / GIB,
            fits=report["fits"],
            compile_s=report["compile_seconds"],
            largest=[(b["shape"], round(b["bytes"] / GIB, 2)) for b in report["programs"][0]["largest_buffers"][:3]],
            kv_cache_gib=_kv_cache_gib(report.get("stdout", "")),
          )
        else:
          gen = next(p for p in report["programs"] if p["name"] == "gen")
          row.update(
            gen_gib=gen["total_bytes"] / GIB,
            gen_largest=[(b["shape"], round(b["bytes"] / GIB, 2)) for b in gen["largest_buffers"][:3]],
          )
      print(row, flush=True)
      rows.append(row)
  return rows


def _kv_cache_gib(stdout: str):
  """The start-up report's 'KV cache N GiB' (per device)."""
  for part in stdout.split(","):
    if "KV cache" in part:
      return part.strip()
  return None


# ----- CPU: slot utilization on skewed lengths ---------------------------------------------------------------


def run_cpu(rows: int, prompt_len: int, response_len: int, mean_length: float, seed: int) -> list[dict]:
  from jaxrlhf.models import Decoder, DecoderConfig, init_params
  from jaxrlhf.models.decoding import decode_model
  from jaxrlhf.rollout import SamplingParams, generate, generate_in_slots, row_keys

  config = DecoderConfig(
    vocab_size=2048,
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
  )
  eos = 1
  model = Decoder(config)
  params, _ = init_params(model, jax.random.key(0))
  # A random model's logits are nearly uniform: this EOS bias makes P(EOS) ~ 1 / mean_length per token.
  stop = 1.0 / mean_length
  bias = math.log(stop * (config.vocab_size - 1) / (1 - stop))

  def apply_fn(p, ids, positions, kv_mask, cache=None, index=None):
    logits, cache = model.apply({"params": p}, ids, positions, kv_mask, cache, index)
    return logits.at[..., eos].add(bias), cache

  biased = dataclasses.replace(decode_model(model), apply=apply_fn)

  prompts = jax.random.randint(jax.random.key(1), (rows, prompt_len), 2, config.vocab_size)
  mask = jnp.ones((rows, prompt_len), jnp.int32)
  sampling = SamplingParams(max_new_tokens=response_len, eos_token_ids=(eos,), pad_token_id=0, decode_segments=1)
  rng = jax.random.key(seed)
  keys = row_keys(rng, rows)
  variants = [("static batch", None)] + [(f"{s} slots", s) for s in (rows // 2, rows // 4, rows // 8)]
  results, reference = [], None
  for label, slots in variants:
    if slots is None:
      fn = jax.jit(functools.partial(generate, biased, sampling=sampling))
      call = lambda fn=fn: fn(params, prompt_ids_BxP=prompts, prompt_mask_BxP=mask, rng=keys)
      computed_per_step = rows
    else:
      fn = jax.jit(functools.partial(generate_in_slots, biased, sampling=sampling, slots=slots))
      call = lambda fn=fn: fn(params, prompt_ids_NxP=prompts, prompt_mask_NxP=mask, rng=rng)
      computed_per_step = slots
    out = jax.device_get(call())  # warm-up (and compile)
    times = []
    for _ in range(3):
      start = time.perf_counter()
      jax.block_until_ready(call())
      times.append(time.perf_counter() - start)
    lengths = out["response_lengths"]
    if reference is None:
      reference = out["responses"]
    steps = int(out["num_steps"])
    useful = int(lengths.sum())
    results.append(
      dict(
        variant=label,
        slots=computed_per_step,
        steps=steps,
        rows_computed=steps * computed_per_step,
        useful_tokens=useful,
        utilization=useful / (steps * computed_per_step),
        wall_s=min(times),
        same_responses=bool(np.array_equal(out["responses"], reference)),
        lengths=dict(
          mean=float(lengths.mean()), median=float(np.median(lengths)), at_limit=int((lengths == response_len).sum())
        ),
      )
    )
    print(results[-1], flush=True)
  return results


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--only", choices=("cpu", "aot"))
  parser.add_argument("--phases", action="store_true", help="also compile phase by phase (the gen phase's GiB)")
  parser.add_argument("--rows", type=int, default=128)
  parser.add_argument("--prompt_len", type=int, default=32)
  parser.add_argument("--response_len", type=int, default=160)
  parser.add_argument("--mean_length", type=float, default=48.0)
  parser.add_argument("--recipe", help="AOT: only the rows whose label contains this")
  parser.add_argument("--results", default="rollout_slots")
  args = parser.parse_args()
  path = os.path.join(ROOT, "benchmarks", "results", f"{args.results}.json")
  results = json.load(open(path)) if os.path.exists(path) else {}
  if args.only in (None, "cpu"):
    results["cpu"] = dict(
      args=dict(
        rows=args.rows, prompt_len=args.prompt_len, response_len=args.response_len, mean_length=args.mean_length
      ),
      rows=run_cpu(args.rows, args.prompt_len, args.response_len, args.mean_length, seed=0),
    )
    print("\n| variant | slots | loop steps | rows computed | useful tokens | utilization | wall s |")
    print("|---|---|---|---|---|---|---|")
    for r in results["cpu"]["rows"]:
      print(
        f"| {r['variant']} | {r['slots']} | {r['steps']} | {r['rows_computed']} | {r['useful_tokens']} | "
        f"{r['utilization']:.0%} | {r['wall_s']:.2f} |"
      )
  if args.only in (None, "aot"):
    done = [r for r in results.get("aot", []) if args.recipe and args.recipe not in r["recipe"]]
    results["aot"] = done + run_aot(args.phases, args.recipe)
    print("\n| recipe | target | max_num_seqs | fused GiB | gen GiB | fits | KV cache (report) |")
    print("|---|---|---|---|---|---|---|")
    for r in results["aot"]:
      gen = f"{r['gen_gib']:.1f}" if "gen_gib" in r else "-"
      fused = f"{r['fused_gib']:.1f}" if "fused_gib" in r else r.get("fused_error", "-")
      print(
        f"| {r['recipe']} | {r['target']} | {r['max_num_seqs'] or 'unset (batch)'} | {fused} | {gen} | "
        f"{r.get('fits', '-')} | {r.get('kv_cache_gib')} |"
      )
  with open(path, "w") as f:
    json.dump(results, f, indent=1)


if __name__ == "__main__":
  main()
