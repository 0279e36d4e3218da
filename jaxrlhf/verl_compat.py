"""verl's command lines, unchanged: Hydra-style `key=value` overrides and verl run scripts.

verl runs as `python3 -m verl.trainer.main_ppo data.train_batch_size=256 trainer.n_gpus_per_node=8 ...`.
jaxrlhf's tree uses verl's key names, so most keys apply as they are; `TABLE` lists every other verl key
jaxrlhf knows, as one of:
  - translated: the same intent under jaxrlhf's names (GPUs per node x nodes -> the mesh);
  - ignored: no meaning here (vLLM, Ray, FSDP wrapping), listed once at start-up with the reason;
  - refused: a feature jaxrlhf lacks (Megatron, vision-language, interactions), one line per family.
Any key in neither the tree nor the table is an error that names it; every problem of a command line is
reported at once, one line each. docs/verl_scripts.md is generated from `SECTIONS` (the table).

Two users of the table:
  - `train.py [--config FILE] key=value ...`: `apply_overrides` sets the keys on the config (without
    --config the base is configs/verl_defaults.py: verl's own defaults, as `main_ppo` starts from).
  - `python -m jaxrlhf.verl_compat SCRIPT.sh [--config FILE]`: reads a verl run script
    (`jaxrlhf.verl_shell`) and prints the equivalent `python train.py --config ... --config.key=value`
    command and the table of mapped / translated / ignored keys. A `key=null` is printed as the verl
    override `key=null` (no `--config.` flag can say None), and a value only the user's shell knows
    (`trainer.nnodes=$SLURM_JOB_NUM_NODES`) as the verl override `key="$VAR"`, with every key whose
    translation depends on it: train.py translates them when it runs, with the shell's values. A Hydra base
    YAML (`--config-path=... --config-name=NAME`, built on verl's ppo_trainer as verl's examples are) is read
    where the script runs from (its `$(pwd)`: the current folder or a folder above the script): its settings
    apply before the script's own. A tool config it finds is loaded, so tools jaxrlhf lacks are refused.

Values follow Hydra's grammar as verl's scripts use it: `null`, `True/False` (any case), numbers,
`[a,b]` / `['a','b']` lists, quoted strings, nothing (`key=`: the empty string); `+key=value` (Hydra's
append) is accepted like `key=value`.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ml_collections

from jaxrlhf.config import SEQUENCE_PARALLEL_KEYS, get
from jaxrlhf.errors import UserError
from jaxrlhf.verl_shell import Script, read_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The base of a verl command line without --config: verl's defaults (`jaxrlhf.config.get_base_config`).
DEFAULT_CONFIG = os.path.join("configs", "verl_defaults.py")
HINT = "docs/verl_scripts.md says what each verl key becomes"


@dataclasses.dataclass(frozen=True)
class Translated:
  """A verl key whose intent lives under other jaxrlhf keys.

  `fn(value, overrides, config)` returns {jaxrlhf key: value}, or ({...}, [(what, reason), ...]) to report
  parts it drops; `overrides` holds every verl key of the command line (parsed), `config` the config with
  the mapped keys applied. `inputs`: the other verl keys it reads (a value only the shell knows in any of
  them leaves the whole translation to train.py at run time).
  """

  fn: Callable[[Any, dict, ml_collections.ConfigDict], Any]
  target: str  # what it becomes, for the table and docs/verl_scripts.md
  inputs: tuple[str, ...] = ()
  note: str = ""  # said next to what it became: where the translation is not exactly verl's


@dataclasses.dataclass(frozen=True)
class Ignored:
  """A verl key with no meaning in jaxrlhf. `refuse(key, value, overrides)` returns a reason for the values
  that cannot be ignored (then the key is refused, in `family`), else None; `refuses` says which, for docs."""

  reason: str
  refuse: Callable[[str, Any, dict], str | None] | None = None
  refuses: str = ""
  family: str = ""


@dataclasses.dataclass(frozen=True)
class Refused:
  """A verl feature jaxrlhf does not have: every key of the family is refused in one line."""

  family: str
  reason: str


# ----- translations ------------------------------------------------------------------------------

GPUS, NODES = "trainer.n_gpus_per_node", "trainer.nnodes"
ROLLOUT_TP = "actor_rollout_ref.rollout.tensor_model_parallel_size"
FSDP_SIZE = "actor_rollout_ref.actor.fsdp_config.fsdp_size"
# Megatron's training tensor parallelism: jaxrlhf's mesh.tensor (one mesh for actor, reference and critic).
MEGATRON_TP = "actor_rollout_ref.actor.megatron.tensor_model_parallel_size"


def _devices(overrides) -> int:
  # verl's defaults: 8 GPUs per node, 1 node.
  try:
    return int(overrides.get(GPUS, 8)) * int(overrides.get(NODES, 1))
  except (TypeError, ValueError):
    raise UserError(
      f"{GPUS} x {NODES} must be whole numbers, got {overrides.get(GPUS, 8)!r} x {overrides.get(NODES, 1)!r}"
    ) from None


def _mesh_from_gpus(value, overrides, config):
  # Training is FSDP, as verl's: the GPUs go to the fsdp axis (a job started on a different device
  # count fails at start-up, naming the mesh). Generation's own TP is rollout.tensor_model_parallel_size.
  del value
  size = overrides.get(FSDP_SIZE)
  if size is not None and (not isinstance(size, int) or isinstance(size, bool)):
    raise UserError(f"{FSDP_SIZE} expects an int (-1: every GPU), got {size!r}")
  # Without the GPU count (fsdp_size alone) the data axis fills whatever devices train.py finds.
  devices = _devices(overrides) if GPUS in overrides or NODES in overrides else None
  mesh = config.mesh
  megatron_tp = _megatron_tp(overrides)
  tensor = megatron_tp or (mesh.tensor if mesh.tensor != -1 else 1)
  tensor_key = {"mesh.tensor": megatron_tp} if megatron_tp else {}
  hybrid, dropped = _hybrid_shard(size, devices, tensor, overrides, config)
  if hybrid or devices is None:
    return {**tensor_key, **hybrid}, dropped
  data = mesh.data if mesh.data != -1 else 1
  if devices % (data * tensor):
    raise UserError(
      f"{GPUS} x {NODES} = {devices} devices are not divisible by mesh.data*mesh.tensor = {data * tensor}"
    )
  return {
    **tensor_key,
    **({"mesh.data": 1} if mesh.data == -1 else {}),
    "mesh.fsdp": devices // (data * tensor),
  }, dropped


def _megatron_tp(overrides) -> int | None:
  """Megatron's tensor_model_parallel_size (None when unset): training's tensor parallelism, jaxrlhf's mesh.tensor.
  Megatron's pipeline and context ranks are not counted out of the GPUs: they stay on the fsdp axis."""
  size = overrides.get(MEGATRON_TP)
  if size is None:
    return None
  if not isinstance(size, int) or isinstance(size, bool) or size < 1:
    raise UserError(f"{MEGATRON_TP} expects a positive int, got {size!r}")
  return size


def _hybrid_shard(size: int | None, devices: int | None, tensor: int, overrides, config) -> tuple[dict, list]:
  """verl's hybrid sharding (actor fsdp_config.fsdp_size = k below the GPU count: parameters sharded within
  groups of k GPUs, replicated over the GPUs / k groups) as the mesh: fsdp = k / tensor, data = GPUs / k
  (-1, filled, when the GPU count is not given). ({} and the reason) where Ulysses SP or generation TP would
  not fit in a group of k: full sharding is kept."""
  if size is None or size < 0 or (devices is not None and size >= devices):
    return {}, []  # verl's default -1: one FSDP group over every GPU
  if size == 0 or (devices is not None and devices % size):
    raise UserError(f"{FSDP_SIZE}={size} must be -1 or divide the {devices} GPUs ({GPUS} x {NODES}), as in verl")
  from jaxrlhf.parallel.mesh import MeshError, mesh_axes  # here: loading the table must not start JAX

  sequence_parallel = max(get(config, key) or 1 for key in SEQUENCE_PARALLEL_KEYS.values())
  rollout_tp = overrides.get(ROLLOUT_TP) or config.actor_rollout_ref.rollout.tensor_model_parallel_size
  data = devices // size if devices is not None else -1
  try:
    if size % tensor:
      raise MeshError(f"mesh.tensor={tensor} does not divide it")
    mesh_axes((max(data, 1), size // tensor, tensor), sequence_parallel, rollout_tp)
  except MeshError as error:
    return {}, [
      (
        FSDP_SIZE,
        str(size),
        f"full sharding over {devices or 'all'} GPUs kept: a group of {size} "
        f"cannot hold the mesh's other axes ({error})",
      )
    ]
  return {"mesh.data": data, "mesh.fsdp": size // tensor}, []


def _rollout_tp(value, overrides, config) -> dict:
  del config
  size, devices = int(value), _devices(overrides)
  if size < 1 or devices % size:
    raise UserError(f"{ROLLOUT_TP}={value} must divide the {devices} GPUs ({GPUS} x {NODES}), as in verl")
  return {ROLLOUT_TP: size}


def _per_gpu(target: str, sequence_parallel: tuple[str, ...]):
  """verl's deprecated global micro-batch -> the per-GPU key: divided over the data-parallel ranks
  (GPUs / Ulysses SP), as verl's FSDP workers divided it (and verl requires at least one per GPU)."""
  source = target.removesuffix("_per_gpu")

  def translate(value, overrides, config):
    if target in overrides and overrides[target] is not None and value is not None:
      raise UserError(
        f"both {source} and {target} are set: verl refuses this too (only the *_per_gpu key is "
        "supported, the other is deprecated); remove one"
      )
    if value is None:
      return {target: None}
    sp = next((get(config, key) for key in sequence_parallel if get(config, key)), 1)
    devices = _devices(overrides)
    ranks = max(devices // sp, 1)
    if int(value) < ranks:
      raise UserError(
        f"{source}={value} sequences over {ranks} data-parallel ranks ({devices} GPUs / "
        f"Ulysses SP {sp}) is less than one per GPU (verl requires {source} x SP >= GPUs)"
      )
    return {target: int(value) // ranks}

  return Translated(
    translate,
    f"{target} = {source.rsplit('.', 1)[1]} / (GPUs / Ulysses SP), as verl divided it",
    inputs=(GPUS, NODES, target),
  )


def _logger(value, overrides, config):
  del overrides, config
  from jaxrlhf.tracking.tracking import LOGGERS  # here: loading the table must not start JAX

  names = (value,) if isinstance(value, str) else () if value is None else tuple(value)
  kept, dropped = [], []
  for name in names:
    name = _VERL_LOGGER_NAMES.get(name, name)
    if name in LOGGERS:
      kept.append(name)
    elif name in _VERL_ONLY_LOGGERS:
      dropped.append(
        (
          "trainer.logger",
          name,
          f"{_VERL_ONLY_LOGGERS[name]}: not a jaxrlhf backend (jaxrlhf has {', '.join(LOGGERS)})",
        )
      )
    else:
      raise UserError(
        f"trainer.logger has unknown logger {name!r}: verl's are "
        f"{sorted({*LOGGERS, *_VERL_ONLY_LOGGERS, *_VERL_LOGGER_NAMES} - {'jsonl'})}, "
        f"jaxrlhf's {list(LOGGERS)}"
      )
  return {"trainer.logger": tuple(dict.fromkeys(kept)) or ("console",)}, dropped


# verl's names for jaxrlhf's backends, and verl's backends jaxrlhf lacks (verl 0.9.1 utils/tracking.py).
_VERL_LOGGER_NAMES = {"file": "jsonl", "tracking": "wandb"}
_VERL_ONLY_LOGGERS = {
  "swanlab": "SwanLab",
  "vemlp_wandb": "Volcengine ML platform's wandb",
  "clearml": "ClearML",
  "trackio": "Trackio",
  "rl_insight": "RL Insight",
}


def _rename(target: str, why: str = "") -> Translated:
  return Translated(lambda value, overrides, config: {target: value}, f"{target}{f' ({why})' if why else ''}")


def _max_resp_len(value, overrides, config) -> dict:
  del overrides
  if value is not None and int(value) != config.data.max_response_length:
    raise UserError(
      f"reward_model.reward_kwargs.max_resp_len={value} differs from data.max_response_length="
      f"{config.data.max_response_length}: jaxrlhf's overlong buffer ends at data.max_response_length"
    )
  return {}


def _token_level_loss(value, overrides, config) -> dict:
  # The DAPO recipe's switch before loss_agg_mode: token-mean, else each sequence's token mean averaged.
  del overrides, config
  return {"actor_rollout_ref.actor.loss_agg_mode": "token-mean" if value else "seq-mean-token-mean"}


def _filter_metric(value, overrides, config) -> dict:
  del overrides, config
  return {"algorithm.filter_groups.metric": "score" if value in ("acc", "reward") else value}


def _profile_steps(value, overrides, config) -> dict:
  del overrides, config
  steps = () if value is None else (value,) if isinstance(value, int) else tuple(value)
  return {"trainer.profile_steps": tuple(int(step) for step in steps)}


# ----- refusals that depend on the value ----------------------------------------------------------


class _LeftToShell:
  """The parsed value of an override whose value only the user's shell knows."""

  def __repr__(self):
    return "<left to the shell>"


LEFT_TO_SHELL = _LeftToShell()
NEEDS_VALUE = "jaxrlhf needs this value to decide whether it can be ignored: set its variable where you run verl_compat"

# ----- multi-turn rollouts with tools (verl 0.9.1's multi_turn and agent keys) ---------------------

MULTI_TURN = "actor_rollout_ref.rollout.multi_turn"
AGENT = "actor_rollout_ref.rollout.agent"
TOOL_CONFIG = f"{MULTI_TURN}.tool_config_path"
# The tool-call formats jaxrlhf parses (jaxrlhf.tools.hermes); verl 0.9.1 registers more parsers.
TOOL_FORMATS = ("hermes",)


def _tool_format(value, overrides, config) -> dict:
  del overrides, config
  if value not in TOOL_FORMATS:
    raise UserError(
      f"refused: tool-call format {value!r}: jaxrlhf parses {' and '.join(TOOL_FORMATS)} only "
      "(<tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>); verl's other parsers "
      "(gpt-oss, qwen3_coder, glm, kimi, ...) are not yet"
    )
  return {f"{MULTI_TURN}.format": value}


def _default_agent_loop(value, overrides, config) -> dict:
  # verl 0.9.1 picks the loop per row: the rows' agent_name column, else this key. Its tool loop is
  # jaxrlhf's multi-turn rollout; its single-turn loop is jaxrlhf's rollout without tools.
  del overrides, config
  if value == "tool_agent":
    return {f"{MULTI_TURN}.enable": True}
  if value in (None, "single_turn_agent"):
    return {}
  raise UserError(
    f"refused: agent loop {value!r}: jaxrlhf runs verl's single_turn_agent and tool_agent loops only "
    "(custom agent loops are not supported)"
  )


def _data_tool_config(key, value, overrides) -> str | None:
  del key
  rollout = overrides.get(TOOL_CONFIG)
  if LEFT_TO_SHELL in (value, rollout) and value is not None:
    return NEEDS_VALUE
  if value in (None, "", rollout):
    return None
  return (
    f"data.tool_config_path={value!r} differs from {TOOL_CONFIG}={rollout!r}: verl's dataset would "
    "measure prompts with one tool list and roll out with another; set the rollout's key only"
  )


def _new_spelling(key: str, target: str, *legacy: str) -> Translated:
  """verl 0.9.1's `reward.*` spelling of a key whose older spelling jaxrlhf's tree keeps (`target`). verl
  migrates the older section over the new one whenever any of its `legacy` keys is set (not null)."""

  def translate(value, overrides, config):
    del config
    if any(overrides.get(key) is not None for key in legacy):
      return {}, [(key, str(value), f"verl takes {' / '.join(legacy)}, set too")]
    return {} if value is None else {target: value}

  older = " / ".join(legacy)
  return Translated(translate, f"{target} (verl 0.9.1's spelling; {older} wins when set, as in verl)", inputs=legacy)


# verl's test sampler: random order, no curriculum (what jaxrlhf's data.shuffle=True does).
_RANDOM_SAMPLER = ("pkg://tests.utils.dataset.test_create_rl_sampler_on_cpu", "RandomCurriculumSampler")
_SAMPLER = (
  "a curriculum sampler class (data.sampler, gone from verl's data config by 0.9.1): jaxrlhf draws the rows "
  "in order or shuffled (data.shuffle)"
)


def _sampler(key, value, overrides) -> str | None:
  del key, value
  chosen = (overrides.get("data.sampler.class_path"), overrides.get("data.sampler.class_name"))
  if LEFT_TO_SHELL in chosen:
    return NEEDS_VALUE
  if chosen == (None, None) or (chosen == _RANDOM_SAMPLER and overrides.get("data.shuffle") is not False):
    return None
  return _SAMPLER


_REWARD_MANAGERS = {
  "prime": "PRIME's reward manager (the PRIME recipe's verification with timeouts and implicit "
  "process rewards): jaxrlhf has no PRIME recipe",
  "collabllm": "CollabLLM's conversation-level rewards over turns with a simulated user: jaxrlhf's "
  "multi-turn rollouts are tool rollouts (no user simulator)",
}


def _reward_manager(value, overrides, config) -> dict:
  """verl's reward manager -> reward_model.reward_manager: naive, dapo and gdpo score one sample a call (DAPO's
  overlong shaping is reward_model.overlong_buffer), batch one batch a call; the others are refused."""
  del overrides, config
  if value is None:
    return {}
  if value in ("naive", "dapo", "batch", "gdpo"):
    return {"reward_model.reward_manager": value}
  reason = _REWARD_MANAGERS.get(value, f"reward manager {value!r}: jaxrlhf has naive, dapo, batch and gdpo")
  raise UserError(f"refused (reward manager): {reason}")


def _legacy_reward_manager(value, overrides, config):
  if overrides.get("reward.reward_manager.name") is not None and value is None:
    return {}
  return _reward_manager(value, overrides, config)


def _new_reward_manager(value, overrides, config):
  # verl migrates reward_model.reward_manager over reward.reward_manager.name when it is set.
  if overrides.get("reward_model.reward_manager") is not None:
    return {}, [("reward.reward_manager.name", str(value), "verl takes reward_model.reward_manager, set too")]
  return _reward_manager(value, overrides, config)


def _refused_unless(*inert, reason: str):
  """A refusal (`reason`) for every value but the `inert` ones (verl's defaults, which change nothing)."""

  def refuse(key, value, overrides) -> str | None:
    del key, overrides
    return NEEDS_VALUE if value is LEFT_TO_SHELL else None if value in inert else reason

  return refuse


_CUSTOM_MANAGER = (
  "a custom reward manager class (reward_manager.source=importlib): jaxrlhf's reward is the rule by data_source "
  "or custom_reward_function (reward_manager.name=batch for a function of the whole batch)"
)
_SANDBOX_FUSION = (
  "sandbox fusion, an external code-execution service: jaxrlhf runs the code sources (codecontests, apps, "
  "codeforces, taco) itself, each program in a process of its own with time and memory limits and no network; "
  "set the url to null"
)
_CODE_LIMITS = "jaxrlhf.rewards.code.MEMORY_LIMIT_BYTES (1 GiB) and TEST_TIMEOUT_S (5 s per test)"
_INPUT_TOKENIZER = (
  "a reward model with its own tokenizer or chat template: jaxrlhf's reward model reads the actor's "
  "tokens (set it to null when the two share tokenizer and chat template)"
)
_LORA = {
  "lora_adapter_path": "continuing from a saved PEFT adapter: jaxrlhf's LoRA starts fresh adapters "
  "(model.lora_rank, lora_alpha, target_modules); it writes PEFT's layout "
  "(trainer.save_hf, jaxrlhf.export) but does not read one",
  "exclude_modules": "modules excluded from LoRA by name: jaxrlhf adapts exactly model.target_modules "
  "(list the modules to adapt there instead)",
}
_CUSTOM_DATASET = (
  "a custom dataset class: jaxrlhf reads verl's parquet/jsonl rows itself (data.prompt_key, "
  "data.reward_fn_key, reward_model.ground_truth)"
)
_MTP = (
  "multi-token prediction (MiMo's and DeepSeek-V3's MTP layers, trained or used as a speculative draft): "
  "jaxrlhf's decoders predict the next token only"
)
_MEGATRON_LORA = (
  "Megatron-Bridge's LoRA (model.lora.*, on Megatron's module names): jaxrlhf's LoRA is "
  "model.lora_rank, lora_alpha and target_modules, on Hugging Face's names"
)


def _refused_when_on(switch: str, reason: str):
  """A refusal (`reason`) for every key of a section once its `switch` key is on; while it is off (verl's
  default) none of them changes anything."""

  def refuse(key, value, overrides) -> str | None:
    del value
    on = overrides.get(switch, False)
    if on is LEFT_TO_SHELL:
      return NEEDS_VALUE if key == switch else None
    return reason if on else None

  return refuse


_CHAT_TEMPLATE_KWARGS = (
  "arguments for the tokenizer's apply_chat_template other than enable_thinking and reasoning_effort "
  "(data.apply_chat_template_kwargs.enable_thinking / .reasoning_effort, which jaxrlhf passes on)"
)
_STATIC_SHAPES = "static shapes: every sequence is padded to data.max_prompt_length + data.max_response_length"
_OPTIMIZER = "jaxrlhf's optimizer is AdamW (optax) with verl's schedules (optim.lr_scheduler_type, warm-up from step 0)"
_QUANTIZATION = "quantized training or generation (QAT, FP8/INT8 rollouts): jaxrlhf computes in float32 or bfloat16"
_DISAGGREGATION = "prefill/decode disaggregation over separate engine replicas: jaxrlhf generates inside the step"
_IGNORE_EOS = "generating past EOS (a benchmark setting): jaxrlhf's rows stop at their EOS"
_ROUTING_REPLAY = (
  "router replay from files or of the old-log-prob forward's routes (Megatron's R2, record_file / replay_file): "
  "jaxrlhf replays the rollout's own routes in the old-log-prob and update forwards (R3), with "
  "actor_rollout_ref.rollout.enable_rollout_routing_replay=True"
)
_HF_CONFIG_PATH = "a config.json apart from the weights: jaxrlhf reads the model directory's own config.json"
_AS_SUBKEYS = "a whole mapping on one key: set its fields as separate keys (section.field=value)"
_TILED_MLP = "TiledMLP splits PyTorch's MLP activations into tiles: XLA plans the step's memory (and remat)"
_PF_PPO = "PF-PPO's reweighting of samples by reward: not in jaxrlhf"
_DISTILLATION = (
  "several distillation teachers routed by distillation.teacher_key: jaxrlhf distills from one teacher "
  "(distillation.teacher_models.teacher_model), which serves every row"
)
_TEACHER_IN_STEP = (
  "the teacher runs inside the step on the trainer's mesh, sharded like the reference policy (no inference "
  "engine, replicas or resource pool of its own); its log-probs use the rollout's temperature and the actor's dtype"
)
_TRANSFER_QUEUE = "verl's TransferQueue between its Ray workers: jaxrlhf's data stays in one program"
_CHECKPOINT_CALLBACK = "a user callback after each checkpoint save: not in jaxrlhf"
_TRAINER_V1 = (
  "verl's separate_async trainer mode (generation and training on disjoint GPUs, weights synchronised every "
  "parameter_sync_step steps): jaxrlhf runs both on one mesh in one program; colocate_async (partial rollouts "
  "carried across steps) and sync are supported"
)


def _trainer_mode(value, overrides, config):
  """verl's trainer.v1.trainer_mode: sync and colocate_async map; colocate_async decodes in the rollout's slots,
  so without an explicit max_num_seqs it takes verl's (vLLM's) default of 1024 concurrent sequences."""
  del config
  if value == "separate_async":
    raise UserError(f"refused (v1): {_TRAINER_V1}")
  out = {"trainer.v1.trainer_mode": value}
  if value == "colocate_async" and overrides.get("actor_rollout_ref.rollout.max_num_seqs") is None:
    out["actor_rollout_ref.rollout.max_num_seqs"] = 1024
  return out


def _warmup_batches(value, overrides, config):
  """verl's fractional warm-up (1.5 batches = one batch and gen_batch_size chunks of another): jaxrlhf's pool
  admits whole batches."""
  del overrides, config
  if isinstance(value, float) and value.is_integer():
    value = int(value)
  return {"trainer.v1.colocate_async.num_warmup_batches": _whole_number(value, "num_warmup_batches")}


_SKIP_ROLLOUT = "replaying dumped rollouts instead of generating (verl's debugging switch): not in jaxrlhf"


def _critic_ckpt_to_keep(value, overrides, config) -> dict:
  # A jaxrlhf checkpoint holds actor and critic together: keep as many as the larger of verl's two counts
  # (None or 0: all), so no checkpoint verl would keep is deleted.
  del overrides
  actor = config.trainer.max_actor_ckpt_to_keep
  if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
    raise UserError(f"expects an int or null, got {value!r}")
  return {"trainer.max_actor_ckpt_to_keep": None if not value or not actor else max(int(value), actor)}  # 0: all


# ----- Megatron-LM's engine (verl's ppo_megatron_trainer) -------------------------------------------
# verl's Megatron workers train the same PPO step as its FSDP workers; only the layout differs. Megatron splits
# the GPUs into tensor x pipeline x context x data ranks (experts over their own expert x expert-tensor ranks);
# jaxrlhf's mesh is (data, fsdp, tensor): tensor parallelism is mesh.tensor, the pipeline's and the data's GPUs
# are the fsdp axis, context parallelism is Ulysses sequence parallelism on it.

MEGATRON_ROLES = ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic")
_ROLE_MODEL = {
  "actor_rollout_ref.actor": "actor_rollout_ref.model",
  "actor_rollout_ref.ref": "actor_rollout_ref.model",
  "critic": "critic.model",
}
_ROLE_SEQUENCE_PARALLEL = {
  "actor_rollout_ref.actor": SEQUENCE_PARALLEL_KEYS["actor"],
  "actor_rollout_ref.ref": SEQUENCE_PARALLEL_KEYS["ref"],
  "critic": SEQUENCE_PARALLEL_KEYS["critic"],
}
_TRANSFORMER = "megatron.override_transformer_config"


def _whole_number(value, what: str) -> int:
  if not isinstance(value, int) or isinstance(value, bool) or value < 1:
    raise UserError(f"{what} expects a positive int, got {value!r}")
  return value


def _context_parallel(role: str) -> Translated:
  """Megatron's context parallelism (each sequence split over k GPUs, K/V passed around a ring) -> Ulysses
  sequence parallelism (each sequence split over k devices, heads exchanged by all-to-all): the same attention.
  The actor's also sets the reference's, as verl's reference config takes the actor's by default."""
  targets = [_ROLE_SEQUENCE_PARALLEL[role]]
  ref_context = "actor_rollout_ref.ref.megatron.context_parallel_size"
  if role == "actor_rollout_ref.actor":
    targets.append(SEQUENCE_PARALLEL_KEYS["ref"])

  def translate(value, overrides, config):
    del config
    size = _whole_number(value, "context_parallel_size")
    # The reference's own context_parallel_size, when given, sets its Ulysses size itself.
    chosen = [key for key in targets if not (key != targets[0] and ref_context in overrides)]
    for key in chosen:
      if size > 1 and overrides.get(key) not in (None, 1, size):
        raise UserError(f"{key}={overrides[key]} differs: both split each sequence over devices; set one")
    return {key: size for key in chosen} if size > 1 else {}

  return Translated(
    translate,
    f"{' and '.join(targets)} = k (> 1): Megatron's context parallelism passes K/V around a ring of k GPUs, "
    "Ulysses exchanges heads by all-to-all over k devices of the fsdp axis: the same attention over the whole "
    "sequence (Ulysses needs the heads divisible by k, checked at start-up)",
    inputs=(*targets, *((ref_context,) if len(targets) > 1 else ())),
  )


def _recompute(model: str) -> Translated:
  """Megatron's activation recomputation -> jaxrlhf's gradient checkpointing (whole layers)."""

  def translate(value, overrides, config):
    del overrides, config
    if value is None:
      return {}
    policy = {"full": "full", "selective": "dots_saveable"}.get(value)
    if policy is None:
      raise UserError(f"expects full, selective or null (Megatron's choices), got {value!r}")
    return {f"{model}.enable_gradient_checkpointing": True, f"{model}.remat_policy": policy}

  return Translated(
    translate,
    f"{model}.enable_gradient_checkpointing=True with remat_policy full (`full`) or dots_saveable (`selective`: "
    "the matmuls' outputs kept, the rest recomputed, as Megatron's selective recompute keeps the projections); "
    "null: nothing",
  )


def _moe_aux_loss(role: str) -> Translated:
  """Megatron's load-balancing coefficient -> HF's (override_config.router_aux_loss_coef, output_router_logits)."""
  model = _ROLE_MODEL[role]
  balancing = f"{role}.{_TRANSFORMER}.moe_router_load_balancing_type"

  def translate(value, overrides, config):
    del config
    if value is None:
      return {}
    if not isinstance(value, (int, float)) or isinstance(value, bool):
      raise UserError(f"expects a number, got {value!r}")
    coefficient = 0.0 if overrides.get(balancing) == "none" else float(value)
    return {
      f"{model}.override_config.router_aux_loss_coef": coefficient,
      f"{model}.override_config.output_router_logits": coefficient > 0,
    }

  return Translated(
    translate,
    f"{model}.override_config.router_aux_loss_coef = the coefficient, output_router_logits = (coefficient > 0): "
    "HF's load-balancing loss in the actor's loss (0 with moe_router_load_balancing_type=none)",
    inputs=(balancing,),
    note="Megatron adds E * sum_e f_e P_e per MoE layer, f_e divided by top-k; HF's (jaxrlhf's) is one such loss "
    "over all layers' tokens, f_e not divided: the same coefficient weighs load balance about num_hidden_layers / "
    "num_experts_per_tok times less here (scale router_aux_loss_coef by that to match)",
  )


def _min_lr(section: str) -> Translated:
  def translate(value, overrides, config):
    del overrides
    lr = get(config, f"{section}.optim.lr")
    if value is None or not value:
      return {f"{section}.optim.min_lr_ratio": 0.0}
    if not lr:
      raise UserError(f"{section}.optim.lr={lr}: min_lr cannot become a ratio of it")
    return {f"{section}.optim.min_lr_ratio": float(value) / lr}

  return Translated(
    translate,
    f"{section}.optim.min_lr_ratio = min_lr / optim.lr (Megatron's floor of the decay)",
    inputs=(f"{section}.optim.lr",),
  )


def _lr_decay_style(section: str) -> Translated:
  def translate(value, overrides, config):
    del overrides, config
    if value not in ("constant", "cosine"):
      raise UserError(
        f"refused (optimizer): Megatron's lr_decay_style={value!r}: jaxrlhf's schedules are verl's "
        "(constant, cosine: optim.lr_scheduler_type)"
      )
    return {f"{section}.optim.lr_scheduler_type": value}

  return Translated(
    translate,
    f"{section}.optim.lr_scheduler_type: constant and cosine; Megatron's linear, inverse-square-root and WSD refused",
  )


_STRATEGY = (
  "one strategy: XLA SPMD over the mesh (mesh.*); `megatron` runs the same trainer, its parallelism "
  "keys translated to the mesh (docs/verl_scripts.md, Megatron-LM)"
)
_ONE_MESH = "one mesh for every model: the actor's megatron.* sizes set it (mesh.tensor, the fsdp axis)"
_PIPELINE = (
  "Megatron's pipeline stages (the layers split over k GPUs, micro-batches in flight) are folded into FSDP: those "
  "GPUs join the fsdp axis (mesh.fsdp = GPUs / (mesh.data x mesh.tensor)) and every device holds a 1/(fsdp x "
  "tensor) slice of every layer: the same loss and updates, another layout"
)
_EXPERT_PARALLEL = (
  "Megatron's expert parallelism (experts spread over k GPUs, tokens moved all-to-all): jaxrlhf splits each "
  "expert's weights over fsdp x tensor as a dense MLP's (docs/architecture.md, Mixture of experts); true expert "
  "parallelism is not built yet. The same model and loss, another layout"
)
_MEGATRON_KERNELS = (
  "Megatron-core's kernels, fusions, token dispatch and pipeline layout: XLA compiles the step; the model's math "
  "is its HF config.json's"
)
_MEGATRON_MOE = {
  "moe_router_load_balancing_type": (
    ("aux_loss", "none", None),
    "Megatron's sequence-level / global / Sinkhorn balancing: jaxrlhf has HF's load-balancing loss (aux_loss)",
  ),
  "moe_z_loss_coeff": ((None, 0, 0.0), "the router's z-loss: not in jaxrlhf (HF's Qwen3-MoE has none)"),
  "moe_expert_capacity_factor": (
    (None,),
    "experts with a capacity (tokens over it dropped): jaxrlhf's experts are dropless, as HF's",
  ),
  "moe_router_enable_expert_bias": (
    (False,),
    "aux-loss-free balancing by a per-expert routing bias (DeepSeek-V3's): not in jaxrlhf",
  ),
  "moe_router_score_function": ((None, "softmax"), "a router other than softmax: jaxrlhf's routers are HF's softmax"),
  "moe_input_jitter_eps": ((None, 0, 0.0), "noise on the router's input: jaxrlhf routes deterministically, as HF"),
}
_DIST_CHECKPOINT = (
  "Megatron's own checkpoint of the starting weights (verl converts it from the HF model: "
  "scripts/converter_hf_to_mcore.py): jaxrlhf reads the HF weights at actor_rollout_ref.model.path; a "
  "checkpoint holding other weights must be converted back to HF first"
)


def _megatron_entries(role: str) -> dict[str, Translated | Ignored | Refused]:
  """Every key of a role's `megatron` section (verl 0.9.1's McoreEngineConfig) and the Megatron optimizer's."""
  megatron, model = f"{role}.megatron", _ROLE_MODEL[role]
  actor = role == "actor_rollout_ref.actor"
  offload = {
    "actor_rollout_ref.actor": "actor_rollout_ref.actor.fsdp_config",
    "actor_rollout_ref.ref": "actor_rollout_ref.ref.fsdp_config",
    "critic": "critic.model.fsdp_config",
  }[role]
  entries: dict[str, Translated | Ignored | Refused] = {
    f"{megatron}.tensor_model_parallel_size": Translated(
      _mesh_from_gpus,
      "mesh.tensor = k: training's tensor parallelism (Megatron's column/row splits of each matmul), mesh.fsdp = "
      "GPUs / (mesh.data x k) with trainer.n_gpus_per_node",
      inputs=(GPUS, NODES, FSDP_SIZE),
    )
    if actor
    else Ignored(_ONE_MESH),
    f"{megatron}.pipeline_model_parallel_size": Ignored(_PIPELINE),
    f"{megatron}.virtual_pipeline_model_parallel_size": Ignored(
      "interleaved pipeline stages: no pipeline here (its stages are folded into FSDP)"
    ),
    f"{megatron}.context_parallel_size": _context_parallel(role),
    f"{megatron}.dynamic_context_parallel": Ignored(
      "Megatron picks a context-parallel size per micro-batch by length: jaxrlhf's Ulysses size is fixed"
    ),
    f"{megatron}.max_seqlen_per_dp_cp_rank": Ignored("read with dynamic_context_parallel (above)"),
    f"{megatron}.expert_model_parallel_size": Ignored(_EXPERT_PARALLEL),
    f"{megatron}.expert_tensor_parallel_size": Ignored(_EXPERT_PARALLEL),
    f"{megatron}.sequence_parallel": Ignored(
      "Megatron's sequence parallelism splits the norms' activations over the TP ranks: XLA shards the "
      "activations by the step's layouts"
    ),
    f"{megatron}.use_distributed_optimizer": Ignored(
      "the optimizer state is sharded over the mesh as the weights are (ZeRO-1 and more)"
    ),
    f"{megatron}.use_megatron_fsdp": Ignored("Megatron's FSDP: jaxrlhf's training is FSDP over the mesh"),
    f"{megatron}.param_offload": _rename(f"{offload}.param_offload", "the FSDP spelling"),
    f"{megatron}.optimizer_offload": _rename(f"{offload}.optimizer_offload", "the FSDP spelling")
    if role != "actor_rollout_ref.ref"
    else Ignored("the reference model has no optimizer"),
    f"{megatron}.grad_offload": Ignored("gradients stay on the devices (the key is gone from verl 0.9.1)"),
    f"{megatron}.use_mbridge": Ignored(
      "Megatron-Bridge converts HF weights to Megatron's layout: jaxrlhf reads the HF weights itself"
    ),
    f"{megatron}.vanilla_mbridge": Ignored(
      "Megatron-Bridge converts HF weights to Megatron's layout: jaxrlhf reads the HF weights itself"
    ),
    f"{megatron}.use_dist_checkpointing": Ignored(_DIST_CHECKPOINT),
    f"{megatron}.dist_checkpointing_path": Ignored(_DIST_CHECKPOINT),
    f"{megatron}.dist_checkpointing_prefix": Ignored(_DIST_CHECKPOINT),
    f"{megatron}.dist_ckpt_optim_fully_reshardable": Ignored(_CHECKPOINT),
    f"{megatron}.distrib_optim_fully_reshardable_mem_efficient": Ignored(_CHECKPOINT),
    f"{megatron}.entropy_from_logits_with_chunking": Ignored(_CHUNKED_HEAD),
    f"{megatron}.entropy_from_logits_chunk_size": Ignored(_CHUNKED_HEAD),
    f"{megatron}.seed": Ignored("Megatron's own RNG seed: jaxrlhf's draws come from trainer.seed"),
    f"{megatron}.override_ddp_config": Ignored(
      "Megatron's data-parallel settings (gradient buckets, overlap): XLA schedules the gradient reduction"
    ),
    f"{megatron}.override_ddp_config.*": Ignored(
      "Megatron's data-parallel settings (gradient buckets, overlap): XLA schedules the gradient reduction"
    ),
    f"{megatron}.override_mcore_model_config": Ignored(
      "an empty mapping",
      _refused_unless({}, None, reason=_MEGATRON_MODEL_CONFIG),
      "a mapping",
      "Megatron-LM",
    ),
    f"{megatron}.override_mcore_model_config.*": Refused("Megatron-LM", _MEGATRON_MODEL_CONFIG),
    f"{megatron}.use_remove_padding": Ignored(
      f"packing is {_ROLE_MODEL[role]}.use_remove_padding (jaxrlhf's key, verl's FSDP spelling)"
    ),
    f"{megatron}.pad_bshd_to_minibatch_max": Ignored(_STATIC_SHAPES),
    f"{megatron}.pad_to_length": Ignored(_STATIC_SHAPES),
    f"{megatron}.pad_to_length_bucket": Ignored(_STATIC_SHAPES),
    f"{megatron}.forward_only": Ignored("verl sets it for the reference model (no update)"),
    f"{megatron}.dtype": Ignored(f"the compute dtype is {model}.dtype (bfloat16 in verl's defaults, as here)"),
    f"{megatron}.router_replay.mode": Ignored(
      "`R3` is actor_rollout_ref.rollout.enable_rollout_routing_replay (set it True); `disabled` is the default",
      _refused_unless("disabled", "R3", None, reason=_ROUTING_REPLAY),
      "`R2`",
      "MoE routing replay",
    ),
    **{
      f"{megatron}.router_replay.{name}": Ignored(
        "null: no routing file", _refused_unless(None, "", reason=_ROUTING_REPLAY), "a path", "MoE routing replay"
      )
      for name in ("record_file", "replay_file")
    },
    f"{megatron}.qat.*": Ignored(
      "off (qat.enable=False, verl's default)",
      _refused_when_on(f"{megatron}.qat.enable", _QUANTIZATION),
      "`qat.enable=True`",
      "quantization",
    ),
  }
  if role == "actor_rollout_ref.ref":
    # The reference model is the actor's architecture run forward only: its transformer settings are the actor's.
    entries[f"{megatron}.override_transformer_config"] = Ignored(
      "verl's reference model takes the actor's override_transformer_config"
    )
    entries[f"{megatron}.override_transformer_config.*"] = Ignored(
      "the reference model runs forward only, on the actor's architecture and layouts"
    )
    return entries
  transformer = f"{role}.{_TRANSFORMER}"
  entries |= {
    f"{transformer}.*": Ignored(_MEGATRON_KERNELS),
    f"{transformer}.recompute_granularity": _recompute(model),
    **{
      f"{transformer}.{name}": Ignored(
        f"which layers and modules Megatron recomputes: jaxrlhf recomputes each layer by {model}.remat_policy"
      )
      for name in ("recompute_method", "recompute_num_layers", "recompute_modules")
    },
    f"{transformer}.moe_aux_loss_coeff": _moe_aux_loss(role)
    if actor
    else Ignored("jaxrlhf adds the load-balancing loss to the actor's loss only"),
    **{
      f"{transformer}.{name}": Ignored(
        "Megatron's default: what jaxrlhf does",
        _refused_unless(*inert, reason=reason),
        "any other value",
        "Megatron-LM",
      )
      for name, (inert, reason) in _MEGATRON_MOE.items()
    },
  }
  optim = f"{role}.optim"
  entries |= {
    f"{optim}.lr_decay_style": _lr_decay_style(role),
    f"{optim}.min_lr": _min_lr(role),
    f"{optim}.lr_warmup_init": Ignored(
      "0: the warm-up starts from lr 0, as jaxrlhf's", _refused_unless(0, 0.0, reason=_OPTIMIZER), "> 0", "optimizer"
    ),
    f"{optim}.lr_decay_steps": Ignored(
      "null: the decay spans the run, as jaxrlhf's",
      _refused_unless(None, reason=_OPTIMIZER),
      "a step count",
      "optimizer",
    ),
    f"{optim}.weight_decay_incr_style": Ignored(
      "constant: weight decay stays optim.weight_decay",
      _refused_unless("constant", reason=_OPTIMIZER),
      "linear / cosine",
      "optimizer",
    ),
    f"{optim}.lr_wsd_*": Ignored("read only with lr_decay_style=WSD (refused)"),
    f"{optim}.use_checkpoint_opt_param_scheduler": Ignored(
      "a resumed run continues the schedule from its checkpoint's step"
    ),
    f"{optim}.use_layer_wise_distributed_optimizer": Ignored(
      "the optimizer state is sharded over the mesh as the weights are"
    ),
    **{
      f"{optim}.{name}": Ignored(
        f"{default}: float32 gradients and Adam moments, as jaxrlhf's",
        _refused_unless(default, reason=_OPTIMIZER_DTYPES),
        "any other",
        "optimizer",
      )
      for name, default in (
        ("use_precision_aware_optimizer", False),
        ("main_grads_dtype", "fp32"),
        ("exp_avg_dtype", "fp32"),
        ("exp_avg_sq_dtype", "fp32"),
      )
    },
    f"{optim}.muon_*": Ignored("read only with optim.optimizer=muon (refused)"),
    f"{optim}.override_optimizer_config.*": Ignored(
      "Megatron's optimizer options (its CPU optimizer, offload fractions, overlaps): jaxrlhf offloads Adam's "
      "state with fsdp_config.optimizer_offload"
    ),
    **{
      f"{optim}.override_optimizer_config.{name}": Ignored(
        "fp32: float32 gradients and Adam moments, as jaxrlhf's",
        _refused_unless("fp32", "float32", "torch.float32", reason=_OPTIMIZER_DTYPES),
        "any other",
        "optimizer",
      )
      for name in ("main_grads_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")
    },
  }
  return entries


_MEGATRON_MODEL_CONFIG = (
  "an override of Megatron's model config: jaxrlhf's model is its HF config.json; set HF's names under "
  "actor_rollout_ref.model.override_config.<field>"
)
_OPTIMIZER_DTYPES = "the optimizer's gradients or Adam moments in another dtype: jaxrlhf keeps them in float32"


# ----- the table ---------------------------------------------------------------------------------
# Keys of jaxrlhf's tree are mapped as they are (same name, same meaning) unless listed here. A `*` in a
# key matches any run of characters (`*.megatron.*`: every key with a `megatron` part); keys of the tree
# under a pattern stay mapped.

_VLLM = "vLLM/SGLang engine setting: generation is jaxrlhf's JAX sampler inside the compiled step"
_RAY = "Ray: jaxrlhf is one SPMD program per host (`train.py --distributed` on each node)"
_FSDP = "PyTorch FSDP wrapping: every parameter is sharded over the mesh's fsdp axis"
_DYNAMIC = (
  "the log-prob and value phases use the actor's token budget (actor.use_dynamic_bsz, actor.ppo_max_token_len_per_gpu)"
)
_TORCH = "PyTorch kernel switch: XLA compiles and fuses the step"
_CHUNKED_HEAD = (
  "the LM head (log-probs, entropy) runs in chunks whose logits the backward recomputes "
  "(actor_rollout_ref.model.logits_chunk_size)"
)
_PROFILER = (
  "jaxrlhf traces every device of the steps in trainer.profile_steps with jax.profiler into "
  "<run dir>/profile (view with TensorBoard or Perfetto); tool, ranks and options are verl's profilers'"
)
# verl's reward rollout keys a judge's sampler reads (`reward_model.rollout.*`, same names).
JUDGE_ROLLOUT_KEYS = (
  "prompt_length",
  "response_length",
  "do_sample",
  "temperature",
  "top_k",
  "top_p",
  "max_num_seqs",
  "seed",
  "dtype",
)
_REWARD_ENGINE = "the reward model's own engine (verl serves it apart): jaxrlhf's reward model scores inside the step"
_MEGATRON = (
  "a Megatron-LM setting jaxrlhf has no translation for (the megatron keys it translates are listed under "
  "Megatron-LM above: tensor parallelism -> mesh.tensor, pipeline and expert parallelism folded into FSDP, context "
  "parallelism -> Ulysses SP); drop it, or set jaxrlhf's own key"
)
_DEAD = "read nowhere in verl 0.9.1"
_CUSTOM_AGENT_LOOP = (
  "a custom agent loop, its manager or its server: jaxrlhf's rollouts are verl's single_turn_agent and "
  "tool_agent loops (multi_turn.enable)"
)
_FUNCTION_TOOLS = (
  "verl's @function_tool Python functions: not yet; declare the tools in the tool config YAML "
  "(multi_turn.tool_config_path, docs/tools.md)"
)
_INTERACTIONS = (
  "interaction agents (a simulated user answering the policy's turns): gone from verl 0.9.1; jaxrlhf's "
  "multi-turn rollouts are tool rollouts"
)
_VISION = "vision-language data (images, videos, audio): jaxrlhf's decoders read text only"
_CHECKPOINT = "checkpoints always hold model, optimizer and data state (Orbax)"

SECTIONS: list[tuple[str, dict[str, Translated | Ignored | Refused]]] = [
  (
    "The cluster and the mesh",
    {
      GPUS: Translated(
        _mesh_from_gpus,
        "mesh.fsdp = GPUs per node x nodes / (mesh.data x mesh.tensor): training is FSDP, as verl's",
        inputs=(NODES, FSDP_SIZE, MEGATRON_TP),
      ),
      NODES: Translated(
        _mesh_from_gpus, "mesh.fsdp (with trainer.n_gpus_per_node)", inputs=(GPUS, FSDP_SIZE, MEGATRON_TP)
      ),
      FSDP_SIZE: Translated(
        _mesh_from_gpus,
        "verl's hybrid sharding: k < GPUs -> mesh.fsdp = k, mesh.data = GPUs / k (-1, filled, "
        "without trainer.n_gpus_per_node / nnodes; parameters "
        "sharded within each group of k devices, replicated over the groups; where Ulysses SP or generation TP "
        "do not fit in a group of k, one group, reported); -1 or k >= GPUs: one group",
        inputs=(GPUS, NODES, ROLLOUT_TP, MEGATRON_TP, *SEQUENCE_PARALLEL_KEYS.values()),
      ),
      ROLLOUT_TP: Translated(
        _rollout_tp,
        "the same key: generation's tensor parallelism, k ways over the fsdp "
        "devices (training stays FSDP: mesh.tensor is not touched)",
        inputs=(GPUS, NODES),
      ),
      "actor_rollout_ref.hybrid_engine": Ignored("actor and rollout always share one set of weights in one program"),
      "actor_rollout_ref.actor.strategy": Ignored(_STRATEGY),
      "critic.strategy": Ignored(_STRATEGY),
      "actor_rollout_ref.ref.strategy": Ignored(_STRATEGY),
      "actor_rollout_ref.actor.fsdp_config.*": Ignored(_FSDP),
      "actor_rollout_ref.ref.fsdp_config.*": Ignored(_FSDP),
      "critic.model.fsdp_config.*": Ignored(_FSDP),
      "critic.model.fsdp_config.fsdp_size": Ignored(
        "one mesh for every model: the actor's fsdp_config.fsdp_size sets it"
      ),
      "actor_rollout_ref.nccl_timeout": Ignored(
        "the timeout of verl's NCCL process groups: XLA's collectives run inside the compiled step"
      ),
      "trainer.use_legacy_worker_impl": Ignored("verl's choice between its worker implementations: jaxrlhf has one"),
      "ray_init.*": Ignored(_RAY),
      "ray_kwargs.*": Ignored(_RAY),
      "trainer.ray_wait_register_center_timeout": Ignored(_RAY),
      "trainer.device": Ignored("JAX picks the platform (JAX_PLATFORMS=cuda|tpu|cpu)"),
      "trainer.balance_batch": Ignored(
        "verl balances sequence lengths over data-parallel ranks: jaxrlhf sizes "
        "micro-batches by tokens (actor.use_dynamic_bsz) inside the step"
      ),
    },
  ),
  (
    "Batch sizes",
    {
      "actor_rollout_ref.actor.ppo_micro_batch_size": _per_gpu(
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        ("actor_rollout_ref.actor.ulysses_sequence_parallel_size",),
      ),
      "actor_rollout_ref.rollout.log_prob_micro_batch_size": _per_gpu(
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
        ("actor_rollout_ref.actor.ulysses_sequence_parallel_size",),
      ),
      "actor_rollout_ref.ref.log_prob_micro_batch_size": _per_gpu(
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
        (
          "actor_rollout_ref.ref.ulysses_sequence_parallel_size",
          "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
        ),
      ),
      "critic.ppo_micro_batch_size": _per_gpu(
        "critic.ppo_micro_batch_size_per_gpu", ("critic.ulysses_sequence_parallel_size",)
      ),
      "critic.forward_micro_batch_size": _per_gpu(
        "critic.forward_micro_batch_size_per_gpu", ("critic.ulysses_sequence_parallel_size",)
      ),
      "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": Ignored(_DYNAMIC),
      "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": Ignored(_DYNAMIC),
      "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": Ignored(_DYNAMIC),
      "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": Ignored(_DYNAMIC),
      "critic.use_dynamic_bsz": Ignored(_DYNAMIC),
      "critic.ppo_max_token_len_per_gpu": Ignored(_DYNAMIC),
      "critic.forward_max_token_len_per_gpu": Ignored(_DYNAMIC),
    },
  ),
  (
    "The optimizer",
    {
      "actor_rollout_ref.actor.optim.clip_grad": _rename(
        "actor_rollout_ref.actor.grad_clip", "verl's optimizer spelling"
      ),
      "critic.optim.clip_grad": _rename("critic.grad_clip", "verl's optimizer spelling"),
      "actor_rollout_ref.actor.optim.warmup_style": _rename(
        "actor_rollout_ref.actor.optim.lr_scheduler_type", "verl's old name"
      ),
      "critic.optim.warmup_style": _rename("critic.optim.lr_scheduler_type", "verl's old name"),
      "actor_rollout_ref.actor.use_token_level_loss": Translated(
        _token_level_loss,
        "actor_rollout_ref.actor.loss_agg_mode: True -> token-mean, False -> "
        "seq-mean-token-mean (the DAPO recipe's switch before loss_agg_mode)",
      ),
      "actor_rollout_ref.actor.optim.total_training_steps": Ignored("verl fills it at run time from the data"),
      "critic.optim.total_training_steps": Ignored("verl fills it at run time from the data"),
    },
  ),
  (
    "The rollout engine",
    {
      "actor_rollout_ref.rollout.name": Ignored(_VLLM),
      "actor_rollout_ref.rollout.mode": Ignored(_VLLM),
      "actor_rollout_ref.rollout.gpu_memory_utilization": Ignored(
        "vLLM's KV-cache share of GPU memory: XLA sizes the KV cache when it compiles, for "
        "actor_rollout_ref.rollout.max_num_seqs rows per generation shard (the whole batch when unset)"
      ),
      "actor_rollout_ref.rollout.enforce_eager": Ignored("vLLM's CUDA-graph switch: the sampler is always compiled"),
      "actor_rollout_ref.rollout.free_cache_engine": Ignored(
        "vLLM frees its KV cache between rollouts: XLA frees the cache when generation ends"
      ),
      "actor_rollout_ref.rollout.enable_chunked_prefill": Ignored(_VLLM),
      "actor_rollout_ref.rollout.enable_prefix_caching": Ignored(_VLLM),
      "actor_rollout_ref.rollout.cudagraph_capture_sizes": Ignored(_VLLM),
      "actor_rollout_ref.rollout.disable_log_stats": Ignored(_VLLM),
      "actor_rollout_ref.rollout.max_num_batched_tokens": Ignored(
        "vLLM's token budget per scheduler step: jaxrlhf's rows decode one token per step, "
        "bounded by actor_rollout_ref.rollout.max_num_seqs"
      ),
      "actor_rollout_ref.rollout.max_model_len": Ignored(
        "vLLM's longest sequence: jaxrlhf's KV cache holds data.max_prompt_length + data.max_response_length"
      ),
      "actor_rollout_ref.rollout.data_parallel_size": Ignored(
        "vLLM's engine replicas: generation runs on every device of the mesh"
      ),
      "actor_rollout_ref.rollout.expert_parallel_size": Ignored(_VLLM),
      "actor_rollout_ref.rollout.pipeline_model_parallel_size": Ignored(_VLLM),
      "actor_rollout_ref.rollout.load_format": Ignored("the sampler reads the actor's weights inside the step"),
      "actor_rollout_ref.rollout.layered_summon": Ignored(_FSDP),
      "actor_rollout_ref.rollout.calculate_log_probs": Ignored("the old log-probs are recomputed by the actor"),
      "actor_rollout_ref.rollout.engine_kwargs.*": Ignored(_VLLM),
      "actor_rollout_ref.rollout.skip_tokenizer_init": Ignored(_VLLM),
      "actor_rollout_ref.rollout.multi_stage_wake_up": Ignored(
        "vLLM/SGLang wake weights and KV cache up in stages to save memory: jaxrlhf's weights and KV cache are "
        "buffers of the one compiled program"
      ),
      "actor_rollout_ref.rollout.prometheus.*": Ignored(
        "the inference server's Prometheus metrics: jaxrlhf serves its own at trainer.prometheus_port"
      ),
      "actor_rollout_ref.rollout.trace.*": Ignored(
        "verl's rollout traces (weave, mlflow): jaxrlhf writes validation generations to "
        "<run dir>/val_generations.jsonl (trainer.log_val_generations)"
      ),
      "actor_rollout_ref.rollout.sglang_rollout_mode": Ignored(_VLLM),
      "actor_rollout_ref.rollout.server.*": Ignored(_VLLM),
      "actor_rollout_ref.rollout.checkpoint_engine.*": Ignored(
        "verl's weight transfer to the rollout engine: the sampler reads the actor's weights in place"
      ),
    },
  ),
  (
    "The model and its kernels",
    {
      "actor_rollout_ref.actor.use_torch_compile": Ignored(_TORCH),
      "actor_rollout_ref.ref.use_torch_compile": Ignored(_TORCH),
      "actor_rollout_ref.model.use_fused_kernels": Ignored(_TORCH),
      "actor_rollout_ref.model.fused_kernel_options.*": Ignored(_TORCH),
      "actor_rollout_ref.model.use_liger": Ignored(_TORCH),
      "actor_rollout_ref.actor.entropy_checkpointing": Ignored(_CHUNKED_HEAD),
      "actor_rollout_ref.actor.entropy_from_logits_with_chunking": Ignored(_CHUNKED_HEAD),
      "actor_rollout_ref.ref.entropy_checkpointing": Ignored(_CHUNKED_HEAD),
      "actor_rollout_ref.ref.entropy_from_logits_with_chunking": Ignored(_CHUNKED_HEAD),
      "actor_rollout_ref.actor.use_prefix_grouper": Ignored(
        "PrefixGrouper computes a group's shared prompt once (the same log-probs, less compute): jaxrlhf runs "
        "each sequence's forward whole"
      ),
      "actor_rollout_ref.actor.calculate_sum_pi_squared": Ignored(
        "jaxrlhf's old-log-prob forward computes sum(pi^2) exactly when algorithm.adv_estimator is "
        "optimal_token_baseline or tir_optimal_token_baseline (where verl needs it True)"
      ),
      **{
        f"{model}.enable_activation_offload": Ignored(
          "PyTorch's activation offload to CPU: jaxrlhf saves activation memory by recomputing them "
          "(model.enable_gradient_checkpointing)"
        )
        for model in ("actor_rollout_ref.model", "critic.model")
      },
      **{
        f"{model}.{name}": Ignored(inert, _refused_unless(None, "", [], reason=_LORA[name]), refuses, "LoRA")
        for model in ("actor_rollout_ref.model", "critic.model")
        for name, inert, refuses in (
          ("lora_adapter_path", "null: fresh adapters", "a path"),
          ("exclude_modules", "null or []: no module excluded", "a module list"),
        )
      },
      "actor_rollout_ref.model.mtp.*": Ignored(
        "off (mtp.enable=False, verl's default)",
        _refused_when_on("actor_rollout_ref.model.mtp.enable", _MTP),
        "`mtp.enable=True`",
        "multi-token prediction",
      ),
      **{
        f"{model}.lora.*": Ignored(
          "off (lora.rank=0, verl's default)",
          _refused_when_on(f"{model}.lora.rank", _MEGATRON_LORA),
          "`lora.rank` > 0",
          "Megatron-LM",
        )
        for model in ("actor_rollout_ref.model", "critic.model")
      },
      "actor_rollout_ref.model.use_shm": Ignored("the model is read from its directory once"),
      "actor_rollout_ref.model.external_lib": Ignored("models are jaxrlhf's own Flax decoders (Llama/Qwen/Mistral)"),
      "actor_rollout_ref.model.trust_remote_code": Ignored("never remote code: models are jaxrlhf's own decoders"),
      "critic.model.external_lib": Ignored("models are jaxrlhf's own Flax decoders (Llama/Qwen/Mistral)"),
      "critic.model.trust_remote_code": Ignored("never remote code: models are jaxrlhf's own decoders"),
      "critic.model.tokenizer_path": Ignored("the critic reads the actor's tokens (one tokenizer: data.tokenizer)"),
      **{
        f"actor_rollout_ref.model.override_config.{name}": Ignored("jaxrlhf's decoder has no dropout (RL sets it 0)")
        for name in ("attention_dropout", "embd_pdrop", "resid_pdrop", "hidden_dropout", "dropout")
      },
    },
  ),
  (
    "Rewards",
    {
      "reward_model.reward_manager": Translated(
        _legacy_reward_manager,
        "reward_model.reward_manager: naive, dapo and gdpo score one sample a call (DAPO's overlong shaping is "
        "reward_model.overlong_buffer), batch calls custom_reward_function once per batch with lists; "
        "prime, collabllm and managers jaxrlhf lacks are refused",
        inputs=("reward.reward_manager.name",),
      ),
      "reward.reward_manager.name": Translated(
        _new_reward_manager,
        "reward_model.reward_manager (verl 0.9.1's spelling; reward_model.reward_manager wins when set, as in verl)",
        inputs=("reward_model.reward_manager",),
      ),
      "reward.reward_manager.source": Ignored(
        "register: verl's registered managers (the name above)",
        _refused_unless("register", reason=_CUSTOM_MANAGER),
        "`importlib`",
        "custom reward loop",
      ),
      "reward.reward_manager.module.*": Ignored(
        "null: no manager module",
        _refused_unless(None, "", "custom_reward_manager", reason=_CUSTOM_MANAGER),
        "a path",
        "custom reward loop",
      ),
      **{
        new: _new_spelling(new, old, old)
        for new, old in (
          ("reward.num_workers", "reward_model.num_workers"),
          ("reward.reward_model.enable", "reward_model.enable"),
          ("reward.reward_model.model_path", "reward_model.model.path"),
        )
      },
      **{
        f"reward.reward_model.{name}": Ignored(_REWARD_ENGINE)
        for name in ("enable_resource_pool", "n_gpus_per_node", "nnodes", "rollout.*")
      },
      # A generative reward model's sampler (`reward_model.generative`): the judge decodes inside the step with
      # these; the rest of verl's reward rollout section configures its serving engine.
      **{
        f"reward.reward_model.rollout.{name}": _new_spelling(
          f"reward.reward_model.rollout.{name}", f"reward_model.rollout.{name}", f"reward_model.rollout.{name}"
        )
        for name in JUDGE_ROLLOUT_KEYS
      },
      **{
        f"{prefix}.url": Ignored(
          "null: the code sources run in local sandboxed processes (jaxrlhf.rewards.code)",
          _refused_unless(None, "", reason=_SANDBOX_FUSION),
          "a URL",
          "sandbox fusion",
        )
        for prefix in ("sandbox_fusion", "reward.sandbox_fusion")
      },
      **{
        f"{prefix}.{name}": Ignored(
          "the code sources' local runs are limited by reward_model.timeout_s per sample and "
          f"{_CODE_LIMITS} per program"
        )
        for prefix in ("sandbox_fusion", "reward.sandbox_fusion")
        for name in ("max_concurrent", "memory_limit_mb")
      },
      **{
        f"reward.reward_kwargs.overlong_buffer_cfg.{name}": _rename(
          f"reward_model.overlong_buffer.{name}", "DAPO's overlong buffer"
        )
        for name in ("enable", "len", "penalty_factor")
      },
      "reward.reward_kwargs.overlong_buffer_cfg.log": Ignored(
        "verl logs each sample's overlong_reward: jaxrlhf logs response_length/clip_ratio (responses cut at the "
        "maximum)"
      ),
      "reward.reward_kwargs.max_resp_len": Translated(
        _max_resp_len, "nothing: checked to equal data.max_response_length, where jaxrlhf's overlong buffer ends"
      ),
      **{
        f"{prefix}.{name}": _rename(f"reward_model.overlong_buffer.{name}", "DAPO's overlong buffer")
        for prefix in ("reward_model.reward_kwargs.overlong_buffer_cfg", "custom_reward_function.overlong_buffer")
        for name in ("enable", "len", "penalty_factor")
      },
      **{
        f"{prefix}.log": Ignored(
          "verl logs each sample's overlong_reward: jaxrlhf logs response_length/clip_ratio "
          "(responses cut at the maximum)"
        )
        for prefix in (
          "reward_model.reward_kwargs.overlong_buffer_cfg",
          "custom_reward_function.overlong_buffer",
          "reward_model.overlong_buffer",
        )
      },
      **{
        f"reward.custom_reward_function.{part}": _new_spelling(
          f"reward.custom_reward_function.{part}",
          f"custom_reward_function.{part}",
          "custom_reward_function.path",
          "custom_reward_function.name",
        )
        for part in ("path", "name")
      },
      "reward_model.reward_kwargs.max_resp_len": Translated(
        _max_resp_len, "nothing: checked to equal data.max_response_length, where jaxrlhf's overlong buffer ends"
      ),
      "reward_model.use_reward_loop": Ignored("verl's asynchronous reward loop: jaxrlhf scores inside the step"),
      "reward_model.rollout.*": Ignored(_REWARD_ENGINE),
      "reward_model.enable_resource_pool": Ignored(_REWARD_ENGINE),
      "reward_model.n_gpus_per_node": Ignored(_REWARD_ENGINE),
      "reward_model.nnodes": Ignored(_REWARD_ENGINE),
      "reward_model.strategy": Ignored(_REWARD_ENGINE),
      "reward_model.micro_batch_size": Ignored(_REWARD_ENGINE),
      "reward_model.micro_batch_size_per_gpu": Ignored(_REWARD_ENGINE),
      "reward_model.max_length": Ignored(_REWARD_ENGINE),
      "reward_model.use_dynamic_bsz": Ignored(_REWARD_ENGINE),
      "reward_model.forward_max_token_len_per_gpu": Ignored(_REWARD_ENGINE),
      "reward_model.model.use_remove_padding": Ignored(_REWARD_ENGINE),
      "reward_model.model.fsdp_config.*": Ignored(_FSDP),
      "reward_model.model.external_lib": Ignored("models are jaxrlhf's own Flax decoders (Llama/Qwen/Mistral)"),
      "reward_model.model.trust_remote_code": Ignored("never remote code: models are jaxrlhf's own decoders"),
      "reward_model.model.input_tokenizer": Ignored(
        "null: the reward model reads the actor's tokens",
        _refused_unless(None, reason=_INPUT_TOKENIZER),
        "any tokenizer (not null)",
        "reward model tokenizer",
      ),
      **{
        f"reward_model.{name}": Ignored(
          "null: verl's reward loop", _refused_unless(None, "", reason=_CUSTOM_MANAGER), "a value", "custom reward loop"
        )
        for name in ("reward_loop_source", "reward_loop_module_path", "reward_loop_class_name")
      },
    },
  ),
  (
    "On-policy distillation",
    {
      "distillation.teacher_models.teacher_model.model_path": _rename(
        "distillation.teacher_model.model_path", "one teacher"
      ),
      "distillation.teacher_models.teacher_model.key": Ignored(
        "with one teacher verl routes every row to it whatever its key; so does jaxrlhf"
      ),
      "distillation.teacher_key": Ignored(
        "the row field that picks a teacher among several: with one teacher (jaxrlhf's) it is not read, as in verl"
      ),
      **{
        f"distillation.{name}": Ignored(_TEACHER_IN_STEP)
        for name in ("n_gpus_per_node", "nnodes", "teacher_models.teacher_model.num_replicas")
      },
      "distillation.teacher_models.teacher_model.inference.*": Ignored(_TEACHER_IN_STEP),
    },
  ),
  (
    "The algorithm",
    {
      "algorithm.filter_groups.metric": Translated(
        _filter_metric,
        "algorithm.filter_groups.metric; verl's `acc` and `reward` become `score`",
        note="`acc`/`reward` -> `score`: jaxrlhf filters on the sequence score (the reward's score, plus the "
        "overlong penalty when it is on), the same groups as verl's `acc` for a reward that scores "
        "correctness alone; with the overlong penalty on, a group whose answers are all right or all "
        "wrong but whose lengths differ in the buffer is kept",
      ),
    },
  ),
  (
    "Logging, profiling, checkpoints",
    {
      "trainer.logger": Translated(
        _logger,
        "trainer.logger: jaxrlhf's backends kept (verl's `file` -> jsonl), "
        "verl's others (swanlab, vemlp_wandb, clearml, trackio) dropped and reported, "
        "an unknown name refused",
      ),
      "global_profiler.steps": Translated(_profile_steps, "trainer.profile_steps (null -> none)"),
      "trainer.profile_steps": Translated(_profile_steps, "trainer.profile_steps (null -> none)"),
      "global_profiler.*": Ignored(_PROFILER),
      "*.profiler.*": Ignored(_PROFILER),
      "actor_rollout_ref.actor.checkpoint.*": Ignored(_CHECKPOINT),
      "critic.checkpoint.*": Ignored(_CHECKPOINT),
      "trainer.max_critic_ckpt_to_keep": Translated(
        _critic_ckpt_to_keep,
        "trainer.max_actor_ckpt_to_keep = the larger of the two (None: all): a jaxrlhf "
        "checkpoint holds actor and critic together",
        inputs=("trainer.max_actor_ckpt_to_keep",),
      ),
      "trainer.default_hdfs_dir": Ignored("checkpoints go to trainer.default_local_dir (any mounted path)"),
      "trainer.del_local_ckpt_after_load": Ignored("checkpoints go to trainer.default_local_dir (any mounted path)"),
      "hydra.*": Ignored("Hydra's own settings (its output directory): train.py writes to the run directory"),
    },
  ),
  (
    "Data loading",
    {
      "data.return_raw_chat": Ignored(
        f"{_DEAD}: verl's dataset always returns the chat messages; jaxrlhf tokenizes them through the chat template"
      ),
      "data.return_raw_input_ids": Ignored("the prompt is tokenized once, through the chat template"),
      "data.return_full_prompt": Ignored("the prompt is tokenized once, through the chat template"),
      "data.dataloader_num_workers": Ignored("the whole data set is tokenized up front; batches are host arrays"),
      "data.filter_overlong_prompts_workers": Ignored("the whole data set is tokenized up front"),
      "data.use_shm": Ignored("the data files are read once"),
      "data.trust_remote_code": Ignored("never remote code"),
      "data.custom_cls.*": Ignored(
        "null: verl's own dataset",
        _refused_unless(None, reason=_CUSTOM_DATASET),
        "a class (not null)",
        "custom dataset class",
      ),
      **{
        f"data.sampler.{name}": Ignored(
          "null, or verl's RandomCurriculumSampler test class (random order, no curriculum): jaxrlhf shuffles "
          "the rows (data.shuffle)",
          _sampler,
          "any other sampler class",
          "custom sampler",
        )
        for name in ("class_path", "class_name")
      },
    },
  ),
  (
    "Multi-turn rollouts with tools",
    {
      # The multi_turn keys of jaxrlhf's tree (max_assistant_turns, max_user_turns, tool_config_path,
      # max_parallel_calls, max_tool_response_length, tool_response_truncate_side) are mapped as they are.
      f"{MULTI_TURN}.enable": _rename(
        f"{MULTI_TURN}.enable",
        "tool rollouts, as the scripts that set it mean; verl 0.9.1 itself runs its tool loop only with "
        "agent.default_agent_loop=tool_agent or the rows' agent_name column",
      ),
      f"{MULTI_TURN}.format": Translated(
        _tool_format, f"{MULTI_TURN}.format: hermes; verl's other tool-call parsers refused"
      ),
      f"{AGENT}.default_agent_loop": Translated(
        _default_agent_loop,
        f"tool_agent -> {MULTI_TURN}.enable=True (verl 0.9.1's tool loop); single_turn_agent -> nothing; "
        "any other loop refused",
      ),
      f"{AGENT}.num_workers": Ignored(
        "the Ray actors that run verl's agent loops: jaxrlhf runs the tool calls on the host "
        "(multi_turn.max_parallel_calls per turn)"
      ),
      **{
        key: Ignored(
          "null: verl's own agent loops",
          _refused_unless(None, "", reason=_CUSTOM_AGENT_LOOP),
          "a path or class",
          "custom agent loops",
        )
        for key in (
          f"{AGENT}.agent_loop_config_path",
          f"{AGENT}.agent_loop_manager_class",
          f"{AGENT}.custom_async_server.*",
        )
      },
      **{
        key: Ignored(
          "null: no function tools",
          _refused_unless(None, "", reason=_FUNCTION_TOOLS),
          "a path",
          "function tools",
        )
        for key in (f"{MULTI_TURN}.function_tool_path", "data.function_tool_path")
      },
      "data.tool_config_path": Ignored(
        f"verl mirrors {TOOL_CONFIG} here (its prompt-length filter counts the tool schemas)",
        _data_tool_config,
        "a path other than the rollout's",
        "multi-turn",
      ),
      f"{MULTI_TURN}.interaction_config_path": Ignored(
        "null: no interaction",
        _refused_unless(None, "", reason=_INTERACTIONS),
        "a path",
        "interactions",
      ),
      **{
        f"{MULTI_TURN}.{name}": Ignored(f"{_DEAD} (a setting of verl's retired SGLang rollout)")
        for name in ("num_repeat_rollouts", "use_inference_chat_template", "tokenization_sanity_check_mode")
      },
      "actor_rollout_ref.rollout.over_sample_rate": Ignored(
        "SGLang's early stop (the last over_sample_rate of a batch's requests aborted): jaxrlhf generates "
        "in-graph, every row to its end"
      ),
    },
  ),
  (
    "verl 0.9.1's newer keys",
    {
      "*._target_": Ignored(
        "the class Hydra instantiates for a section (verl's dataclass configs): jaxrlhf's sections are its tree"
      ),
      **{
        f"{section}.rollout_n": Ignored("verl fills it from actor_rollout_ref.rollout.n")
        for section in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic")
      },
      **{
        f"{section}.data_loader_seed": Ignored(
          "the mini-batch order of the update draws from trainer.seed (the data order from data.seed)"
        )
        for section in ("actor_rollout_ref.actor", "critic")
      },
      "actor_rollout_ref.actor.calculate_entropy": Ignored(
        "the old-log-prob forward always computes the entropy (actor/entropy), as verl's does for its metric"
      ),
      "actor_rollout_ref.actor.use_fused_kernels": Ignored(_TORCH),
      **{
        f"{section}.entropy_from_logits_chunk_size": Ignored(_CHUNKED_HEAD)
        for section in ("actor_rollout_ref.actor", "actor_rollout_ref.ref")
      },
      **{
        f"{section}.pad_to_length": Ignored(_STATIC_SHAPES)
        for section in ("actor_rollout_ref.actor", "actor_rollout_ref.ref")
      },
      "actor_rollout_ref.actor.use_remove_padding": Ignored(
        "the actor's forward reads actor_rollout_ref.model.use_remove_padding (verl's engine copies it here)"
      ),
      **{
        f"{section}.optim.optimizer": Ignored(
          "AdamW (optax.adamw); Megatron's `adam` is AdamW too (decoupled weight decay)",
          _refused_unless("AdamW", "adamw", "adam", reason=_OPTIMIZER),
          "any other optimizer",
          "optimizer",
        )
        for section in ("actor_rollout_ref.actor", "critic")
      },
      **{
        f"{section}.optim.optimizer_impl": Ignored("the optimizer is optax's AdamW (torch.optim's, in verl)")
        for section in ("actor_rollout_ref.actor", "critic")
      },
      **{
        f"{section}.optim.zero_indexed_step": Ignored(
          "True: the warm-up counts from step 0 (lr 0 at the first update), jaxrlhf's schedule",
          _refused_unless(True, reason=_OPTIMIZER),
          "False",
          "optimizer",
        )
        for section in ("actor_rollout_ref.actor", "critic")
      },
      **{
        f"{section}.optim.override_optimizer_config": Ignored(
          "null: no optimizer override", _refused_unless(None, {}, reason=_OPTIMIZER), "a mapping", "optimizer"
        )
        for section in ("actor_rollout_ref.actor", "critic")
      },
      **{
        f"{section}.qat.*": Ignored(
          "off (qat.enable=False, verl's default)",
          _refused_when_on(f"{section}.qat.enable", _QUANTIZATION),
          "`qat.enable=True`",
          "quantization",
        )
        for section in ("actor_rollout_ref.actor", "critic.fsdp")
      },
      **{
        f"actor_rollout_ref.rollout.{name}": Ignored(
          "null: full-precision generation",
          _refused_unless(None, "", reason=_QUANTIZATION),
          "a quantization",
          "quantization",
        )
        for name in ("quantization", "quantization_config_file", "qat")
      },
      "actor_rollout_ref.rollout.mtp": Ignored(
        "null: no draft model", _refused_unless(None, reason=_MTP), "a setting", "multi-token prediction"
      ),
      **{f"actor_rollout_ref.rollout.{name}": Ignored(_VLLM) for name in ("scheduling_policy", "router_config_path")},
      **{
        f"actor_rollout_ref.rollout.{name}": Ignored(
          "the rollout's own GPUs (verl's standalone rollout): generation runs on every device of the mesh"
        )
        for name in ("nnodes", "n_gpus_per_node")
      },
      "actor_rollout_ref.rollout.disaggregation.*": Ignored(
        "off (disaggregation.enabled=False)",
        _refused_when_on("actor_rollout_ref.rollout.disaggregation.enabled", _DISAGGREGATION),
        "`disaggregation.enabled=True`",
        "disaggregated serving",
      ),
      "actor_rollout_ref.rollout.full_determinism": Ignored(
        "jaxrlhf's sampler is deterministic given trainer.seed (same seed and config, same generations)"
      ),
      "actor_rollout_ref.rollout.seed": Ignored("generation samples from trainer.seed"),
      **{
        f"actor_rollout_ref.rollout.{name}": Ignored(
          f"verl fills it from data.max_{name}: jaxrlhf's rollout reads data.max_{name}"
        )
        for name in ("prompt_length", "response_length")
      },
      "actor_rollout_ref.rollout.ignore_eos": Ignored(
        "False: a row stops at its EOS", _refused_unless(False, reason=_IGNORE_EOS), "True", "rollout sampling"
      ),
      "actor_rollout_ref.rollout.logprobs_mode": Ignored("the old log-probs are recomputed by the actor"),
      "actor_rollout_ref.rollout.moe_load_balance_metrics_interval": Ignored(
        "the inference engine's MoE load-balance metrics: generation is jaxrlhf's sampler"
      ),
      **{
        f"{model}.hf_config_path": Ignored(
          "null: the model's own config.json",
          _refused_unless(None, "", reason=_HF_CONFIG_PATH),
          "a path",
          "model config",
        )
        for model in ("actor_rollout_ref.model", "critic.model")
      },
      "actor_rollout_ref.model.tokenizer_path": _rename("data.tokenizer", "the tokenizer's path"),
      "critic.model.custom_chat_template": Ignored("the critic reads the actor's tokens"),
      **{
        f"{model}.override_config": Ignored(
          "an empty mapping: jaxrlhf reads the override_config.<field> keys",
          _refused_unless({}, None, reason=_AS_SUBKEYS),
          "a whole mapping",
          "whole mappings",
        )
        for model in ("actor_rollout_ref.model", "critic.model")
      },
      **{f"{model}.tiled_mlp.*": Ignored(_TILED_MLP) for model in ("actor_rollout_ref.model", "critic.model")},
      "critic.model.use_shm": Ignored("the model is read from its directory once"),
      **{
        f"critic.model.{name}": Ignored(_TORCH) for name in ("use_liger", "use_fused_kernels", "fused_kernel_options.*")
      },
      "critic.model.mtp.*": Ignored(
        "off (mtp.enable=False, verl's default)",
        _refused_when_on("critic.model.mtp.enable", _MTP),
        "`mtp.enable=True`",
        "multi-token prediction",
      ),
      "critic.fsdp.*": Ignored(_FSDP),
      **{
        f"critic.fsdp.{name}": _rename(f"critic.model.fsdp_config.{name}", "verl 0.9.1's critic.fsdp spelling")
        for name in ("param_offload", "optimizer_offload")
      },
      "critic.fsdp.fsdp_size": Ignored("one mesh for every model: the actor's fsdp_config.fsdp_size sets it"),
      "critic.fsdp.ulysses_sequence_parallel_size": _rename(
        "critic.ulysses_sequence_parallel_size", "verl 0.9.1's critic.fsdp spelling"
      ),
      "critic.fsdp.strategy": Ignored(_STRATEGY),
      **{
        f"critic.fsdp.{name}": Ignored(_CHUNKED_HEAD)
        for name in ("entropy_from_logits_with_chunking", "entropy_from_logits_chunk_size", "entropy_checkpointing")
      },
      "critic.fsdp.use_torch_compile": Ignored(_TORCH),
      "critic.fsdp.pad_to_length": Ignored(_STATIC_SHAPES),
      "critic.fsdp.pad_to_length_bucket": Ignored(_STATIC_SHAPES),
      **{
        f"critic.fsdp.{name}": Ignored("the critic's dtypes are critic.model.dtype and critic.model.param_dtype")
        for name in ("model_dtype", "dtype")
      },
      "data.validation_shuffle": Ignored("validation scores every row of data.val_files; the order changes no metric"),
      "data.apply_chat_template_kwargs": Ignored(
        "an empty mapping: jaxrlhf reads data.apply_chat_template_kwargs.enable_thinking and .reasoning_effort",
        _refused_unless({}, None, reason=_AS_SUBKEYS),
        "a whole mapping",
        "whole mappings",
      ),
      "data.apply_chat_template_kwargs.*": Refused("chat template arguments", _CHAT_TEMPLATE_KWARGS),
      "algorithm.filter_groups.max_inflight_gen_batches": Ignored(
        "verl's asynchronous generation rounds in flight: jaxrlhf generates one round at a time "
        "(algorithm.filter_groups.max_num_gen_batches bounds the rounds)"
      ),
      "algorithm.use_pf_ppo": Ignored("False", _refused_unless(False, reason=_PF_PPO), "True", "PF-PPO"),
      "algorithm.pf_ppo.*": Ignored(
        "read only with algorithm.use_pf_ppo=True",
        _refused_when_on("algorithm.use_pf_ppo", _PF_PPO),
        "`algorithm.use_pf_ppo=True`",
        "PF-PPO",
      ),
      # Any teacher entry but verl's single `teacher_model` (its keys are read above).
      "distillation.teacher_models.*": Refused("distillation teachers", _DISTILLATION),
      "transfer_queue.*": Ignored(
        "off (transfer_queue.enable=False): verl's data transfer between Ray workers",
        _refused_when_on("transfer_queue.enable", _TRANSFER_QUEUE),
        "`transfer_queue.enable=True`",
        "transfer queue",
      ),
      "trainer.esi_redundant_time": Ignored(
        "Volcano ESI's save-before-expiry margin: jaxrlhf saves at trainer.save_freq and on SIGTERM"
      ),
      "trainer.checkpoint_callback_class": Ignored(
        "null: no callback", _refused_unless(None, "", reason=_CHECKPOINT_CALLBACK), "a class", "checkpoint callback"
      ),
      "trainer.use_v1": Ignored("verl's choice between its trainer implementations: jaxrlhf has one, synchronous"),
      "trainer.v1.trainer_mode": Translated(
        _trainer_mode,
        "trainer.v1.trainer_mode (sync, colocate_async; separate_async refused); colocate_async without "
        "actor_rollout_ref.rollout.max_num_seqs also sets it to verl's default, 1024",
        inputs=("actor_rollout_ref.rollout.max_num_seqs",),
      ),
      "trainer.v1.colocate_async.num_warmup_batches": Translated(
        _warmup_batches,
        "trainer.v1.colocate_async.num_warmup_batches (whole batches only)",
      ),
      "trainer.v1.*": Ignored("settings of verl's asynchronous trainer modes (trainer.v1.trainer_mode)"),
      "trainer.v1.sampler.custom_sampler.*": Ignored(
        "null: no custom sampler", _refused_unless(None, "", reason=_SAMPLER), "a path or name", "custom sampler"
      ),
      **{
        f"skip.{name}.*": Ignored(
          f"off (skip.{name}.enable=False)",
          _refused_when_on(f"skip.{name}.enable", _SKIP_ROLLOUT),
          f"`skip.{name}.enable=True`",
          "rollout replay",
        )
        for name in ("rollout", "rollout_tq", "async_rollout")
      },
    },
  ),
  (
    "Megatron-LM (ppo_megatron_trainer)",
    {
      **{key: entry for role in MEGATRON_ROLES for key, entry in _megatron_entries(role).items()},
      "critic.nccl_timeout": Ignored(
        "the timeout of verl's NCCL process groups: XLA's collectives run inside the compiled step"
      ),
    },
  ),
  (
    "Features jaxrlhf does not have",
    {
      "*.megatron.*": Refused("Megatron-LM", _MEGATRON),
      **{
        key: Refused("vision-language", _VISION)
        for key in (
          "data.image_key",
          "data.video_key",
          "data.audio_key",
          "data.image_patch_size",
          "data.return_multi_modal_inputs",
          "data.mm_processor_kwargs",
          "data.mm_processor_kwargs.*",
          "actor_rollout_ref.rollout.limit_images",
          "actor_rollout_ref.actor.freeze_vision_tower",
        )
      },
    },
  ),
]
# Every family a key can be refused in, and why (docs/verl_scripts.md's summary).
FAMILIES = {
  "Megatron-LM": _MEGATRON,
  "vision-language": _VISION,
  "multi-turn": "a tool setting jaxrlhf cannot follow: data.tool_config_path other than the rollout's, or a "
  "tool config whose tools do not load in jaxrlhf (verl's sandbox_fusion, search, geo3k and MCP tools; a "
  "verl tool class): port the tool to jaxrlhf.tools.BaseTool (docs/tools.md)",
  "interactions": _INTERACTIONS,
  "function tools": _FUNCTION_TOOLS,
  "custom agent loops": _CUSTOM_AGENT_LOOP,
  "custom sampler": _SAMPLER,
  "reward manager": "; ".join(f"{name}: {why}" for name, why in _REWARD_MANAGERS.items())
  + "; any other manager but naive, dapo, batch and gdpo: jaxrlhf has no such manager",
  "reward model tokenizer": _INPUT_TOKENIZER,
  "LoRA": "; ".join(_LORA.values()),
  "custom dataset class": _CUSTOM_DATASET,
  "multi-token prediction": _MTP,
  "chat template arguments": _CHAT_TEMPLATE_KWARGS,
  "custom reward loop": "a custom reward loop or manager class: jaxrlhf's reward is custom_reward_function",
  "sandbox fusion": _SANDBOX_FUSION,
  "optimizer": _OPTIMIZER,
  "quantization": _QUANTIZATION,
  "disaggregated serving": _DISAGGREGATION,
  "rollout sampling": _IGNORE_EOS,
  "MoE routing replay": _ROUTING_REPLAY,
  "model config": _HF_CONFIG_PATH,
  "whole mappings": _AS_SUBKEYS,
  "PF-PPO": _PF_PPO,
  "distillation teachers": _DISTILLATION,
  "transfer queue": _TRANSFER_QUEUE,
  "checkpoint callback": _CHECKPOINT_CALLBACK,
  "v1": _TRAINER_V1,
  "rollout replay": _SKIP_ROLLOUT,
  "Hydra base config": "a base YAML (--config-name) jaxrlhf cannot read: not found where the script runs, not "
  "built on verl's ppo_trainer, or with values it cannot read (interpolations, lists of mappings)",
}
TABLE: dict[str, Translated | Ignored | Refused] = {
  key: entry for _, entries in SECTIONS for key, entry in entries.items()
}
_PATTERNS = sorted(
  ((key, re.compile(".*".join(map(re.escape, key.split("*"))))) for key in TABLE if "*" in key),
  key=lambda item: -len(item[0].replace("*", "")),
)

_TARGET = "*._target_"

# Hydra's base config (`--config-name`): verl's defaults are jaxrlhf's base; another file's values are unknown.
# verl's ppo_megatron_trainer is ppo_trainer with the megatron sections, whose defaults translate to nothing.
_HYDRA_BASES = {"ppo_trainer": None, "ppo_megatron_trainer": None}


# ----- parsing key=value ---------------------------------------------------------------------------


@dataclasses.dataclass
class Override:
  key: str
  raw: str  # the value as written (after the shell)
  arg: str  # the whole argument, for messages


def parse_override(arg: str) -> Override:
  """`key=value`, `+key=value` or `++key=value` (Hydra's append / force-append act as set here)."""
  if "=" not in arg or arg.startswith(("-", "~")):
    raise UserError(
      f"cannot read override {arg!r}: expected key=value (verl/Hydra style) or --config.key=value",
      hint="Hydra's ~key (delete) has no jaxrlhf equivalent; leave the key out",
    )
  key, raw = arg.split("=", 1)
  key = key.lstrip("+")
  if not re.fullmatch(r"[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)*", key):  # nsys options have dashes
    raise UserError(f"cannot read override {arg!r}: {key!r} is not a dotted config key")
  return Override(key, raw, arg)


def _split_list(text: str, raw: str) -> list[str]:
  """Hydra list items: commas outside quotes and brackets."""
  items, depth, quote, current = [], 0, None, ""
  for char in text:
    if quote:
      quote = None if char == quote else quote
    elif char in "'\"":
      quote = char
    elif char in "[(":
      depth += 1
    elif char in "])":
      depth -= 1
    elif char == "," and depth == 0:
      items.append(current)
      current = ""
      continue
    current += char
  if quote or depth:
    raise UserError(f"cannot read {raw!r}: {'an unclosed quote' if quote else 'unbalanced brackets'}")
  if current.strip():
    items.append(current)
  return items


def parse_value(raw: str) -> Any:
  """A Hydra value: null, bools, ints, floats, [lists], quoted strings; anything else is a string.

  An unclosed bracket or quote (`["console","wandb"`) is an error, as in Hydra, not a string. An empty
  value (`key=`, e.g. from an empty shell variable) is the empty string, as in Hydra.
  """
  text = raw.strip()
  if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
    return text[1:-1]
  if text.startswith(("'", '"')):
    raise UserError(f"cannot read {raw!r}: an unclosed {text[0]} quote")
  if text in ("null", "None", "~"):
    return None
  if text == "{}":  # an empty mapping (verl's `engine_kwargs: {}`)
    return {}
  if text.lower() in ("true", "false"):
    return text.lower() == "true"
  for open_char, close_char in ("[]", "()"):  # (a,b): jaxrlhf's own tuple spelling, from --config habits
    if text.startswith(open_char) or text.endswith(close_char):
      if not (text.startswith(open_char) and text.endswith(close_char)):
        raise UserError(f"cannot read {raw!r}: an unclosed {open_char}{close_char} list")
      return [parse_value(item) for item in _split_list(text[1:-1], raw)]
  if re.fullmatch(r"[+-]?\d+", text):
    return int(text)
  if re.fullmatch(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?|[+-]?(inf|nan)", text):
    return float(text)
  return text


def coerce(key: str, value: Any, expected: type, arg: str) -> Any:
  """`value` as the tree's type for `key` (a str data path -> a 1-tuple, an int -> float), or UserError."""
  if value is None or expected is type(None):
    return value
  if expected is tuple:
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)
  if expected is float and isinstance(value, int) and not isinstance(value, bool):
    return float(value)
  if expected is str and isinstance(value, (int, float)) and not isinstance(value, bool):
    return str(value)  # e.g. trainer.experiment_name=123
  if isinstance(value, list) or not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
    raise UserError(
      f"config key '{key}' expects {expected.__name__}, got {value!r} ({type(value).__name__}) from {arg}"
    )
  return value


# ----- classification ----------------------------------------------------------------------------


def base_tree_types() -> dict[str, type]:
  """{key: declared type} of every leaf of jaxrlhf's config tree (placeholders too)."""
  from jaxrlhf.config import _field_types, get_base_config

  return _field_types(get_base_config())


def lookup(key: str, tree_types: dict[str, type]) -> Translated | Ignored | Refused | str | None:
  """The table's entry for `key`; "mapped" for a key of the tree; None for an unknown key."""
  entry = TABLE.get(key) or (TABLE[_TARGET] if key.endswith(_TARGET[1:]) else None)
  if entry is not None:  # a section's `_target_` is its class, never a setting, whatever the section's pattern
    return entry
  if key in tree_types:
    return "mapped"
  return next((TABLE[pattern] for pattern, regex in _PATTERNS if regex.fullmatch(key)), None)


CLASSES = ("mapped", "translated", "ignored", "refused", "unknown")


def classify(key: str, tree_types: dict[str, type]) -> str:
  """One of `CLASSES` for a verl key (an ignored key that some values refuse is "ignored": verl's default is inert)."""
  entry = lookup(key, tree_types)
  if entry is None or isinstance(entry, str):
    return entry or "unknown"
  return {Translated: "translated", Ignored: "ignored", Refused: "refused"}[type(entry)]


def did_you_mean(key: str, candidates: Sequence[str]) -> str | None:
  """A close key: a small typo of the last part under the same section, or the same last part in a section
  spelled almost alike. Never a different setting that merely shares words."""
  parent, _, leaf = key.rpartition(".")
  best, best_score = None, 0.0
  for candidate in candidates:
    candidate_parent, _, candidate_leaf = candidate.rpartition(".")
    if candidate_parent == parent:
      score = difflib.SequenceMatcher(None, leaf, candidate_leaf).ratio()
      score = score if score >= 0.85 else 0.0
    elif candidate_leaf == leaf:
      score = difflib.SequenceMatcher(None, parent, candidate_parent).ratio()
      score = score if score >= 0.75 else 0.0
    else:
      continue
    if score > best_score:
      best, best_score = candidate, score
  return best


def unknown_key_line(key: str, arg: str, tree_types) -> str:
  close = did_you_mean(key, list(tree_types) + [k for k in TABLE if "*" not in k])
  suggestion = f"; did you mean '{close}'?" if close else "; docs/config.md lists every key"
  return f"unknown config key '{key}' (from {arg}){suggestion}"


def unknown_key_error(key: str, arg: str, tree_types) -> UserError:
  return UserError(unknown_key_line(key, arg, tree_types), hint=HINT)


@dataclasses.dataclass
class Report:
  """What a command line's overrides became: rows of (verl key, value as written, what happened)."""

  mapped: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
  translated: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
  ignored: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
  # Overrides passed on as verl overrides for train.py to translate when it runs: (key, raw, shell text).
  deferred: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
  notes: list[str] = dataclasses.field(default_factory=list)
  # The jaxrlhf keys and values to set, in order (what `--config.key=value` would set).
  assignments: dict[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def unresolved(self):  # the rows whose values only the user's shell knows
    return [row for row in self.deferred if row[2] is not None]

  def ignored_lines(self) -> list[str]:
    return [f"  {key}={raw}: {reason}" for key, raw, reason in self.ignored]

  def table(self) -> str:
    deferred = [
      (key, raw, "train.py translates it when it runs" if shell is None else "left to your shell")
      for key, raw, shell in self.deferred
    ]
    lines = []
    for title, rows in (
      ("mapped", self.mapped),
      ("translated", self.translated),
      ("ignored", self.ignored),
      ("passed on to train.py", deferred),
    ):
      if rows:
        lines.append(f"# {title}: {len(rows)}")
        lines += [f"#   {key}={raw}  ->  {what}" for key, raw, what in rows]
    lines += [f"# {note}" for note in self.notes]
    return "\n".join(lines)


def plan(
  args: Sequence[str],
  config: ml_collections.ConfigDict,
  *,
  shell_text: Mapping[str, str] | None = None,
  refusals: Mapping[str, tuple[str, list[str]]] | None = None,
) -> Report:
  """Classifies verl overrides against `config` and returns the jaxrlhf assignments (nothing set yet).

  `shell_text`: {argument: its double-quoted form} for the arguments whose values only the user's shell
  knows (the script reader's `$SLURM_JOB_NUM_NODES`); they, and the translations that read them, are
  passed on as verl overrides for train.py to translate when it runs. A repeated key: the last wins.
  Every problem (unknown key, bad value, refused family; `refusals` found before) is raised at once.
  """
  tree_types = base_tree_types()
  shell_text = shell_text or {}
  report = Report()
  problems: list[str] = []
  refusals = {family: (reason, list(keys)) for family, (reason, keys) in (refusals or {}).items()}
  overrides: dict[str, Override] = {}
  for arg in args:
    try:
      override = parse_override(arg)
    except UserError as error:
      problems.append(str(error))
      continue
    overrides.pop(override.key, None)  # the last one wins, in its place
    overrides[override.key] = override
  entries, parsed = {}, {}
  for key, override in overrides.items():
    entry = lookup(key, tree_types)
    if entry is None:
      problems.append(unknown_key_line(key, override.arg, tree_types))
      continue
    entries[key] = entry
    if override.arg in shell_text:
      parsed[key] = LEFT_TO_SHELL
      continue
    try:
      parsed[key] = parse_value(override.raw)
    except UserError as error:
      problems.append(f"config key '{key}': {error}")
  deferred = set()
  for key, entry in entries.items():
    if isinstance(entry, Translated) and any(parsed.get(k) is LEFT_TO_SHELL for k in (key, *entry.inputs)):
      deferred |= {key, *(k for k in entry.inputs if k in parsed and isinstance(entries.get(k), Translated))}
  translations = []
  for key, entry in entries.items():
    if key not in parsed:
      continue
    override, value = overrides[key], parsed[key]
    if isinstance(entry, Refused):
      refusals.setdefault(entry.family, (entry.reason, []))[1].append(key)
    elif isinstance(entry, Ignored):
      reason = entry.refuse(key, value, parsed) if entry.refuse is not None else None
      if reason == NEEDS_VALUE:
        problems.append(f"config key '{key}'={override.raw}: {NEEDS_VALUE}")
      elif reason:
        refusals.setdefault(entry.family, (reason, []))[1].append(f"{key}={override.raw}")
      else:
        report.ignored.append((key, override.raw, entry.reason))
    elif key in deferred or value is LEFT_TO_SHELL:
      report.deferred.append((key, override.raw, shell_text.get(override.arg)))
    elif isinstance(entry, Translated):
      translations.append(key)
    else:
      try:
        report.assignments[key] = coerce(key, value, tree_types[key], override.arg)
        report.mapped.append((key, override.raw, key))
      except UserError as error:
        problems.append(str(error))
  # Translations see the mapped keys applied (the mesh they size may come from the command line too).
  scratch = ml_collections.ConfigDict(config.to_dict())
  try:
    _set_all(scratch, report.assignments, tree_types)
  except UserError as error:
    problems.append(str(error))
  done = {}  # translation function -> its row: keys that translate together (GPUs x nodes) share one row
  for key in translations:
    entry, override = entries[key], overrides[key]
    if entry.fn in done:
      row_key, raw, became = report.translated[done[entry.fn]]
      report.translated[done[entry.fn]] = (f"{row_key}={raw} {key}", override.raw, became)
      continue
    try:
      result = entry.fn(parsed[key], parsed, scratch)
      targets, dropped = result if isinstance(result, tuple) else (result, [])
      targets = {target: coerce(target, value, tree_types[target], override.arg) for target, value in targets.items()}
    except UserError as error:
      problems.append(str(error) if str(error).startswith(("config key", key)) else f"{key}={override.raw}: {error}")
      continue
    done[entry.fn] = len(report.translated)
    became = ", ".join(f"{k}={v!r}" for k, v in targets.items()) or entry.target
    if entry.note and targets != {key: parsed[key]}:
      became += f"  ({entry.note})"
    report.translated.append((key, override.raw, became))
    report.ignored += dropped
    report.assignments.update(targets)
  if problems or refusals:
    raise UserError(_problem_message(problems, refusals), hint=HINT)
  return report


def _problem_message(problems: list[str], refusals: dict[str, tuple[str, list[str]]]) -> str:
  lines = problems + [
    f"refused ({family}): {reason} [{keys[0]}{f' and {len(keys) - 1} more' if len(keys) > 1 else ''}]"
    for family, (reason, keys) in refusals.items()
  ]
  if len(lines) == 1:
    return lines[0]
  return f"{len(lines)} problems with the verl overrides:\n" + "\n".join(f"  {line}" for line in lines)


def _set_all(config, assignments: dict[str, Any], tree_types) -> None:
  for key, value in assignments.items():
    *parents, leaf = key.split(".")
    node = config
    for part in parents:
      node = node[part]
    try:
      node[leaf] = value
    except (TypeError, ValueError) as error:  # ml_collections' own type check, kept
      raise UserError(f"config key '{key}' expects {tree_types[key].__name__}, got {value!r}: {error}") from None


def apply_overrides(config: ml_collections.ConfigDict, args: Sequence[str]) -> Report:
  """Sets verl overrides on `config` (a locked tree keeps its types: only existing keys are set)."""
  report = plan(args, config)
  _set_all(config, report.assignments, base_tree_types())
  return report


def split_overrides(argv: Sequence[str]) -> tuple[list[str], list[str]]:
  """(verl `key=value` arguments, the rest) of a command line."""
  verl = [arg for arg in argv if not arg.startswith("-") and "=" in arg]
  return verl, [arg for arg in argv if arg not in verl]


# ----- a verl run script -> a jaxrlhf command ---------------------------------------------------------


def _flag_text(value: Any) -> str:
  """A value as ml_collections' `--config.key=` flag reads it."""
  if isinstance(value, tuple):
    return "(" + "".join(f"{item!r}," for item in value) + ")"
  return repr(value) if isinstance(value, float) else str(value)


def _quote(text: str) -> str:
  """Double quotes where the shell needs any (tuples read better than with shlex's single quotes)."""
  if text == shlex.quote(text):
    return text
  if not re.search(r'["$`\\!]', text):
    return f'"{text}"'
  return shlex.quote(text)


def jaxrlhf_command(report: Report, config_path: str, passthrough: Sequence[str] = ()) -> str:
  """`python train.py --config FILE --config.key=value ... [key=null ...] [key="$VAR" ...]`, one per line.

  No `--config.` flag can set None, so a null is the verl override `key=null` (train.py reads verl overrides
  after the flags); a value only the user's shell knows, and what translates from it, is a verl override too.
  """
  lines = ["python train.py", f"--config {_quote(config_path)}"]
  nulls = []
  for key, value in report.assignments.items():
    if value is None:
      nulls.append(f"{key}=null")
    else:
      lines.append(f"--config.{key}={_quote(_flag_text(value))}")
  lines += nulls
  for key, raw, shell in report.deferred:
    lines.append(f'{key}="{shell}"' if shell is not None else _quote(f"{key}={raw}"))
  lines += list(passthrough)
  return " \\\n    ".join(lines)


def translate_script(
  path: str, config_path: str | None = None, env: dict[str, str] | None = None
) -> tuple[str, Report, Script]:
  """(the jaxrlhf command, its report, the script as read) for a verl run script."""
  from jaxrlhf.config import get_base_config, load_config_file

  script = read_script(path, env)
  config = load_config_file(config_path) if config_path else get_base_config()
  base = _hydra_base(script)
  args = base.overrides + [str(word) for word in script.overrides]
  refusals = {**base.refusals, **_tool_config_refusal(args, script.path, base.notes)}
  report = plan(
    args,
    config,
    shell_text={str(word): word.shell.split("=", 1)[1] for word in script.overrides if word.shell is not None},
    refusals=refusals,
  )
  report.ignored += base.rows
  report.notes += base.notes
  passthrough = [word.shell if word.unquoted else f'"{word.shell}"' for word in script.passthrough]
  for word in passthrough:
    report.notes.append(f"{word} is left to your shell: train.py reads the key=value overrides it holds")
  if script.script_args:
    report.notes.append(f"{path} passes its own arguments on (\"$@\"): add them to the command as key=value")
  return jaxrlhf_command(report, config_path or DEFAULT_CONFIG, passthrough), report, script


# ----- the script's Hydra base config and tool config ----------------------------------------------


@dataclasses.dataclass
class HydraBase:
  """What a script's `--config-path` / `--config-name` become: the base YAML's settings as overrides (set
  before the script's own, which win), refusals, report rows and notes."""

  overrides: list[str] = dataclasses.field(default_factory=list)
  refusals: dict[str, tuple[str, list[str]]] = dataclasses.field(default_factory=dict)
  rows: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
  notes: list[str] = dataclasses.field(default_factory=list)


# verl's scripts run from their project root (PROJECT_DIR="$(pwd)"): a path under it is looked for there.
_PROJECT_ROOT = re.compile(r"(\$\(pwd\)|`pwd`|\$PWD|\$\{PWD\})(/|$)")


def _project_file(text: str, script_path: str) -> str | None:
  """The file a script's path names, or None: `$(pwd)/...` and relative paths are looked for under the current
  directory, then under each folder above the script (its project root); other shell values are unknown."""
  match = _PROJECT_ROOT.match(text)
  tail = os.path.expanduser(text[match.end() :] if match else text)
  if not tail or "$" in tail or "`" in tail:
    return None
  if os.path.isabs(tail):
    return tail if os.path.isfile(tail) else None
  folder, roots = os.path.dirname(os.path.abspath(script_path)), [os.getcwd()]
  while True:
    roots.append(folder)
    if os.path.dirname(folder) == folder:
      break
    folder = os.path.dirname(folder)
  return next((os.path.join(root, tail) for root in roots if os.path.isfile(os.path.join(root, tail))), None)


def _hydra_flags(words: Sequence[str]) -> dict[str, str]:
  """{--config-path | --config-name | --config-dir: value} of Hydra's flags (short forms and `flag value` too)."""
  long = {"-cp": "--config-path", "-cn": "--config-name", "-cd": "--config-dir"}
  flags, words = {}, list(words)
  for k, word in enumerate(words):
    flag, equals, value = str(word).partition("=")
    flag = long.get(flag, flag)
    if flag not in long.values():
      continue
    if not equals:
      value = str(words[k + 1]) if k + 1 < len(words) else ""
    flags[flag] = value.strip("'\"")
  return flags


def _hydra_base(script: Script) -> HydraBase:
  """verl's ppo_trainer is jaxrlhf's base; a YAML built on it (`defaults: [ppo_trainer, _self_]`, as verl's
  examples write them) is read when the script's --config-path leads to it; anything else is refused."""
  flags, base = _hydra_flags(script.hydra_args), HydraBase()
  name = flags.get("--config-name")
  stem = os.path.splitext(os.path.basename(name))[0] if name else "ppo_trainer"
  if stem in _HYDRA_BASES:
    base.rows = [
      (flag, value, "verl's Hydra base config: jaxrlhf's base is --config FILE") for flag, value in flags.items()
    ]
    if _HYDRA_BASES[stem]:
      family, reason = _HYDRA_BASES[stem]
      base.refusals[family] = (reason, [f"--config-name={name}"])
    return base
  folders = [flags[flag] for flag in ("--config-path", "--config-dir") if flag in flags] or [""]
  found = next(
    (file for folder in folders if (file := _project_file(os.path.join(folder, f"{stem}.yaml"), script.path))), None
  )
  if found is None:
    base.refusals["Hydra base config"] = (
      f"{stem}.yaml is not found under {' or '.join(repr(folder or '.') for folder in folders)}: run "
      "verl_compat from the folder the script runs in (its $(pwd)), or pass the YAML's settings as key=value",
      [f"--config-name={name}"],
    )
    return base
  base.overrides, problems = _read_hydra_yaml(found)
  for family, reason in problems:
    earlier = base.refusals.get(family, (None,))[0]
    base.refusals[family] = ("; ".join(filter(None, (earlier, reason))), [f"--config-name={name}"])
  base.rows = [
    (flag, value, f"read: {found}" if flag == "--config-name" else "where the base YAML was found")
    for flag, value in flags.items()
  ]
  base.notes.append(
    f"--config-name={name}: {len(base.overrides)} settings of {found} apply before the script's own "
    "(verl's ppo_trainer defaults under them)"
  )
  return base


def _read_hydra_yaml(path: str) -> tuple[list[str], list[tuple[str, str]]]:
  """(the YAML's settings as key=value overrides, [(family, why) refused]) of a Hydra config built on verl's
  ppo_trainer."""
  import yaml  # here: only scripts with a base YAML need it

  try:
    with open(path) as file:
      document = yaml.safe_load(file)
  except (OSError, yaml.YAMLError) as error:
    return [], [("Hydra base config", f"cannot read {path}: {error}")]
  if not isinstance(document, dict):
    return [], [("Hydra base config", f"{path} is not a mapping of settings")]
  problems = []
  document.pop("hydra", None)  # Hydra's own settings (its search path)
  for entry in document.pop("defaults", None) or []:
    if entry == "_self_" or (isinstance(entry, str) and _HYDRA_BASES.get(entry, False) is None):
      continue
    if isinstance(entry, str) and _HYDRA_BASES.get(entry):
      problems.append(_HYDRA_BASES[entry])
    else:
      problems.append(
        ("Hydra base config", f"{path}: defaults entry {entry!r}: jaxrlhf reads YAMLs built on verl's ppo_trainer only")
      )
  overrides = []

  def walk(node, prefix):
    for key, value in node.items():
      if isinstance(value, dict):
        walk(value, f"{prefix}{key}.")
        continue
      text = _hydra_text(value)
      if text is None or "${" in text:
        problems.append(
          ("Hydra base config", f"{path}: {prefix}{key}={value!r} (a value jaxrlhf cannot read: set it as key=value)")
        )
      else:
        overrides.append(f"{prefix}{key}={text}")

  walk(document, "")
  return overrides, problems


def _hydra_text(value) -> str | None:
  """A YAML value as a Hydra override's text that `parse_value` reads back the same; None when there is none."""
  if value is None or isinstance(value, (bool, int, float)):
    text = "null" if value is None else str(value)
  elif isinstance(value, str):
    text = value if not re.search(r"[\s,\[\]()'\"]", value) else f"'{value}'" if "'" not in value else f'"{value}"'
  elif isinstance(value, list) and all(not isinstance(item, (dict, list)) for item in value):
    items = [_hydra_text(item) for item in value]
    text = None if None in items else "[" + ",".join(items) + "]"
  else:
    return None
  try:
    return text if text is not None and parse_value(text) == value else None
  except UserError:
    return None


def _tool_config_refusal(args: Sequence[str], script_path: str, notes: list[str]) -> dict[str, tuple[str, list[str]]]:
  """{"multi-turn": (why, [argument])} when the tool config the script names is found and its tools do not load
  in jaxrlhf (verl's sandbox_fusion or search tools); a path only the shell knows is left to train.py."""
  arg = next((a for a in reversed(args) if a.lstrip("+").startswith(f"{TOOL_CONFIG}=")), None)
  if arg is None:
    return {}
  raw = arg.split("=", 1)[1]
  try:
    value = parse_value(raw)
  except UserError:
    return {}
  found = _project_file(value, script_path) if isinstance(value, str) else None
  if found is None:
    return {}
  from jaxrlhf.tools import ToolConfigError, load_tools  # here: loading the table must not import the tools

  try:
    load_tools(found)
  except ToolConfigError as error:
    return {"multi-turn": (f"{error} (port the tool to jaxrlhf.tools.BaseTool: docs/tools.md)", [arg])}
  if _PROJECT_ROOT.match(value):
    notes.append(
      f"{TOOL_CONFIG}: $(pwd) is the script's project root, where its tools load from {found}: "
      "give train.py that path (train.py runs from jaxrlhf's root)"
    )
  return {}


def main(argv: Sequence[str]) -> None:
  import argparse

  from jaxrlhf.cli import add_verbose_flag, run

  parser = argparse.ArgumentParser(
    prog="python -m jaxrlhf.verl_compat",
    description="Print the jaxrlhf command equivalent to a verl run script, and what each key became.",
  )
  parser.add_argument("script", help="a verl run script (bash) with a `python3 -m verl.trainer.main_ppo` command")
  parser.add_argument(
    "--config", default=None, help=f"the jaxrlhf base config the overrides apply to (default: {DEFAULT_CONFIG})"
  )
  add_verbose_flag(parser)
  args = parser.parse_args(argv)

  def translate():
    command, report, script = translate_script(args.script, args.config)
    print(command)
    print()
    print(report.table())
    if script.missing:
      print(f"# shell variables not set in {args.script}: {', '.join(sorted(script.missing))}", flush=True)

  run("jaxrlhf.verl_compat", translate, verbose=args.verbose)


if __name__ == "__main__":
  main(sys.argv[1:])
