"""Rows and columns of a model's per-layer cache, moved by each leaf's logical axes (`DecodeModel.cache_axes`).

Generation moves a row's state between slots and shards and its columns along the sequence without knowing what
a layer keeps: every leaf has a "batch" axis; leaves that grow with the sequence (keys, values) also have a
"length" axis, the others (a recurrent state) are moved whole per row. A "ring" axis (a sliding layer's last W columns,
`models/ring_cache.py`) holds sequence column c at c mod W: where the columns shift, it rolls.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def map_leaves(fn, cache, axes):
  """fn(leaf, names) over the cache's leaves; `names` is that leaf's tuple of logical axes."""
  return jax.tree.map(fn, cache, axes)


def _axis(names, name: str) -> int | None:
  return names.index(name) if name in names else None


def pad_length(cache, axes, after: int, before: int = 0):
  """Leaves with a length axis padded with `before` / `after` zero columns; the others unchanged."""

  def pad(x, names):
    length = _axis(names, "length")
    if _axis(names, "ring") is not None:
      return jnp.roll(x, before, axis=_axis(names, "ring"))
    if length is None or not (before or after):
      return x
    return jnp.pad(x, [(before, after) if a == length else (0, 0) for a in range(x.ndim)])

  return map_leaves(pad, cache, axes)


def shift_length(cache, axes, shift: int):
  """Leaves with a length axis moved `shift` columns left (zeros come in at the end)."""

  def left(x, names):
    length = _axis(names, "length")
    if _axis(names, "ring") is not None:
      return jnp.roll(x, -shift, axis=_axis(names, "ring"))
    if length is None:
      return x
    kept = jax.lax.slice_in_dim(x, shift, x.shape[length], axis=length)
    return jnp.concatenate([kept, jnp.zeros_like(jax.lax.slice_in_dim(x, 0, shift, axis=length))], axis=length)

  return map_leaves(left, cache, axes)


def split_rows(cache, axes, shards: int):
  """[.., D x m, ..] -> [.., D, m, ..] at each leaf's batch axis (contiguous blocks: shard d holds rows
  [d m, (d+1) m))."""
  return map_leaves(lambda x, names: split_axis(x, names.index("batch"), shards), cache, axes)


def merge_rows(cache, axes):
  """The inverse of `split_rows` (`axes`: the leaves' axes before the split)."""
  return map_leaves(lambda x, names: merge_axis(x, names.index("batch")), cache, axes)


def split_axis(x, axis: int, shards: int):
  return x.reshape(x.shape[:axis] + (shards, x.shape[axis] // shards) + x.shape[axis + 1 :])


def merge_axis(x, axis: int):
  return x.reshape(x.shape[:axis] + (x.shape[axis] * x.shape[axis + 1],) + x.shape[axis + 2 :])


def take_rows(cache, axes, start, count: int):
  """Rows [start, start + count) of every leaf (`start` may be traced)."""
  return map_leaves(
    lambda x, names: jax.lax.dynamic_slice_in_dim(x, start, count, axis=names.index("batch")), cache, axes
  )


def put_row(cache, row_cache, axes, slot, ok, column=0):
  """`cache` with `row_cache`'s one row (its leaves [.., 1, ..]) written into row `slot` where `ok` (else unchanged):
  a leaf with a length axis from sequence column `column` on (its first columns; the rest of the row is kept,
  masked by the caller), any other leaf whole (a ring rolled by `column`)."""

  def put(whole, new, names):
    batch, length = names.index("batch"), _axis(names, "length")
    if _axis(names, "ring") is not None:
      new = jnp.roll(new, column, axis=_axis(names, "ring"))
    zero = jnp.int32(0)
    start = tuple(slot if a == batch else column if a == length else zero for a in range(whole.ndim))
    new = new.astype(whole.dtype)
    old = jax.lax.dynamic_slice(whole, start, new.shape)
    return jax.lax.dynamic_update_slice(whole, jnp.where(ok, new, old), start)

  return jax.tree.map(put, cache, row_cache, axes)
