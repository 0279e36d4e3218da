"""The one decode loop of generation: a typed per-row state (`DecodeState`) and one step (`step`) that every path
runs (docs/architecture.md, "Generation").

- the step's whole-batch rollout (`batch.generate`): every row at one cache column, `decode` until no row is
  live or a segment ends;
- `max_num_seqs` slots (`slots.generate_in_slots`): a row per slot at its own column, and after each step a
  refill policy that records each slot's token under its row and gives a finished slot the next prompt;
- multi-turn turns (`turns.run_turn`): a forcing policy (`Forced`) feeds the host's tokens (a tool's response)
  before the row samples again;
- the serving engine (`engine.Engine`): one `step` per `generate` call, every slot at one column.

What a layer keeps between tokens is the model's (`models/decoding.py`): the state carries its cache as an opaque
tree, created by `DecodeModel.init_cache`, written and read by `DecodeModel.apply`, moved by `cache_rows` along
the axes the model names. A row that is not live takes no token: its column is not marked in `kv_mask`, so the
model leaves its state as it was (the contract in `models/decoding.py`), and nothing is recorded for it.

Sampling keys: token t of a row is drawn with `token_keys(key, t)`; with one key for the batch (`shared_key`) the
index is the step, one draw over [B, V] (the training rollout's convention; a live row's step equals its t).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from jaxrlhf.models.decoder import positions_from_mask
from jaxrlhf.models.decoding import DecodeModel
from jaxrlhf.rollout.sampler import SamplingParams, decode_step, token_keys

_identity = lambda cache: cache


@flax.struct.dataclass
class DecodeState:
  """Every decoding row's state between two steps. B rows, S sequence (cache) columns."""

  cache: Any  # the model's per-layer state of B rows (`DecodeModel.init_cache`), opaque here
  kv_mask: jax.Array  # [B, S] int32: the sequence columns written (the keys a query may see)
  column: jax.Array  # [] int32 (every row at one column) or [B]: the column the next input is written at
  token: jax.Array  # [B] int32: the next input (the last prompt token, then the last token taken)
  position: jax.Array  # [B] int32: its token position
  length: jax.Array  # [B] int32: tokens taken (response columns written)
  live: jax.Array  # [B] bool: the row takes a token at the next step
  keys: jax.Array  # uint32 key data: one key for the batch (`shared_key`) or [B, ...] one per row
  steps: jax.Array  # [] int32: steps run
  shared_key: bool = flax.struct.field(pytree_node=False, default=False)

  def sampling_keys(self):
    """This step's sampling keys (the module docstring's convention)."""
    index = self.steps if self.shared_key else self.length
    return token_keys(jax.random.wrap_key_data(self.keys), index)


@flax.struct.dataclass
class Taken:
  """What one step gave each row (B rows)."""

  token: jax.Array  # [B] int32: the token taken (pad where the row was not live)
  log_prob: jax.Array  # [B] float32: its log-prob under softmax(logits / T) where sampled, else 0
  sampled: jax.Array  # [B] bool: the policy sampled it (the loss mask), not forced
  written: jax.Array  # [B] bool: the row was live: the token is its response's
  index: jax.Array  # [B] int32: the response column it is written at (the row's length before the step)


@flax.struct.dataclass
class Responses:
  """Every row's response so far (N rows, R columns): what a rollout returns."""

  tokens: jax.Array  # [N, R] int32, pad where nothing was written
  loss_mask: jax.Array  # [N, R] int32: 1 on the tokens the policy sampled
  log_probs: jax.Array  # [N, R] float32: the sampled tokens' log-probs, 0 elsewhere

  @classmethod
  def empty(cls, rows: int, width: int, pad_token_id: int) -> "Responses":
    return cls(
      tokens=jnp.full((rows, width), pad_token_id, jnp.int32),
      loss_mask=jnp.zeros((rows, width), jnp.int32),
      log_probs=jnp.zeros((rows, width), jnp.float32),
    )

  def record(self, taken: Taken, rows=None) -> "Responses":
    """`taken` written at each row's response column. `rows` [B] (optional): the response row of each decoding
    row (the slots'); without it decoding row b is response row b (an elementwise select, which keeps a mesh's
    batch split as it is)."""
    values = (taken.token, taken.sampled.astype(jnp.int32), taken.log_prob)
    if rows is None:
      hit_BxR = (jnp.arange(self.tokens.shape[1])[None, :] == taken.index[:, None]) & taken.written[:, None]
      return Responses(*(jnp.where(hit_BxR, new[:, None], old) for old, new in zip(self._fields(), values)))
    at = (jnp.where(taken.written, rows, self.tokens.shape[0]), taken.index)  # a row not written is dropped
    return Responses(*(old.at[at].set(new, mode="drop") for old, new in zip(self._fields(), values)))

  def as_outputs(self, steps) -> dict:
    """A one-turn rollout's outputs (every written token sampled): responses, response_mask, rollout_log_probs
    [N, R], response_lengths [N] and num_steps (`steps`, the loop's)."""
    return {
      "responses": self.tokens,
      "response_mask": self.loss_mask,
      "rollout_log_probs": self.log_probs,
      "response_lengths": self.loss_mask.sum(axis=1),
      "num_steps": steps,
    }

  def _fields(self):
    return (self.tokens, self.loss_mask, self.log_probs)


def record_outputs(model: DecodeModel, cache, written_BxS, width: int) -> dict:
  """The model's per-token records of B rows (`DecodeModel.records`) as a rollout's outputs "rollout_<name>" [B,
  width, ...]: sequence columns, prompt then response, as the training forward reads them; `written_BxS` the
  columns the rows wrote (their kv mask; the last response token is never fed, so never recorded)."""
  written_BxW = jnp.pad(written_BxS, ((0, 0), (0, width - written_BxS.shape[1])))
  return {f"rollout_{name}": x for name, x in model.records(cache, written_BxW).items()}


@flax.struct.dataclass
class Forced:
  """Tokens the host chose for each row (multi-turn: a tool's response and the next generation prompt), fed before
  the row samples again; each is written with loss mask 0 and log-prob 0."""

  tokens: jax.Array  # [B, F] int32
  count: jax.Array  # [B] int32: how many of them
  start: jax.Array  # [B] int32: the row's length when its first forced token is taken

  def choose(self, length_B, sampled_B):
    """(token_B, forcing_B): the forced token where the row has one left, else the sampled one."""
    index_B = length_B - self.start
    forcing_B = index_B < self.count
    forced_B = jnp.take_along_axis(self.tokens, jnp.clip(index_B, 0, self.tokens.shape[1] - 1)[:, None], axis=1)[:, 0]
    return jnp.where(forcing_B, forced_B, sampled_B).astype(jnp.int32), forcing_B


def prefill_cache(
  model: DecodeModel,
  params,
  prompt_ids_BxP,
  prompt_mask_BxP,
  cache_length: int,
  constrain_cache: Callable | None = None,
  visible_length: int | None = None,
):
  """The model's state after every prompt token but the last, whose forward is the first decode step.

  Only the cache of this call is used, so XLA drops its language-model head: no [B, P, V] logits.
  Left padding puts every row's last prompt token in the last column. Returns (cache, kv_mask_BxS):
  the cache has `cache_length` columns, the mask `visible_length` (default all), the columns the
  first decode segment attends over. Column P - 1 is not marked: the first step writes it (marks it), and only
  for a live row, so a row that never decodes leaves its state as the prefill left it.
  """
  batch, prompt_len = prompt_ids_BxP.shape
  visible_length = visible_length or cache_length
  constrain_cache = constrain_cache or _identity
  cache = constrain_cache(model.init_cache(batch, cache_length))
  written_BxP = prompt_mask_BxP.astype(jnp.int32).at[:, -1].set(0)
  kv_mask_BxS = jnp.concatenate([written_BxP, jnp.zeros((batch, visible_length - prompt_len), jnp.int32)], axis=1)
  if prompt_len > 1:
    # Causal masking keeps these queries off column P-1 too.
    _, cache = model.apply(
      params, prompt_ids_BxP[:, :-1], positions_from_mask(prompt_mask_BxP)[:, :-1], kv_mask_BxS, cache, jnp.int32(0)
    )
    cache = constrain_cache(cache)
  return cache, kv_mask_BxS


def start_state(cache, kv_mask_BxS, prompt_ids_BxP, prompt_mask_BxP, keys, *, shared_column: bool, live_B=None):
  """The state of prefilled rows before their first step: the last prompt token is the next input, at column
  P - 1. `keys`: one key for the batch (a shared key) or one per row (`jax.random` keys); `live_B`: rows marked
  False (batch padding) take nothing."""
  rows, prompt_len = prompt_ids_BxP.shape
  column = jnp.int32(prompt_len - 1)
  return DecodeState(
    cache=cache,
    kv_mask=kv_mask_BxS,
    column=column if shared_column else jnp.full((rows,), column),
    token=prompt_ids_BxP[:, -1].astype(jnp.int32),
    position=jnp.maximum(prompt_mask_BxP.astype(jnp.int32).sum(axis=1) - 1, 0),
    length=jnp.zeros((rows,), jnp.int32),
    live=jnp.ones((rows,), bool) if live_B is None else jnp.asarray(live_B, bool),
    keys=jax.random.key_data(keys),
    steps=jnp.int32(0),
    shared_key=keys.ndim == 0,
  )


def step(
  model: DecodeModel,
  params,
  state: DecodeState,
  sampling: SamplingParams,
  *,
  budget: int,
  constrain_cache: Callable | None = None,
  forced: Forced | None = None,
  stop_token_ids: tuple[int, ...] = (),
) -> tuple[DecodeState, Taken]:
  """One decode step of every row: each live row's input written at its column, the next token chosen (sampled,
  or forced by `forced`), the row ended by a sampled end-of-sequence token (or one of `stop_token_ids`) or at
  `budget` tokens."""
  rows, width = state.kv_mask.shape
  column_B = jnp.broadcast_to(state.column, (rows,))
  writes_BxS = (jnp.arange(width)[None, :] == column_B[:, None]) & state.live[:, None]
  kv_mask_BxS = state.kv_mask | writes_BxS.astype(jnp.int32)
  sampled_B, log_prob_B, cache = decode_step(
    model.apply,
    params,
    state.token,
    state.position,
    kv_mask_BxS,
    state.cache,
    state.column,
    state.sampling_keys(),
    sampling,
  )
  cache = (constrain_cache or _identity)(cache)
  written_B = state.live
  if forced is None:
    token_B, by_policy_B = sampled_B, written_B
  else:
    token_B, forcing_B = forced.choose(state.length, sampled_B)
    by_policy_B = written_B & ~forcing_B
  taken = Taken(
    token=jnp.where(written_B, token_B, sampling.pad_token_id).astype(jnp.int32),
    log_prob=jnp.where(by_policy_B, log_prob_B, 0.0),
    sampled=by_policy_B,
    written=written_B,
    index=state.length,
  )
  moved_B = written_B.astype(jnp.int32)
  length_B = state.length + moved_B
  ends_E = jnp.asarray(tuple(sampling.eos_token_ids) + tuple(stop_token_ids), jnp.int32)
  ended_B = (by_policy_B & jnp.isin(token_B, ends_E)) | (length_B >= budget)
  state = state.replace(
    cache=cache,
    kv_mask=kv_mask_BxS,
    column=state.column + 1 if state.column.ndim == 0 else state.column + moved_B,
    token=jnp.where(written_B, token_B, state.token).astype(jnp.int32),
    position=state.position + moved_B,
    length=length_B,
    live=written_B & ~ended_B,
    steps=state.steps + 1,
  )
  return state, taken


def decode(
  model: DecodeModel,
  params,
  state: DecodeState,
  responses,
  sampling: SamplingParams,
  *,
  budget: int,
  until_step: int | None = None,
  after_step: Callable | None = None,
  until: Callable | None = None,
  **step_options,
):
  """`step` in a `lax.while_loop` until no row is live (or `until_step` steps have run, or `until(state,
  responses)`, a policy's own test, is False). After each step, `after_step(state, responses, taken) -> (state,
  responses)` (default: record each row's token in `responses`): the slots' refill is such a policy, and partial
  rollouts' "enough groups have finished" such a test (`rollout/partial.py`). Returns (state, responses)."""
  after_step = after_step or (lambda state, responses, taken: (state, responses.record(taken)))

  def body(carry):
    state, responses = carry
    state, taken = step(model, params, state, sampling, budget=budget, **step_options)
    return after_step(state, responses, taken)

  def cond(carry):
    going = jnp.any(carry[0].live)
    if until is not None:
      going &= until(*carry)
    return going if until_step is None else going & (carry[0].steps < until_step)

  return jax.lax.while_loop(cond, body, (state, responses))
