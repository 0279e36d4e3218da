#!/usr/bin/env bash
#SBATCH --nodes=4
#SBATCH --gres=gpu:8
# A multi-node job: the node count comes from SLURM when it runs, so only the shell knows it (and what
# is computed from it); verl's deprecated global micro-batch sizes are divided over those GPUs.
set -x

GPUS_PER_NODE=8
NNODES=${SLURM_JOB_NUM_NODES}
EXTRA_ARGS=${EXTRA_ARGS:-}

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    data.train_batch_size=256 \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.actor.ppo_micro_batch_size=64 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size=128 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=4 \
    trainer.default_local_dir=$CHECKPOINT_ROOT/gsm8k \
    trainer.n_gpus_per_node=$GPUS_PER_NODE \
    trainer.nnodes=$NNODES \
    $EXTRA_ARGS
