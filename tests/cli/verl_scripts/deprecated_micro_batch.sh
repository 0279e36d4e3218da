# verl's deprecated global micro-batch sizes (as verl's older PPO examples wrote them), on 2 nodes of 8.
python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=gae \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    data.train_batch_size=1024 \
    actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct \
    actor_rollout_ref.actor.ppo_mini_batch_size=256 \
    actor_rollout_ref.actor.ppo_micro_batch_size=64 \
    actor_rollout_ref.actor.ulysses_sequence_parallel_size=2 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size=128 \
    actor_rollout_ref.ref.log_prob_micro_batch_size=256 \
    critic.model.path=Qwen/Qwen2-7B-Instruct \
    critic.ppo_micro_batch_size=32 \
    critic.forward_micro_batch_size=64 \
    actor_rollout_ref.actor.optim.clip_grad=0.5 \
    critic.optim.clip_grad=2.0 \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=2 $@
