"""The PPO step (SPEC §5) as a composition of phases: `PPOStep(state, batch, rng) -> (state, metrics)`.

Phases: gen (prompts x n -> responses, generation layout) -> reward (rule via host callback, or a
reward model; DAPO overlong shaping) -> old/ref log-probs and values (train layout) -> adv (KL in
reward, estimator) -> update_critic -> update_actor (after `critic_warmup`) -> metrics (SPEC §7).
The fused step (`__call__`) runs them all in one program; phased mode (`phased.PhasedStep`) jits
them one by one. What each phase computes lives elsewhere, one place each:
- generation: `generation`; the reward phase: `reward`;
- model outputs (log-probs + entropy, values; padded or packed): `model_outputs`;
- losses: `losses`; the math they and the phases compose: `jaxrlhf.algos`;
- micro-batch plans and the update loop: `update_loop` (+ `packing`);
- layouts and the generation <-> train round trip: `jaxrlhf.parallel.StepLayouts`;
- batch statistics: `batch_metrics`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxrlhf import algos
from jaxrlhf.config import sequence_parallel_sizes
from jaxrlhf.models.activation_layout import ActivationLayout
from jaxrlhf.models.decoder import Decoder, DecoderConfig
from jaxrlhf.models.sequence_parallel import SequenceParallel
from jaxrlhf.parallel.step_layouts import StepLayouts
from jaxrlhf.rollout import SamplingParams
from jaxrlhf.trainer import flops, losses, reward, update_loop
from jaxrlhf.trainer.batch_metrics import batch_metrics
from jaxrlhf.trainer.generation import Generation
from jaxrlhf.trainer.model_outputs import ModelOutputs
from jaxrlhf.trainer.state import TrainState

ACTOR, CRITIC = "actor_rollout_ref.actor", "critic"  # config paths of the two trained sections
OTB_ESTIMATORS = ("optimal_token_baseline", "tir_optimal_token_baseline")  # need sum_pi_squared


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
    # Ulysses (`models/sequence_parallel.py`): the training and log-prob / value forwards split sequences
    # over the mesh's sp axis; generation (`self.generation`) has its own module and never does.
    # Every train-layout forward pins its activations to the batch layout (`models/activation_layout.py`).
    sp_sizes = sequence_parallel_sizes(config)

    def layout(role):
      if layouts.mesh is None:
        return None
      return SequenceParallel(layouts.mesh) if sp_sizes.get(role, 1) > 1 else ActivationLayout(layouts.mesh)

    self.actor = Decoder(model_config, head="lm", layout=layout("actor"))
    self.critic = Decoder(critic_model_config or model_config, head="value", layout=layout("critic"))
    self.reward_fn = reward_fn
    self.reward_model = (Decoder(reward_model_config, head="reward", layout=layout("reward"))
                         if reward_model_config else None)
    self.lr_schedules = lr_schedules
    self.optimizers = optimizers
    self.layouts = layouts
    self.kl_warmup_steps = kl_warmup_steps
    self.sampling = SamplingParams.from_rollout_config(
        rollout, config.data.max_response_length, eos_token_ids, pad_token_id)
    self.generation = Generation(config, model_config, self.sampling, layouts)
    self.rollout_dtype, self.rollout_actor = self.generation.rollout_dtype, self.generation.rollout_actor
    # The LM head's chunks keep the forward's split: by rows (and length under sequence parallelism).
    self.outputs = ModelOutputs(self.actor, self.critic, self.sampling.logprob_temperature,
                                config.actor_rollout_ref.model.logits_chunk_size, num_batch_shards,
                                self.actor.layout.constrain if self.actor.layout else (lambda x, logical_axes: x))
    # A sequence-parallel group shares its rows: batch shards (verl's data-parallel size) are devices / sp.
    # Packing pays only when it saves more backbone work than its heads add (`packing.packing_pays`).
    seq_len = config.data.max_prompt_length + config.data.max_response_length
    self.batcher = update_loop.MicroBatcher(
        config, num_batch_shards, {ACTOR: sp_sizes["actor"], CRITIC: sp_sizes["critic"]},
        head_costs={ACTOR: flops.head_cost(model_config, "lm", seq_len),
                    CRITIC: flops.head_cost(critic_model_config or model_config, "value", seq_len)})
    self.use_critic = bool(config.critic.enable)
    self.use_reference = bool(actor.use_kl_loss or config.algorithm.use_kl_in_reward)
    # LoRA: the actor trains adapters over a frozen base, and the base (adapters off) is the reference
    # policy, so no copy of the weights is stored for it.
    self.actor_lora = model_config.lora_rank > 0
    self.stores_reference = self.use_reference and not self.actor_lora
    # Exact KL over the vocabulary ("full") needs both policies' logits in one place: the old-log-prob
    # phase runs the reference too (for the reward; it then yields the reference log-probs as well, so
    # there is no separate ref phase), and the actor loss runs it per micro-batch.
    self.full_kl_in_reward = bool(config.algorithm.use_kl_in_reward and config.algorithm.kl_penalty == "full")
    self.full_kl_loss = bool(actor.use_kl_loss and actor.kl_loss_type == "full")
    self.ref_phase = self.use_reference and not self.full_kl_in_reward
    # verl 0.9.1's rollout correction between the sampler's log-probs and the trainer's. Bypass mode: the
    # rollout's log-probs are the old ones (no old-log-prob forward unless a statistic or the full KL needs
    # it) and the `bypass_mode` loss corrects per micro-batch. Decoupled mode (rollout_is / rollout_rs set):
    # weights and rejection from the old-log-prob phase's log-probs, once per batch, before the estimator.
    correction = config.algorithm.rollout_correction
    self.bypass = bool(correction.bypass_mode)
    self.decoupled_correction = not self.bypass and (correction.rollout_is is not None
                                                     or correction.rollout_rs is not None)
    self.old_forward = not self.bypass or self.full_kl_in_reward or (
        config.algorithm.adv_estimator in OTB_ESTIMATORS)
    # Performance switches (SPEC §5, `packing`): the critic follows the actor's (or its own model's) packing.
    self.actor_packed = bool(config.actor_rollout_ref.model.use_remove_padding)
    self.critic_packed = self.actor_packed or bool(config.critic.model.use_remove_padding)
    # In bypass mode the old log-probs are the rollout's, not this forward's: never on-policy by construction.
    on_policy = (actor.ppo_epochs == 1 and actor.ppo_mini_batch_size == config.data.train_batch_size
                 and not self.bypass)
    self.actor_loss = functools.partial(losses.actor_loss, outputs=self.outputs, actor=actor, on_policy=on_policy,
                                        rollout_correction=correction if self.bypass else None)
    self.critic_loss = functools.partial(losses.critic_loss, outputs=self.outputs, critic=config.critic)
    self.actor_update_metric_names: tuple[str, ...] = ()

  # ----- gen and reward ----------------------------------------------------------------------

  def rollout(self, actor_params, batch, rng, actor_adapters=None) -> dict:
    """Phase `gen` (`generation.Generation.rollout`)."""
    return self.generation.rollout(actor_params, batch, rng, actor_adapters)

  def score(self, rollout: dict, reward_params=None) -> dict:
    """Phase `reward` (`reward.score_rollout`)."""
    return reward.score_rollout(self.config.reward_model, self.reward_fn, self.reward_model, reward_params, rollout)

  # ----- forward-only phases: old/ref log-probs, values ---------------------------------------

  def _forward_phase(self, outputs_fn, rollout, section, section_path: str, packed: bool, micro_per_device):
    seq_len = rollout["prompts"].shape[1] + rollout["responses"].shape[1]
    batching = self.batcher.phase_plan(section, section_path, rollout["responses"].shape[0], seq_len, packed,
                                       micro_per_device)
    return update_loop.forward_phase(outputs_fn, rollout, batching, self.layouts.to_train)

  def _rollout_log_probs(self, params, rollout: dict, phase: str, statistics: tuple[str, ...] = (), adapters=None,
                         ref_params=None):
    return self._forward_phase(
        lambda micro: self.outputs.token_outputs(params, micro, statistics, adapters, ref_params), rollout,
        self.config.actor_rollout_ref.actor, ACTOR, self.actor_packed, self.batcher.forward_micro_per_device[phase])

  def old_log_prob(self, actor_params, rollout: dict, actor_adapters=None, ref_params=None):
    """Phase `old_log_prob`: (log-probs of the rollout policy, aux). aux["metrics"] holds its entropy
    (`actor/entropy`, as verl); aux["sum_pi_squared"] [N, R] feeds the optimal token baselines. With
    `ref_params` (full KL in the reward) aux also holds "full_kl" and "ref_log_prob" [N, R].
    Bypass mode: the old log-probs are the sampler's (`rollout_log_probs`)."""
    if not self.old_forward:
      return rollout["rollout_log_probs"], {"metrics": {}}
    actor = self.config.actor_rollout_ref.actor
    statistics = ("entropy",) + (("sum_pi_squared",) if self.config.algorithm.adv_estimator in OTB_ESTIMATORS else ())
    if ref_params is not None:
      ref_params = self.layouts.fetch(ref_params, self.ref_device)
    out = jax.lax.stop_gradient(self._rollout_log_probs(
        self.layouts.fetch(actor_params, self.layouts.actor_device), rollout, "old_log_prob", statistics,
        actor_adapters, ref_params))
    aux = {"metrics": {"actor/entropy": algos.agg_loss(out["entropy"], rollout["response_mask"], actor.loss_agg_mode,
                                                       loss_scale_factor=actor.loss_scale_factor)}}
    aux.update({key: out[key] for key in ("sum_pi_squared", "full_kl", "ref_log_prob") if key in out})
    return (rollout["rollout_log_probs"] if self.bypass else out["log_prob"]), aux

  def reference_params(self, state: TrainState):
    """The reference policy's weights: its own copy, or with LoRA the actor's base (run without adapters)."""
    return state.actor_params if self.actor_lora else state.ref_params

  @property
  def ref_device(self):
    """Where the reference's weights are fetched to: the actor's base with LoRA, else the reference's own."""
    return self.layouts.actor_device if self.actor_lora else self.layouts.ref_device

  def ref_log_prob(self, ref_params, rollout: dict):
    return self._rollout_log_probs(self.layouts.fetch(ref_params, self.ref_device), rollout, "ref")["log_prob"]

  def critic_values(self, critic_params, rollout: dict):
    values_NxR = self._forward_phase(lambda micro: self.outputs.values(critic_params, micro), rollout,
                                     self.config.critic, CRITIC, self.critic_packed,
                                     self.batcher.forward_micro_per_device["values"])
    return values_NxR * rollout["response_mask"].astype(jnp.float32)

  # ----- adv and the updates ----------------------------------------------------------------------

  def kl_gate(self, step):
    """0.0 during the KL warm-up (no KL term in reward or loss), else 1.0."""
    return (step >= self.kl_warmup_steps).astype(jnp.float32)

  def advantages(self, state: TrainState, rollout: dict, scored: dict, old_log_probs, ref_log_probs, values,
                 old_aux=None):
    """Phase `adv`: KL in reward (+ controller update), then the configured estimator. `old_aux`:
    `old_log_prob`'s aux ("sum_pi_squared" for the optimal token baselines, "full_kl" for the full KL)."""
    old_aux = old_aux or {}
    algo = self.config.algorithm
    kl_coef, metrics = state.kl_coef, {}
    token_level_rewards = scored["token_level_scores"]
    response_mask, rollout_is_weights = rollout["response_mask"], None
    if algo.use_kl_in_reward:
      token_level_rewards, kl_coef, current_kl = algos.apply_kl_penalty(
          token_level_rewards, old_log_probs, ref_log_probs, rollout["response_mask"], kl_coef,
          kl_penalty_type=algo.kl_penalty, kl_ctrl_type=algo.kl_ctrl.type, target_kl=algo.kl_ctrl.target_kl,
          horizon=algo.kl_ctrl.horizon, kl_gate=self.kl_gate(state.step), full_kl_NxR=old_aux.get("full_kl"))
      metrics["actor/reward_kl_penalty"] = current_kl
      metrics["actor/reward_kl_penalty_coeff"] = state.kl_coef
    if self.decoupled_correction:
      # As verl: rejected tokens leave the response mask for the estimator and both updates.
      correction = algo.rollout_correction
      rollout_is_weights, response_mask, correction_metrics = algos.compute_rollout_correction_and_rejection_mask(
          old_log_probs, rollout["rollout_log_probs"], response_mask,
          **{key: correction[key] for key in algos.ROLLOUT_CORRECTION_CONFIG_KEYS if key != "loss_type"})
      response_mask = response_mask.astype(rollout["response_mask"].dtype)
      metrics.update(correction_metrics)
    advantages, returns = algos.compute_advantage(
        algo.adv_estimator, token_level_rewards=token_level_rewards,
        response_mask=response_mask.astype(jnp.float32), values=values, index=rollout["group_index"],
        reward_baselines=scored.get("reward_baselines"), gamma=algo.gamma, lam=algo.lam,
        norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo, old_log_probs=old_log_probs,
        sum_pi_squared=old_aux.get("sum_pi_squared"), rollout_is_weights=rollout_is_weights,
        reward_components=scored.get("reward_components"), reward_weights=algo.gdpo_reward_weights)
    adv = {"advantages": advantages, "returns": returns, "token_level_rewards": token_level_rewards,
           "kl_coef": kl_coef, "metrics": metrics, "response_mask": response_mask}
    if rollout_is_weights is not None:
      adv["rollout_is_weights"] = rollout_is_weights
    return adv

  def update_data(self, rollout, old_log_probs, ref_log_probs, adv):
    """What the updates read: the sequences (the response mask after any rollout rejection), old
    log-probs, advantages, and the reference's log-probs and rollout correction weights when present."""
    data = {key: rollout[key] for key in ("prompts", "prompt_mask", "responses")}
    data.update(response_mask=adv["response_mask"], old_log_probs=old_log_probs, advantages=adv["advantages"])
    if "rollout_is_weights" in adv:
      data["rollout_is_weights"] = adv["rollout_is_weights"]
    if ref_log_probs is not None:
      data["ref_log_probs"] = ref_log_probs
    return data

  def _update(self, loss_fn, section, section_path: str, packed: bool, params, opt_state, aux, data, rng, *,
              tx, lr, prefix: str, shardings):
    """`shardings`: the trained parameters' train layout (a tree of NamedSharding, None without a mesh),
    which their gradients are pinned to."""
    seq_len = data["prompts"].shape[1] + data["responses"].shape[1]
    pin_grads = (lambda tree: tree) if shardings is None else (
        lambda tree: jax.lax.with_sharding_constraint(tree, shardings))
    return update_loop.ppo_update(
        loss_fn, params, opt_state, aux, data, rng, tx=tx, lr=lr,
        batching=self.batcher.update_plan(section, section_path, seq_len, packed),
        mini_batch_rows=section.ppo_mini_batch_size * self.batcher.n, epochs=section.ppo_epochs,
        shuffle=section.shuffle, loss_agg_mode=section.loss_agg_mode, prefix=prefix, to_train=self.layouts.to_train,
        loss_scale_factor=section.loss_scale_factor, pin_grads=pin_grads)

  def update_critic(self, state: TrainState, data: dict, values, returns, rng):
    """Phase `update_critic`: PPO epochs of clipped value loss."""
    return self._update(self.critic_loss, self.config.critic, CRITIC, self.critic_packed, state.critic_params,
                        state.critic_opt_state, None, dict(data, values=values, returns=returns), rng,
                        tx=self.optimizers["critic"], lr=self.lr_schedules["critic"](state.step) * state.lr_scale,
                        prefix="critic", shardings=self.layouts.critic_train)

  def update_actor(self, state: TrainState, data: dict, rng):
    """Phase `update_actor`: PPO epochs of the policy loss (skipped during `critic_warmup`).

    Returns (trained, opt_state, metrics): `trained` is the actor's params, or its adapters with LoRA."""
    actor = self.config.actor_rollout_ref.actor
    kl_gate = self.kl_gate(state.step)

    # verl counts steps from 1 and updates the actor once `critic_warmup <= step`; the actor's learning
    # rate schedule advances with its own updates, so it starts at its step 0 after the warm-up.
    warmup = self.config.trainer.critic_warmup if self.use_critic else 0
    warmup_steps = max(warmup - 1, 0)

    def run(trained, opt_state):
      """`trained`: the actor's params, or its adapters with LoRA (the base then rides in aux, frozen)."""
      aux = {"kl_gate": kl_gate}
      if self.actor_lora:
        aux["base_params"] = self.layouts.fetch(state.actor_params, self.layouts.actor_device)
      else:
        trained = self.layouts.fetch(trained, self.layouts.actor_device)
      opt_state = self.layouts.fetch(opt_state, self.layouts.actor_opt_device)
      actor_updates_done = jnp.maximum(state.step - warmup_steps, 0)
      if self.full_kl_loss:
        aux["ref_params"] = self.layouts.fetch(self.reference_params(state), self.ref_device)
      trained, opt_state, metrics = self._update(
          self.actor_loss, actor, ACTOR, self.actor_packed, trained, opt_state, aux, data, rng,
          tx=self.optimizers["actor"], lr=self.lr_schedules["actor"](actor_updates_done) * state.lr_scale,
          prefix="actor", shardings=self.layouts.actor_adapters if self.actor_lora else self.layouts.actor_train)
      if actor.use_kl_loss:
        metrics["actor/kl_coef"] = kl_gate * actor.kl_loss_coef
      if not self.actor_lora:
        trained = self.layouts.fetch(trained, self.layouts.actor_host)
      return trained, self.layouts.fetch(opt_state, self.layouts.actor_opt_host), metrics

    trained = state.actor_adapters if self.actor_lora else state.actor_params
    if warmup_steps == 0:
      return run(trained, state.actor_opt_state)
    metric_shapes = jax.eval_shape(run, trained, state.actor_opt_state)[2]
    # Recorded when traced: the host drops these in warm-up steps (verl logs no actor update metrics).
    self.actor_update_metric_names = tuple(metric_shapes)
    skip = lambda params, opt_state: (params, opt_state, jax.tree.map(
        lambda s: jnp.zeros(s.shape, s.dtype), metric_shapes))
    return jax.lax.cond(state.step >= warmup_steps, run, skip, trained, state.actor_opt_state)

  # ----- composition --------------------------------------------------------------------------

  @staticmethod
  def split_rng(rng):
    gen_rng, actor_rng, critic_rng = jax.random.split(rng, 3)
    return {"gen": gen_rng, "actor": actor_rng, "critic": critic_rng}

  def train_on_rollout(self, state: TrainState, rollout: dict, scored: dict, rng) -> tuple[TrainState, dict]:
    """Everything after the reward, in one program (used by the fused step and by DAPO's rounds)."""
    old = self.old_log_prob(state.actor_params, rollout, state.actor_adapters,
                            self.reference_params(state) if self.full_kl_in_reward else None)
    ref_log_probs = (self.ref_log_prob(self.reference_params(state), rollout) if self.ref_phase
                     else old[1].get("ref_log_prob"))
    values = self.critic_values(state.critic_params, rollout) if self.use_critic else None
    adv = self.advantages(state, rollout, scored, old[0], ref_log_probs, values, old[1])
    return self.finish(state, rollout, scored, old, ref_log_probs, values, adv, self.split_rng(rng))

  def finish(self, state, rollout, scored, old, ref_log_probs, values, adv, rngs, critic_result=None,
             actor_result=None):
    """Updates (unless given, as in phased mode) and the new state + metrics. `old`: `old_log_prob`'s output."""
    old_log_probs, old_aux = old
    data = self.update_data(rollout, old_log_probs, ref_log_probs, adv)
    metrics = {**old_aux["metrics"], **adv["metrics"]}
    critic_params, critic_opt_state = state.critic_params, state.critic_opt_state
    if self.use_critic:
      critic_params, critic_opt_state, critic_metrics = critic_result or self.update_critic(
          state, data, values, adv["returns"], rngs["critic"])
      metrics.update(critic_metrics)
    actor_trained, actor_opt_state, actor_metrics = actor_result or self.update_actor(state, data, rngs["actor"])
    metrics.update(actor_metrics)
    actor_params, actor_adapters = (state.actor_params, actor_trained) if self.actor_lora else (actor_trained, None)
    metrics.update(batch_metrics(rollout, scored, adv, values, self.config.data.max_prompt_length,
                                 self.config.algorithm.gdpo_reward_keys or ()))
    new_state = state.replace(step=state.step + 1, actor_params=actor_params, actor_opt_state=actor_opt_state,
                              actor_adapters=actor_adapters,
                              critic_params=critic_params, critic_opt_state=critic_opt_state, kl_coef=adv["kl_coef"])
    return new_state, metrics

  def __call__(self, state: TrainState, batch: dict[str, jax.Array], rng) -> tuple[TrainState, dict]:
    """The fused step: every phase in one program."""
    rollout = self.rollout(state.actor_params, batch, self.split_rng(rng)["gen"], state.actor_adapters)
    return self.train_on_rollout(state, rollout, self.score(rollout, state.reward_params), rng)

