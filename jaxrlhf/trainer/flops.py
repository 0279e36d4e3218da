"""Model FLOPs of a PPO step and the device peak they are measured against (`perf/mfu/actor`).

Per token, a decoder forward costs 2 * (non-embedding params) + 4 * layers * hidden * context
(attention scores and values over a context of `context` tokens); backward costs twice the forward.
The actor's work in a step: rollout (one forward per prompt and generated token), old log-probs and,
when a KL term needs it, the reference (one forward each over the sequences), and `ppo_epochs`
updates (forward + backward). MFU = those FLOPs / (step time x devices x peak FLOP/s per device).
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

# Dense bf16 peak FLOP/s per device, by substrings of `device_kind` (lower case).
PEAK_FLOPS = (
    ("h200", 989e12), ("h100", 989e12), ("a100", 312e12), ("l4", 121e12), ("a10", 125e12),
    ("v6", 918e12), ("v5p", 459e12), ("v5 lite", 197e12), ("v5e", 197e12), ("v4", 275e12),
)


def forward_flops_per_token(num_params: int, embedding_params: int, num_layers: int, hidden: int,
                            context: float) -> float:
  return 2.0 * (num_params - embedding_params) + 4.0 * num_layers * hidden * context


def actor_step_flops(model_config, num_params: int, *, prompt_tokens: float, response_tokens: float,
                     num_sequences: int, ppo_epochs: int, use_reference: bool) -> float:
  embedding = model_config.vocab_size * model_config.hidden_size
  tokens = prompt_tokens + response_tokens
  context = tokens / max(num_sequences, 1) / 2.0  # causal: each token sees half the sequence on average
  per_token = forward_flops_per_token(num_params, embedding, model_config.num_hidden_layers,
                                      model_config.hidden_size, context)
  forwards = 1 + 1 + (1 if use_reference else 0)  # rollout, old log-prob, reference
  return per_token * tokens * (forwards + 3 * ppo_epochs)


@functools.lru_cache(maxsize=None)
def measure_peak_flops(size: int = 1024, repeats: int = 10) -> float:
  """Achieved fp32 matmul FLOP/s of the default device (the CPU's practical peak); measured once per process."""
  x = jnp.ones((size, size), jnp.float32)
  matmul = jax.jit(lambda a: a @ a)
  matmul(x).block_until_ready()
  start = time.perf_counter()
  for _ in range(repeats):
    matmul(x).block_until_ready()
  return 2.0 * size**3 * repeats / (time.perf_counter() - start)


def device_peak_flops(device, configured: float | None = None) -> float:
  """Config value if given, else the table entry of the device kind, else a measured matmul peak."""
  if configured:
    return float(configured)
  kind = getattr(device, "device_kind", "").lower()
  for key, value in PEAK_FLOPS:
    if key in kind:
      return value
  return measure_peak_flops()


def count_params(params) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))
