#!/usr/bin/env bash
# Single-node GPU training: every visible GPU joins one mesh (its shape: --config.mesh.* or trainer.n_gpus_per_node).
#
# Needs: NVIDIA GPUs and jaxrlhf installed with JAX for CUDA (`pip install -e . 'jax[cuda12]'`), run from anywhere.
#   gpu_scripts/run_single_node.sh [--dry-run] configs/quickstart.py [--config.key=value | key=value ...]
set -euo pipefail
DRY_RUN=0
if [[ "${1:-}" == "--dry-run" ]]; then
  DRY_RUN=1
  shift
fi
if [[ $# -eq 0 ]]; then
  echo "usage: $0 [--dry-run] [CONFIG.py] [--config.key=value | key=value ...]" >&2
  exit 2
fi
ARGS=()
if [[ "$1" == *.py ]]; then
  ARGS+=(--config "$1")
  shift
fi
# Most of the GPU memory up front, and collectives overlapped with compute.
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}
export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_gpu_enable_latency_hiding_scheduler=true"
COMMAND=("${PYTHON:-python}" train.py "${ARGS[@]}" "$@")
cd "$(dirname "$0")/.."
if [[ "$DRY_RUN" == 1 ]]; then
  printf 'export %q\n' "XLA_PYTHON_CLIENT_MEM_FRACTION=$XLA_PYTHON_CLIENT_MEM_FRACTION" "XLA_FLAGS=$XLA_FLAGS"
  printf '%q ' "${COMMAND[@]}"
  echo
  exit 0
fi
exec "${COMMAND[@]}"
