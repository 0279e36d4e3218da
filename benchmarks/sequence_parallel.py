"""Sequence parallelism: per-device memory of the actor's training phase as Ulysses sp grows (issue 19).

Qwen2.5-7B GRPO (`configs/grpo_gsm8k_qwen2_5_7b.py`) on one 8xH100 node (`h100x8`, mesh.fsdp=8), prompts
of 512 and responses of R tokens, one sequence per sequence-parallel group per micro-batch
(`ppo_micro_batch_size_per_gpu=1`, no token budget), compiled ahead of time on this CPU like
`python -m jaxrlhf.aot`. Only the `update_actor` phase is compiled (the forward + backward over
micro-batches and the optimizer step): its inputs are traced abstractly through the earlier phases.
sp=1 puts 8 sequences (one per GPU) in a micro-batch, sp=s puts 8/s, each split over s GPUs.

    python benchmarks/sequence_parallel.py [--response 16384] [--sp 1 2 4] [--packed]

Writes benchmarks/results/sequence_parallel.json and prints the markdown table for benchmarks/README.md.
Needs the `aot` extra (`pip install -e '.[aot]'`).
"""

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from jaxrlhf.aot.targets import parse_target, prepare_environment  # noqa: E402

GIB = 1024**3


def measure(sp: int, response: int, packed: bool, target) -> dict:
  import jax

  from jaxrlhf.aot.compile import _device_bytes, build_abstract_program, compile_program
  from jaxrlhf.config import load_config_file
  from jaxrlhf.parallel import batch_sharding, replicated
  from jaxrlhf.trainer import update_loop

  config = load_config_file(os.path.join(ROOT, "configs", "grpo_gsm8k_qwen2_5_7b.py"))
  config.actor_rollout_ref.model.path = os.path.join(ROOT, "configs", "models", "qwen2.5-7b-instruct")
  config.data.max_response_length = response
  config.data.train_batch_size = 8
  config.actor_rollout_ref.rollout.n = 1
  actor = config.actor_rollout_ref.actor
  actor.ppo_mini_batch_size = 8
  actor.ppo_micro_batch_size_per_gpu = 1
  actor.use_dynamic_bsz = False
  actor.ulysses_sequence_parallel_size = sp
  config.actor_rollout_ref.model.use_remove_padding = packed
  config.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu = 1
  program = build_abstract_program(config, target.devices())
  ppo, state, mesh = program.ppo, program.abstract_state, program.mesh
  rng = jax.random.key(0)
  # The update's inputs, traced (not compiled) through the phases before it, in the batch layout.
  rollout = jax.eval_shape(ppo.rollout, state.actor.weights, program.abstract_batch(8), rng)
  scored = jax.eval_shape(ppo.score, rollout, state.reward_params)
  old = jax.eval_shape(ppo.old_log_prob, state.actor.weights, rollout)
  ref = jax.eval_shape(ppo.ref_log_prob, state.ref_params, rollout) if ppo.plan.ref_phase else None
  adv = jax.eval_shape(ppo.advantages, state, rollout, scored, old, ref, None)
  data = jax.eval_shape(update_loop.update_data, rollout, old, ref, adv)
  data = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=batch_sharding(mesh, x.shape)), data)
  rng = jax.ShapeDtypeStruct((), rng.dtype, sharding=replicated(mesh))
  report, _ = compile_program("update_actor", jax.jit(ppo.update_actor), (state, data, rng), resident_bytes=0)
  return {
    "sp": sp,
    "response_length": response,
    "prompt_length": config.data.max_prompt_length,
    "packed": packed,
    "mesh": dict(mesh.shape),
    "target": target.name,
    "rows_per_micro_batch": ppo.batcher.update_plan(actor, "actor_rollout_ref.actor", 0, packed).rows,
    "temp_bytes": report.temp_bytes,
    "argument_bytes": report.argument_bytes,
    "output_bytes": report.output_bytes,
    "alias_bytes": report.alias_bytes,
    "train_state_bytes": _device_bytes(state),
    "compile_s": round(report.compile_seconds, 1),
    "largest_buffers": [[size, shape, label] for size, shape, label in report.largest_buffers[:4]],
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--response", type=int, default=16384)
  parser.add_argument("--sp", type=int, nargs="+", default=[1, 2, 4])
  parser.add_argument("--packed", action="store_true", help="use_remove_padding=True (packed rows)")
  parser.add_argument("--target", default="h100x8")
  parser.add_argument("--results", default="sequence_parallel")
  args = parser.parse_args()
  target = parse_target(args.target)
  prepare_environment(target)
  rows = []
  for sp in args.sp:
    start = time.perf_counter()
    row = measure(sp, args.response, args.packed, target)
    print(f"sp={sp}: temp {row['temp_bytes'] / GIB:.2f} GiB/device ({time.perf_counter() - start:.0f} s)", flush=True)
    rows.append(row)
  path = os.path.join(ROOT, "benchmarks", "results", f"{args.results}.json")
  with open(path, "w") as f:
    json.dump(rows, f, indent=1)
  print(
    "\n| sp | rows per micro-batch | tokens per GPU per micro-batch | temp GiB/device | args GiB/device "
    "| compile s |\n|---|---|---|---|---|---|"
  )
  for row in rows:
    tokens = row["rows_per_micro_batch"] * (row["prompt_length"] + row["response_length"]) // 8
    print(
      f"| {row['sp']} | {row['rows_per_micro_batch']} | {tokens} | {row['temp_bytes'] / GIB:.2f} "
      f"| {row['argument_bytes'] / GIB:.2f} | {row['compile_s']} |"
    )


if __name__ == "__main__":
  main()
