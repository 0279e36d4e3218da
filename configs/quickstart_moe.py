"""CPU quickstart on a tiny from-scratch mixture-of-experts model (Qwen3-MoE's layers): PPO with a critic on the
built-in `recall` task.

The model is `configs/quickstart.py`'s with each layer's MLP replaced by 8 experts of which every token uses 2
(`models/moe.py`: a softmax router, dropless grouped matmuls), q/k norms as Qwen3's, and HF's load-balancing loss in
the actor's loss (`output_router_logits`, weight 0.01; `actor/moe_aux_loss` and `actor/moe_expert_load_max` show the
balance).

    python train.py --config configs/quickstart_moe.py
"""

import os

from jaxrlhf.config import load_config_file


def get_config():
  config = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "quickstart.py"))
  model = config.actor_rollout_ref.model.override_config
  model.model_type = "qwen3_moe"
  model.head_dim = 16
  model.num_experts = 8
  model.num_experts_per_tok = 2
  model.moe_intermediate_size = 64
  model.norm_topk_prob = True
  model.output_router_logits = True
  model.router_aux_loss_coef = 0.01
  config.trainer.experiment_name = "recall_ppo_moe"
  return config
