"""GRPO on GSM8K, gpt-oss-20b on one 8xH100 node: the 7B GRPO recipe on gpt-oss's alternating sliding-window layers
and experts.

Data: verl-format parquet written by examples/data_preprocess/gsm8k.py from a local GSM8K copy
(the Hub's openai/gsm8k `main/` folder), model: a bf16 copy of gpt-oss-20b in ~/models/gpt-oss-20b (the Hub's
checkpoint stores its experts in MXFP4, which jaxrlhf refuses: load it in transformers with
`Mxfp4Config(dequantize=True)` and save it there first).

    hf download openai/gsm8k --repo-type dataset --include "main/*" --local-dir ~/raw/gsm8k
    python examples/data_preprocess/gsm8k.py --local_dir ~/raw/gsm8k/main --output_dir ~/data/gsm8k
    hf download openai/gpt-oss-20b --local-dir ~/models/gpt-oss-20b-mxfp4
    python -c "import os, transformers as t; t.AutoModelForCausalLM.from_pretrained(os.path.expanduser(
      '~/models/gpt-oss-20b-mxfp4'), quantization_config=t.Mxfp4Config(dequantize=True), dtype='bfloat16'
      ).save_pretrained(os.path.expanduser('~/models/gpt-oss-20b'))"
    python train.py --config configs/grpo_gsm8k_gpt_oss_20b.py

Ahead-of-time check for the node, from the architecture file alone (no weights):

    python -m jaxrlhf.aot --config configs/grpo_gsm8k_gpt_oss_20b.py \
        --config.actor_rollout_ref.model.path=configs/models/gpt-oss-20b --target h100x8

What changes from the 7B recipe: the model, whose 24 layers alternate a 128-token window (a ring of 128 columns in
the generation cache) with full attention, each with learned attention sinks, and route each token to 4 of 32
experts (docs/architecture.md); generation splits it over the node's 8 GPUs (`rollout.tensor_model_parallel_size=8`:
the 8 KV heads divide by 8) in 128 slots.

Measured ahead of time (h100x8, jax 0.10.2, 2026-12-07): fits at 73.0 GiB per GPU against 79.1 (86.3 before the
experts ran on each device's own tokens, `ActivationLayout.experts`); the peak is the update's optimizer step, Adam's
elementwise temporaries over the stacked experts (benchmarks/README.md, "Scale").
"""

import os

from jaxrlhf.config import load_config_file


def get_config():
  config = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "grpo_gsm8k_qwen2_5_7b.py"))
  config.actor_rollout_ref.model.path = os.path.expanduser("~/models/gpt-oss-20b")
  config.actor_rollout_ref.rollout.tensor_model_parallel_size = 8
  # One generation shard (TP 8 over the node): 128 slots bound the cache to 128 rows.
  config.actor_rollout_ref.rollout.max_num_seqs = 128
  config.trainer.experiment_name = "grpo_gpt_oss_20b"
  return config
