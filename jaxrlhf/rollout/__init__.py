"""Generation: one decode loop over the model's per-layer state (`decode`), run for the whole batch (`batch`),
`max_num_seqs` slots refilled in-graph (`slots`), multi-turn turns (`turns`) and a JetStream-style engine
(`engine`); prompt buckets."""

from jaxrlhf.rollout.batch import generate
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
from jaxrlhf.rollout.decode import DecodeState, prefill_cache
from jaxrlhf.rollout.engine import Engine, Prefix, ResultTokens, SlotData
from jaxrlhf.rollout.sampler import (
  SamplingParams,
  choose_tokens,
  decode_step,
  filter_logits,
  greedy_tokens,
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
