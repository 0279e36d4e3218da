"""The step's whole-batch rollout: a cache-only prefill of left-padded prompts, then the decode loop
(`rollout/decode.py`) with every row at one cache column.

The prefill runs every prompt token but the last and keeps only the model's state, so XLA never computes
[B, P, vocab] logits; decode step s feeds one token (the last prompt token, then each sampled token)
and samples from its logits, so no forward is spent on a token that is never fed back. The loop stops
early once every row has emitted EOS. Long decodes run as a few consecutive loops that attend over a
growing prefix of the cache (`SamplingParams.segment_ends`), so early steps attend over a shorter one;
the cache itself is allocated once at its final length (growing a stacked [layers, ...] cache would
copy all of it). The response mask covers tokens up to and including the first EOS.
"""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp

from jaxrlhf.models.decoding import DecodeModel
from jaxrlhf.rollout.decode import Responses, decode, prefill_cache, record_outputs, start_state
from jaxrlhf.rollout.sampler import SamplingParams


def generate(
  model: DecodeModel,
  params,
  prompt_ids_BxP,
  prompt_mask_BxP,
  rng,
  sampling: SamplingParams,
  constrain_cache: Callable | None = None,
  active_B=None,
):
  """Samples up to `max_new_tokens` per left-padded prompt.

  `rng`: one key for the batch (the training rollout), or one key per row, a request's own key
  (`request_key`; see `token_keys`): then a row samples what the serving engine samples for that key.
  `constrain_cache(cache) -> cache` pins the cache's sharding (batch and kv-heads) on a mesh.
  `active_B` (bool, optional): rows marked False (batch padding) start finished and stay empty.
  Returns dict(responses [B,R] int32 (pad after EOS), response_mask [B,R] int32,
  rollout_log_probs [B,R] fp32, response_lengths [B] int32, num_steps scalar), plus the model's records
  (`record_outputs`: "rollout_routes" [B, P + R, layers, k] of a model that records its routes). A length equal to R
  means the row hit max_new_tokens (`response_length/clip_ratio`).
  """
  batch, prompt_len = prompt_ids_BxP.shape
  response_len = sampling.max_new_tokens
  ends = sampling.segment_ends
  cache, kv_mask_BxS = prefill_cache(
    model,
    params,
    prompt_ids_BxP,
    prompt_mask_BxP,
    cache_length(prompt_len, response_len, ends[-1]),
    constrain_cache,
    visible_length=cache_length(prompt_len, response_len, ends[0]),
  )
  state = start_state(cache, kv_mask_BxS, prompt_ids_BxP, prompt_mask_BxP, rng, shared_column=True, live_B=active_B)
  responses = Responses.empty(batch, response_len, sampling.pad_token_id)
  for index, end in enumerate(ends):
    if index:  # this segment sees more cache columns: masked until written
      extra = cache_length(prompt_len, response_len, end) - state.kv_mask.shape[1]
      state = state.replace(kv_mask=jnp.pad(state.kv_mask, ((0, 0), (0, extra))))
    state, responses = decode(
      model,
      params,
      state,
      responses,
      sampling,
      budget=response_len,
      until_step=end,
      constrain_cache=constrain_cache,
    )
  records = record_outputs(model, state.cache, state.kv_mask, prompt_len + response_len)
  return dict(responses.as_outputs(state.steps), **records)


def cache_length(prompt_len: int, response_len: int, end: int) -> int:
  """Cache columns a segment ending at step `end` needs: its own inputs plus the next input's column."""
  return prompt_len + min(end, response_len - 1)
