"""Generation: jitted prefill + while-loop decode with a KV cache (the whole batch, or `max_num_seqs` slots refilled
in-graph), prompt buckets, a JetStream-style engine."""

from jaxrlhf.rollout.buckets import (
  DEFAULT_BATCH_BUCKETS,
  DEFAULT_LENGTH_BUCKETS,
  PaddedPrompts,
  pad_prompts,
  pick_bucket,
  prompt_length_buckets,
  repeat_interleave,
  response_lengths_and_clip,
)
from jaxrlhf.rollout.engine import DecodeState, Engine, Prefix, ResultTokens, SlotData
from jaxrlhf.rollout.sampler import (
  SamplingParams,
  choose_tokens,
  decode_step,
  filter_logits,
  generate,
  greedy_tokens,
  prefill_cache,
  request_key,
  token_keys,
  token_log_probs,
)
from jaxrlhf.rollout.slots import generate_in_slots, row_keys

__all__ = [
  "DEFAULT_BATCH_BUCKETS",
  "DEFAULT_LENGTH_BUCKETS",
  "PaddedPrompts",
  "pad_prompts",
  "pick_bucket",
  "prompt_length_buckets",
  "repeat_interleave",
  "response_lengths_and_clip",
  "DecodeState",
  "Engine",
  "Prefix",
  "ResultTokens",
  "SlotData",
  "SamplingParams",
  "choose_tokens",
  "decode_step",
  "filter_logits",
  "generate",
  "greedy_tokens",
  "prefill_cache",
  "request_key",
  "token_keys",
  "token_log_probs",
  "generate_in_slots",
  "row_keys",
]
