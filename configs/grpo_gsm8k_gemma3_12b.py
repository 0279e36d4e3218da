"""GRPO on GSM8K, Gemma 3 12B (instruction-tuned) on one 8xH100 node: the 7B GRPO recipe on Gemma 3's interleaved
sliding-window layers.

Data: verl-format parquet written by examples/data_preprocess/gsm8k.py from a local GSM8K copy
(the Hub's openai/gsm8k `main/` folder), model: a local gemma-3-12b-it download (its `Gemma3ForConditionalGeneration`
checkpoint: the text model is loaded, the vision tower skipped).

    hf download openai/gsm8k --repo-type dataset --include "main/*" --local-dir ~/raw/gsm8k
    python examples/data_preprocess/gsm8k.py --local_dir ~/raw/gsm8k/main --output_dir ~/data/gsm8k
    hf download google/gemma-3-12b-it --local-dir ~/models/gemma-3-12b-it
    python train.py --config configs/grpo_gsm8k_gemma3_12b.py

Ahead-of-time check for the node, from the architecture file alone (no weights):

    python -m jaxrlhf.aot --config configs/grpo_gsm8k_gemma3_12b.py \
        --config.actor_rollout_ref.model.path=configs/models/gemma-3-12b-it --target h100x8

What changes from the 7B recipe: the model, 40 of whose 48 layers attend over a 1,024-token window (their KV cache a
ring of 1,024 columns, docs/architecture.md) and 8 over the whole sequence; generation splits it over the node's 8 GPUs
(`rollout.tensor_model_parallel_size=8`: the 8 KV heads divide by 8); its 262,144-token vocabulary makes the LM head
the largest single matmul, read in chunks (`model.logits_chunk_size`).
"""

import os

from jaxrlhf.config import load_config_file


def get_config():
  config = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "grpo_gsm8k_qwen2_5_7b.py"))
  config.actor_rollout_ref.model.path = os.path.expanduser("~/models/gemma-3-12b-it")
  config.actor_rollout_ref.rollout.tensor_model_parallel_size = 8
  # One generation shard (TP 8 over the node): 128 slots bound the cache to 128 rows (all 1280 at once: 65 GiB a GPU;
  # 256 slots: 85.7 GiB per GPU in all).
  config.actor_rollout_ref.rollout.max_num_seqs = 128
  config.trainer.experiment_name = "grpo_gemma3_12b"
  return config
