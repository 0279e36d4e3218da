#!/usr/bin/env bash
# Delete a TPU VM or pod (stops the billing; the disks go with it: copy checkpoints off first).
#
# Needs: gcloud.
#   TPU_NAME=rlhf ZONE=us-east5-a tpu_scripts/delete.sh [--dry-run]
set -euo pipefail
# shellcheck source=tpu_scripts/common.sh
source "$(dirname "$0")/common.sh"
run gcloud compute tpus tpu-vm delete "$TPU_NAME" "${LOCATION[@]}" --quiet
