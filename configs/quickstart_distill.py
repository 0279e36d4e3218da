"""CPU quickstart of on-policy distillation: a fresh student learns the `recall` task from a teacher alone.

The teacher is the recall quickstart's trained actor (configs/quickstart.py, exported in HF format); the student,
the same tiny architecture from scratch, samples its own answers and is pulled towards the teacher's distribution
over the teacher's top-k tokens at every sampled position (verl's `forward_kl_topk`). No task reward reaches its
loss (`use_task_rewards=False`): the rule reward is only measured. docs/quickstarts.md gives the steps to 0.95
greedy validation against the PPO quickstart's.

    python train.py --config configs/quickstart.py --config.trainer.save_freq=150 --config.trainer.save_hf=True
    python train.py --config configs/quickstart_distill.py
    python train.py --config configs/quickstart_distill.py \\
        --config.distillation.teacher_model.model_path=runs/quickstart/recall_ppo/huggingface/global_step_100
"""

import os

from jaxrlhf.config import load_config_file


def get_config():
  config = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "quickstart.py"))

  distillation = config.distillation
  distillation.enabled = True
  distillation.teacher_model.model_path = "runs/quickstart/recall_ppo/huggingface/global_step_150"
  loss = distillation.distillation_loss
  loss.loss_mode = "forward_kl_topk"
  loss.topk = 8
  loss.use_task_rewards = False  # the teacher's signal alone
  loss.log_prob_min_clamp = -20.0  # a student far from the teacher: its log-probs at the teacher's tokens floored

  # No task reward trains the student, so neither a critic nor a KL loss to a reference has anything to do.
  config.algorithm.adv_estimator = "grpo"
  config.critic.enable = False
  actor = config.actor_rollout_ref.actor
  actor.use_kl_loss = False
  actor.entropy_coeff = 0.0
  actor.optim.lr = 1e-3

  config.trainer.total_training_steps = 50
  config.trainer.test_freq = 5
  config.trainer.experiment_name = "recall_distill"
  return config
