"""CPU quickstart, GRPO: group-relative advantages instead of a critic, on the built-in `recall` task.

The same tiny from-scratch decoder and task as configs/quickstart.py (PPO); here each prompt is
sampled n=8 times and every sample's advantage is its reward against its group's mean and std
(`algorithm.adv_estimator=grpo`); no critic, and the KL to the reference policy is a loss term
(`actor.use_kl_loss`), as in verl's GRPO examples. Greedy validation reward rises from 0 to ~1
by step ~100 (about two minutes on two CPU cores).

    python train.py --config configs/quickstart_grpo.py
    python train.py --config configs/quickstart_grpo.py --config.actor_rollout_ref.rollout.n=16
"""

from jaxrlhf.config import get_base_config


def get_config():
  config = get_base_config()

  config.data.train_files = ("builtin:recall:train",)
  config.data.val_files = ("builtin:recall:test",)
  config.data.tokenizer = "builtin:recall"
  config.data.max_prompt_length = 12
  config.data.max_response_length = 4
  config.data.train_batch_size = 64  # x n=8 = 512 sequences per step
  config.data.val_batch_size = 256

  model = config.actor_rollout_ref.model
  model.override_config.vocab_size = 64
  model.override_config.hidden_size = 64
  model.override_config.intermediate_size = 128
  model.override_config.num_hidden_layers = 2
  model.override_config.num_attention_heads = 4
  model.override_config.num_key_value_heads = 2
  model.override_config.tie_word_embeddings = True
  model.override_config.max_position_embeddings = 64

  actor = config.actor_rollout_ref.actor
  actor.ppo_mini_batch_size = 32
  actor.ppo_epochs = 2
  actor.shuffle = True
  actor.use_kl_loss = True
  actor.kl_loss_coef = 0.001
  actor.kl_loss_type = "low_var_kl"
  actor.entropy_coeff = 0.01
  actor.optim.lr = 1e-3
  actor.optim.weight_decay = 0.0

  config.actor_rollout_ref.rollout.n = 8
  config.actor_rollout_ref.rollout.temperature = 1.0

  config.critic.enable = False
  config.algorithm.adv_estimator = "grpo"
  config.algorithm.norm_adv_by_std_in_grpo = True
  config.algorithm.use_kl_in_reward = False

  config.trainer.total_training_steps = 150
  config.trainer.test_freq = 25
  config.trainer.project_name = "quickstart"
  config.trainer.experiment_name = "recall_grpo"
  config.trainer.default_local_dir = "runs"
  config.trainer.resume_mode = "disable"
  config.mesh.fsdp = -1
  return config
