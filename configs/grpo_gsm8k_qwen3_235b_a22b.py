"""GRPO on GSM8K, Qwen3-235B-A22B (mixture of experts: 128 experts, 8 per token) on 8 nodes of 8xH200.

Data: verl-format parquet written by examples/data_preprocess/gsm8k.py from a local GSM8K copy
(the Hub's openai/gsm8k `main/` folder), model: a local Qwen3-235B-A22B download on every node.
Start one process per node (64 GPUs in one mesh):

    python examples/data_preprocess/gsm8k.py --local_dir ~/raw/gsm8k/main --output_dir ~/data/gsm8k
    hf download Qwen/Qwen3-235B-A22B --local-dir ~/models/Qwen3-235B-A22B
    sbatch --nodes=8 gpu_scripts/slurm_multinode.sbatch configs/grpo_gsm8k_qwen3_235b_a22b.py  # SLURM; or on each node:
    python train.py --config configs/grpo_gsm8k_qwen3_235b_a22b.py --distributed

Ahead-of-time check for the 64 GPUs, from the architecture file alone (no weights):

    python -m jaxrlhf.aot --config configs/grpo_gsm8k_qwen3_235b_a22b.py \
        --config.actor_rollout_ref.model.path=configs/models/qwen3-235b-a22b --target h200:8x8

The 72B recipe at 235B, for a model whose every layer routes each token to 8 of 128 experts (docs/architecture.md,
"Mixture of experts"). Training splits over `mesh.tensor=4` (the 4 KV heads do not divide by 8) and `mesh.fsdp=-1`
(16); generation splits the
470 GB bf16 copy 16 ways (`rollout.tensor_model_parallel_size=16`: 64 query heads and each expert's 1536 hidden
units over 16, the 4 KV heads repeated 4 times), 29 GB per GPU; the fp32 actor, its Adam moments and the fp32
reference are 3.76 TB, 59 GB a GPU, so the moments live in host memory (`optimizer_offload`).
"""

import os

from jaxrlhf.config import load_config_file


def get_config():
  config = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "grpo_gsm8k_qwen2_5_72b.py"))
  config.actor_rollout_ref.model.path = os.path.expanduser("~/models/Qwen3-235B-A22B")
  config.mesh.tensor = 4
  config.actor_rollout_ref.rollout.tensor_model_parallel_size = 16
  config.actor_rollout_ref.actor.fsdp_config.optimizer_offload = True
  config.trainer.experiment_name = "grpo_qwen3_235b_a22b"
  return config
