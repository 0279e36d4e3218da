# `test && assignment` on something only the shell can test.
[ -f "$HOME/.use_small_lr" ] && LR=1e-7 || LR=1e-6
python3 -m verl.trainer.main_ppo actor_rollout_ref.actor.optim.lr=$LR
