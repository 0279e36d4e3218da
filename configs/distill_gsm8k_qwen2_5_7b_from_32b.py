"""On-policy distillation on GSM8K: a Qwen2.5-7B-Instruct student, a Qwen2.5-32B-Instruct teacher, one 8xH100 node.

The 7B GRPO recipe (configs/grpo_gsm8k_qwen2_5_7b.py) plus verl's `distillation.*` at its defaults: the task
reward's GRPO loss and the teacher's k3 reverse KL at every sampled token (`use_task_rewards=True`, coefficient
1). The teacher is frozen, in the train layout over the 8 GPUs like the reference, its weights in the rollout's
dtype (bf16): 32.8e9 x 2 bytes / 8 = 7.6 GiB per GPU.

    hf download Qwen/Qwen2.5-32B-Instruct --local-dir ~/models/Qwen2.5-32B-Instruct
    python train.py --config configs/distill_gsm8k_qwen2_5_7b_from_32b.py

Ahead-of-time check for the node, from the architecture files alone (no weights):

    python -m jaxrlhf.aot --config configs/distill_gsm8k_qwen2_5_7b_from_32b.py \\
        --config.actor_rollout_ref.model.path=configs/models/qwen2.5-7b-instruct \\
        --config.distillation.teacher_model.model_path=configs/models/qwen2.5-32b-instruct --target h100x8
"""

import os

from jaxrlhf.config import load_config_file


def get_config():
  config = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "grpo_gsm8k_qwen2_5_7b.py"))
  distillation = config.distillation
  distillation.enabled = True
  distillation.teacher_model.model_path = os.path.expanduser("~/models/Qwen2.5-32B-Instruct")
  distillation.distillation_loss.loss_mode = "k3"
  config.trainer.experiment_name = "distill_qwen2_5_7b_from_32b"
  return config
