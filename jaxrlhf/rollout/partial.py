"""Partial rollouts carried across trainer steps (verl's `trainer.v1.trainer_mode=colocate_async`): a pool of
prompt groups decodes in `max_num_seqs` slots until enough groups have finished for the step's batch; those are
trained, the rest stay in the pool (their tokens, behaviour log-probs, slot cache and policy versions) and the next
step continues them under its new weights (docs/architecture.md, "Partial rollouts").

The unit that finishes is the group (a prompt's n samples), as in verl's replay buffer: GRPO's advantage needs all n
rewards of a prompt, so a group is trainable once each of its rows has ended. The pool holds
`(1 + num_warmup_batches) x train_batch_size` groups (G), n rows each (M = G x n rows):
- `admit`: a batch of prompts takes the pool's free groups (verl's warm-up batches are admissions before the
  first step; each step admits its own batch);
- `decode_pool`: the one decode loop (`rollout/decode.py`) over the slots; after each step the taken tokens are
  recorded under each slot's pool row, an ended row's slot is freed, and free slots take the oldest waiting rows
  (their prompts prefilled then, with the weights of that step). The loop ends when `need` groups are trainable
  (`stop="enough"`: partial rollout) or when every admitted row has ended (`stop="all"`: one-step-off, the batch
  trained is the one the previous step generated);
- `take_trainable`: the oldest trainable groups (verl orders by the step that admitted them) leave the pool as the
  step's rollout.

A row keeps its slot, with its cache, from its first token to its last, across steps: tokens sampled under older
weights keep their behaviour log-probs (`rollout_log_probs`), which is what rollout correction compares with the
training forward (`algorithm.rollout_correction.*`). `first_version` is the trainer step whose weights sampled a
row's first token: staleness = step - first_version.

`max_off_policy_threshold` (verl's semantics, a span in model versions: step - admitted + 1): with `drop`, a finished
group past it is not trained and its prompt is admitted again (fresh, as the newest; verl refills with a fresh
prompt from the data stream, which a static-shaped step cannot draw); with `wait`, the loop does not end while an
unfinished group has reached it, so it finishes and is trained instead.

Shapes: G groups, n rows per group, M = G x n pool rows, S slots, P prompt, R response columns.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from jaxrlhf.models.decoding import DecodeModel
from jaxrlhf.rollout.batch import cache_length
from jaxrlhf.rollout.decode import DecodeState, Responses, decode, prefill_cache
from jaxrlhf.rollout.sampler import SamplingParams

WAITING, DECODING, DONE = 0, 1, 2  # a pool row's status
# Rows free slots take per loop step, prefilled in one call (the slots' `INSERTS_PER_STEP`).
INSERTS_PER_STEP = 4
_LAST = jnp.iinfo(jnp.int32).max


@flax.struct.dataclass
class RolloutPool:
  """Prompt groups in flight between trainer steps (part of the train state: checkpointed with it)."""

  prompts: jax.Array  # [M, P] int32, left-padded, each group's prompt in its n rows
  prompt_mask: jax.Array  # [M, P] int32
  sample_index: jax.Array  # [M] int32: the prompt's row in the dataset
  responses: Responses  # [M, R] tokens, loss mask, behaviour log-probs so far
  status: jax.Array  # [M] int32: WAITING, DECODING (in a slot) or DONE
  first_version: jax.Array  # [M] int32: the step whose weights sampled the row's first token (-1: none yet)
  valid: jax.Array  # [G] bool: the group holds an admitted prompt
  admitted: jax.Array  # [G] int32: the step that admitted it (verl's prompt global step)
  ticket: jax.Array  # [G] int32: admission order (older first)
  next_ticket: jax.Array  # [] int32
  slots: DecodeState  # the S slots' decode state (cache included)
  slot_row: jax.Array  # [S] int32: the pool row each slot decodes (M: free)

  @property
  def group_size(self) -> int:
    return self.prompts.shape[0] // self.valid.shape[0]

  def group_done(self):
    """[G] bool: admitted groups whose rows have all ended."""
    done_GxN = (self.status == DONE).reshape(self.valid.shape[0], self.group_size)
    return self.valid & done_GxN.all(axis=1)

  def rows_of(self, groups_B):
    """[B x n] the pool rows of groups `groups_B`, group by group."""
    n = self.group_size
    return (groups_B[:, None] * n + jnp.arange(n, dtype=jnp.int32)[None, :]).reshape(-1)

  def row_valid(self):
    return jnp.repeat(self.valid, self.group_size)


def empty_pool(
  model: DecodeModel, *, groups: int, n: int, prompt_len: int, response_len: int, slots: int, pad_token_id: int
) -> RolloutPool:
  """A pool with no admitted group and free slots."""
  rows, total_len = groups * n, cache_length(prompt_len, response_len, response_len)
  key_data = jax.random.key_data(jax.random.split(jax.random.key(0), slots))
  state = DecodeState(
    cache=model.init_cache(slots, total_len),
    kv_mask=jnp.zeros((slots, total_len), jnp.int32),
    column=jnp.full((slots,), prompt_len - 1, jnp.int32),
    token=jnp.zeros((slots,), jnp.int32),
    position=jnp.zeros((slots,), jnp.int32),
    length=jnp.zeros((slots,), jnp.int32),
    live=jnp.zeros((slots,), bool),
    keys=key_data,
    steps=jnp.int32(0),
  )
  return RolloutPool(
    prompts=jnp.zeros((rows, prompt_len), jnp.int32),
    prompt_mask=jnp.zeros((rows, prompt_len), jnp.int32),
    sample_index=jnp.zeros((rows,), jnp.int32),
    responses=Responses.empty(rows, response_len, pad_token_id),
    status=jnp.full((rows,), DONE, jnp.int32),
    first_version=jnp.full((rows,), -1, jnp.int32),
    valid=jnp.zeros((groups,), bool),
    admitted=jnp.zeros((groups,), jnp.int32),
    ticket=jnp.zeros((groups,), jnp.int32),
    next_ticket=jnp.int32(0),
    slots=state,
    slot_row=jnp.full((slots,), rows, jnp.int32),
  )


def _restart(pool: RolloutPool, groups_B, ok_B, step, pad_token_id: int) -> RolloutPool:
  """Groups `groups_B` (where `ok_B`) reset to waiting with no tokens, admitted at `step` as the newest."""
  n, rows = pool.group_size, pool.prompts.shape[0]
  groups = pool.valid.shape[0]
  at_G = jnp.where(ok_B, groups_B, groups)
  at_M = jnp.where(jnp.repeat(ok_B, n), pool.rows_of(groups_B), rows)
  tickets_B = pool.next_ticket + jnp.cumsum(ok_B.astype(jnp.int32)) - 1
  responses = pool.responses
  responses = Responses(
    tokens=responses.tokens.at[at_M].set(pad_token_id, mode="drop"),
    loss_mask=responses.loss_mask.at[at_M].set(0, mode="drop"),
    log_probs=responses.log_probs.at[at_M].set(0.0, mode="drop"),
  )
  return pool.replace(
    responses=responses,
    status=pool.status.at[at_M].set(WAITING, mode="drop"),
    first_version=pool.first_version.at[at_M].set(-1, mode="drop"),
    valid=pool.valid.at[at_G].set(True, mode="drop"),
    admitted=pool.admitted.at[at_G].set(step, mode="drop"),
    ticket=pool.ticket.at[at_G].set(tickets_B, mode="drop"),
    next_ticket=pool.next_ticket + ok_B.sum(dtype=jnp.int32),
  )


def admit(pool: RolloutPool, prompt_ids_BxP, prompt_mask_BxP, sample_index_B, step, pad_token_id: int):
  """The pool with B prompts in its first B free groups (each prompt in its group's n rows), admitted at `step`.
  The caller keeps B free groups: the pool has `(1 + warm-up batches) x B` groups and each step frees B."""
  batch = prompt_ids_BxP.shape[0]
  n = pool.group_size
  groups_B = jnp.nonzero(~pool.valid, size=batch, fill_value=pool.valid.shape[0])[0].astype(jnp.int32)
  rows = pool.rows_of(groups_B)
  repeat = lambda x: jnp.repeat(x, n, axis=0)
  pool = pool.replace(
    prompts=pool.prompts.at[rows].set(repeat(prompt_ids_BxP).astype(jnp.int32), mode="drop"),
    prompt_mask=pool.prompt_mask.at[rows].set(repeat(prompt_mask_BxP).astype(jnp.int32), mode="drop"),
    sample_index=pool.sample_index.at[rows].set(repeat(sample_index_B).astype(jnp.int32), mode="drop"),
  )
  return _restart(pool, groups_B, jnp.ones((batch,), bool), step, pad_token_id)


def drop_stale(pool: RolloutPool, step, threshold: int, pad_token_id: int):
  """`max_off_policy_strategy=drop`: finished groups whose span (step - admitted + 1) exceeds `threshold` start
  again from their prompt, as the newest admission. Returns (pool, groups dropped)."""
  stale_G = pool.group_done() & (step - pool.admitted + 1 > threshold)
  groups = jnp.arange(pool.valid.shape[0], dtype=jnp.int32)
  return _restart(pool, groups, stale_G, step, pad_token_id), stale_G.sum(dtype=jnp.int32)


def trainable(pool: RolloutPool, step, threshold: int | None, strategy: str):
  """[G] bool: finished groups the step may train (with `drop`, not past the staleness threshold)."""
  done_G = pool.group_done()
  if threshold is not None and strategy == "drop":
    done_G &= step - pool.admitted + 1 <= threshold
  return done_G


def decode_pool(
  model: DecodeModel,
  params,
  pool: RolloutPool,
  rng,
  sampling: SamplingParams,
  *,
  step,
  need: int,
  stop: str = "enough",
  threshold: int | None = None,
  strategy: str = "drop",
  inserts_per_step: int = INSERTS_PER_STEP,
):
  """Decodes the pool's rows in its slots until `need` groups are trainable (`stop="enough"`) or every admitted row
  has ended (`stop="all"`). Returns (pool, loop steps run, slot-steps with a live row).

  Row r's token t is drawn with `token_keys(fold_in(rng_r, ...), t)` where rng_r = fold_in(rng, r's ticket x n +
  its index in the group), fixed when the row enters a slot and kept with the slot: a carried row draws its later
  tokens from its own key."""
  slots = pool.slot_row.shape[0]
  rows, prompt_len = pool.prompts.shape
  n = pool.group_size
  axes = model.cache_axes
  total_len = pool.slots.kv_mask.shape[1]
  inserts = min(inserts_per_step, slots)

  def insert(state: DecodeState, pool: RolloutPool, inserts: int = inserts):
    """Free slots take the oldest waiting rows (at most `inserts`), prefilled with this step's weights."""
    free = jnp.nonzero(pool.slot_row == rows, size=inserts, fill_value=slots)[0]
    group_of = jnp.arange(rows, dtype=jnp.int32) // n
    waiting = pool.row_valid() & (pool.status == WAITING)
    order = jnp.where(waiting, pool.ticket[group_of] * n + jnp.arange(rows, dtype=jnp.int32) % n, _LAST)
    neg_order, picked = jax.lax.top_k(-order, inserts)
    ok = (free < slots) & (-neg_order < _LAST)
    picked = picked.astype(jnp.int32)

    def fill(args):
      state, pool = args
      ids, mask = pool.prompts[picked], pool.prompt_mask[picked]
      cache, kv_mask = prefill_cache(model, params, ids, mask, total_len)
      row_ids = pool.ticket[picked // n] * n + picked % n
      keys = jax.vmap(lambda r: jax.random.key_data(jax.random.fold_in(rng, r)))(row_ids)
      at = jnp.where(ok, free, slots)
      put = lambda whole, new: whole.at[at].set(new.astype(whole.dtype), mode="drop")
      state = state.replace(
        cache=_put_rows(state.cache, cache, axes, at),
        kv_mask=put(state.kv_mask, kv_mask),
        column=put(state.column, jnp.full((inserts,), prompt_len - 1, jnp.int32)),
        token=put(state.token, ids[:, -1]),
        position=put(state.position, jnp.maximum(mask.sum(axis=1) - 1, 0)),
        length=put(state.length, jnp.zeros((inserts,), jnp.int32)),
        live=put(state.live, jnp.ones((inserts,), bool)),
        keys=put(state.keys, keys),
      )
      at_rows = jnp.where(ok, picked, rows)
      pool = pool.replace(
        status=pool.status.at[at_rows].set(DECODING, mode="drop"),
        first_version=pool.first_version.at[at_rows].set(step, mode="drop"),
        slot_row=put(pool.slot_row, picked),
      )
      return state, pool

    return jax.lax.cond(jnp.any(ok), fill, lambda args: args, (state, pool))

  def after_step(state: DecodeState, carried, taken):
    pool, busy = carried
    responses = pool.responses.record(taken, rows=pool.slot_row)
    ended = taken.written & ~state.live
    pool = pool.replace(
      responses=responses,
      status=pool.status.at[jnp.where(ended, pool.slot_row, rows)].set(DONE, mode="drop"),
      slot_row=jnp.where(ended, rows, pool.slot_row),
    )
    state, pool = insert(state, pool)
    return state, (pool, busy + taken.written.sum(dtype=jnp.int32))

  def going(state: DecodeState, carried):
    pool = carried[0]
    unfinished = pool.row_valid() & (pool.status != DONE)
    if stop == "all":
      return jnp.any(unfinished)
    more = trainable(pool, step, threshold, strategy).sum() < need
    if threshold is not None and strategy == "wait":
      # verl's dropless control: a group at the threshold finishes before the step trains.
      at_limit_G = pool.valid & ~pool.group_done() & (step - pool.admitted + 1 >= threshold)
      more |= jnp.any(at_limit_G)
    return more & jnp.any(unfinished)

  state = pool.slots.replace(steps=jnp.int32(0))
  state, pool = insert(state, pool, slots)  # every free slot at once: one prefill
  state, (pool, busy) = decode(
    model,
    params,
    state,
    (pool, jnp.int32(0)),
    sampling,
    budget=sampling.max_new_tokens,
    after_step=after_step,
    until=going,
  )
  return pool.replace(slots=state), state.steps, busy


def _put_rows(cache, new_cache, axes, at_K):
  """`cache` with `new_cache`'s K rows written into rows `at_K` (an index past the end: not written)."""

  def put(whole, new, names):
    batch = names.index("batch")
    moved = jnp.moveaxis(whole, batch, 0).at[at_K].set(jnp.moveaxis(new, batch, 0).astype(whole.dtype), mode="drop")
    return jnp.moveaxis(moved, 0, batch)

  return jax.tree.map(put, cache, new_cache, axes)


def take_trainable(pool: RolloutPool, step, need: int, threshold: int | None = None, strategy: str = "drop"):
  """The `need` oldest trainable groups leave the pool. Returns (pool, rows) with rows a dict of [need x n]
  arrays (group by group): prompts, prompt_mask, responses, response_mask, rollout_log_probs, sample_index,
  staleness (steps between the weights of a row's first token and `step`)."""
  order_G = jnp.where(trainable(pool, step, threshold, strategy), pool.ticket, _LAST)
  groups_B = jnp.argsort(order_G)[:need].astype(jnp.int32)
  rows = pool.rows_of(groups_B)
  taken = {
    "prompts": pool.prompts[rows],
    "prompt_mask": pool.prompt_mask[rows],
    "responses": pool.responses.tokens[rows],
    "response_mask": pool.responses.loss_mask[rows],
    "rollout_log_probs": pool.responses.log_probs[rows],
    "sample_index": pool.sample_index[rows],
    "staleness": step - pool.first_version[rows],
  }
  return pool.replace(valid=pool.valid.at[groups_B].set(False)), taken
