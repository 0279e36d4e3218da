"""Generation in a bounded number of slots (`actor_rollout_ref.rollout.max_num_seqs`): a finished row's slot
takes the next waiting prompt inside the same compiled loop, so the KV cache holds `max_num_seqs` rows per
generation shard instead of the whole batch.

The pattern is JetStream's prefill / insert / generate, in-graph (docs/architecture.md, "Generation"):
- prefill: every prompt's KV cache ([layers, N, K, P, H], prompt columns only), computed `slots` rows per
  shard at a time, so prefill activations are bounded by the slots too;
- insert: a free slot gets the next prompt of its shard: its prompt columns copied into the slot's row of
  the decode cache ([layers, D x slots, K, P + R - 1, H]), its kv-mask row reset (what the previous row
  left in the other columns is masked, and overwritten as the new row proceeds);
- generate: one decode step for every slot, each at its own cache column (`Decoder`'s per-row
  `cache_index`): a row's prompt sits in columns [0, P) and its response token t is fed at column P + t,
  as in `sampler.generate`, whichever slot or loop step it runs in.

Shards. The batch is split over the generation layout's data-parallel shards D (contiguous blocks, the
layout `StepLayouts.to_generation_batch` gives it); each shard has its own slots and its own queue of
rows, so an insert never moves data between devices (the per-shard updates are vmapped over D: the
gathers and scatters are batched along the sharded axis).

Sampling keys are per row: row r's token t is drawn with `token_keys(fold_in(rng, r), t)`, so what a row
samples depends on the seed, its row and its prompt only, not on `max_num_seqs`, its slot or the step at
which it ran. (`sampler.generate` with one key for the batch draws a row's tokens from one [B, V] draw: a
different, older convention, kept when `max_num_seqs` is not set.)

Inserts per loop step are bounded (`inserts_per_step` per shard, a static unrolled copy each): a burst of
rows finishing at one step refills over the next steps. Memory: the prompt cache N x P plus the slot
cache D x slots x (P + R - 1), against N x (P + R - 1) for the static batch.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from jaxrlhf.models.decoder import CACHE_LOGICAL_AXES
from jaxrlhf.rollout.sampler import SamplingParams, cache_length, decode_step, prefill_cache, token_keys

# Rows a shard's free slots take per loop step (each an unrolled copy of one prompt's cache row).
INSERTS_PER_STEP = 4

_BATCH, _LENGTH = CACHE_LOGICAL_AXES.index("batch"), CACHE_LOGICAL_AXES.index("length")


def row_keys(rng, rows: int):
  """Per-row sampling keys [rows]: `fold_in(rng, r)` for one key; a key per row is used as given."""
  if rng.ndim == 0:
    return jax.vmap(lambda r: jax.random.fold_in(rng, r))(jnp.arange(rows, dtype=jnp.int32))
  return rng


def _by_shard(x, axis: int, shards: int):
  """[..., D x m, ...] -> [..., D, m, ...] at `axis` (contiguous blocks: shard d holds rows [d m, (d+1) m))."""
  return x.reshape(x.shape[:axis] + (shards, x.shape[axis] // shards) + x.shape[axis + 1 :])


def _merge_shards(x, axis: int):
  """The inverse of `_by_shard`."""
  return x.reshape(x.shape[:axis] + (x.shape[axis] * x.shape[axis + 1],) + x.shape[axis + 2 :])


def prefill_prompts(
  apply_fn: Callable,
  params,
  model_config,
  prompt_ids_NxP,
  prompt_mask_NxP,
  *,
  rows_per_call: int,
  shards: int,
  constrain_cache: Callable,
):
  """Every prompt's KV cache ({"k","v"} [layers, N, K, P, H]: columns [0, P - 1), column P - 1 empty),
  `rows_per_call` rows of each shard per forward (a loop over the chunks when they do not cover the batch)."""
  rows, prompt_len = prompt_ids_NxP.shape
  per_shard = rows // shards
  chunks = -(-per_shard // rows_per_call)
  padded = chunks * rows_per_call
  ids = _by_shard(prompt_ids_NxP, 0, shards)
  mask = _by_shard(prompt_mask_NxP.astype(jnp.int32), 0, shards)
  if padded > per_shard:  # rows past the end of a shard: empty prompts, never inserted
    ids = jnp.pad(ids, ((0, 0), (0, padded - per_shard), (0, 0)))
    mask = jnp.pad(mask, ((0, 0), (0, padded - per_shard), (0, 0)))

  def chunk_cache(chunk):
    take = lambda x: _merge_shards(jax.lax.dynamic_slice_in_dim(x, chunk * rows_per_call, rows_per_call, axis=1), 0)
    cache, _ = prefill_cache(apply_fn, params, model_config, take(ids), take(mask), prompt_len, constrain_cache)
    return jax.tree.map(lambda x: _by_shard(x, _BATCH, shards), cache)

  if chunks == 1:
    cache = chunk_cache(0)
  else:

    def body(chunk, cache):
      return jax.tree.map(
        lambda whole, part: jax.lax.dynamic_update_slice_in_dim(whole, part, chunk * rows_per_call, axis=_BATCH + 1),
        cache,
        chunk_cache(chunk),
      )

    first = chunk_cache(0)
    cache = jax.tree.map(lambda x: jnp.pad(x, _widths(x.ndim, _BATCH + 1, padded - rows_per_call)), first)
    cache = jax.lax.fori_loop(1, chunks, body, cache)
  return jax.tree.map(lambda x: _merge_shards(x, _BATCH), cache)


def _widths(ndim: int, axis: int, after: int):
  return [(0, after) if a == axis else (0, 0) for a in range(ndim)]


def generate_in_slots(
  apply_fn: Callable,
  params,
  model_config,
  prompt_ids_NxP,
  prompt_mask_NxP,
  rng,
  sampling: SamplingParams,
  *,
  slots: int,
  shards: int = 1,
  constrain_cache: Callable | None = None,
  inserts_per_step: int = INSERTS_PER_STEP,
):
  """Samples up to `max_new_tokens` per left-padded prompt with `slots` rows decoding at once per shard.

  Same arguments and outputs as `sampler.generate` (`apply_fn` must accept a per-row `cache_index` in a
  decode step, as `Decoder` does), plus `slots` (rows decoding at once in each of `shards` contiguous blocks
  of the batch; more than a shard's rows is the whole shard) and per-row keys (module docstring).
  `num_steps`: loop steps run (each one decode step of every slot).
  """
  rows, prompt_len = prompt_ids_NxP.shape
  if rows % shards:
    raise ValueError(f"{rows} rows do not split into {shards} generation shards")
  per_shard = rows // shards
  slots = max(1, min(int(slots), per_shard))
  batch = shards * slots
  response_len = sampling.max_new_tokens
  total_len = cache_length(prompt_len, response_len, response_len)
  constrain_cache = constrain_cache or (lambda cache: cache)
  eos_E = jnp.asarray(sampling.eos_token_ids, jnp.int32)
  prompt_mask_NxP = prompt_mask_NxP.astype(jnp.int32)
  keys_N = row_keys(rng, rows)
  last_position_N = jnp.maximum(prompt_mask_NxP.sum(axis=1) - 1, 0)
  last_token_N = prompt_ids_NxP[:, -1].astype(jnp.int32)

  prompt_cache = prefill_prompts(
    apply_fn,
    params,
    model_config,
    prompt_ids_NxP,
    prompt_mask_NxP,
    rows_per_call=slots,
    shards=shards,
    constrain_cache=constrain_cache,
  )
  prompt_cache_6d = jax.tree.map(lambda x: _by_shard(x, _BATCH, shards), prompt_cache)

  # The first `slots` rows of every shard fill the slots (a static copy); rows are local to their shard.
  first_rows = lambda x: _merge_shards(_by_shard(x, 0, shards)[:, :slots], 0)
  cache = jax.tree.map(
    lambda x: jnp.pad(_merge_shards(x[:, :, :slots], _BATCH), _widths(x.ndim - 1, _LENGTH, total_len - prompt_len)),
    prompt_cache_6d,
  )
  cache = constrain_cache(cache)
  state = dict(
    row=_merge_shards(jnp.broadcast_to(jnp.arange(slots, dtype=jnp.int32), (shards, slots)), 0),
    generated=jnp.zeros((batch,), jnp.int32),
    live=jnp.ones((batch,), bool),
    token=first_rows(last_token_N),
    kv_mask=jnp.pad(first_rows(prompt_mask_NxP), ((0, 0), (0, total_len - prompt_len))),
    next=jnp.full((shards,), slots, jnp.int32),
  )
  outputs = dict(
    tokens=jnp.full((shards, per_shard, response_len), sampling.pad_token_id, jnp.int32),
    log_probs=jnp.zeros((shards, per_shard, response_len), jnp.float32),
    valid=jnp.zeros((shards, per_shard, response_len), jnp.int32),
  )
  inserts = min(inserts_per_step, slots) if per_shard > slots else 0
  shard_prompt_mask = _by_shard(prompt_mask_NxP, 0, shards)

  def insert(cache, state):
    """Each shard's first free slots take its next rows (at most `inserts` per step)."""

    def one_shard(cache_sh, prompt_sh, mask_sh, state_sh):
      slot_ids = jnp.nonzero(~state_sh["live"], size=inserts, fill_value=slots)[0]
      first_row = state_sh["next"]
      for j in range(inserts):
        row = first_row + j
        ok = (slot_ids[j] < slots) & (row < per_shard)
        slot, row = jnp.minimum(slot_ids[j], slots - 1), jnp.minimum(row, per_shard - 1)

        def put(whole, new, slot=slot, ok=ok):
          old = jax.lax.dynamic_slice_in_dim(whole, slot, 1, axis=0)
          return jax.lax.dynamic_update_slice_in_dim(whole, jnp.where(ok, new, old), slot, axis=0)

        cache_sh = jax.tree.map(lambda whole, prompt: _put_prompt(whole, prompt, slot, row, ok), cache_sh, prompt_sh)
        state_sh = dict(
          state_sh,
          row=put(state_sh["row"], row[None]),
          generated=put(state_sh["generated"], jnp.zeros((1,), jnp.int32)),
          live=put(state_sh["live"], jnp.ones((1,), bool)),
          kv_mask=put(
            state_sh["kv_mask"],
            jnp.pad(jax.lax.dynamic_slice_in_dim(mask_sh, row, 1, axis=0), ((0, 0), (0, total_len - prompt_len))),
          ),
        )
        state_sh["next"] = state_sh["next"] + ok.astype(jnp.int32)
      return cache_sh, state_sh

    shard_axis = _BATCH  # the caches as [layers, D, slots or rows, K, S, H]: D at the batch axis
    cache_6d = jax.tree.map(lambda x: _by_shard(x, _BATCH, shards), cache)
    state_sh = {name: value if name == "next" else _by_shard(value, 0, shards) for name, value in state.items()}
    cache_6d, state_sh = jax.vmap(one_shard, in_axes=(shard_axis, shard_axis, 0, 0), out_axes=(shard_axis, 0))(
      cache_6d, prompt_cache_6d, shard_prompt_mask, state_sh
    )
    cache = constrain_cache(jax.tree.map(lambda x: _merge_shards(x, _BATCH), cache_6d))
    return cache, {name: value if name == "next" else _merge_shards(value, 0) for name, value in state_sh.items()}

  def body(carry):
    step, cache, state, outputs = carry
    if inserts:
      cache, state = insert(cache, state)
    # The slot's global row (its shard's block + its local row) names its prompt and its key.
    global_row = _merge_shards(
      _by_shard(state["row"], 0, shards) + (jnp.arange(shards, dtype=jnp.int32) * per_shard)[:, None], 0
    )
    generated = state["generated"]
    column = prompt_len - 1 + generated  # this step's input: the last prompt token, then each sampled one
    kv_mask = state["kv_mask"] | (jnp.arange(total_len)[None, :] == column[:, None]).astype(jnp.int32)
    token, log_prob, cache = decode_step(
      apply_fn,
      params,
      jnp.where(generated == 0, last_token_N[global_row], state["token"]),
      last_position_N[global_row] + generated,
      kv_mask,
      cache,
      column,
      token_keys(keys_N[global_row], generated),
      sampling,
    )
    cache = constrain_cache(cache)
    live = state["live"]

    def record(out_sh, row_sh, at_sh, value_sh, live_sh):
      return out_sh.at[jnp.where(live_sh, row_sh, per_shard), at_sh].set(value_sh, mode="drop")

    shard = lambda x: _by_shard(x, 0, shards)
    outputs = {
      name: jax.vmap(record)(outputs[name], shard(state["row"]), shard(generated), shard(value), shard(live))
      for name, value in (("tokens", token), ("log_probs", log_prob), ("valid", jnp.ones_like(token)))
    }
    generated = generated + live.astype(jnp.int32)
    finished = jnp.isin(token, eos_E) | (generated >= response_len)
    state = dict(state, generated=generated, live=live & ~finished, token=token, kv_mask=kv_mask)
    return step + 1, cache, state, outputs

  def cond(carry):
    _, _, state, _ = carry
    return jnp.any(state["live"]) | jnp.any(state["next"] < per_shard)

  steps, _, _, outputs = jax.lax.while_loop(cond, body, (jnp.int32(0), cache, state, outputs))
  tokens, log_probs, valid = (_merge_shards(outputs[name], 0) for name in ("tokens", "log_probs", "valid"))
  return {
    "responses": tokens,
    "response_mask": valid,
    "rollout_log_probs": log_probs,
    "response_lengths": valid.sum(axis=1),
    "num_steps": steps,
  }


def _put_prompt(slot_cache, prompt_cache, slot, row, ok):
  """A shard's slot cache [layers, slots, K, S, H] with prompt row `row` (of [layers, rows, K, P, H]) in the first
  P columns of slot `slot` where `ok` (else unchanged)."""
  new = jax.lax.dynamic_slice_in_dim(prompt_cache, row, 1, axis=_BATCH)
  start = tuple(slot if axis == _BATCH else jnp.int32(0) for axis in range(slot_cache.ndim))
  old = jax.lax.dynamic_slice(slot_cache, start, new.shape)
  return jax.lax.dynamic_update_slice(slot_cache, jnp.where(ok, new, old), start)
