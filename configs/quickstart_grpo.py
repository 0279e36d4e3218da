"""CPU quickstart, GRPO: group-relative advantages instead of a critic, on the built-in `recall` task.

The same tiny from-scratch decoder and task as configs/quickstart.py (PPO); here each prompt is
sampled n=8 times and every sample's advantage is its reward against its group's mean and std
(`algorithm.adv_estimator=grpo`); no critic, and the KL to the reference policy is a loss term
(`actor.use_kl_loss`), as in verl's GRPO examples. Greedy validation reward rises from 0 to ~1
by step ~100 (about two minutes on two CPU cores).

    python train.py --config configs/quickstart_grpo.py
    python train.py --config configs/quickstart_grpo.py --config.actor_rollout_ref.rollout.n=16
"""

import os

from jaxrlhf.config import load_config_file


def get_config():
  config = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "quickstart.py"))
  config.data.train_batch_size = 64  # x n=8 = 512 sequences per step
  config.actor_rollout_ref.rollout.n = 8
  # Two mini-batches of 32 prompts, a constant lr and a small entropy bonus, as measured here (the PPO
  # quickstart moved to 64, a cosine decay and 0.05 for its own robustness, issue 36).
  actor = config.actor_rollout_ref.actor
  actor.ppo_mini_batch_size = 32
  actor.optim.lr_scheduler_type = "constant"
  actor.entropy_coeff = 0.01

  config.critic.enable = False
  config.algorithm.adv_estimator = "grpo"
  config.algorithm.norm_adv_by_std_in_grpo = True
  config.algorithm.use_kl_in_reward = False

  config.trainer.total_training_steps = 150
  config.trainer.experiment_name = "recall_grpo"
  return config
