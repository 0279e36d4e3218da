"""TRL vs jaxrlhf, side by side on this CPU: one RL step of PPO (with a critic) and of GRPO, same work.

Both sides load the same local HF checkpoint (Qwen2-shaped, random weights) and tokenizer, read the
same verl-format parquet of GSM8K-style word problems and score with verl's GSM8K rule
(`jaxrlhf/rewards/gsm8k.py`, loaded by path on the TRL side). fp32, 2 threads, `--response_length`
new tokens, no packing, and the same batch shape on both sides:
- PPO: 16 prompts x 1 sample, KL in the reward (k1, coefficient 0.05), GAE, one mini-batch of 16 rows,
  micro-batches of 8, 2 PPO epochs; TRL's `PPOTrainer` (trl 1.12.0, `trl.experimental.ppo`: the last
  release that has one; a rule reward stands in for its reward model). TRL's old log-probs are those of
  the sampler (the scores `generate` returns), with no forward pass for them; jaxrlhf does the same
  with verl's bypass mode (`algorithm.rollout_correction.bypass_mode`: PPO-clip against the rollout's
  log-probs, no correction thresholds).
- GRPO: 4 prompts x 4 samples, no KL, one mini-batch of 16 rows, micro-batches of 8, 2 epochs
  (TRL: `num_iterations=2`, `gradient_accumulation_steps=2`); current TRL's `GRPOTrainer`.
jaxrlhf's layer settings are the faster on CPU per model (`LAYER_SETTINGS`): at 155K the layer scan with
gradient checkpointing (as verl's recipes), at 21.7M a loop of layers without it; TRL runs with its
defaults (no checkpointing). Each side runs on the cores that make it fastest, never more than 2 threads
(`JAXRLHF_CORES`): at 155K jaxrlhf runs on one core, TRL on two.
Each TRL version gets its own venv under `benchmarks/.venvs` (made on first use; pip + PyPI). jaxrlhf
runs `train.py` with this file as its config (`get_config`). The sides alternate, `--rounds` times; a
side's step time is the median over its steps after the first (compile / warm-up) in each round, and
the table shows the median over rounds. The load average is printed with every run: measure on a
quiet machine (1-minute load below ~1.5).

    python benchmarks/vs_trl.py --quick                     # end to end, small: both models, 16 tokens, 1 round
    python benchmarks/vs_trl.py [--rounds 3] [--steps 5] [--models 155K 21.7M] [--algos ppo grpo]

Writes benchmarks/results/vs_trl.json (or vs_trl_quick.json, or `--results NAME`) with the CPU model and its
widest vector extension, and prints a markdown table.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENVS = os.path.join(ROOT, "benchmarks", ".venvs")
TORCH = "torch==2.13.0"  # the CPU build (see docs/architecture.md "Environment")
TRL_VERSIONS = {"ppo": "1.12.0", "grpo": "1.16.0"}
MODELS = {  # vocab, hidden, intermediate, layers, heads, kv heads
  "155K": (64, 64, 128, 4, 4, 2),
  "21.7M": (32000, 384, 1024, 6, 6, 2),
}
ALGOS = {  # prompts per step, samples per prompt; both: 16 rows, micro-batches of 8, 2 epochs, one mini-batch
  "ppo": (16, 1),
  "grpo": (4, 4),
}
# jaxrlhf's layer settings per model, the faster on CPU: at 155K the layer scan with checkpointing (a loop of
# layers: GRPO fused step 0.34 against 0.31 s); at 21.7M a Python loop of layers without checkpointing (PPO
# step 9.97 against 11.66 s, GRPO 6.85 against 7.26 s; 2-core Xeon, trainers alternating in one process). The
# loop's compile is longer (6 layers); `benchmarks/backbone_vs_torch.py` times the backbone alone.
LAYER_SETTINGS = {"155K": "scan=1,remat=1", "21.7M": "scan=0,remat=0"}
# The cores jaxrlhf's process may run on per model (None: all). XLA:CPU sizes its thread pool from them. At 155K
# the step is thousands of tiny ops, and handing each to the other core's thread costs more than that core gives
# (2-vCPU Xeon VM, 155K GRPO step 0.34-0.39 s on one core against 0.49-0.70 s on two; PPO 0.75-0.90 against
# 0.84-1.56). TRL is not faster on one thread there (GRPO 0.92 against 0.85 s, PPO 1.53 against 1.52 s).
JAXRLHF_CORES = {"155K": 1, "21.7M": None}
MICRO_ROWS, EPOCHS = 8, 2
THREADS = 2

# ----- the shared inputs: tokenizer, models, parquet -------------------------------------------------

SPECIAL = ("<pad>", "<eos>", "<unk>", "<|user|>", "<|assistant|>")
WORDS = (
  "####",
  ".",
  "?",
  ",",
  "tom",
  "ana",
  "sam",
  "lee",
  "has",
  "have",
  "does",
  "he",
  "she",
  "buys",
  "eats",
  "gives",
  "finds",
  "loses",
  "more",
  "apples",
  "pens",
  "cards",
  "coins",
  "and",
  "then",
  "how",
  "many",
  "now",
  "think",
  "step",
  "by",
  "give",
  "the",
  "answer",
  "after",
  "away",
)
DIGITS = tuple(str(d) for d in range(10))
CHAT_TEMPLATE = (
  "{% for message in messages %}<|{{ message['role'] }}|> {{ message['content'] }} {% endfor %}"
  "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer(vocab_size: int, save_dir: str):
  """A word-level HF fast tokenizer of exactly `vocab_size` tokens (the problem words, then fillers)."""
  from tokenizers import Tokenizer, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  words = SPECIAL + WORDS + DIGITS
  words += tuple(f"<w{i}>" for i in range(len(words), vocab_size))
  backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
  backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  tokenizer = PreTrainedTokenizerFast(
    tokenizer_object=backend,
    pad_token="<pad>",
    eos_token="<eos>",
    unk_token="<unk>",
    additional_special_tokens=["<|user|>", "<|assistant|>"],
    padding_side="left",
  )
  tokenizer.chat_template = CHAT_TEMPLATE
  tokenizer.save_pretrained(save_dir)


def build_model(name: str, save_dir: str) -> int:
  """A random Qwen2-shaped causal LM saved as an HF checkpoint (+ the tokenizer); returns its parameters."""
  import torch
  from transformers import Qwen2Config, Qwen2ForCausalLM

  vocab, hidden, intermediate, layers, heads, kv_heads = MODELS[name]
  config = Qwen2Config(
    vocab_size=vocab,
    hidden_size=hidden,
    intermediate_size=intermediate,
    num_hidden_layers=layers,
    num_attention_heads=heads,
    num_key_value_heads=kv_heads,
    max_position_embeddings=512,
    tie_word_embeddings=True,
    bos_token_id=None,
    eos_token_id=1,
    pad_token_id=0,
  )
  torch.manual_seed(0)
  model = Qwen2ForCausalLM(config).to(torch.float32)
  model.generation_config.eos_token_id, model.generation_config.pad_token_id = 1, 0
  model.save_pretrained(save_dir)
  # Its own folder: next to a Qwen2 config.json, AutoTokenizer would rebuild it as Qwen2's BPE tokenizer.
  build_tokenizer(vocab, os.path.join(save_dir, "tokenizer"))
  return sum(p.numel() for p in model.parameters())


def problem_rows(count: int, seed: int = 0) -> list[dict]:
  """GSM8K-style word problems in verl's row format; 1-6 clauses, so prompts are 20-70 tokens."""
  import random

  rng = random.Random(seed)
  rows = []
  for index in range(count):
    name, item = rng.choice(("tom", "ana", "sam", "lee")), rng.choice(("apples", "pens", "cards", "coins"))
    total = rng.randint(0, 9)
    clauses = [f"{name} has {total} {item} ."]
    for _ in range(rng.randint(0, 5)):
      if total < 9 and rng.random() < 0.5:
        change = rng.randint(1, 9 - total)
        clauses.append(f"then {rng.choice(('he', 'she'))} {rng.choice(('buys', 'finds'))} {change} more {item} .")
        total += change
      elif total > 0:
        change = rng.randint(1, total)
        clauses.append(f"then {rng.choice(('he', 'she'))} {rng.choice(('eats', 'loses'))} {change} {item} .")
        total -= change
    question = (
      " ".join(clauses) + f" how many {item} does {name} have now ? think step by step and give the answer after ####"
    )
    rows.append(
      {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(total)},
        "extra_info": {"split": "train", "index": index},
      }
    )
  return rows


def prepare(work_dir: str, models: list[str]) -> dict:
  """Checkpoints and the parquet under `work_dir` (made once, reused; the tokenizer in `<model>/tokenizer`)."""
  import pyarrow as pa
  import pyarrow.parquet as pq
  from safetensors import safe_open

  os.makedirs(work_dir, exist_ok=True)
  parquet = os.path.join(work_dir, "train.parquet")
  if not os.path.exists(parquet):
    pq.write_table(pa.Table.from_pylist(problem_rows(1024)), parquet)
  params = {}
  for name in models:
    model_dir = os.path.join(work_dir, f"model_{name}")
    if not os.path.exists(os.path.join(model_dir, "model.safetensors")):
      build_model(name, model_dir)
    with safe_open(os.path.join(model_dir, "model.safetensors"), "np") as f:  # tied: the head is the embedding
      params[name] = int(sum(f.get_tensor(k).size for k in f.keys()))
  return {"parquet": parquet, "params": params}


# ----- jaxrlhf: train.py with this file as its config ------------------------------------------------


def get_config(spec: str):
  """`train.py --config benchmarks/vs_trl.py:algo=ppo,model=DIR,data=PARQUET,steps=5,response_length=64,run_dir=DIR`.

  Optional: `fuse=0` (phased mode: per-phase times and MFU), `bucket=0` (prompts padded to max_prompt_length),
  `prompt_length=104` (max_prompt_length, 128 by default: the last length bucket),
  `bypass=0` (PPO: an old-log-prob forward pass, as verl's default, instead of the sampler's log-probs),
  `remat=0` (no gradient checkpointing), `scan=0` (a Python loop of layers, not one scan over stacked weights),
  `attention=xla` (the whole score matrix, not 64-token blocks).
  """
  from jaxrlhf.config import get_base_config

  args = dict(item.split("=", 1) for item in spec.split(","))
  prompts, n = ALGOS[args["algo"]]
  config = get_base_config()
  config.data.train_files = (args["data"],)
  config.data.max_prompt_length = int(args.get("prompt_length", 128))
  config.data.max_response_length = int(args["response_length"])
  config.data.train_batch_size = prompts
  config.data.seed = 0
  config.actor_rollout_ref.model.path = args["model"]
  config.data.tokenizer = os.path.join(args["model"], "tokenizer")
  actor = config.actor_rollout_ref.actor
  actor.ppo_mini_batch_size = prompts  # one mini-batch, as TRL's
  actor.ppo_micro_batch_size_per_gpu = MICRO_ROWS
  actor.ppo_epochs = EPOCHS
  actor.use_kl_loss = False
  actor.entropy_coeff = 0.0
  config.actor_rollout_ref.rollout.n = n
  config.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu = prompts * n  # TRL: one forward batch
  config.critic.ppo_micro_batch_size_per_gpu = MICRO_ROWS
  config.critic.ppo_epochs = EPOCHS
  # Gradient checkpointing (the results do not change) and the layer scan by default, as verl's GSM8K recipes
  # and the library. With the scan, a layer's recomputed forward costs less than the stacked residuals at 155K
  # (GRPO fused step 0.13-0.15 -> 0.11-0.12 s) and about the same at 21.7M; `LAYER_SETTINGS` picks per model.
  remat = args.get("remat", "1") == "1"
  scan = args.get("scan", "1") == "1"
  for model in (config.actor_rollout_ref.model, config.critic.model):
    model.enable_gradient_checkpointing, model.scan_layers = remat, scan
  # Blockwise attention in 64-token blocks (`attention=xla` for the whole score matrix, the CPU default): over
  # 128-token sequences the blocks above the diagonal, a quarter of the scores, are skipped, and the backward
  # recomputes the probabilities instead of keeping them (155K GRPO fused step ~7% faster, 21.7M even).
  attention = args.get("attention", "blockwise")
  for model in (config.actor_rollout_ref.model, config.critic.model):
    model.attention_impl, model.attention_block_size = attention, 64
  algorithm = config.algorithm
  if args["algo"] == "ppo":
    algorithm.adv_estimator, algorithm.gamma, algorithm.lam = "gae", 1.0, 0.95  # TRL's PPO defaults
    algorithm.use_kl_in_reward, algorithm.kl_penalty, algorithm.kl_ctrl.kl_coef = True, "kl", 0.05
    # TRL's PPOTrainer takes the old log-probs from generation's scores: the sampler's, as verl's bypass mode.
    algorithm.rollout_correction.bypass_mode = args.get("bypass", "1") == "1"
  else:
    algorithm.adv_estimator = "grpo"
  config.trainer.fuse_step = args.get("fuse", "1") == "1"
  config.data.bucket_prompt_lengths = args.get("bucket", "1") == "1"
  config.trainer.total_training_steps = int(args["steps"])
  config.trainer.val_before_train = False
  config.trainer.logger = ("jsonl",)
  config.trainer.plot = False
  config.trainer.resume_mode = "disable"
  config.trainer.default_local_dir = args["run_dir"]
  config.trainer.project_name, config.trainer.experiment_name = "vs_trl", args["algo"]
  config.mesh.fsdp = 1
  return config


def run_jaxrlhf(
  algo: str,
  model_dir: str,
  parquet: str,
  steps: int,
  response_length: int,
  run_dir: str,
  fused: bool = True,
  settings: str = "",
  cores: int | None = None,
) -> dict:
  """`cores`: run on the first this many of this process's cores (None: all of them)."""
  spec = (
    f"algo={algo},model={model_dir},data={parquet},steps={steps},response_length={response_length},"
    f"run_dir={run_dir},fuse={int(fused)}" + (f",{settings}" if settings else "")
  )
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  allowed = sorted(os.sched_getaffinity(0))[:cores]
  subprocess.run(
    [sys.executable, os.path.join(ROOT, "train.py"), f"--config={os.path.abspath(__file__)}:{spec}"],
    cwd=ROOT,
    env=env,
    check=True,
    stdout=subprocess.DEVNULL,
    preexec_fn=lambda: os.sched_setaffinity(0, allowed),
  )
  with open(os.path.join(run_dir, "vs_trl", algo, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f if line.strip()]
  steps_s = [r["timing_s/step"] for r in records if "timing_s/step" in r]
  phases = {
    k: statistics.median(r[k] for r in records[1:]) for k in records[-1] if k.startswith(("timing_s/", "perf/mfu/"))
  }
  return {"step_s": steps_s, "phases": phases}


# ----- TRL: a worker run by the TRL venv's python ---------------------------------------------------


def trl_python(version: str) -> str:
  """The python of a venv with trl==version and the CPU torch, made on first use."""
  venv = os.path.join(VENVS, f"trl-{version}")
  python = os.path.join(venv, "bin", "python")
  if not os.path.exists(python):
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
  check = subprocess.run(
    [python, "-c", f"import trl, torch; assert trl.__version__ == '{version}'"], capture_output=True
  )
  if check.returncode:
    print(f"installing trl=={version} into {venv}", flush=True)
    subprocess.run([python, "-m", "pip", "install", "-q", TORCH, f"trl=={version}", "pyarrow"], check=True)
  return python


def run_trl(algo: str, model_dir: str, parquet: str, steps: int, response_length: int, out_dir: str) -> dict:
  os.makedirs(out_dir, exist_ok=True)
  out = os.path.join(out_dir, "trl_steps.json")
  env = dict(
    os.environ,
    OMP_NUM_THREADS=str(THREADS),
    MKL_NUM_THREADS=str(THREADS),
    TOKENIZERS_PARALLELISM="false",
    HF_HUB_OFFLINE="1",
    HF_DATASETS_OFFLINE="1",
    WANDB_MODE="disabled",
  )
  env.pop("PYTHONPATH", None)
  subprocess.run(
    [
      trl_python(TRL_VERSIONS[algo]),
      os.path.abspath(__file__),
      "--trl_worker",
      algo,
      "--model_dir",
      model_dir,
      "--data",
      parquet,
      "--steps",
      str(steps),
      "--response_length",
      str(response_length),
      "--out",
      out,
    ],
    cwd=out_dir,
    env=env,
    check=True,
    stdout=subprocess.DEVNULL,
  )
  with open(out) as f:
    ends = json.load(f)["step_ends"]
  return {"step_s": [b - a for a, b in zip(ends, ends[1:])]}


def trl_worker(algo: str, model_dir: str, parquet: str, steps: int, response_length: int, out: str) -> None:
  """Runs TRL's trainer for `steps` RL steps and writes the wall-clock time at the end of each."""
  import importlib.util

  import datasets
  import torch
  from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback

  torch.set_num_threads(THREADS)
  datasets.disable_caching()
  spec = importlib.util.spec_from_file_location("gsm8k", os.path.join(ROOT, "jaxrlhf", "rewards", "gsm8k.py"))
  gsm8k = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(gsm8k)
  tokenizer = AutoTokenizer.from_pretrained(os.path.join(model_dir, "tokenizer"), padding_side="left")
  rows = datasets.Dataset.from_parquet(parquet)
  prompts, n = ALGOS[algo]
  updates_per_step = 1 if algo == "ppo" else EPOCHS  # GRPO: one optimizer step per epoch
  step_ends = [time.perf_counter()]

  class StepClock(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
      if state.global_step % updates_per_step == 0:
        step_ends.append(time.perf_counter())

  common = dict(
    output_dir=os.path.dirname(out),
    per_device_train_batch_size=MICRO_ROWS,
    gradient_accumulation_steps=prompts * n // MICRO_ROWS,
    learning_rate=1e-6,
    report_to="none",
    save_strategy="no",
    logging_steps=1,
    bf16=False,
    fp16=False,
    use_cpu=True,
    seed=0,
    dataloader_num_workers=0,
  )
  if algo == "grpo":
    from trl import GRPOConfig, GRPOTrainer

    def score(completions, reward_model, **kwargs):
      return [gsm8k.compute_score(c, truth["ground_truth"]) for c, truth in zip(completions, reward_model)]

    text_rows = rows.map(
      lambda row: {"prompt": tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)}
    )
    config = GRPOConfig(
      **common,
      num_generations=n,
      max_completion_length=response_length,
      num_iterations=EPOCHS,
      beta=0.0,
      temperature=1.0,
      max_steps=steps * EPOCHS,
      shuffle_dataset=False,
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    trainer = GRPOTrainer(
      model=model,
      reward_funcs=score,
      args=config,
      train_dataset=text_rows,
      processing_class=tokenizer,
      callbacks=[StepClock()],
    )
  else:
    from trl.experimental.ppo import PPOConfig, PPOTrainer, ppo_trainer

    truths, prompt_ids = {}, []
    for row in rows:
      ids = tokenizer(
        tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False),
        add_special_tokens=False,
      )["input_ids"]
      truths[tuple(ids)] = row["reward_model"]["ground_truth"]
      prompt_ids.append(ids)
    token_rows = datasets.Dataset.from_dict({"input_ids": prompt_ids})

    class RuleReward(torch.nn.Module):
      """Stands in for PPOTrainer's reward model: verl's GSM8K rule on the decoded response."""

    rule = RuleReward()
    model_reward = ppo_trainer.get_reward

    def get_reward(model, query_responses, pad_token_id, context_length):
      if model is not rule:
        return model_reward(model, query_responses, pad_token_id, context_length)
      queries, responses = query_responses[:, :context_length], query_responses[:, context_length:]
      texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
      keys = [tuple(q[q != pad_token_id].tolist()) for q in queries]
      return None, torch.tensor([gsm8k.compute_score(t, truths[k]) for t, k in zip(texts, keys)]), None

    ppo_trainer.get_reward = get_reward
    config = PPOConfig(
      **common,
      num_mini_batches=1,
      num_ppo_epochs=EPOCHS,
      response_length=response_length,
      local_rollout_forward_batch_size=prompts * n,
      total_episodes=steps * prompts * n,
      num_sample_generations=0,
      stop_token="eos",
      kl_coef=0.05,
      kl_estimator="k1",
      temperature=1.0,
      gamma=1.0,
      lam=0.95,
    )
    load = lambda cls, **kw: cls.from_pretrained(model_dir, dtype=torch.float32, **kw)
    value_model = load(AutoModelForSequenceClassification, num_labels=1)
    trainer = PPOTrainer(
      args=config,
      processing_class=tokenizer,
      model=load(AutoModelForCausalLM),
      ref_model=load(AutoModelForCausalLM),
      reward_model=rule,
      value_model=value_model,
      train_dataset=token_rows,
      callbacks=[StepClock()],
    )
  trainer.train()
  with open(out, "w") as f:
    json.dump({"step_ends": step_ends}, f)


# ----- the side by side ------------------------------------------------------------------------------


def machine() -> str:
  """The CPU the times belong to: its model and widest vector extension (two 2-core machines here differed
  2.3x in jaxrlhf's 21.7M step, one with AVX-512 and one without), cores, threads."""
  model, flags = "unknown CPU", set()
  if os.path.exists("/proc/cpuinfo"):
    with open("/proc/cpuinfo") as f:
      for line in f:
        key, _, value = (part.strip() for part in line.partition(":"))
        if key == "model name":
          model = value
        elif key == "flags":
          flags = set(value.split())
          break
  vector = next((name for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2")) if flag in flags), "no AVX2")
  return f"{os.cpu_count()} CPU cores ({model}, {vector}), {THREADS} threads, fp32"


def write_results(name: str, settings: dict, **payload) -> None:
  """benchmarks/results/NAME.json: this machine, the settings, the date and `payload`; prints the first two."""
  description = machine()
  os.makedirs(os.path.join(ROOT, "benchmarks", "results"), exist_ok=True)
  with open(os.path.join(ROOT, "benchmarks", "results", name.removesuffix(".json") + ".json"), "w") as f:
    json.dump(
      {
        "machine": description,
        "settings": settings,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        **payload,
      },
      f,
      indent=2,
    )
  print(f"\n{description}; {settings}\n")


def load_average() -> float:
  return os.getloadavg()[0]


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--quick", action="store_true", help="end to end, small: 1 round, 3 steps, 16 new tokens")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--steps", type=int, default=5, help="RL steps per run; the first is not counted")
  parser.add_argument("--response_length", type=int, default=64)
  parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
  parser.add_argument("--algos", nargs="+", default=list(ALGOS), choices=list(ALGOS))
  parser.add_argument("--phases", action="store_true", help="also one phased jaxrlhf run per case (breakdown, MFU)")
  parser.add_argument("--work_dir", default=os.path.join(VENVS, "work"))
  parser.add_argument(
    "--results", help="results file name under benchmarks/results (default: vs_trl, or vs_trl_quick with --quick)"
  )
  parser.add_argument("--trl_worker", choices=list(ALGOS))
  parser.add_argument("--model_dir")
  parser.add_argument("--data")
  parser.add_argument("--out")
  args = parser.parse_args()
  if args.trl_worker:
    trl_worker(args.trl_worker, args.model_dir, args.data, args.steps, args.response_length, args.out)
    return
  if args.quick:
    args.rounds, args.steps, args.response_length = 1, 3, 16
  inputs = prepare(args.work_dir, args.models)
  runs = []
  for round_index in range(args.rounds):
    for name in args.models:
      model_dir = os.path.join(args.work_dir, f"model_{name}")
      for algo in args.algos:
        sides = ("trl", "jaxrlhf") if round_index % 2 == 0 else ("jaxrlhf", "trl")  # alternate who goes first
        for side in sides:
          run_dir = os.path.join(args.work_dir, "runs", f"{side}_{name}_{algo}_{round_index}")
          subprocess.run(["rm", "-rf", run_dir], check=True)
          load_before = load_average()
          start = time.perf_counter()
          runner = (
            run_trl
            if side == "trl"
            else functools.partial(run_jaxrlhf, settings=LAYER_SETTINGS[name], cores=JAXRLHF_CORES[name])
          )
          result = runner(algo, model_dir, inputs["parquet"], args.steps, args.response_length, run_dir)
          result.update(
            side=side,
            model=name,
            algo=algo,
            round=round_index,
            load_before=load_before,
            load_after=load_average(),
            wall_s=round(time.perf_counter() - start, 1),
            median_step_s=statistics.median(result["step_s"][1:]),
          )
          print(json.dumps({k: v for k, v in result.items() if k != "phases"}), flush=True)
          runs.append(result)
  breakdowns = []
  if args.phases:
    for name in args.models:
      for algo in args.algos:
        run_dir = os.path.join(args.work_dir, "runs", f"phased_{name}_{algo}")
        subprocess.run(["rm", "-rf", run_dir], check=True)
        result = run_jaxrlhf(
          algo,
          os.path.join(args.work_dir, f"model_{name}"),
          inputs["parquet"],
          args.steps,
          args.response_length,
          run_dir,
          fused=False,
          settings=LAYER_SETTINGS[name],
          cores=JAXRLHF_CORES[name],
        )
        breakdowns.append({"model": name, "algo": algo, "load": load_average(), **result})
        print(json.dumps(breakdowns[-1]), flush=True)
  table = []
  for name in args.models:
    for algo in args.algos:
      median = lambda side: statistics.median(
        r["median_step_s"] for r in runs if (r["side"], r["model"], r["algo"]) == (side, name, algo)
      )
      loads = [r[k] for r in runs if (r["model"], r["algo"]) == (name, algo) for k in ("load_before", "load_after")]
      table.append(
        {
          "model": name,
          "params": inputs["params"][name],
          "algo": algo,
          "trl": TRL_VERSIONS[algo],
          "trl_step_s": round(median("trl"), 3),
          "jaxrlhf_step_s": round(median("jaxrlhf"), 3),
          "ratio": round(median("trl") / median("jaxrlhf"), 2),
          "load_min": round(min(loads), 2),
          "load_max": round(max(loads), 2),
        }
      )
  settings = {k: getattr(args, k) for k in ("quick", "rounds", "steps", "response_length", "models", "algos")}
  settings.update(jaxrlhf_layers=LAYER_SETTINGS, jaxrlhf_cores=JAXRLHF_CORES)
  write_results(
    args.results or ("vs_trl_quick" if args.quick else "vs_trl"), settings, table=table, runs=runs, phased=breakdowns
  )
  print("| model | algo | TRL | TRL step s | jaxrlhf step s | TRL / jaxrlhf | load average |")
  print("|---|---|---|---|---|---|---|")
  for r in table:
    print(
      f"| {r['model']} ({r['params'] / 1e6:.3g}M) | {r['algo']} | {r['trl']} | {r['trl_step_s']} | "
      f"{r['jaxrlhf_step_s']} | {r['ratio']}x | {r['load_min']}-{r['load_max']} |"
    )


if __name__ == "__main__":
  main()
