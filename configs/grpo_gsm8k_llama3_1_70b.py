"""GRPO on GSM8K, Llama-3.1-70B-Instruct on 8 nodes of 8xH200: the Qwen2.5-72B recipe for Llama.

Data: verl-format parquet written by examples/data_preprocess/gsm8k.py from a local GSM8K copy
(the Hub's openai/gsm8k `main/` folder), model: a local Llama-3.1-70B-Instruct download on every
node (a gated repository: accept Meta's licence on the Hub first). Start one process per node (64 GPUs
in one mesh):

    hf download openai/gsm8k --repo-type dataset --include "main/*" --local-dir ~/raw/gsm8k
    python examples/data_preprocess/gsm8k.py --local_dir ~/raw/gsm8k/main --output_dir ~/data/gsm8k
    hf download meta-llama/Llama-3.1-70B-Instruct --local-dir ~/models/Llama-3.1-70B-Instruct
    sbatch --nodes=8 gpu_scripts/slurm_multinode.sbatch configs/grpo_gsm8k_llama3_1_70b.py  # SLURM; or on each node:
    python train.py --config configs/grpo_gsm8k_llama3_1_70b.py --distributed

Ahead-of-time check for the 64 GPUs, from the architecture file alone (no weights):

    python -m jaxrlhf.aot --config configs/grpo_gsm8k_llama3_1_70b.py \
        --config.actor_rollout_ref.model.path=configs/models/llama-3.1-70b-instruct --target h200:8x8

Same shape class as Qwen2.5-72B (80 layers, width 8192, 64 query / 8 KV heads), so the same layout:
`mesh.tensor=8` inside a node, `mesh.fsdp=-1` (8) across nodes, generation split 8 ways over
`tensor` (about 18 GB of bf16 weights per GPU). Data, chat template (the model's own) and the GSM8K
reward rule are unchanged; Llama's tokenizer has no pad token, so padding uses its first EOS id.
"""

import os

from jaxrlhf.config import load_config_file


def get_config():
  config = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "grpo_gsm8k_qwen2_5_72b.py"))
  config.actor_rollout_ref.model.path = os.path.expanduser("~/models/Llama-3.1-70B-Instruct")
  config.trainer.experiment_name = "grpo_llama3_1_70b"
  return config
