# A script jaxrlhf cannot run, for several reasons at once (MoE routing replay, images, multi-turn tools, PRIME's
# reward manager, two misspelled keys): every one is reported in one run, one line each. Its Megatron
# parallelism translates (TP 4 -> mesh.tensor, PP 2 folded into FSDP).
python3 -m verl.trainer.main_ppo --config-path=config \
    --config-name='ppo_megatron_trainer.yaml' \
    algorithm.adv_estimator=grpo \
    data.train_files=$HOME/data/geo3k/train.parquet \
    data.image_key=images \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-VL-7B-Instruct \
    actor_rollout_ref.actor.strategy=megatron \
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2 \
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4 \
    actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=2 \
    actor_rollout_ref.actor.megatron.router_replay.mode=R2 \
    actor_rollout_ref.actor.megatron.router_replay.record_file=/tmp/routes.pt \
    actor_rollout_ref.rollout.multi_turn.enable=True \
    actor_rollout_ref.rollout.multi_turn.tool_config_path=tools.yaml \
    critic.pipeline_model_parallel_size=2 \
    reward_model.reward_manager=prime \
    trainer.total_trainig_steps=100 \
    trainer.n_gpus_per_node=8
