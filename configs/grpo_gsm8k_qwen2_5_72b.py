"""GRPO on GSM8K, Qwen2.5-72B-Instruct on 8 nodes of 8xH200: the 32B layout at 72B.

Data: verl-format parquet written by examples/data_preprocess/gsm8k.py from a local GSM8K copy
(the Hub's openai/gsm8k `main/` folder), model: a local Qwen2.5-72B-Instruct download on every node.
Start one process per node (64 GPUs in one mesh):

    hf download openai/gsm8k --repo-type dataset --include "main/*" --local-dir ~/raw/gsm8k
    python examples/data_preprocess/gsm8k.py --local_dir ~/raw/gsm8k/main --output_dir ~/data/gsm8k
    hf download Qwen/Qwen2.5-72B-Instruct --local-dir ~/models/Qwen2.5-72B-Instruct
    sbatch --nodes=8 gpu_scripts/slurm_multinode.sbatch configs/grpo_gsm8k_qwen2_5_72b.py  # SLURM; or on each node:
    python train.py --config configs/grpo_gsm8k_qwen2_5_72b.py --distributed

Ahead-of-time check for the 64 GPUs, from the architecture file alone (no weights):

    python -m jaxrlhf.aot --config configs/grpo_gsm8k_qwen2_5_72b.py \
        --config.actor_rollout_ref.model.path=configs/models/qwen2.5-72b-instruct --target h200:8x8

The 32B recipe's layout: `mesh.tensor=8` inside a node, `mesh.fsdp=-1` (8) across nodes, generation
split 8 ways over `tensor` (1/8 of the 145 GB bf16 copy, 18 GB, per GPU; 64 query / 8 KV heads);
fp32 weights and Adam moments take about 14 GB per GPU; micro-batches of 6144 tokens per GPU.
"""

import os

from jaxrlhf.config import load_config_file


def get_config():
  config = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "grpo_gsm8k_qwen2_5_32b.py"))
  config.actor_rollout_ref.model.path = os.path.expanduser("~/models/Qwen2.5-72B-Instruct")
  config.trainer.experiment_name = "grpo_qwen2_5_72b"
  return config
