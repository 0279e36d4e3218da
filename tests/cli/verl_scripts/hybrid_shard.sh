#!/usr/bin/env bash
# In the shape of verl's examples/gmpo_trainer/test_dapo_7b_math.sh and the NPU GSPO/GRPO examples: hybrid
# sharding (FSDP groups of 32 over 8 x 8 GPUs), Ulysses SP 4 and rollout TP 4 inside a group, the ref's
# own strategy and head chunking, SGLang's staged wake-up.
set -xeuo pipefail

NNODES=${NNODES:-8}
sp_size=4
gen_tp=4
fsdp_size=32
max_prompt_length=$((1024 * 2))
max_response_length=$((1024 * 8))
actor_ppo_max_token_len=$(((max_prompt_length + max_response_length) * 2))

python3 -m verl.trainer.main_ppo \
    data.train_files="${HOME}/data/dapo-math-17k.parquet" \
    data.max_prompt_length=${max_prompt_length} \
    data.max_response_length=${max_response_length} \
    data.train_batch_size=512 \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-Math-7B \
    actor_rollout_ref.actor.strategy=fsdp2 \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=${actor_ppo_max_token_len} \
    actor_rollout_ref.actor.ulysses_sequence_parallel_size=${sp_size} \
    actor_rollout_ref.actor.fsdp_config.fsdp_size=${fsdp_size} \
    actor_rollout_ref.actor.entropy_checkpointing=True \
    actor_rollout_ref.actor.entropy_from_logits_with_chunking=True \
    actor_rollout_ref.ref.strategy=fsdp2 \
    actor_rollout_ref.ref.entropy_checkpointing=True \
    actor_rollout_ref.ref.entropy_from_logits_with_chunking=True \
    actor_rollout_ref.ref.ulysses_sequence_parallel_size=${sp_size} \
    actor_rollout_ref.rollout.name=sglang \
    actor_rollout_ref.rollout.tensor_model_parallel_size=${gen_tp} \
    actor_rollout_ref.rollout.multi_stage_wake_up=True \
    actor_rollout_ref.rollout.n=16 \
    trainer.logger='["console"]' \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes="${NNODES}" \
    trainer.total_epochs=10
