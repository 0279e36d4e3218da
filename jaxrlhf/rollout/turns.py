"""Multi-turn generation on device: the KV cache and every row's response stay in one `TurnState` between the
host's turns, and each turn is one compiled loop (docs/architecture.md, "Multi-turn rollouts").

- `start_turns`: the prompts' prefill into a cache as long as the whole trajectory (P + R - 1 columns), as
  `sampler.generate` allocates it, and an empty response of R columns per row.
- `run_turn`: a `lax.while_loop` of decode steps over the batch. A row first takes its *forced* tokens, what
  the host appends between two of its turns (a tool's response rendered by the chat template, then the
  assistant's generation prompt): each is fed like a sampled token but chosen by the host, written to the
  response with loss mask 0 and log-prob 0. Then the row samples until it emits an end-of-sequence token or
  its response reaches R columns (or, given `stop_token_ids`, emits a token that closes a tool call). Rows the host has
finished (`live` False) do not move. The loop ends when
  every row has ended its turn.

A row's response column t is fed at cache column P + t and drawn with `token_keys(its key, t)`, whichever turn
it belongs to, as in `slots.generate_in_slots`: a trajectory that calls no tool samples exactly what
single-turn generation with the same per-row keys samples (`row_keys`).

Forced tokens run as decode steps, one column per step, through the same decode step as sampling: one program
per turn whatever the tool output's length, at the cost of one decode step (of every row) per appended token.
"""

from __future__ import annotations

from collections.abc import Callable

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from jaxrlhf.rollout.sampler import SamplingParams, cache_length, decode_step, prefill_cache, token_keys
from jaxrlhf.rollout.slots import row_keys


@flax.struct.dataclass
class TurnState:
  """Every row's trajectory so far (on device between turns). N rows, P prompt columns, R response columns."""

  cache: dict  # {"k", "v"} [layers, N, K, P + R - 1, H]
  kv_mask: jax.Array  # [N, P + R - 1] int32: the cache columns written
  last_prompt_position: jax.Array  # [N] int32: the position of each row's last prompt token
  keys: jax.Array  # [N, ...] uint32: each row's sampling key (key data)
  token: jax.Array  # [N] int32: the next input, the last token written (the last prompt token at the start)
  length: jax.Array  # [N] int32: response columns written (sampled and forced)
  responses: jax.Array  # [N, R] int32, pad beyond `length`
  loss_mask: jax.Array  # [N, R] int32: 1 on the tokens the policy sampled
  log_probs: jax.Array  # [N, R] float32: the sampled tokens' log-probs (0 on forced tokens)
  steps: jax.Array  # [] int32: decode steps run over all turns

  def sequence_mask(self) -> np.ndarray:
    """[N, R] int32 every response column written (sampled and forced): the response's attention mask (host)."""
    return (np.arange(self.responses.shape[1])[None, :] < np.asarray(self.length)[:, None]).astype(np.int32)


def start_turns(
  apply_fn: Callable,
  params,
  model_config,
  prompt_ids_NxP,
  prompt_mask_NxP,
  rng,
  sampling: SamplingParams,
  constrain_cache: Callable | None = None,
) -> TurnState:
  """The prompts' prefill and an empty response per row. `rng`: one key (row r samples with `fold_in(rng, r)`)
  or one key per row; `sampling.max_new_tokens` is R, the whole trajectory's response budget."""
  rows, prompt_len = prompt_ids_NxP.shape
  response_len = sampling.max_new_tokens
  prompt_mask_NxP = prompt_mask_NxP.astype(jnp.int32)
  total_len = cache_length(prompt_len, response_len, response_len)
  cache, kv_mask = prefill_cache(
    apply_fn, params, model_config, prompt_ids_NxP, prompt_mask_NxP, total_len, constrain_cache
  )
  return TurnState(
    cache=cache,
    kv_mask=kv_mask,
    last_prompt_position=jnp.maximum(prompt_mask_NxP.sum(axis=1) - 1, 0),
    keys=jax.random.key_data(row_keys(rng, rows)),
    token=prompt_ids_NxP[:, -1].astype(jnp.int32),
    length=jnp.zeros((rows,), jnp.int32),
    responses=jnp.full((rows, response_len), sampling.pad_token_id, jnp.int32),
    loss_mask=jnp.zeros((rows, response_len), jnp.int32),
    log_probs=jnp.zeros((rows, response_len), jnp.float32),
    steps=jnp.int32(0),
  )


def run_turn(
  apply_fn: Callable,
  params,
  state: TurnState,
  forced_NxF,
  forced_len_N,
  live_N,
  sampling: SamplingParams,
  constrain_cache: Callable | None = None,
  stop_token_ids: tuple[int, ...] = (),
) -> TurnState:
  """One turn of every live row: its `forced_len_N` forced tokens (`forced_NxF`, host-chosen), then sampled ones
  until end-of-sequence (or one of `stop_token_ids`: a token that closes a tool call) or the response budget.
  `apply_fn` must accept a per-row `cache_index` (as `Decoder`)."""
  rows, response_len = state.responses.shape
  total_len = state.kv_mask.shape[1]
  prompt_len = total_len - response_len + 1
  eos_E = jnp.asarray(tuple(sampling.eos_token_ids) + tuple(stop_token_ids), jnp.int32)
  constrain_cache = constrain_cache or (lambda cache: cache)
  forced_len_N = forced_len_N.astype(jnp.int32)
  turn_start_N = state.length
  row_N = jnp.arange(rows)
  # A row that cannot take a token this turn has ended it before the first step.
  active_N = jnp.asarray(live_N, bool) & (state.length < response_len)

  def body(carry):
    state, active_N = carry
    length_N = state.length
    # The input (the last written token) sits in column P - 1 + length; a row at its budget writes nowhere new.
    column_N = jnp.minimum(prompt_len - 1 + length_N, total_len - 1)
    kv_mask = state.kv_mask | (jnp.arange(total_len)[None, :] == column_N[:, None]).astype(jnp.int32)
    sampled_N, log_prob_N, cache = decode_step(
      apply_fn,
      params,
      state.token,
      state.last_prompt_position + length_N,
      kv_mask,
      state.cache,
      column_N,
      token_keys(jax.random.wrap_key_data(state.keys), length_N),
      sampling,
    )
    cache = constrain_cache(cache)
    forced_index_N = length_N - turn_start_N
    forcing_N = forced_index_N < forced_len_N
    forced_token_N = jnp.take_along_axis(
      forced_NxF, jnp.clip(forced_index_N, 0, forced_NxF.shape[1] - 1)[:, None], axis=1
    )[:, 0]
    token_N = jnp.where(forcing_N, forced_token_N, sampled_N).astype(jnp.int32)
    at = (jnp.where(active_N, row_N, rows), length_N)  # an inactive row's write is dropped
    sampled = active_N & ~forcing_N
    state = state.replace(
      cache=cache,
      kv_mask=jnp.where(active_N[:, None], kv_mask, state.kv_mask),
      token=jnp.where(active_N, token_N, state.token),
      length=length_N + active_N.astype(jnp.int32),
      responses=state.responses.at[at].set(token_N, mode="drop"),
      loss_mask=state.loss_mask.at[at].set(sampled.astype(jnp.int32), mode="drop"),
      log_probs=state.log_probs.at[at].set(jnp.where(sampled, log_prob_N, 0.0), mode="drop"),
      steps=state.steps + 1,
    )
    ended_N = (sampled & jnp.isin(token_N, eos_E)) | (state.length >= response_len)
    return state, active_N & ~ended_N

  state, _ = jax.lax.while_loop(lambda carry: jnp.any(carry[1]), body, (state, active_N))
  return state
