"""CPU quickstart with partial rollouts (`trainer.v1.trainer_mode=colocate_async`): configs/quickstart.py (PPO on the
built-in `recall` task) with its generation in 256 slots and a pool of two batches of prompt groups carried from
step to step (`jaxrlhf/rollout/partial.py`, docs/architecture.md "Partial rollouts"): each step decodes until 128
groups have finished, trains on the oldest of them and carries the rest, under the next step's weights.

    python train.py --config configs/quickstart_partial.py
"""

import os

from jaxrlhf.config import load_config_file


def get_config():
  config = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "quickstart.py"))
  config.actor_rollout_ref.rollout.max_num_seqs = 256  # half of a step's 128 prompts x n=4
  config.trainer.v1.trainer_mode = "colocate_async"
  config.trainer.v1.colocate_async.num_warmup_batches = 1
  config.trainer.experiment_name = "recall_ppo_partial"
  return config
