"""CPU quickstart: PPO with a critic teaches a tiny from-scratch decoder the built-in `recall` task.

The task asks for the first or last digit of a list ("last : 5 8 2 7" -> "#### 7"), scored by the
GSM8K rule. Validation is greedy on 256 held-out lists every 25 steps: 0 before training, 0.2-0.4 at
step 25, >= 0.95 by step 75 (100 for one seed) and 1.0 at step 150 across the seeds and CPU numerics
swept by benchmarks/quickstart_robustness.py.

    python train.py --config configs/quickstart.py
    python train.py --config configs/quickstart.py --config.actor_rollout_ref.actor.optim.lr=3e-4
"""

from jaxrlhf.config import get_base_config


def get_config():
  config = get_base_config()

  config.data.train_files = ("builtin:recall:train",)
  config.data.val_files = ("builtin:recall:test",)
  config.data.tokenizer = "builtin:recall"
  config.data.max_prompt_length = 12
  config.data.max_response_length = 4
  # Twice the prompts of the earlier 64 x 300 steps for half the steps: the same samples and time, but each
  # update averages over twice the prompts. With 64 the run crossed 0.95 anywhere from step 225 to never (0.79
  # at seed 3; 0.711 on an AVX2 CPU, issue 36); benchmarks/quickstart_robustness.py has the sweep.
  config.data.train_batch_size = 128
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
  actor.ppo_mini_batch_size = 64
  actor.ppo_epochs = 2
  actor.shuffle = True
  actor.use_kl_loss = True
  actor.kl_loss_coef = 0.001
  actor.kl_loss_type = "low_var_kl"
  # The policy learns to answer digit by digit; with a small bonus (0.01) a digit it has stopped sampling can
  # stay unlearned for 100+ steps (seed 5 ended at 0.91: every prompt whose answer is 7 wrong). 0.05 keeps each digit
  # sampled (the mean entropy per token ends near 2; greedy validation and the sampled reward reach ~1).
  actor.entropy_coeff = 0.05
  actor.optim.lr = 1e-3
  # Cosine down to 1e-4 by the last step: at a constant lr a solved policy drifted (a seed fell back to 0.949).
  actor.optim.lr_scheduler_type = "cosine"
  actor.optim.min_lr_ratio = 0.1
  actor.optim.weight_decay = 0.0

  config.actor_rollout_ref.rollout.n = 4
  config.actor_rollout_ref.rollout.temperature = 1.0

  config.critic.optim.lr = 2e-3
  config.critic.optim.weight_decay = 0.0
  config.critic.cliprange_value = 0.5

  config.algorithm.adv_estimator = "gae"
  config.algorithm.gamma = 1.0
  config.algorithm.lam = 0.95

  config.trainer.total_training_steps = 150
  config.trainer.test_freq = 25
  config.trainer.log_val_generations = 8
  config.trainer.project_name = "quickstart"
  config.trainer.experiment_name = "recall_ppo"
  config.trainer.default_local_dir = "runs"
  config.trainer.resume_mode = "disable"
  config.mesh.fsdp = -1
  return config
