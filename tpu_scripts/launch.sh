#!/usr/bin/env bash
# Start training on every worker of a TPU VM / pod at once (--worker=all): one process per host, one mesh.
#
# Needs: gcloud, a TPU set up by setup.sh. `train.py --distributed` calls jax.distributed.initialize(),
# which finds the other hosts of a Cloud TPU pod by itself. The run survives the ssh session (nohup);
# each worker writes LOG_FILE (default ~/jaxrlhf_train.log); logs.sh follows it.
#   TPU_NAME=rlhf ZONE=us-east5-a tpu_scripts/launch.sh [--dry-run] configs/X.py [--config.key=value | key=value ...]
set -euo pipefail
# shellcheck source=tpu_scripts/common.sh
source "$(dirname "$0")/common.sh"
if [[ ${#SCRIPT_ARGS[@]} -eq 0 ]]; then
  echo "usage: $0 [--dry-run] [CONFIG.py] [--config.key=value | key=value ...]" >&2
  exit 2
fi
TRAIN_ARGS=()
if [[ "${SCRIPT_ARGS[0]}" == *.py ]]; then
  TRAIN_ARGS+=(--config "${SCRIPT_ARGS[0]}")
  SCRIPT_ARGS=("${SCRIPT_ARGS[@]:1}")
fi
TRAIN_ARGS+=(--distributed "${SCRIPT_ARGS[@]}")
QUOTED=$(printf '%q ' "${TRAIN_ARGS[@]}")
on_workers "cd $REMOTE_DIR && nohup .venv/bin/python train.py ${QUOTED}> $LOG_FILE 2>&1 &"
