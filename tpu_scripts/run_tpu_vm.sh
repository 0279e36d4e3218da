#!/usr/bin/env bash
# Training on the TPU VM this runs on (all its local chips in one mesh); for a pod use launch.sh.
#
# Needs: a TPU VM with jaxrlhf installed with JAX for TPU (tpu_scripts/setup.sh does it).
#   tpu_scripts/run_tpu_vm.sh [--dry-run] configs/quickstart.py [--config.key=value | key=value ...]
set -euo pipefail
# shellcheck source=scripts/train_command.sh
source "$(dirname "$0")/../scripts/train_command.sh"
parse_train_args "$@"
run_train
