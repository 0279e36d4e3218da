"""PPO with a critic (GAE) on GSM8K, Qwen2.5-1.5B-Instruct: the 0.5B recipe on the next size up.

Data: verl-format parquet written by examples/data_preprocess/gsm8k.py from a local GSM8K copy
(the Hub's openai/gsm8k `main/` folder), model: a local Qwen2.5-1.5B-Instruct download.

    hf download openai/gsm8k --repo-type dataset --include "main/*" --local-dir ~/raw/gsm8k
    python examples/data_preprocess/gsm8k.py --local_dir ~/raw/gsm8k/main --output_dir ~/data/gsm8k
    hf download Qwen/Qwen2.5-1.5B-Instruct --local-dir ~/models/Qwen2.5-1.5B-Instruct
    python train.py --config configs/ppo_gsm8k_qwen2_5_1_5b.py

Ahead-of-time check on one 8xH100 node, from the architecture file alone (no weights):

    python -m jaxrlhf.aot --config configs/ppo_gsm8k_qwen2_5_1_5b.py \
        --config.actor_rollout_ref.model.path=configs/models/qwen2.5-1.5b-instruct --target h100x8

Everything else is the 0.5B recipe: every device on one FSDP axis (`mesh.fsdp=-1`, any GPU count),
a 1.5B critic from the same checkpoint, micro-batches of 16384 tokens per device.
"""

import os

from jaxrlhf.config import load_config_file


def get_config():
  config = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ppo_gsm8k_qwen2_5_0_5b.py"))
  config.actor_rollout_ref.model.path = os.path.expanduser("~/models/Qwen2.5-1.5B-Instruct")
  config.trainer.experiment_name = "ppo_qwen2_5_1_5b"
  return config
