"""The sliding layers' KV cache as a ring of `sliding_window` columns (Gemma 3's `sliding_attention` layers).

A query at sequence column q of a sliding layer sees keys at columns (q - W, q] only (W = `sliding_window`), so the
layer keeps W columns, not the whole length: column c lives at ring slot c % W (logical axis "ring",
`RING_LOGICAL_AXES`), and writing column c overwrites column c - W, which no query at c or later sees. The ring is
W columns whatever the cache's length, so a prompt's cache moves into a longer one whole (`rollout/cache_rows.py`
rolls it where the sequence's columns shift).

Which column a slot holds is not stored: at query column q, slot j holds the latest column <= q that is j modulo W,
q - ((q - j) mod W), and `kv_mask_BxS` (over the sequence's columns, as for the full layers) says whether that column
was written. A column the mask does not mark may hold anything (a paused or finished row's write): it is masked.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrlhf.models.attention import decode_attention

RING_LOGICAL_AXES = ("layers", "batch", "kv_heads", "ring", "head_dim")


def slot_columns(query_column, width: int):
  """The sequence column each ring slot holds at query column `query_column` (a scalar or [B]): [..., W]."""
  query_column = jnp.asarray(query_column, jnp.int32)[..., None]
  return query_column - (query_column - jnp.arange(width, dtype=jnp.int32)) % width


def _mask_at(kv_mask_BxS, columns):
  """`kv_mask_BxS` at `columns` ([W] shared or [B, W] per row), 0 where a column is outside [0, S)."""
  length = kv_mask_BxS.shape[1]
  inside = (columns >= 0) & (columns < length)
  clipped = jnp.clip(columns, 0, length - 1)
  if columns.ndim == 1:
    return jnp.where(inside[None], jnp.take(kv_mask_BxS, clipped, axis=1), 0)
  return jnp.where(inside, jnp.take_along_axis(kv_mask_BxS, clipped, axis=1), 0)


def decode(
  q_BxKxGxH,
  k_BxKx1xH,
  v_BxKx1xH,
  ring_k_BxKxWxH,
  ring_v_BxKxWxH,
  kv_mask_BxS,
  cache_index,
  write_columns,
  sinks_KxG=None,
):
  """One query per row at column `cache_index` (a scalar or [B]) over the ring with this step's key and value
  written at its slot. Returns the attention output [B, K, G, H]. `write_columns`: the decoder's column writer;
  `sinks_KxG`: learned attention sinks (gpt-oss; `attention.py`)."""
  width = ring_k_BxKxWxH.shape[2]
  slot = jnp.asarray(cache_index, jnp.int32) % width
  ring_k_BxKxWxH = write_columns(ring_k_BxKxWxH, k_BxKx1xH, slot, batch_axis=0, length_axis=2)
  ring_v_BxKxWxH = write_columns(ring_v_BxKxWxH, v_BxKx1xH, slot, batch_axis=0, length_axis=2)
  valid_BxW = _mask_at(kv_mask_BxS, slot_columns(cache_index, width))
  # Every slot is at or before the query and inside the window by construction: the query's index W passes the
  # causal test of each, and the mask alone decides.
  return decode_attention(q_BxKxGxH, ring_k_BxKxWxH, ring_v_BxKxWxH, jnp.int32(width), valid_BxW, sinks_KxG=sinks_KxG)


def prefill(attend, q_BxLxKxGxH, k_BxLxKxH, v_BxLxKxH, ring_k_BxKxWxH, ring_v_BxKxWxH, kv_mask_BxS, offset):
  """L queries at columns offset .. offset + L - 1 (`offset` a scalar) over the ring's columns before them and this
  call's keys: the W + L columns [offset - W, offset + L) laid out in order, attended by `attend(q, keys, values,
  kv_mask, offset)` (the configured kernel, with the window) with the queries at index W. Returns (out [B, L, K, G,
  H], new ring {"sliding_k", "sliding_v"} [B, K, W, H]: the last W of those columns at their slots)."""
  width, length = ring_k_BxKxWxH.shape[2], k_BxLxKxH.shape[1]
  columns_W = offset - width + jnp.arange(width, dtype=jnp.int32)
  dtype = ring_k_BxKxWxH.dtype
  keys, values = (
    jnp.concatenate([jnp.take(ring, columns_W % width, axis=2).transpose(0, 2, 1, 3), new.astype(dtype)], axis=1)
    for ring, new in ((ring_k_BxKxWxH, k_BxLxKxH), (ring_v_BxKxWxH, v_BxLxKxH))
  )
  mask_Bx_W_L = jnp.concatenate(
    [_mask_at(kv_mask_BxS, columns_W), jax.lax.dynamic_slice_in_dim(kv_mask_BxS, offset, length, axis=1)], axis=1
  )
  out_BxLxKxGxH = attend(q_BxLxKxGxH, keys, values, mask_Bx_W_L, width)
  # Columns offset + L - W + i (i < W) go to slot (offset + L + i) mod W.
  shift = (offset + length) % width
  new_ring = {
    name: jnp.roll(x[:, length:].transpose(0, 2, 1, 3), shift, axis=2)
    for name, x in (("sliding_k", keys), ("sliding_v", values))
  }
  return out_BxLxKxGxH, new_ring
