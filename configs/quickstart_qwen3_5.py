"""CPU quickstart on a tiny from-scratch Qwen3.5-style hybrid model: PPO with a critic on the built-in `recall` task.

The model is `configs/quickstart.py`'s with four layers in Qwen3.5's pattern: Gated DeltaNet linear attention
(`models/linear_attention.py`) then gated full attention, twice (`layer_types`), partial RoPE and (1 + w) norms.
Learning the task (greedy validation 0.0 -> 0.95 at step 50) needs gradients through the delta rule: the linear
layers carry the digits to the answer as much as the attention does.

    python train.py --config configs/quickstart_qwen3_5.py
"""

import os

from jaxrlhf.config import load_config_file


def get_config():
  config = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "quickstart.py"))
  model = config.actor_rollout_ref.model.override_config
  model.model_type = "qwen3_5_text"
  model.num_hidden_layers = 4
  model.layer_types = ("linear_attention", "full_attention") * 2
  model.head_dim = 16
  model.partial_rotary_factor = 0.25
  model.linear_num_key_heads = 2
  model.linear_num_value_heads = 4
  model.linear_key_head_dim = 16
  model.linear_value_head_dim = 16
  model.linear_conv_kernel_dim = 4
  config.trainer.experiment_name = "recall_ppo_qwen3_5"
  return config
