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
