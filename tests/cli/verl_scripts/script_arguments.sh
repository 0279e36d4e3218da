#!/usr/bin/env bash
# The shape of verl's examples/grpo_trainer/run_qwen2-7b_math_trtllm.sh and the router-replay examples: the
# first argument picks the rollout TP (`${1:-4}`), the others are passed on ("${@:2}": no word at all when
# the script gets none, as "$@"), paths the user fills in are left empty (`key=` is '', as in Hydra), and
# a slice of an array of shared settings.
set -x

TP=${1:-4}
PROJECT_NAME=${PROJECT_NAME:-"verl_grpo_example_gsm8k_math"}
EXP_NAME=trtllm-qwen2-7b-tp${TP}-8gpus
DIST_CKPT_PATH=""
COMMON=( trainer.total_epochs=3 trainer.save_freq=20 trainer.test_freq=5 )

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files="['$HOME/data/gsm8k/train.parquet', '$HOME/data/math/train.parquet']" \
    data.train_batch_size=1024 \
    data.max_prompt_length=2048 \
    data.max_response_length=1024 \
    actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct \
    actor_rollout_ref.actor.ppo_mini_batch_size=256 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=${TP} \
    actor_rollout_ref.rollout.name=trtllm \
    actor_rollout_ref.rollout.n=5 \
    trainer.logger='["console","wandb"]' \
    trainer.project_name="${PROJECT_NAME}" \
    trainer.experiment_name=${EXP_NAME} \
    trainer.resume_from_path=$DIST_CKPT_PATH \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.total_epochs=15 \
    "${COMMON[@]:1}" \
    "${@:2}"
