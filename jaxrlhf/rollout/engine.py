"""A JetStream-style serving engine: `prefill`, `insert`, `generate` over a fixed number of decode slots.

The API follows JetStream's `engine_api` (prefill -> (Prefix, ResultTokens); insert(prefix, state,
slot); generate(params, state) -> (state, ResultTokens) with one new token per slot), so a trained
policy can be served by JetStream's orchestrator through `jaxrlhf.rollout.jetstream_adapter`, and
`Engine.serve` runs continuous batching in-process: requests of different lengths enter free slots
as others finish.

The slots are the rows of the decode loop's state (`rollout/decode.py` `DecodeState`), and `generate` is one
`decode.step` of it. Cache layout: all slots are stepped at one shared write column (`DecodeState.column`), each
slot with its own token positions (RoPE) and its own row of the kv mask: `insert` puts a left-padded prefix of
P columns at [column - P, column) of the slot's row (a leaf of the model's state without a length axis: the
whole row, `cache_rows.put_row`) and clears the rest of that row's mask. When the column reaches the cache
length S, `generate` first shifts every row left by S - keep, where keep = max_prefill_length + max_new_tokens
bounds what a live request can have written, so nothing live is lost and the copy happens once every S - keep
steps. Masked columns add exactly 0 to attention, so a request's tokens do not depend on its neighbours.

Sampling keys are per request: sample s of request (prompt) i under seed k has the key
`request_key(k, i, s)` and draws its token g with `token_keys(that key, g)` (fold_in), the convention
`generate` follows when given per-row keys, so `jaxrlhf.generate` and `Engine.serve` sample the same
tokens for the same seed and request, whichever slot or step it ran in. The first token is drawn at
prefill by the same `decode.step` that `Engine.generate` and every other generation path run.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrlhf.models import Decoder, DecoderConfig, load_hf_params
from jaxrlhf.models.decoding import DecodeModel, decode_model
from jaxrlhf.rollout import cache_rows
from jaxrlhf.rollout.buckets import DEFAULT_LENGTH_BUCKETS, pick_bucket
from jaxrlhf.rollout.decode import DecodeState, prefill_cache, start_state, step
from jaxrlhf.rollout.sampler import SamplingParams, request_key


@struct.dataclass
class SlotData:
  """One slot's view of a `ResultTokens`: tokens and validity [samples, 1], lengths [samples]."""

  tokens: Any
  valid: Any
  lengths: Any


@struct.dataclass
class ResultTokens:
  """JetStream's result layout: one int32 array [batch, 3] = (token, valid, length) so one copy reaches the host.

  `log_probs` [batch, 1] fp32 (beyond JetStream) holds the sampled tokens' log-probs under
  softmax(logits / T), the same numbers the rollout gives the trainer.
  """

  data: Any
  tokens_idx: tuple[int, int] = struct.field(pytree_node=False, default=(0, 1))
  valid_idx: tuple[int, int] = struct.field(pytree_node=False, default=(1, 2))
  length_idx: tuple[int, int] = struct.field(pytree_node=False, default=(2, 3))
  samples_per_slot: int = struct.field(pytree_node=False, default=1)
  log_probs: Any = None

  def copy_to_host_async(self) -> None:
    for array in (self.data, self.log_probs):
      if isinstance(array, jax.Array):
        array.copy_to_host_async()

  def convert_to_numpy(self) -> "ResultTokens":
    return self.replace(
      data=np.asarray(self.data), log_probs=None if self.log_probs is None else np.asarray(self.log_probs)
    )

  def get_result_at_slot(self, slot: int) -> SlotData:
    rows = slice(slot * self.samples_per_slot, (slot + 1) * self.samples_per_slot)
    return SlotData(
      tokens=self.data[rows, self.tokens_idx[0] : self.tokens_idx[1]],
      valid=self.data[rows, self.valid_idx[0] : self.valid_idx[1]],
      lengths=self.data[rows, self.length_idx[0] : self.length_idx[1]][:, 0],
    )


def _result(token_B, valid_B, length_B, log_prob_B) -> ResultTokens:
  data_Bx3 = jnp.stack([token_B, valid_B.astype(jnp.int32), length_B], axis=1).astype(jnp.int32)
  return ResultTokens(data=data_Bx3, log_probs=log_prob_B[:, None].astype(jnp.float32))


@struct.dataclass
class Prefix:
  """A prefilled request: the model's state over a left-padded prompt bucket and its first sampled token."""

  cache: Any  # the model's state of one row (`DecodeModel.init_cache`), P = max_prefill_length columns
  mask_1xP: jax.Array  # int32, left padding
  token: jax.Array  # [1] int32: the first generated token (not yet in the cache)
  position: jax.Array  # [1] int32: its token position
  done: jax.Array  # [1] bool: it already ends the request (EOS or max_new_tokens == 1)
  key_data: jax.Array  # [1, ...] uint32: the request's sampling key


class Engine:
  """Serving engine over a `Decoder(config)` with the lm head (see the module docstring for the cache).

  sampling: static sampling settings shared by every request (max_new_tokens bounds each request).
  max_concurrent_decodes: number of slots. prefill_buckets: prompt lengths compiled for prefill;
  prompts up to `max_prefill_length` (default: the largest bucket) are accepted. model: how to decode
  (default: `decode_model(Decoder(model_config))`).
  """

  def __init__(
    self,
    model_config: DecoderConfig,
    sampling: SamplingParams,
    *,
    max_concurrent_decodes: int = 8,
    prefill_buckets: Sequence[int] = DEFAULT_LENGTH_BUCKETS,
    max_prefill_length: int | None = None,
    cache_length: int | None = None,
    model: DecodeModel | None = None,
    mesh=None,
    seed: int = 0,
  ):
    self.model_config = model_config
    self.sampling = sampling
    self._slots = int(max_concurrent_decodes)
    self._max_prefill_length = int(max_prefill_length or max(prefill_buckets))
    self.prefill_buckets = tuple(sorted(b for b in prefill_buckets if b < self._max_prefill_length)) + (
      self._max_prefill_length,
    )
    self._keep = self._max_prefill_length + sampling.max_new_tokens
    self.cache_length = int(cache_length or self._keep + max(8, self._keep // 4))
    if self.cache_length <= self._keep:
      raise ValueError(
        f"cache_length={self.cache_length} must exceed max_prefill_length + max_new_tokens = {self._keep}"
      )
    self._model = model or decode_model(Decoder(model_config))
    self._mesh = mesh
    self._seed = int(seed)
    self._num_prefills = 0
    self._prefill_jit = jax.jit(self._prefill_impl)
    self._insert_jit = jax.jit(self._insert_impl, donate_argnums=1)
    self._generate_jit = jax.jit(self._generate_impl, donate_argnums=1)

  # --- JetStream engine_api -------------------------------------------------------------------------

  @property
  def max_concurrent_decodes(self) -> int:
    return self._slots

  @property
  def samples_per_slot(self) -> int:
    return 1

  @property
  def max_prefill_length(self) -> int:
    return self._max_prefill_length

  @property
  def mesh(self):
    return self._mesh

  @property
  def colocated_cpus(self):
    return None

  def load_params(self, path: str):
    """Params of an HF checkpoint directory for this engine's config."""
    return load_hf_params(path, self.model_config)

  def get_prefix_destination_sharding(self):
    return None

  def free_resource(self, slot: int):
    """Nothing to free: a slot's cache row is overwritten by the next `insert`."""
    return None

  def init_decode_state(self) -> DecodeState:
    # Empty slots draw tokens that are never reported; any valid key does.
    keys = jnp.broadcast_to(jax.random.key(self._seed), (self._slots,))
    slots = self._slots
    return DecodeState(
      cache=self._model.init_cache(slots, self.cache_length),
      kv_mask=jnp.zeros((slots, self.cache_length), jnp.int32),
      column=jnp.int32(self._max_prefill_length),
      token=jnp.full((slots,), self.sampling.pad_token_id, jnp.int32),
      position=jnp.zeros((slots,), jnp.int32),
      length=jnp.zeros((slots,), jnp.int32),
      live=jnp.zeros((slots,), bool),
      keys=jax.random.key_data(keys),
      steps=jnp.int32(0),
    )

  def prefill(
    self, *, params, existing_prefix=None, padded_tokens, true_length: int, sampler=None, rng=None
  ) -> tuple[Prefix, ResultTokens]:
    """KV cache of one prompt and its first token.

    padded_tokens: 1-D ids, right-padded as JetStream's tokenizer pads (`true_length` real tokens).
    The prompt is re-padded on the left to the smallest prefill bucket. rng: the request's key
    (default: `request_key(engine seed, k, 0)` for the k-th prefill of this engine, the key `serve`
    gives its k-th request with n=1).
    """
    if existing_prefix is not None:
      raise NotImplementedError("prefill on top of an existing prefix is not supported")
    if sampler is not None:
      raise NotImplementedError("a per-call sampler is not supported: set SamplingParams on the Engine")
    true_length = int(true_length)
    tokens = np.asarray(padded_tokens).reshape(-1)[:true_length]
    if not 1 <= true_length <= self._max_prefill_length or len(tokens) < true_length:
      raise ValueError(
        f"prompt of {true_length} tokens: expected 1..{self._max_prefill_length} "
        f"(max_prefill_length) and at most len(padded_tokens)={np.asarray(padded_tokens).size}"
      )
    bucket = pick_bucket(true_length, self.prefill_buckets)
    ids_1xP = np.full((1, bucket), self.sampling.pad_token_id, np.int32)
    ids_1xP[0, bucket - true_length :] = tokens
    mask_1xP = (np.arange(bucket) >= bucket - true_length).astype(np.int32)[None]
    if rng is None:
      rng = request_key(self._seed, self._num_prefills, 0)
      self._num_prefills += 1
    return self._prefill_jit(params, ids_1xP, mask_1xP, rng)

  def insert(self, prefix: Prefix, decode_state: DecodeState, slot: int) -> DecodeState:
    """Puts a prefilled request into `slot` (donates `decode_state`)."""
    if not 0 <= slot < self._slots:
      raise ValueError(f"slot {slot} is outside [0, {self._slots})")
    return self._insert_jit(prefix, decode_state, jnp.int32(slot))

  def generate(self, params, decode_state: DecodeState, sampler=None) -> tuple[DecodeState, ResultTokens]:
    """One new token for every slot (donates `decode_state`); finished or empty slots report valid=0."""
    if sampler is not None:
      raise NotImplementedError("a per-call sampler is not supported: set SamplingParams on the Engine")
    return self._generate_jit(params, decode_state)

  # --- compiled bodies ------------------------------------------------------------------------------

  def _prefill_impl(self, params, ids_1xP, mask_1xP, rng):
    prompt_len = ids_1xP.shape[1]
    cache, kv_mask_1xP = prefill_cache(self._model, params, ids_1xP, mask_1xP, prompt_len)
    state = start_state(cache, kv_mask_1xP, ids_1xP, mask_1xP, rng[None], shared_column=True)
    state, taken = step(self._model, params, state, self.sampling, budget=self.sampling.max_new_tokens)
    # Left-padded to max_prefill_length so that one compiled `insert` serves every bucket.
    pad = self._max_prefill_length - prompt_len
    prefix = Prefix(
      cache=cache_rows.pad_length(state.cache, self._model.cache_axes, 0, before=pad),
      mask_1xP=jnp.pad(state.kv_mask, ((0, 0), (pad, 0))),  # the prompt, its last token written by the step
      token=taken.token,
      position=state.position,
      done=~state.live,
      key_data=state.keys,
    )
    return prefix, _result(taken.token, taken.written, state.length, taken.log_prob)

  def _insert_impl(self, prefix: Prefix, state: DecodeState, slot):
    prompt_len = prefix.mask_1xP.shape[1]
    start = state.column - prompt_len
    cache = cache_rows.put_row(state.cache, prefix.cache, self._model.cache_axes, slot, True, column=start)
    row_S = jax.lax.dynamic_update_slice(jnp.zeros((self.cache_length,), jnp.int32), prefix.mask_1xP[0], (start,))
    return state.replace(
      cache=cache,
      kv_mask=jax.lax.dynamic_update_slice(state.kv_mask, row_S[None], (slot, jnp.int32(0))),
      token=state.token.at[slot].set(prefix.token[0]),
      position=state.position.at[slot].set(prefix.position[0]),
      length=state.length.at[slot].set(1),
      live=state.live.at[slot].set(~prefix.done[0]),
      keys=state.keys.at[slot].set(prefix.key_data[0]),
    )

  def _compact(self, state: DecodeState) -> DecodeState:
    shift = self.cache_length - self._keep
    return state.replace(
      cache=cache_rows.shift_length(state.cache, self._model.cache_axes, shift),
      kv_mask=cache_rows.shift_length(state.kv_mask, ("batch", "length"), shift),
      column=state.column - shift,
    )

  def _generate_impl(self, params, state: DecodeState):
    state = jax.lax.cond(state.column >= self.cache_length, self._compact, lambda s: s, state)
    state, taken = step(self._model, params, state, self.sampling, budget=self.sampling.max_new_tokens)
    return state, _result(taken.token, taken.written, state.length, taken.log_prob)

  # --- continuous batching in-process ---------------------------------------------------------------

  def serve(self, params, prompts: Sequence[Sequence[int]], seed: int = 0, n: int = 1) -> list[dict[str, list]]:
    """Generates n samples per prompt with continuous batching; sample s of prompt i is keyed
    `request_key(seed, i, s)`, as `jaxrlhf.generate` keys it. Returns, prompt-major (prompt i's
    samples at [i * n, (i + 1) * n), the CLI's row order), {'token_ids': [...] (up to and including
    EOS), 'log_probs': [...]}."""
    if n < 1:
      raise ValueError(f"n={n}: expected at least 1 sample per prompt")
    pending = collections.deque(
      (i * n + sample, prompt, request_key(seed, i, sample)) for i, prompt in enumerate(prompts) for sample in range(n)
    )
    free_slots = list(range(self._slots))[::-1]
    running: dict[int, int] = {}  # slot -> output row
    outputs = [{"token_ids": [], "log_probs": []} for _ in range(len(prompts) * n)]

    def record(row: int, result: ResultTokens, slot: int) -> bool:
      """Appends a valid token; True when the request is finished."""
      data = result.get_result_at_slot(slot)
      if not int(data.valid[0, 0]):
        return True
      token = int(data.tokens[0, 0])
      outputs[row]["token_ids"].append(token)
      outputs[row]["log_probs"].append(float(result.log_probs[slot, 0]))
      return token in self.sampling.eos_token_ids or int(data.lengths[0]) >= self.sampling.max_new_tokens

    state = self.init_decode_state()
    while pending or running:
      while pending and free_slots:
        row, prompt, key = pending.popleft()
        prefix, first = self.prefill(
          params=params, padded_tokens=np.asarray(prompt, np.int32), true_length=len(prompt), rng=key
        )
        if not record(row, first.convert_to_numpy(), 0):
          slot = free_slots.pop()
          state = self.insert(prefix, state, slot)
          running[slot] = row
      if not running:
        continue
      state, result = self.generate(params, state)
      result = result.convert_to_numpy()
      for slot, row in list(running.items()):
        if record(row, result, slot):
          del running[slot]
          free_slots.append(slot)
    return outputs
