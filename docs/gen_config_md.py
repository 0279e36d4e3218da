"""Writes docs/config.md: every key of `get_base_config()` with its default, meaning and verl name.

    python docs/gen_config_md.py            # rewrite docs/config.md
    python docs/gen_config_md.py --check    # exit 1 if docs/config.md is out of date

Keys and defaults come from the config tree itself; meanings and verl equivalents from `_DOCS`
below. A key without an entry is an error, so a new config key cannot ship undocumented
(tests/docs/test_config_docs.py runs the same check).
"""

from __future__ import annotations

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

import ml_collections  # noqa: E402

from jaxrlhf.config import NOT_IMPLEMENTED, get_base_config  # noqa: E402

OUTPUT = os.path.join(_ROOT, "docs", "config.md")
SAME = "same"  # verl has exactly this key

# Sections that occur twice in the tree (actor and critic model / optimizer): documented once by suffix.
_MODEL = {
  "path": (
    "Hugging Face checkpoint directory (config.json + safetensors), or a Hub model id `org/name[@revision]` "
    "(from the hub cache, else downloaded; a path that exists wins); `\"\"` = initialise from scratch "
    "from `override_config`",
    SAME,
  ),
  "override_config.vocab_size": (
    "HF config field; with `path` it overrides config.json, without `path` it "
    "defines the from-scratch model (as do the other `override_config.*`)",
    "`override_config` (a free dict in verl, applied to a loaded HF config only)",
  ),
  "override_config.hidden_size": ("HF config field: model width", "`override_config` (free dict)"),
  "override_config.intermediate_size": ("HF config field: MLP width", "`override_config` (free dict)"),
  "override_config.num_hidden_layers": ("HF config field: decoder layers", "`override_config` (free dict)"),
  "override_config.num_attention_heads": ("HF config field: query heads", "`override_config` (free dict)"),
  "override_config.num_key_value_heads": ("HF config field: key/value heads (GQA)", "`override_config` (free dict)"),
  "override_config.head_dim": (
    "HF config field: per-head size; None = hidden_size / heads",
    "`override_config` (free dict)",
  ),
  "override_config.rope_theta": ("HF config field: RoPE base", "`override_config` (free dict)"),
  "override_config.rms_norm_eps": ("HF config field: RMSNorm epsilon", "`override_config` (free dict)"),
  "override_config.tie_word_embeddings": (
    "HF config field: LM head shares the embedding matrix",
    "`override_config` (free dict)",
  ),
  "override_config.max_position_embeddings": ("HF config field: longest position", "`override_config` (free dict)"),
  "override_config.model_type": (
    "HF config field: the family of a from-scratch model (None = llama); e.g. `qwen3_5_text` reads the keys below "
    "as its config.json would",
    "`override_config` (free dict)",
  ),
  "override_config.layer_types": (
    "HF config field (Qwen3.5): each layer's kind, `linear_attention` (Gated DeltaNet) or `full_attention`",
    "`override_config` (free dict)",
  ),
  "override_config.linear_num_key_heads": (
    "HF config field (Qwen3.5): Gated DeltaNet key heads",
    "`override_config` (free dict)",
  ),
  "override_config.linear_num_value_heads": (
    "HF config field (Qwen3.5): Gated DeltaNet value heads",
    "`override_config` (free dict)",
  ),
  "override_config.linear_key_head_dim": (
    "HF config field (Qwen3.5): Gated DeltaNet key head size",
    "`override_config` (free dict)",
  ),
  "override_config.linear_value_head_dim": (
    "HF config field (Qwen3.5): Gated DeltaNet value head size",
    "`override_config` (free dict)",
  ),
  "override_config.linear_conv_kernel_dim": (
    "HF config field (Qwen3.5): the causal conv's kernel width",
    "`override_config` (free dict)",
  ),
  "override_config.partial_rotary_factor": (
    "HF config field: the share of each head's dims RoPE rotates (Qwen3.5: 0.25)",
    "`override_config` (free dict)",
  ),
  "override_config.num_experts": (
    "HF config field (Qwen3-MoE, Qwen3.5-MoE): routed experts per layer (docs/architecture.md, Mixture of experts)",
    "`override_config` (free dict)",
  ),
  "override_config.num_experts_per_tok": (
    "HF config field (MoE): experts each token is routed to (top-k)",
    "`override_config` (free dict)",
  ),
  "override_config.moe_intermediate_size": (
    "HF config field (MoE): each expert's SwiGLU hidden size",
    "`override_config` (free dict)",
  ),
  "override_config.shared_expert_intermediate_size": (
    "HF config field (Qwen3.5-MoE): the shared expert's hidden size",
    "`override_config` (free dict)",
  ),
  "override_config.norm_topk_prob": (
    "HF config field (MoE): renormalise the top-k routing weights to sum to 1",
    "`override_config` (free dict)",
  ),
  "override_config.output_router_logits": (
    "HF config field (MoE): True adds the load-balancing loss to the actor's loss (HF's switch)",
    "`override_config` (free dict)",
  ),
  "override_config.router_aux_loss_coef": (
    "HF config field (MoE): the load-balancing loss's weight (with output_router_logits)",
    "`override_config` (free dict)",
  ),
  "use_remove_padding": (
    "sequence packing: several sequences per row with segment ids and block-diagonal "
    "attention (same numbers as the padded path)",
    SAME,
  ),
  "enable_gradient_checkpointing": ("rematerialise each decoder layer in the backward pass (`jax.checkpoint`)", SAME),
  "remat_policy": (
    "what gradient checkpointing saves: `full` (nothing), `dots_saveable`, `nothing_saveable`, ... "
    "(`jax.checkpoint_policies`)",
    "— (ours; verl has only on/off plus `enable_activation_offload`)",
  ),
  "scan_layers": (
    "the decoder layers as one `nn.scan` over stacked weights (one compiled layer body whatever "
    "the depth; KV cache stacked per layer); False = a Python loop of `layers_<i>` modules. "
    "Checkpoints of either layout load into either",
    "— (ours; XLA compile time)",
  ),
  "attention_impl": (
    "attention kernel: `auto` (cudnn on NVIDIA GPUs, splash on TPU, xla on CPU, by the mesh's "
    "devices), `xla` (the whole [L, S] score matrix), `blockwise` (online softmax over blocks, "
    "plain JAX, any backend), `cudnn` (bf16/fp16), `splash` (TPU Pallas; on a mesh of several "
    "devices it runs in a shard_map over rows and key/value heads). Packed rows (cudnn), a partial sliding "
    "window, a cache prefill, fp32 (cudnn) and a "
    "process without cuDNN (compiling ahead of time on a CPU host) fall back to blockwise; decode "
    "steps keep their own path",
    "`attn_implementation` (`flash_attention_2`, `sdpa`, `eager`)",
  ),
  "attention_block_size": ("query and key block of `blockwise` attention (and splash's tiles)", "— (ours)"),
  "linear_attention_chunk_size": (
    "Gated DeltaNet layers (Qwen3.5): tokens per chunk of the chunked delta rule (training, prefill and log-prob "
    "forwards; a decode step is recurrent)",
    "— (ours; FLA's chunk size)",
  ),
  "lora_rank": (
    "LoRA adapter rank; 0 = full fine-tuning. With a rank only the adapters (fp32) train, hold "
    "optimizer state and are checkpointed; the frozen base (adapters off) is the reference policy, "
    "and generation runs base + adapters merged once per rollout (docs/lora.md)",
    SAME,
  ),
  "lora_alpha": ("LoRA scaling: the adapter's delta is multiplied by lora_alpha / lora_rank", SAME),
  "target_modules": (
    "modules that get an adapter: `all-linear` (q/k/v/o and gate/up/down of every layer; not "
    "the LM head) or a list such as `[\"q_proj\", \"v_proj\"]` (or `q_proj,v_proj`), which may "
    "also name `lm_head` and `embed_tokens` (an untied head only)",
    SAME,
  ),
  "logits_chunk_size": (
    "LM head (log-probs, entropy) in chunks of about this many tokens per device: the "
    "[rows, length, vocab] logits never exist at once and the backward recomputes each "
    "chunk's; 0 = all positions at once. The heads only ever see response positions",
    "— (ours; verl: `entropy_from_logits_with_chunking`, `entropy_checkpointing`)",
  ),
  "dtype": ("compute dtype: `float32` or `bfloat16`", "`fsdp_config.mixed_precision` (`model_dtype` / `reduce_dtype`)"),
  "param_dtype": ("dtype the parameters are stored and updated in", "`fsdp_config.mixed_precision.param_dtype`"),
}

# The critic's meaning where it differs from the actor's.
_CRITIC_MODEL = {
  "lora_rank": (
    "LoRA adapter rank; 0 = full fine-tuning. With a rank the adapters (fp32) and the fresh value "
    "head (`score`, as PEFT's `modules_to_save`) train, hold optimizer state and are checkpointed; "
    "the backbone is frozen and rebuilt from its source on resume; export merges (docs/lora.md)"
  ),
  "target_modules": (
    "modules that get an adapter: `all-linear` (q/k/v/o and gate/up/down of every layer) or a "
    "list such as `[\"q_proj\", \"v_proj\"]`, which may also name `embed_tokens`; not "
    "`lm_head` (the critic has none; its value head trains in full)"
  ),
}

_OPTIM = {
  "lr": ("peak learning rate (AdamW)", SAME),
  "betas": ("AdamW (beta1, beta2)", SAME),
  "eps": ("AdamW epsilon", "— (torch AdamW default 1e-8)"),
  "weight_decay": ("AdamW decoupled weight decay", SAME),
  "lr_warmup_steps": ("linear warm-up steps from lr 0 at step 0; <= 0 = use `lr_warmup_steps_ratio`", SAME),
  "lr_warmup_steps_ratio": ("warm-up as a fraction of the total training steps", SAME),
  "lr_scheduler_type": ("`constant` or `cosine` (after warm-up)", "same (older verl: `warmup_style`)"),
  "min_lr_ratio": ("cosine floor as a fraction of `lr`", SAME),
  "num_cycles": ("cosine waves over the decay phase (0.5: one half-wave from `lr` down to the floor)", SAME),
}

_DOCS = {
  # ----- data
  "data.train_files": (
    "training parquet files (verl row format, docs/algorithms.md §8) or `builtin:<task>:train`",
    "same (a string or a list)",
  ),
  "data.val_files": ("validation files; `(\"\",)` = no validation", "same"),
  "data.tokenizer": (
    "tokenizer directory or Hub model id; `\"\"` = the actor's `model.path`; `builtin:<task>` = "
    "the built-in word-level tokenizer",
    "same (no `builtin:`)",
  ),
  "data.prompt_key": ("column holding the chat messages", SAME),
  "data.reward_fn_key": ("column selecting the reward function", SAME),
  "data.max_prompt_length": (
    "prompt tokens at most; with `bucket_prompt_lengths=False` every prompt is left-padded to this",
    SAME,
  ),
  "data.max_response_length": ("generated tokens per response", SAME),
  "data.train_batch_size": ("prompts per training step (each sampled `rollout.n` times)", SAME),
  "data.gen_batch_size": (
    "DAPO dynamic sampling: prompts generated per round before filtering; None = `train_batch_size`",
    "same (DAPO recipe)",
  ),
  "data.val_batch_size": ("validation prompts per batch; None = the whole set in one batch", SAME),
  "data.shuffle": ("reshuffle the training prompts every epoch", SAME),
  "data.seed": ("seed of the prompt order", SAME),
  "data.truncation": ("an over-long prompt: `error`, or keep its `left`/`right`/`middle` part", SAME),
  "data.filter_overlong_prompts": ("drop prompts longer than `max_prompt_length` when loading", SAME),
  "data.train_max_samples": (
    "use this many rows of `train_files` (<= 0: all): with `shuffle` a subset drawn with `seed` at load, else the "
    "first rows; chosen before `filter_overlong_prompts`",
    SAME,
  ),
  "data.val_max_samples": ("as `train_max_samples`, for `val_files`", SAME),
  "data.apply_chat_template_kwargs.enable_thinking": (
    "passed to the tokenizer's `apply_chat_template` (Qwen3's thinking switch); None = not passed",
    SAME,
  ),
  "data.apply_chat_template_kwargs.reasoning_effort": (
    "passed to the tokenizer's `apply_chat_template` (gpt-oss); None = not passed",
    SAME,
  ),
  "actor_rollout_ref.model.custom_chat_template": (
    "a Jinja chat template used instead of the tokenizer's own (prompts, and the template saved with the run)",
    SAME,
  ),
  "data.bucket_prompt_lengths": (
    "left-pad each batch's prompts (training, DAPO rounds, validation) to its longest "
    "prompt rounded up to a length bucket (16, 32, 64, ... below `max_prompt_length`, "
    "and `max_prompt_length`): one compiled step per bucket used, same numbers as "
    "full padding; False = always `max_prompt_length`. `jaxrlhf.aot` compiles "
    "`max_prompt_length` (the worst case)",
    "none (verl pads every prompt to `max_prompt_length`)",
  ),
  # ----- actor
  "actor_rollout_ref.actor.ppo_mini_batch_size": ("prompts per PPO update (x `rollout.n` sequences)", SAME),
  "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": (
    "sequences per device per gradient-accumulation step; None = the whole per-device mini-batch",
    SAME,
  ),
  "actor_rollout_ref.actor.use_dynamic_bsz": ("form micro-batches by a token budget instead of a row count", SAME),
  "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": ("token budget of one micro-batch with `use_dynamic_bsz`", SAME),
  "actor_rollout_ref.actor.clip_ratio": ("PPO clip epsilon (docs/algorithms.md §4)", SAME),
  "actor_rollout_ref.actor.clip_ratio_low": ("lower clip epsilon; None = `clip_ratio`", "same (verl's default is 0.2)"),
  "actor_rollout_ref.actor.clip_ratio_high": (
    "upper clip epsilon (DAPO clip-higher: 0.28); None = `clip_ratio`",
    "same (verl's default is 0.2)",
  ),
  "actor_rollout_ref.actor.clip_ratio_c": ("dual-clip bound for negative advantages", SAME),
  "actor_rollout_ref.actor.policy_loss.loss_mode": (
    "`vanilla`, `gspo`, `gpg`, `cispo`, `geo_mean`, "
    "`clip_cov`, `kl_cov`, `sapo`, `dro`, `dppo_tv`, `dppo_kl`, "
    "`bypass_mode` or a registered one",
    SAME,
  ),
  "actor_rollout_ref.actor.policy_loss.dro_beta": (
    "`dro`: weight of the quadratic log-ratio penalty (required, > 0)",
    SAME,
  ),
  "actor_rollout_ref.actor.tau_pos": ("`sapo`: gate temperature for tokens with A > 0", SAME),
  "actor_rollout_ref.actor.tau_neg": ("`sapo`: gate temperature for tokens with A <= 0", SAME),
  "actor_rollout_ref.actor.loss_scale_factor": (
    "`seq-mean-token-sum-norm` divisor (after the mean over sequences); None = the padded response length",
    SAME,
  ),
  "actor_rollout_ref.actor.policy_loss.clip_cov_ratio": ("`clip_cov`: fraction of tokens clipped", SAME),
  "actor_rollout_ref.actor.policy_loss.clip_cov_lb": ("`clip_cov`: covariance lower bound", SAME),
  "actor_rollout_ref.actor.policy_loss.clip_cov_ub": ("`clip_cov`: covariance upper bound", SAME),
  "actor_rollout_ref.actor.policy_loss.kl_cov_ratio": ("`kl_cov`: fraction of tokens with the KL penalty", SAME),
  "actor_rollout_ref.actor.policy_loss.ppo_kl_coef": ("`kl_cov`: coefficient of that penalty", SAME),
  "actor_rollout_ref.actor.loss_agg_mode": (
    "`token-mean`, `token-sum`, `seq-mean-token-sum`, "
    "`seq-mean-token-mean`, `seq-mean-token-sum-norm` "
    "(docs/algorithms.md §4; the normalisers count the whole "
    "mini-batch, as verl 0.9.1)",
    SAME,
  ),
  "actor_rollout_ref.actor.entropy_coeff": ("weight of the entropy bonus", SAME),
  "actor_rollout_ref.actor.use_kl_loss": ("add `kl_loss_coef * KL(pi, ref)` to the actor loss", SAME),
  "actor_rollout_ref.actor.kl_loss_coef": ("KL loss weight", SAME),
  "actor_rollout_ref.actor.kl_loss_type": (
    "KL estimator: `kl`/`k1`, `abs`, `mse`/`k2`, `low_var_kl`/`k3`, "
    "`full` (exact KL over the vocabulary from both policies' logits, "
    "per LM-head chunk), or `<name>+` (straight-through)",
    "same, and `full` works here (verl 0.9.1 raises on it)",
  ),
  "actor_rollout_ref.actor.ppo_epochs": ("passes over the rollout batch per step", SAME),
  "actor_rollout_ref.actor.shuffle": ("reshuffle the mini-batches every epoch (seeded)", SAME),
  "actor_rollout_ref.actor.grad_clip": ("global gradient-norm clip; a step with a non-finite norm is skipped", SAME),
  "actor_rollout_ref.actor.fsdp_config.param_offload": (
    "keep the actor's parameters in pinned host memory "
    "between the phases that use them (generation, old "
    "log-prob, update)",
    SAME,
  ),
  "actor_rollout_ref.actor.fsdp_config.optimizer_offload": (
    "keep the actor's optimizer state in pinned host memory between updates",
    SAME,
  ),
  "critic.model.fsdp_config.param_offload": (
    "keep the critic's parameters in pinned host memory between the phases that use them (values, update)",
    SAME,
  ),
  "critic.model.fsdp_config.optimizer_offload": (
    "keep the critic's optimizer state in pinned host memory between updates",
    SAME,
  ),
  "actor_rollout_ref.actor.ulysses_sequence_parallel_size": (
    "Ulysses sequence parallelism: devices of `mesh.fsdp` that split each sequence of the actor's training "
    "and log-prob forwards (all-to-all around attention; docs/sequence_parallel.md). Must divide `mesh.fsdp` "
    "and, times `mesh.tensor`, the query and key/value heads; micro-batches are then `devices / sp` rows "
    "per `..._per_gpu`",
    SAME,
  ),
  # ----- rollout
  "actor_rollout_ref.rollout.name": ("generation engine", "same (verl: `vllm`, `sglang`, `hf`)"),
  "actor_rollout_ref.rollout.temperature": ("sampling temperature (log-probs and entropy use the same scaling)", SAME),
  "actor_rollout_ref.rollout.top_k": ("top-k sampling; -1 = off", SAME),
  "actor_rollout_ref.rollout.top_p": ("nucleus sampling; 1.0 = off", SAME),
  "actor_rollout_ref.rollout.n": ("samples per prompt (a GRPO group)", SAME),
  "actor_rollout_ref.rollout.do_sample": ("sample; False = greedy", SAME),
  "actor_rollout_ref.rollout.tensor_model_parallel_size": (
    "tensor-parallel degree k of the generation layout (the weights are resharded for generation inside the "
    "step): k <= `mesh.tensor` generates over `tensor` as training does; larger, a multiple of `mesh.tensor` "
    "dividing `mesh.fsdp` x `mesh.tensor`, splits heads / mlp / vocab over `tensor` and k / tensor of the fsdp "
    "devices and the batch over the rest (training stays FSDP); key/value heads that k does not divide are "
    "repeated for generation",
    SAME,
  ),
  "actor_rollout_ref.rollout.dtype": (
    "compute dtype of generation (`float32` | `bfloat16`); the actor's weights "
    "are cast once per rollout, matmuls accumulate in fp32. None = the actor's "
    "`model.dtype`",
    "same key (verl's default: `bfloat16`)",
  ),
  "actor_rollout_ref.rollout.max_num_batched_tokens": ("token budget of one generation batch", SAME),
  "actor_rollout_ref.rollout.max_num_seqs": (
    "rows that decode at once per generation shard (a data-parallel block of the generation layout; one device "
    "without a mesh): the KV cache holds this many rows, and a finished row's slot takes the next prompt inside the "
    "compiled loop (`jaxrlhf/rollout/slots.py`); rows sample with per-row keys, so responses do not depend on it. "
    "None = the whole batch at once (one key for the batch)",
    "same key (vLLM's concurrent sequences per engine; verl's default 1024)",
  ),
  "actor_rollout_ref.rollout.enable_rollout_routing_replay": (
    "rollout routing replay (a model with experts): the sampler records the experts each token was routed to in "
    "every layer, and the actor's old-log-prob and update forwards route by that record (the reference's routes by "
    "its own router); metric `actor/moe_replay_route_mismatch`. Single-turn rollouts (docs/algorithms.md)",
    "same key (verl's R3, with `actor.megatron.router_replay.mode=R3`; default False)",
  ),
  "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": (
    "sequences per device per micro-batch of the "
    "old-log-prob phase (and of the reference and "
    "values phases unless they set theirs); None = "
    "all at once (packed: the update's slots)",
    SAME,
  ),
  "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": (
    "sequences per device per micro-batch of the reference log-prob phase; None = the rollout's",
    SAME,
  ),
  "actor_rollout_ref.rollout.multi_turn.enable": (
    "multi-turn rollouts with tools ([tools.md](tools.md)): a turn ends at EOS (or, with one call per turn, where a "
    "tool call closes); the host runs the turn's tool calls and appends their responses through the chat template, "
    "out of the loss; generation goes on from the KV cache",
    "same key (verl 0.9.1 selects its tool loop by `rollout.agent.default_agent_loop=tool_agent` or the rows' "
    "`agent_name`; verl_compat translates both to this key)",
  ),
  "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": (
    "a trajectory ends after this many policy turns (a call in the last one does not run); None = no limit",
    SAME,
  ),
  "actor_rollout_ref.rollout.multi_turn.max_user_turns": (
    "a trajectory ends after the policy's turn that follows this many tool turns; None = no limit",
    SAME,
  ),
  "actor_rollout_ref.rollout.multi_turn.tool_config_path": (
    "the tool YAML (`tools: - class_name, config, tool_schema`); `builtin:<name>` for a packaged one "
    "(`gsm8k`, `calculator`, `lookup`)",
    SAME,
  ),
  "actor_rollout_ref.rollout.multi_turn.max_parallel_calls": (
    "tool calls of one turn that run, concurrently (the rest are dropped, as verl)",
    SAME,
  ),
  "actor_rollout_ref.rollout.multi_turn.max_tool_response_length": (
    "characters of a tool response kept (verl's truncation marker added)",
    SAME,
  ),
  "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side": (
    "`left` keeps the end, `right` the start, `middle` both ends",
    SAME,
  ),
  "actor_rollout_ref.rollout.multi_turn.format": ("the tool-call format the parser reads: `hermes`", SAME),
  "actor_rollout_ref.rollout.multi_turn.tool_timeout_s": (
    "seconds a tool call may take (create and execute); a call over it, like one that raises, returns an "
    "error text the policy reads",
    "jaxrlhf's (verl has no timeout: a hanging tool blocks its batch)",
  ),
  "actor_rollout_ref.rollout.val_kwargs.temperature": ("validation sampling temperature", SAME),
  "actor_rollout_ref.rollout.val_kwargs.top_k": ("validation top-k", SAME),
  "actor_rollout_ref.rollout.val_kwargs.top_p": ("validation top-p", SAME),
  "actor_rollout_ref.rollout.val_kwargs.n": ("validation samples per prompt (`mean@n`)", SAME),
  "actor_rollout_ref.rollout.val_kwargs.do_sample": ("validation sampling; False = greedy", SAME),
  "actor_rollout_ref.ref.fsdp_config.param_offload": ("keep the reference parameters in pinned host memory", SAME),
  "actor_rollout_ref.ref.ulysses_sequence_parallel_size": (
    "the reference's sequence parallelism; None = the actor's (it must equal it: the same module)",
    "same key (verl's default: the actor's)",
  ),
  # ----- critic
  "critic.ulysses_sequence_parallel_size": (
    "the critic's sequence parallelism: 1 or the actor's size (one `sp` mesh axis)",
    SAME,
  ),
  "critic.enable": ("train a value model; None = on exactly when `adv_estimator == 'gae'`", SAME),
  "critic.cliprange_value": ("value clip range `c` (docs/algorithms.md §4; 0.2 is common practice)", SAME),
  "critic.loss_agg_mode": ("value-loss aggregation; None = the actor's", SAME),
  "critic.loss_scale_factor": (
    "`seq-mean-token-sum-norm` divisor of the value loss; None = the actor's (as verl)",
    SAME,
  ),
  "critic.ppo_mini_batch_size": ("prompts per critic update; None = the actor's", SAME),
  "critic.ppo_micro_batch_size_per_gpu": ("critic micro-batch; None = the actor's", SAME),
  "critic.forward_micro_batch_size_per_gpu": (
    "sequences per device per micro-batch of the values phase; None = "
    "the rollout's `log_prob_micro_batch_size_per_gpu`",
    SAME,
  ),
  "critic.ppo_epochs": ("critic passes per step; None = the actor's", SAME),
  "critic.shuffle": ("critic mini-batch shuffling; None = the actor's", SAME),
  "critic.grad_clip": ("critic gradient-norm clip", SAME),
  # ----- reward
  "reward_model.enable": ("score with a learned reward model (in addition to rule rewards)", SAME),
  "reward_model.model.path": (
    "reward model checkpoint (HF sequence classification, num_labels=1; the "
    "actor's tokenizer), or with `generative` a causal LM judge with its own tokenizer: a directory or a Hub model id",
    SAME,
  ),
  "reward_model.reward_manager": (
    "`naive`, `dapo`, `gdpo`: the reward function scores one sample a call; `batch`: one call per batch with "
    "lists (`data_sources`, `solution_strs`, `ground_truths`, `extra_infos`), returning a score per sample",
    "`reward.reward_manager.name` in verl 0.9.1 (`reward_model.reward_manager` before)",
  ),
  "reward_model.combine_with_rule": (
    "True: score = rule reward + reward model; False: the reward model alone",
    "— (ours; verl uses the reward model alone when it is on)",
  ),
  "reward_model.on_error": (
    "a reward function that raises, exits, crashes or times out: `raise`, or `zero` "
    "(scores 0, counted in `reward/num_errors`)",
    "— (ours; verl always raises)",
  ),
  "reward_model.num_workers": (
    "processes that score the rule reward: `0` = the trainer's process, one sample "
    "after another, no time limit; `N` = N worker processes (a crash or `sys.exit` "
    "fails one sample; a dead worker is replaced); `None` = `min(8, cores)` for a "
    "`custom_reward_function` file, `0` for the built-in rules (faster in-process)",
    "same name (verl: 8)",
  ),
  "reward_model.timeout_s": (
    "seconds a sample may take in a worker process; longer fails it (`on_error`). Not applied with `num_workers=0`",
    "— (ours)",
  ),
  "reward_model.overlong_buffer.enable": (
    "DAPO overlong shaping: linear penalty for responses entering the last `len` tokens before `max_response_length`",
    "same (DAPO recipe)",
  ),
  "reward_model.overlong_buffer.len": ("tokens of the penalty buffer", "same (DAPO recipe)"),
  "reward_model.overlong_buffer.penalty_factor": (
    "penalty at `max_response_length` (reached linearly)",
    "same (DAPO recipe)",
  ),
  "reward_model.generative": (
    "True: `model.path` is a causal LM judge with its own tokenizer (LLM-as-judge, docs/algorithms.md "
    "\"A generative reward model\"): each response fills `judge.prompt_template`, the judge replies inside the step "
    "and `judge.score_function` parses the reply into the score (`on_error`, `timeout_s`, `num_workers` apply)",
    "— (verl: a reward model whose `custom_reward_function` posts to its reward router is generative)",
  ),
  "reward_model.judge.prompt_template": (
    "`str.format` template of a judge prompt: `{prompt}` (the policy's prompt, decoded), `{response}`, "
    "`{ground_truth}`, `{data_source}`, `{extra_info}` (the row's dict: `{extra_info[question]}`); a literal "
    "brace is `{{` or `}}`",
    "— (verl: the template inside the user's reward function)",
  ),
  "reward_model.judge.apply_chat_template": (
    "the filled template as one user message through the judge tokenizer's chat template (with the generation "
    "prompt), as `jaxrlhf.generate --chat`; False, or a tokenizer without one: the text as it is",
    "— (verl's router applies the chat template of `/v1/chat/completions`)",
  ),
  "reward_model.judge.score_function.path": (
    "Python file with the judge's parser, called as verl calls a reward function plus the judge's reply: "
    "`fn(data_source, solution_str, ground_truth, extra_info, judge_response)` -> a number or a dict with "
    "`score`; a reply it rejects (raises, no number) fails that sample (`on_error`); `\"\"` = the last number of "
    "the reply",
    "— (verl: the parsing part of a generative `custom_reward_function`)",
  ),
  "reward_model.judge.score_function.name": ("the parser's function name in `score_function.path`", "— (ours)"),
  "reward_model.rollout.prompt_length": (
    "judge prompt tokens (left-padded); a longer judge prompt fails its sample (`on_error`), it is not truncated",
    "`reward.reward_model.rollout.prompt_length`",
  ),
  "reward_model.rollout.response_length": (
    "tokens of a judge's reply at most",
    "`reward.reward_model.rollout.response_length`",
  ),
  "reward_model.rollout.do_sample": (
    "False: greedy replies (the default here: a verdict should not be a draw); True: sampled with "
    "`temperature`, `top_k`, `top_p`",
    "`reward.reward_model.rollout.do_sample` (verl: True)",
  ),
  "reward_model.rollout.temperature": ("judge sampling temperature", "`reward.reward_model.rollout.temperature`"),
  "reward_model.rollout.top_k": ("judge top-k; -1 = off", "`reward.reward_model.rollout.top_k`"),
  "reward_model.rollout.top_p": ("judge nucleus sampling; 1.0 = off", "`reward.reward_model.rollout.top_p`"),
  "reward_model.rollout.max_num_seqs": (
    "judge prompts decoding at once per generation shard (slots refilled in-graph, as "
    "`actor_rollout_ref.rollout.max_num_seqs`); None = all of them",
    "`reward.reward_model.rollout.max_num_seqs`",
  ),
  "reward_model.rollout.seed": (
    "a sampling judge's key: batch row r, judging a response to data row i, draws with (seed, i, r)",
    "`reward.reward_model.rollout.seed`",
  ),
  "reward_model.rollout.dtype": (
    "the judge's compute dtype in generation (`float32` | `bfloat16`): its weights are cast once a step",
    "`reward.reward_model.rollout.dtype` (verl: bfloat16)",
  ),
  "custom_reward_function.path": (
    "Python file with a reward function; `\"\"` = the built-in ones by `data_source`",
    "same (also top level in verl)",
  ),
  "custom_reward_function.name": (
    "function name in that file, `f(data_source, solution_str, ground_truth, extra_info)`",
    SAME,
  ),
  # ----- on-policy distillation
  "distillation.enabled": (
    "a frozen teacher scores every sampled response token inside the step; its loss joins the actor's "
    "(docs/algorithms.md \"On-policy distillation\")",
    SAME,
  ),
  "distillation.distillation_loss.loss_mode": (
    "`k1`/`kl`, `abs`, `k2`/`mse`, `k3`/`low_var_kl`: reverse-KL estimators at the sampled token (the teacher's "
    "log-prob of it); `forward_kl_topk`: KL(teacher || student) over the teacher's top-k tokens",
    SAME,
  ),
  "distillation.distillation_loss.topk": (
    "`forward_kl_topk`: the teacher's k most likely tokens per position (computed by chunks of the LM head)",
    SAME,
  ),
  "distillation.distillation_loss.use_task_rewards": (
    "True: the PPO loss + `distillation_loss_coef` x the distillation term; False: the distillation term alone",
    SAME,
  ),
  "distillation.distillation_loss.distillation_loss_coef": (
    "weight of the distillation term beside the PPO loss (read with `use_task_rewards`)",
    SAME,
  ),
  "distillation.distillation_loss.loss_max_clamp": (
    "per-token loss clamped to [-c, c] before aggregation; None = no clamp",
    SAME,
  ),
  "distillation.distillation_loss.log_prob_min_clamp": (
    "`forward_kl_topk`: floor of the student's and teacher's top-k log-probs; None = none",
    SAME,
  ),
  "distillation.distillation_loss.use_policy_gradient": (
    "True: the per-token loss, negated and stopped, is the advantage of a vanilla PPO loss (the KL as a reward); "
    "False: the loss is minimised directly (`k1` needs True)",
    SAME,
  ),
  "distillation.distillation_loss.policy_loss_mode": ("the PPO loss of `use_policy_gradient`: `vanilla` only", SAME),
  "distillation.distillation_loss.clip_ratio": ("`use_policy_gradient`: PPO clip range", SAME),
  "distillation.distillation_loss.clip_ratio_low": ("`use_policy_gradient`: lower clip range", SAME),
  "distillation.distillation_loss.clip_ratio_high": ("`use_policy_gradient`: upper clip range", SAME),
  "distillation.teacher_model.model_path": (
    "the teacher: an HF causal-LM checkpoint directory or Hub id, any size or family jaxrlhf loads, with the "
    "student's vocabulary; frozen, sharded like the reference policy",
    "`distillation.teacher_models.teacher_model.model_path` (one teacher)",
  ),
  # ----- algorithm
  "algorithm.gamma": ("discount (GAE, REINFORCE++); 0.99 is the usual choice for PPO", SAME),
  "algorithm.lam": ("GAE lambda; 0.95 is the usual choice", SAME),
  "algorithm.adv_estimator": (
    "`gae`, `grpo`, `rloo`, `reinforce_plus_plus`, `reinforce_plus_plus_baseline`, "
    "`remax`, `opo`, `gpg`, `grpo_passk`, `gdpo`, `optimal_token_baseline`, "
    "`tir_optimal_token_baseline`, `grpo_vectorized`, `rloo_vectorized` "
    "(docs/algorithms.md §3)",
    SAME,
  ),
  "algorithm.gdpo_reward_keys": (
    "`gdpo`: reward components (keys of the dict the reward function returns), each group-normalised on its own",
    SAME,
  ),
  "algorithm.gdpo_reward_weights": ("`gdpo`: weight of each component in the sum; None = 1 each", SAME),
  "algorithm.rollout_correction.rollout_is": (
    "importance weights pi_train / pi_rollout: None (off), `token` or `sequence`",
    SAME,
  ),
  "algorithm.rollout_correction.rollout_is_threshold": (
    "`\"upper\"` truncates the weights (TIS); `\"lower_upper\"` zeroes them outside (IcePop)",
    "same (verl also takes a float)",
  ),
  "algorithm.rollout_correction.rollout_is_batch_normalize": (
    "rescale the weights to mean 1: over the batch (decoupled mode) or the micro-batch (bypass mode)",
    SAME,
  ),
  "algorithm.rollout_correction.rollout_rs": (
    "rejection: comma-separated `token_k1/k2/k3`, `seq_sum_k1/k2/k3`, `seq_mean_k1/k2/k3`, `seq_max_k2/k3`; None = off",
    SAME,
  ),
  "algorithm.rollout_correction.rollout_rs_threshold": (
    "one threshold, or one per `rollout_rs` option (comma-separated; k1 takes ratio bounds `lower_upper`)",
    "same (verl also takes a float)",
  ),
  "algorithm.rollout_correction.bypass_mode": (
    "True: the rollout's log-probs serve as `old_log_prob` and `loss_mode` becomes `bypass_mode`",
    SAME,
  ),
  "algorithm.rollout_correction.loss_type": (
    "bypass mode loss: `ppo_clip` (the ratio is the correction) or `reinforce` (-A * log-prob * weight)",
    SAME,
  ),
  "algorithm.norm_adv_by_std_in_grpo": ("GRPO divides by the group std; False = Dr.GRPO", SAME),
  "algorithm.use_kl_in_reward": ("subtract `beta * KL` from the token rewards", SAME),
  "algorithm.kl_penalty": (
    "KL estimator for the in-reward penalty (as `kl_loss_type`; `full` runs the "
    "reference in the old-log-prob phase, which then replaces the ref phase)",
    "same, and `full` works here (verl 0.9.1 raises on it)",
  ),
  "algorithm.kl_ctrl.type": ("`fixed` or `adaptive` coefficient (docs/algorithms.md §2; checkpointed)", SAME),
  "algorithm.kl_ctrl.kl_coef": ("initial in-reward KL coefficient `beta`", SAME),
  "algorithm.kl_ctrl.horizon": ("adaptive controller horizon", SAME),
  "algorithm.kl_ctrl.target_kl": ("adaptive controller target", SAME),
  "algorithm.filter_groups.enable": (
    "DAPO dynamic sampling: drop groups whose `metric` is equal for every "
    "sample, generate more until the batch is full",
    "same (DAPO recipe)",
  ),
  "algorithm.filter_groups.metric": ("`score` or `seq_reward`", "same (DAPO recipe; verl also has `acc`)"),
  "algorithm.filter_groups.max_num_gen_batches": (
    "generation rounds allowed per step; 0 = no limit",
    "same (DAPO recipe)",
  ),
  # ----- trainer
  "trainer.total_epochs": ("passes over the training prompts (unless `total_training_steps`)", SAME),
  "trainer.total_training_steps": ("steps to run; None = epochs x batches per epoch", SAME),
  "trainer.project_name": ("run directory `<default_local_dir>/<project>/<experiment>`, tracker project", SAME),
  "trainer.experiment_name": ("run name", SAME),
  "trainer.logger": (
    "sinks: `console`, `jsonl`, `wandb`, `tensorboard`, `mlflow`",
    "same (verl has no `jsonl`; its file logger differs)",
  ),
  "trainer.save_freq": ("checkpoint every N steps (and at the end); -1 = never", SAME),
  "trainer.test_freq": ("validate every N steps (and at the end); -1 = never", SAME),
  "trainer.val_before_train": ("validate once before the first step", SAME),
  "trainer.critic_warmup": ("steps that update only the critic", SAME),
  "trainer.resume_mode": ("`auto` (latest checkpoint of the run), `disable`, `resume_path`", SAME),
  "trainer.resume_from_path": ("`.../global_step_N` for `resume_mode=resume_path`", SAME),
  "trainer.default_local_dir": (
    "root of run directories (checkpoints, metrics.jsonl, plots)",
    "same (verl's default already includes project/experiment)",
  ),
  "trainer.max_actor_ckpt_to_keep": ("checkpoints kept; None or 0 = all (verl's 0)", SAME),
  "trainer.save_hf": (
    "also export the actor (and critic) in HF format at every save, into `<run dir>/huggingface/global_step_N`",
    "— (ours; verl converts afterwards with its model merger)",
  ),
  "trainer.seed": ("seed of initialisation, sampling and mini-batch shuffling", "— (ours; verl seeds per worker)"),
  "trainer.plot": ("write `<run dir>/metrics.png` at the end (needs the `jsonl` logger)", "— (ours)"),
  "trainer.fuse_step": (
    "True: one compiled program per step; False: phased mode, one jit per stage with `timing_s/*` (same numbers)",
    "— (ours; verl always runs phases)",
  ),
  "trainer.val_only": ("validate once (the validation before training) and exit", SAME),
  "trainer.rollout_data_dir": (
    "each step's generations written as `<dir>/<step>.jsonl` (input, output, gts, score, step, reward extras)",
    "same (verl's `_dump_generations`)",
  ),
  "trainer.validation_data_dir": (
    "each validation's generations written as `<dir>/<step>.jsonl`, as `rollout_data_dir`",
    "same (verl's `_dump_generations`)",
  ),
  "trainer.log_val_generations": (
    "validation samples written to `<run dir>/val_generations.jsonl`",
    "same (verl logs them to the tracker)",
  ),
  "trainer.peak_flops_per_device": (
    "peak FLOP/s of one device for `perf/mfu/*` (`actor`, `critic`: the update "
    "phases, phased mode; `step`: the fused step); None = the known "
    "accelerator table, or measured once on CPU",
    "— (ours)",
  ),
  "trainer.prometheus_port": (
    "serve metrics as Prometheus gauges on this port; None = off, 0 = any free port",
    "— (ours)",
  ),
  "trainer.profile_steps": (
    "global steps (from 1) traced with `jax.profiler` into `<run dir>/profile`",
    "`global_profiler.steps` (older verl: `trainer.profile_steps`, nsys)",
  ),
  "trainer.guard.enable": (
    "on a KL blow-up or reward collapse: restore the last checkpoint, scale the lr by "
    "`lr_backoff`, continue (roll back on a spike, as PPO practice guides advise)",
    "— (ours)",
  ),
  "trainer.guard.kl_max": ("KL above this triggers a rollback (suggested: 0.1)", "— (ours)"),
  "trainer.guard.reward_drop": (
    "relative drop of `critic/score/mean` below its moving average that triggers a rollback (suggested: 20%)",
    "— (ours)",
  ),
  "trainer.guard.reward_window": ("steps in that moving average", "— (ours)"),
  "trainer.guard.lr_backoff": ("learning-rate factor applied at each rollback", "— (ours)"),
  "trainer.guard.max_rollbacks": ("stop with an error after this many rollbacks", "— (ours)"),
  "trainer.guard.kl_warmup_steps_ratio": (
    "no KL term (loss or reward) for this fraction of the first steps (suggested: 5%)",
    "— (ours)",
  ),
  "trainer.v1.trainer_mode": (
    "sync: each step generates its batch, then trains on it. colocate_async: partial rollouts (verl's mode of "
    "that name): prompt groups decode in the rollout's max_num_seqs slots in a pool carried from step to step in "
    "the train state; a step admits its batch, decodes until train_batch_size groups have finished (a group, a "
    "prompt's n samples, is the unit that finishes), trains on the oldest of them and carries the rest, slot cache "
    "and behaviour log-probs included (`jaxrlhf/rollout/partial.py`). separate_async: refused (one mesh runs both)",
    SAME,
  ),
  "trainer.v1.colocate_async.num_warmup_batches": (
    "batches admitted to the pool before the first step (the schedule's first batches; step k then admits batch "
    "k + this): the pool holds 1 + this many batches of groups. Whole batches only",
    "same key (verl also takes fractions)",
  ),
  "trainer.v1.colocate_async.partial_rollout": (
    "True: a step stops decoding once enough groups have finished (partial rollout). False: it decodes every "
    "admitted group to the end and trains on the oldest batch: with 1 warm-up batch, one-step-off-policy (step k "
    "trains on the batch step k - 1 generated)",
    "— (ours: verl's colocate_async is always partial)",
  ),
  "trainer.v1.sampler.max_off_policy_threshold": (
    "model versions a trained group may span (step - step admitted + 1); None: no bound. colocate_async only",
    SAME,
  ),
  "trainer.v1.sampler.max_off_policy_strategy": (
    "drop: a finished group past the threshold is not trained, and its prompt starts again as the newest (verl "
    "refills with a fresh prompt). wait: the step decodes on until every unfinished group at the threshold has "
    "finished, and trains it",
    SAME,
  ),
  # ----- mesh
  "mesh.data": (
    "devices along the pure data-parallel axis; -1 = fill",
    "— (ours; verl: `trainer.n_gpus_per_node` x `trainer.nnodes`)",
  ),
  "mesh.fsdp": (
    "devices along the fully-sharded data-parallel axis; -1 = fill (product of the axes = device count)",
    "— (ours; verl: `actor.fsdp_config.fsdp_size`)",
  ),
  "mesh.tensor": (
    "devices along the tensor-parallel axis (training layout)",
    "— (ours; verl's training TP is Megatron's `tensor_model_parallel_size`)",
  ),
}

_SECTION_TITLES = {
  "data": "Data",
  "actor_rollout_ref": "Actor, rollout and reference",
  "critic": "Critic",
  "reward_model": "Reward model",
  "custom_reward_function": "Custom reward function",
  "distillation": "On-policy distillation",
  "algorithm": "Algorithm",
  "trainer": "Trainer",
  "mesh": "Mesh",
}


def walk(config: ml_collections.ConfigDict, prefix: str = ""):
  """(key, default, type name) for every leaf; top-level sections in docs/algorithms.md §6 order, keys sorted
  below."""
  names = config.keys()
  if not prefix:
    names = sorted(names, key=lambda n: (list(_SECTION_TITLES).index(n) if n in _SECTION_TITLES else 99, n))
  for name in names:
    value = config[name]
    key = prefix + name
    if isinstance(value, ml_collections.ConfigDict):
      yield from walk(value, key + ".")
    else:
      yield key, value, config.get_type(name).__name__


def describe(key: str) -> tuple[str, str]:
  """(meaning, verl equivalent) of a key; raises KeyError for an undocumented key."""
  if key in _DOCS:
    return _DOCS[key]
  for section, table in (
    ("actor_rollout_ref.model.", _MODEL),
    ("critic.model.", _MODEL),
    ("actor_rollout_ref.actor.optim.", _OPTIM),
    ("critic.optim.", _OPTIM),
  ):
    if key.startswith(section) and key[len(section) :] in table:
      meaning, verl = table[key[len(section) :]]
      if section.startswith("critic.model.") and key.endswith(".path"):
        meaning = (
          "critic checkpoint (a directory or a Hub model id); `\"\"` = the actor's `model.path` with a fresh value head"
        )
      if section.startswith("critic.model.") and key[len(section) :] in _CRITIC_MODEL:
        meaning = _CRITIC_MODEL[key[len(section) :]]
      return meaning, verl
  raise KeyError(f"config key '{key}' has no entry in docs/gen_config_md.py; add its meaning and verl name")


def format_default(value) -> str:
  return f"`{value!r}`"


_PARITY = """
## Parity with verl 0.9.1

Same as verl 0.9.1, shown by `tests/algos/test_verl_parity.py` (3 seeds, part of the test suite) and
`python benchmarks/verl_parity.py --seeds 20` (23,820 comparisons): jaxrlhf against a NumPy transcription of
verl's formulas (`tests/algos/verl_reference.py`) on random masked inputs with interior holes and a padding
row, agreeing to 1e-5 (rtol and atol):
- `loss_agg_mode` (all five modes, with `loss_scale_factor`, and summed over micro-batches with the mini-batch
  normalisers = verl's `batch_num_tokens` / `global_batch_size`), the KL estimators `kl/k1/abs/mse/k2/
  low_var_kl/k3` and their `+` variants (value), the value loss and `vf_clipfrac`;
- policy losses `vanilla, gspo, sapo, gpg, cispo, dro, dppo_tv, dppo_kl, kl_cov, clip_cov` (all candidates
  detached), `geo_mean` and `bypass_mode` (`ppo_clip` and `reinforce`), each with and without
  `rollout_is_weights`, with their `pg_clipfrac`, `pg_clipfrac_lower` and `ppo_kl`;
- advantage estimators `gae, grpo, grpo_vectorized, grpo_passk, rloo, rloo_vectorized, reinforce_plus_plus,
  reinforce_plus_plus_baseline, remax, opo, gpg, gdpo` (with reward components and weights),
  `optimal_token_baseline` and `tir_optimal_token_baseline` (with rollout IS weights, with and without the
  zero-tail rule);
- rollout correction: token/sequence importance weights (truncated and IcePop, batch-normalised), every
  `rollout_rs` option and combinations, and all `rollout_corr/...` metrics.
`tests/trainer/test_lr_schedule.py` shows the constant and cosine schedules equal verl's (warm-up from lr 0,
the `lr_warmup_steps_ratio` fallback, `min_lr_ratio`, `num_cycles`).

In the step, as verl's trainer composes them (tests under `tests/trainer/`): bypass mode takes the sampler's
log-probs as the old ones (no old-log-prob forward) and the `bypass_mode` loss, whatever `loss_mode` says; in
decoupled mode the weights and the rejection come from the old-log-prob phase once per batch, after the KL
penalty and before the estimator, and rejected tokens leave the response mask of the estimator and of both
updates; GDPO reads the components named by `gdpo_reward_keys` from the dict the reward function returns and
logs `gdpo/<key>/{mean,std,max,min}`; validation's variables are the score (`reward`) and every entry the
reward returns, `acc` is the core variable when present, `maj@k` votes on a text `pred` (same bootstrap
draws as verl's); `actor/entropy` comes from the old-log-prob phase (absent in bypass mode, as verl); actor
metrics are absent during the critic warm-up; `perf/mfu/actor` is the update phase's, in phased mode.
With one actor mini-batch per epoch (`ppo_mini_batch_size` = `train_batch_size`) and nothing before the
update reading the old log-probs (no KL in the reward, no rollout correction, no optimal token baseline, no
critic warm-up, unpacked updates), the update's first epoch runs on the rollout policy's weights: its forward
gives the old log-probs for the later epochs and `actor/entropy`, and the old-log-prob forward is not run
(verl runs it; the numbers are the same, `tests/trainer/test_ppo_step.py`).

Deliberate differences (each is an input verl never produces, or a choice the comparison shows):
- rows without a valid response token are padding: they join no group, no whitening, no normaliser and no
  rollout-correction statistic, and get advantage 0 (verl counts every row; its rows are never empty, so
  the comparison runs verl on the real rows). An empty mask gives a loss of 0, where verl's token-mean is 0/0;
  a variance over fewer than two tokens is 0 and `grpo_passk` gives a group of one 0 (verl raises);
- outputs are 0 off the response mask (verl leaves values there, e.g. GAE returns), and outcome estimators
  sum `token_level_rewards` over valid tokens only (verl sums every position; rewards off the mask are 0 in
  both pipelines);
- per-token metrics (`pg_clipfrac`, `ppo_kl`, `vf_clipfrac`, ...) are normalised by the mini-batch like the
  loss, so micro-batches add up (verl averages per-micro-batch means); the `seq-mean-*` normaliser counts rows
  with a valid token (verl: `ppo_mini_batch_size x n`, equal without padding rows);
- the importance ratio is `exp(clip(log_ratio, -20, 20))` in `gspo` and `geo_mean` too (verl clips only
  elsewhere): different only beyond e^20;
- `clip_cov` draws its detached tokens with a JAX PRNG key (verl: `torch.randperm`): same distribution,
  other draws; `kl_cov` and `grpo_passk` break ties by position (verl: `torch.topk`, unspecified);
- the rollout-correction std metrics are computed two-pass (verl: E[x^2] - E[x]^2): the same number without
  fp32 cancellation; `rollout_is_threshold` / `rollout_rs_threshold` are strings (`"2.0"`, `"0.5_2.0"`)
  because the config tree is typed (verl takes a float or a string);
- rollout correction in decoupled mode runs (and logs `rollout_corr/...`) when `rollout_is` or `rollout_rs`
  is set (verl: whenever the section exists and the rollout returned log-probs, which jaxrlhf's always
  does); bypass mode's `rollout_corr/...` are per-micro-batch means averaged over the micro-batches, as verl;
- `full` KL works (exact, from both policies' logits, per LM-head chunk; verl 0.9.1 raises on it);
- the fused step (one program) has no update-phase time: it reports `perf/mfu/step` (the whole step's)
  instead of `perf/mfu/actor`.
""".splitlines()


def render(config: ml_collections.ConfigDict | None = None) -> str:
  config = config if config is not None else get_base_config()
  lines = [
    "# Configuration reference",
    "",
    "Every key of the config tree (`jaxrlhf.config.get_base_config()`, docs/algorithms.md §6), its default,",
    "what it does, and its name in verl. \"same\" means verl has exactly this key, so a verl command line's",
    "overrides carry over as `--config.<key>=<value>`; \"— (ours)\" marks keys verl does not have.",
    "It names the key only: where the *behaviour* is tested to equal verl 0.9.1's, and where it",
    "deliberately differs, is listed at the end (\"Parity with verl 0.9.1\").",
    "`None` defaults are typed placeholders: the type column says what a value must be. Keys marked",
    "**not implemented** are accepted with their default only (`jaxrlhf.config.NOT_IMPLEMENTED`).",
    "",
    "Generated by `python docs/gen_config_md.py` from the config tree; do not edit by hand",
    "(tests/docs/test_config_docs.py fails when this file and the tree disagree).",
  ]
  section = None
  for key, value, type_name in walk(config):
    top = key.split(".")[0]
    if top != section:
      section = top
      lines += [
        "",
        f"## {_SECTION_TITLES.get(top, top)} (`{top}`)",
        "",
        "| key | default | type | meaning | verl |",
        "|---|---|---|---|---|",
      ]
    meaning, verl = describe(key)
    if key in NOT_IMPLEMENTED:
      default, instead = NOT_IMPLEMENTED[key]
      meaning = f"**not implemented: only `{default!r}` is accepted**; instead, {instead}. verl: {meaning}"
    lines.append(f"| `{key}` | {format_default(value)} | {type_name} | {meaning} | {verl} |")
  return "\n".join(lines + _PARITY) + "\n"


def write_or_check(output: str, text: str, argv, generator: str) -> int:
  """A generated page's command line (this one's and docs/gen_verl_scripts_md.py's): `--check` exits 1 when
  `output` differs from `text`; otherwise `output` is rewritten."""
  if "--check" in argv:
    with open(output) as f:
      if f.read() != text:
        print(f"{output} is out of date: run python {generator}", file=sys.stderr)
        return 1
    return 0
  with open(output, "w") as f:
    f.write(text)
  print(f"wrote {output}")
  return 0


def main(argv) -> int:
  return write_or_check(OUTPUT, render(), argv, "docs/gen_config_md.py")


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
