"""The host side of training: build everything from a config, run the fused step, validate, log.

Data flows one way: dataset batch (host) -> `jitted_step` (one compiled program, state donated) ->
metrics (host) -> sinks. Validation is a second compiled program (greedy by `val_kwargs`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxrlhf.checkpoint import Checkpointer, CheckpointError, resume_changes, split_step_dir
from jaxrlhf.config import ConfigError, resolve_config, reward_model_head
from jaxrlhf.data import BatchSchedule, batch_arrays, build_dataset, longest_prompt, process_rows
from jaxrlhf.data.builtin import build_tokenizer
from jaxrlhf.errors import UserError
from jaxrlhf.models import generation_eos_ids, load_hf_params, load_tokenizer, pad_token_id
from jaxrlhf.parallel import batch_sharding, replicated
from jaxrlhf.parallel.mesh import fsdp_size, mesh_from_config
from jaxrlhf.rollout import SamplingParams, pick_bucket, prompt_length_buckets
from jaxrlhf.tools.registry import load_tools
from jaxrlhf.tracking import Tracking, maybe_profile, plot_metrics, truncate_jsonl
from jaxrlhf.trainer.dumps import RolloutDump
from jaxrlhf.trainer.flops import actor_step_flops, count_params, device_peak_flops, update_flops
from jaxrlhf.trainer.guards import Guard
from jaxrlhf.trainer.hf_weights import actor_base_params, critic_base_params, init_keys, write_hf
from jaxrlhf.trainer.judge import HostJudging, JudgeFns, JudgeHost, judge_score_function, judge_scorer, make_judge_fns
from jaxrlhf.trainer.multi_turn import MultiTurnGeneration, tools_kwargs_notes
from jaxrlhf.trainer.phased import PhasedStep, timed
from jaxrlhf.trainer.preemption import Preempted, StopSignal
from jaxrlhf.trainer.program import BaseWeights, build_program, model_configs, teacher_model_config
from jaxrlhf.trainer.reward import (
  PREFLIGHT_ROWS,
  host_callback_errors,
  make_reward_fn,
  preflight,
  reward_scorer,
  uses_judge,
  uses_rule_reward,
)
from jaxrlhf.trainer.run_lock import RunLock
from jaxrlhf.trainer.state import TrainState
from jaxrlhf.trainer.step_modes import (
  StepBatches,
  abstract_batches,
  actor_update_metric_names,
  batch_layout,
  generation_mode,
  step_mode,
)
from jaxrlhf.trainer.validation import Validation, make_validation_fn
from jaxrlhf.validate import check_data_sources_known, first_rows, validate_run


def tokenizer_from_config(config, save_dir: str):
  """data.tokenizer, else the actor's model path; `builtin:<task>` builds and saves the built-in one."""
  name = config.data.tokenizer or config.actor_rollout_ref.model.path
  if not name:
    raise ConfigError("no tokenizer: set data.tokenizer (e.g. 'builtin:recall') or actor_rollout_ref.model.path")
  if name.startswith("builtin:"):
    # Written next to the run so users can load it the usual way; `builtin:lookup` has the tool task's words.
    build_tokenizer(save_dir=save_dir, task=name.split(":", 1)[1])
    name = save_dir
  tokenizer = load_tokenizer(name)
  if config.actor_rollout_ref.model.custom_chat_template is not None:  # verl's: replaces the tokenizer's template
    tokenizer.chat_template = config.actor_rollout_ref.model.custom_chat_template
  return tokenizer


def _outermost_missing(path: str) -> str | None:
  """The outermost folder of `path` that does not exist yet (None: all of it exists)."""
  path, missing = os.path.abspath(path), None
  while not os.path.lexists(path):
    path, missing = os.path.dirname(path), path
  return missing


def _remove_new_run_dir(run_dir: str, outermost: str) -> None:
  """Removes a run directory this run made (only it wrote there: it held the lock), then its parents up to
  `outermost` while they are empty (another run may have made its own directory beside it meanwhile)."""
  shutil.rmtree(run_dir, ignore_errors=True)
  folder = os.path.dirname(os.path.abspath(run_dir))
  while len(folder) >= len(outermost):
    try:
      os.rmdir(folder)
    except OSError:
      return
    folder = os.path.dirname(folder)


def _put_global(x, sharding) -> jax.Array:
  """A host array every process holds whole -> a global array: each process places its own devices' part
  (`device_put` would also compare the processes' copies, and a NaN, as in `Rollout.tool_rewards`, never equals
  itself)."""
  if jax.process_count() == 1:
    return jax.device_put(x, sharding)
  x = np.asarray(x)
  return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


class Trainer:
  def __init__(self, config: ml_collections.ConfigDict, devices=None):
    """`devices`: the devices of the mesh (default: all); tests and notebooks pass a subset."""
    self.config = config = resolve_config(config)
    self.compute_score = compute_score = validate_run(config)  # paths, data, reward fns: before anything heavy
    trainer_cfg = config.trainer
    self.run_dir = os.path.join(trainer_cfg.default_local_dir, trainer_cfg.project_name, trainer_cfg.experiment_name)
    new_dir = _outermost_missing(self.run_dir)
    os.makedirs(self.run_dir, exist_ok=True)
    self.run_lock = RunLock(self.run_dir)
    if jax.process_index() == 0:  # refused before anything heavy; held again (same process) while fit() runs
      self.run_lock.acquire()
    self.reward_scorer = reward_scorer(config.reward_model, compute_score)  # in this process or in workers
    try:
      if compute_score is not None and uses_rule_reward(config.reward_model):  # user code: tried before compiling
        rows = first_rows(config.data.train_files, 64 * PREFLIGHT_ROWS)
        preflight(self.reward_scorer, rows, "data.train_files", config.data.reward_fn_key)
      self.mesh = mesh_from_config(config, devices)
      self._load_data(config, compute_score)
    except UserError:
      self.reward_scorer.close()
      if new_dir and jax.process_index() == 0:  # a refused run leaves no run directory (nor its lock) behind
        _remove_new_run_dir(self.run_dir, new_dir)
      raise
    self.num_batch_shards = self.mesh.shape["data"] * fsdp_size(self.mesh)
    data_cfg = config.data

    self.model_config, self.critic_model_config, self.reward_model_config = model_configs(config, self.tokenizer)
    self.teacher_model_config = teacher_model_config(config, self.model_config)
    eos_ids = generation_eos_ids(config.actor_rollout_ref.model.path or None, self.tokenizer)
    pad_id = pad_token_id(self.tokenizer, eos_ids)
    # GDPO's reward components: entries of the dict the reward function returns, one advantage each.
    components = tuple(config.algorithm.gdpo_reward_keys or ()) if config.algorithm.adv_estimator == "gdpo" else ()
    dump_dir = trainer_cfg.rollout_data_dir
    self.rollout_dump = RolloutDump(dump_dir) if dump_dir and jax.process_index() == 0 else None
    reward_fn = make_reward_fn(
      self.tokenizer, self.train_data, self.reward_scorer, config.reward_model.on_error, components, self.rollout_dump
    )
    self.judge_host, judge_fns = None, None
    if uses_judge(config.reward_model):  # a generative reward model: its own tokenizer, its parser tried now
      self.judge_host, judge_fns = self._judge(config, self.reward_model_config)
    self.program = build_program(
      config,
      self.mesh,
      model_config=self.model_config,
      critic_model_config=self.critic_model_config,
      reward_model_config=self.reward_model_config,
      reward_fn=reward_fn,
      eos_token_ids=eos_ids,
      pad_token_id=pad_id,
      total_steps=self.total_steps,
      judge_fns=judge_fns,
      teacher_model_config=self.teacher_model_config,
    )
    self.ppo, self.layouts = self.program.ppo, self.program.layouts
    state_shardings = self.program.state_shardings
    self.state = self._init_state()
    self.jitted_step = self.program.jit_step()
    self.phased = PhasedStep(self.ppo, state_shardings, replicated(self.mesh))
    val_sampling = validate_program = None
    if self.val_data is not None:
      val_sampling = SamplingParams.from_rollout_config(
        config.actor_rollout_ref.rollout, data_cfg.max_response_length, eos_ids, pad_id, validation=True
      )
      validate_program = jax.jit(
        make_validation_fn(self.ppo, val_sampling),
        in_shardings=(state_shardings.actor.weights, state_shardings.reward_params, None, replicated(self.mesh)),
        out_shardings=replicated(self.mesh),
      )
    multi_turn = None
    if config.actor_rollout_ref.rollout.multi_turn.enable:
      # Phase gen is a host loop of compiled turns; the training phases after it stay one program.
      multi_turn = MultiTurnGeneration(self.ppo, self.tokenizer, self.train_data, self._device_batch, self.tools)
    self.generation = generation_mode(
      config,
      self.phased,
      multi_turn=multi_turn,
      validate_program=validate_program,
      load_batch=self._load_batch,
      val_sampling=val_sampling,
      put=self._device_batch,
    )
    self.step_mode = step_mode(config.trainer.fuse_step, self.generation, self.phased, self.jitted_step)
    self._skipped_in_warmup: tuple[str, ...] | None = None  # `step_modes.actor_update_metric_names`, once
    self.gen_cursor = 0  # generation rounds drawn so far (dynamic sampling); saved in checkpoints
    self.actor_num_params = count_params(self.state.actor.params)
    self.peak_flops = device_peak_flops(self.mesh.devices.flat[0], trainer_cfg.peak_flops_per_device)
    self.rng = jax.random.key(trainer_cfg.seed)
    self.validation = None
    if self.val_data is not None:
      judging = None
      if self.judge_host is not None:
        judging = HostJudging(
          self.ppo.judge, self.judge_host.with_dataset(self.val_data), state_shardings.reward_params
        )
      self.validation = Validation(
        config, self.generation, self.val_data, self.tokenizer, self.reward_scorer, self.run_dir, self.rng, judging
      )

  # ----- set-up ----------------------------------------------------------------------------------

  def _load_data(self, config, compute_score) -> None:
    """Tokenizer, datasets and batch schedules: every data error before anything is built or compiled."""
    data_cfg, trainer_cfg = config.data, config.trainer
    self.tokenizer = tokenizer_from_config(config, os.path.join(self.run_dir, "tokenizer"))
    multi_turn = config.actor_rollout_ref.rollout.multi_turn
    # Multi-turn: the prompts are rendered with the tools' schemas (verl's `apply_chat_template(..., tools=)`).
    self.tools = load_tools(multi_turn.tool_config_path) if multi_turn.enable else None
    dataset_kwargs = dict(
      tools=[tool.tool_schema.to_dict() for tool in self.tools.values()] if self.tools else None,
      chat_template_kwargs={
        key: value for key, value in data_cfg.apply_chat_template_kwargs.items() if value is not None
      },
      max_prompt_length=data_cfg.max_prompt_length,
      prompt_key=data_cfg.prompt_key,
      reward_fn_key=data_cfg.reward_fn_key,
      truncation=data_cfg.truncation,
      filter_overlong_prompts=data_cfg.filter_overlong_prompts,
      # verl's train/val_max_samples: a subset drawn with the prompt order's seed, chosen before tokenizing.
      shuffle=data_cfg.shuffle,
      seed=data_cfg.seed,
    )
    self.train_data = build_dataset(
      data_cfg.train_files, self.tokenizer, max_samples=data_cfg.train_max_samples, **dataset_kwargs
    )
    self.val_data = (
      build_dataset(data_cfg.val_files, self.tokenizer, max_samples=data_cfg.val_max_samples, **dataset_kwargs)
      if any(data_cfg.val_files)
      else None
    )
    for key, dataset, split in (
      ("data.train_files", self.train_data, "train"),
      ("data.val_files", self.val_data, "val"),
    ):
      if dataset is None:
        continue
      for note in (dataset.sampling_note(key, f"data.{split}_max_samples"), dataset.filtering_note(key)):
        if note:
          print(note, flush=True)
      if self.tools:
        for note in tools_kwargs_notes(dataset.extra_infos, set(self.tools), key):
          print(note, flush=True)
    if compute_score is None and (not config.reward_model.enable or config.reward_model.combine_with_rule):
      # validate_run saw a sample of each file; every row is here now, still before anything compiles.
      check_data_sources_known(self.train_data.data_sources, "data.train_files")
      if self.val_data is not None:
        check_data_sources_known(self.val_data.data_sources, "data.val_files")
    schedule = lambda key, batch_size: BatchSchedule(
      len(self.train_data),
      batch_size,
      seed=data_cfg.seed,
      shuffle=data_cfg.shuffle,
      key=key,
      num_dropped=self.train_data.num_filtered,
    )
    self.schedule = schedule("data.train_batch_size", data_cfg.train_batch_size)
    self.gen_schedule = schedule(
      "data.gen_batch_size" if data_cfg.gen_batch_size else "data.train_batch_size",
      data_cfg.gen_batch_size or data_cfg.train_batch_size,
    )
    self.total_steps = trainer_cfg.total_training_steps or self.schedule.batches_per_epoch * trainer_cfg.total_epochs

  def _judge(self, config, judge_config) -> tuple[JudgeHost, JudgeFns]:
    """A generative reward model's host side: the judge's tokenizer (checked against its vocabulary), its parser
    (`reward_model.judge.score_function`) and where it runs, the judge's generation ids."""
    path = config.reward_model.model.path
    judge_tokenizer = load_tokenizer(path)
    if len(judge_tokenizer) > judge_config.vocab_size:
      raise ConfigError(
        f"reward_model.model.path={path!r}: the judge's tokenizer has {len(judge_tokenizer)} tokens but its "
        f"vocab_size is {judge_config.vocab_size}"
      )
    scorer = judge_scorer(config.reward_model, judge_score_function(config.reward_model))
    host = JudgeHost(
      config.reward_model, self.tokenizer, judge_tokenizer, self.train_data, scorer, dump=self.rollout_dump
    )
    eos_ids = generation_eos_ids(path, judge_tokenizer)
    return host, make_judge_fns(host, eos_ids, pad_token_id(judge_tokenizer, eos_ids))

  def layout_report(self) -> str:
    """Mesh, per-layout sharding of each parameter group, per-device bytes (printed at start-up)."""
    return self.program.layout_report()

  def _init_state(self) -> TrainState:
    """Loads the base weights (checkpoints, or initialised from `trainer.seed`) and builds the state from them
    straight into the program's shardings (`StepProgram.init_state`)."""
    config, plan, shardings = self.config, self.ppo.plan, self.program.state_shardings
    actor_key, critic_key = init_keys(config)
    actor_params = actor_base_params(config, self.model_config, self.layouts.actor_train)
    critic_params = reward_params = None
    if plan.use_critic:  # verl's critic format, the actor's checkpoint with a fresh value head, or all fresh
      critic_params = critic_base_params(config, self.critic_model_config, self.layouts.critic_train)
    if self.reward_model_config is not None:
      reward_params = load_hf_params(
        config.reward_model.model.path,
        self.reward_model_config,
        head=reward_model_head(config),
        shardings=shardings.reward_params,
      )
    teacher_params = None
    if self.teacher_model_config is not None:
      teacher_params = load_hf_params(
        config.distillation.teacher_model.model_path,
        self.teacher_model_config,
        head="lm",
        shardings=shardings.teacher_params,
      )
    base = BaseWeights(actor=actor_params, critic=critic_params, reward=reward_params, teacher=teacher_params)
    return self.program.init_state(base, actor_key, critic_key)

  def _device_batch(self, arrays):
    """A tree (a dict, a record) of global host arrays -> arrays in the batch layout (scalars replicated)."""
    return jax.tree.map(_put_global, arrays, batch_layout(self.mesh, arrays))

  def _prompt_width(self, dataset, indices: np.ndarray) -> int:
    """`data.bucket_prompt_lengths`: the batch's longest prompt rounded up to a bucket; else max_prompt_length."""
    max_prompt_length = self.config.data.max_prompt_length
    if not self.config.data.bucket_prompt_lengths:
      return max_prompt_length
    return pick_bucket(longest_prompt(dataset, indices), prompt_length_buckets(max_prompt_length))

  def _load_batch(self, dataset, indices: np.ndarray) -> dict[str, jax.Array]:
    """A global batch of dataset rows where each process reads only its own share of the rows.

    Every process sees the whole data set, so all agree on the batch's prompt width.
    """
    width = self._prompt_width(dataset, indices)
    if jax.process_count() == 1:
      return self._device_batch(batch_arrays(dataset, indices, width))
    local = batch_arrays(dataset, process_rows(indices, jax.process_index(), jax.process_count()), width)
    return {
      k: jax.make_array_from_process_local_data(
        batch_sharding(self.mesh, (len(indices),) + v.shape[1:]), v, (len(indices),) + v.shape[1:]
      )
      for k, v in local.items()
    }

  def train_batch(self, step: int) -> dict[str, jax.Array]:
    """Batch `step` of the training schedule, on the mesh: what `train_step` feeds the step (notebooks run
    its phases one by one on it: `self.phased.generate_and_score` then `self.phased.train`)."""
    return self._load_batch(self.train_data, self.schedule.indices(step))

  def step_batches(self, step: int) -> StepBatches:
    """Where step `step` draws its prompts: batch `step` of the schedule (with colocate_async's warm-up batches
    the schedule's first batches were admitted before step 0: batch `step + num_warmup_batches`), or dynamic
    sampling's rounds."""
    ahead = self.ppo.generation.warmup_batches
    return StepBatches(train=lambda: self.train_batch(step + ahead), gen_round=self._next_gen_round)

  def warm_up_pool(self) -> None:
    """trainer.v1.trainer_mode=colocate_async on a fresh run: batches 0 .. num_warmup_batches - 1 admitted to the
    carried pool before step 0 (verl's warm-up batches; a resumed run's pool comes back with its checkpoint)."""
    admit = self.program.jit_admit()
    for batch in range(self.ppo.generation.warmup_batches):
      self.state = admit(self.state, self.train_batch(batch))

  def _next_gen_round(self) -> dict[str, jax.Array]:
    """The next round of dynamic sampling (`data.gen_batch_size` prompts): the generation cursor moves on."""
    indices = self.gen_schedule.indices(self.gen_cursor)
    self.gen_cursor += 1
    return self._load_batch(self.train_data, indices)

  # ----- running ---------------------------------------------------------------------------------

  def train_step(self, step: int) -> dict[str, float]:
    """One PPO step on batch `step` of the schedule (fused, phased or with dynamic sampling); host metrics."""
    rng = jax.random.fold_in(self.rng, step)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    with host_callback_errors():  # a reward function's own error, not XLA's wrapping of it
      self.state, device_metrics, host_metrics = self.step_mode.run(
        self.state, self.step_batches(step), rng, timed(timings)
      )
      metrics = {k: float(v) for k, v in jax.device_get(device_metrics).items()}
    actor_updated = self.ppo.plan.actor_updates_at(step)
    if not actor_updated:  # verl reports no actor metrics for a step whose actor did not update
      for key in self._actor_update_metric_names(rng):
        metrics.pop(key, None)
    elapsed = time.perf_counter() - start
    metrics.update(host_metrics)  # generation rounds; turns per trajectory, tool calls and errors, tool time
    tokens = metrics["perf/total_num_tokens"]
    response_tokens = metrics["response_length/mean"] * self._num_sequences
    for phase, seconds in timings.items():
      metrics[f"timing_s/{phase}"] = seconds
      phase_tokens = response_tokens if phase == "gen" else tokens  # verl: gen per response token
      metrics[f"timing_per_token_ms/{phase}"] = 1000.0 * seconds / max(phase_tokens, 1.0)
    metrics["timing_s/step"] = elapsed
    metrics["perf/time_per_step"] = elapsed
    metrics["perf/throughput"] = tokens / elapsed / self.mesh.size
    metrics.update(self._mfu(metrics, timings, elapsed, actor_updated))
    metrics["training/global_step"] = step + 1
    metrics["training/epoch"] = self.schedule.epoch_of(step)
    if self.rollout_dump is not None:
      self.rollout_dump.write(step + 1)  # verl's <rollout_data_dir>/<global step>.jsonl
    return metrics

  @property
  def _num_sequences(self) -> int:
    return self.config.data.train_batch_size * self.config.actor_rollout_ref.rollout.n

  def _mfu(self, metrics, timings: dict[str, float], elapsed: float, actor_updated: bool) -> dict[str, float]:
    """`perf/mfu/{actor,critic}`: an update phase's model FLOPs over its time x devices x the peak (verl's).

    The fused step times no phase, so it has no update MFU (verl's meaning): `perf/mfu/step` is the
    actor's FLOPs of the whole step (rollout, log-probs, updates) over the step time instead.
    """
    n, peak = self._num_sequences, self.mesh.size * self.peak_flops
    tokens = dict(prompt_tokens=metrics["prompt_length/mean"] * n, response_tokens=metrics["response_length/mean"] * n)
    if "update_actor" not in timings:
      return {
        "perf/mfu/step": actor_step_flops(
          self.model_config,
          self.actor_num_params,
          **tokens,
          num_sequences=n,
          ppo_epochs=self.config.actor_rollout_ref.actor.ppo_epochs,
          use_reference=self.ppo.plan.use_reference,
          old_forward=not self.ppo.plan.old_in_update,
        )
        / (elapsed * peak)
      }
    mfu = {}
    phases = [("critic", self.critic_model_config, self.config.critic, "value")] if self.ppo.plan.use_critic else []
    if actor_updated:
      phases.append(("actor", self.model_config, self.config.actor_rollout_ref.actor, "lm"))
    for name, model_config, section, head in phases:
      flops = update_flops(model_config, **tokens, num_sequences=n, epochs=section.ppo_epochs, head=head)
      mfu[f"perf/mfu/{name}"] = flops / (timings[f"update_{name}"] * peak)
    return mfu

  def _actor_update_metric_names(self, rng) -> tuple[str, ...]:
    if self._skipped_in_warmup is None:
      batches = abstract_batches(self.program)
      self._skipped_in_warmup = actor_update_metric_names(self.generation, self.phased, self.state, batches, rng)
    return self._skipped_in_warmup

  # ----- checkpoints and guards -------------------------------------------------------------------

  def save(self, checkpointer: Checkpointer, step: int) -> None:
    meta = {
      "step": step,
      "epoch": self.schedule.epoch_of(step),
      "data_seed": self.config.data.seed,
      "seed": self.config.trainer.seed,
      "gen_cursor": self.gen_cursor,
      "config": self.config.to_json(),
    }
    checkpointer.save(step, self.state, meta)
    if self.config.trainer.save_hf:
      self.export_hf(os.path.join(self.run_dir, "huggingface", f"global_step_{step}"))

  def _save_on_stop(self, checkpointer: Checkpointer, step: int) -> str:
    """Saves step `step` for a SIGTERM (unless checkpoints are off) and says what was kept, in one line."""
    resume = "trainer.resume_mode=auto continues from it"
    if self.config.trainer.save_freq <= 0:
      latest = checkpointer.latest_step()
      kept = f"the last checkpoint is step {latest}" if latest is not None else "the run has no checkpoint"
      return (
        f"SIGTERM after step {step}: not saved because trainer.save_freq={self.config.trainer.save_freq} "
        f"turns checkpoints off; {kept}"
      )
    if checkpointer.latest_step() != step:
      self.save(checkpointer, step)
    checkpointer.wait()
    return f"SIGTERM after step {step}: saved {checkpointer.step_dir(step)}; {resume}"

  def export_hf(self, out_dir: str) -> None:
    """The current actor as an HF causal LM in `out_dir` (the critic in `out_dir`/critic); with LoRA the
    adapters merged in, and alone in PEFT's layout in `out_dir`/lora_adapter."""
    critic = self.state.critic
    write_hf(
      self.state.actor,
      self.config,
      out_dir,
      critic=critic,
      critic_out=os.path.join(out_dir, "critic") if critic else None,
      tokenizer_dir=os.path.join(self.run_dir, "tokenizer"),
    )

  def resume(self, checkpointer: Checkpointer) -> int:
    """Restores per `trainer.resume_mode`; returns the step to continue from (0 for a fresh run).

    `auto` takes the newest checkpoint that reads back whole. Newer ones that do not (a file truncated
    after the save) are logged and renamed `unreadable_global_step_N` (kept, no longer steps). When
    none reads back, nothing is renamed: that is more likely a config that no longer fits the run.
    """
    config = self.config.trainer
    if config.resume_mode == "disable":
      return 0
    if config.resume_mode == "resume_path":
      directory, step = split_step_dir(config.resume_from_path)
      source = Checkpointer(directory)
      try:
        self.state, meta = source.restore(step, self.state, config=self.config)
      finally:
        source.close()
    else:
      unreadable: list[tuple[int, CheckpointError]] = []
      for step in sorted(checkpointer.all_steps(), reverse=True):
        try:
          self.state, meta = checkpointer.restore(step, self.state, config=self.config)
          break
        except CheckpointError as e:
          unreadable.append((step, e))
      else:
        if unreadable:
          raise CheckpointError(
            f"no checkpoint in {self.run_dir} can be restored; the newest: {unreadable[0][1]}",
            hint="if the model or optimizer config changed, start a new trainer.experiment_name (or "
            "trainer.resume_mode=disable)",
          ) from unreadable[0][1]
        return 0
      for bad_step, error in unreadable:
        kept = checkpointer.set_aside(bad_step)
        logging.warning(
          "%s; kept it as %s and resuming from step %d, the newest checkpoint that reads back", error, kept, step
        )
    self.gen_cursor = int(meta.get("gen_cursor", 0))
    step_dir = config.resume_from_path if config.resume_mode == "resume_path" else checkpointer.step_dir(step)
    print(f"resumed from step {step}: {step_dir}", flush=True)
    if "config" in meta:
      changes = resume_changes(json.loads(meta["config"]), json.loads(self.config.to_json()))
      if changes:
        print(f"resumed with {len(changes)} setting(s) changed since the checkpoint: {'; '.join(changes)}", flush=True)
    return int(step)

  def rollback(self, checkpointer: Checkpointer, guard: Guard, reason: str, metrics: dict, tracking) -> int:
    """Guard event: restore the last checkpoint, lower the lr, log the event; returns the step to redo."""
    guard.record_rollback(reason)  # raises GuardError past max_rollbacks
    checkpointer.wait()
    step = checkpointer.latest_step()
    lr_scale = float(self.state.lr_scale) * self.config.trainer.guard.lr_backoff
    self.state, meta = checkpointer.restore(step, self.state)
    self.gen_cursor = int(meta.get("gen_cursor", 0))
    self.state = self.state.replace(lr_scale=jax.device_put(jnp.float32(lr_scale), self.state.lr_scale.sharding))
    metrics.update(
      {
        "guard/rollback": 1.0,
        "guard/rollback_to_step": float(step),
        "guard/lr_scale": lr_scale,
        "guard/rollbacks": float(guard.rollbacks),
      }
    )
    tracking.log(metrics, step=int(metrics["training/global_step"]))
    tracking.write(f"guard: {reason}; rolled back to step {step}, lr scale now {lr_scale:g}")
    return int(step)

  def validate(self, step: int = 0) -> dict[str, float]:
    """Greedy (val_kwargs) generation on the validation set: val-core/<data_source>/reward/mean@n
    (`validation.Validation`). With trainer.log_val_generations = K, the first K samples go to
    <run dir>/val_generations.jsonl."""
    return self.validation(self.state, step)

  def fit(self) -> list[dict]:
    """Runs to `total_steps` with validation, checkpoints and guards; returns the step records.

    Resumes per `trainer.resume_mode`; writes metrics.jsonl (on resume, after cutting the records of the
    steps past the checkpoint, which it writes again) and the plot. Holds the run directory's lock while it
    runs; SIGTERM ends it after the step in flight with a checkpoint of that step (raises `Preempted`).
    """
    config = self.config.trainer
    if jax.process_index() == 0:
      self.run_lock.acquire()  # this process's lock again (released when the last fit() ended)
    try:
      with StopSignal() as stop:
        return self._fit(config, stop)
    finally:
      self.reward_scorer.close()  # stops its reward worker processes, if any (another fit() starts them again)
      if self.judge_host is not None:
        self.judge_host.scorer.close()
      if jax.process_index() == 0:
        self.run_lock.release()

  def _fit(self, config, stop: StopSignal) -> list[dict]:
    checkpointer = Checkpointer(self.run_dir, max_to_keep=config.max_actor_ckpt_to_keep or None)  # 0: all (verl's)
    try:
      start_step = self.resume(checkpointer)
    except BaseException:  # a refused or failed resume: its checkpoint readers closed, not left to the collector
      checkpointer.close()
      raise
    if start_step >= self.total_steps:
      checkpointer.close()
      print(
        f"{self.run_dir}: already complete: the checkpoint at step {start_step} is at or past "
        f"trainer.total_training_steps={self.total_steps}; nothing to train (raise total_training_steps "
        "to continue it)",
        flush=True,
      )
      return []
    if jax.process_index() == 0:
      # The resolved config, to read back what every override became: only now, so that a refused resume leaves
      # the config.json of the run the checkpoints come from.
      with open(os.path.join(self.run_dir, "config.json"), "w") as f:
        json.dump(self.config.to_dict(), f, indent=2, default=str)
      # Steps after the checkpoint are written again (all of them on a fresh start): keep each step once.
      truncate_jsonl(os.path.join(self.run_dir, "val_generations.jsonl"), start_step if start_step > 0 else -1)
    if jax.process_index() == 0 and "console" in config.logger:
      print(self.layout_report(), flush=True)
    tracking = Tracking(
      config.logger,
      self.run_dir,
      total_steps=self.total_steps,
      config=self.config,
      project=config.project_name,
      experiment=config.experiment_name,
      prometheus_port=config.prometheus_port,
      start_step=start_step,
    )
    if start_step == 0:
      self.warm_up_pool()
    guard = Guard(config.guard)
    if guard.enabled and checkpointer.latest_step() is None:
      self.save(checkpointer, start_step)  # a rollback needs somewhere to go back to
    history = []
    try:
      if self.val_data is not None and (config.val_before_train or config.val_only):
        val = self.validate(start_step)
        tracking.log(val, step=start_step)
        history.append({"step": start_step, **val})
      if config.val_only:  # verl's: validate, then exit without training
        return history
      step = start_step
      while step < self.total_steps:
        with maybe_profile(step + 1, config.profile_steps, self.run_dir):
          metrics = self.train_step(step)  # returns host values: the profiled step has finished
        reason = guard.check(metrics)
        if reason is not None:
          step = self.rollback(checkpointer, guard, reason, metrics, tracking)
          history.append({"step": step, **metrics})
          continue
        step += 1
        is_last = step == self.total_steps
        if self.val_data is not None and config.test_freq > 0 and (step % config.test_freq == 0 or is_last):
          metrics.update(self.validate(step))
        tracking.log(metrics, step=step)
        history.append({"step": step, **metrics})
        if (config.save_freq > 0 and step % config.save_freq == 0) or (is_last and config.save_freq > 0):
          self.save(checkpointer, step)
        checkpointer.check()  # a background save that failed stops the run now, not a save later
        if not is_last and stop.requested():
          raise Preempted(self._save_on_stop(checkpointer, step))
    finally:
      checkpointer.close()
      tracking.close(failed=sys.exc_info()[0] not in (None, Preempted))
    if config.plot and "jsonl" in config.logger and jax.process_index() == 0:
      plot_metrics(tracking.metrics_path, os.path.join(self.run_dir, "metrics.png"))
    return history
