#!/usr/bin/env bash
# The command line shared by gpu_scripts/run_single_node.sh and tpu_scripts/run_tpu_vm.sh (sourced by them).
#
# Set (environment): PYTHON (default python).
#   parse_train_args "$@"   sets DRY_RUN (0 or 1) and COMMAND (python train.py [--config CONFIG.py] ARGS...)
#                           from [--dry-run] [CONFIG.py] [--config.key=value | key=value ...]
#   run_train               from the repository root: runs COMMAND, or with --dry-run prints
#                           `export VAR=value` for each VAR in the array DRY_RUN_EXPORTS, then COMMAND
parse_train_args() {
  DRY_RUN=0
  DRY_RUN_EXPORTS=()
  if [[ "${1:-}" == "--dry-run" ]]; then
    DRY_RUN=1
    shift
  fi
  if [[ $# -eq 0 ]]; then
    echo "usage: $0 [--dry-run] [CONFIG.py] [--config.key=value | key=value ...]" >&2
    exit 2
  fi
  local config=()
  if [[ "$1" == *.py ]]; then
    config+=(--config "$1")
    shift
  fi
  COMMAND=("${PYTHON:-python}" train.py "${config[@]}" "$@")
}

run_train() {
  cd "$(dirname "$0")/.." || exit 1
  if [[ "$DRY_RUN" == 1 ]]; then
    local var
    for var in "${DRY_RUN_EXPORTS[@]}"; do
      printf 'export %q\n' "$var=${!var}"
    done
    printf '%q ' "${COMMAND[@]}"
    echo
    exit 0
  fi
  exec "${COMMAND[@]}"
}
