"""The step's generation phase: the actor's weights in the generation layout and the rollout dtype,
prompts x n sampled with the KV cache pinned, responses returned in the train layout (docs/algorithms.md §5 `gen`).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxrlhf.config import ConfigError
from jaxrlhf.models.decoder import Decoder, DecoderConfig, cast_floating, kv_heads_repeated
from jaxrlhf.models.decoding import decode_model
from jaxrlhf.models.lora import merge_adapters
from jaxrlhf.parallel.step_layouts import StepLayouts
from jaxrlhf.rollout import SamplingParams, generate, generate_in_slots
from jaxrlhf.rollout import partial as partial_rollouts
from jaxrlhf.trainer.records import Rollout


class Generation:
  """`rollout_dtype`: generation's compute dtype (`rollout.dtype`): the weights are cast once per rollout."""

  def __init__(self, config, model_config: DecoderConfig, sampling: SamplingParams, layouts: StepLayouts):
    self.config = config
    self.rollout_dtype = config.actor_rollout_ref.rollout.dtype or model_config.dtype
    self.model_config = model_config
    # With more rollout TP devices than key/value heads, the rollout model has copies of them (`StepLayouts`).
    self.rollout_actor = Decoder(
      dataclasses.replace(kv_heads_repeated(model_config, layouts.generation_kv_repeat), dtype=self.rollout_dtype),
      head="lm",
    )
    self.replay_routes = bool(config.actor_rollout_ref.rollout.enable_rollout_routing_replay)
    if self.replay_routes and not model_config.num_experts:
      raise ConfigError(
        "actor_rollout_ref.rollout.enable_rollout_routing_replay=True needs a model with experts (this model's "
        f"model_type {model_config.model_type!r} has num_experts=0); set it False"
      )
    # What the decode loop calls and keeps; with routing replay it also records each token's experts.
    self.decode_model = decode_model(self.rollout_actor, record_routes=self.replay_routes)
    self.sampling = sampling
    self.layouts = layouts
    self.lora_alpha = model_config.lora_alpha
    v1 = config.trainer.v1
    # trainer.v1.trainer_mode=colocate_async: rollouts carried between steps in a pool (`rollout/partial.py`).
    self.carries_rollouts = v1.trainer_mode == "colocate_async"
    warmup_batches = int(v1.colocate_async.num_warmup_batches)
    self.warmup_batches = warmup_batches if self.carries_rollouts else 0
    self.stop = "enough" if v1.colocate_async.partial_rollout else "all"
    self.off_policy_threshold = v1.sampler.max_off_policy_threshold
    self.off_policy_strategy = v1.sampler.max_off_policy_strategy

  def generation_params(self, actor):
    """The actor's weights (`RoleState.weights`) in the generation layout and the rollout dtype; LoRA adapters
    merged in.

    Merging once per rollout (in the train layout, before the gather) costs one r-rank product per
    targeted kernel; decoding with the adapters unmerged would add two small matmuls to every targeted
    linear of every decode step (benchmarks/lora_generation.py measures both).
    """
    actor = self.layouts.actor.on_device(actor)
    actor_params = merge_adapters(actor.params, actor.adapters, self.lora_alpha)
    # Cast before the reshard: the all-gathers move (and the gathered copy holds) the rollout dtype.
    return self.layouts.to_generation(cast_floating(actor_params, self.rollout_dtype), self.model_config)

  def sample(self, generation_params, prompts_NxP, prompt_mask_NxP, rng, sampling: SamplingParams) -> dict:
    """`generate` with the rollout model, the prompts in the generation layout and the cache pinned; with
    `rollout.max_num_seqs`, `generate_in_slots`: that many rows decode at once per generation shard."""
    inputs = (generation_params, *self.layouts.to_generation_batch((prompts_NxP, prompt_mask_NxP)))
    slots = self.config.actor_rollout_ref.rollout.max_num_seqs
    if slots is None:
      return generate(self.decode_model, *inputs, rng, sampling, constrain_cache=self.constrain_cache)
    return generate_in_slots(
      self.decode_model,
      *inputs,
      rng,
      sampling,
      slots=slots,
      shards=self.layouts.generation_shards(prompts_NxP.shape[0]),
    )

  def constrain_cache(self, cache):
    """The rollout model's cache pinned in the generation layout."""
    return self.layouts.constrain_cache(cache, self.decode_model.cache_axes)

  # ----- trainer.v1.trainer_mode=colocate_async: the carried pool -----------------------------------------

  def empty_pool(self) -> partial_rollouts.RolloutPool:
    """The carried rollout of a fresh run: room for `1 + num_warmup_batches` batches of prompt groups."""
    data, rollout = self.config.data, self.config.actor_rollout_ref.rollout
    return partial_rollouts.empty_pool(
      self.decode_model,
      groups=(1 + self.warmup_batches) * data.train_batch_size,
      n=rollout.n,
      prompt_len=data.max_prompt_length,
      response_len=data.max_response_length,
      slots=rollout.max_num_seqs,
      pad_token_id=self.sampling.pad_token_id,
    )

  def admit(self, pool, batch, step):
    """`pool` with `batch`'s prompts admitted at `step` (left-padded to the pool's prompt width)."""
    ids, mask = batch["input_ids"], batch["attention_mask"]
    pad = pool.prompts.shape[1] - ids.shape[1]
    ids, mask = (jnp.pad(x, ((0, 0), (pad, 0))) for x in (ids, mask))
    return partial_rollouts.admit(pool, ids, mask, batch["sample_index"], step, self.sampling.pad_token_id)

  def partial_rollout(self, actor, pool, batch, rng, step):
    """Phase `gen` of a colocate_async step: the batch admitted, the pool decoded with this step's weights until
    `train_batch_size` groups are trainable (or, without partial rollout, until every admitted row has ended), the
    oldest of them taken. Returns (Rollout, the pool carried on, metrics)."""
    batch_size, n = batch["input_ids"].shape[0], self.config.actor_rollout_ref.rollout.n
    threshold, strategy = self.off_policy_threshold, self.off_policy_strategy
    params = self.generation_params(actor)
    pool = self.admit(pool, batch, step)
    dropped = jnp.int32(0)
    if threshold is not None and strategy == "drop":
      pool, dropped = partial_rollouts.drop_stale(pool, step, threshold, self.sampling.pad_token_id)
    pool, loop_steps, busy = partial_rollouts.decode_pool(
      self.decode_model,
      params,
      pool,
      rng,
      self.sampling,
      step=step,
      need=batch_size,
      stop=self.stop,
      threshold=threshold,
      strategy=strategy,
    )
    pool, taken = partial_rollouts.take_trainable(pool, step, batch_size, threshold, strategy)
    staleness = taken["staleness"].astype(jnp.float32)
    slots = pool.slot_row.shape[0]
    metrics = {
      "rollout/staleness_mean": staleness.mean(),
      "rollout/staleness_max": staleness.max(),
      "rollout/carried_trajectories": pool.row_valid().sum().astype(jnp.float32),
      "rollout/carried_in_slots": (pool.slot_row < pool.prompts.shape[0]).sum().astype(jnp.float32),
      "rollout/slot_utilization": busy.astype(jnp.float32) / jnp.maximum(loop_steps * slots, 1).astype(jnp.float32),
      "rollout/dropped_groups": dropped.astype(jnp.float32),
    }
    fields = ("prompts", "prompt_mask", "responses", "response_mask", "rollout_log_probs")
    moved = self.layouts.to_train(tuple(taken[name] for name in fields))
    rollout = Rollout(
      **dict(zip(fields, moved)),
      sample_index=taken["sample_index"],
      group_index=jnp.repeat(jnp.arange(batch_size, dtype=jnp.int32), n),
      decode_steps=loop_steps,
    )
    return rollout, pool, metrics

  def rollout(self, actor, batch, rng) -> Rollout:
    """Prompts x n (interleaved, group ids) -> responses and the sampler's log-probs of them (what rollout
    correction compares with the training forward's), returned in the train layout.

    ReMax also decodes each prompt greedily once: its reward is the baseline.
    """
    n = self.config.actor_rollout_ref.rollout.n
    prompts_NxP = jnp.repeat(batch["input_ids"], n, axis=0)
    prompt_mask_NxP = jnp.repeat(batch["attention_mask"], n, axis=0).astype(jnp.int32)
    # The gathered (and merged) copy lives only in this phase.
    generation_params = self.generation_params(actor)
    out = self.sample(generation_params, prompts_NxP, prompt_mask_NxP, rng, self.sampling)
    responses_NxR, response_mask_NxR, rollout_log_probs_NxR = self.layouts.to_train(
      (out["responses"], out["response_mask"], out["rollout_log_probs"])
    )
    replayed = {}
    if self.replay_routes:  # [N, P + R, layers, k]: each fed token's experts (`models/decoding.py`, records)
      replayed["rollout_routes"] = self.layouts.to_train(out["rollout_routes"])
    prompts_NxP, prompt_mask_NxP = self.layouts.to_train((prompts_NxP, prompt_mask_NxP))
    baseline = {}
    if self.config.algorithm.adv_estimator == "remax":
      greedy = dataclasses.replace(self.sampling, do_sample=False)
      greedy_out = self.sample(generation_params, batch["input_ids"], batch["attention_mask"], rng, greedy)
      baseline = {
        "baseline_responses": jnp.repeat(greedy_out["responses"], n, axis=0),
        "baseline_response_mask": jnp.repeat(greedy_out["response_mask"], n, axis=0),
      }
    rollout = Rollout(
      prompts=prompts_NxP,
      prompt_mask=prompt_mask_NxP,
      responses=responses_NxR,
      response_mask=response_mask_NxR,
      rollout_log_probs=rollout_log_probs_NxR,
      sample_index=jnp.repeat(batch["sample_index"], n, axis=0),
      group_index=jnp.repeat(jnp.arange(batch["input_ids"].shape[0], dtype=jnp.int32), n),
      decode_steps=out["num_steps"],
      **baseline,
      **replayed,
    )
    return rollout
