"""GRPO on GSM8K, Qwen2.5-0.5B-Instruct: group-relative advantages, no critic, KL as a loss term.

Data: verl-format parquet written by examples/data_preprocess/gsm8k.py from a local GSM8K copy
(the Hub's openai/gsm8k `main/` folder), model: a local Qwen2.5-0.5B-Instruct download.

    python examples/data_preprocess/gsm8k.py --local_dir ~/raw/gsm8k/main --output_dir ~/data/gsm8k
    huggingface-cli download Qwen/Qwen2.5-0.5B-Instruct --local-dir ~/models/Qwen2.5-0.5B-Instruct
    python train.py --config configs/grpo_gsm8k_qwen2_5_0_5b.py
    python train.py --config configs/grpo_gsm8k_qwen2_5_0_5b.py --config.actor_rollout_ref.rollout.n=8

Settings follow verl's GRPO GSM8K example: 256 prompts x n=5 samples per step, mini-batches of 64
prompts, actor lr 1e-6, clip 0.2, the KL to the reference as a low-variance loss of 0.001 (none in
the reward), no entropy bonus, responses up to 1024 tokens, `mesh.fsdp=-1`.
"""

import os

from jaxrlhf.config import get_base_config

DATA_DIR = os.path.expanduser("~/data/gsm8k")
MODEL_PATH = os.path.expanduser("~/models/Qwen2.5-0.5B-Instruct")


def get_config():
  config = get_base_config()

  config.data.train_files = (os.path.join(DATA_DIR, "train.parquet"),)
  config.data.val_files = (os.path.join(DATA_DIR, "test.parquet"),)
  config.data.tokenizer = ""  # the model's own tokenizer and chat template
  config.data.max_prompt_length = 512
  config.data.max_response_length = 1024
  config.data.train_batch_size = 256
  config.data.filter_overlong_prompts = True
  config.data.truncation = "error"

  model = config.actor_rollout_ref.model
  model.path = MODEL_PATH
  model.enable_gradient_checkpointing = True
  model.dtype = "bfloat16"
  model.param_dtype = "float32"

  actor = config.actor_rollout_ref.actor
  actor.optim.lr = 1e-6
  actor.ppo_mini_batch_size = 64  # prompts: 64 x 5 = 320 sequences per update
  actor.ppo_micro_batch_size_per_gpu = 8
  # Seeds: pack sequences and size micro-batches by tokens (same numbers, fewer padded tokens).
  config.actor_rollout_ref.model.use_remove_padding = True
  actor.use_dynamic_bsz = True
  actor.ppo_max_token_len_per_gpu = 16384
  actor.ppo_epochs = 1
  actor.clip_ratio = 0.2
  actor.loss_agg_mode = "token-mean"
  actor.entropy_coeff = 0.0
  actor.use_kl_loss = True
  actor.kl_loss_coef = 0.001
  actor.kl_loss_type = "low_var_kl"
  actor.grad_clip = 1.0

  rollout = config.actor_rollout_ref.rollout
  rollout.n = 5
  rollout.temperature = 1.0
  rollout.tensor_model_parallel_size = 1
  rollout.log_prob_micro_batch_size_per_gpu = 16

  config.critic.enable = False

  algorithm = config.algorithm
  algorithm.adv_estimator = "grpo"
  algorithm.norm_adv_by_std_in_grpo = True
  algorithm.use_kl_in_reward = False

  trainer = config.trainer
  trainer.total_epochs = 15
  trainer.test_freq = 5
  trainer.save_freq = 20
  trainer.val_before_train = True
  trainer.logger = ("console", "jsonl")
  trainer.project_name = "gsm8k"
  trainer.experiment_name = "grpo_qwen2_5_0_5b"
  trainer.default_local_dir = "checkpoints"
  trainer.max_actor_ckpt_to_keep = 3

  config.mesh.data = 1
  config.mesh.fsdp = -1
  config.mesh.tensor = 1
  return config
