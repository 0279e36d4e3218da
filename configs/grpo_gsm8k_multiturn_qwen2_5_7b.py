"""Multi-turn GRPO on GSM8K with the GSM8K tool, Qwen2.5-7B-Instruct on one 8xH100 node: verl's
sglang_multiturn GSM8K example (the policy checks its answer with `calc_gsm8k_reward` between turns) on the 7B
GRPO recipe.

Data: verl's multi-turn rows, written by examples/data_preprocess/gsm8k_multiturn_w_tool.py from a local GSM8K
copy; model: a local Qwen2.5-7B-Instruct download (its chat template renders the tool schema and hermes calls).

    hf download openai/gsm8k --repo-type dataset --include "main/*" --local-dir ~/raw/gsm8k
    python examples/data_preprocess/gsm8k_multiturn_w_tool.py --local_dir ~/raw/gsm8k/main \
        --output_dir ~/data/gsm8k_multiturn
    python train.py --config configs/grpo_gsm8k_multiturn_qwen2_5_7b.py

Ahead-of-time check for the node (the programs the run compiles: generation weights, prefill, one turn, reward,
the training phases), from the architecture file alone:

    python -m jaxrlhf.aot --config configs/grpo_gsm8k_multiturn_qwen2_5_7b.py \
        --config.actor_rollout_ref.model.path=configs/models/qwen2.5-7b-instruct --target h100x8

verl's example settings: up to 5 assistant turns, one tool call per turn, tool responses of 256 characters,
prompts of 1024 tokens (the system prompt and tool schema take ~400) and 1024 response tokens for the whole
trajectory (the tool responses included). The 7B recipe's batch: 256 prompts x n=5 (verl's 3B example takes
n=16; at 7B the KV cache of 4096 trajectories of 2048 tokens alone is 60 GiB per H100).
"""

import os

from jaxrlhf.config import load_config_file


def get_config():
  config = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "grpo_gsm8k_qwen2_5_7b.py"))
  config.data.train_files = (os.path.expanduser("~/data/gsm8k_multiturn/train.parquet"),)
  config.data.val_files = (os.path.expanduser("~/data/gsm8k_multiturn/test.parquet"),)
  config.data.max_prompt_length = 1024
  config.data.max_response_length = 1024
  config.actor_rollout_ref.actor.ppo_max_token_len_per_gpu = 8192  # micro-batches of 4 rows of 1024 + 1024

  multi_turn = config.actor_rollout_ref.rollout.multi_turn
  multi_turn.enable = True
  multi_turn.tool_config_path = "builtin:gsm8k"  # verl's gsm8k_tool_config.yaml (calc_gsm8k_reward)
  multi_turn.max_assistant_turns = 5

  config.trainer.experiment_name = "grpo_multiturn_qwen2_5_7b"
  return config
