"""GRPO on GSM8K, Qwen2.5-7B-Instruct on one 8xH100 node: the 0.5B GRPO recipe at 7B.

Data: verl-format parquet written by examples/data_preprocess/gsm8k.py from a local GSM8K copy
(the Hub's openai/gsm8k `main/` folder), model: a local Qwen2.5-7B-Instruct download.

    hf download openai/gsm8k --repo-type dataset --include "main/*" --local-dir ~/raw/gsm8k
    python examples/data_preprocess/gsm8k.py --local_dir ~/raw/gsm8k/main --output_dir ~/data/gsm8k
    hf download Qwen/Qwen2.5-7B-Instruct --local-dir ~/models/Qwen2.5-7B-Instruct
    python train.py --config configs/grpo_gsm8k_qwen2_5_7b.py

Ahead-of-time check for the node, from the architecture file alone (no weights):

    python -m jaxrlhf.aot --config configs/grpo_gsm8k_qwen2_5_7b.py \
        --config.actor_rollout_ref.model.path=configs/models/qwen2.5-7b-instruct --target h100x8

What changes from the 0.5B recipe: `mesh.fsdp=8` (training state split 8 ways); generation gathers
the actor over FSDP (`rollout.tensor_model_parallel_size=1`: the 4 KV heads do not divide by 8, so
the generation copy cannot be split over all 8 GPUs); micro-batches of 6144 tokens per GPU, 4 rows of
prompt + response (512 + 1024), with gradient checkpointing and bf16 compute.
"""

import os

from jaxrlhf.config import load_config_file


def get_config():
  config = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "grpo_gsm8k_qwen2_5_0_5b.py"))
  config.actor_rollout_ref.model.path = os.path.expanduser("~/models/Qwen2.5-7B-Instruct")

  actor = config.actor_rollout_ref.actor
  actor.ppo_micro_batch_size_per_gpu = 4
  actor.ppo_max_token_len_per_gpu = 6144  # use_dynamic_bsz: this budget, not the row count, sizes micro-batches
  # Log-prob phases keep the 0.5B recipe's micro-batches of 16 sequences per GPU: with the activations pinned
  # to the batch layout they need 21.8 GiB per H100 at 4096-token responses (generation's 76.3 is the peak).

  config.trainer.experiment_name = "grpo_qwen2_5_7b"
  config.mesh.fsdp = 8
  return config
