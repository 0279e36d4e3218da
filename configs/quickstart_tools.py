"""CPU quickstart with a tool: GRPO teaches a tiny from-scratch decoder to call a tool and use its answer.

The built-in `lookup` task asks "secret ?", a digit that only the row's `lookup` tool knows (docs/tools.md): a
guess scores 0.1, a policy that calls the tool (one token, a hermes `<tool_call>`), reads the tool's reply and
answers `#### <digit>` scores 1. Multi-turn rollouts (`actor_rollout_ref.rollout.multi_turn`, verl's keys): the
turn ends at the tool call, the tool runs on the host, its reply enters the sequence out of the loss, the policy
answers in a second turn. Validation (greedy) reports the reward (`acc`) and the tool-call metrics.

    python train.py --config configs/quickstart_tools.py
"""

import os

from jaxrlhf.config import load_config_file


def get_config():
  config = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "quickstart.py"))

  config.data.train_files = ("builtin:lookup:train",)
  config.data.val_files = ("builtin:lookup:test",)
  config.data.tokenizer = "builtin:lookup"  # the built-in words and the tool task's
  config.data.max_prompt_length = 6
  config.data.max_response_length = 8
  config.actor_rollout_ref.model.override_config.vocab_size = 40  # the built-in tokenizer's 35 words
  config.data.train_batch_size = 64
  config.data.val_batch_size = 256

  rollout = config.actor_rollout_ref.rollout
  rollout.n = 8
  multi_turn = rollout.multi_turn
  multi_turn.enable = True
  multi_turn.tool_config_path = "builtin:lookup"
  multi_turn.max_assistant_turns = 2

  # As configs/quickstart_grpo.py: two mini-batches of 32 prompts, two epochs, a constant lr, a small entropy bonus.
  actor = config.actor_rollout_ref.actor
  actor.ppo_mini_batch_size = 32
  actor.optim.lr_scheduler_type = "constant"
  actor.use_kl_loss = False
  actor.entropy_coeff = 0.01

  config.critic.enable = False
  config.algorithm.adv_estimator = "grpo"

  config.trainer.total_training_steps = 200
  config.trainer.test_freq = 25
  config.trainer.project_name = "quickstart"
  config.trainer.experiment_name = "lookup_tools_grpo"
  return config
