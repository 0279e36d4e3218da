"""GRPO on GSM8K, Qwen2.5-32B-Instruct on 4 nodes of 8xH100: tensor parallelism inside each node.

Data: verl-format parquet written by examples/data_preprocess/gsm8k.py from a local GSM8K copy
(the Hub's openai/gsm8k `main/` folder), model: a local Qwen2.5-32B-Instruct download on every node.
Start one process per node (32 GPUs in one mesh):

    hf download openai/gsm8k --repo-type dataset --include "main/*" --local-dir ~/raw/gsm8k
    python examples/data_preprocess/gsm8k.py --local_dir ~/raw/gsm8k/main --output_dir ~/data/gsm8k
    hf download Qwen/Qwen2.5-32B-Instruct --local-dir ~/models/Qwen2.5-32B-Instruct
    sbatch --nodes=4 gpu_scripts/slurm_multinode.sbatch configs/grpo_gsm8k_qwen2_5_32b.py  # SLURM; or on each node:
    python train.py --config configs/grpo_gsm8k_qwen2_5_32b.py --distributed

Ahead-of-time check for the 32 GPUs, from the architecture file alone (no weights):

    python -m jaxrlhf.aot --config configs/grpo_gsm8k_qwen2_5_32b.py \
        --config.actor_rollout_ref.model.path=configs/models/qwen2.5-32b-instruct --target h100:4x8

What changes from the 7B GRPO recipe: `mesh.tensor=8` (one node's NVLink domain) with `mesh.fsdp=-1`
(4, across nodes): training state is split 32 ways, heads / MLP / vocabulary over the node's 8 GPUs.
Generation keeps the split over `tensor` and gathers over FSDP only
(`rollout.tensor_model_parallel_size=8`): each GPU holds 1/8 of the bf16 generation copy (8 GB), and
the 40 query / 8 KV heads divide by 8. Micro-batches stay at 6144 tokens per GPU.
"""

import os

from jaxrlhf.config import load_config_file


def get_config():
  config = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "grpo_gsm8k_qwen2_5_7b.py"))
  config.actor_rollout_ref.model.path = os.path.expanduser("~/models/Qwen2.5-32B-Instruct")
  config.actor_rollout_ref.rollout.tensor_model_parallel_size = 8
  config.trainer.experiment_name = "grpo_qwen2_5_32b"
  config.mesh.fsdp = -1
  config.mesh.tensor = 8
  return config
