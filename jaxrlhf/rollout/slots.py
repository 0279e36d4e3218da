"""Generation in a bounded number of slots (`actor_rollout_ref.rollout.max_num_seqs`): a finished row's slot
takes the next waiting prompt inside the same compiled loop, so the KV cache holds `max_num_seqs` rows per
generation shard instead of the whole batch.

The pattern is JetStream's prefill / insert / generate, in-graph (docs/architecture.md, "Generation", Slots):
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
rows, so an insert never moves data between devices: the per-shard record and refill run on each shard's
local rows (`Shards.map`: a vmap over D here, a `shard_map` on a mesh, `StepLayouts.generation_shards`).

Sampling keys are per row: row r's token t is drawn with `token_keys(fold_in(rng, r), t)`, so what a row
samples depends on the seed, its row and its prompt only, not on `max_num_seqs`, its slot or the step at
which it ran. (`sampler.generate` with one key for the batch draws a row's tokens from one [B, V] draw: a
different, older convention, kept when `max_num_seqs` is not set.)

Inserts per loop step are bounded (`inserts_per_step` per shard, a static unrolled copy each): a burst of
rows finishing at one step refills over the next steps. Memory: the prompt cache N x P plus the slot
cache D x slots x (P + R - 1), against N x (P + R - 1) for the static batch.
"""

from __future__ import annotations

import dataclasses
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


@dataclasses.dataclass(frozen=True)
class Shards:
  """The generation shards of a batch: `count` contiguous blocks of rows, and how code runs on each block's own
  rows. Here (no mesh) the blocks are one array's, and `map` vmaps over them; `StepLayouts.generation_shards`
  gives a mesh's (a `shard_map`: each device updates its own rows, nothing moves between devices)."""

  count: int = 1

  def constrain_cache(self, cache):
    return cache

  def map(self, fn, cache, rows, const_caches, const_rows):
    """fn(cache, rows, const_caches, const_rows) -> (cache, rows) on one block's local views: caches
    [layers, rows of the block, K, S, H], rows [rows of the block, ...]; `const_*` are read only."""
    split = lambda axis: lambda x: _by_shard(x, axis, self.count)
    merge = lambda axis: lambda x: _merge_shards(x, axis)
    args = (cache, rows, const_caches, const_rows)
    axes = (_BATCH, 0, _BATCH, 0)
    cache, rows = jax.vmap(fn, in_axes=axes, out_axes=axes[:2])(
      *(jax.tree.map(split(axis), arg) for arg, axis in zip(args, axes))
    )
    return jax.tree.map(merge(_BATCH), cache), jax.tree.map(merge(0), rows)


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
  shards: int | Shards = 1,
  inserts_per_step: int = INSERTS_PER_STEP,
):
  """Samples up to `max_new_tokens` per left-padded prompt with `slots` rows decoding at once per shard.

  Same arguments and outputs as `sampler.generate` (`apply_fn` must accept a per-row `cache_index` in a
  decode step, as `Decoder` does), plus `slots` (rows decoding at once in each shard; more than a shard's rows
  is the whole shard), `shards` (a count, or the mesh's `Shards`: it also pins the caches) and per-row keys
  (module docstring). `num_steps`: loop steps run (each one decode step of every slot).
  """
  shards = shards if isinstance(shards, Shards) else Shards(int(shards))
  rows, prompt_len = prompt_ids_NxP.shape
  if rows % shards.count:
    raise ValueError(f"{rows} rows do not split into {shards.count} generation shards")
  per_shard = rows // shards.count
  slots = max(1, min(int(slots), per_shard))
  response_len = sampling.max_new_tokens
  total_len = cache_length(prompt_len, response_len, response_len)
  eos_E = jnp.asarray(sampling.eos_token_ids, jnp.int32)
  prompt_mask_NxP = prompt_mask_NxP.astype(jnp.int32)
  # What a slot reads of its row when the row enters it.
  prompts = dict(
    mask=prompt_mask_NxP,
    last_token=prompt_ids_NxP[:, -1].astype(jnp.int32),
    last_position=jnp.maximum(prompt_mask_NxP.sum(axis=1) - 1, 0),
    key=jax.random.key_data(row_keys(rng, rows)),
  )
  # The first `slots` rows of every shard fill the slots (a static copy); a slot's `row` is local to its shard.
  first_rows = lambda x, axis=0: _merge_shards(
    jax.lax.slice_in_dim(_by_shard(x, axis, shards.count), 0, slots, axis=axis + 1), axis
  )
  inserts = min(inserts_per_step, slots) if per_shard > slots else 0
  if inserts:
    prompt_cache = prefill_prompts(
      apply_fn,
      params,
      model_config,
      prompt_ids_NxP,
      prompt_mask_NxP,
      rows_per_call=slots,
      shards=shards.count,
      constrain_cache=shards.constrain_cache,
    )
    cache = jax.tree.map(
      lambda x: jnp.pad(first_rows(x, _BATCH), _widths(x.ndim, _LENGTH, total_len - prompt_len)), prompt_cache
    )
  else:  # every row has its slot from the start: prefilled in place, no separate prompt cache
    prompt_cache = None
    cache, _ = prefill_cache(
      apply_fn,
      params,
      model_config,
      prompt_ids_NxP,
      prompt_mask_NxP,
      total_len,
      shards.constrain_cache,
      visible_length=prompt_len,
    )
  cache = shards.constrain_cache(cache)
  state = dict(
    row=jnp.tile(jnp.arange(slots, dtype=jnp.int32), shards.count),
    generated=jnp.zeros((shards.count * slots,), jnp.int32),
    live=jnp.ones((shards.count * slots,), bool),
    token=first_rows(prompts["last_token"]),
    position=first_rows(prompts["last_position"]),
    key=first_rows(prompts["key"]),
    kv_mask=jnp.pad(first_rows(prompts["mask"]), ((0, 0), (0, total_len - prompt_len))),
    next=jnp.full((shards.count,), slots, jnp.int32),  # each shard's next waiting row
  )
  outputs = dict(
    tokens=jnp.full((rows, response_len), sampling.pad_token_id, jnp.int32),
    log_probs=jnp.zeros((rows, response_len), jnp.float32),
    valid=jnp.zeros((rows, response_len), jnp.int32),
  )

  def insert(slot_cache, state, prompt_cache, prompts):
    """A shard's first free slots take its next rows (at most `inserts` per step)."""
    free = jnp.nonzero(~state["live"], size=inserts, fill_value=slots)[0]
    first = state["next"][0]
    for j in range(inserts):
      ok = (free[j] < slots) & (first + j < per_shard)
      slot, row = jnp.minimum(free[j], slots - 1), jnp.minimum(first + j, per_shard - 1)
      slot_cache = jax.tree.map(lambda whole, part: _put_prompt(whole, part, slot, row, ok), slot_cache, prompt_cache)
      take = lambda x, row=row: jax.lax.dynamic_slice_in_dim(x, row, 1, axis=0)
      entering = dict(
        row=row[None],
        generated=jnp.zeros((1,), jnp.int32),
        live=jnp.ones((1,), bool),
        token=take(prompts["last_token"]),
        position=take(prompts["last_position"]),
        key=take(prompts["key"]),
        kv_mask=jnp.pad(take(prompts["mask"]), ((0, 0), (0, total_len - prompt_len))),
      )
      state = {
        name: _put_row(value, entering[name], slot, ok) if name in entering else value for name, value in state.items()
      }
      state["next"] = state["next"] + ok.astype(jnp.int32)
    return slot_cache, state

  def advance(slot_cache, rows_in, prompt_cache, prompts):
    """A shard after a decode step: its tokens recorded, finished rows' slots freed and refilled."""
    state, outputs, (token, log_prob) = rows_in["state"], rows_in["outputs"], rows_in["sampled"]
    live, generated = state["live"], state["generated"]
    at = (jnp.where(live, state["row"], per_shard), generated)  # a free slot's token is dropped
    outputs = {
      name: outputs[name].at[at].set(value, mode="drop")
      for name, value in (("tokens", token), ("log_probs", log_prob), ("valid", jnp.ones_like(token)))
    }
    generated = generated + live.astype(jnp.int32)
    live = live & ~(jnp.isin(token, eos_E) | (generated >= response_len))
    state = dict(state, generated=generated, live=live, token=token)
    if inserts:
      slot_cache, state = insert(slot_cache, state, prompt_cache, prompts)
    return slot_cache, dict(rows_in, state=state, outputs=outputs)

  def body(carry):
    step, cache, state, outputs = carry
    generated = state["generated"]
    column = prompt_len - 1 + generated  # this step's input: the last prompt token, then each sampled one
    kv_mask = state["kv_mask"] | (jnp.arange(total_len)[None, :] == column[:, None]).astype(jnp.int32)
    sampled_token, log_prob, cache = decode_step(
      apply_fn,
      params,
      state["token"],
      state["position"] + generated,
      kv_mask,
      cache,
      column,
      token_keys(jax.random.wrap_key_data(state["key"]), generated),
      sampling,
    )
    rows_in = dict(state=dict(state, kv_mask=kv_mask), outputs=outputs, sampled=(sampled_token, log_prob))
    cache, rows_out = shards.map(advance, cache, rows_in, prompt_cache, prompts)
    return step + 1, cache, rows_out["state"], rows_out["outputs"]

  cond = lambda carry: jnp.any(carry[2]["live"])
  steps, _, _, outputs = jax.lax.while_loop(cond, body, (jnp.int32(0), cache, state, outputs))
  return {
    "responses": outputs["tokens"],
    "response_mask": outputs["valid"],
    "rollout_log_probs": outputs["log_probs"],
    "response_lengths": outputs["valid"].sum(axis=1),
    "num_steps": steps,
  }


def _put_row(whole, new, slot, ok):
  """`whole` ([slots, ...]) with row `slot` replaced by `new` ([1, ...]) where `ok`."""
  old = jax.lax.dynamic_slice_in_dim(whole, slot, 1, axis=0)
  return jax.lax.dynamic_update_slice_in_dim(whole, jnp.where(ok, new, old), slot, axis=0)


def _put_prompt(slot_cache, prompt_cache, slot, row, ok):
  """A shard's slot cache [layers, slots, K, S, H] with prompt row `row` (of [layers, rows, K, P, H]) in the first
  P columns of slot `slot` where `ok` (else unchanged)."""
  new = jax.lax.dynamic_slice_in_dim(prompt_cache, row, 1, axis=_BATCH)
  start = tuple(slot if axis == _BATCH else jnp.int32(0) for axis in range(slot_cache.ndim))
  old = jax.lax.dynamic_slice(slot_cache, start, new.shape)
  return jax.lax.dynamic_update_slice(slot_cache, jnp.where(ok, new, old), start)
