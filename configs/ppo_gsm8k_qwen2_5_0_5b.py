"""PPO with a critic (GAE) on GSM8K, Qwen2.5-0.5B-Instruct: verl's GSM8K PPO example, GPU-sized.

Data: verl-format parquet written by examples/data_preprocess/gsm8k.py from a local GSM8K copy
(the Hub's openai/gsm8k `main/` folder), model: a local Qwen2.5-0.5B-Instruct download.

    hf download openai/gsm8k --repo-type dataset --include "main/*" --local-dir ~/raw/gsm8k
    python examples/data_preprocess/gsm8k.py --local_dir ~/raw/gsm8k/main --output_dir ~/data/gsm8k
    hf download Qwen/Qwen2.5-0.5B-Instruct --local-dir ~/models/Qwen2.5-0.5B-Instruct
    python train.py --config configs/ppo_gsm8k_qwen2_5_0_5b.py
    python train.py --config configs/ppo_gsm8k_qwen2_5_0_5b.py \
        --config.data.train_files="('/data/gsm8k/train.parquet',)" \
        --config.actor_rollout_ref.model.path=/models/Qwen2.5-0.5B-Instruct

Settings follow verl's examples and a common PPO checklist: 256 prompts per step in mini-batches of
64, actor lr 1e-6 / critic lr 1e-5, clip 0.2, GAE gamma 0.99 / lambda 0.95, value clip 0.2, a
low-variance KL loss of 0.001 to the reference, and every device on one FSDP axis (`mesh.fsdp=-1`).
The critic starts from the same checkpoint with a fresh value head.
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
  config.data.max_response_length = 512
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
  actor.ppo_mini_batch_size = 64
  actor.ppo_micro_batch_size_per_gpu = 4
  # Pack sequences and size micro-batches by tokens (same numbers, fewer padded tokens).
  config.actor_rollout_ref.model.use_remove_padding = True
  actor.use_dynamic_bsz = True
  actor.ppo_max_token_len_per_gpu = 16384
  actor.ppo_epochs = 1
  actor.clip_ratio = 0.2
  actor.entropy_coeff = 0.0
  actor.use_kl_loss = True
  actor.kl_loss_coef = 0.001
  actor.kl_loss_type = "low_var_kl"
  actor.grad_clip = 1.0

  rollout = config.actor_rollout_ref.rollout
  rollout.n = 1
  rollout.temperature = 1.0
  rollout.tensor_model_parallel_size = 1
  rollout.log_prob_micro_batch_size_per_gpu = 16

  critic = config.critic
  critic.enable = True
  critic.model.path = ""  # "" = the actor's checkpoint with a fresh value head
  critic.model.enable_gradient_checkpointing = True
  critic.model.dtype = "bfloat16"
  critic.optim.lr = 1e-5
  critic.cliprange_value = 0.2  # common practice: vf_clip_param 0.2
  critic.ppo_micro_batch_size_per_gpu = 4

  algorithm = config.algorithm
  algorithm.adv_estimator = "gae"
  algorithm.gamma = 0.99
  algorithm.lam = 0.95
  algorithm.use_kl_in_reward = False
  algorithm.kl_ctrl.kl_coef = 0.001

  trainer = config.trainer
  trainer.total_epochs = 15
  trainer.critic_warmup = 0
  trainer.test_freq = 10
  trainer.save_freq = 20
  trainer.val_before_train = True
  trainer.logger = ("console", "jsonl")
  trainer.project_name = "gsm8k"
  trainer.experiment_name = "ppo_qwen2_5_0_5b"
  trainer.default_local_dir = "checkpoints"
  trainer.max_actor_ckpt_to_keep = 3

  config.mesh.data = 1
  config.mesh.fsdp = -1
  config.mesh.tensor = 1
  return config
