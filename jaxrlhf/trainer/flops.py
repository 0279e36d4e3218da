"""Model FLOPs of a PPO step and the device peak they are measured against (`perf/mfu/{actor,critic}`).

Per token, a decoder forward costs 2 * (non-embedding params) + 4 * layers * hidden * context
(attention scores and values over a context of `context` tokens); backward costs twice the forward.
The actor's work in a step: rollout (one forward per prompt and generated token), old log-probs and,
when a KL term needs it, the reference (one forward each over the sequences), and `ppo_epochs`
updates (forward + backward). MFU = those FLOPs / (step time x devices x peak FLOP/s per device).
Where the update phases are timed (phased mode), `update_flops` over each phase's time gives the
per-phase MFU verl reports.
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxrlhf.rollout.batch import cache_length

# Dense bf16 peak FLOP/s per device, by substrings of `device_kind` (lower case).
PEAK_FLOPS = (
  ("h200", 989e12),
  ("h100", 989e12),
  ("a100", 312e12),
  ("l4", 121e12),
  ("a10", 125e12),
  ("v6", 918e12),
  ("v5p", 459e12),
  ("v5 lite", 197e12),
  ("v5e", 197e12),
  ("v4", 275e12),
)


def forward_flops_per_token(
  num_params: int, embedding_params: int, num_layers: int, hidden: int, context: float
) -> float:
  return 2.0 * (num_params - embedding_params) + 4.0 * num_layers * hidden * context


def actor_step_flops(
  model_config,
  num_params: int,
  *,
  prompt_tokens: float,
  response_tokens: float,
  num_sequences: int,
  ppo_epochs: int,
  use_reference: bool,
  old_forward: bool = True,
) -> float:
  embedding = model_config.vocab_size * model_config.hidden_size
  tokens = prompt_tokens + response_tokens
  context = tokens / max(num_sequences, 1) / 2.0  # causal: each token sees half the sequence on average
  per_token = forward_flops_per_token(
    num_params, embedding, model_config.num_hidden_layers, model_config.hidden_size, context
  )
  forwards = 1 + (1 if old_forward else 0) + (1 if use_reference else 0)  # rollout, old log-prob, reference
  return per_token * tokens * (forwards + 3 * ppo_epochs)


def update_flops(
  config, *, prompt_tokens: float, response_tokens: float, num_sequences: int, epochs: int, head: str
) -> float:
  """Model FLOPs of an update phase: `epochs` passes of forward + backward (3 forwards) over the real tokens.

  As verl's `perf/mfu/*`: tokens in the batch, not padding; rematerialisation is not model work. The
  language-model head (`head="lm"`) counts at the response positions only, the log-probs the step
  needs; a value head (`"value"`) is one output per response position.
  """
  tokens = prompt_tokens + response_tokens
  context = tokens / max(num_sequences, 1) / 2.0  # causal: each token sees half the sequence on average
  attention = 4.0 * config.num_attention_heads * config.resolved_head_dim * context
  body = tokens * config.num_hidden_layers * (layer_matmul_flops_per_token(config) + attention)
  head_outputs = config.vocab_size if head == "lm" else 1
  return 3.0 * epochs * (body + response_tokens * 2.0 * config.hidden_size * head_outputs)


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


# ----- the step's FLOPs by phase, as the compiled program does the work (`jaxrlhf.aot`) -------------


def layer_matmul_flops_per_token(config) -> float:
  """q/k/v/o projections and the SwiGLU MLP of one decoder layer, one token."""
  d, head_dim = config.hidden_size, config.resolved_head_dim
  q, kv = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
  return 2.0 * d * (q + 2 * kv) + 2.0 * q * d + 3 * 2.0 * d * config.intermediate_size


def forward_flops(config, tokens: float, keys: float, head: str | None) -> float:
  """A forward of `tokens` query tokens, each attending densely over `keys` positions (scores + values).

  `head`: "lm" (the vocabulary projection at every token), "value"/"reward" (one output), None (cache only).
  """
  attention = 4.0 * config.num_attention_heads * config.resolved_head_dim * keys
  head_flops = {
    "lm": 2.0 * config.hidden_size * config.vocab_size,
    "value": 2.0 * config.hidden_size,
    "reward": 2.0 * config.hidden_size,
    None: 0.0,
  }[head]
  return tokens * (config.num_hidden_layers * (layer_matmul_flops_per_token(config) + attention) + head_flops)


def head_cost(config, head: str, keys: float) -> float:
  """The head's work per position over the backbone's (each position attending over `keys`): what a
  packed row pays extra for running its head on every position (`packing.packing_pays`)."""
  backbone = forward_flops(config, 1.0, keys, None)
  return (forward_flops(config, 1.0, keys, head) - backbone) / backbone


def generation_flops(config, rows: int, prompt_len: int, segment_cache_lengths: list[tuple[int, int]]) -> float:
  """Prefill of every prompt token but the last (its cache), then every decode step of every segment.

  `segment_cache_lengths`: (decode steps, cache columns) per segment of the decode loop. An early exit
  (every row finished) does less; this is the work of a rollout that uses the whole response budget.
  """
  first_cache = segment_cache_lengths[0][1]
  total = 0.0
  if prompt_len > 1:
    # Only the cache is kept: the last layer's query, attention, output projection and MLP are dead code.
    prefill_tokens = rows * (prompt_len - 1)
    total = (
      forward_flops(config, prefill_tokens, first_cache, None)
      * (config.num_hidden_layers - 1)
      / max(config.num_hidden_layers, 1)
    )
    total += prefill_tokens * 2.0 * config.hidden_size * 2 * config.num_key_value_heads * config.resolved_head_dim
  for steps, cache_columns in segment_cache_lengths:
    total += forward_flops(config, rows * steps, cache_columns, "lm")
  return total


def step_phase_flops(ppo, *, batch_size: int, prompt_len: int, response_len: int) -> dict[str, float]:
  """FLOPs of each phase of one step of `ppo` (a PPOStep) at the padded lengths.

  Counted as the program computes them: every padded position, attention dense over the whole
  sequence (masked, not skipped), the language-model head at every position, backward = 2 x forward,
  and one more forward per update when the model rematerialises (gradient checkpointing). Packed
  phases (`use_remove_padding`) are counted as if padded. Element-wise work (norms, softmax, the
  optimizer) is left out: it is a few percent at the sizes that matter.
  """
  config = ppo.config
  n = config.actor_rollout_ref.rollout.n
  rows, seq_len = batch_size * n, prompt_len + response_len
  actor, critic = ppo.actor.config, ppo.critic.config
  ends = ppo.sampling.segment_ends
  segments = [(end - start, cache_length(prompt_len, response_len, end)) for start, end in zip([0] + ends[:-1], ends)]
  phases = {"gen": generation_flops(actor, rows, prompt_len, segments)}
  if config.algorithm.adv_estimator == "remax":  # one greedy rollout per prompt as the baseline
    phases["gen"] += generation_flops(actor, batch_size, prompt_len, segments)
  if ppo.reward_model is not None:
    phases["reward"] = forward_flops(ppo.reward_model.config, rows * seq_len, seq_len, "reward")
  actor_forward = forward_flops(actor, rows * seq_len, seq_len, "lm")
  if not ppo.plan.old_in_update:
    phases["old_log_prob"] = actor_forward
  if ppo.plan.use_reference:
    phases["ref"] = actor_forward
  if ppo.teacher is not None:  # on-policy distillation: the teacher's forward over the rollout
    phases["teacher"] = forward_flops(ppo.teacher.config, rows * seq_len, seq_len, "lm")
  if ppo.plan.use_critic:
    critic_forward = forward_flops(critic, rows * seq_len, seq_len, "value")
    phases["values"] = critic_forward
    remat = 1 if critic.remat_policy != "none" else 0
    phases["update_critic"] = config.critic.ppo_epochs * (3 + remat) * critic_forward
  remat = 1 if actor.remat_policy != "none" else 0
  phases["update_actor"] = config.actor_rollout_ref.actor.ppo_epochs * (3 + remat) * actor_forward
  return phases
