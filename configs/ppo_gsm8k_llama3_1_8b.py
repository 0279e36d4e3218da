"""PPO with a critic (GAE) on GSM8K, Llama-3.1-8B-Instruct on a TPU v5p-64 slice or one 8xH100 node.

Data: verl-format parquet written by examples/data_preprocess/gsm8k.py from a local GSM8K copy
(the Hub's openai/gsm8k `main/` folder), model: a local Llama-3.1-8B-Instruct download (a gated
repository: accept Meta's licence on the Hub first). On the v5p slice, run the command with
`--distributed` on every host (one process per host, one mesh).

    hf download openai/gsm8k --repo-type dataset --include "main/*" --local-dir ~/raw/gsm8k
    python examples/data_preprocess/gsm8k.py --local_dir ~/raw/gsm8k/main --output_dir ~/data/gsm8k
    hf download meta-llama/Llama-3.1-8B-Instruct --local-dir ~/models/Llama-3.1-8B-Instruct
    python train.py --config configs/ppo_gsm8k_llama3_1_8b.py

Ahead-of-time checks for both targets, from the architecture file alone (no weights):

    python -m jaxrlhf.aot --config configs/ppo_gsm8k_llama3_1_8b.py \
        --config.actor_rollout_ref.model.path=configs/models/llama-3.1-8b-instruct --target v5p-64
    python -m jaxrlhf.aot --config configs/ppo_gsm8k_llama3_1_8b.py \
        --config.actor_rollout_ref.model.path=configs/models/llama-3.1-8b-instruct --target h100x8

The 7B PPO recipe with every device on one FSDP axis (`mesh.fsdp=-1`: 32 v5p chips or 8 GPUs) and
generation gathered over it (`rollout.tensor_model_parallel_size=1`, a 16 GB bf16 copy per device);
micro-batches of 4096 tokens per device. Data, chat template (the model's own) and the GSM8K reward
rule are unchanged; Llama's tokenizer has no pad token, so padding uses its first EOS id.
"""

import os

from jaxrlhf.config import load_config_file


def get_config():
  config = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ppo_gsm8k_qwen2_5_7b.py"))
  config.actor_rollout_ref.model.path = os.path.expanduser("~/models/Llama-3.1-8B-Instruct")
  config.trainer.experiment_name = "ppo_llama3_1_8b"
  config.mesh.fsdp = -1
  return config
