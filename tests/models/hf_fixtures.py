"""Tiny random Hugging Face models (torch CPU) saved with `save_pretrained`: nothing is downloaded."""

from __future__ import annotations

import numpy as np

VOCAB = 128
_COMMON = dict(
  vocab_size=VOCAB,
  hidden_size=32,
  intermediate_size=64,
  num_hidden_layers=2,
  num_attention_heads=4,
  num_key_value_heads=2,
  max_position_embeddings=256,
  rms_norm_eps=1e-5,
  bos_token_id=None,
  eos_token_id=None,
  pad_token_id=0,
)

# name -> (config class, kwargs). Together they cover every switch of the decoder family.
VARIANTS = {
  "llama": ("LlamaConfig", dict(attention_bias=True, mlp_bias=True, rope_theta=500.0)),
  "llama3_rope": (
    "LlamaConfig",
    dict(
      tie_word_embeddings=True,
      rope_parameters=dict(
        rope_type="llama3",
        rope_theta=10000.0,
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=64,
      ),
    ),
  ),
  "qwen2_tied": ("Qwen2Config", dict(tie_word_embeddings=True, rope_theta=1e6)),
  "qwen2_untied": ("Qwen2Config", dict(tie_word_embeddings=False)),
  "qwen3": ("Qwen3Config", dict(head_dim=16, num_key_value_heads=1)),
  "mistral": ("MistralConfig", dict(sliding_window=7)),  # shorter than the test sequences: the window matters
}


def hf_config(variant: str, **overrides):
  import transformers

  class_name, kwargs = VARIANTS[variant]
  return getattr(transformers, class_name)(**{**_COMMON, **kwargs, **overrides})


def randomize_(model, seed: int = 0):
  """HF initialises biases to 0 and norms to 1; random values make every parameter count in parity."""
  import torch

  generator = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, param in model.named_parameters():
      noise = torch.randn(param.shape, generator=generator)
      param.copy_(1.0 + 0.1 * noise if name.endswith("norm.weight") else 0.15 * noise)
  return model


def build_model(variant: str, auto_class: str = "AutoModelForCausalLM", seed: int = 0, **overrides):
  import torch
  import transformers

  torch.manual_seed(seed)
  config = hf_config(variant, **overrides)
  model = getattr(transformers, auto_class).from_config(config, dtype=torch.float32, attn_implementation="eager")
  return randomize_(model.eval(), seed)


def save_model(model, path, **kwargs) -> str:
  model.save_pretrained(str(path), **kwargs)
  return str(path)


def left_padded_batch(seed: int = 0, batch: int = 3, length: int = 12, pads=(0, 3, 7), low: int = 1):
  """Random ids (never the pad id 0) with per-row left padding; HF position ids = cumsum(mask) - 1."""
  rng = np.random.RandomState(seed)
  ids = rng.randint(low, VOCAB, (batch, length)).astype(np.int32)
  mask = np.ones((batch, length), np.int32)
  for row, pad in enumerate(pads):
    mask[row, :pad] = 0
    ids[row, :pad] = 0
  positions = np.maximum(mask.cumsum(-1) - 1, 0)
  return ids, mask, positions


def hf_forward(model, ids, mask, positions):
  import torch

  with torch.no_grad():
    out = model(
      input_ids=torch.tensor(ids, dtype=torch.long),
      attention_mask=torch.tensor(mask, dtype=torch.long),
      position_ids=torch.tensor(positions, dtype=torch.long),
    )
  return out.logits.float().numpy()
