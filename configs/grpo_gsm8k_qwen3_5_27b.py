"""GRPO on GSM8K, Qwen3.5-27B on one 8xH100 node: tensor parallelism in generation, FSDP in training.

Data: verl-format parquet written by examples/data_preprocess/gsm8k.py from a local GSM8K copy
(the Hub's openai/gsm8k `main/` folder), model: a local Qwen3.5-27B download (its
`Qwen3_5ForConditionalGeneration` checkpoint: the text model is loaded, the vision tower skipped).

    python examples/data_preprocess/gsm8k.py --local_dir ~/raw/gsm8k/main --output_dir ~/data/gsm8k
    hf download Qwen/Qwen3.5-27B --local-dir ~/models/Qwen3.5-27B
    python train.py --config configs/grpo_gsm8k_qwen3_5_27b.py

Ahead-of-time check for the node, from the architecture file alone (no weights):

    python -m jaxrlhf.aot --config configs/grpo_gsm8k_qwen3_5_27b.py \
        --config.actor_rollout_ref.model.path=configs/models/qwen3.5-27b --target h100x8

What changes from the 4B recipe: generation splits the model over the node's 8 GPUs
(`rollout.tensor_model_parallel_size=8`: 24 query heads, 48 Gated DeltaNet value heads and their recurrent state
over 8; the 4 KV heads are repeated twice), so each GPU holds 1/8 of the bf16 generation copy (6.7 GB) instead of
all of it; training keeps FSDP over the 8 GPUs. Generation runs in 128 slots (`rollout.max_num_seqs`): with one
generation shard every GPU holds every row's recurrent state (1/8 of its heads), 22.5 GiB for the 1280 rows at once.
Micro-batches of 2 rows of 4096 tokens per GPU.

Measured ahead of time (h100x8, jax 0.10.2, 2026-12-07): 82.3 GiB per GPU at 64 slots, 85.0 at 128, against 79.1:
it does not fit yet. Generation is no longer the peak (157.4 GiB without slots, where the recurrent state
f32[48, 1280, 6, 128, 128] was 22.5 GiB a copy); the update is: the train state's 50.1 GiB (fp32 actor, Adam
moments, fp32 reference) and the LM head's gradient over the 248,320-token vocabulary (f32[5120, 248320], 4.7 GiB,
with bf16 companions). An h200x8 node, or a reference kept in bf16 as verl keeps it (6.3 GiB less), would fit.
"""

import os

from jaxrlhf.config import load_config_file


def get_config():
  config = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "grpo_gsm8k_qwen3_5_4b.py"))
  config.actor_rollout_ref.model.path = os.path.expanduser("~/models/Qwen3.5-27B")
  config.actor_rollout_ref.rollout.tensor_model_parallel_size = 8
  # One generation shard of 1280 rows: a Gated DeltaNet layer's fp32 state is 48 heads x 128 x 128 per row (150 MiB
  # per row over the 48 linear layers), so slots bound it as vLLM's max_num_seqs does.
  config.actor_rollout_ref.rollout.max_num_seqs = 128
  actor = config.actor_rollout_ref.actor
  actor.ppo_micro_batch_size_per_gpu = 2
  actor.ppo_max_token_len_per_gpu = 4096
  config.trainer.experiment_name = "grpo_qwen3_5_27b"
  return config
