"""The base config tree (verl's key names, docs/algorithms.md §6) and its validation.

Every config file does `config = jaxrlhf.config.get_base_config()` and assigns existing keys; the
tree is locked, so a misspelt key fails at assignment with its name. `validate_config` re-checks a
finished config (keys, types, sizes) and `resolve_config` fills the values verl derives (critic on
for GAE, critic PPO sizes inherited from the actor).
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import re
import string

import ml_collections
from ml_collections import config_dict

from jaxrlhf.errors import UserError

_placeholder = config_dict.placeholder


# Every linear of the decoder layers: PEFT's "all-linear" (which leaves out the LM head) on these models.
ATTENTION_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_TARGETS = ("gate_proj", "up_proj", "down_proj")
# Qwen3.5's Gated DeltaNet layers (`linear_attn.*`); a model without them simply has no such modules.
LINEAR_ATTENTION_TARGETS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")
LORA_TARGETS = ATTENTION_TARGETS + MLP_TARGETS + LINEAR_ATTENTION_TARGETS
# The input embedding and the output layer, which PEFT adapts only when named. The head's adapter lets the
# logits grow, which a frozen head bounds (a from-scratch head at init scale caps any one token's probability
# near 6% of a 64-word vocabulary).
EMBED_TARGET = "embed_tokens"
HEAD_TARGET = "lm_head"
TARGET_MODULES = (EMBED_TARGET,) + LORA_TARGETS + (HEAD_TARGET,)


def resolve_target_modules(target_modules, key: str = "target_modules") -> tuple[str, ...]:
  """verl's `target_modules` ("all-linear", a list of names, or a comma-separated string) -> module names."""
  if isinstance(target_modules, str):
    if target_modules == "all-linear":
      return LORA_TARGETS
    target_modules = [name.strip() for name in target_modules.split(",") if name.strip()]
  names = tuple(target_modules)
  unknown = [name for name in names if name not in TARGET_MODULES]
  if unknown or not names:
    raise ValueError(
      f"'{key}'={target_modules!r}: expected 'all-linear' or a list of {list(TARGET_MODULES)}"
      + (f" (unknown: {unknown})" if unknown else "")
    )
  return tuple(name for name in TARGET_MODULES if name in names)


class ConfigError(UserError, ValueError):
  """A config value is missing, unknown, of the wrong type or inconsistent; the message names the key."""


def _optim(lr: float) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(
    dict(
      lr=lr,
      betas=(0.9, 0.999),
      eps=1e-8,
      weight_decay=0.01,
      lr_warmup_steps=-1,  # -1: use lr_warmup_steps_ratio
      lr_warmup_steps_ratio=0.0,
      lr_scheduler_type="constant",  # constant | cosine
      min_lr_ratio=0.0,
      num_cycles=0.5,  # cosine waves over the decay (0.5: from lr down to the floor once)
    )
  )


def _model() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(
    dict(
      path="",  # HF checkpoint directory; "" = initialise from override_config
      # HF config.json names; used when `path` is empty (tiny models, tests) and to override a loaded config.
      override_config=dict(
        vocab_size=_placeholder(int),
        hidden_size=_placeholder(int),
        intermediate_size=_placeholder(int),
        num_hidden_layers=_placeholder(int),
        num_attention_heads=_placeholder(int),
        num_key_value_heads=_placeholder(int),
        head_dim=_placeholder(int),
        rope_theta=_placeholder(float),
        rms_norm_eps=_placeholder(float),
        tie_word_embeddings=_placeholder(bool),
        max_position_embeddings=_placeholder(int),
        # A from-scratch model of another family than Llama reads the rest as that family's config.json would
        # (e.g. model_type="qwen3_5_text" with layer_types and the linear_* sizes: a tiny hybrid model).
        model_type=_placeholder(str),
        layer_types=_placeholder(tuple),
        linear_num_key_heads=_placeholder(int),
        linear_num_value_heads=_placeholder(int),
        linear_key_head_dim=_placeholder(int),
        linear_value_head_dim=_placeholder(int),
        linear_conv_kernel_dim=_placeholder(int),
        partial_rotary_factor=_placeholder(float),
        # Mixture of experts (qwen3_moe, qwen3_5_moe_text), HF's names; the load-balancing loss joins the actor's
        # loss with output_router_logits=True (HF's switch), weighted by router_aux_loss_coef.
        num_experts=_placeholder(int),
        num_experts_per_tok=_placeholder(int),
        moe_intermediate_size=_placeholder(int),
        shared_expert_intermediate_size=_placeholder(int),
        norm_topk_prob=_placeholder(bool),
        output_router_logits=_placeholder(bool),
        router_aux_loss_coef=_placeholder(float),
      ),
      use_remove_padding=False,
      enable_gradient_checkpointing=False,
      remat_policy="full",  # with gradient checkpointing: full | dots_saveable | nothing_saveable | ...
      scan_layers=True,  # layers as one nn.scan over stacked weights (False: a Python loop)
      attention_impl="auto",  # auto (cudnn on GPU, splash on TPU, xla on CPU) | xla | blockwise | cudnn | splash
      attention_block_size=512,  # blockwise attention's query/key block
      linear_attention_chunk_size=64,  # Gated DeltaNet layers (Qwen3.5): the chunked form's chunk of tokens
      # LoRA (verl's keys): rank 0 = full fine-tuning; > 0 trains adapters on `target_modules` only
      # ("all-linear", or a list such as ["q_proj", "v_proj"]) with scaling lora_alpha / lora_rank.
      lora_rank=0,
      lora_alpha=16,
      target_modules=ml_collections.FieldReference("all-linear", field_type=object),
      # LM head (log-probs, entropy): tokens per device whose logits exist at once; the backward
      # recomputes them chunk by chunk. 0 = all positions at once.
      logits_chunk_size=2048,
      dtype="float32",  # compute dtype
      param_dtype="float32",
    )
  )


def get_base_config() -> ml_collections.ConfigDict:
  """verl's config tree with verl's defaults, locked against new keys."""
  config = ml_collections.ConfigDict()

  config.data = dict(
    train_files=("",),
    val_files=("",),
    tokenizer="",  # "" = the actor model's path; "builtin:<task>" for the built-in tasks
    prompt_key="prompt",
    reward_fn_key="data_source",
    max_prompt_length=512,
    max_response_length=512,
    train_batch_size=1024,
    gen_batch_size=_placeholder(int),  # DAPO dynamic sampling: prompts generated per round (None = train_batch_size)
    val_batch_size=_placeholder(int),  # None = the whole validation set in one batch
    shuffle=True,
    seed=1,
    truncation="error",  # error | left | right | middle
    filter_overlong_prompts=False,
    train_max_samples=-1,  # rows of data.train_files used: a subset chosen once at load (<= 0: every row)
    val_max_samples=-1,  # likewise for data.val_files
    # Keyword arguments of the tokenizer's apply_chat_template (verl's key); None: not passed (the template's default).
    apply_chat_template_kwargs=dict(enable_thinking=_placeholder(bool), reasoning_effort=_placeholder(str)),
    # Beyond verl: pad each batch's prompts to its longest prompt rounded up to a length bucket
    # (rollout.buckets.prompt_length_buckets), not always to max_prompt_length. False = verl's padding.
    bucket_prompt_lengths=True,
  )

  config.actor_rollout_ref = dict(
    model=_model(),
    actor=dict(
      ppo_mini_batch_size=256,  # prompts; times rollout.n sequences
      ppo_micro_batch_size_per_gpu=_placeholder(int),  # None = the whole per-device mini-batch
      use_dynamic_bsz=False,
      ppo_max_token_len_per_gpu=16384,
      clip_ratio=0.2,
      clip_ratio_low=_placeholder(float),
      clip_ratio_high=_placeholder(float),
      clip_ratio_c=3.0,
      # loss_mode: vanilla | gspo | gpg | cispo | geo_mean | clip_cov | kl_cov (+ registered ones)
      policy_loss=dict(
        loss_mode="vanilla",
        clip_cov_ratio=0.0002,
        clip_cov_lb=1.0,
        clip_cov_ub=5.0,
        kl_cov_ratio=0.0002,
        ppo_kl_coef=0.1,
        dro_beta=_placeholder(float),
      ),
      loss_agg_mode="token-mean",
      loss_scale_factor=_placeholder(float),  # seq-mean-token-sum-norm divisor; None = padded response length
      tau_pos=1.0,  # sapo gate temperature where A > 0
      tau_neg=1.05,  # sapo gate temperature where A <= 0
      entropy_coeff=0.0,
      use_kl_loss=False,
      kl_loss_coef=0.001,
      kl_loss_type="low_var_kl",
      ppo_epochs=1,
      shuffle=False,
      grad_clip=1.0,
      optim=_optim(1e-6),
      fsdp_config=dict(param_offload=False, optimizer_offload=False),
      ulysses_sequence_parallel_size=1,  # devices of mesh.fsdp that split each sequence (Ulysses)
    ),
    rollout=dict(
      name="jax",
      temperature=1.0,
      top_k=-1,
      top_p=1.0,
      n=1,
      do_sample=True,
      tensor_model_parallel_size=1,
      dtype=_placeholder(str),  # generation compute dtype: float32 | bfloat16; None = actor's model.dtype
      max_num_batched_tokens=8192,
      # Rows decoding at once per generation shard (vLLM's concurrent sequences): a finished row's slot takes the
      # next prompt inside the compiled loop; the KV cache holds this many rows. None = the whole batch at once.
      max_num_seqs=_placeholder(int),
      # Rollout routing replay (verl's R3; a model with experts): the sampler records each token's experts in every
      # layer and the actor's old-log-prob and update forwards route by them (docs/algorithms.md).
      enable_rollout_routing_replay=False,
      log_prob_micro_batch_size_per_gpu=_placeholder(int),
      val_kwargs=dict(temperature=0.0, top_k=-1, top_p=1.0, n=1, do_sample=False),
      # Multi-turn rollouts with tools (verl's MultiTurnConfig; docs/tools.md): the policy's turns end at EOS, the
      # tool calls in a turn run on the host, their responses enter the sequence out of the loss.
      multi_turn=dict(
        enable=False,
        max_assistant_turns=_placeholder(int),  # None = until the response budget
        max_user_turns=_placeholder(int),  # tool-response turns; None = until the response budget
        tool_config_path=_placeholder(str),  # verl's tool YAML (tools: - class_name, config, tool_schema)
        max_parallel_calls=1,  # tool calls of one turn that run (the rest dropped, as verl)
        max_tool_response_length=256,  # characters of a tool's response text kept (as verl)
        tool_response_truncate_side="middle",  # left | right | middle
        format="hermes",  # <tool_call>{"name": ..., "arguments": {...}}</tool_call>
        tool_timeout_s=30.0,  # beyond verl: a call running longer returns an error text to the policy
      ),
    ),
    ref=dict(
      fsdp_config=dict(param_offload=False),
      log_prob_micro_batch_size_per_gpu=_placeholder(int),
      ulysses_sequence_parallel_size=_placeholder(int),
    ),  # None = the actor's
  )
  # A Jinja chat template used instead of the tokenizer's own (verl's key; the critic reads the actor's tokens).
  config.actor_rollout_ref.model.custom_chat_template = _placeholder(str)

  config.critic = dict(
    enable=_placeholder(bool),  # None = on exactly when adv_estimator == "gae"
    model=_model(),
    optim=_optim(1e-5),
    cliprange_value=0.5,
    loss_agg_mode=_placeholder(str),  # None = actor's
    loss_scale_factor=_placeholder(float),  # None = actor's (as verl)
    ppo_mini_batch_size=_placeholder(int),  # None = actor's
    ppo_micro_batch_size_per_gpu=_placeholder(int),
    forward_micro_batch_size_per_gpu=_placeholder(int),  # the values phase; None = as log-probs (below)
    ppo_epochs=_placeholder(int),
    shuffle=_placeholder(bool),
    grad_clip=1.0,
    ulysses_sequence_parallel_size=1,
  )
  # verl's critic keeps its offload keys under its model section.
  config.critic.model.fsdp_config = dict(param_offload=False, optimizer_offload=False)

  config.reward_model = dict(
    enable=False,
    model=dict(path=""),  # HF AutoModelForSequenceClassification checkpoint (num_labels=1), actor's tokenizer
    combine_with_rule=False,
    # naive | dapo | gdpo: the reward function scores one sample a call; batch: one call per batch, with lists
    # (data_sources, solution_strs, ground_truths, extra_infos), returning one score (or dict) per sample.
    reward_manager="naive",  # True: score = rule reward + reward model; False: the reward model alone (verl)
    on_error="raise",  # raise | zero: a reward function that fails scores 0 and is counted (reward/num_errors)
    # Rule reward processes (verl's key): 0 = in the trainer's process, no time limit; N >= 1 = N worker
    # processes; None = min(8, cores) for a custom_reward_function file, 0 for the built-in rules.
    num_workers=_placeholder(int),
    timeout_s=60.0,  # beyond verl: a sample scored in a worker process longer than this fails (on_error)
    # DAPO overlong shaping: a linear penalty over the last `len` tokens before max_response_length.
    overlong_buffer=dict(enable=False, len=4096, penalty_factor=1.0),
    # A generative reward model (LLM-as-judge, docs/algorithms.md "A generative reward model"): model.path is a
    # causal LM with its own tokenizer; each response fills `judge.prompt_template`, the judge's greedy (by
    # default) reply is parsed into the score by `judge.score_function`, through on_error and timeout_s.
    generative=False,
    judge=dict(
      # str.format fields: {prompt} (the policy's prompt, decoded), {response}, {ground_truth}, {data_source},
      # {extra_info} (the row's dict: {extra_info[question]}).
      prompt_template="{prompt}\n{response}\nScore the response from 0 to 10.",
      apply_chat_template=True,  # the filled template as one user message through the judge's chat template
      # verl's reward function signature plus the judge's reply: fn(data_source, solution_str, ground_truth,
      # extra_info, judge_response) -> float | dict with "score"; path "" = the last number in the reply.
      score_function=dict(path="", name="compute_score"),
    ),
    # The judge's sampler (verl's reward.reward_model.rollout.*): judge prompts are left-padded to prompt_length
    # tokens (a longer one fails its row: on_error), replies are up to response_length tokens.
    rollout=dict(
      prompt_length=512,
      response_length=32,
      do_sample=False,  # greedy, unlike verl's default: a judge's verdict should not be a draw
      temperature=1.0,
      top_k=-1,
      top_p=1.0,
      max_num_seqs=_placeholder(int),  # None = every judge prompt decodes at once
      seed=42,  # sampling judges (do_sample=True): batch row r, of data row i, draws with key (seed, i, r)
      dtype="float32",  # the judge's compute dtype (its weights are cast once per judging): float32 | bfloat16
    ),
  )
  # verl keeps the custom reward function at the top level of its tree.
  config.custom_reward_function = dict(path="", name="compute_score")

  # On-policy distillation (verl's `distillation.*`): a frozen teacher scores the student's samples inside the
  # step (docs/algorithms.md "On-policy distillation").
  config.distillation = dict(
    enabled=False,
    distillation_loss=dict(
      loss_mode="k3",  # k1/kl, abs, k2/mse, k3/low_var_kl (the sampled token) | forward_kl_topk (teacher's top-k)
      topk=32,  # forward_kl_topk: the teacher's k most likely tokens per position
      use_task_rewards=True,  # True: the PPO loss + distillation_loss_coef x the distillation term; False: alone
      distillation_loss_coef=1.0,
      loss_max_clamp=_placeholder(float),  # None = no clamp; else the per-token loss is clamped to [-c, c]
      log_prob_min_clamp=_placeholder(float),  # forward_kl_topk: floor of both log-probs; None = none
      use_policy_gradient=False,  # True: -loss is a per-token advantage of the vanilla PPO loss
      policy_loss_mode="vanilla",
      clip_ratio=0.2,
      clip_ratio_low=0.2,
      clip_ratio_high=0.2,
    ),
    # One teacher for every row (verl's single `teacher_models.teacher_model`); its vocabulary must be the student's.
    teacher_model=dict(model_path=""),
  )

  config.algorithm = dict(
    gamma=1.0,
    lam=1.0,
    adv_estimator="gae",
    norm_adv_by_std_in_grpo=True,
    use_kl_in_reward=False,
    kl_penalty="kl",
    kl_ctrl=dict(type="fixed", kl_coef=0.001, horizon=10000, target_kl=0.1),
    # DAPO dynamic sampling: drop groups whose `metric` is equal for every sample, refill the batch.
    filter_groups=dict(enable=False, metric="score", max_num_gen_batches=0),  # 0 = no limit
    # gdpo: names of the reward components (keys of the dict a reward function returns) and their weights.
    gdpo_reward_keys=_placeholder(tuple),
    gdpo_reward_weights=_placeholder(tuple),  # None = 1 each
    # verl's rollout correction between the rollout's and the training forward's log-probs.
    rollout_correction=dict(
      rollout_is=_placeholder(str),  # None | token | sequence
      rollout_is_threshold="2.0",  # "upper" truncates the weights (TIS); "lower_upper" zeroes outside (IcePop)
      rollout_is_batch_normalize=False,
      rollout_rs=_placeholder(str),  # None | comma-separated token_k1..seq_max_k3 rejection options
      rollout_rs_threshold=_placeholder(str),  # one threshold, or one per rollout_rs option (comma-separated)
      bypass_mode=False,  # True: old_log_prob = the rollout's log-prob, loss_mode bypass_mode
      loss_type="ppo_clip",  # bypass mode: ppo_clip | reinforce
    ),
  )

  config.trainer = dict(
    total_epochs=1,
    total_training_steps=_placeholder(int),  # None = epochs x batches per epoch
    project_name="jaxrlhf",
    experiment_name="run",
    logger=("console", "jsonl"),
    save_freq=-1,
    test_freq=-1,
    val_before_train=True,
    critic_warmup=0,
    resume_mode="auto",
    resume_from_path="",
    default_local_dir="checkpoints",
    max_actor_ckpt_to_keep=_placeholder(int),
    save_hf=False,  # also export the actor (and critic) in HF format at every save: <run dir>/huggingface/
    seed=1,
    plot=True,
    fuse_step=True,  # False: phased mode, one jit per stage with timing_s/* per phase (same numbers)
    log_val_generations=0,  # validation samples written to <run dir>/val_generations.jsonl
    val_only=False,  # validate once (trainer.val_before_train's validation) and exit
    rollout_data_dir=_placeholder(str),  # each step's generations as <dir>/<step>.jsonl (verl's dump)
    validation_data_dir=_placeholder(str),  # each validation's generations as <dir>/<step>.jsonl
    peak_flops_per_device=_placeholder(float),  # for perf/mfu/*; None = known accelerator table or measured
    prometheus_port=_placeholder(int),  # None = off; 0 = any free port
    profile_steps=(),  # global steps (from 1) to trace with jax.profiler into <run dir>/profile
    # Seeds' stable-pipeline practice, automated: on a KL blow-up or a reward collapse, restore the
    # last checkpoint, scale the learning rate by lr_backoff and continue; stop after max_rollbacks.
    guard=dict(
      enable=False,
      kl_max=0.1,  # seeds: 0.1 -> roll back (0.3 -> pause)
      reward_drop=0.2,  # relative drop of critic/score/mean below its moving average
      reward_window=10,  # steps in the moving average
      lr_backoff=0.5,
      max_rollbacks=3,
      kl_warmup_steps_ratio=0.0,  # no KL term (loss or reward) for this fraction of the first steps
    ),
    # verl's trainer.v1 modes. sync: each step generates its batch, then trains on it. colocate_async: partial
    # rollouts in the rollout's max_num_seqs slots carried across steps (rollout/partial.py).
    v1=dict(
      trainer_mode="sync",  # sync | colocate_async (separate_async: refused, one mesh runs both)
      colocate_async=dict(
        num_warmup_batches=1,  # batches admitted before the first step: the pool holds 1 + this many batches
        # jaxrlhf: False decodes every admitted group to the end each step (one-step-off with 1 warm-up batch)
        partial_rollout=True,
      ),
      sampler=dict(
        max_off_policy_threshold=8,  # model versions a trained group may span (step - admitted + 1); None: any
        max_off_policy_strategy="drop",  # drop: a finished group past it starts again | wait: it finishes first
      ),
    ),
  )

  config.mesh = dict(data=1, fsdp=-1, tensor=1)

  config.lock()
  return config


# Keys verl has that jaxrlhf accepts but does not implement (yet): any value but the default is
# refused, saying what jaxrlhf does instead. Delete a row when its feature lands.
NOT_IMPLEMENTED = {
  "actor_rollout_ref.rollout.name": (
    "jax",
    "generation always runs jaxrlhf's JAX sampler inside the compiled step (no vllm/sglang/hf)",
  ),
  "actor_rollout_ref.rollout.max_num_batched_tokens": (
    8192,
    "generation runs the whole batch (data.train_batch_size x rollout.n sequences) at once; "
    "bound it with data.train_batch_size",
  ),
  "critic.model.logits_chunk_size": (
    2048,
    "the critic has no LM head: its value head reads the response positions at once",
  ),
}

SEQUENCE_PARALLEL_KEYS = {
  "actor": "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
  "ref": "actor_rollout_ref.ref.ulysses_sequence_parallel_size",
  "critic": "critic.ulysses_sequence_parallel_size",
}

# The names of the attention kernels and of the gradient-checkpointing policies. They live here, not in
# `jaxrlhf.models`, because this module imports no JAX (`python -m jaxrlhf.aot` loads a config before it chooses
# JAX's platform); the models import them, so the dependency runs one way (models -> config).
ATTENTION_IMPLS = ("auto", "xla", "blockwise", "cudnn", "splash")
REMAT_POLICY_NAMES = ("none", "full", "nothing_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable")

_CHOICES = {
  "trainer.v1.trainer_mode": ("sync", "colocate_async", "separate_async"),
  "trainer.v1.sampler.max_off_policy_strategy": ("drop", "wait"),
  "data.truncation": ("error", "left", "right", "middle"),
  "reward_model.on_error": ("raise", "zero"),
  "reward_model.reward_manager": ("naive", "dapo", "gdpo", "batch"),
  "algorithm.filter_groups.metric": ("score", "seq_reward"),
  "actor_rollout_ref.actor.optim.lr_scheduler_type": ("constant", "cosine"),
  "critic.optim.lr_scheduler_type": ("constant", "cosine"),
  "trainer.resume_mode": ("auto", "disable", "resume_path"),
  "actor_rollout_ref.model.dtype": ("float32", "bfloat16"),
  "actor_rollout_ref.model.param_dtype": ("float32", "bfloat16"),
  "critic.model.dtype": ("float32", "bfloat16"),
  "critic.model.param_dtype": ("float32", "bfloat16"),
  "actor_rollout_ref.model.attention_impl": ATTENTION_IMPLS,
  "critic.model.attention_impl": ATTENTION_IMPLS,
  "actor_rollout_ref.model.remat_policy": REMAT_POLICY_NAMES,
  "critic.model.remat_policy": REMAT_POLICY_NAMES,
  "actor_rollout_ref.rollout.dtype": ("float32", "bfloat16"),
  "reward_model.rollout.dtype": ("float32", "bfloat16"),
  "algorithm.rollout_correction.rollout_is": ("token", "sequence"),
  "algorithm.rollout_correction.loss_type": ("ppo_clip", "reinforce"),
  "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side": ("left", "right", "middle"),
  "actor_rollout_ref.rollout.multi_turn.format": ("hermes",),
  # verl 0.9.1 supports only the vanilla PPO loss for the distillation reward (DistillationLossConfig).
  "distillation.distillation_loss.policy_loss_mode": ("vanilla",),
}


def _registry_choices() -> dict[str, list[str]]:
  """Choice keys whose choices are a registry: read at validation time, so user-registered names count."""
  # Imported here, not at the top: loading a config file must not load JAX, because `python -m jaxrlhf.aot`
  # reads the config before it sets up the target's environment (JAX reads it when it starts).
  from jaxrlhf import algos

  kl_types = list(algos.KL_PENALTY_TYPES)
  return {
    "algorithm.adv_estimator": algos.ADV_ESTIMATORS.names(),
    "actor_rollout_ref.actor.policy_loss.loss_mode": algos.POLICY_LOSSES.names(),
    "actor_rollout_ref.actor.loss_agg_mode": list(algos.LOSS_AGG_MODES),
    "critic.loss_agg_mode": list(algos.LOSS_AGG_MODES),
    "actor_rollout_ref.actor.kl_loss_type": kl_types,
    "algorithm.kl_penalty": kl_types,
    "algorithm.kl_ctrl.type": list(algos.KL_CONTROLLERS),
    "distillation.distillation_loss.loss_mode": list(algos.DISTILLATION_LOSS_MODES),
  }


def _at_least(low):
  return (lambda v: v >= low), f">= {low}"


def _above(low):
  return (lambda v: v > low), f"> {low}"


def _within(low, high, *, open_low=False, open_high=False):
  check = lambda v: (v > low if open_low else v >= low) and (v < high if open_high else v <= high)
  return check, f"in {'(' if open_low else '['}{low}, {high}{')' if open_high else ']'}"


# Numeric ranges (None = derived or off, never checked). Sampling (temperature, top_p, top_k) is
# checked by `_check_sampling`, which knows about do_sample.
_RANGES = {
  **{
    key: _at_least(1)
    for key in (
      "data.train_batch_size",
      "data.gen_batch_size",
      "data.val_batch_size",
      "data.max_prompt_length",
      "data.max_response_length",
      "actor_rollout_ref.actor.ppo_mini_batch_size",
      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
      "actor_rollout_ref.actor.ppo_epochs",
      "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
      "actor_rollout_ref.rollout.n",
      "actor_rollout_ref.rollout.val_kwargs.n",
      "actor_rollout_ref.rollout.tensor_model_parallel_size",
      "critic.ppo_mini_batch_size",
      "critic.ppo_micro_batch_size_per_gpu",
      "critic.ppo_epochs",
      "trainer.total_epochs",
      "trainer.total_training_steps",
      "algorithm.kl_ctrl.horizon",
      "trainer.guard.reward_window",
      *SEQUENCE_PARALLEL_KEYS.values(),
    )
  },
  **{
    key: _at_least(0)
    for key in (
      "actor_rollout_ref.actor.kl_loss_coef",
      "algorithm.kl_ctrl.kl_coef",
      "actor_rollout_ref.actor.optim.lr",
      "critic.optim.lr",
      "actor_rollout_ref.actor.optim.weight_decay",
      "critic.optim.weight_decay",
      "actor_rollout_ref.actor.clip_ratio_low",
      "actor_rollout_ref.actor.clip_ratio_high",
      "critic.cliprange_value",
      "trainer.critic_warmup",
      "trainer.log_val_generations",
      "trainer.guard.max_rollbacks",
      "reward_model.num_workers",
      "trainer.max_actor_ckpt_to_keep",  # 0 (or None) keeps every checkpoint, as in verl
    )
  },
  **{
    key: _above(0)
    for key in (
      "actor_rollout_ref.actor.clip_ratio",
      "actor_rollout_ref.actor.grad_clip",
      "critic.grad_clip",
      "actor_rollout_ref.actor.optim.eps",
      "critic.optim.eps",
      "algorithm.kl_ctrl.target_kl",
      "trainer.guard.kl_max",
      "trainer.peak_flops_per_device",
      "reward_model.timeout_s",
    )
  },
  **{
    key: _within(0, 1)
    for key in (
      "algorithm.gamma",
      "algorithm.lam",
      "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio",
      "critic.optim.lr_warmup_steps_ratio",
      "actor_rollout_ref.actor.optim.min_lr_ratio",
      "critic.optim.min_lr_ratio",
      "trainer.guard.kl_warmup_steps_ratio",
    )
  },
  "actor_rollout_ref.actor.clip_ratio_c": _above(1),
  "trainer.guard.lr_backoff": _within(0, 1, open_low=True),
  "trainer.prometheus_port": _within(0, 65535),
  **{
    key: _at_least(1)
    for key in (
      "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
      "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
      "critic.forward_micro_batch_size_per_gpu",
      "actor_rollout_ref.rollout.max_num_seqs",
      "reward_model.rollout.max_num_seqs",
      "reward_model.rollout.prompt_length",
      "reward_model.rollout.response_length",
      "trainer.v1.colocate_async.num_warmup_batches",
      "trainer.v1.sampler.max_off_policy_threshold",
      "actor_rollout_ref.rollout.multi_turn.max_assistant_turns",
      "actor_rollout_ref.rollout.multi_turn.max_user_turns",
      "actor_rollout_ref.rollout.multi_turn.max_parallel_calls",
      "actor_rollout_ref.rollout.multi_turn.max_tool_response_length",
      "distillation.distillation_loss.topk",
    )
  },
  **{
    key: _above(0)
    for key in ("distillation.distillation_loss.loss_max_clamp", "distillation.distillation_loss.clip_ratio")
  },
  **{
    key: _at_least(0)
    for key in (
      "distillation.distillation_loss.distillation_loss_coef",
      "distillation.distillation_loss.clip_ratio_low",
      "distillation.distillation_loss.clip_ratio_high",
    )
  },
  "actor_rollout_ref.rollout.multi_turn.tool_timeout_s": _above(0),
  "actor_rollout_ref.model.logits_chunk_size": _at_least(0),  # 0 = no chunking
  **{f"{section}.model.lora_rank": _at_least(0) for section in ("actor_rollout_ref", "critic")},  # 0 = off
  **{f"{section}.model.lora_alpha": _above(0) for section in ("actor_rollout_ref", "critic")},
}


def _flatten(config, prefix=""):
  out = {}
  for key in config.keys():
    value = config[key]
    path = f"{prefix}{key}"
    if isinstance(value, (ml_collections.ConfigDict, dict)):
      out.update(_flatten(value, path + "."))
    else:
      out[path] = value
  return out


def _field_types(config, prefix=""):
  """The declared type of every leaf (placeholders included) of a ConfigDict."""
  out = {}
  for key in config.keys():
    value = config[key]
    path = f"{prefix}{key}"
    if isinstance(value, ml_collections.ConfigDict):
      out.update(_field_types(value, path + "."))
    else:
      out[path] = config.get_type(key)
  return out


def load_config_file(path: str) -> ml_collections.ConfigDict:
  """`get_config()` of a config file, by path (what `--config` does; configs build on each other with it)."""
  if not os.path.exists(path):
    raise ConfigError(f"config file {path!r} does not exist")
  spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not hasattr(module, "get_config"):
    raise ConfigError(f"config file {path!r} defines no get_config()")
  return module.get_config()


def all_keys() -> list[str]:
  """Every leaf key of the config tree, dotted (for messages that suggest the key meant)."""
  return list(_flatten(get_base_config()))


def get(config, path: str):
  node = config
  for part in path.split("."):
    node = node[part]
  return node


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Raises ConfigError naming the first bad key: unknown, wrong type, bad choice, unsupported."""
  base_types = _field_types(get_base_config())
  values = _flatten(config)
  for path, value in values.items():
    if path not in base_types:
      raise ConfigError(f"unknown config key '{path}' (value {value!r}); see jaxrlhf/config.py for the tree")
    expected = base_types[path]
    if value is None or expected is type(None):
      continue
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
      continue
    if not isinstance(value, expected):
      raise ConfigError(f"config key '{path}' expects {expected.__name__}, got {value!r} ({type(value).__name__})")
  for path, expected in base_types.items():
    value = values[path]
    if expected is float and value is not None and not math.isfinite(value):
      raise ConfigError(f"config key '{path}' must be a finite number, got {value!r}")
  for path, choices in {**_CHOICES, **_registry_choices()}.items():
    # None: derived from another key (rollout.dtype, critic.loss_agg_mode; see resolve_config).
    if values[path] is not None and values[path] not in choices:
      raise ConfigError(f"config key '{path}' must be one of {list(choices)}, got {values[path]!r}")
  from jaxrlhf.tracking.tracking import LOGGERS  # not at the top: see _registry_choices

  for name in values["trainer.logger"]:
    if isinstance(name, str) and "," in name:  # --config.trainer.logger=console,jsonl is one string
      raise ConfigError(
        f"config key 'trainer.logger' has unknown logger {name!r}: it is a tuple of names",
        hint="""--config.trainer.logger="('console', 'jsonl')" (or verl's trainer.logger='[console,jsonl]')""",
      )
    if name not in LOGGERS:
      raise ConfigError(f"config key 'trainer.logger' has unknown logger {name!r}; known: {list(LOGGERS)}")
  for path, (check, expected) in _RANGES.items():
    if values[path] is not None and not check(values[path]):
      raise ConfigError(f"config key '{path}' must be {expected}, got {values[path]!r}")
  rollout = config.actor_rollout_ref.rollout
  _check_sampling("actor_rollout_ref.rollout", rollout)
  _check_sampling("actor_rollout_ref.rollout.val_kwargs", rollout.val_kwargs)
  _check_judge(config)
  for path, (default, instead) in NOT_IMPLEMENTED.items():
    if values[path] != default:
      raise ConfigError(
        f"config key '{path}'={values[path]!r} is not implemented (only {default!r} is accepted): {instead}"
      )
  for section in ("actor_rollout_ref", "critic"):
    try:
      targets = resolve_target_modules(values[f"{section}.model.target_modules"], f"{section}.model.target_modules")
    except ValueError as e:
      raise ConfigError(f"config key {e}") from None
    if section == "critic" and HEAD_TARGET in targets:  # its value head trains whole with LoRA, as modules_to_save
      raise ConfigError(
        f"config key 'critic.model.target_modules'={values['critic.model.target_modules']!r} "
        f"names {HEAD_TARGET!r}, but the critic has no LM head: its value head trains in full "
        "beside the adapters"
      )
  data = config.data
  actor = config.actor_rollout_ref.actor
  _check_rollout_correction(config)
  _check_gdpo(config)
  _check_multi_turn(config)
  _check_distillation(config)
  _check_trainer_mode(config)
  critic_overrides = [k for k, v in config.critic.model.override_config.items() if v is not None]
  critic_path = config.critic.model.path
  if critic_overrides and (not critic_path or critic_path == config.actor_rollout_ref.model.path):
    raise ConfigError(
      f"config keys critic.model.override_config.{critic_overrides} are read only with a critic "
      "checkpoint of its own (critic.model.path): without one the critic takes the actor's "
      "architecture (actor_rollout_ref.model.override_config) and weights"
    )
  if data.train_batch_size % actor.ppo_mini_batch_size:
    raise ConfigError(
      f"data.train_batch_size={data.train_batch_size} is not divisible by "
      f"actor_rollout_ref.actor.ppo_mini_batch_size={actor.ppo_mini_batch_size}"
    )
  if data.gen_batch_size is not None and data.gen_batch_size < data.train_batch_size:
    raise ConfigError(
      f"data.gen_batch_size={data.gen_batch_size} must be >= data.train_batch_size={data.train_batch_size}"
    )
  overlong = config.reward_model.overlong_buffer
  if overlong.enable and not 0 < overlong.len <= data.max_response_length:
    raise ConfigError(
      f"reward_model.overlong_buffer.len={overlong.len} must be in 1..data.max_response_length="
      f"{data.max_response_length}"
    )
  if config.reward_model.enable and not config.reward_model.model.path:
    raise ConfigError(
      "reward_model.enable=True needs reward_model.model.path (an HF sequence-classification checkpoint directory; "
      "with reward_model.generative=True a causal LM judge with its tokenizer)"
    )
  if actor.use_dynamic_bsz:
    # A micro-batch holds whole sequences: the per-device token budget must fit the longest one. Under
    # sequence parallelism a group of sp devices holds a row, so a device holds its 1/sp share (as verl,
    # which scales the budget by the Ulysses size); the critic follows the actor's budget with its own sp.
    seq_len = data.max_prompt_length + data.max_response_length
    sizes = sequence_parallel_sizes(config)
    sp = min(sizes["actor"], sizes["critic"]) if config.critic.enable else sizes["actor"]
    if actor.ppo_max_token_len_per_gpu * sp < seq_len:
      share = f" / ulysses_sequence_parallel_size {sp} = {-(-seq_len // sp)} tokens per device" if sp > 1 else ""
      raise ConfigError(
        f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={actor.ppo_max_token_len_per_gpu} is smaller than one "
        f"sequence: data.max_prompt_length + data.max_response_length = {seq_len}{share} (use_dynamic_bsz=True)"
      )


def _check_gdpo(config) -> None:
  """GDPO normalises each named component of the rule reward's result: it needs the names (verl asserts
  them too), one weight per name, and a rule reward."""
  algo = config.algorithm
  if algo.adv_estimator != "gdpo":
    return
  keys = algo.gdpo_reward_keys
  if not keys:
    raise ConfigError(
      "config key 'algorithm.adv_estimator'='gdpo' needs algorithm.gdpo_reward_keys: the entries of "
      "the dict the reward function returns to normalise one by one, e.g. ('format', 'acc')"
    )
  if algo.gdpo_reward_weights is not None and len(algo.gdpo_reward_weights) != len(keys):
    raise ConfigError(
      f"config key 'algorithm.gdpo_reward_weights' has {len(algo.gdpo_reward_weights)} weights for "
      f"{len(keys)} algorithm.gdpo_reward_keys {tuple(keys)}"
    )
  if config.reward_model.enable and not config.reward_model.combine_with_rule:
    raise ConfigError(
      "config key 'algorithm.adv_estimator'='gdpo' reads its components from the rule reward; "
      "reward_model.enable=True without reward_model.combine_with_rule has none"
    )


def _check_distillation(config) -> None:
  distillation = config.distillation
  if not distillation.enabled:
    return
  if not distillation.teacher_model.model_path:
    raise ConfigError(
      "distillation.enabled=True needs distillation.teacher_model.model_path (an HF causal-LM checkpoint directory "
      "with the student's vocabulary)"
    )
  loss = distillation.distillation_loss
  if loss.loss_mode in ("k1", "kl") and not loss.use_policy_gradient:
    raise ConfigError(
      f"distillation.distillation_loss.loss_mode={loss.loss_mode!r} needs use_policy_gradient=True: k1's gradient "
      "does not depend on the teacher (as verl, which refuses it too); use k3 or forward_kl_topk as a loss"
    )
  model = config.actor_rollout_ref.model
  if loss.loss_mode == "forward_kl_topk" and model.use_remove_padding:
    raise ConfigError(
      "distillation.distillation_loss.loss_mode='forward_kl_topk' with actor_rollout_ref.model.use_remove_padding="
      "True: the teacher's top-k reach the student's head on padded rows only; set use_remove_padding=False"
    )
  if config.actor_rollout_ref.actor.ulysses_sequence_parallel_size > 1:
    raise ConfigError(
      "distillation.enabled=True with actor_rollout_ref.actor.ulysses_sequence_parallel_size > 1: the teacher "
      "runs without sequence parallelism; set it to 1"
    )


def _check_rollout_correction(config) -> None:
  """The `bypass_mode` loss needs the rollout's log-probs as the old ones; thresholds and rejection options
  parse (`algos.rollout_correction` names the key when they do not)."""
  correction = config.algorithm.rollout_correction
  if config.actor_rollout_ref.actor.policy_loss.loss_mode == "bypass_mode" and not correction.bypass_mode:
    raise ConfigError(
      "config key 'actor_rollout_ref.actor.policy_loss.loss_mode'='bypass_mode' needs "
      "algorithm.rollout_correction.bypass_mode=True (the rollout's log-probs as the old ones); "
      "bypass_mode=True selects that loss by itself, as in verl"
    )
  from jaxrlhf.algos import rollout_correction  # not at the top: see _registry_choices

  try:
    if correction.rollout_is is not None:
      rollout_correction.parse_rollout_is_threshold(correction.rollout_is_threshold)
    if correction.rollout_rs is not None:
      rollout_correction.parse_rollout_rs(correction.rollout_rs, correction.rollout_rs_threshold)
  except ValueError as error:
    raise ConfigError(f"config key {error}") from None


def _check_trainer_mode(config) -> None:
  """`trainer.v1.trainer_mode=colocate_async` carries rollouts in the rollout's slots between fused steps; what it
  cannot carry is refused here, one key at a time."""
  mode = config.trainer.v1.trainer_mode
  if mode == "separate_async":
    raise ConfigError(
      "config key 'trainer.v1.trainer_mode'='separate_async' is not supported: jaxrlhf's step runs generation and "
      "training on one mesh in one program (disjoint generation and training meshes are not built); use "
      "'colocate_async' (partial rollouts carried across steps) or 'sync'"
    )
  if mode != "colocate_async":
    return
  rollout = config.actor_rollout_ref.rollout
  unsupported = {
    "actor_rollout_ref.rollout.max_num_seqs": (
      rollout.max_num_seqs is None,
      "None: partial rollouts decode in the rollout's slots; set it (e.g. the rows one step decodes at once)",
    ),
    "trainer.fuse_step": (not config.trainer.fuse_step, "False: the carried rollout lives in the fused step"),
    "actor_rollout_ref.rollout.multi_turn.enable": (rollout.multi_turn.enable, "True: turns are not carried"),
    "algorithm.filter_groups.enable": (
      config.algorithm.filter_groups.enable,
      "True: dynamic sampling's rounds draw more prompts per step than the pool admits",
    ),
    "algorithm.adv_estimator": (
      config.algorithm.adv_estimator == "remax",
      "'remax': its greedy baseline is decoded whole per step",
    ),
    "actor_rollout_ref.rollout.enable_rollout_routing_replay": (
      rollout.enable_rollout_routing_replay,
      "True: routes are not carried with the slots",
    ),
  }
  for key, (bad, why) in unsupported.items():
    if bad:
      raise ConfigError(f"config key '{key}' with trainer.v1.trainer_mode='colocate_async': {why}")


def _check_sampling(prefix: str, sampling) -> None:
  """temperature > 0 unless greedy (do_sample=False), top_p in (0, 1], top_k -1 (off) or >= 0."""
  if sampling.do_sample and not sampling.temperature > 0:
    raise ConfigError(
      f"config key '{prefix}.temperature' must be > 0 when do_sample=True (got "
      f"{sampling.temperature}); use {prefix}.do_sample=False for greedy decoding"
    )
  if not 0 < sampling.top_p <= 1:
    raise ConfigError(f"config key '{prefix}.top_p' must be in (0, 1], got {sampling.top_p!r} (1.0 = off)")
  if sampling.top_k < -1:
    raise ConfigError(f"config key '{prefix}.top_k' must be >= -1, got {sampling.top_k!r} (-1 = off)")


JUDGE_TEMPLATE_FIELDS = ("prompt", "response", "ground_truth", "data_source", "extra_info")


def reward_model_head(config) -> str:
  """The reward model's head: "lm" for a judge (`reward_model.generative`), else a scalar "reward" head."""
  return "lm" if config.reward_model.generative else "reward"


def _check_judge(config) -> None:
  """A judge's template names only the fields each row fills (`JUDGE_TEMPLATE_FIELDS`), and parses as a format
  string; its sampling keys are checked as a rollout's."""
  section = config.reward_model
  if not (section.enable and section.generative):
    return
  key = "reward_model.judge.prompt_template"
  try:
    fields = [field for _, field, _, _ in string.Formatter().parse(section.judge.prompt_template) if field is not None]
  except ValueError as error:
    raise ConfigError(f"config key '{key}' is not a str.format template: {error}") from None
  for field in fields:
    name = re.split(r"[.\[]", field, maxsplit=1)[0]
    if name not in JUDGE_TEMPLATE_FIELDS:
      raise ConfigError(
        f"config key '{key}' has field {{{field}}}; a judge template fills {list(JUDGE_TEMPLATE_FIELDS)} "
        "(write a literal brace as {{ or }})"
      )
  _check_sampling("reward_model.rollout", section.rollout)


def _check_multi_turn(config) -> None:
  """Multi-turn rollouts need tools, and generate the whole batch at once (no slots)."""
  rollout = config.actor_rollout_ref.rollout
  multi_turn = rollout.multi_turn
  if not multi_turn.enable:
    return
  if not multi_turn.tool_config_path:
    raise ConfigError(
      "actor_rollout_ref.rollout.multi_turn.enable=True needs actor_rollout_ref.rollout.multi_turn.tool_config_path "
      "(a tool YAML in verl's layout; docs/tools.md): jaxrlhf's multi-turn rollouts are tool rollouts"
    )
  if config.reward_model.enable:
    raise ConfigError(
      "reward_model.enable=True with actor_rollout_ref.rollout.multi_turn.enable=True: a reward model over "
      "multi-turn responses is not supported yet; score them with the rule reward (reward_model.enable=False)"
    )
  if rollout.max_num_seqs is not None:
    raise ConfigError(
      f"actor_rollout_ref.rollout.max_num_seqs={rollout.max_num_seqs} with multi_turn.enable=True: multi-turn "
      "rollouts keep every trajectory's KV cache between turns (the whole batch at once); unset max_num_seqs"
    )
  if rollout.enable_rollout_routing_replay:
    raise ConfigError(
      "actor_rollout_ref.rollout.enable_rollout_routing_replay=True with multi_turn.enable=True: the turns' sampler "
      "does not record routes yet; replay works with single-turn rollouts"
    )


def resolve_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Validates, then returns a copy with verl's derived values filled in (critic defaults)."""
  validate_config(config)
  config = ml_collections.ConfigDict(config.to_dict())
  actor, critic = config.actor_rollout_ref.actor, config.critic
  if critic.enable is None:
    critic.enable = config.algorithm.adv_estimator == "gae"
  if config.algorithm.adv_estimator == "gae" and not critic.enable:
    raise ConfigError("algorithm.adv_estimator='gae' needs a critic, but critic.enable=False")
  for key in (
    "ppo_mini_batch_size",
    "ppo_micro_batch_size_per_gpu",
    "ppo_epochs",
    "shuffle",
    "loss_agg_mode",
    "loss_scale_factor",
  ):
    if critic[key] is None:
      critic[key] = actor[key]
  ref = config.actor_rollout_ref.ref
  if ref.ulysses_sequence_parallel_size is None:
    ref.ulysses_sequence_parallel_size = actor.ulysses_sequence_parallel_size
  _check_sequence_parallel(config)
  loggers = tuple(config.trainer.logger)
  if len(set(loggers)) < len(loggers):  # each would write every record again (metrics.jsonl twice)
    config.trainer.logger = tuple(dict.fromkeys(loggers))
    twice = sorted({name for name in loggers if loggers.count(name) > 1})
    logging.getLogger(__name__).warning(
      "trainer.logger lists %s more than once: using each logger once", ", ".join(twice)
    )
  rollout = config.actor_rollout_ref.rollout
  if rollout.dtype is None:
    rollout.dtype = config.actor_rollout_ref.model.dtype
  if config.data.train_batch_size % critic.ppo_mini_batch_size:
    raise ConfigError(
      f"data.train_batch_size={config.data.train_batch_size} is not divisible by "
      f"critic.ppo_mini_batch_size={critic.ppo_mini_batch_size}"
    )
  config.lock()
  return config


def sequence_parallel_sizes(config) -> dict[str, int]:
  """{"actor", "ref", "critic"}: each model's Ulysses size, of a resolved config (1 for a model the step
  does not run)."""
  rollout_ref, algorithm = config.actor_rollout_ref, config.algorithm
  uses_ref = rollout_ref.actor.use_kl_loss or algorithm.use_kl_in_reward
  return {
    "actor": rollout_ref.actor.ulysses_sequence_parallel_size,
    "ref": rollout_ref.ref.ulysses_sequence_parallel_size if uses_ref else 1,
    "critic": config.critic.ulysses_sequence_parallel_size if config.critic.enable else 1,
  }


def mesh_sequence_parallel(config) -> int:
  """The size of the mesh's `sp` axis: the models' one size above 1, or 1 (`_check_sequence_parallel`)."""
  return max(sequence_parallel_sizes(config).values())


def _check_sequence_parallel(config) -> None:
  """One `sp` axis serves every model: the sizes above 1 agree, and the reference (which runs the
  actor's module) splits as the actor does. Heads and mesh are checked with the model (`trainer.program`)."""
  sizes = sequence_parallel_sizes(config)
  actor_key, ref_key, critic_key = (SEQUENCE_PARALLEL_KEYS[role] for role in ("actor", "ref", "critic"))
  uses_ref = config.actor_rollout_ref.actor.use_kl_loss or config.algorithm.use_kl_in_reward
  if uses_ref and sizes["ref"] != sizes["actor"]:
    raise ConfigError(
      f"config keys {ref_key}={sizes['ref']} and {actor_key}={sizes['actor']} must be equal: the "
      "reference runs the actor's module (leave the ref key unset to follow the actor)"
    )
  if sizes["critic"] > 1 and sizes["actor"] > 1 and sizes["critic"] != sizes["actor"]:
    raise ConfigError(
      f"config keys {critic_key}={sizes['critic']} and {actor_key}={sizes['actor']} must be equal "
      "or 1: the models share one sequence-parallel mesh axis"
    )
