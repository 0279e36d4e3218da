# Hydra's null for keys of every type: a str, an int, a float, a list and a bool, placeholders or not.
python3 -m verl.trainer.main_ppo \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    data.val_batch_size=null \
    data.val_files=null \
    actor_rollout_ref.rollout.dtype=null \
    actor_rollout_ref.actor.clip_ratio_high=null \
    critic.enable=null \
    trainer.total_training_steps=null \
    trainer.max_actor_ckpt_to_keep=null \
    global_profiler.steps=null
