"""PPO with a critic (GAE) on GSM8K, Qwen2.5-7B-Instruct on one 8xH100 node (verl's qwen2-7b PPO example).

Data: verl-format parquet written by examples/data_preprocess/gsm8k.py from a local GSM8K copy
(the Hub's openai/gsm8k `main/` folder), model: a local Qwen2.5-7B-Instruct download.

    hf download openai/gsm8k --repo-type dataset --include "main/*" --local-dir ~/raw/gsm8k
    python examples/data_preprocess/gsm8k.py --local_dir ~/raw/gsm8k/main --output_dir ~/data/gsm8k
    hf download Qwen/Qwen2.5-7B-Instruct --local-dir ~/models/Qwen2.5-7B-Instruct
    python train.py --config configs/ppo_gsm8k_qwen2_5_7b.py

Ahead-of-time check for the node, from the architecture file alone (no weights):

    python -m jaxrlhf.aot --config configs/ppo_gsm8k_qwen2_5_7b.py \
        --config.actor_rollout_ref.model.path=configs/models/qwen2.5-7b-instruct --target h100x8

What changes from the 0.5B recipe:
- `mesh.fsdp=8`: actor, critic and optimiser state split 8 ways (fp32 weights and Adam moments: about
  11 GB a GPU for each of the two 7B models).
- Generation gathers the actor over FSDP (`rollout.tensor_model_parallel_size=1`, a 15 GB bf16 copy on
  every GPU). Splitting it 8 ways instead (`= mesh.fsdp`) is not possible: the model's 4 KV heads do
  not divide by 8.
- Micro-batches of 4096 tokens per GPU: 4 rows of prompt + response (512 + 512), the token form of
  verl's `ppo_micro_batch_size_per_gpu=4`, with gradient checkpointing and bf16 compute.
"""

import os

from jaxrlhf.config import load_config_file


def get_config():
  config = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ppo_gsm8k_qwen2_5_0_5b.py"))
  config.actor_rollout_ref.model.path = os.path.expanduser("~/models/Qwen2.5-7B-Instruct")
  # With use_dynamic_bsz the token budget sizes the actor's and the critic's micro-batches.
  config.actor_rollout_ref.actor.ppo_max_token_len_per_gpu = 4096
  config.trainer.experiment_name = "ppo_qwen2_5_7b"
  config.mesh.fsdp = 8
  return config
