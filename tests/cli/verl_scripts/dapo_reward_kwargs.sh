#!/usr/bin/env bash
# DAPO as verl 0.9.1's examples write it: the DAPO reward manager's kwargs, the `acc` filter metric, the
# optimizer's clip_grad, the global profiler, and engine settings jaxrlhf has no use for.
set -xeuo pipefail

max_prompt_length=$((1024 * 2))
max_response_length=$((1024 * 8))
overlong_buffer_len=$((1024 * 4))
offload=True

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files="$HOME/data/dapo-math-17k.parquet" \
    data.max_prompt_length=${max_prompt_length} \
    data.max_response_length=${max_response_length} \
    data.train_batch_size=512 \
    +data.gen_batch_size=1536 \
    algorithm.filter_groups.enable=True \
    algorithm.filter_groups.metric=acc \
    algorithm.filter_groups.max_num_gen_batches=10 \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-Math-7B \
    actor_rollout_ref.actor.optim.clip_grad=1.0 \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.entropy_checkpointing=True \
    actor_rollout_ref.actor.profiler.enable=True \
    actor_rollout_ref.actor.profiler.all_ranks=False \
    actor_rollout_ref.ref.use_torch_compile=False \
    actor_rollout_ref.ref.fsdp_config.param_offload=${offload} \
    actor_rollout_ref.rollout.max_model_len=$((max_prompt_length + max_response_length)) \
    actor_rollout_ref.rollout.multi_turn.enable=False \
    actor_rollout_ref.nccl_timeout=1200 \
    reward_model.reward_manager=dapo \
    reward_model.use_reward_loop=True \
    reward_model.num_workers=8 \
    reward_model.rollout.name=vllm \
    reward_model.rollout.gpu_memory_utilization=0.8 \
    +reward_model.reward_kwargs.overlong_buffer_cfg.enable=True \
    +reward_model.reward_kwargs.overlong_buffer_cfg.len=${overlong_buffer_len} \
    +reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0 \
    +reward_model.reward_kwargs.overlong_buffer_cfg.log=False \
    +reward_model.reward_kwargs.max_resp_len=${max_response_length} \
    global_profiler.tool=nsys \
    global_profiler.steps='[1,3]' \
    global_profiler.save_path=./outputs/profile \
    trainer.use_legacy_worker_impl=disable \
    trainer.logger='["console","swanlab","file"]' \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1
