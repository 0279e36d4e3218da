"""Generation in a bounded number of slots (`actor_rollout_ref.rollout.max_num_seqs`): a finished row's slot
takes the next waiting prompt inside the same compiled loop, so the KV cache holds `max_num_seqs` rows per
generation shard instead of the whole batch.

The pattern is JetStream's prefill / insert / generate, in-graph (docs/architecture.md, "Generation", Slots):
- prefill: prompts' states (for a KV cache [layers, N, K, P, H], prompt columns only), `slots` rows per shard at a
  time, held in a window of the next 2 x slots rows of each shard that slides on as rows enter slots (prefilling
  the following chunk inside the loop into the place of the chunk its rows have left: a ring, `PromptChunks`), so
  prefill activations and prompt state are bounded by the slots too (a recurrent layer's state is whole per row:
  for all N rows at once it would be the whole batch's);
- insert: a free slot gets the next prompt of its shard: its prompt state copied into the slot's row of
  the decode cache (a KV cache's first P columns of [layers, D x slots, K, P + R - 1, H]; a leaf without a
  length axis whole, `cache_rows.put_row`), its kv-mask row reset (what the previous row left in the other
  columns is masked, and overwritten as the new row proceeds);
- generate: one step of the decode loop (`rollout/decode.py`) for every slot, each at its own cache column
  (`Decoder`'s per-row `cache_index`): a row's prompt sits in columns [0, P) and its response token t is fed at
  column P + t, as in `batch.generate`, whichever slot or loop step it runs in. The record and the refill are
  the loop's after-step policy.

Shards. The batch is split over the generation layout's data-parallel shards D (contiguous blocks, the
layout `StepLayouts.to_generation_batch` gives it); each shard has its own slots and its own queue of
rows, so an insert never moves data between devices: the per-shard record and refill run on each shard's
local rows (`Shards.map`: a vmap over D here, a `shard_map` on a mesh, `StepLayouts.generation_shards`).

Sampling keys are per row: row r's token t is drawn with `token_keys(fold_in(rng, r), t)`, so what a row
samples depends on the seed, its row and its prompt only, not on `max_num_seqs`, its slot or the step at
which it ran. (`batch.generate` with one key for the batch draws a row's tokens from one [B, V] draw: a
different, older convention, kept when `max_num_seqs` is not set.)

Inserts per loop step are bounded (`inserts_per_step` per shard, a static unrolled copy each): a burst of
rows finishing at one step refills over the next steps (`inserts_per_step` <= slots keeps them in the window).
Memory: the prompt window D x 2 slots x P plus the slot cache D x slots x (P + R - 1), against N x (P + R - 1) for
the static batch.
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from jaxrlhf.models.decoding import DecodeModel
from jaxrlhf.rollout import cache_rows
from jaxrlhf.rollout.batch import cache_length
from jaxrlhf.rollout.decode import DecodeState, Responses, decode, prefill_cache, record_outputs, start_state
from jaxrlhf.rollout.sampler import SamplingParams

# Rows a shard's free slots take per loop step (each an unrolled copy of one prompt's cache row).
INSERTS_PER_STEP = 4
# Prompt tokens one prefill call runs per generation shard: a chunk of more rows prefills in groups (`PromptChunks`).
# A forward's activations grow with its tokens; a mixture of experts' (token, expert) pair buffers by top-k times
# more (Qwen3-30B-A3B: 256 slots x 1,024 prompt tokens held [2M, 2048] bf16 buffers, 8 GiB each, on every GPU).
PREFILL_TOKENS = 32768


def row_keys(rng, rows: int):
  """Per-row sampling keys [rows]: `fold_in(rng, r)` for one key; a key per row is used as given."""
  if rng.ndim == 0:
    return jax.vmap(lambda r: jax.random.fold_in(rng, r))(jnp.arange(rows, dtype=jnp.int32))
  return rng


@dataclasses.dataclass(frozen=True)
class PromptChunks:
  """Prefills the prompts of every shard `slots` rows at a time: `rows(starts_D)` is the state of rows
  [start_d, start_d + slots) of each shard d (a cache [.., D x slots, ..], merged over the shards), as the prompts'
  forward leaves it (a KV cache's columns [0, P - 1); column P - 1 empty). Rows past a shard's end are empty
  prompts, never inserted.

  The window of waiting prompt states is a ring of two chunks per shard: row r (r >= slots) sits at
  `ring_index(r)`, so sliding on overwrites the chunk its rows have left in place (no copy of the window)."""

  @staticmethod
  def ring_index(row, slots: int):
    """Where row `row` of a shard sits in its window ([2 slots] rows; rows from `slots` on)."""
    return (row - slots) % (2 * slots)

  model: DecodeModel
  params: object
  ids_DxMxP: jax.Array  # each shard's prompts, padded with empty ones by two chunks
  mask_DxMxP: jax.Array
  slots: int
  constrain_cache: object

  @classmethod
  def of(cls, model, params, prompt_ids_NxP, prompt_mask_NxP, *, slots: int, shards: int, constrain_cache):
    pad = ((0, 0), (0, 2 * slots), (0, 0))
    ids = jnp.pad(cache_rows.split_axis(prompt_ids_NxP, 0, shards), pad)
    mask = jnp.pad(cache_rows.split_axis(prompt_mask_NxP.astype(jnp.int32), 0, shards), pad)
    return cls(model, params, ids, mask, slots, constrain_cache)

  def rows(self, starts_D, count: int | None = None):
    """The prompt state of rows [start_d, start_d + count) of each shard d (`count`: one chunk of `slots`), in
    prefill calls of at most `PREFILL_TOKENS` prompt tokens per shard: groups of `group` rows of every shard at once
    (a loop over the groups), so a call's rows stay split over the shards as the chunk's are."""
    count = count or self.slots
    shards, _, prompt_len = self.ids_DxMxP.shape
    take = lambda x: jax.vmap(lambda rows, start: jax.lax.dynamic_slice_in_dim(rows, start, count, axis=0))(x, starts_D)
    ids_DxCxP, mask_DxCxP = take(self.ids_DxMxP), take(self.mask_DxMxP)
    group = max(r for r in range(1, count + 1) if count % r == 0 and (r * prompt_len <= PREFILL_TOKENS or r == 1))
    prefill = lambda ids_BxP, mask_BxP: prefill_cache(
      self.model, self.params, ids_BxP, mask_BxP, prompt_len, self.constrain_cache
    )[0]
    if group == count:
      return prefill(cache_rows.merge_axis(ids_DxCxP, 0), cache_rows.merge_axis(mask_DxCxP, 0))
    # [D, C, P] -> [G, D x group, P]: each call takes `group` rows of every shard
    to_groups = lambda x: cache_rows.merge_axis(jnp.moveaxis(cache_rows.split_axis(x, 1, count // group), 1, 0), 1)
    caches_G = jax.lax.map(lambda inputs: prefill(*inputs), (to_groups(ids_DxCxP), to_groups(mask_DxCxP)))

    def back(x, names):  # [G, .., D x group, ..] -> [.., D x C, ..], shard-major (shard d's rows contiguous)
      axis = names.index("batch")
      x = cache_rows.split_axis(jnp.moveaxis(x, 0, axis), axis + 1, shards)  # [.., G, D, group, ..]
      return cache_rows.merge_axis(cache_rows.merge_axis(jnp.swapaxes(x, axis, axis + 1), axis + 1), axis)

    return self.constrain_cache(cache_rows.map_leaves(back, caches_G, self.model.cache_axes))


def advance_window(chunks: PromptChunks, shards, window, window_start_D, next_D, axes):
  """The prompt window after a step: a shard whose next waiting row has left the window's first chunk prefills the
  chunk after its second into the first's place in the ring (only when some shard needs it; each shard updates its
  own rows, `Shards.map`). Returns (window, window_start_D)."""
  slots = chunks.slots
  need_D = next_D >= window_start_D + slots
  offset_D = PromptChunks.ring_index(window_start_D, slots)

  def put(window, local, fresh, _):
    need, offset = local

    def one(whole, new, names):
      axis = names.index("batch")
      old = jax.lax.dynamic_slice_in_dim(whole, offset[0], slots, axis=axis)
      chunk = jnp.where(need[0], new.astype(whole.dtype), old)
      return jax.lax.dynamic_update_slice_in_dim(whole, chunk, offset[0], axis=axis)

    return jax.tree.map(one, window, fresh, axes), local

  def shift(window):
    fresh = chunks.rows(window_start_D + 2 * slots)
    return shards.map(put, axes, window, (need_D, offset_D), fresh, ())[0]

  window = jax.lax.cond(jnp.any(need_D), shift, lambda window: window, window)
  return window, window_start_D + slots * need_D.astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class Shards:
  """The generation shards of a batch: `count` contiguous blocks of rows, and how code runs on each block's own
  rows. Here (no mesh) the blocks are one array's, and `map` vmaps over them; `StepLayouts.generation_shards`
  gives a mesh's (a `shard_map`: each device updates its own rows, nothing moves between devices)."""

  count: int = 1

  def constrain_cache(self, cache, cache_axes):
    return cache

  def map(self, fn, cache_axes, cache, rows, const_caches, const_rows):
    """fn(cache, rows, const_caches, const_rows) -> (cache, rows) on one block's local views: caches (leaves with
    `cache_axes`) of the block's rows, rows [rows of the block, ...]; `const_*` are read only."""
    batch_axes = jax.tree.map(lambda names: names.index("batch"), cache_axes, is_leaf=lambda x: isinstance(x, tuple))
    split_cache = lambda tree: jax.tree.map(
      lambda x, axis: cache_rows.split_axis(x, axis, self.count), tree, batch_axes
    )
    split_rows = lambda tree: jax.tree.map(lambda x: cache_rows.split_axis(x, 0, self.count), tree)
    const_axes = None if const_caches is None else batch_axes  # None: the slots hold every row, nothing to read
    const_caches = None if const_caches is None else split_cache(const_caches)
    args = (split_cache(cache), split_rows(rows), const_caches, split_rows(const_rows))
    in_axes = (batch_axes, 0, const_axes, 0)
    cache, rows = jax.vmap(fn, in_axes=in_axes, out_axes=in_axes[:2])(*args)
    merged = jax.tree.map(cache_rows.merge_axis, cache, batch_axes)
    return merged, jax.tree.map(lambda x: cache_rows.merge_axis(x, 0), rows)


def generate_in_slots(
  model: DecodeModel,
  params,
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

  Same arguments and outputs as `batch.generate` (the model must accept a per-row `cache_index` in a decode step,
  as `Decoder` does), plus `slots` (rows decoding at once in each shard; more than a shard's rows is the whole
  shard), `shards` (a count, or the mesh's `Shards`: it also pins the caches) and per-row keys (module docstring).
  `num_steps`: loop steps run (each one decode step of every slot).
  """
  shards = shards if isinstance(shards, Shards) else Shards(int(shards))
  axes = model.cache_axes
  rows, prompt_len = prompt_ids_NxP.shape
  if rows % shards.count:
    raise ValueError(f"{rows} rows do not split into {shards.count} generation shards")
  per_shard = rows // shards.count
  slots = max(1, min(int(slots), per_shard))
  response_len = sampling.max_new_tokens
  total_len = cache_length(prompt_len, response_len, response_len)
  prompt_mask_NxP = prompt_mask_NxP.astype(jnp.int32)
  # What a slot reads of its row when the row enters it.
  prompts = dict(
    mask=jnp.pad(prompt_mask_NxP, ((0, 0), (0, total_len - prompt_len))),
    last_token=prompt_ids_NxP[:, -1].astype(jnp.int32),
    last_position=jnp.maximum(prompt_mask_NxP.sum(axis=1) - 1, 0),
    key=jax.random.key_data(row_keys(rng, rows)),
  )
  # The first `slots` rows of every shard fill the slots (a static copy); a slot's `row` is local to its shard.
  first_rows = lambda x, axis=0: cache_rows.merge_axis(
    jax.lax.slice_in_dim(cache_rows.split_axis(x, axis, shards.count), 0, slots, axis=axis + 1), axis
  )
  constrain_cache = lambda cache: shards.constrain_cache(cache, axes)
  inserts = min(inserts_per_step, slots) if per_shard > slots else 0
  if inserts:
    # The first `slots` rows of every shard prefilled in their slots; the next two chunks of `slots` rows of each
    # shard wait in a window of prompt states that slides on as rows enter slots (`advance_window`): prompt state
    # is held for 3 x slots rows per shard, not for all of them (a recurrent layer's state is whole per row).
    chunks = PromptChunks.of(
      model, params, prompt_ids_NxP, prompt_mask_NxP, slots=slots, shards=shards.count, constrain_cache=constrain_cache
    )
    starts = lambda first: jnp.full((shards.count,), first, jnp.int32)
    cache = cache_rows.pad_length(chunks.rows(starts(0)), axes, total_len - prompt_len)
    window = chunks.rows(starts(slots), 2 * slots)  # rows [slots, 3 slots): ring_index 0, 1, ...
  else:  # every row has its slot from the start: prefilled in place, no prompt window
    window = None
    cache, _ = prefill_cache(
      model, params, prompt_ids_NxP, prompt_mask_NxP, total_len, constrain_cache, visible_length=prompt_len
    )
  state = start_state(
    constrain_cache(cache),
    first_rows(prompts["mask"]),
    first_rows(prompt_ids_NxP),
    first_rows(prompt_mask_NxP),
    jax.random.wrap_key_data(first_rows(prompts["key"])),
    shared_column=False,
  )
  # The model's per-token records of each row (`DecodeModel.records`): saved when the row leaves its slot.
  width = prompt_len + response_len
  blank = record_outputs(model, state.cache, jnp.zeros_like(state.kv_mask), width)
  saved = jax.tree.map(lambda x: jnp.broadcast_to(x[:1], (rows,) + x.shape[1:]), blank)
  slot_rows = SlotRows(
    row=jnp.tile(jnp.arange(slots, dtype=jnp.int32), shards.count),
    next=jnp.full((shards.count,), slots, jnp.int32),  # each shard's next waiting row
    window_start=jnp.full((shards.count,), slots, jnp.int32),  # the first row the prompt window holds
  )

  def insert(cache, state: DecodeState, slot_rows: SlotRows, saved, window, prompts):
    """A shard's first free slots take its next rows (at most `inserts` per step) from the prompt window; the
    records of the rows they held are saved first."""
    free = jnp.nonzero(~state.live, size=inserts, fill_value=slots)[0]
    first = slot_rows.next[0]
    for j in range(inserts):
      ok = (free[j] < slots) & (first + j < per_shard)
      slot, row = jnp.minimum(free[j], slots - 1), jnp.minimum(first + j, per_shard - 1)
      if saved:
        leaving = record_outputs(
          model,
          cache_rows.take_rows(cache, axes, slot, 1),
          jax.lax.dynamic_slice_in_dim(state.kv_mask, slot, 1, axis=0),
          width,
        )
        left = slot_rows.row[slot]
        saved = jax.tree.map(lambda whole, new, left=left, ok=ok: _put_row(whole, new, left, ok), saved, leaving)
      in_window = PromptChunks.ring_index(row, slots)
      cache = cache_rows.put_row(cache, cache_rows.take_rows(window, axes, in_window, 1), axes, slot, ok)
      take = lambda x, row=row: jax.lax.dynamic_slice_in_dim(x, row, 1, axis=0)
      put = lambda whole, new, slot=slot, ok=ok: _put_row(whole, new, slot, ok)
      state = state.replace(
        kv_mask=put(state.kv_mask, take(prompts["mask"])),
        column=put(state.column, jnp.full((1,), prompt_len - 1, jnp.int32)),
        token=put(state.token, take(prompts["last_token"])),
        position=put(state.position, take(prompts["last_position"])),
        length=put(state.length, jnp.zeros((1,), jnp.int32)),
        live=put(state.live, jnp.ones((1,), bool)),
        keys=put(state.keys, take(prompts["key"])),
      )
      slot_rows = slot_rows.replace(row=put(slot_rows.row, row[None]), next=slot_rows.next + ok.astype(jnp.int32))
    return cache, state, slot_rows, saved

  def advance(cache, local, window, prompts):
    """A shard after a decode step: its tokens recorded under their rows, finished rows' slots refilled."""
    state, slot_rows, responses, saved, taken = local
    responses = responses.record(taken, rows=slot_rows.row)
    if inserts:
      cache, state, slot_rows, saved = insert(cache, state, slot_rows, saved, window, prompts)
    return cache, (state, slot_rows, responses, saved, taken)

  def after_step(state: DecodeState, carried, taken):
    slot_rows, responses, saved, window = carried
    # The shards' local views hold per-row arrays only: the step count stays outside.
    local = (state.replace(cache=(), steps=()), slot_rows, responses, saved, taken)
    cache, (local_state, slot_rows, responses, saved, _) = shards.map(
      advance, axes, state.cache, local, window, prompts
    )
    if inserts:
      window, window_start = advance_window(chunks, shards, window, slot_rows.window_start, slot_rows.next, axes)
      window, slot_rows = constrain_cache(window), slot_rows.replace(window_start=window_start)
    return local_state.replace(cache=cache, steps=state.steps), (slot_rows, responses, saved, window)

  state, (slot_rows, responses, saved, _) = decode(
    model,
    params,
    state,
    (slot_rows, Responses.empty(rows, response_len, sampling.pad_token_id), saved, window),
    sampling,
    budget=response_len,
    after_step=after_step,
  )
  if saved:  # the rows still in their slots

    def save_last(cache, local, _const_caches, _const_rows):
      kv_mask, row, saved = local
      last = record_outputs(model, cache, kv_mask, width)
      return cache, (kv_mask, row, jax.tree.map(lambda whole, new: whole.at[row].set(new), saved, last))

    _, (_, _, saved) = shards.map(save_last, axes, state.cache, (state.kv_mask, slot_rows.row, saved), None, ())
  return dict(responses.as_outputs(state.steps), **saved)


@flax.struct.dataclass
class SlotRows:
  """Which row each slot decodes, and each shard's next waiting row (rows local to their shard)."""

  row: jax.Array  # [D x slots] int32
  next: jax.Array  # [D] int32
  window_start: jax.Array  # [D] int32: the prompt window holds rows [start, start + 2 slots) of each shard


def _put_row(whole, new, slot, ok):
  """`whole` ([slots, ...]) with row `slot` replaced by `new` ([1, ...]) where `ok`."""
  old = jax.lax.dynamic_slice_in_dim(whole, slot, 1, axis=0)
  return jax.lax.dynamic_update_slice_in_dim(whole, jnp.where(ok, new, old), slot, axis=0)
