#!/usr/bin/env bash
# Single-node GPU training: every visible GPU joins one mesh (its shape: --config.mesh.* or trainer.n_gpus_per_node).
#
# Needs: NVIDIA GPUs and jaxrlhf installed with JAX for CUDA (`pip install -e . 'jax[cuda12]'`), run from anywhere.
#   gpu_scripts/run_single_node.sh [--dry-run] configs/quickstart.py [--config.key=value | key=value ...]
set -euo pipefail
# shellcheck source=scripts/train_command.sh
source "$(dirname "$0")/../scripts/train_command.sh"
parse_train_args "$@"
# Most of the GPU memory up front, and collectives overlapped with compute.
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}
export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_gpu_enable_latency_hiding_scheduler=true"
DRY_RUN_EXPORTS=(XLA_PYTHON_CLIENT_MEM_FRACTION XLA_FLAGS)
run_train
