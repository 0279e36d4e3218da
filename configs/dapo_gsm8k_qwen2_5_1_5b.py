"""DAPO on GSM8K, Qwen2.5-1.5B-Instruct: GRPO plus clip-higher, token-level loss, dynamic sampling
and overlong reward shaping, without any KL term (verl's recipe/dapo, sized for GSM8K).

Data: verl-format parquet written by examples/data_preprocess/gsm8k.py from a local GSM8K copy
(the Hub's openai/gsm8k `main/` folder), model: a local Qwen2.5-1.5B-Instruct download.

    hf download openai/gsm8k --repo-type dataset --include "main/*" --local-dir ~/raw/gsm8k
    python examples/data_preprocess/gsm8k.py --local_dir ~/raw/gsm8k/main --output_dir ~/data/gsm8k
    hf download Qwen/Qwen2.5-1.5B-Instruct --local-dir ~/models/Qwen2.5-1.5B-Instruct
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

from jaxrlhf.config import load_config_file


def get_config():
  # The GRPO recipe with DAPO's changes, on the 1.5B model.
  config = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "grpo_gsm8k_qwen2_5_0_5b.py"))
  config.data.gen_batch_size = 384  # 1.5x: spare groups for the ones dynamic sampling drops
  config.actor_rollout_ref.model.path = os.path.expanduser("~/models/Qwen2.5-1.5B-Instruct")

  actor = config.actor_rollout_ref.actor
  actor.optim.lr_warmup_steps = 10
  actor.optim.weight_decay = 0.1
  actor.ppo_mini_batch_size = 64  # prompts: 64 x 8 = 512 sequences per update
  actor.ppo_micro_batch_size_per_gpu = 4
  actor.clip_ratio_low = 0.2
  actor.clip_ratio_high = 0.28
  actor.clip_ratio_c = 10.0
  actor.use_kl_loss = False
  config.actor_rollout_ref.rollout.n = 8

  overlong = config.reward_model.overlong_buffer
  overlong.enable, overlong.len, overlong.penalty_factor = True, 512, 1.0

  filter_groups = config.algorithm.filter_groups
  filter_groups.enable, filter_groups.metric, filter_groups.max_num_gen_batches = True, "score", 10

  config.trainer.total_epochs = 10
  config.trainer.experiment_name = "dapo_qwen2_5_1_5b"
  return config
