"""The PPO step (SPEC §5) as a composition of phases: `PPOStep(state, batch, rng) -> (state, metrics)`.

Phases: gen (prompts x n -> responses, generation layout) -> reward (rule via host callback, or a
reward model; DAPO overlong shaping) -> old/ref log-probs and values (train layout) -> adv (KL in
reward, estimator) -> update_critic -> update_actor (after `critic_warmup`) -> metrics (SPEC §7).
The fused step (`__call__`) runs them all in one program; phased mode (`phased.PhasedStep`) jits
them one by one. What each phase computes lives elsewhere, one place each:
- model outputs (log-probs + entropy, values; padded or packed): `model_outputs`;
- losses: `losses`; the math they and the phases compose: `jaxrlhf.algos`;
- micro-batch plans and the update loop: `update_loop` (+ `packing`);
- layouts and the generation <-> train round trip: `jaxrlhf.parallel.StepLayouts`;
- batch statistics: `batch_metrics`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxrlhf import algos
from jaxrlhf.models.decoder import Decoder, DecoderConfig, cast_floating
from jaxrlhf.parallel.step_layouts import StepLayouts
from jaxrlhf.rollout import SamplingParams, generate
from jaxrlhf.trainer import losses, reward, update_loop
from jaxrlhf.trainer.batch_metrics import batch_metrics
from jaxrlhf.trainer.model_outputs import ModelOutputs
from jaxrlhf.trainer.state import TrainState

ACTOR, CRITIC = "actor_rollout_ref.actor", "critic"  # config paths of the two trained sections


class PPOStep:
  """Builds the step's phases from a resolved config; holds only static things (models, sizes)."""

  def __init__(self, config, model_config: DecoderConfig, reward_fn: Callable, *, eos_token_ids, pad_token_id,
               lr_schedules: dict[str, Callable], optimizers: dict[str, Any], layouts: StepLayouts,
               num_batch_shards: int = 1, kl_warmup_steps: int = 0,
               critic_model_config: DecoderConfig | None = None,
               reward_model_config: DecoderConfig | None = None):
    self.config = config
    actor = config.actor_rollout_ref.actor
    rollout = config.actor_rollout_ref.rollout
    self.actor = Decoder(model_config, head="lm")
    self.critic = Decoder(critic_model_config or model_config, head="value")
    # Generation may run in its own compute dtype (rollout.dtype): the weights are cast once per rollout.
    self.rollout_dtype = rollout.dtype or model_config.dtype
    self.rollout_actor = Decoder(dataclasses.replace(model_config, dtype=self.rollout_dtype), head="lm")
    self.reward_fn = reward_fn
    self.reward_model = Decoder(reward_model_config, head="reward") if reward_model_config else None
    self.lr_schedules = lr_schedules
    self.optimizers = optimizers
    self.layouts = layouts
    self.kl_warmup_steps = kl_warmup_steps
    self.sampling = SamplingParams.from_rollout_config(
        rollout, config.data.max_response_length, eos_token_ids, pad_token_id)
    self.outputs = ModelOutputs(self.actor, self.critic, self.sampling.logprob_temperature)
    self.batcher = update_loop.MicroBatcher(config, num_batch_shards)
    self.use_critic = bool(config.critic.enable)
    self.use_reference = bool(actor.use_kl_loss or config.algorithm.use_kl_in_reward)
    # Performance switches (SPEC §5, `packing`): the critic follows the actor's (or its own model's) packing.
    self.actor_packed = bool(config.actor_rollout_ref.model.use_remove_padding)
    self.critic_packed = self.actor_packed or bool(config.critic.model.use_remove_padding)
    on_policy = actor.ppo_epochs == 1 and actor.ppo_mini_batch_size == config.data.train_batch_size
    self.actor_loss = functools.partial(losses.actor_loss, outputs=self.outputs, actor=actor, on_policy=on_policy)
    self.critic_loss = functools.partial(losses.critic_loss, outputs=self.outputs, critic=config.critic)

  # ----- gen and reward ----------------------------------------------------------------------

  def generation_params(self, actor_params):
    """The actor's weights in the generation layout and the rollout dtype."""
    return cast_floating(self.layouts.to_generation(actor_params), self.rollout_dtype)

  def sample(self, generation_params, prompts_NxP, prompt_mask_NxP, rng, sampling: SamplingParams) -> dict:
    """`generate` with the rollout model, the prompts in the generation layout and the cache pinned."""
    apply = lambda params, *inputs: self.rollout_actor.apply({"params": params}, *inputs)
    return generate(apply, generation_params, self.rollout_actor.config,
                    *self.layouts.to_generation_batch((prompts_NxP, prompt_mask_NxP)), rng, sampling,
                    constrain_cache=self.layouts.constrain_cache)

  def rollout(self, actor_params, batch, rng) -> dict:
    """Phase `gen`: prompts x n (interleaved, group ids) -> responses, returned in the train layout.

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

  def score(self, rollout: dict, reward_params=None) -> dict:
    """Phase `reward` (`reward.score_rollout`)."""
    return reward.score_rollout(self.config.reward_model, self.reward_fn, self.reward_model, reward_params, rollout)

  # ----- forward-only phases: old/ref log-probs, values ---------------------------------------

  def _forward_phase(self, outputs_fn, rollout, section, section_path: str, packed: bool):
    seq_len = rollout["prompts"].shape[1] + rollout["responses"].shape[1]
    batching = (self.batcher.phase_plan(section, section_path, rollout["responses"].shape[0], seq_len)
                if packed else None)
    return update_loop.forward_phase(outputs_fn, rollout, batching)

  def _rollout_log_probs(self, params, rollout: dict):
    return self._forward_phase(lambda micro: self.outputs.log_probs(params, micro, with_entropy=False)[0], rollout,
                               self.config.actor_rollout_ref.actor, ACTOR, self.actor_packed)

  def old_log_prob(self, actor_params, rollout: dict):
    return jax.lax.stop_gradient(self._rollout_log_probs(actor_params, rollout))

  def ref_log_prob(self, ref_params, rollout: dict):
    return self._rollout_log_probs(self.layouts.fetch(ref_params, self.layouts.ref_device), rollout)

  def critic_values(self, critic_params, rollout: dict):
    values_NxR = self._forward_phase(lambda micro: self.outputs.values(critic_params, micro), rollout,
                                     self.config.critic, CRITIC, self.critic_packed)
    return values_NxR * rollout["response_mask"].astype(jnp.float32)

  # ----- adv and the updates ----------------------------------------------------------------------

  def kl_gate(self, step):
    """0.0 during the KL warm-up (no KL term in reward or loss), else 1.0."""
    return (step >= self.kl_warmup_steps).astype(jnp.float32)

  def advantages(self, state: TrainState, rollout: dict, scored: dict, old_log_probs, ref_log_probs, values):
    """Phase `adv`: KL in reward (+ controller update), then the configured estimator."""
    algo = self.config.algorithm
    kl_coef, metrics = state.kl_coef, {}
    token_level_rewards = scored["token_level_scores"]
    if algo.use_kl_in_reward:
      token_level_rewards, kl_coef, current_kl = algos.apply_kl_penalty(
          token_level_rewards, old_log_probs, ref_log_probs, rollout["response_mask"], kl_coef,
          kl_penalty_type=algo.kl_penalty, kl_ctrl_type=algo.kl_ctrl.type, target_kl=algo.kl_ctrl.target_kl,
          horizon=algo.kl_ctrl.horizon, kl_gate=self.kl_gate(state.step))
      metrics["actor/reward_kl_penalty"] = current_kl
      metrics["actor/reward_kl_penalty_coeff"] = state.kl_coef
    advantages, returns = algos.compute_advantage(
        algo.adv_estimator, token_level_rewards=token_level_rewards,
        response_mask=rollout["response_mask"].astype(jnp.float32), values=values, index=rollout["group_index"],
        reward_baselines=scored.get("reward_baselines"), gamma=algo.gamma, lam=algo.lam,
        norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo)
    return {"advantages": advantages, "returns": returns, "token_level_rewards": token_level_rewards,
            "kl_coef": kl_coef, "metrics": metrics}

  def update_data(self, rollout, old_log_probs, ref_log_probs, adv):
    data = {key: rollout[key] for key in ("prompts", "prompt_mask", "responses", "response_mask")}
    data.update(old_log_probs=old_log_probs, advantages=adv["advantages"])
    if ref_log_probs is not None:
      data["ref_log_probs"] = ref_log_probs
    return data

  def _update(self, loss_fn, section, section_path: str, packed: bool, params, opt_state, aux, data, rng, *,
              tx, lr, prefix: str):
    seq_len = data["prompts"].shape[1] + data["responses"].shape[1]
    return update_loop.ppo_update(
        loss_fn, params, opt_state, aux, data, rng, tx=tx, lr=lr,
        batching=self.batcher.update_plan(section, section_path, seq_len, packed),
        mini_batch_rows=section.ppo_mini_batch_size * self.batcher.n, epochs=section.ppo_epochs,
        shuffle=section.shuffle, loss_agg_mode=section.loss_agg_mode, prefix=prefix, to_train=self.layouts.to_train)

  def update_critic(self, state: TrainState, data: dict, values, returns, rng):
    """Phase `update_critic`: PPO epochs of clipped value loss."""
    return self._update(self.critic_loss, self.config.critic, CRITIC, self.critic_packed, state.critic_params,
                        state.critic_opt_state, None, dict(data, values=values, returns=returns), rng,
                        tx=self.optimizers["critic"], lr=self.lr_schedules["critic"](state.step) * state.lr_scale,
                        prefix="critic")

  def update_actor(self, state: TrainState, data: dict, rng):
    """Phase `update_actor`: PPO epochs of the policy loss (skipped during `critic_warmup`)."""
    actor = self.config.actor_rollout_ref.actor
    kl_gate = self.kl_gate(state.step)

    def run(params, opt_state):
      opt_state = self.layouts.fetch(opt_state, self.layouts.actor_opt_device)
      params, opt_state, metrics = self._update(
          self.actor_loss, actor, ACTOR, self.actor_packed, params, opt_state, {"kl_gate": kl_gate}, data, rng,
          tx=self.optimizers["actor"], lr=self.lr_schedules["actor"](state.step) * state.lr_scale, prefix="actor")
      if actor.use_kl_loss:
        metrics["actor/kl_coef"] = kl_gate * actor.kl_loss_coef
      return params, self.layouts.fetch(opt_state, self.layouts.actor_opt_host), metrics

    warmup = self.config.trainer.critic_warmup
    if not (self.use_critic and warmup > 0):
      return run(state.actor_params, state.actor_opt_state)
    metric_shapes = jax.eval_shape(run, state.actor_params, state.actor_opt_state)[2]
    skip = lambda params, opt_state: (params, opt_state, jax.tree.map(
        lambda s: jnp.zeros(s.shape, s.dtype), metric_shapes))
    return jax.lax.cond(state.step >= warmup, run, skip, state.actor_params, state.actor_opt_state)

  # ----- composition --------------------------------------------------------------------------

  @staticmethod
  def split_rng(rng):
    gen_rng, actor_rng, critic_rng = jax.random.split(rng, 3)
    return {"gen": gen_rng, "actor": actor_rng, "critic": critic_rng}

  def train_on_rollout(self, state: TrainState, rollout: dict, scored: dict, rng) -> tuple[TrainState, dict]:
    """Everything after the reward, in one program (used by the fused step and by DAPO's rounds)."""
    old_log_probs = self.old_log_prob(state.actor_params, rollout)
    ref_log_probs = self.ref_log_prob(state.ref_params, rollout) if self.use_reference else None
    values = self.critic_values(state.critic_params, rollout) if self.use_critic else None
    adv = self.advantages(state, rollout, scored, old_log_probs, ref_log_probs, values)
    return self.finish(state, rollout, scored, old_log_probs, ref_log_probs, values, adv, self.split_rng(rng))

  def finish(self, state, rollout, scored, old_log_probs, ref_log_probs, values, adv, rngs,
             critic_result=None, actor_result=None):
    """Updates (unless given, as in phased mode) and the new state + metrics."""
    data = self.update_data(rollout, old_log_probs, ref_log_probs, adv)
    metrics = dict(adv["metrics"])
    critic_params, critic_opt_state = state.critic_params, state.critic_opt_state
    if self.use_critic:
      critic_params, critic_opt_state, critic_metrics = critic_result or self.update_critic(
          state, data, values, adv["returns"], rngs["critic"])
      metrics.update(critic_metrics)
    actor_params, actor_opt_state, actor_metrics = actor_result or self.update_actor(state, data, rngs["actor"])
    metrics.update(actor_metrics)
    metrics.update(batch_metrics(rollout, scored, adv, values, self.config.data.max_prompt_length))
    new_state = state.replace(step=state.step + 1, actor_params=actor_params, actor_opt_state=actor_opt_state,
                              critic_params=critic_params, critic_opt_state=critic_opt_state, kl_coef=adv["kl_coef"])
    return new_state, metrics

  def __call__(self, state: TrainState, batch: dict[str, jax.Array], rng) -> tuple[TrainState, dict]:
    """The fused step: every phase in one program."""
    rollout = self.rollout(state.actor_params, batch, self.split_rng(rng)["gen"])
    return self.train_on_rollout(state, rollout, self.score(rollout, state.reward_params), rng)

