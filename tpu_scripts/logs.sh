#!/usr/bin/env bash
# Follow the training log of one worker (WORKER, default 0: the host that writes metrics and checkpoints).
#
# Needs: gcloud, a run started by launch.sh.
#   TPU_NAME=rlhf ZONE=us-east5-a [WORKER=3] tpu_scripts/logs.sh [--dry-run]
set -euo pipefail
WORKER=${WORKER:-0}
# shellcheck source=tpu_scripts/common.sh
source "$(dirname "$0")/common.sh"
on_workers "tail -n 200 -f $LOG_FILE"
