"""The PPO step (docs/algorithms.md §5) as a composition of phases: `PPOStep(state, batch, rng) -> (state, metrics)`.

Phases: gen (prompts x n -> responses, generation layout) -> reward (rule via host callback, or a
reward model; DAPO overlong shaping) -> old/ref log-probs, the distillation teacher's, values (train layout) ->
adv (KL in reward, estimator) -> update_critic -> update_actor (after `critic_warmup`) -> metrics
(docs/algorithms.md §7).
The fused step (`__call__`) runs them all in one program; phased mode (`phased.PhasedStep`) jits
them one by one. What each phase computes lives elsewhere, one place each:
- generation: `generation`; the reward phase: `reward`; on-policy distillation: `distillation`;
- model outputs (log-probs + entropy, values; padded or packed): `model_outputs`;
- which phases run for a config: `phase_plan`; the advantage phase: `advantage`;
- losses: `losses`; the math they and the phases compose: `jaxrlhf.algos`;
- micro-batch plans and the update loop: `update_loop` (+ `packing`);
- layouts and the generation <-> train round trip: `jaxrlhf.parallel.StepLayouts`;
- batch statistics: `batch_metrics`;
- the trained roles (actor, critic: model, optimizer, schedule, LoRA, packing, where their state lives): `role`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxrlhf import algos
from jaxrlhf.config import sequence_parallel_sizes
from jaxrlhf.models.decoder import Decoder, DecoderConfig
from jaxrlhf.models.sequence_parallel import training_layout
from jaxrlhf.parallel.step_layouts import StepLayouts
from jaxrlhf.rollout import SamplingParams
from jaxrlhf.trainer import advantage, flops, losses, reward, update_loop
from jaxrlhf.trainer.batch_metrics import batch_metrics, rollout_probs_diff
from jaxrlhf.trainer.distillation import Distillation
from jaxrlhf.trainer.generation import Generation
from jaxrlhf.trainer.judge import Judge, JudgeFns
from jaxrlhf.trainer.model_outputs import ModelOutputs
from jaxrlhf.trainer.phase_plan import PhasePlan
from jaxrlhf.trainer.records import Advantages, OldLogProbs, Rollout, Scored
from jaxrlhf.trainer.role import ROLE_PATHS, TrainedRole
from jaxrlhf.trainer.state import RoleState, TrainState


class PPOStep:
  """Builds the step's phases from a resolved config; holds only static things (models, sizes)."""

  def __init__(
    self,
    config,
    model_config: DecoderConfig,
    reward_fn: Callable,
    *,
    eos_token_ids,
    pad_token_id,
    lr_schedules: dict[str, Callable],
    optimizers: dict[str, Any],
    layouts: StepLayouts,
    num_batch_shards: int = 1,
    kl_warmup_steps: int = 0,
    critic_model_config: DecoderConfig | None = None,
    reward_model_config: DecoderConfig | None = None,
    judge_fns: JudgeFns | None = None,
    teacher_model_config: DecoderConfig | None = None,
  ):
    """`judge_fns`: with a generative reward model (`reward_model.generative`), the judge's host side."""
    self.config = config
    actor = config.actor_rollout_ref.actor
    # Every train-layout forward pins its activations to the batch layout, and under Ulysses splits sequences
    # over the mesh's sp axis (`models/sequence_parallel.py`); generation has its own module and never does.
    sp_sizes = sequence_parallel_sizes(config)
    layout = lambda role: training_layout(layouts.mesh, sp_sizes.get(role, 1))
    self.actor = Decoder(model_config, head="lm", layout=layout("actor"))
    self.critic = Decoder(critic_model_config or model_config, head="value", layout=layout("critic"))
    self.reward_fn = reward_fn
    # A reward model is a scalar head over the actor's tokens, or a judge that generates (`judge.Judge`).
    self.judge = None
    self.reward_model = None
    if reward_model_config and reward.uses_judge(config.reward_model):
      if judge_fns is None:
        raise ValueError("reward_model.generative=True: PPOStep needs the judge's host side (judge_fns)")
      self.judge = Judge(config, reward_model_config, layouts, judge_fns)
    elif reward_model_config:
      self.reward_model = Decoder(reward_model_config, head="reward", layout=layout("reward"))
    # On-policy distillation: the teacher, frozen, runs forward like the reference (its own architecture).
    self.distillation = Distillation.from_config(config)
    self.teacher = None
    if self.distillation is not None:
      if teacher_model_config is None:
        raise ValueError("distillation.enabled needs the teacher's model config (program.teacher_model_config)")
      self.teacher = Decoder(teacher_model_config, head="lm", layout=layout("actor"))
    self.layouts = layouts
    self.kl_warmup_steps = kl_warmup_steps
    self.sampling = SamplingParams.from_rollout_config(
      config.actor_rollout_ref.rollout, config.data.max_response_length, eos_token_ids, pad_token_id
    )
    self.generation = Generation(config, model_config, self.sampling, layouts)
    # The LM head's chunks keep the forward's split: by rows (and length under sequence parallelism).
    self.outputs = ModelOutputs(
      self.actor,
      self.critic,
      self.sampling.logprob_temperature,
      config.actor_rollout_ref.model.logits_chunk_size,
      num_batch_shards,
      self.actor.layout.constrain if self.actor.layout else (lambda x, logical_axes: x),
    )
    # A sequence-parallel group shares its rows: batch shards (verl's data-parallel size) are devices / sp.
    # Packing pays only when it saves more backbone work than its heads add (`packing.packing_pays`).
    seq_len = config.data.max_prompt_length + config.data.max_response_length
    self.batcher = update_loop.MicroBatcher(
      config,
      num_batch_shards,
      {path: sp_sizes[name] for name, path in ROLE_PATHS.items()},
      head_costs={
        ROLE_PATHS["actor"]: flops.head_cost(model_config, "lm", seq_len),
        ROLE_PATHS["critic"]: flops.head_cost(critic_model_config or model_config, "value", seq_len),
      },
    )
    self.plan = plan = PhasePlan.from_config(config, model_config, critic_model_config or model_config)
    self.roles = {
      name: TrainedRole(
        name=name,
        section=section,
        model=model,
        tx=optimizers[name],
        lr_schedule=lr_schedules[name],
        packed=packed,
        sequence_parallel=sp_sizes[name],
        layouts=layouts.role(name),
      )
      for name, section, model, packed in (
        ("actor", actor, self.actor, plan.actor_packed),
        ("critic", config.critic, self.critic, plan.critic_packed),
      )
    }
    self.ref_device = layouts.actor.reference_device(layouts.ref_device)
    correction = config.algorithm.rollout_correction if plan.bypass else None
    self.actor_loss = functools.partial(
      losses.actor_loss,
      outputs=self.outputs,
      actor=actor,
      on_policy=plan.on_policy,
      rollout_correction=correction,
      distillation=self.distillation,
    )
    self.first_epoch_actor_loss = functools.partial(self.actor_loss, first_epoch=True) if plan.old_in_update else None
    self.critic_loss = functools.partial(losses.critic_loss, outputs=self.outputs, critic=config.critic)
    self.losses = {"actor": self.actor_loss, "critic": self.critic_loss}

  # ----- gen and reward ----------------------------------------------------------------------

  def rollout(self, actor: RoleState, batch, rng) -> Rollout:
    """Phase `gen` (`generation.Generation.rollout`); `actor`: the actor's weights (`RoleState.weights`)."""
    return self.generation.rollout(actor, batch, rng)

  def score(self, rollout: Rollout, reward_params=None) -> Scored:
    """Phase `reward` (`reward.score_rollout`)."""
    return reward.score_rollout(
      self.config.reward_model, self.reward_fn, self.reward_model, reward_params, rollout, judge=self.judge
    )

  # ----- forward-only phases: old/ref log-probs, values ---------------------------------------

  def _forward_phase(self, outputs_fn, rollout: Rollout, role: str, phase: str):
    role = self.roles[role]
    seq_len = rollout.prompts.shape[1] + rollout.responses.shape[1]
    batching = self.batcher.phase_plan(
      role.section,
      role.path,
      rollout.responses.shape[0],
      seq_len,
      role.packed,
      self.batcher.forward_micro_per_device[phase],
    )
    return update_loop.forward_phase(outputs_fn, rollout.sequences(), batching, self.layouts.to_train)

  def old_log_prob(self, actor: RoleState, rollout: Rollout, ref_params=None) -> OldLogProbs:
    """Phase `old_log_prob`: the rollout policy's log-probs; `actor`: its weights (`RoleState.weights`).
    Its metrics hold the entropy (`actor/entropy`, as verl); `sum_pi_squared` feeds the optimal token
    baselines. With `ref_params` (full KL in the reward) also `full_kl` and `ref_log_probs`. Bypass mode: the
    old log-probs are the sampler's (`rollout_log_probs`). With `plan.old_in_update` the actor update's first
    epoch gives them (and the entropy): log-probs None, no metrics."""
    if self.plan.old_in_update:
      return OldLogProbs(log_probs=None, metrics={})
    if not self.plan.old_forward:
      return OldLogProbs(log_probs=rollout.rollout_log_probs, metrics={})
    section = self.roles["actor"].section
    statistics = ("entropy",) + (("sum_pi_squared",) if self.plan.sum_pi_squared else ())
    if ref_params is not None:
      ref_params = self.layouts.fetch(ref_params, self.ref_device)
    actor = self.roles["actor"].layouts.on_device(actor)
    out = jax.lax.stop_gradient(
      self._forward_phase(
        lambda micro: self.outputs.token_outputs(
          actor.params, micro, statistics, actor.adapters, ref_params, replay=True
        ),
        rollout,
        "actor",
        "old_log_prob",
      )
    )
    entropy = algos.agg_loss(
      out["entropy"], rollout.response_mask, section.loss_agg_mode, loss_scale_factor=section.loss_scale_factor
    )
    gap = rollout_probs_diff(rollout.rollout_log_probs, out["log_prob"], rollout.response_mask)
    return OldLogProbs(
      log_probs=rollout.rollout_log_probs if self.plan.bypass else out["log_prob"],
      metrics={"actor/entropy": entropy, **gap},
      sum_pi_squared=out.get("sum_pi_squared"),
      full_kl=out.get("full_kl"),
      ref_log_probs=out.get("ref_log_prob"),
    )

  def reference_params(self, state: TrainState):
    """The reference policy's weights: its own copy, or with LoRA the actor's base (run without adapters)."""
    return state.actor.reference(state.ref_params)

  def ref_log_prob(self, ref_params, rollout: Rollout):
    ref_params = self.layouts.fetch(ref_params, self.ref_device)
    return self._forward_phase(lambda micro: self.outputs.token_outputs(ref_params, micro), rollout, "actor", "ref")[
      "log_prob"
    ]

  def teacher_log_probs(self, teacher_params, rollout: Rollout) -> dict:
    """Phase `teacher` (distillation): the teacher's log-probs of the sampled tokens, or its top-k log-probs and
    ids (`Distillation.teacher_data`), batched like the reference's forward."""
    topk = self.distillation.topk if self.distillation.uses_topk else 0
    out = self._forward_phase(
      lambda micro: self.outputs.teacher_outputs(self.teacher, teacher_params, micro, topk), rollout, "actor", "ref"
    )
    return self.distillation.teacher_data(out)

  def critic_values(self, critic: RoleState, rollout: Rollout):
    """Phase `values`; `critic`: the critic's weights (`RoleState.weights`)."""
    critic = self.roles["critic"].layouts.on_device(critic)
    outputs_fn = lambda micro: self.outputs.values(critic.params, micro, critic.adapters)
    return self._forward_phase(outputs_fn, rollout, "critic", "values") * rollout.response_mask.astype(jnp.float32)

  # ----- adv and the updates ----------------------------------------------------------------------

  def kl_gate(self, step):
    """0.0 during the KL warm-up (no KL term in reward or loss), else 1.0."""
    return (step >= self.kl_warmup_steps).astype(jnp.float32)

  def advantages(
    self, state: TrainState, rollout: Rollout, scored: Scored, old: OldLogProbs, ref_log_probs, values
  ) -> Advantages:
    """Phase `adv` (`advantage.advantages`)."""
    return advantage.advantages(
      self.config.algorithm,
      decoupled_correction=self.plan.decoupled_correction,
      kl_coef=state.kl_coef,
      kl_gate=self.kl_gate(state.step),
      rollout=rollout,
      scored=scored,
      old=old,
      ref_log_probs=ref_log_probs,
      values=values,
    )

  def update(self, name: str, state: TrainState, data: dict, rng):
    """Phase `update_<name>`: PPO epochs of role `name`'s loss (the actor's skipped during `critic_warmup`).

    Returns (the role's new `RoleState`, metrics). What trains is `RoleState.trained`; the rest of the role's
    weights (with LoRA the frozen base) ride in the loss's aux as `frozen` (`RoleState.frozen`)."""
    role, role_state = self.roles[name], state.role(name)
    aux, warmup_steps, first_epoch_loss_fn = {}, 0, None
    if name == "actor":
      warmup_steps, first_epoch_loss_fn = self.plan.actor_warmup_steps, self.first_epoch_actor_loss
      aux["kl_gate"] = self.kl_gate(state.step)
      if self.plan.full_kl_loss:
        aux["ref_params"] = self.layouts.fetch(self.reference_params(state), self.ref_device)
    updates_done = jnp.maximum(state.step - warmup_steps, 0)  # the role's lr schedule's own step
    lr = role.lr_schedule(updates_done) * state.lr_scale
    seq_len = data["prompts"].shape[1] + data["responses"].shape[1]

    def run(trained, opt_state):
      device = role.layouts.on_device(role_state.with_trained(trained, opt_state))
      trained, opt_state, metrics = update_loop.ppo_update(
        self.losses[name],
        device.trained,
        device.opt_state,
        dict(aux, frozen=device.frozen),
        data,
        rng,
        tx=role.tx,
        lr=lr,
        batching=self.batcher.update_plan(role.section, role.path, seq_len, role.packed),
        mini_batch_rows=role.section.ppo_mini_batch_size * self.batcher.n,
        epochs=role.section.ppo_epochs,
        shuffle=role.section.shuffle,
        loss_agg_mode=role.section.loss_agg_mode,
        prefix=name,
        to_train=self.layouts.to_train,
        loss_scale_factor=role.section.loss_scale_factor,
        pin_grads=functools.partial(self.layouts.pin_gradients, role=name),
        first_epoch_loss_fn=first_epoch_loss_fn,
      )
      if name == "actor" and role.section.use_kl_loss:
        metrics["actor/kl_coef"] = aux["kl_gate"] * role.section.kl_loss_coef
      stored = role.layouts.store(role_state, trained, opt_state)
      return stored.trained, stored.opt_state, metrics

    trained, opt_state, metrics = update_loop.update_after_warmup(
      run, warmup_steps, state.step, role_state.trained, role_state.opt_state
    )
    return role_state.with_trained(trained, opt_state), metrics

  def update_critic(self, state: TrainState, data: dict, rng):
    """Phase `update_critic`: `data` holds the values and returns. -> (the critic's RoleState, metrics)"""
    return self.update("critic", state, data, rng)

  def update_actor(self, state: TrainState, data: dict, rng):
    """Phase `update_actor` (after `critic_warmup`). -> (the actor's RoleState, metrics)"""
    return self.update("actor", state, data, rng)

  # ----- composition --------------------------------------------------------------------------
  # One composition for every mode: `run(name, fn, *args)` runs each phase. The fused step traces them
  # into one program (`inline`); phased mode jits and times each (`phased.PhasedStep`), `jaxrlhf.aot`
  # compiles each for a target. Phases named None are small glue programs.

  @staticmethod
  def split_rng(rng):
    return dict(zip(("gen", "actor", "critic"), jax.random.split(rng, 3)))

  def generate_and_score(
    self, state: TrainState, batch: dict, rng, run: Callable | None = None
  ) -> tuple[Rollout, Scored]:
    """Phases gen and reward: (rollout, scored)."""
    run = run or inline
    rollout = run("gen", self.rollout, state.actor.weights, batch, self.split_rng(rng)["gen"])
    return rollout, run("reward", self.score, rollout, state.reward_params)

  def train_on_rollout(self, state: TrainState, rollout: Rollout, scored: Scored, rng, run: Callable | None = None):
    """Everything after the reward: old_log_prob, ref, values, adv, update_critic, update_actor, then the new
    state and the metrics. One program in the fused step and for DAPO's rounds."""
    run, plan, keys = run or inline, self.plan, self.split_rng(rng)
    if plan.old_in_update:  # the update's first epoch gives them: no phase
      old = self.old_log_prob(state.actor.weights, rollout)
    else:
      ref_params = self.reference_params(state) if plan.full_kl_in_reward else None
      old = run("old_log_prob", self.old_log_prob, state.actor.weights, rollout, ref_params)
    if plan.ref_phase:
      ref_log_probs = run("ref", self.ref_log_prob, self.reference_params(state), rollout)
    else:
      ref_log_probs = old.ref_log_probs
    teacher = None
    if self.distillation is not None:
      teacher = run("teacher", self.teacher_log_probs, state.teacher_params, rollout)
    values = None
    if plan.use_critic:
      values = run("values", self.critic_values, state.critic.weights, rollout)
    adv = run("adv", self.advantages, state, rollout, scored, old, ref_log_probs, values)
    data = run(None, update_loop.update_data, rollout, old, ref_log_probs, adv, teacher)
    results = {}  # role -> (its new RoleState, metrics)
    if plan.use_critic:
      critic_data = dict(data, values=values, returns=adv.returns)
      results["critic"] = run("update_critic", self.update_critic, state, critic_data, keys["critic"])
    results["actor"] = run("update_actor", self.update_actor, state, data, keys["actor"])
    return run(None, self.finish, state, rollout, scored, old.metrics, values, adv, results)

  def finish(self, state, rollout, scored, old_metrics, values, adv, results) -> tuple[TrainState, dict]:
    """The new state and the step's metrics from the phases' outputs."""
    metrics = {**old_metrics, **adv.metrics}
    roles = {}
    for role, (role_state, role_metrics) in results.items():
      roles[role] = role_state
      metrics.update(role_metrics)
    metrics.update(
      batch_metrics(
        rollout, scored, adv, values, self.config.data.max_prompt_length, self.config.algorithm.gdpo_reward_keys or ()
      )
    )
    return state.replace(step=state.step + 1, kl_coef=adv.kl_coef, **roles), metrics

  def __call__(self, state: TrainState, batch: dict[str, jax.Array], rng) -> tuple[TrainState, dict]:
    """The fused step: every phase in one program. With a carried rollout (trainer.v1.trainer_mode=colocate_async)
    the batch joins the pool and the step trains on the groups the pool has finished (`Generation.partial_rollout`)."""
    if state.carried is None:
      rollout, scored = self.generate_and_score(state, batch, rng)
      return self.train_on_rollout(state, rollout, scored, rng)
    rollout, carried, gen_metrics = self.generation.partial_rollout(
      state.actor.weights, state.carried, batch, self.split_rng(rng)["gen"], state.step
    )
    scored = self.score(rollout, state.reward_params)
    state, metrics = self.train_on_rollout(state.replace(carried=carried), rollout, scored, rng)
    return state, {**metrics, **gen_metrics}

  def admit(self, state: TrainState, batch: dict[str, jax.Array]) -> TrainState:
    """A warm-up batch (verl's `num_warmup_batches`) admitted to the carried pool before the first step."""
    return state.replace(carried=self.generation.admit(state.carried, batch, state.step))


def inline(name, fn, *args):
  """The fused step's phase runner: each phase traced into the caller's program."""
  del name
  return fn(*args)
