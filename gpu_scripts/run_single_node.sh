#!/usr/bin/env bash
# Single-node GPU launch: every visible GPU joins one mesh (set its shape with --config.mesh.*).
#   gpu_scripts/run_single_node.sh configs/quickstart.py --config.mesh.fsdp=-1
set -euo pipefail
CONFIG=${1:?usage: $0 CONFIG [--config.key=value ...]}
shift
# Let XLA use most of the GPU memory up front, and overlap collectives with compute.
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}
export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_latency_hiding_scheduler=true"
cd "$(dirname "$0")/.."
exec python train.py --config "$CONFIG" "$@"
