"""verl's command lines, unchanged: Hydra-style `key=value` overrides and verl run scripts.

verl runs as `python3 -m verl.trainer.main_ppo data.train_batch_size=256 trainer.n_gpus_per_node=8 ...`.
jaxrlhf's tree uses verl's key names, so most keys apply as they are; `TABLE` lists every other verl key
jaxrlhf knows, as one of:
  - translated: the same intent under jaxrlhf's names (GPUs per node x nodes -> the mesh);
  - ignored: no meaning here (vLLM, Ray, FSDP wrapping), listed once at start-up with the reason.
Any key in neither the tree nor the table is an error that names it.

Two users of the table:
  - `train.py [--config FILE] key=value ...`: `apply_overrides` sets the keys on the config (without
    --config the base is configs/verl_defaults.py: verl's own defaults, as `main_ppo` starts from).
  - `python -m jaxrlhf.verl_compat SCRIPT.sh [--config FILE]`: reads a verl run script (line
    continuations, the script's own `VAR=value` lines, `$VAR` / `${VAR:-default}` / `$((a + b))`) and
    prints the equivalent `python train.py --config ... --config.key=value` command and the table of
    mapped / translated / ignored keys. A `$VAR` it cannot resolve stays in the command for the shell
    and is reported.

Values follow Hydra's grammar as verl's scripts use it: `null`, `True/False` (any case), numbers,
`[a,b]` / `['a','b']` lists, quoted strings; `+key=value` (Hydra's append) is accepted like `key=value`.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import Any

import ml_collections

from jaxrlhf.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The base of a verl command line without --config: verl's defaults (`jaxrlhf.config.get_base_config`).
DEFAULT_CONFIG = os.path.join("configs", "verl_defaults.py")
VERL_ENTRY_POINTS = ("verl.trainer.main_ppo", "recipe.dapo.main_dapo", "verl.trainer.main_generation")


@dataclasses.dataclass(frozen=True)
class Translated:
  """A verl key whose intent lives under other jaxrlhf keys.

  `fn(value, overrides, config)` returns {jaxrlhf key: value}; `overrides` holds every verl key of the
  command line (parsed), `config` the config with the mapped keys already applied.
  """
  fn: Callable[[Any, dict, ml_collections.ConfigDict], dict]
  target: str  # what it becomes, for the table


@dataclasses.dataclass(frozen=True)
class Ignored:
  reason: str


# ----- translations ------------------------------------------------------------------------------

def _mesh_from_gpus(value, overrides, config) -> dict:
  # verl's defaults: 8 GPUs per node, 1 node. The device count pins the fsdp axis (the one that
  # absorbs devices), so a job that starts with fewer devices fails at start-up, naming the mesh.
  del value
  devices = int(overrides.get("trainer.n_gpus_per_node", 8)) * int(overrides.get("trainer.nnodes", 1))
  mesh = config.mesh
  tensor = _rollout_tp(overrides).get("mesh.tensor", mesh.tensor)
  data = mesh.data if mesh.data != -1 else 1
  if devices % (data * tensor):
    raise UserError(f"trainer.n_gpus_per_node x trainer.nnodes = {devices} devices are not divisible by "
                    f"mesh.data*mesh.tensor = {data * tensor}",
                    hint="change mesh.data / rollout.tensor_model_parallel_size so they divide the devices")
  return {**({"mesh.data": 1} if mesh.data == -1 else {}), "mesh.fsdp": devices // (data * tensor)}


def _rollout_tp(overrides) -> dict:
  # jaxrlhf generates in the training layout gathered over fsdp (or over fsdp*tensor), so a
  # generation TP of k is a tensor axis of k: training and generation both split heads k ways.
  if "actor_rollout_ref.rollout.tensor_model_parallel_size" not in overrides:
    return {}
  size = int(overrides["actor_rollout_ref.rollout.tensor_model_parallel_size"])
  return {"mesh.tensor": size, "actor_rollout_ref.rollout.tensor_model_parallel_size": size}


def _logger(value, overrides, config) -> dict:
  del overrides, config
  from jaxrlhf.tracking.tracking import LOGGERS  # here: loading the table must not start JAX
  names = (value,) if isinstance(value, str) else tuple(value)
  return {"trainer.logger": tuple(name for name in names if name in LOGGERS) or ("console",)}


def _same(target: str):
  return lambda value, overrides, config: {target: value}


# ----- the table ---------------------------------------------------------------------------------
# Keys of jaxrlhf's tree are mapped as they are (same name, same meaning) unless listed here.
# A key ending in `.*` covers every key under it (keys of the tree under it stay mapped).

_VLLM = "vLLM/SGLang engine setting: generation is jaxrlhf's JAX sampler inside the compiled step"
_RAY = "Ray: jaxrlhf is one SPMD program per host (`train.py --distributed` on each node)"
_FSDP = "PyTorch FSDP wrapping: every parameter is sharded over the mesh's fsdp axis"
_DYNAMIC = ("the log-prob and value phases use the actor's token budget (actor.use_dynamic_bsz, "
            "actor.ppo_max_token_len_per_gpu)")
_TORCH = "PyTorch kernel switch: XLA compiles and fuses the step"

TABLE: dict[str, Translated | Ignored] = {
    "trainer.n_gpus_per_node": Translated(_mesh_from_gpus, "mesh.fsdp = GPUs / (mesh.data * mesh.tensor)"),
    "trainer.nnodes": Translated(_mesh_from_gpus, "mesh.fsdp = GPUs / (mesh.data * mesh.tensor)"),
    "actor_rollout_ref.rollout.tensor_model_parallel_size": Translated(
        lambda value, overrides, config: _rollout_tp(overrides),
        "mesh.tensor and rollout.tensor_model_parallel_size (generation TP = training TP)"),
    "trainer.logger": Translated(_logger, "trainer.logger, keeping the backends jaxrlhf has"),
    "actor_rollout_ref.actor.optim.warmup_style": Translated(
        _same("actor_rollout_ref.actor.optim.lr_scheduler_type"), "actor.optim.lr_scheduler_type (verl's old name)"),
    "critic.optim.warmup_style": Translated(_same("critic.optim.lr_scheduler_type"),
                                            "critic.optim.lr_scheduler_type (verl's old name)"),
    # The rollout engine.
    "actor_rollout_ref.rollout.name": Ignored(_VLLM),
    "actor_rollout_ref.rollout.mode": Ignored(_VLLM),
    "actor_rollout_ref.rollout.gpu_memory_utilization": Ignored(
        "vLLM's KV-cache share of GPU memory: XLA sizes the KV cache for the batch when it compiles"),
    "actor_rollout_ref.rollout.enforce_eager": Ignored("vLLM's CUDA-graph switch: the sampler is always compiled"),
    "actor_rollout_ref.rollout.free_cache_engine": Ignored(
        "vLLM frees its KV cache between rollouts: XLA frees the cache when generation ends"),
    "actor_rollout_ref.rollout.enable_chunked_prefill": Ignored(_VLLM),
    "actor_rollout_ref.rollout.max_num_batched_tokens": Ignored(
        "vLLM's scheduler budget: the whole batch (train_batch_size x n) generates at once"),
    "actor_rollout_ref.rollout.max_num_seqs": Ignored(
        "vLLM's scheduler budget: the whole batch (train_batch_size x n) generates at once"),
    "actor_rollout_ref.rollout.load_format": Ignored("the sampler reads the actor's weights inside the step"),
    "actor_rollout_ref.rollout.layered_summon": Ignored(_FSDP),
    "actor_rollout_ref.rollout.calculate_log_probs": Ignored("the old log-probs are recomputed by the actor"),
    "actor_rollout_ref.rollout.engine_kwargs.*": Ignored(_VLLM),
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": Ignored(_DYNAMIC),
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": Ignored(_DYNAMIC),
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": Ignored(_DYNAMIC),
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": Ignored(_DYNAMIC),
    "critic.use_dynamic_bsz": Ignored(_DYNAMIC),
    "critic.ppo_max_token_len_per_gpu": Ignored(_DYNAMIC),
    "critic.forward_max_token_len_per_gpu": Ignored(_DYNAMIC),
    # Parallelism and PyTorch.
    "actor_rollout_ref.hybrid_engine": Ignored("actor and rollout always share one set of weights in one program"),
    "actor_rollout_ref.actor.strategy": Ignored("one strategy: XLA SPMD over the mesh (mesh.*)"),
    "critic.strategy": Ignored("one strategy: XLA SPMD over the mesh (mesh.*)"),
    "actor_rollout_ref.actor.fsdp_config.*": Ignored(_FSDP),
    "actor_rollout_ref.ref.fsdp_config.*": Ignored(_FSDP),
    "critic.model.fsdp_config.*": Ignored(_FSDP + "; the critic's state stays on the device"),
    "actor_rollout_ref.actor.use_torch_compile": Ignored(_TORCH),
    "actor_rollout_ref.model.use_fused_kernels": Ignored(_TORCH),
    "actor_rollout_ref.model.use_liger": Ignored(_TORCH),
    "actor_rollout_ref.model.use_shm": Ignored("the model is read from its directory once"),
    "actor_rollout_ref.model.external_lib": Ignored("models are jaxrlhf's own Flax decoders (Llama/Qwen/Mistral)"),
    "actor_rollout_ref.model.trust_remote_code": Ignored("never remote code: models are jaxrlhf's own decoders"),
    "critic.model.external_lib": Ignored("models are jaxrlhf's own Flax decoders (Llama/Qwen/Mistral)"),
    "critic.model.trust_remote_code": Ignored("never remote code: models are jaxrlhf's own decoders"),
    "critic.model.tokenizer_path": Ignored("the critic reads the actor's tokens (one tokenizer: data.tokenizer)"),
    **{f"actor_rollout_ref.model.override_config.{name}": Ignored("jaxrlhf's decoder has no dropout (RL sets it 0)")
       for name in ("attention_dropout", "embd_pdrop", "resid_pdrop", "hidden_dropout", "dropout")},
    "actor_rollout_ref.actor.checkpoint.*": Ignored("checkpoints always hold model, optimizer and data state (Orbax)"),
    "critic.checkpoint.*": Ignored("checkpoints always hold model, optimizer and data state (Orbax)"),
    "actor_rollout_ref.actor.optim.total_training_steps": Ignored("verl fills it at run time from the data"),
    "critic.optim.total_training_steps": Ignored("verl fills it at run time from the data"),
    # Ray, devices, the driver.
    "ray_init.*": Ignored(_RAY),
    "ray_kwargs.*": Ignored(_RAY),
    "trainer.ray_wait_register_center_timeout": Ignored(_RAY),
    "trainer.device": Ignored("JAX picks the platform (JAX_PLATFORMS=cuda|tpu|cpu)"),
    "trainer.balance_batch": Ignored("verl balances sequence lengths over data-parallel ranks: jaxrlhf sizes "
                                     "micro-batches by tokens (actor.use_dynamic_bsz) inside the step"),
    "trainer.default_hdfs_dir": Ignored("checkpoints go to trainer.default_local_dir (any mounted path)"),
    "trainer.del_local_ckpt_after_load": Ignored("checkpoints go to trainer.default_local_dir (any mounted path)"),
    # Data loading and the reward manager.
    "data.return_raw_chat": Ignored("the prompt is tokenized once, through the chat template"),
    "data.return_raw_input_ids": Ignored("the prompt is tokenized once, through the chat template"),
    "data.return_full_prompt": Ignored("the prompt is tokenized once, through the chat template"),
    "data.dataloader_num_workers": Ignored("the whole data set is tokenized up front; batches are host arrays"),
    "data.filter_overlong_prompts_workers": Ignored("the whole data set is tokenized up front"),
    "data.use_shm": Ignored("the data files are read once"),
    "data.trust_remote_code": Ignored("never remote code"),
    "reward_model.reward_manager": Ignored("rewards are scored by data_source (naive and dapo alike); DAPO's "
                                           "overlong shaping is reward_model.overlong_buffer"),
}


# ----- parsing key=value ---------------------------------------------------------------------------

@dataclasses.dataclass
class Override:
  key: str
  raw: str  # the value as written (after the shell)
  arg: str  # the whole argument, for messages


def parse_override(arg: str) -> Override:
  """`key=value`, `+key=value` or `++key=value` (Hydra's append / force-append act as set here)."""
  if "=" not in arg or arg.startswith(("-", "~")):
    raise UserError(f"cannot read override {arg!r}: expected key=value (verl/Hydra style) or --config.key=value",
                    hint="Hydra's ~key (delete) has no jaxrlhf equivalent; leave the key out")
  key, raw = arg.split("=", 1)
  key = key.lstrip("+")
  if not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*", key):
    raise UserError(f"cannot read override {arg!r}: {key!r} is not a dotted config key")
  return Override(key, raw, arg)


def _split_list(text: str) -> list[str]:
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
  if current.strip():
    items.append(current)
  return items


def parse_value(raw: str) -> Any:
  """A Hydra value: null, bools, ints, floats, [lists], quoted strings; anything else is a string."""
  text = raw.strip()
  if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
    return text[1:-1]
  if text in ("null", "None", "~"):
    return None
  if text.lower() in ("true", "false"):
    return text.lower() == "true"
  if text.startswith("[") and text.endswith("]"):
    return [parse_value(item) for item in _split_list(text[1:-1])]
  if text.startswith("(") and text.endswith(")"):  # jaxrlhf's own tuple spelling, from --config habits
    return [parse_value(item) for item in _split_list(text[1:-1])]
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
    raise UserError(f"config key '{key}' expects {expected.__name__}, got {value!r} ({type(value).__name__}) "
                    f"from {arg}")
  return value


# ----- classification ----------------------------------------------------------------------------

def _tree_types() -> dict[str, type]:
  from jaxrlhf.config import _field_types, get_base_config  # the tree's declared types, placeholders too
  return _field_types(get_base_config())


def lookup(key: str, tree_types: dict[str, type]) -> Translated | Ignored | str | None:
  """The table's entry for `key`; "mapped" for a key of the tree; None for an unknown key."""
  if key in TABLE:
    return TABLE[key]
  if key in tree_types:
    return "mapped"
  for pattern, entry in TABLE.items():
    if pattern.endswith(".*") and key.startswith(pattern[:-1]):
      return entry
  return None


def unknown_key_error(key: str, arg: str, tree_types) -> UserError:
  candidates = list(tree_types) + [k for k in TABLE if not k.endswith(".*")]
  close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
  suggestion = f"; did you mean '{close[0]}'?" if close else "; docs/config.md lists every key"
  return UserError(f"unknown config key '{key}' (from {arg}){suggestion}",
                   hint="jaxrlhf.verl_compat.TABLE lists the verl keys that are translated or ignored")


@dataclasses.dataclass
class Report:
  """What a command line's overrides became: rows of (verl key, value as written, what happened)."""
  mapped: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
  translated: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
  ignored: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
  unresolved: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
  # The jaxrlhf keys and values to set, in order (what `--config.key=value` would set).
  assignments: dict[str, Any] = dataclasses.field(default_factory=dict)

  def ignored_lines(self) -> list[str]:
    return [f"  {key}={raw}: {reason}" for key, raw, reason in self.ignored]

  def table(self) -> str:
    lines = []
    for title, rows in (("mapped", self.mapped), ("translated", self.translated), ("ignored", self.ignored),
                        ("unresolved (left to your shell)", self.unresolved)):
      if rows:
        lines.append(f"# {title}: {len(rows)}")
        lines += [f"#   {key}={raw}  ->  {what}" for key, raw, what in rows]
    return "\n".join(lines)


def plan(args: Sequence[str], config: ml_collections.ConfigDict, *,
         unresolved: Callable[[str], bool] = lambda raw: False) -> Report:
  """Classifies verl overrides against `config` and returns the jaxrlhf assignments (nothing set yet).

  `unresolved(raw)`: True for a value that still holds a shell variable (the script reader's case);
  such a key is passed on verbatim and reported, not type-checked.
  """
  tree_types = _tree_types()
  report = Report()
  parsed: dict[str, Any] = {}
  translations: list[tuple[Override, Translated]] = []
  for arg in args:
    override = parse_override(arg)
    entry = lookup(override.key, tree_types)
    if entry is None:
      raise unknown_key_error(override.key, arg, tree_types)
    if unresolved(override.raw):
      report.unresolved.append((override.key, override.raw, "not resolved in the script: set it in your shell"))
      if entry == "mapped":
        report.assignments[override.key] = override.raw
      continue
    value = parse_value(override.raw)
    parsed[override.key] = value
    if isinstance(entry, Ignored):
      report.ignored.append((override.key, override.raw, entry.reason))
    elif isinstance(entry, Translated):
      translations.append((override, entry))
    else:
      report.assignments[override.key] = coerce(override.key, value, tree_types[override.key], arg)
      report.mapped.append((override.key, override.raw, override.key))
  # Translations see the mapped keys applied (the mesh they size may come from the command line too).
  scratch = ml_collections.ConfigDict(config.to_dict())
  unresolved_keys = {key for key, _, _ in report.unresolved}
  _set_all(scratch, {k: v for k, v in report.assignments.items() if k not in unresolved_keys}, tree_types)
  done = {}  # translation function -> its row: keys that translate together (GPUs x nodes) share one row
  for override, entry in translations:
    if entry.fn in done:
      key, raw, became = report.translated[done[entry.fn]]
      report.translated[done[entry.fn]] = (f"{key}={raw} {override.key}", override.raw, became)
      continue
    targets = entry.fn(parsed[override.key], parsed, scratch)
    targets = {key: coerce(key, value, tree_types[key], override.arg) for key, value in targets.items()}
    done[entry.fn] = len(report.translated)
    report.translated.append((override.key, override.raw,
                              ", ".join(f"{k}={v!r}" for k, v in targets.items()) or "(nothing)"))
    report.assignments.update(targets)
  return report


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
  _set_all(config, report.assignments, _tree_types())
  return report


def split_overrides(argv: Sequence[str]) -> tuple[list[str], list[str]]:
  """(verl `key=value` arguments, the rest) of a command line."""
  verl = [arg for arg in argv if not arg.startswith("-") and "=" in arg]
  return verl, [arg for arg in argv if arg not in verl]


# ----- reading a verl run script ---------------------------------------------------------------------

_VAR = re.compile(r"\$(?P<plain>[A-Za-z_]\w*)")
_BRACED = re.compile(r"\$\{(?P<name>[A-Za-z_]\w*)(?:(?P<op>:?-)(?P<default>.*))?\}", re.S)
_ARITH = re.compile(r"\$\(\((?P<expr>[^()]*)\)\)")


class _Shell:
  """Just enough of bash to read verl's run scripts: variables, quotes, $((arithmetic)); runs nothing."""

  def __init__(self, env: dict[str, str]):
    self.vars = dict(env)
    self.missing: set[str] = set()

  def expand(self, text: str) -> str:
    def arith(match):
      expr = self.expand(match.group("expr"))
      expr = re.sub(r"\b([A-Za-z_]\w*)\b", lambda m: self.vars.get(m.group(1), m.group(0)), expr)
      if re.fullmatch(r"[\d\s+\-*/%()]+", expr):
        return str(eval(expr.replace("/", "//")))  # noqa: S307  (digits and operators only, checked above)
      self.missing.add(match.group(0))
      return match.group(0)

    out, i = "", 0
    while i < len(text):
      end = _dollar_span(text, i) if text[i] == "$" else i + 1
      piece = text[i:end]
      arith_match, braced, plain = _ARITH.fullmatch(piece), _BRACED.fullmatch(piece), _VAR.fullmatch(piece)
      if arith_match:
        out += arith(arith_match)
      elif braced or plain:
        name = (braced or plain).group("name" if braced else "plain")
        if name in self.vars:
          out += self.vars[name]
        elif braced and braced.group("op"):
          out += " ".join(self.words('"' + braced.group("default").replace('"', "") + '"'))
        else:
          self.missing.add(name)
          out += piece
      else:
        out += piece
      i = end
    return out

  def words(self, line: str) -> list[str]:
    """bash's word splitting and quote removal: single quotes keep `$`, double quotes expand it."""
    words, current, quote, started = [], "", None, False
    i = 0
    while i < len(line):
      char = line[i]
      if quote == "'":
        if char == "'":
          quote = None
        else:
          current += char
      elif quote == '"':
        if char == '"':
          quote = None
        elif char == "\\" and i + 1 < len(line) and line[i + 1] in '"\\$`':
          current += line[i + 1]
          i += 1
        elif char == "$":
          span = _dollar_span(line, i)
          current += self.expand(line[i:span])
          i = span - 1
        else:
          current += char
      elif char in "'\"":
        quote, started = char, True
      elif char.isspace():
        if started:
          words.append(current)
        current, started = "", False
      elif char == "#" and not started:
        break
      elif char == "\\" and i + 1 < len(line):
        current += line[i + 1]
        started = True
        i += 1
      elif char == "$":
        span = _dollar_span(line, i)
        current += self.expand(line[i:span])
        started = True
        i = span - 1
      else:
        current += char
        started = True
      i += 1
    if started:
      words.append(current)
    return words


def _dollar_span(line: str, start: int) -> int:
  """End index of the `$...` expression starting at `start` (`${...}` may nest: `${A:-"${B}/x"}`)."""
  if line.startswith("${", start):
    depth = 0
    for i in range(start + 1, len(line)):
      depth += {"{": 1, "}": -1}.get(line[i], 0)
      if depth == 0:
        return i + 1
  for pattern in (_ARITH, _VAR):
    match = pattern.match(line, start)
    if match:
      return match.end()
  match = re.compile(r"\$[@*#?0-9]").match(line, start)
  return match.end() if match else start + 1


def _logical_lines(text: str) -> list[str]:
  return re.sub(r"\\\r?\n", " ", text).splitlines()


_STOP_WORDS = {"|", "||", "&&", ";", "&", "2>&1", ">", ">>", "2>", "1>"}


@dataclasses.dataclass
class Script:
  overrides: list[str]  # key=value words after the verl entry point
  ignored_args: list[str]  # other words after it (Hydra's --config-path/-name, "$@")
  missing: set[str]  # shell variables it could not resolve


def read_script(path: str, env: dict[str, str] | None = None) -> Script:
  """The overrides of the verl command in a run script (its `VAR=value` lines resolved, nothing run)."""
  try:
    with open(path) as f:
      text = f.read()
  except OSError as error:
    raise UserError(f"cannot read verl script {path!r}: {error.strerror}") from None
  shell = _Shell(dict(os.environ if env is None else env))
  for line in _logical_lines(text):
    stripped = line.strip()
    if not stripped or stripped.startswith("#"):
      continue
    assignment = re.match(r"^(?:export\s+|local\s+|readonly\s+)?([A-Za-z_]\w*)=(.*)$", stripped)
    if assignment and not any(entry in stripped for entry in VERL_ENTRY_POINTS):
      words = shell.words(assignment.group(2))
      shell.vars[assignment.group(1)] = words[0] if words else ""
      continue
    if not any(entry in stripped for entry in VERL_ENTRY_POINTS):
      continue
    before_missing = set(shell.missing)
    words = shell.words(stripped)
    start = next(i for i, word in enumerate(words) if word in VERL_ENTRY_POINTS or word.endswith(
        tuple(entry.replace(".", "/") + ".py" for entry in VERL_ENTRY_POINTS)))
    overrides, ignored = [], []
    for word in words[start + 1:]:
      if word in _STOP_WORDS or word.startswith((">", "2>", "|")):
        break
      if "=" in word and not word.startswith("-"):
        overrides.append(word)
      else:
        ignored.append(word)
    missing = shell.missing - before_missing | {m for m in shell.missing if any(m in o for o in overrides)}
    return Script(overrides, ignored, {m for m in missing if any(m in o for o in overrides)})
  raise UserError(f"verl script {path!r} has no `python3 -m verl.trainer.main_ppo` command",
                  hint=f"looked for {', '.join(VERL_ENTRY_POINTS)}")


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


def jaxrlhf_command(report: Report, config_path: str) -> str:
  """`python train.py --config FILE --config.key=value ...`, one flag per line, shell-quoted."""
  lines = ["python train.py", f"--config {_quote(config_path)}"]
  unresolved = {key for key, _, _ in report.unresolved}
  for key, value in report.assignments.items():
    if key in unresolved:  # "$VAR": double quotes, so the user's shell fills it in
      lines.append(f'--config.{key}="{value}"')
    else:
      lines.append(f"--config.{key}={_quote(_flag_text(value))}")
  return " \\\n    ".join(lines)


def translate_script(path: str, config_path: str | None = None, env: dict[str, str] | None = None
                     ) -> tuple[str, Report, Script]:
  """(the jaxrlhf command, its report, the script as read) for a verl run script."""
  from jaxrlhf.config import get_base_config, load_config_file
  script = read_script(path, env)
  config = load_config_file(config_path) if config_path else get_base_config()
  missing = script.missing
  report = plan(script.overrides, config, unresolved=lambda raw: any(
      re.search(r"\$\{?" + re.escape(name.lstrip("$")), raw) for name in missing))
  for word in script.ignored_args:
    if word.startswith("--config-"):
      report.ignored.append((word, "", "verl's Hydra base config: jaxrlhf's base is --config FILE"))
  return jaxrlhf_command(report, config_path or DEFAULT_CONFIG), report, script


def main(argv: Sequence[str]) -> None:
  import argparse
  from jaxrlhf.cli import add_verbose_flag, run
  parser = argparse.ArgumentParser(
      prog="python -m jaxrlhf.verl_compat",
      description="Print the jaxrlhf command equivalent to a verl run script, and what each key became.")
  parser.add_argument("script", help="a verl run script (bash) with a `python3 -m verl.trainer.main_ppo` command")
  parser.add_argument("--config", default=None,
                      help=f"the jaxrlhf base config the overrides apply to (default: {DEFAULT_CONFIG})")
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
