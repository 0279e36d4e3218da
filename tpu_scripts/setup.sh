#!/usr/bin/env bash
# Copy this repository to every worker of a TPU VM / pod and install jaxrlhf with JAX for TPU there.
#
# Needs: gcloud, git (the committed tree is what is copied: `git archive HEAD`), a TPU made by create.sh.
#   TPU_NAME=rlhf ZONE=us-east5-a tpu_scripts/setup.sh [--dry-run]
set -euo pipefail
# shellcheck source=tpu_scripts/common.sh
source "$(dirname "$0")/common.sh"
cd "$(dirname "$0")/.."
ARCHIVE=${ARCHIVE:-/tmp/jaxrlhf.tar.gz}
run git archive --format=tar.gz --output="$ARCHIVE" HEAD
run gcloud compute tpus tpu-vm scp "$ARCHIVE" "$TPU_NAME":jaxrlhf.tar.gz "${LOCATION[@]}" --worker=all
on_workers "mkdir -p $REMOTE_DIR && tar -xzf jaxrlhf.tar.gz -C $REMOTE_DIR && cd $REMOTE_DIR \
&& python3 -m venv .venv && .venv/bin/pip install --quiet -e . 'jax[tpu]'"
