"""The CPU quickstart with LoRA: PPO trains rank-r adapters on every linear layer and the LM head of the tiny
decoder; its base weights stay as initialised and are the reference policy.

A from-scratch base has an LM head at init scale, and with the final norm frozen such a head bounds the logits:
no token can get more than ~6% of the probability, so adapters on the layers alone cannot make the policy
choose (the full-rank run without the head stayed at validation 0.125). So the head is untied from the
embedding and adapted too (`lm_head` in target_modules, as PEFT names it), and the learning rate is 10x the
full fine-tune's, as verl recommends for LoRA. The critic trains fully, as in configs/quickstart.py.

    python train.py --config configs/quickstart_lora.py
"""

import os

from jaxrlhf.config import load_config_file


def get_config():
  config = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "quickstart.py"))
  model = config.actor_rollout_ref.model
  model.override_config.tie_word_embeddings = False  # LoRA on the LM head needs a head of its own
  model.lora_rank = 64  # full rank on this 64-wide model: the base has no skills for a low-rank update to steer
  model.lora_alpha = 128
  model.target_modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]
  config.trainer.experiment_name = "recall_ppo_lora"
  return config
