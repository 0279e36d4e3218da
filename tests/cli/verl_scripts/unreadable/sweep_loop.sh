# A sweep: one verl run per learning rate.
for lr in 1e-6 3e-6; do
    python3 -m verl.trainer.main_ppo \
        data.train_files=$HOME/data/gsm8k/train.parquet \
        actor_rollout_ref.actor.optim.lr=$lr
done
