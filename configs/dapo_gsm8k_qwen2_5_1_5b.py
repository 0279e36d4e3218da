"""DAPO on GSM8K, Qwen2.5-1.5B-Instruct: GRPO plus clip-higher, token-level loss, dynamic sampling
and overlong reward shaping, without any KL term (verl's recipe/dapo, sized for GSM8K).

Data: verl-format parquet written by examples/data_preprocess/gsm8k.py from a local GSM8K copy
(the Hub's openai/gsm8k `main/` folder), model: a local Qwen2.5-1.5B-Instruct download.

    python examples/data_preprocess/gsm8k.py --local_dir ~/raw/gsm8k/main --output_dir ~/data/gsm8k
    huggingface-cli download Qwen/Qwen2.5-1.5B-Instruct --local-dir ~/models/Qwen2.5-1.5B-Instruct
    python train.py --config configs/dapo_gsm8k_qwen2_5_1_5b.py
    python train.py --config configs/dapo_gsm8k_qwen2_5_1_5b.py --config.algorithm.filter_groups.enable=False

The four DAPO ingredients:
- clip-higher: `clip_ratio_low=0.2`, `clip_ratio_high=0.28` (room for low-probability tokens to grow);
- token-level policy loss: `loss_agg_mode=token-mean` over the whole mini-batch;
- dynamic sampling: generate `data.gen_batch_size` prompts per round, drop groups whose scores are
  all equal (no learning signal), and repeat until `train_batch_size` groups are kept;
- overlong shaping: responses that run into the last 512 tokens before `max_response_length` lose
  up to `penalty_factor` of their reward, linearly.
No KL (neither loss nor reward) and no entropy bonus, as in the DAPO paper.
"""

import os

from jaxrlhf.config import get_base_config

DATA_DIR = os.path.expanduser("~/data/gsm8k")
MODEL_PATH = os.path.expanduser("~/models/Qwen2.5-1.5B-Instruct")


def get_config():
  config = get_base_config()

  config.data.train_files = (os.path.join(DATA_DIR, "train.parquet"),)
  config.data.val_files = (os.path.join(DATA_DIR, "test.parquet"),)
  config.data.tokenizer = ""  # the model's own tokenizer and chat template
  config.data.max_prompt_length = 512
  config.data.max_response_length = 1024
  config.data.train_batch_size = 256
  config.data.gen_batch_size = 384  # 1.5x: spare groups for the ones dynamic sampling drops
  config.data.filter_overlong_prompts = True
  config.data.truncation = "error"

  model = config.actor_rollout_ref.model
  model.path = MODEL_PATH
  model.enable_gradient_checkpointing = True
  model.dtype = "bfloat16"
  model.param_dtype = "float32"

  actor = config.actor_rollout_ref.actor
  actor.optim.lr = 1e-6
  actor.optim.lr_warmup_steps = 10
  actor.optim.weight_decay = 0.1
  actor.ppo_mini_batch_size = 64  # prompts: 64 x 8 = 512 sequences per update
  actor.ppo_micro_batch_size_per_gpu = 4
  # Seeds: pack sequences and size micro-batches by tokens (same numbers, fewer padded tokens).
  config.actor_rollout_ref.model.use_remove_padding = True
  actor.use_dynamic_bsz = True
  actor.ppo_max_token_len_per_gpu = 16384
  actor.ppo_epochs = 1
  actor.clip_ratio_low = 0.2
  actor.clip_ratio_high = 0.28
  actor.clip_ratio_c = 10.0
  actor.loss_agg_mode = "token-mean"
  actor.entropy_coeff = 0.0
  actor.use_kl_loss = False
  actor.grad_clip = 1.0

  rollout = config.actor_rollout_ref.rollout
  rollout.n = 8
  rollout.temperature = 1.0
  rollout.top_p = 1.0
  rollout.tensor_model_parallel_size = 1
  rollout.log_prob_micro_batch_size_per_gpu = 16

  config.critic.enable = False

  reward = config.reward_model
  reward.overlong_buffer.enable = True
  reward.overlong_buffer.len = 512
  reward.overlong_buffer.penalty_factor = 1.0

  algorithm = config.algorithm
  algorithm.adv_estimator = "grpo"
  algorithm.norm_adv_by_std_in_grpo = True
  algorithm.use_kl_in_reward = False
  algorithm.filter_groups.enable = True
  algorithm.filter_groups.metric = "score"
  algorithm.filter_groups.max_num_gen_batches = 10

  trainer = config.trainer
  trainer.total_epochs = 10
  trainer.test_freq = 5
  trainer.save_freq = 20
  trainer.val_before_train = True
  trainer.logger = ("console", "jsonl")
  trainer.project_name = "gsm8k"
  trainer.experiment_name = "dapo_qwen2_5_1_5b"
  trainer.default_local_dir = "checkpoints"
  trainer.max_actor_ckpt_to_keep = 3

  config.mesh.data = 1
  config.mesh.fsdp = -1
  config.mesh.tensor = 1
  return config
