"""GRPO on GSM8K, Qwen3.5-4B on one 8xH100 node: the 7B GRPO recipe on Qwen3.5's hybrid layers.

Data: verl-format parquet written by examples/data_preprocess/gsm8k.py from a local GSM8K copy
(the Hub's openai/gsm8k `main/` folder), model: a local Qwen3.5-4B download (its
`Qwen3_5ForConditionalGeneration` checkpoint: the text model is loaded, the vision tower skipped).

    python examples/data_preprocess/gsm8k.py --local_dir ~/raw/gsm8k/main --output_dir ~/data/gsm8k
    hf download Qwen/Qwen3.5-4B --local-dir ~/models/Qwen3.5-4B
    python train.py --config configs/grpo_gsm8k_qwen3_5_4b.py

Ahead-of-time check for the node, from the architecture file alone (no weights):

    python -m jaxrlhf.aot --config configs/grpo_gsm8k_qwen3_5_4b.py \
        --config.actor_rollout_ref.model.path=configs/models/qwen3.5-4b --target h100x8

What changes from the 7B recipe: the model, 24 of whose 32 layers are Gated DeltaNet (`linear_attention`: a
recurrent state per row instead of a KV cache, docs/architecture.md) and 8 gated full attention; and
`use_remove_padding=False`, since a packed row would carry one sequence's recurrent state into the next (jaxrlhf
refuses packing for these layers). Generation gathers the actor over FSDP (`rollout.tensor_model_parallel_size=1`:
the 4 KV heads do not divide by 8).
"""

import os

from jaxrlhf.config import load_config_file


def get_config():
  config = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "grpo_gsm8k_qwen2_5_7b.py"))
  config.actor_rollout_ref.model.path = os.path.expanduser("~/models/Qwen3.5-4B")
  config.actor_rollout_ref.model.use_remove_padding = False  # the recurrence must not cross sequences
  config.trainer.experiment_name = "grpo_qwen3_5_4b"
  return config
