"""Micro-batch plans and the loops that run over them (docs/algorithms.md §5): forward-only phases and PPO updates.

An update is `epochs` x mini-batches (one optimizer step each) x micro-batches (gradients summed),
as nested `lax.scan`s. A micro-batch is padded rows or, with `use_remove_padding`, a packed slot
(`packing`); `use_dynamic_bsz` sizes it by a token budget. The loss normalisers come from the whole
mini-batch, so micro-batch losses and gradients add up exactly to the unsplit mini-batch's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from jaxrlhf import algos
from jaxrlhf.trainer import packing
from jaxrlhf.trainer.batch_metrics import rollout_probs_diff
from jaxrlhf.trainer.model_outputs import REPLAYED, sequence_inputs
from jaxrlhf.trainer.records import Advantages, OldLogProbs, Rollout
from jaxrlhf.trainer.state import apply_gradients


class MicroBatcher:
  """Cuts a config section's mini-batches (`ppo_mini_batch_size` prompts x `rollout.n`) into micro-batches.

  `section_path` ("actor_rollout_ref.actor" or "critic") names the section in errors and picks its
  batch shards: `num_batch_shards` / the section's `sequence_parallel` size (a sequence-parallel group
  of devices shares its rows). `head_costs`: {section_path: the model head's work per position over the
  backbone's} (`packing.packing_pays`).
  """

  def __init__(
    self,
    config,
    num_batch_shards: int,
    sequence_parallel: dict[str, int] | None = None,
    head_costs: dict[str, float] | None = None,
  ):
    self.head_costs = head_costs or {}
    self.n = config.actor_rollout_ref.rollout.n
    actor = config.actor_rollout_ref.actor
    # The token budget (use_dynamic_bsz) is the actor's key; the critic follows it, as in verl's recipes.
    self.max_token_len = actor.ppo_max_token_len_per_gpu if actor.use_dynamic_bsz else None
    self.num_batch_shards = num_batch_shards
    self.sequence_parallel = sequence_parallel or {}
    # Sequences per device of one forward-only micro-batch, per phase (verl's keys; the reference and
    # the values fall back to the rollout's log-prob key, as verl's examples set them alike).
    log_prob = config.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu
    ref = config.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu
    values = config.critic.forward_micro_batch_size_per_gpu
    self.forward_micro_per_device = {
      "old_log_prob": log_prob,
      "ref": log_prob if ref is None else ref,
      "values": log_prob if values is None else values,
    }

  def shards(self, section_path: str) -> int:
    """Batch shards of a section's micro-batches: devices over the rows."""
    return self.num_batch_shards // self.sequence_parallel.get(section_path, 1)

  def micro_rows(self, section, section_path: str) -> int:
    """Rows of one micro-batch (all batch shards) from `ppo_micro_batch_size_per_gpu`; must divide the mini-batch."""
    mini_batch_rows = section.ppo_mini_batch_size * self.n
    per_device = section.ppo_micro_batch_size_per_gpu
    if per_device is None:
      return mini_batch_rows
    rows = per_device * self.shards(section_path)
    if mini_batch_rows % rows:
      raise ValueError(
        f"{section_path}.ppo_micro_batch_size_per_gpu={per_device} x {self.shards(section_path)} "
        f"batch shards = {rows} rows does not divide the mini-batch of {mini_batch_rows} sequences"
      )
    return rows

  def update_plan(self, section, section_path: str, seq_len: int, packed: bool) -> packing.MicroBatching:
    """The micro-batches of one mini-batch."""
    mini_batch_rows = section.ppo_mini_batch_size * self.n
    shards = self.shards(section_path)
    if self.max_token_len is not None:
      # A group of sp devices holds one row's tokens: the per-device budget counts S / sp per row.
      max_token_len = self.max_token_len * self.sequence_parallel.get(section_path, 1)
      plan = packing.micro_batching(
        mini_batch_rows, seq_len, shards, rows_per_shard=None, max_token_len=max_token_len, packed=packed
      )
    else:
      rows = self.micro_rows(section, section_path)
      plan = packing.MicroBatching(rows=rows, num_micro=mini_batch_rows // rows, shards=shards, packed=packed)
    return dataclasses.replace(plan, head_cost=self.head_costs.get(section_path, 0.0))

  def phase_plan(
    self,
    section,
    section_path: str,
    num_sequences: int,
    seq_len: int,
    packed: bool,
    micro_per_device: int | None = None,
  ) -> packing.MicroBatching | None:
    """Micro-batches of a forward-only phase over the whole batch (old/ref log-probs, values).

    `micro_per_device` (verl's `log_prob_micro_batch_size_per_gpu` / `forward_micro_batch_size_per_gpu`)
    sets the rows of one; without it padded rows run at once (None) and packed slots take the update's size.
    """
    if micro_per_device is not None:
      shards = self.shards(section_path)
      rows = micro_per_device * shards
      return packing.MicroBatching(
        rows=rows,
        num_micro=-(-num_sequences // rows),
        shards=shards,
        packed=packed,
        head_cost=self.head_costs.get(section_path, 0.0),
      )
    if not packed:
      return None
    mini = self.update_plan(section, section_path, seq_len, packed=True)
    # Packing that does not pay falls back to padded rows all at once, as the unpacked phase runs, unless
    # a token budget (use_dynamic_bsz) bounds the micro-batches.
    return dataclasses.replace(
      mini, num_micro=-(-num_sequences // mini.rows), padded_at_once=self.max_token_len is None
    )


def pack_sequences(data: dict, batching: packing.MicroBatching) -> dict:
  """The packing plan of `data`'s sequences (valid prompt tokens + response prefix)."""
  ids_NxS, _, _ = sequence_inputs(data["prompts"], data["prompt_mask"], data["responses"])
  # Every token of the sequence (with tool responses, in a multi-turn rollout), not only the loss's.
  response_valid_NxR = data.get("response_attention_mask", data["response_mask"])
  valid_NxS = jnp.concatenate([data["prompt_mask"], response_valid_NxR], axis=1)
  # The routes a forward replays (rollout routing replay) are per token too: packed alike.
  per_token = {name: data[name] for name in (REPLAYED,) if name in data}
  return packing.pack(ids_NxS, valid_NxS, batching, per_token)


# Loss metrics that are means over one micro-batch (bypass mode's rollout correction, as verl reduces them):
# averaged over the micro-batches that ran. Every other metric is normalised by the mini-batch's counts and
# summed.
MICRO_MEAN_PREFIXES = ("rollout_corr/",)
# Loss metrics that are extremes over the valid tokens (distillation's per-token loss range, as verl's MIN/MAX
# metrics): the extreme over the micro-batches and then over the step's mini-batches. A micro-batch without
# valid tokens reports the neutral value (+inf for a minimum).
EXTREMA = {"distillation/loss_min": (jnp.min, jnp.inf), "distillation/loss_max": (jnp.max, -jnp.inf)}


def reduce_metric(key: str, values, count):
  """One metric over stacked micro-batches (or optimizer steps): summed, averaged or an extreme (above)."""
  if key in EXTREMA:
    return EXTREMA[key][0](values)
  return values.sum() / count if key.startswith(MICRO_MEAN_PREFIXES) else values.sum()


def forward_phase(
  outputs_fn: Callable, sequences: dict, batching: packing.MicroBatching | None, to_train: Callable = lambda tree: tree
):
  """`outputs_fn(micro) -> [N, R]` (or a tree of them) over `sequences` (`Rollout.sequences()`): at once on padded rows
  (`batching` None), by micro-batches of padded rows, or slot by slot on packed rows (an empty slot is
  skipped; 0 off the response mask) when packing pays (`packing.packing_pays`; else padded micro-batches
  of the same rows). `to_train` pins each micro-batch's rows to the batch layout, so every device runs
  its share of a micro-batch, not all of it."""
  if batching is None:
    return outputs_fn(sequences)
  num_rows = sequences["responses"].shape[0]

  def padded():
    if batching.padded_at_once:
      return outputs_fn(sequences)
    rows = packing.pad_rows(sequences, batching.num_micro * batching.rows)
    micro_batches = jax.tree.map(lambda x: x.reshape((batching.num_micro, batching.rows) + x.shape[1:]), rows)
    return jax.tree.map(
      lambda out_MxBxR: out_MxBxR.reshape((-1,) + out_MxBxR.shape[2:])[:num_rows],
      jax.lax.map(lambda micro: outputs_fn(to_train(micro)), micro_batches),
    )

  if not batching.packed:
    return padded()
  plan = pack_sequences(sequences, batching)
  mask_NxR = sequences["response_mask"]
  slot_micro = lambda k: to_train(dict(sequences, packed=packing.slot(plan, k)))
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), jax.eval_shape(outputs_fn, slot_micro(0)))

  def packed():
    def run_slot(out, k):
      slot_values = jax.lax.cond(plan["used"][k], lambda: outputs_fn(slot_micro(k)), lambda: zeros)
      in_slot_Nx1 = (plan["slot_N"] == k)[:, None]
      return jax.tree.map(lambda new_NxR, out_NxR: jnp.where(in_slot_Nx1, new_NxR, out_NxR), slot_values, out), None

    out, _ = jax.lax.scan(run_slot, zeros, jnp.arange(batching.num_micro))
    return out

  out = jax.lax.cond(
    packing.packing_pays(plan, batching, sequences["prompts"].shape[1], mask_NxR.shape[1]),
    packed,
    lambda: jax.tree.map(lambda x: x.astype(jnp.float32), padded()),
  )
  return jax.tree.map(lambda out_NxR: out_NxR * mask_NxR.astype(jnp.float32), out)


def minibatch_gradients(
  loss_fn: Callable,
  params,
  aux,
  minibatch: dict,
  rng,
  batching: packing.MicroBatching,
  loss_agg_mode: str,
  to_train: Callable = lambda tree: tree,
  loss_scale_factor: float | None = None,
  pin_grads: Callable = lambda tree: tree,
):
  """Summed gradients and metrics of one mini-batch over its micro-batches (padded rows or packed slots), and the
  loss's per-row outputs: (grads, metrics, rows).

  `loss_fn(params, aux, micro, normalizers, rng) -> (loss, (metrics, rows))`: `metrics` scalars (summed over the
  micro-batches: the losses are normalised by the mini-batch's counts), `rows` a dict of [rows, R] arrays (joined
  over the micro-batches, padding rows dropped; empty for most losses). `to_train` pins a micro-batch to
  the training layout; `loss_scale_factor` is `seq-mean-token-sum-norm`'s divisor (None: the padded length).
  `pin_grads` pins a gradient tree to the parameters' layout: each micro-batch's gradients and their sum
  (a loop carry, whose layout XLA does not infer: left alone it held the 7B's stacked MLP gradients
  whole, [28, 3584, 18944] fp32 on every GPU).
  With packing (`batching.packed`) the slots run only when packing pays (`packing.packing_pays`), else
  padded micro-batches of the same rows; metrics["perf/packed"] says which (1 = packed).
  """
  normalizers = algos.loss_normalizers(minibatch["response_mask"], loss_agg_mode, loss_scale_factor)
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  micro_rngs = jax.random.split(rng, batching.num_micro)
  zeros = pin_grads(jax.tree.map(jnp.zeros_like, params))
  add = lambda grads_acc, grads: pin_grads(jax.tree.map(jnp.add, grads_acc, grads))

  def gradients(micro, micro_rng):
    (_, outputs), grads = grad_fn(params, aux, to_train(micro), normalizers, micro_rng)
    return pin_grads(grads), outputs

  def finish(grads, micro_outputs, micro_batches_run):
    # Losses and token-mean metrics are normalised by the mini-batch's counts: they add up exactly.
    micro_metrics, micro_rows = micro_outputs
    join = lambda v: v.reshape((-1,) + v.shape[2:])[: minibatch["responses"].shape[0]]
    reduced = {k: reduce_metric(k, v, micro_batches_run) for k, v in micro_metrics.items()}
    return grads, reduced, {k: join(v) for k, v in micro_rows.items()}

  def padded():
    rows = packing.pad_rows(minibatch, batching.num_micro * batching.rows)
    micro_batches = jax.tree.map(lambda x: x.reshape((batching.num_micro, batching.rows) + x.shape[1:]), rows)

    def padded_step(grads_acc, inputs):
      grads, outputs = gradients(*inputs)
      return add(grads_acc, grads), outputs

    return finish(*jax.lax.scan(padded_step, zeros, (micro_batches, micro_rngs)), float(batching.num_micro))

  if not batching.packed:
    return padded()
  plan = pack_sequences(minibatch, batching)

  def packed():
    def packed_step(grads_acc, inputs):
      k, micro_rng = inputs
      in_slot_N = plan["slot_N"] == k
      micro = dict(
        minibatch,
        response_mask=minibatch["response_mask"] * in_slot_N[:, None].astype(minibatch["response_mask"].dtype),
        packed=packing.slot(plan, k),
      )
      run = lambda: gradients(micro, micro_rng)
      skip_shapes = jax.eval_shape(run)

      def skip():
        grads, (metrics, rows) = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), skip_shapes)
        metrics = {k: jnp.full_like(v, EXTREMA[k][1]) if k in EXTREMA else v for k, v in metrics.items()}
        return grads, (metrics, rows)

      grads, outputs = jax.lax.cond(plan["used"][k], run, skip)  # an empty slot costs nothing
      return add(grads_acc, grads), outputs

    grads, micro_outputs = jax.lax.scan(packed_step, zeros, (jnp.arange(batching.num_micro), micro_rngs))
    return finish(grads, micro_outputs, jnp.maximum(jnp.sum(plan["used"]), 1).astype(jnp.float32))

  pays = packing.packing_pays(plan, batching, minibatch["prompts"].shape[1], minibatch["responses"].shape[1])
  grads, metrics, rows = jax.lax.cond(pays, packed, padded)
  return grads, dict(metrics, **{"perf/packed": pays.astype(jnp.float32)}), rows


def update_data(
  rollout: Rollout, old: OldLogProbs, ref_log_probs, adv: Advantages, teacher: dict | None = None
) -> dict:
  """What the updates read, per row: the sequences (the response mask after any rollout rejection), old
  log-probs (unless None), advantages, and the reference's log-probs and rollout correction weights when present;
  `teacher`: the distillation teacher's outputs (`Distillation.teacher_data`)."""
  data = dict(rollout.sequences(), response_mask=adv.response_mask, advantages=adv.advantages)
  optional = {
    "old_log_probs": old.log_probs,  # None: the actor update's first epoch gives them (`PhasePlan.old_in_update`)
    # ... and then compares them with the sampler's (`batch_metrics.rollout_probs_diff`)
    "rollout_log_probs": rollout.rollout_log_probs if old.log_probs is None else None,
    "rollout_is_weights": adv.rollout_is_weights,
    "ref_log_probs": ref_log_probs,
  }
  return dict(data, **{key: value for key, value in optional.items() if value is not None}, **(teacher or {}))


def ppo_update(
  loss_fn: Callable,
  params,
  opt_state,
  aux,
  data: dict,
  rng,
  *,
  tx,
  lr,
  batching: packing.MicroBatching,
  mini_batch_rows: int,
  epochs: int,
  shuffle: bool,
  loss_agg_mode: str,
  prefix: str,
  to_train: Callable = lambda tree: tree,
  loss_scale_factor: float | None = None,
  pin_grads: Callable = lambda tree: tree,
  first_epoch_loss_fn: Callable | None = None,
):
  """`epochs` x mini-batches of `mini_batch_rows` (one optimizer step each) x micro-batches (`batching`).

  `first_epoch_loss_fn` (one mini-batch of padded rows): the first epoch's loss instead of `loss_fn`; its
  per-row outputs (the loss's `rows`) join `data` under their keys for the later epochs,
  and its metrics that the later epochs lack are the first epoch's.
  Returns (params, opt_state, metrics averaged over the optimizer steps, plus `<prefix>/lr`).
  """
  num_rows = data["responses"].shape[0]
  num_mini = num_rows // mini_batch_rows
  if first_epoch_loss_fn is not None and (num_mini != 1 or batching.packed):
    raise ValueError(
      f"{prefix}: a first-epoch loss needs one mini-batch of padded rows, got {num_mini} "
      f"mini-batches{' of packed rows' if batching.packed else ''}"
    )

  def split(tree, parts):
    return jax.tree.map(lambda x: x.reshape((parts, x.shape[0] // parts) + x.shape[1:]), tree)

  def minibatch_step(loss_fn, carry, inputs):
    params, opt_state = carry
    minibatch, minibatch_rng = inputs
    grads, metrics, rows = minibatch_gradients(
      loss_fn, params, aux, minibatch, minibatch_rng, batching, loss_agg_mode, to_train, loss_scale_factor, pin_grads
    )
    params, opt_state, grad_norm, skipped = apply_gradients(tx, params, opt_state, grads, lr)
    metrics[f"{prefix}/grad_norm"] = grad_norm
    metrics[f"{prefix}/update_skipped"] = skipped  # non-finite gradients: the update was not applied
    if "perf/packed" in metrics:  # the fraction of this section's mini-batches that ran packed
      metrics[f"perf/packed/{prefix}"] = metrics.pop("perf/packed")
    return (params, opt_state), (metrics, rows)

  def epoch(loss_fn, data, carry, epoch_rng):
    """-> (carry, (metrics, per-row outputs) stacked over the mini-batches, the epoch's row order)."""
    perm_rng, mini_rng = jax.random.split(epoch_rng)
    order = jax.random.permutation(perm_rng, num_rows) if shuffle else jnp.arange(num_rows)
    epoch_data = jax.tree.map(lambda x: x[order], data)
    carry, outputs = jax.lax.scan(
      lambda c, inputs: minibatch_step(loss_fn, c, inputs),
      carry,
      (split(epoch_data, num_mini), jax.random.split(mini_rng, num_mini)),
    )
    return carry, outputs, order

  def epochs_of(loss_fn, data, carry, epoch_rngs):
    """-> (carry, metrics stacked over epochs x mini-batches)."""
    carry, (metrics, _) = jax.lax.scan(lambda c, epoch_rng: epoch(loss_fn, data, c, epoch_rng)[:2], carry, epoch_rngs)
    return carry, metrics

  epoch_rngs = jax.random.split(rng, epochs)
  if first_epoch_loss_fn is None:
    (params, opt_state), metrics = epochs_of(loss_fn, data, (params, opt_state), epoch_rngs)
    metrics = {k: EXTREMA[k][0](v) if k in EXTREMA else v.mean() for k, v in metrics.items()}
  else:
    carry, (first, rows), order = epoch(first_epoch_loss_fn, data, (params, opt_state), epoch_rngs[0])
    rows = {k: v[0] for k, v in rows.items()}  # the one mini-batch's
    data = dict(data, **{k: jnp.zeros_like(v).at[order].set(v) for k, v in rows.items()})  # back to row order
    if "old_log_probs" in rows and "rollout_log_probs" in data:  # the old-log-prob phase's metric, here
      gap = rollout_probs_diff(data["rollout_log_probs"], data["old_log_probs"], data["response_mask"])
      first.update({k: v[None] for k, v in gap.items()})  # as one mini-batch's
    (params, opt_state), rest = epochs_of(loss_fn, data, carry, epoch_rngs[1:]) if epochs > 1 else (carry, {})
    over_steps = lambda k, v: (
      EXTREMA[k][0](jnp.concatenate([v.ravel(), rest[k].ravel()]) if k in rest else v)
      if k in EXTREMA
      else (v.sum() + rest[k].sum()) / (v.size + rest[k].size)
      if k in rest
      else v.mean()
    )
    metrics = {k: over_steps(k, v) for k, v in first.items()}
  metrics[f"{prefix}/lr"] = lr
  return params, opt_state, metrics


def update_after_warmup(update: Callable, warmup_steps: int, step, params, opt_state):
  """`update(params, opt_state) -> (params, opt_state, metrics)` from step `warmup_steps` on, before it
  the inputs unchanged and zeros for the same metrics (the host drops them: `step_modes.actor_update_metric_names`)."""
  if warmup_steps == 0:
    return update(params, opt_state)
  metric_shapes = jax.eval_shape(update, params, opt_state)[2]
  skip = lambda params, opt_state: (
    params,
    opt_state,
    jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), metric_shapes),
  )
  return jax.lax.cond(step >= warmup_steps, update, skip, params, opt_state)
