#!/usr/bin/env bash
# Multi-node GPU launch under SLURM: one process per node, every GPU of every node in one mesh.
#   sbatch --nodes=4 --ntasks-per-node=1 --gpus-per-node=8 gpu_scripts/run_multi_node_slurm.sh \
#       configs/grpo_gsm8k_qwen2_5_32b.py [--config.key=value ...]
# `train.py --distributed` calls jax.distributed.initialize(), which reads the coordinator, process
# count and index from SLURM. Outside SLURM: start `python train.py --config X --distributed
# --num_processes N --process_id I` on each host with JAX_COORDINATOR_ADDRESS=<host 0>:<port>.
set -euo pipefail
CONFIG=${1:?usage: $0 CONFIG [--config.key=value ...]}
shift
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}
export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_latency_hiding_scheduler=true"
cd "$(dirname "$0")/.."
exec srun --ntasks-per-node=1 python train.py --config "$CONFIG" --distributed "$@"
