# shellcheck shell=bash
# Shared by the tpu_scripts/*.sh: the TPU's name and place, and --dry-run. Sourced, not run.
#
# Set (environment):  TPU_NAME (required), ZONE (required), PROJECT (default: gcloud's configured project),
#   ACCELERATOR_TYPE (default v5p-8; a pod is e.g. v5p-32, v5litepod-16, v4-32, v6e-16),
#   RUNTIME_VERSION (default: the TPU VM image for that generation), REMOTE_DIR (default: ~/jaxrlhf).
# A first argument `--dry-run` prints every gcloud command instead of running it.

DRY_RUN=0
if [[ "${1:-}" == "--dry-run" ]]; then
  DRY_RUN=1
  shift
fi
# shellcheck disable=SC2034  # read by launch.sh
SCRIPT_ARGS=("$@")

TPU_NAME=${TPU_NAME:?set TPU_NAME (the TPU VM or pod name)}
ZONE=${ZONE:?set ZONE (e.g. us-east5-a for v5p, us-central2-b for v4)}
ACCELERATOR_TYPE=${ACCELERATOR_TYPE:-v5p-8}
REMOTE_DIR=${REMOTE_DIR:-'~/jaxrlhf'}
LOG_FILE=${LOG_FILE:-'~/jaxrlhf_train.log'}
if [[ -z "${RUNTIME_VERSION:-}" ]]; then
  case "$ACCELERATOR_TYPE" in
    v5p-*) RUNTIME_VERSION=v2-alpha-tpuv5 ;;
    v5litepod-*) RUNTIME_VERSION=v2-alpha-tpuv5-lite ;;
    v6e-*) RUNTIME_VERSION=v2-alpha-tpuv6e ;;
    *) RUNTIME_VERSION=tpu-ubuntu2204-base ;;
  esac
fi
LOCATION=(--zone="$ZONE")
if [[ -n "${PROJECT:-}" ]]; then
  LOCATION+=(--project="$PROJECT")
fi

# One word as a shell reads it back: bare when safe, else in single quotes.
quote() {
  if [[ "$1" =~ ^[A-Za-z0-9_./:=@%+,~-]+$ ]]; then
    printf '%s' "$1"
  else
    printf "'%s'" "${1//\'/\'\\\'\'}"
  fi
}

# Runs a command, or prints it (one line, quoted so it can be pasted) with --dry-run.
run() {
  if [[ "$DRY_RUN" == 1 ]]; then
    local words=()
    for word in "$@"; do
      words+=("$(quote "$word")")
    done
    echo "${words[*]}"
  else
    "$@"
  fi
}

# `gcloud compute tpus tpu-vm ssh` on every worker of the pod (one host per 4 chips), running $1.
on_workers() {
  run gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${LOCATION[@]}" --worker="${WORKER:-all}" --command="$1"
}
