"""Generate from a Hugging Face checkpoint directory or a jaxrlhf training checkpoint.

    python -m jaxrlhf.generate --model PATH --prompts FILE --output OUT.jsonl [--max_new_tokens N]
        [--temperature T] (0 = greedy) [--top_p P] [--top_k K] [--n N] [--chat] [--seed S]
        [--dtype float32|bfloat16]

PATH: an HF directory (config.json + safetensors + tokenizer), a Hugging Face Hub model id such as
`Qwen/Qwen2.5-0.5B-Instruct` (from the hub cache, else downloaded: `jaxrlhf.models.hub`), or a run's
`global_step_N` directory (the tokenizer then comes from the run's model path, else the run's `tokenizer/`
folder).
FILE: a text file with one prompt per line, a .jsonl/.json file whose rows have a `prompt` field
(a string, or a verl list of chat messages, which always goes through the chat template), or a verl
.parquet file as the trainer reads it (its `prompt` column: chat messages). Text is tokenized as-is
(no special tokens added) unless --chat applies the tokenizer's chat template. The prompts are read
before the model is loaded, so a bad file fails at once; `-v` shows the traceback of an error.
Each output line: {"prompt", "sample", "response", "response_ids" (up to and including EOS),
"finish_reason" ("stop" | "length")}. Prompts are padded to length/batch buckets
(`jaxrlhf.rollout.buckets`), so a run compiles a few programs at most. Sample s of prompt i is keyed
by (seed, i, s) (`rollout.request_key`), as `Engine.serve` keys it: the same seed gives the same
samples whatever --batch_size, and sample s of a prompt does not depend on --n.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys

import jax
import numpy as np

from jaxrlhf import cli
from jaxrlhf.checkpoint import read_checkpoint
from jaxrlhf.data.dataset import read_lines
from jaxrlhf.errors import UserError
from jaxrlhf.models import (
  Decoder,
  cast_floating,
  generation_eos_ids,
  load_hf_config,
  load_hf_params,
  load_tokenizer,
  model_config_from,
  pad_token_id,
  params_for,
)
from jaxrlhf.models.decoding import decode_model
from jaxrlhf.models.hub import resolve_model_path
from jaxrlhf.models.tokenizer import encode_prompt
from jaxrlhf.rollout import (
  SamplingParams,
  generate,
  pad_prompts,
  repeat_interleave,
  request_key,
  response_lengths_and_clip,
)
from jaxrlhf.trainer.hf_weights import saved_roles, whole_actor
from jaxrlhf.validate import check_writable


def _parquet_prompts(path: str) -> list:
  import pyarrow as pa
  import pyarrow.parquet as pq

  try:
    table = pq.read_table(path)
  except (OSError, pa.ArrowException) as e:
    raise UserError(f"--prompts {path!r} is not a readable parquet file: {e}") from None
  if "prompt" not in table.column_names:
    raise UserError(
      f"--prompts {path!r} has no 'prompt' column (verl's prompt column); columns: {sorted(table.column_names)}"
    )
  return table.column("prompt").to_pylist()


def read_prompts(path: str) -> list:
  """Strings (or lists of chat messages) from a text file, a jsonl file with a `prompt` field, or verl parquet."""
  if not os.path.isfile(path):
    raise UserError(f"--prompts {path!r} is not a file")
  if path.endswith(".parquet"):
    prompts = _parquet_prompts(path)
    if not prompts:
      raise UserError(f"--prompts {path!r} holds no prompt")
    return prompts
  lines = [line.rstrip("\r\n") for _, line in read_lines(path, where=f"--prompts {path}")]
  if not path.endswith((".jsonl", ".json")):
    prompts = [line for line in lines if line.strip()]
  else:
    prompts = []
    for number, line in enumerate(lines, 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise UserError(f"--prompts {path}:{number} is not valid JSON: {e}") from None
      if not isinstance(row, dict) or "prompt" not in row:
        raise UserError(f"--prompts {path}:{number} has no 'prompt' field (expected a JSON object per line)")
      prompts.append(row["prompt"])
  if not prompts:
    raise UserError(f"--prompts {path!r} holds no prompt")
  return prompts


def load_model(path: str):
  """(params, DecoderConfig, tokenizer, eos ids, pad id) of an HF directory (or Hub id) or a `global_step_N`
  directory."""
  path = resolve_model_path(path, "--model")
  if not os.path.isdir(path):
    raise UserError(
      f"--model {path!r} is not a directory (an HF checkpoint directory, a Hub model id org/name, or "
      "a run's global_step_N)"
    )
  if os.path.exists(os.path.join(path, "config.json")):
    model_config = load_hf_config(path)
    params = load_hf_params(path, model_config)
    tokenizer, source = load_tokenizer(path), path
  else:
    state, _, config = read_checkpoint(path, key="--model")
    actor = saved_roles(state)[0]
    model_section = config.actor_rollout_ref.model
    # A snapshot in another machine's hub cache is fetched here; a LoRA run's frozen base is rebuilt from it.
    model_section.path = resolve_model_path(
      model_section.path, "the checkpoint's actor_rollout_ref.model.path", weights=actor.rebuilds_frozen
    )
    model_config = model_config_from(model_section)
    merged = whole_actor(actor, config).merged(model_config.lora_alpha)  # a LoRA run's adapters merged in
    params = params_for(model_config, jax.tree.map(np.asarray, merged))
    source = model_section.path or None
    tokenizer_dir = source or os.path.join(os.path.dirname(os.path.abspath(path)), "tokenizer")
    if not os.path.isdir(tokenizer_dir):
      raise UserError(
        f"checkpoint {path!r}: no tokenizer at {tokenizer_dir!r} (the run's model path or its tokenizer/ folder)"
      )
    tokenizer = load_tokenizer(tokenizer_dir)
  if len(tokenizer) > model_config.vocab_size:
    raise UserError(
      f"the tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {model_config.vocab_size}"
    )
  eos_ids = generation_eos_ids(source, tokenizer)
  return params, model_config, tokenizer, eos_ids, pad_token_id(tokenizer, eos_ids)


def sample_responses(
  params,
  model_config,
  prompt_ids: list[list[int]],
  sampling: SamplingParams,
  *,
  n: int = 1,
  seed: int = 0,
  batch_size: int = 32,
) -> tuple[list[dict], np.ndarray]:
  """n samples of each tokenized prompt, prompt-major (row j: prompt j // n, sample j % n).

  Row j samples with `request_key(seed, j // n, j % n)`, the key `Engine.serve` gives the same
  request, and both run `decode.step`, so they sample the same tokens (whatever the batch or
  bucket a row lands in). Returns (rows of {"prompt_index", "sample", "response_ids" (up to and
  including EOS), "log_probs"}, the response masks [rows, R]).
  """
  generate_fn = jax.jit(functools.partial(generate, decode_model(Decoder(model_config)), sampling=sampling))
  request_keys = jax.jit(jax.vmap(request_key, in_axes=(None, 0, 0)))
  rows = repeat_interleave(list(range(len(prompt_ids))), n)
  results, masks = [], []
  for start in range(0, len(rows), batch_size):
    prompt_indices = rows[start : start + batch_size]
    batch = pad_prompts([prompt_ids[i] for i in prompt_indices], sampling.pad_token_id)
    # Rows past the prompts only pad the batch to its bucket (inactive): any key does.
    row_B = np.minimum(start + np.arange(batch.prompt_ids_BxP.shape[0]), len(rows) - 1)
    rngs_B = request_keys(seed, row_B // n, row_B % n)
    out = jax.device_get(
      generate_fn(
        params,
        prompt_ids_BxP=batch.prompt_ids_BxP,
        prompt_mask_BxP=batch.prompt_mask_BxP,
        rng=rngs_B,
        active_B=batch.active_B,
      )
    )
    masks.append(out["response_mask"][: batch.num_prompts])
    for row, prompt_index in enumerate(prompt_indices):
      length = int(out["response_lengths"][row])
      results.append(
        {
          "prompt_index": prompt_index,
          "sample": (start + row) % n,
          "response_ids": [int(t) for t in out["responses"][row, :length]],
          "log_probs": [float(x) for x in out["rollout_log_probs"][row, :length]],
        }
      )
  return results, np.concatenate(masks)


def run(args) -> list[dict]:
  texts = read_prompts(args.prompts)  # before the model: a bad prompts file or output path fails at once
  check_writable(f"--output {args.output!r}", args.output, is_file=True)
  params, model_config, tokenizer, eos_ids, pad_id = load_model(args.model)
  encoded = [encode_prompt(tokenizer, text, args.chat) for text in texts]
  for text, ids in zip(texts, encoded):
    if not ids:
      raise UserError(f"prompt {text!r} tokenizes to no tokens")
  greedy = args.temperature <= 0
  sampling = SamplingParams(
    max_new_tokens=args.max_new_tokens,
    eos_token_ids=eos_ids,
    pad_token_id=pad_id,
    temperature=1.0 if greedy else args.temperature,
    top_k=args.top_k,
    top_p=args.top_p,
    do_sample=not greedy,
  )
  if args.dtype:
    model_config = dataclasses.replace(model_config, dtype=args.dtype)
    params = cast_floating(params, args.dtype)
  sampled, masks = sample_responses(
    jax.device_put(params), model_config, encoded, sampling, n=args.n, seed=args.seed, batch_size=args.batch_size
  )
  results = []
  for row in sampled:
    ids = row["response_ids"]
    results.append(
      {
        "prompt": texts[row["prompt_index"]],
        "sample": row["sample"],
        "response": tokenizer.decode(ids, skip_special_tokens=True),
        "response_ids": ids,
        "finish_reason": "stop" if ids and ids[-1] in eos_ids else "length",
      }
    )
  os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
  with open(args.output, "w", encoding="utf-8") as f:
    for result in results:
      f.write(json.dumps(result, ensure_ascii=False) + "\n")
  lengths, clip_ratio = response_lengths_and_clip(masks)
  print(
    f"{len(results)} responses ({len(texts)} prompts x n={args.n}) -> {args.output}; "
    f"response_length/mean {lengths.mean():.1f}, response_length/clip_ratio {clip_ratio:.3f}",
    file=sys.stderr,
  )
  return results


def parse_args(argv=None):
  parser = argparse.ArgumentParser(prog="python -m jaxrlhf.generate", description=__doc__.split("\n\n")[0])
  parser.add_argument(
    "--model",
    required=True,
    help="HF checkpoint directory, Hub model id (org/name), or a run's global_step_N directory",
  )
  parser.add_argument("--prompts", required=True, help="text file (one prompt per line) or jsonl with 'prompt'")
  parser.add_argument("--output", required=True, help="output .jsonl")
  parser.add_argument("--max_new_tokens", type=int, default=256)
  parser.add_argument("--temperature", type=float, default=1.0, help="> 0 samples; 0 = greedy")
  parser.add_argument("--top_p", type=float, default=1.0)
  parser.add_argument("--top_k", type=int, default=-1, help="-1 = off")
  parser.add_argument("--n", type=int, default=1, help="samples per prompt")
  parser.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--batch_size", type=int, default=32, help="rows per generate call (padded to a bucket)")
  parser.add_argument(
    "--dtype",
    choices=("float32", "bfloat16"),
    default=None,
    help="compute dtype (weights cast once); default: the checkpoint's",
  )
  cli.add_verbose_flag(parser)
  args = parser.parse_args(argv)
  for name, low in (("max_new_tokens", 1), ("n", 1), ("batch_size", 1)):
    if getattr(args, name) < low:
      parser.error(f"--{name} must be >= {low}, got {getattr(args, name)}")
  if not args.temperature >= 0.0 or args.temperature == float("inf"):  # NaN fails the first test
    parser.error(f"--temperature must be > 0 (sampling) or 0 (greedy), got {args.temperature}")
  if not 0.0 < args.top_p <= 1.0:
    parser.error(f"--top_p must be in (0, 1], got {args.top_p}")
  if args.top_k == 0 or args.top_k < -1:
    parser.error(f"--top_k must be -1 (off) or >= 1, got {args.top_k}")
  return args


def main(argv=None):
  args = parse_args(argv)
  cli.run("python -m jaxrlhf.generate", run, args, verbose=args.verbose)


if __name__ == "__main__":
  main()
