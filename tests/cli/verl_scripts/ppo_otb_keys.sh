#!/usr/bin/env bash
# In the shape of verl's examples/ppo_trainer/run_qwen3-8b_npu.sh, otb_trainer/run_qwen2_5-7b.sh and
# prefix_grouper/run_qwen3_prefix_grouper.sh: the optimal token baseline with verl's sum(pi^2) switch,
# PrefixGrouper, activation offload, the critic's own checkpoint count, and sections that change nothing
# while their switch is off (mtp.enable, Megatron's lora.rank).
set -x

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=optimal_token_baseline \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    data.train_batch_size=128 \
    data.max_prompt_length=1024 \
    data.max_response_length=2048 \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-7B \
    actor_rollout_ref.model.enable_activation_offload=True \
    actor_rollout_ref.model.lora_adapter_path=null \
    actor_rollout_ref.model.mtp.enable=False \
    actor_rollout_ref.model.mtp.enable_train=True \
    actor_rollout_ref.model.lora.merge=True \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.actor.calculate_sum_pi_squared=True \
    actor_rollout_ref.actor.use_prefix_grouper=True \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.over_sample_rate=0 \
    data.custom_cls.path=null \
    critic.model.path=Qwen/Qwen2.5-7B \
    critic.model.enable_activation_offload=True \
    critic.model.fsdp_config.fsdp_size=-1 \
    trainer.max_actor_ckpt_to_keep=1 \
    trainer.max_critic_ckpt_to_keep=2 \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1
