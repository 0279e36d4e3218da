"""`python -m jaxrlhf.generate` on a tiny HF checkpoint directory (real subprocess) and on a training checkpoint."""

import functools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from jaxrlhf.checkpoint import Checkpointer
from jaxrlhf.config import get_base_config
from jaxrlhf.data.builtin import build_tokenizer
from jaxrlhf.models import Decoder, init_params
from jaxrlhf.models.decoding import decode_model
from jaxrlhf.rollout import SamplingParams, generate, pad_prompts
from jaxrlhf.trainer.state import RoleState, TrainState
from tests.helpers import subprocess_env
from tests.models import hf_fixtures

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPTS = ["first : 3 5 7", "last : 1 2", "7 + 8 = ?"]
EOS_ID = 1  # "<eos>" of the built-in tokenizer


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  pytest.importorskip("torch")
  path = tmp_path_factory.mktemp("hf_qwen2")
  hf_fixtures.save_model(hf_fixtures.build_model("qwen2_tied", seed=1), path)
  build_tokenizer(save_dir=str(path))
  return str(path)


def _cli(*args):
  env = subprocess_env(JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  proc = subprocess.run(
    [sys.executable, "-m", "jaxrlhf.generate", *map(str, args)],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc


def _read(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def greedy_text_run(hf_dir, tmp_path_factory):
  tmp = tmp_path_factory.mktemp("cli")
  (tmp / "prompts.txt").write_text("\n".join(PROMPTS[:2]) + "\n\n" + PROMPTS[2] + "\n")
  proc = _cli(
    "--model",
    hf_dir,
    "--prompts",
    tmp / "prompts.txt",
    "--output",
    tmp / "out.jsonl",
    "--temperature",
    0,
    "--n",
    2,
    "--max_new_tokens",
    12,
  )
  return _read(tmp / "out.jsonl"), proc.stderr


def test_text_prompts_greedy_with_n_samples(greedy_text_run, hf_dir):
  from jaxrlhf.models import load_tokenizer

  rows, stderr = greedy_text_run
  tokenizer = load_tokenizer(hf_dir)  # the checkpoint's word tokenizer (AutoTokenizer makes it Qwen2's: test_hf_io)
  assert [r["prompt"] for r in rows] == [p for p in PROMPTS for _ in range(2)]
  assert [r["sample"] for r in rows] == [0, 1] * 3
  for first, second in zip(rows[::2], rows[1::2]):  # greedy: every sample of a prompt is the same
    assert first["response_ids"] == second["response_ids"]
  for row in rows:
    ids = row["response_ids"]
    assert 1 <= len(ids) <= 12 and EOS_ID not in ids[:-1]
    assert row["finish_reason"] == ("stop" if ids[-1] == EOS_ID else "length")
    assert (row["finish_reason"] == "length") == (len(ids) == 12)
    assert row["response"] == tokenizer.decode(ids, skip_special_tokens=True)
  assert "response_length/clip_ratio" in stderr


def test_jsonl_prompts_give_the_same_greedy_responses_in_a_new_process(greedy_text_run, hf_dir, tmp_path):
  with open(tmp_path / "prompts.jsonl", "w") as f:
    for prompt in PROMPTS:
      f.write(json.dumps({"prompt": prompt, "data_source": "x"}) + "\n")
  _cli(
    "--model",
    hf_dir,
    "--prompts",
    tmp_path / "prompts.jsonl",
    "--output",
    tmp_path / "out.jsonl",
    "--temperature",
    0,
    "--max_new_tokens",
    12,
    "--seed",
    5,
  )
  rows = _read(tmp_path / "out.jsonl")
  assert [r["prompt"] for r in rows] == PROMPTS
  assert [r["response_ids"] for r in rows] == [r["response_ids"] for r in greedy_text_run[0][::2]]


def test_training_checkpoint_directory_with_chat_and_sampling(tmp_path):
  from jaxrlhf import generate as cli
  from jaxrlhf.models import model_config_from

  # A from-scratch run's checkpoint: model from override_config, tokenizer in the run's tokenizer/ folder.
  config = get_base_config()
  for key, value in dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
  ).items():
    config.actor_rollout_ref.model.override_config[key] = value
  model_config = model_config_from(config.actor_rollout_ref.model)
  params, _ = init_params(Decoder(model_config), jax.random.key(4))
  run_dir = tmp_path / "run"
  tokenizer = build_tokenizer(save_dir=str(run_dir / "tokenizer"))
  checkpointer = Checkpointer(str(run_dir), async_save=False)
  state = TrainState(
    step=jnp.int32(3),
    actor=RoleState(params=params, opt_state=None),  # what generate reads; no optimizer state needed here
    critic=None,
    ref_params=None,
    reward_params=None,
    kl_coef=jnp.float32(0),
    lr_scale=jnp.float32(1),
  )
  checkpointer.save(3, state, {"step": 3, "config": config.to_json()})
  checkpointer.close()
  step_dir = str(run_dir / "global_step_3")
  (tmp_path / "p.txt").write_text("\n".join(PROMPTS) + "\n")

  greedy = cli.run(
    cli.parse_args(
      [
        "--model",
        step_dir,
        "--prompts",
        str(tmp_path / "p.txt"),
        "--output",
        str(tmp_path / "g.jsonl"),
        "--temperature",
        "0",
        "--max_new_tokens",
        "12",
      ]
    )
  )
  # The same greedy tokens as the sampler called directly on the checkpoint's weights.
  batch = pad_prompts([tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS], 0)
  model = Decoder(model_config)
  apply_fn = decode_model(model)
  sampling = SamplingParams(max_new_tokens=12, eos_token_ids=(EOS_ID,), pad_token_id=0, do_sample=False)
  out = jax.jit(functools.partial(generate, apply_fn, sampling=sampling))(
    params, prompt_ids_BxP=batch.prompt_ids_BxP, prompt_mask_BxP=batch.prompt_mask_BxP, rng=jax.random.key(0)
  )
  expected = [[int(t) for t in out["responses"][row, : int(out["response_lengths"][row])]] for row in range(3)]
  assert [r["response_ids"] for r in greedy] == expected

  sampled = cli.run(
    cli.parse_args(
      [
        "--model",
        step_dir,
        "--prompts",
        str(tmp_path / "p.txt"),
        "--output",
        str(tmp_path / "s.jsonl"),
        "--temperature",
        "1.0",
        "--top_k",
        "20",
        "--n",
        "3",
        "--chat",
        "--max_new_tokens",
        "6",
        "--seed",
        "2",
      ]
    )
  )
  assert len(sampled) == 9 and [r["sample"] for r in sampled] == [0, 1, 2] * 3
  assert len({tuple(r["response_ids"]) for r in sampled}) > 3  # samples differ
  assert _read(tmp_path / "s.jsonl") == sampled


def test_generate_and_the_serving_engine_sample_the_same_tokens(hf_dir, tmp_path):
  """One decode step and one PRNG convention: for the same seed, request j of `jaxrlhf.generate` and of
  `Engine.serve` draw the same tokens, though the CLI batches and buckets them and the engine runs them
  through 2 slots with continuous batching."""
  from jaxrlhf import generate as generate_cli
  from jaxrlhf.rollout import Engine

  prompts_file = tmp_path / "prompts.txt"
  prompts_file.write_text("\n".join(PROMPTS) + "\n")
  args = generate_cli.parse_args(
    [
      "--model",
      hf_dir,
      "--prompts",
      str(prompts_file),
      "--output",
      str(tmp_path / "out.jsonl"),
      "--temperature",
      "1.0",
      "--top_k",
      "40",
      "--max_new_tokens",
      "10",
      "--seed",
      "7",
    ]
  )
  rows = generate_cli.run(args)
  params, model_config, tokenizer, eos_ids, pad_id = generate_cli.load_model(hf_dir)
  sampling = SamplingParams(max_new_tokens=10, eos_token_ids=eos_ids, pad_token_id=pad_id, temperature=1.0, top_k=40)
  engine = Engine(model_config, sampling, max_concurrent_decodes=2, prefill_buckets=(8, 16))
  served = engine.serve(params, [generate_cli.encode_prompt(tokenizer, p, chat=False) for p in PROMPTS], seed=7)
  assert [row["response_ids"] for row in rows] == [out["token_ids"] for out in served]
  assert len({tuple(row["response_ids"]) for row in rows}) == len(PROMPTS)  # really sampled, not one answer
  other_seed = engine.serve(params, [generate_cli.encode_prompt(tokenizer, p, chat=False) for p in PROMPTS], seed=8)
  assert [out["token_ids"] for out in other_seed] != [out["token_ids"] for out in served]
