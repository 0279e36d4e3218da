#!/usr/bin/env bash
# Single TPU VM launch (all local chips in one mesh):
#   tpu_scripts/run_tpu_vm.sh configs/quickstart.py --config.mesh.fsdp=-1
set -euo pipefail
CONFIG=${1:?usage: $0 CONFIG [--config.key=value ...]}
shift
cd "$(dirname "$0")/.."
exec python train.py --config "$CONFIG" "$@"
