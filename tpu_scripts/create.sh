#!/usr/bin/env bash
# Create a Cloud TPU VM or pod slice.
#
# Needs: gcloud (authenticated, `gcloud auth login`), TPU quota for ACCELERATOR_TYPE in ZONE.
#   TPU_NAME=rlhf ZONE=us-east5-a ACCELERATOR_TYPE=v5p-32 tpu_scripts/create.sh [--dry-run]
# SPOT=1 asks for spot capacity (cheaper, can be preempted); see tpu_scripts/common.sh for the variables.
set -euo pipefail
# shellcheck source=tpu_scripts/common.sh
source "$(dirname "$0")/common.sh"
EXTRA=()
if [[ "${SPOT:-0}" == 1 ]]; then
  EXTRA+=(--spot)
fi
run gcloud compute tpus tpu-vm create "$TPU_NAME" "${LOCATION[@]}" --accelerator-type="$ACCELERATOR_TYPE" \
  --version="$RUNTIME_VERSION" "${EXTRA[@]}"
