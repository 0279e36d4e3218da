"""Multi-turn generation on device: the KV cache and every row's response stay in one `TurnState` between the
host's turns, and each turn is one compiled loop (docs/architecture.md, "Multi-turn rollouts").

- `start_turns`: the prompts' prefill into a cache as long as the whole trajectory (P + R - 1 columns), as
  `batch.generate` allocates it, and an empty response of R columns per row.
- `run_turn`: the decode loop (`rollout/decode.py`) over the batch with a forcing policy. A row first takes its
  *forced* tokens, what
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

from jaxrlhf.models.decoding import DecodeModel
from jaxrlhf.rollout.batch import cache_length
from jaxrlhf.rollout.decode import DecodeState, Forced, Responses, decode, prefill_cache, start_state
from jaxrlhf.rollout.sampler import SamplingParams
from jaxrlhf.rollout.slots import row_keys


@flax.struct.dataclass
class TurnState:
  """Every row's trajectory so far (on device between turns). N rows, P prompt columns, R response columns."""

  decode: DecodeState  # the decode loop's rows (the model's cache over P + R - 1 columns, per-row keys)
  record: Responses  # [N, R] the response so far: sampled and forced tokens, loss mask, log-probs

  @property
  def length(self) -> jax.Array:
    """[N] int32: response columns written (sampled and forced)."""
    return self.decode.length

  @property
  def responses(self) -> jax.Array:
    """[N, R] int32, pad beyond `length`."""
    return self.record.tokens

  @property
  def loss_mask(self) -> jax.Array:
    """[N, R] int32: 1 on the tokens the policy sampled."""
    return self.record.loss_mask

  @property
  def log_probs(self) -> jax.Array:
    """[N, R] float32: the sampled tokens' log-probs (0 on forced tokens)."""
    return self.record.log_probs

  @property
  def steps(self) -> jax.Array:
    """[] int32: decode steps run over all turns."""
    return self.decode.steps

  def sequence_mask(self) -> np.ndarray:
    """[N, R] int32 every response column written (sampled and forced): the response's attention mask (host)."""
    return (np.arange(self.responses.shape[1])[None, :] < np.asarray(self.length)[:, None]).astype(np.int32)


def start_turns(
  model: DecodeModel,
  params,
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
  total_len = cache_length(prompt_len, response_len, response_len)
  cache, kv_mask = prefill_cache(model, params, prompt_ids_NxP, prompt_mask_NxP, total_len, constrain_cache)
  return TurnState(
    decode=start_state(cache, kv_mask, prompt_ids_NxP, prompt_mask_NxP, row_keys(rng, rows), shared_column=False),
    record=Responses.empty(rows, response_len, sampling.pad_token_id),
  )


def run_turn(
  model: DecodeModel,
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
  The model must accept a per-row `cache_index` (as `Decoder`)."""
  response_len = state.responses.shape[1]
  # A row that cannot take a token this turn has ended it before the first step.
  rows = state.decode.replace(live=jnp.asarray(live_N, bool) & (state.length < response_len))
  forced = Forced(tokens=forced_NxF, count=forced_len_N.astype(jnp.int32), start=state.length)
  rows, record = decode(
    model,
    params,
    rows,
    state.record,
    sampling,
    budget=response_len,
    constrain_cache=constrain_cache,
    forced=forced,
    stop_token_ids=tuple(stop_token_ids),
  )
  return TurnState(decode=rows, record=record)
