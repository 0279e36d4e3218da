which=LR_SMALL
LR_SMALL=1e-7
LR=${!which}
python3 -m verl.trainer.main_ppo actor_rollout_ref.actor.optim.lr=$LR
