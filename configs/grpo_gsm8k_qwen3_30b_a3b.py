"""GRPO on GSM8K, Qwen3-30B-A3B (mixture of experts: 128 experts, 8 per token) on one 8xH100 node.

Data: verl-format parquet written by examples/data_preprocess/gsm8k.py from a local GSM8K copy
(the Hub's openai/gsm8k `main/` folder), model: a local Qwen3-30B-A3B download.

    python examples/data_preprocess/gsm8k.py --local_dir ~/raw/gsm8k/main --output_dir ~/data/gsm8k
    hf download Qwen/Qwen3-30B-A3B --local-dir ~/models/Qwen3-30B-A3B
    python train.py --config configs/grpo_gsm8k_qwen3_30b_a3b.py

Ahead-of-time check for the node, from the architecture file alone (no weights):

    python -m jaxrlhf.aot --config configs/grpo_gsm8k_qwen3_30b_a3b.py \
        --config.actor_rollout_ref.model.path=configs/models/qwen3-30b-a3b --target h100x8

What changes from the 7B recipe: the model, whose every layer routes each token to 8 of 128 experts
(docs/architecture.md, "Mixture of experts"); generation splits it over the node's 8 GPUs
(`rollout.tensor_model_parallel_size=8`: the 32 query heads and each expert's 768 hidden units over 8, the 4 KV heads
repeated twice), so each GPU holds 1/8 of the 61 GB bf16 generation copy; the actor's Adam moments live in host
memory (`optimizer_offload`, as verl's FSDP recipes for this model offload): the fp32 actor, its moments and the fp32
reference are 488 GB, 61 GB a GPU, before any activation. Micro-batches of 2 rows of 4096 tokens per GPU.

Measured ahead of time (h100x8, jax 0.10.2, 2026-12-07): 98.0 GiB per GPU against 79.1, counting the offloaded
Adam moments (28.4 GiB) in device memory (the cuda target compiled on a CPU has no host memory): not shown to fit yet.
The peak is the update's optimizer step: with the experts split over fsdp on E (`parallel/layouts.py`) the transposed
copies of the stacked expert weights, gradients and moments are gone, and what remains is Adam's elementwise
temporaries over the stacked `f32[48, 16, 768, 2048]` experts (benchmarks/README.md, "Scale"). 128 slots or
`model.logits_chunk_size=512` leave the number where it is, so the recipe keeps 256 slots and the default chunk.
"""

import os

from jaxrlhf.config import load_config_file


def get_config():
  config = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "grpo_gsm8k_qwen2_5_7b.py"))
  config.actor_rollout_ref.model.path = os.path.expanduser("~/models/Qwen3-30B-A3B")
  config.actor_rollout_ref.rollout.tensor_model_parallel_size = 8
  # One generation shard (TP 8 over the node): 256 slots bound the KV cache to 256 rows (45 GiB for all 1280 at once).
  config.actor_rollout_ref.rollout.max_num_seqs = 256
  # Forward phases in micro-batches of 2 sequences per GPU, as the update's: 16 held 2M (token, expert) pairs a GPU,
  # 8 GiB per bf16 [pairs, hidden] buffer.
  config.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu = 2
  config.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu = 2
  actor = config.actor_rollout_ref.actor
  actor.fsdp_config.optimizer_offload = True
  actor.ppo_micro_batch_size_per_gpu = 2
  actor.ppo_max_token_len_per_gpu = 4096
  config.trainer.experiment_name = "grpo_qwen3_30b_a3b"
  return config
