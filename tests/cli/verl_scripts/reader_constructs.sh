#!/usr/bin/env bash
# The bash that verl's newer recipes use: arrays of overrides, arithmetic with inner parentheses,
# a switch on a variable, defaults, and several overrides in one unquoted variable.
set -xeuo pipefail

project_name='GSPO'
exp_name="gspo-$(basename Qwen/Qwen2.5-3B-Instruct)"   # a command substitution the reader computes
max_prompt_length=$((1024 * 2))
max_response_length=$((1024 * 8))
actor_ppo_max_token_len=$(( (max_prompt_length + max_response_length) * 2 ))
infer_ppo_max_token_len=$(((max_prompt_length + max_response_length) * 3))
NNODES=${NNODES:-2}
rollout_mode="async"
if [ "$rollout_mode" = "async" ]; then
    return_raw_chat="True"
else
    return_raw_chat="False"
fi
if [[ $rollout_mode == sync* ]]; then
    n_resp=4
elif [[ "$NNODES" -ge 2 && $project_name != "" ]]; then
    n_resp=8
fi

DATA=(
    data.train_files="${HOME}/data/math/train.parquet"   # verl's math set
    data.val_files="['$HOME/data/math/test.parquet', '$HOME/data/aime/test.parquet']"
    data.max_prompt_length=${max_prompt_length}
    data.max_response_length=${max_response_length}
)
DATA+=( data.return_raw_chat=${return_raw_chat} )
ACTOR=( actor_rollout_ref.model.path=Qwen/Qwen2.5-3B-Instruct actor_rollout_ref.actor.ppo_mini_batch_size=32 )
SAMPLING="actor_rollout_ref.rollout.n=${n_resp} actor_rollout_ref.rollout.temperature=1.0"
LOSS_AGG=${LOSS_AGG:-}
[ -z "$LOSS_AGG" ] && LOSS_AGG=seq-mean-token-mean
[ -n "$LOSS_AGG" ] || LOSS_AGG=token-mean
cd "$HOME" || exit 1

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    "${DATA[@]}" \
    ${ACTOR[*]} \
    $SAMPLING \
    actor_rollout_ref.actor.policy_loss.loss_mode=gspo \
    actor_rollout_ref.actor.loss_agg_mode=${LOSS_AGG} \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=${actor_ppo_max_token_len} \
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=${infer_ppo_max_token_len} \
    trainer.logger='["console","wandb"]' \
    trainer.project_name="${project_name}" \
    trainer.experiment_name="${exp_name}-n${n_resp}" \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes="${NNODES}" "$@" 2>&1 | tee "${exp_name}.log"
exit 0
python3 -m verl.trainer.main_ppo trainer.total_epochs=1  # never reached
