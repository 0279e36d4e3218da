"""GRPO on GSM8K, Qwen2.5-0.5B-Instruct: group-relative advantages, no critic, KL as a loss term.

Data: verl-format parquet written by examples/data_preprocess/gsm8k.py from a local GSM8K copy
(the Hub's openai/gsm8k `main/` folder), model: a local Qwen2.5-0.5B-Instruct download.

    hf download openai/gsm8k --repo-type dataset --include "main/*" --local-dir ~/raw/gsm8k
    python examples/data_preprocess/gsm8k.py --local_dir ~/raw/gsm8k/main --output_dir ~/data/gsm8k
    hf download Qwen/Qwen2.5-0.5B-Instruct --local-dir ~/models/Qwen2.5-0.5B-Instruct
    python train.py --config configs/grpo_gsm8k_qwen2_5_0_5b.py
    python train.py --config configs/grpo_gsm8k_qwen2_5_0_5b.py --config.actor_rollout_ref.rollout.n=8

Settings follow verl's GRPO GSM8K example: 256 prompts x n=5 samples per step, mini-batches of 64
prompts, actor lr 1e-6, clip 0.2, the KL to the reference as a low-variance loss of 0.001 (none in
the reward), no entropy bonus, responses up to 1024 tokens, `mesh.fsdp=-1`.
"""

import os

from jaxrlhf.config import load_config_file


def get_config():
  # The PPO recipe's data, model and optimiser; GRPO replaces the critic with group advantages.
  config = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ppo_gsm8k_qwen2_5_0_5b.py"))
  config.data.max_response_length = 1024

  actor = config.actor_rollout_ref.actor
  actor.ppo_mini_batch_size = 64  # prompts: 64 x 5 = 320 sequences per update
  actor.ppo_micro_batch_size_per_gpu = 8
  actor.loss_agg_mode = "token-mean"
  config.actor_rollout_ref.rollout.n = 5

  config.critic.enable = False
  config.algorithm.adv_estimator = "grpo"
  config.algorithm.norm_adv_by_std_in_grpo = True

  config.trainer.test_freq = 5
  config.trainer.experiment_name = "grpo_qwen2_5_0_5b"
  return config
