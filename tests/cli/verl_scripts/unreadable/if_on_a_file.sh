# The learning rate depends on a file the reader cannot look at.
if [ -f "$HOME/.use_small_lr" ]; then
    LR=1e-7
fi
python3 -m verl.trainer.main_ppo \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    actor_rollout_ref.actor.optim.lr=$LR
