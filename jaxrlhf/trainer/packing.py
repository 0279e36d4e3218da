"""Token-budget micro-batches (`use_dynamic_bsz`) and sequence packing (`use_remove_padding`), in-graph.

Both must keep one compiled program per step, so every shape here is static. A micro-batch is a
*slot* of `rows` rows (split evenly over the batch shards, `rows // shards` per device):
- padded: each row is one sequence of the padded length S = prompt + response length;
- packed: each row (length S too) holds several sequences' valid tokens, told apart by segment ids
  (sequence index + 1; 0 = empty) with positions restarting per segment; the decoder's attention is
  block-diagonal causal over segments. Rows of length S keep the dense attention cost per row equal
  to the padded path's (a longer row would pay for its masked-out blocks quadratically).

Sequences go into rows by first-fit decreasing (longest first, each into the first row with room),
the rows ordered slot by slot and, inside a slot, round-robin over the shards: slots fill one after
another and a slot's sequences spread evenly over the devices (the balance that matters when every
slot costs the same). The slot count is static and sized for the worst case (one sequence per row,
the padded path's count); a slot left empty is skipped at run time (`lax.cond`), so the tokens
processed follow the tokens present. Losses stay exactly globally normalised (docs/algorithms.md §4): each slot's
loss is computed on the mini-batch's [rows, R] response layout with the response mask restricted
to the slot's sequences and the mini-batch's normalisers, so slot losses add up to the full loss.

`use_dynamic_bsz` sets the rows per device to `ppo_max_token_len_per_gpu // S` (the token budget
counts the tokens a device processes: S per row, padded or packed); otherwise they are
`ppo_micro_batch_size_per_gpu` (or the whole per-device mini-batch).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class MicroBatching:
  """Static cut of a batch of `num_sequences` into `num_micro` slots of `rows` rows (all shards).

  `head_cost`: the model head's work per position over the backbone's (the LM head's vocabulary
  projection is a large share of a small model's); it decides whether packing pays (`packing_pays`).
  `padded_at_once`: when packing does not pay, a forward-only phase runs its padded rows at once (as
  it does unpacked without a micro-batch size) instead of in micro-batches of `rows`; never under a
  token budget (`use_dynamic_bsz`), which bounds every micro-batch.
  """

  rows: int
  num_micro: int
  shards: int
  packed: bool
  head_cost: float = 0.0
  padded_at_once: bool = False


def micro_batching(
  num_sequences: int, seq_len: int, shards: int, *, rows_per_shard: int | None, max_token_len: int | None, packed: bool
) -> MicroBatching:
  """`max_token_len` (token budget per device, `use_dynamic_bsz`) wins over `rows_per_shard`."""
  per_shard_needed = math.ceil(num_sequences / shards)
  if max_token_len is not None:
    rows_per_shard = max(1, max_token_len // seq_len)
  elif rows_per_shard is None:
    rows_per_shard = per_shard_needed
  rows = min(rows_per_shard, per_shard_needed) * shards
  return MicroBatching(rows=rows, num_micro=math.ceil(num_sequences / rows), shards=shards, packed=packed)


def pad_rows(tree, num_rows: int):
  """Appends all-zero rows (masks 0: they count nowhere) up to `num_rows`."""

  def pad(x):
    extra = num_rows - x.shape[0]
    return x if extra == 0 else jnp.concatenate([x, jnp.zeros((extra,) + x.shape[1:], x.dtype)])

  return jax.tree.map(pad, tree)


def first_fit_decreasing(lengths_N, num_bins: int, capacity: int):
  """(bin_N, offset_N): longest first, each sequence into the first bin with room (none may be > capacity)."""
  order_N = jnp.argsort(-lengths_N, stable=True)

  def place(remaining_B, length):
    bin_index = jnp.argmax(remaining_B >= length)
    offset = capacity - remaining_B[bin_index]
    return remaining_B.at[bin_index].add(-length), (bin_index, offset)

  _, (bins, offsets) = jax.lax.scan(
    place, jnp.full((num_bins,), capacity, jnp.int32), lengths_N[order_N].astype(jnp.int32)
  )
  bin_N = jnp.zeros_like(bins).at[order_N].set(bins)
  offset_N = jnp.zeros_like(offsets).at[order_N].set(offsets)
  return bin_N, offset_N


def pack(input_ids_NxS, valid_NxS, batching: MicroBatching, per_token: dict | None = None) -> dict:
  """Packs the valid tokens of N sequences into `num_micro` slots of `rows` rows of length S.

  Returns per-slot arrays (leading axis num_micro): `input_ids`, `positions`, `segment_ids`
  [rows, S] and `used` (the slot holds a sequence); per sequence: `slot_N`, `row_N` (row inside its
  slot), `column_NxS` (packed column of each of its tokens; meaningful where valid). `per_token` {name: [N, S,
  ...]}: more per-token arrays packed alike, each [num_micro, rows, S, ...] under its name (0 off the tokens).
  Valid tokens of a sequence must be contiguous (left-padded prompt + response prefix) so that the
  packed position of a token's predecessor is its own column - 1, as in the padded row.
  """
  num_sequences, seq_len = input_ids_NxS.shape
  rows, slots, shards = batching.rows, batching.num_micro, batching.shards
  valid_NxS = valid_NxS.astype(jnp.int32)
  lengths_N = valid_NxS.sum(axis=1)
  fill_N, offset_N = first_fit_decreasing(lengths_N, slots * rows, seq_len)
  # Fill order -> (slot, row): round-robin over the shards inside a slot (row = shard * per_shard + r).
  slot_N, within_N = fill_N // rows, fill_N % rows
  row_N = (within_N % shards) * (rows // shards) + within_N // shards
  index_NxS = jnp.cumsum(valid_NxS, axis=1) - 1  # position inside the sequence (= positions_from_mask)
  column_NxS = offset_N[:, None] + index_NxS
  flat_size = slots * rows * seq_len
  destination_NxS = jnp.where(valid_NxS > 0, ((slot_N * rows + row_N) * seq_len)[:, None] + column_NxS, flat_size)
  scatter = lambda values_NxS, dtype=jnp.int32: (
    jnp.zeros((flat_size,) + values_NxS.shape[2:], dtype)
    .at[destination_NxS.reshape(-1)]
    .set(values_NxS.reshape((-1,) + values_NxS.shape[2:]).astype(dtype), mode="drop")
    .reshape((slots, rows, seq_len) + values_NxS.shape[2:])
  )
  sequence_NxS = jnp.broadcast_to(jnp.arange(1, num_sequences + 1, dtype=jnp.int32)[:, None], valid_NxS.shape)
  used_M = jnp.zeros((slots,), bool).at[slot_N].max(lengths_N > 0)
  return {
    "input_ids": scatter(input_ids_NxS),
    "positions": scatter(jnp.maximum(index_NxS, 0)),
    "segment_ids": scatter(sequence_NxS),
    "used": used_M,
    "slot_N": slot_N,
    "row_N": row_N,
    "column_NxS": column_NxS,
    **{name: scatter(values, values.dtype) for name, values in (per_token or {}).items()},
  }


def packing_pays(plan: dict, batching: MicroBatching, prompt_len: int, response_len: int):
  """Whether the packed slots cost less than the padded micro-batches (a traced bool).

  Both run `rows` rows of S = P + R positions through the backbone per slot / micro-batch; packing
  runs only the used slots, but its heads see every position of a packed row (which positions predict
  response tokens is known only at run time), where the padded rows' heads see the R response ones. On
  uniform full-length sequences packing saves no slot and would cost the extra head work, the packing
  and the gathers: the padded path runs instead.
  """
  seq_len = prompt_len + response_len
  packed = plan["used"].sum().astype(jnp.float32) * seq_len * (1.0 + batching.head_cost)
  padded = batching.num_micro * (seq_len + response_len * batching.head_cost)
  return packed < padded


PER_SEQUENCE = ("used", "slot_N", "row_N", "column_NxS")  # a plan's entries that are not per slot


def slot(plan: dict, k) -> dict:
  """The packed rows of slot `k` (and of its `per_token` arrays) and the gather indices of every sequence (valid for
  slot k's own)."""
  rows = {name: x[k] for name, x in plan.items() if name not in PER_SEQUENCE}
  return dict(rows, row_N=plan["row_N"], column_NxS=plan["column_NxS"])


def response_outputs(per_token_BxS, packed: dict, prompt_len: int, response_len: int):
  """[N, R] from per-token outputs of packed rows, read (as in the padded path) at the token before
  each response token; rows of sequences outside the slot hold garbage, to be masked by the caller."""
  column_NxR = packed["column_NxS"][:, prompt_len - 1 : prompt_len + response_len - 1]
  column_NxR = jnp.clip(column_NxR, 0, per_token_BxS.shape[1] - 1)
  return per_token_BxS[packed["row_N"][:, None], column_NxR]


def next_tokens(input_ids_BxS):
  """The token each packed position predicts (the next one in the row); 0 past the end."""
  return jnp.concatenate([input_ids_BxS[:, 1:], jnp.zeros_like(input_ids_BxS[:, :1])], axis=1)


def packed_token_ratio(valid_NxS, batching: MicroBatching):
  """(tokens in the packed rows of executed slots) / (tokens of the padded rows): the compute kept."""
  seq_len = valid_NxS.shape[1]
  plan = pack(jnp.zeros(valid_NxS.shape, jnp.int32), valid_NxS, batching)
  used_slots = plan["used"].sum()
  return used_slots * batching.rows * seq_len / (batching.num_micro * batching.rows * seq_len)
