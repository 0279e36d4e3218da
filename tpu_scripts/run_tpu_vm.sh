#!/usr/bin/env bash
# Training on the TPU VM this runs on (all its local chips in one mesh); for a pod use launch.sh.
#
# Needs: a TPU VM with jaxrlhf installed with JAX for TPU (tpu_scripts/setup.sh does it).
#   tpu_scripts/run_tpu_vm.sh [--dry-run] configs/quickstart.py [--config.key=value | key=value ...]
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
COMMAND=("${PYTHON:-python}" train.py "${ARGS[@]}" "$@")
cd "$(dirname "$0")/.."
if [[ "$DRY_RUN" == 1 ]]; then
  printf '%q ' "${COMMAND[@]}"
  echo
  exit 0
fi
exec "${COMMAND[@]}"
