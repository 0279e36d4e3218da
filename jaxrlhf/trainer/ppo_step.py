"""The fused PPO step (SPEC §5): `ppo_step(state, batch, rng) -> (state, metrics)`, one program.

Inside: repeat prompts `n` times (interleaved, group ids) -> generate in the generation layout ->
rule reward via host callback -> old/ref log-probs and values in the train layout -> KL in reward ->
advantages -> critic update, then actor update (after `critic_warmup`) as `lax.scan` over
epochs x mini-batches x micro-batches with exact global loss normalisation -> metrics (SPEC §7).
Micro-batches are padded rows, or with `use_remove_padding` packed rows (`packing`: the log-prob and
value phases too); `use_dynamic_bsz` sizes them by a token budget.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxrlhf import algos
from jaxrlhf.models.decoder import Decoder, DecoderConfig, cast_floating, positions_from_mask, reward_model_scores
from jaxrlhf.parallel.step_layouts import StepLayouts
from jaxrlhf.rollout import SamplingParams, generate, token_log_probs
from jaxrlhf.trainer import packing
from jaxrlhf.trainer.state import TrainState, apply_gradients


def _stats(prefix: str, x, mask=None) -> dict[str, jax.Array]:
  x = x.astype(jnp.float32)
  if mask is None:
    return {f"{prefix}/mean": jnp.mean(x), f"{prefix}/max": jnp.max(x), f"{prefix}/min": jnp.min(x)}
  valid = mask > 0
  return {f"{prefix}/mean": algos.masked_mean(x, mask),
          f"{prefix}/max": jnp.max(jnp.where(valid, x, -jnp.inf)),
          f"{prefix}/min": jnp.min(jnp.where(valid, x, jnp.inf))}


class PPOStep:
  """Builds the step function from a resolved config; holds only static things (models, sizes)."""

  def __init__(self, config, model_config: DecoderConfig, reward_fn: Callable, *, eos_token_ids, pad_token_id,
               lr_schedules: dict[str, Callable], optimizers: dict[str, Any], layouts: StepLayouts,
               num_batch_shards: int = 1, kl_warmup_steps: int = 0,
               critic_model_config: DecoderConfig | None = None,
               reward_model_config: DecoderConfig | None = None):
    self.config = config
    self.model_config = model_config
    self.actor = Decoder(model_config, head="lm")
    # Generation may run in its own compute dtype (rollout.dtype): the weights are cast once per rollout.
    self.rollout_dtype = config.actor_rollout_ref.rollout.dtype or model_config.dtype
    self.rollout_actor = Decoder(dataclasses.replace(model_config, dtype=self.rollout_dtype), head="lm")
    self.critic = Decoder(critic_model_config or model_config, head="value")
    self.reward_fn = reward_fn
    self.reward_model = Decoder(reward_model_config, head="reward") if reward_model_config else None
    self.lr_schedules = lr_schedules
    self.optimizers = optimizers
    self.layouts = layouts
    self.num_batch_shards = num_batch_shards
    self.kl_warmup_steps = kl_warmup_steps
    rollout = config.actor_rollout_ref.rollout
    self.sampling = SamplingParams.from_rollout_config(
        rollout, config.data.max_response_length, eos_token_ids, pad_token_id)
    self.temperature = self.sampling.logprob_temperature
    actor = config.actor_rollout_ref.actor
    self.use_critic = bool(config.critic.enable)
    self.use_reference = bool(actor.use_kl_loss or config.algorithm.use_kl_in_reward)
    # One mini-batch, one epoch: every gradient is taken at the rollout policy itself. As verl does,
    # use the current log-prob (stopped) as the old one, so the ratio is exactly 1, not 1 +- rounding.
    self.actor_on_policy = actor.ppo_epochs == 1 and actor.ppo_mini_batch_size == config.data.train_batch_size
    # Performance switches (SPEC §5, `packing`): the critic follows the actor's (or its own model's) packing.
    self.actor_packed = bool(config.actor_rollout_ref.model.use_remove_padding)
    self.critic_packed = self.actor_packed or bool(config.critic.model.use_remove_padding)

  # ----- model calls -------------------------------------------------------------------------

  def rollout_apply(self, params, ids, positions, kv_mask, cache=None, cache_index=None):
    return self.rollout_actor.apply({"params": params}, ids, positions, kv_mask, cache, cache_index)

  def _sequence_inputs(self, prompts_NxP, prompt_mask_NxP, responses_NxR):
    ids_NxS = jnp.concatenate([prompts_NxP, responses_NxR], axis=1)
    mask_NxS = jnp.concatenate([prompt_mask_NxP.astype(jnp.int32), jnp.ones_like(responses_NxR)], axis=1)
    return ids_NxS, positions_from_mask(mask_NxS), mask_NxS

  def _packed_apply(self, model, params, packed):
    return model.apply({"params": params}, packed["input_ids"], packed["positions"],
                       (packed["segment_ids"] > 0).astype(jnp.int32), segment_ids_BxL=packed["segment_ids"])[0]

  def policy_outputs(self, params, micro, with_entropy: bool = True):
    """(log_prob_NxR, entropy_NxR or None) of the response tokens: padded rows, or a packed slot.

    Padded rows: prompt + response in one sequence, read at the position before each response token.
    A packed slot (`micro["packed"]`, use_remove_padding) is read back into the [N, R] layout; rows
    outside the slot hold garbage. Logits in fp32, divided by the rollout temperature.
    """
    prompt_len, response_len = micro["prompts"].shape[1], micro["responses"].shape[1]
    if "packed" in micro:
      packed = micro["packed"]
      logits_BxSxV = self._packed_apply(self.actor, params, packed)
      log_prob_BxS = token_log_probs(logits_BxSxV, packing.next_tokens(packed["input_ids"]), self.temperature)
      log_prob_NxR = packing.response_outputs(log_prob_BxS, packed, prompt_len, response_len)
      entropy = lambda: packing.response_outputs(algos.entropy_from_logits(logits_BxSxV / self.temperature),
                                                 packed, prompt_len, response_len)
    else:
      ids_NxS, positions_NxS, mask_NxS = self._sequence_inputs(micro["prompts"], micro["prompt_mask"],
                                                               micro["responses"])
      logits_NxSxV, _ = self.actor.apply({"params": params}, ids_NxS, positions_NxS, mask_NxS)
      logits_NxRxV = logits_NxSxV[:, prompt_len - 1:prompt_len + response_len - 1]
      log_prob_NxR = token_log_probs(logits_NxRxV, micro["responses"], self.temperature)
      entropy = lambda: algos.entropy_from_logits(logits_NxRxV / self.temperature)
    return log_prob_NxR, entropy() if with_entropy else None

  def value_outputs(self, params, micro):
    """V at the state before each response token (SPEC §4): padded rows, or a packed slot (as above)."""
    prompt_len, response_len = micro["prompts"].shape[1], micro["responses"].shape[1]
    if "packed" in micro:
      packed = micro["packed"]
      return packing.response_outputs(self._packed_apply(self.critic, params, packed), packed, prompt_len,
                                      response_len)
    ids_NxS, positions_NxS, mask_NxS = self._sequence_inputs(micro["prompts"], micro["prompt_mask"],
                                                             micro["responses"])
    values_NxS, _ = self.critic.apply({"params": params}, ids_NxS, positions_NxS, mask_NxS)
    return values_NxS[:, prompt_len - 1:prompt_len + response_len - 1]

  def _batching(self, num_sequences: int, seq_len: int, micro_per_device, micro_key: str, packed: bool):
    """Micro-batch slots of `num_sequences` (a mini-batch, or the whole batch for the log-prob phases)."""
    actor = self.config.actor_rollout_ref.actor
    if actor.use_dynamic_bsz:
      return packing.micro_batching(num_sequences, seq_len, self.num_batch_shards, rows_per_shard=None,
                                    max_token_len=actor.ppo_max_token_len_per_gpu, packed=packed)
    rows = self.micro_rows(micro_per_device, num_sequences, micro_key)
    return packing.MicroBatching(rows=rows, num_micro=num_sequences // rows, shards=self.num_batch_shards,
                                 packed=packed)

  def _pack(self, data, batching):
    ids_NxS, _, _ = self._sequence_inputs(data["prompts"], data["prompt_mask"], data["responses"])
    valid_NxS = jnp.concatenate([data["prompt_mask"], data["response_mask"]], axis=1)
    return packing.pack(ids_NxS, valid_NxS, batching)

  def _packed_phase(self, outputs_fn, rollout, batching):
    """A forward-only phase over packed slots: `outputs_fn(packed) -> [N, R]`; 0 off the response mask."""
    plan = self._pack(rollout, batching)
    mask_NxR = rollout["response_mask"]

    def run_slot(out_NxR, k):
      slot_values = jax.lax.cond(plan["used"][k], lambda: outputs_fn(packing.slot(plan, k)),
                                 lambda: jnp.zeros(out_NxR.shape, jnp.float32))
      return jnp.where((plan["slot_N"] == k)[:, None], slot_values, out_NxR), None

    out_NxR, _ = jax.lax.scan(run_slot, jnp.zeros(mask_NxR.shape, jnp.float32), jnp.arange(batching.num_micro))
    return out_NxR * mask_NxR.astype(jnp.float32)

  def _phase_batching(self, rollout, cfg, micro_key: str, packed: bool):
    rows = cfg.ppo_mini_batch_size * self.config.actor_rollout_ref.rollout.n
    seq_len = rollout["prompts"].shape[1] + rollout["responses"].shape[1]
    mini = self._batching(rows, seq_len, cfg.ppo_micro_batch_size_per_gpu, micro_key, packed)
    num_sequences = rollout["responses"].shape[0]
    return dataclasses.replace(mini, num_micro=-(-num_sequences // mini.rows))

  def _whole_rollout(self, outputs_fn, rollout, section, micro_key: str, packed: bool):
    """A forward-only phase: `outputs_fn(micro) -> [N, R]` on the padded rollout at once, or per packed slot."""
    if not packed:
      return outputs_fn(rollout)
    batching = self._phase_batching(rollout, section, micro_key, True)
    return self._packed_phase(lambda slot: outputs_fn(dict(rollout, packed=slot)), rollout, batching)

  # ----- losses ------------------------------------------------------------------------------

  def actor_loss(self, params, aux, micro, normalizers, rng):
    """aux: per-step scalars (`kl_scale`: 0 during the KL warm-up, else 1)."""
    actor = self.config.actor_rollout_ref.actor
    mask = micro["response_mask"]
    log_prob, entropy = self.policy_outputs(params, micro)
    old_log_prob = jax.lax.stop_gradient(log_prob) if self.actor_on_policy else micro["old_log_probs"]
    pg_loss, pg_metrics = algos.compute_policy_loss(
        old_log_prob, log_prob, micro["advantages"], mask,
        loss_mode=actor.policy_loss.loss_mode, clip_ratio=actor.clip_ratio, clip_ratio_low=actor.clip_ratio_low,
        clip_ratio_high=actor.clip_ratio_high, clip_ratio_c=actor.clip_ratio_c,
        loss_agg_mode=actor.loss_agg_mode, rng=rng, **normalizers,
        **{key: actor.policy_loss[key] for key in algos.POLICY_LOSS_CONFIG_KEYS})
    entropy_loss = algos.agg_loss(entropy, mask, actor.loss_agg_mode, **normalizers)
    loss = pg_loss - actor.entropy_coeff * entropy_loss
    metrics = {"actor/pg_loss": pg_loss, "actor/entropy": entropy_loss,
               "actor/pg_clipfrac": pg_metrics["pg_clipfrac"],
               "actor/pg_clipfrac_lower": pg_metrics["pg_clipfrac_lower"],
               "actor/ppo_kl": pg_metrics["ppo_kl"]}
    if actor.use_kl_loss:
      kl = algos.kl_penalty(log_prob, micro["ref_log_probs"], actor.kl_loss_type)
      kl_loss = algos.agg_loss(kl, mask, actor.loss_agg_mode, **normalizers)
      loss = loss + aux["kl_scale"] * actor.kl_loss_coef * kl_loss
      metrics["actor/kl_loss"] = kl_loss
    return loss, metrics

  def critic_loss(self, params, unused_aux, micro, normalizers, unused_rng):
    critic = self.config.critic
    vpreds = self.value_outputs(params, micro)
    vf_loss, vf_clipfrac = algos.compute_value_loss(
        vpreds, micro["values"], micro["returns"], micro["response_mask"], critic.cliprange_value,
        loss_agg_mode=critic.loss_agg_mode, **normalizers)
    # vpred_mean is a per-token mean: normalise it like the loss so micro-batches add up.
    vpred_mean = algos.agg_loss(vpreds, micro["response_mask"], "token-mean",
                                global_token_count=normalizers["global_token_count"])
    return vf_loss, {"critic/vf_loss": vf_loss, "critic/vf_clipfrac": vf_clipfrac, "critic/vpred_mean": vpred_mean}

  # ----- the update loop ---------------------------------------------------------------------

  def minibatch_gradients(self, loss_fn, params, aux, minibatch, key, batching: packing.MicroBatching,
                          loss_agg_mode: str):
    """Summed gradients and metrics of one mini-batch over its micro-batches (padded rows or packed slots).

    The normalisers come from the whole mini-batch, so micro-batch losses and gradients add up exactly.
    """
    normalizers = algos.loss_normalizers(minibatch["response_mask"], loss_agg_mode)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    keys = jax.random.split(key, batching.num_micro)
    zeros = jax.tree.map(jnp.zeros_like, params)

    def gradients(micro, micro_key):
      (_, metrics), grads = grad_fn(params, aux, self.layouts.to_train(micro), normalizers, micro_key)
      return grads, metrics

    if batching.packed:
      plan = self._pack(minibatch, batching)

      def packed_step(grads_acc, inputs):
        k, micro_key = inputs
        in_slot_N = plan["slot_N"] == k
        micro = dict(minibatch, response_mask=minibatch["response_mask"] * in_slot_N[:, None].astype(
            minibatch["response_mask"].dtype), packed=packing.slot(plan, k))
        run = lambda: gradients(micro, micro_key)
        skip_shapes = jax.eval_shape(run)
        skip = lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), skip_shapes)
        grads, metrics = jax.lax.cond(plan["used"][k], run, skip)  # an empty slot costs nothing
        return jax.tree.map(jnp.add, grads_acc, grads), metrics

      grads, micro_metrics = jax.lax.scan(packed_step, zeros, (jnp.arange(batching.num_micro), keys))
    else:
      padded = packing.pad_rows(minibatch, batching.num_micro * batching.rows)
      micro_batches = jax.tree.map(lambda x: x.reshape((batching.num_micro, batching.rows) + x.shape[1:]), padded)

      def padded_step(grads_acc, inputs):
        grads, metrics = gradients(*inputs)
        return jax.tree.map(jnp.add, grads_acc, grads), metrics

      grads, micro_metrics = jax.lax.scan(padded_step, zeros, (micro_batches, keys))
    # Losses and token-mean metrics are normalised by the mini-batch's counts: they add up exactly.
    return grads, {k: v.sum() for k, v in micro_metrics.items()}

  def _update(self, loss_fn, params, opt_state, aux, data, rng, *, tx, lr, mini_batch_rows: int,
              micro_per_device, micro_key: str, packed: bool, epochs: int, shuffle: bool, loss_agg_mode: str,
              prefix: str):
    """`epochs` x mini-batches (one optimizer step each) x micro-batches (grad accumulation)."""
    num_rows = data["responses"].shape[0]
    num_mini = num_rows // mini_batch_rows
    seq_len = data["prompts"].shape[1] + data["responses"].shape[1]
    batching = self._batching(mini_batch_rows, seq_len, micro_per_device, micro_key, packed)

    def split(tree, parts):
      return jax.tree.map(lambda x: x.reshape((parts, x.shape[0] // parts) + x.shape[1:]), tree)

    def minibatch_step(carry, inputs):
      params, opt_state = carry
      minibatch, key = inputs
      grads, metrics = self.minibatch_gradients(loss_fn, params, aux, minibatch, key, batching, loss_agg_mode)
      params, opt_state, grad_norm, skipped = apply_gradients(tx, params, opt_state, grads, lr)
      metrics[f"{prefix}/grad_norm"] = grad_norm
      metrics[f"{prefix}/update_skipped"] = skipped  # non-finite gradients: the update was not applied
      return (params, opt_state), metrics

    def epoch_step(carry, key):
      perm_key, mini_key = jax.random.split(key)
      order = jax.random.permutation(perm_key, num_rows) if shuffle else jnp.arange(num_rows)
      epoch_data = jax.tree.map(lambda x: x[order], data)
      return jax.lax.scan(minibatch_step, carry, (split(epoch_data, num_mini), jax.random.split(mini_key, num_mini)))

    (params, opt_state), metrics = jax.lax.scan(epoch_step, (params, opt_state), jax.random.split(rng, epochs))
    metrics = {k: v.mean() for k, v in metrics.items()}
    metrics[f"{prefix}/lr"] = lr
    return params, opt_state, metrics

  def micro_rows(self, micro_per_device, mini_batch_rows: int, key: str) -> int:
    if micro_per_device is None:
      return mini_batch_rows
    rows = micro_per_device * self.num_batch_shards
    if mini_batch_rows % rows:
      raise ValueError(f"{key}={micro_per_device} x {self.num_batch_shards} batch shards = {rows} rows "
                       f"does not divide the mini-batch of {mini_batch_rows} sequences")
    return rows

  # ----- the phases of a step (SPEC §5); fused = their composition in one program ----------------

  def generation_params(self, actor_params):
    """The actor's weights in the generation layout and the rollout dtype."""
    return cast_floating(self.layouts.to_generation(actor_params), self.rollout_dtype)

  def sample(self, generation_params, prompts_NxP, prompt_mask_NxP, rng, sampling: SamplingParams) -> dict:
    """`generate` with the rollout model, the prompts in the generation layout and the cache pinned."""
    return generate(self.rollout_apply, generation_params, self.rollout_actor.config,
                    *self.layouts.to_generation_batch((prompts_NxP, prompt_mask_NxP)), rng, sampling,
                    constrain_cache=self.layouts.constrain_cache)

  def rollout(self, actor_params, batch, rng) -> dict:
    """Phase `gen`: prompts x n (interleaved, group ids) -> responses in the generation layout.

    ReMax also decodes each prompt greedily once: its reward is the baseline.
    """
    n = self.config.actor_rollout_ref.rollout.n
    prompts_NxP = jnp.repeat(batch["input_ids"], n, axis=0)
    prompt_mask_NxP = jnp.repeat(batch["attention_mask"], n, axis=0).astype(jnp.int32)
    generation_params = self.generation_params(actor_params)  # the gathered copy lives only in this phase
    out = self.sample(generation_params, prompts_NxP, prompt_mask_NxP, rng, self.sampling)
    responses_NxR, response_mask_NxR = self.layouts.to_train((out["responses"], out["response_mask"]))
    prompts_NxP, prompt_mask_NxP = self.layouts.to_train((prompts_NxP, prompt_mask_NxP))
    rollout = {"prompts": prompts_NxP, "prompt_mask": prompt_mask_NxP, "responses": responses_NxR,
               "response_mask": response_mask_NxR,
               "sample_index": jnp.repeat(batch["sample_index"], n, axis=0),
               "group_index": jnp.repeat(jnp.arange(batch["input_ids"].shape[0], dtype=jnp.int32), n),
               "decode_steps": out["num_steps"]}
    if self.config.algorithm.adv_estimator == "remax":
      greedy = dataclasses.replace(self.sampling, do_sample=False)
      baseline = self.sample(generation_params, batch["input_ids"], batch["attention_mask"], rng, greedy)
      rollout["baseline_responses"] = jnp.repeat(baseline["responses"], n, axis=0)
      rollout["baseline_response_mask"] = jnp.repeat(baseline["response_mask"], n, axis=0)
    return rollout

  def sequence_scores(self, reward_fn, reward_params, prompts_NxP, prompt_mask_NxP, responses_NxR,
                      response_mask_NxR, sample_index_N):
    """(scores_N, errors_N): the rule reward, the reward model's score, or (combine_with_rule) their sum."""
    rm = self.config.reward_model
    zeros_N = jnp.zeros(responses_NxR.shape[:1], jnp.float32)
    scores_N, errors_N = zeros_N, zeros_N
    if not rm.enable or rm.combine_with_rule:
      scores_N, errors_N = reward_fn(responses_NxR, response_mask_NxR, sample_index_N)
    if rm.enable:
      ids_NxS, _, _ = self._sequence_inputs(prompts_NxP, prompt_mask_NxP, responses_NxR)
      mask_NxS = jnp.concatenate([prompt_mask_NxP, response_mask_NxR], axis=1).astype(jnp.int32)
      scores_N = scores_N + reward_model_scores(self.reward_model, reward_params, ids_NxS, mask_NxS)
    return scores_N, errors_N

  def score(self, rollout: dict, reward_params=None) -> dict:
    """Phase `reward`: sequence score (+ DAPO overlong penalty) on the last valid token -> token_level_scores."""
    responses_NxR, response_mask_NxR = rollout["responses"], rollout["response_mask"]
    scores_N, errors_N = self.sequence_scores(self.reward_fn, reward_params, rollout["prompts"],
                                              rollout["prompt_mask"], responses_NxR, response_mask_NxR,
                                              rollout["sample_index"])
    overlong = self.config.reward_model.overlong_buffer
    if overlong.enable:
      scores_N = scores_N + algos.overlong_penalty(response_mask_NxR.sum(axis=1), responses_NxR.shape[1],
                                                   overlong.len, overlong.penalty_factor)
    out = {"scores": scores_N, "reward_errors": errors_N,
           "token_level_scores": algos.place_scores_on_last_token(scores_N, response_mask_NxR)}
    if "baseline_responses" in rollout:
      out["reward_baselines"] = self.sequence_scores(
          self.reward_fn, reward_params, rollout["prompts"], rollout["prompt_mask"], rollout["baseline_responses"],
          rollout["baseline_response_mask"], rollout["sample_index"])[0]
    return out

  def _rollout_log_probs(self, params, rollout: dict):
    return self._whole_rollout(lambda micro: self.policy_outputs(params, micro, with_entropy=False)[0], rollout,
                               self.config.actor_rollout_ref.actor,
                               "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", self.actor_packed)

  def old_log_prob(self, actor_params, rollout: dict):
    return jax.lax.stop_gradient(self._rollout_log_probs(actor_params, rollout))

  def ref_log_prob(self, ref_params, rollout: dict):
    ref_params = self.layouts.fetch(ref_params, self.layouts.ref_device)
    return self._rollout_log_probs(ref_params, rollout)

  def critic_values(self, critic_params, rollout: dict):
    values_NxR = self._whole_rollout(lambda micro: self.value_outputs(critic_params, micro), rollout,
                                     self.config.critic, "critic.ppo_micro_batch_size_per_gpu", self.critic_packed)
    return values_NxR * rollout["response_mask"].astype(jnp.float32)

  def kl_scale(self, step):
    return (step >= self.kl_warmup_steps).astype(jnp.float32)  # KL warm-up: no KL term at first

  def advantages(self, state: TrainState, rollout: dict, scored: dict, old_log_probs, ref_log_probs, values):
    """Phase `adv`: KL in reward (+ controller update), then the configured estimator."""
    algo = self.config.algorithm
    mask_f = rollout["response_mask"].astype(jnp.float32)
    kl_coef, metrics = state.kl_coef, {}
    token_level_rewards = scored["token_level_scores"]
    if algo.use_kl_in_reward:
      token_level_rewards, kl_coef, current_kl = algos.apply_kl_penalty(
          token_level_rewards, old_log_probs, ref_log_probs, rollout["response_mask"], kl_coef,
          kl_penalty_type=algo.kl_penalty, kl_ctrl_type=algo.kl_ctrl.type, target_kl=algo.kl_ctrl.target_kl,
          horizon=algo.kl_ctrl.horizon, kl_scale=self.kl_scale(state.step))
      metrics["actor/reward_kl_penalty"] = current_kl
      metrics["actor/reward_kl_penalty_coeff"] = state.kl_coef
    advantages, returns = algos.compute_advantage(
        algo.adv_estimator, token_level_rewards=token_level_rewards, response_mask=mask_f, values=values,
        index=rollout["group_index"], reward_baselines=scored.get("reward_baselines"), gamma=algo.gamma,
        lam=algo.lam, norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo)
    return {"advantages": advantages, "returns": returns, "token_level_rewards": token_level_rewards,
            "kl_coef": kl_coef, "metrics": metrics}

  def update_data(self, rollout, old_log_probs, ref_log_probs, adv):
    data = {key: rollout[key] for key in ("prompts", "prompt_mask", "responses", "response_mask")}
    data.update(old_log_probs=old_log_probs, advantages=adv["advantages"])
    if ref_log_probs is not None:
      data["ref_log_probs"] = ref_log_probs
    return data

  def update_critic(self, state: TrainState, data: dict, values, returns, rng):
    """Phase `update_critic`: PPO epochs of clipped value loss."""
    critic_cfg = self.config.critic
    rows = critic_cfg.ppo_mini_batch_size * self.config.actor_rollout_ref.rollout.n
    return self._update(
        self.critic_loss, state.critic_params, state.critic_opt_state, None, dict(data, values=values, returns=returns),
        rng, tx=self.optimizers["critic"], lr=self.lr_schedules["critic"](state.step) * state.lr_scale,
        mini_batch_rows=rows, micro_per_device=critic_cfg.ppo_micro_batch_size_per_gpu,
        micro_key="critic.ppo_micro_batch_size_per_gpu", packed=self.critic_packed, epochs=critic_cfg.ppo_epochs,
        shuffle=critic_cfg.shuffle, loss_agg_mode=critic_cfg.loss_agg_mode, prefix="critic")

  def update_actor(self, state: TrainState, data: dict, rng):
    """Phase `update_actor`: PPO epochs of the policy loss (skipped during `critic_warmup`)."""
    actor_cfg = self.config.actor_rollout_ref.actor
    rows = actor_cfg.ppo_mini_batch_size * self.config.actor_rollout_ref.rollout.n
    kl_scale = self.kl_scale(state.step)

    def run(params, opt_state):
      opt_state = self.layouts.fetch(opt_state, self.layouts.actor_opt_device)
      params, opt_state, metrics = self._update(
          self.actor_loss, params, opt_state, {"kl_scale": kl_scale}, data, rng, tx=self.optimizers["actor"],
          lr=self.lr_schedules["actor"](state.step) * state.lr_scale, mini_batch_rows=rows,
          micro_per_device=actor_cfg.ppo_micro_batch_size_per_gpu,
          micro_key="actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", packed=self.actor_packed,
          epochs=actor_cfg.ppo_epochs, shuffle=actor_cfg.shuffle, loss_agg_mode=actor_cfg.loss_agg_mode,
          prefix="actor")
      if actor_cfg.use_kl_loss:
        metrics["actor/kl_coef"] = kl_scale * actor_cfg.kl_loss_coef
      return params, self.layouts.fetch(opt_state, self.layouts.actor_opt_host), metrics

    warmup = self.config.trainer.critic_warmup
    if not (self.use_critic and warmup > 0):
      return run(state.actor_params, state.actor_opt_state)
    metric_shapes = jax.eval_shape(run, state.actor_params, state.actor_opt_state)[2]
    skip = lambda params, opt_state: (params, opt_state, jax.tree.map(
        lambda s: jnp.zeros(s.shape, s.dtype), metric_shapes))
    return jax.lax.cond(state.step >= warmup, run, skip, state.actor_params, state.actor_opt_state)

  def batch_metrics(self, rollout, scored, adv, values) -> dict:
    """SPEC §7 batch statistics of one step."""
    mask_f = rollout["response_mask"].astype(jnp.float32)
    lengths_N = rollout["response_mask"].sum(axis=1)
    prompt_lengths_N = rollout["prompt_mask"].sum(axis=1)
    metrics = {}
    metrics.update(_stats("critic/score", scored["scores"]))
    metrics.update(_stats("critic/rewards", adv["token_level_rewards"].sum(axis=1)))
    metrics.update(_stats("critic/advantages", adv["advantages"], mask_f))
    metrics.update(_stats("critic/returns", adv["returns"], mask_f))
    if values is not None:
      metrics.update(_stats("critic/values", values, mask_f))
      residual_var = algos.masked_var(adv["returns"] - values, mask_f)
      metrics["critic/vf_explained_var"] = 1.0 - residual_var / (algos.masked_var(adv["returns"], mask_f) + 1e-5)
    metrics.update(_stats("response_length", lengths_N))
    metrics["response_length/clip_ratio"] = jnp.mean((lengths_N == mask_f.shape[1]).astype(jnp.float32))
    metrics.update(_stats("prompt_length", prompt_lengths_N))
    metrics["prompt_length/clip_ratio"] = jnp.mean(
        (prompt_lengths_N == rollout["prompt_mask"].shape[1]).astype(jnp.float32))
    metrics["perf/total_num_tokens"] = (prompt_lengths_N.sum() + lengths_N.sum()).astype(jnp.float32)
    metrics["perf/decode_steps"] = jnp.asarray(rollout["decode_steps"], jnp.float32)
    metrics["reward/num_errors"] = scored["reward_errors"].sum()
    return metrics

  @staticmethod
  def split_rng(rng):
    gen_key, actor_key, critic_key = jax.random.split(rng, 3)
    return {"gen": gen_key, "actor": actor_key, "critic": critic_key}

  def train_on_rollout(self, state: TrainState, rollout: dict, scored: dict, rng) -> tuple[TrainState, dict]:
    """Everything after the reward, in one program (used by the fused step and by DAPO's rounds)."""
    keys = self.split_rng(rng)
    old_log_probs = self.old_log_prob(state.actor_params, rollout)
    ref_log_probs = self.ref_log_prob(state.ref_params, rollout) if self.use_reference else None
    values = self.critic_values(state.critic_params, rollout) if self.use_critic else None
    adv = self.advantages(state, rollout, scored, old_log_probs, ref_log_probs, values)
    return self.finish(state, rollout, scored, old_log_probs, ref_log_probs, values, adv, keys)

  def finish(self, state, rollout, scored, old_log_probs, ref_log_probs, values, adv, keys,
             critic_result=None, actor_result=None):
    """Updates (unless given, as in phased mode) and the new state + metrics."""
    data = self.update_data(rollout, old_log_probs, ref_log_probs, adv)
    metrics = dict(adv["metrics"])
    critic_params, critic_opt_state = state.critic_params, state.critic_opt_state
    if self.use_critic:
      critic_params, critic_opt_state, critic_metrics = critic_result or self.update_critic(
          state, data, values, adv["returns"], keys["critic"])
      metrics.update(critic_metrics)
    actor_params, actor_opt_state, actor_metrics = actor_result or self.update_actor(state, data, keys["actor"])
    metrics.update(actor_metrics)
    metrics.update(self.batch_metrics(rollout, scored, adv, values))
    new_state = state.replace(step=state.step + 1, actor_params=actor_params, actor_opt_state=actor_opt_state,
                              critic_params=critic_params, critic_opt_state=critic_opt_state, kl_coef=adv["kl_coef"])
    return new_state, metrics

  def __call__(self, state: TrainState, batch: dict[str, jax.Array], rng) -> tuple[TrainState, dict]:
    """The fused step: every phase in one program."""
    rollout = self.rollout(state.actor_params, batch, self.split_rng(rng)["gen"])
    return self.train_on_rollout(state, rollout, self.score(rollout, state.reward_params), rng)


def make_validation_fn(step: PPOStep, sampling: SamplingParams, reward_fn: Callable):
  """`validate(actor_params, reward_params, batch, rng) -> (scores_N, responses_NxR, response_mask_NxR)`."""

  def validate(actor_params, reward_params, batch, rng):
    n = step.config.actor_rollout_ref.rollout.val_kwargs.n
    prompts_NxP = jnp.repeat(batch["input_ids"], n, axis=0)
    prompt_mask_NxP = jnp.repeat(batch["attention_mask"], n, axis=0)
    sample_index_N = jnp.repeat(batch["sample_index"], n, axis=0)
    rollout = step.sample(step.generation_params(actor_params), prompts_NxP, prompt_mask_NxP, rng, sampling)
    scores_N, _ = step.sequence_scores(reward_fn, reward_params, prompts_NxP, prompt_mask_NxP, rollout["responses"],
                                       rollout["response_mask"], sample_index_N)
    return scores_N, rollout["responses"], rollout["response_mask"]

  return validate
