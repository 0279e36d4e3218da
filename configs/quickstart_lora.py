"""The CPU quickstart with LoRA: PPO trains rank-r adapters on every linear layer of the tiny decoder.

The base weights (embeddings, norms and the tied LM head included) stay as initialised and serve as the
reference policy; only the adapters (and the critic, fully) train. A from-scratch base has no skills for
adapters to steer, so the adapters are full rank for this 64-wide model and the learning rate higher.

    python train.py --config configs/quickstart_lora.py
"""

import os

from jaxrlhf.config import load_config_file


def get_config():
  config = load_config_file(os.path.join(os.path.dirname(__file__), "quickstart.py"))
  model = config.actor_rollout_ref.model
  model.lora_rank = 64
  model.lora_alpha = 128
  model.target_modules = "all-linear"
  config.actor_rollout_ref.actor.optim.lr = 3e-3
  config.trainer.experiment_name = "recall_ppo_lora"
  return config
