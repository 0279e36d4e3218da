"""The validation pass a run makes before anything heavy: no tokenizing, no weights, no compiling.

`Trainer` calls `validate_run` first thing, after `resolve_config` has checked the config tree itself
(keys, types, choices against the registries, ranges, keys not implemented). This pass checks what the
config points at, in the order a user would fix them:

- Hugging Face Hub ids among the model and tokenizer paths (`Qwen/Qwen2.5-7B-Instruct`), resolved to their
  local snapshot directories in the config itself (`jaxrlhf.models.hub`), so everything after this pass, the
  run's config.json and checkpoints included, sees a local directory;
- the model directories (actor, critic, reward model): config.json, safetensors, and every tensor's
  shape and the layer count against the config, from the safetensors headers alone; LoRA on the embedding
  or the LM head against a tied head;
- the tokenizer directory;
- the data files: they exist and have the prompt and data_source columns, and every data_source they
  hold has a reward function (a file's first `DATA_SOURCE_SAMPLE_ROWS` rows; the trainer checks every
  row again once the dataset is built, still before compiling);
- the custom reward file and function (imported once here; the trainer uses the function returned);
- the checkpoint `trainer.resume_from_path` names;
- the run directory can be written (no part of its path is a file), and the run fits the model and the
  machine: prompt + response no longer than the model's positions (without RoPE scaling), and the
  memory a first estimate counts (prompts padded on the host, the rollout's KV cache) no more than the
  machine has.

Every failure is a `UserError` naming the config key and the file, column or tensor.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterable

from jaxrlhf import rewards
from jaxrlhf.checkpoint import STEP_PREFIX, CheckpointError, split_step_dir
from jaxrlhf.config import ConfigError, reward_model_head
from jaxrlhf.data import DataError
from jaxrlhf.data.builtin import builtin_rows
from jaxrlhf.data.dataset import read_lines
from jaxrlhf.errors import UserError
from jaxrlhf.models import check_hf_checkpoint, critic_config_from, load_hf_config, model_config_from
from jaxrlhf.models.hub import resolve_model_paths
from jaxrlhf.models.lora import outer_targets

log = logging.getLogger(__name__)

DATA_SOURCE_SAMPLE_ROWS = 10_000  # rows per data file whose data_source is checked before tokenizing


def validate_run(config) -> Callable | None:
  """Checks a resolved config's paths, data and reward functions; returns the custom reward function (or None).

  Hub ids among its model paths are replaced by their local snapshot directories, in `config` itself."""
  resolve_model_paths(config)
  check_models(config)
  check_lora_targets(config)
  check_tokenizer(config)
  compute_score = load_reward_function(config)
  uses_rule_reward = compute_score is None and (not config.reward_model.enable or config.reward_model.combine_with_rule)
  num_rows = 0
  for key in ("data.train_files", "data.val_files"):
    for path in _files(config.data[key.split(".")[1]]):
      num_rows += check_data_file(
        key, path, config.data.prompt_key, config.data.reward_fn_key, check_data_sources=uses_rule_reward
      )
  check_resume(config)
  trainer = config.trainer
  check_writable(
    f"trainer.default_local_dir={trainer.default_local_dir!r}",
    os.path.join(trainer.default_local_dir, trainer.project_name, trainer.experiment_name),
  )
  check_lengths(config, num_rows)
  return compute_score


def _files(files) -> list[str]:
  return [files] if isinstance(files, str) else [f for f in files if f]


# ----- models --------------------------------------------------------------------------------------


def check_model_dir(key: str, path: str) -> None:
  """`key`=`path` is a Hugging Face checkpoint directory (config.json + *.safetensors)."""
  if not os.path.exists(path):
    raise ConfigError(
      f"{key}={path!r} does not exist (expected a Hugging Face checkpoint directory: config.json + "
      "*.safetensors, or a Hub model id org/name)"
    )
  if not os.path.isdir(path):
    raise ConfigError(f"{key}={path!r} is not a directory (expected a Hugging Face checkpoint directory)")
  if not os.path.isfile(os.path.join(path, "config.json")):
    raise ConfigError(f"{key}={path!r} has no config.json (expected a Hugging Face checkpoint directory)")


def check_models(config) -> None:
  """Every model directory the run loads, against the config the run builds for it (shapes, layer count)."""
  actor = config.actor_rollout_ref.model
  sections = []
  if actor.path:
    sections.append(("actor_rollout_ref.model", actor, "lm"))
  if config.critic.enable:
    # verl's critic loads its own path, else the actor's checkpoint with a fresh value head.
    critic = config.critic.model
    if critic.path and critic.path != actor.path:
      sections.append(("critic.model", critic, "value"))
    elif actor.path:
      sections.append(("actor_rollout_ref.model", actor, "value"))
  if config.reward_model.enable:
    sections.append(("reward_model.model", config.reward_model.model, reward_model_head(config)))
  for key, section, head in sections:
    check_model_dir(f"{key}.path", section.path)
    try:
      reward = key == "reward_model.model"  # its own config.json as it is: not the actor's override keys
      model_config = load_hf_config(section.path) if reward else model_config_from(section)
      check_hf_checkpoint(section.path, model_config, head=head)
    except CheckpointError as e:
      raise CheckpointError(f"{key}.path: {e}", hint=e.hint) from None
    except ValueError as e:  # DecoderConfig's own checks (heads, sizes) on the checkpoint's config.json
      raise ConfigError(f"{key}.path={section.path!r}: {e}") from None


def check_lora_targets(config) -> None:
  """LoRA on `embed_tokens` or `lm_head` needs an untied head (as the checkpoint's config.json or override_config
  has it): a tied head is the input embedding, and merging either one's adapter into the generation copy and
  the export would change the other use too (PEFT's merge has the same flaw), so the merged policy would not be
  the one trained."""
  model = config.actor_rollout_ref.model
  key = "actor_rollout_ref.model.target_modules"
  targets = outer_targets(model, key)
  if not targets or not model_config_from(model).tie_word_embeddings:
    return
  raise ConfigError(
    f"{key}={model.target_modules!r} adapts {targets}, but the model ties its LM head to the input "
    "embedding (tie_word_embeddings=True): LoRA on either needs an untied head "
    "(actor_rollout_ref.model.override_config.tie_word_embeddings=False)"
  )


def check_tokenizer(config) -> None:
  name = config.data.tokenizer
  if name.startswith("builtin:"):
    return
  if not name and not config.actor_rollout_ref.model.path:
    raise ConfigError(
      "no tokenizer: set data.tokenizer (a tokenizer directory, or 'builtin:recall') or actor_rollout_ref.model.path"
    )
  if name and not os.path.isdir(name):
    raise ConfigError(
      f"data.tokenizer={name!r} is not a directory (expected a tokenizer directory, a Hub model id "
      "org/name, or 'builtin:<task>'; '' = the actor's model.path)"
    )


# ----- data ----------------------------------------------------------------------------------------


def _parquet_columns(path: str, column: str, limit: int) -> tuple[set[str], list, int]:
  """(column names, the first `limit` values of `column` if it exists, number of rows) of a parquet file."""
  import pyarrow as pa
  import pyarrow.parquet as pq

  try:
    parquet = pq.ParquetFile(path)
    names = set(parquet.schema_arrow.names)
    values = []
    if column in names:
      for batch in parquet.iter_batches(batch_size=min(limit, 65536), columns=[column]):
        values.extend(batch.column(column).to_pylist())
        if len(values) >= limit:
          break
    return names, values[:limit], parquet.metadata.num_rows
  except (OSError, pa.ArrowException) as e:
    raise DataError(f"data file {path!r} is not a readable parquet file: {e}") from None


def _jsonl_columns(path: str, column: str, limit: int) -> tuple[set[str], list, int]:
  """The same for a jsonl file: names and values from its first `limit` rows; all rows are counted."""
  names: set[str] = set()
  values = []
  rows = 0
  for line_no, line in read_lines(path):  # every line: a byte that is not UTF-8 is refused wherever it is
    if not line.strip():
      continue
    rows += 1
    if rows > limit:
      continue  # counted, not parsed
    try:
      row = json.loads(line)
    except json.JSONDecodeError as e:
      raise DataError(f"{path}:{line_no}: not valid JSON ({e})") from None
    if not isinstance(row, dict):
      raise DataError(f"{path}:{line_no}: expected a JSON object per line, got {type(row).__name__}")
    names |= set(row)
    if column in row:
      values.append(row[column])
  return names, values, rows


def check_data_file(
  key: str,
  path: str,
  prompt_key: str,
  reward_fn_key: str,
  *,
  check_data_sources: bool = True,
  limit: int = DATA_SOURCE_SAMPLE_ROWS,
) -> int:
  """One data file of `key`: exists, has the prompt / data_source / reward_model columns, known data_sources.
  Returns its number of rows."""
  if path.startswith("builtin:"):
    try:
      rows = builtin_rows(path)
    except ValueError as e:
      raise DataError(f"{key}: {e}") from None
    names = set(rows[0]) if rows else set()
    data_sources, num_rows = [row.get(reward_fn_key) for row in rows[:limit]], len(rows)
  elif not os.path.exists(path):
    raise DataError(f"{key}: data file {path!r} does not exist")
  elif path.endswith(".parquet"):
    names, data_sources, num_rows = _parquet_columns(path, reward_fn_key, limit)
  elif path.endswith((".jsonl", ".json")):
    names, data_sources, num_rows = _jsonl_columns(path, reward_fn_key, limit)
  else:
    raise DataError(f"{key}: data file {path!r}: expected a .parquet, .jsonl or builtin:<task>:<split> path")
  if num_rows == 0:
    raise DataError(f"{key}: data file {path!r} has no rows")
  for column, what in (
    (prompt_key, "data.prompt_key"),
    (reward_fn_key, "data.reward_fn_key"),
    ("reward_model", "its 'ground_truth' field"),
  ):
    if column not in names:
      raise DataError(f"{key}: data file {path!r} has no column {column!r} ({what}); columns: {sorted(names)}")
  if not check_data_sources:
    return num_rows
  check_data_sources_known(data_sources, f"{key}: data file {path!r}, column {reward_fn_key!r}")
  if num_rows > limit:
    log.info(
      "%s: checked the %s of the first %d of %d rows in %s; the rest are checked when the dataset is built",
      key,
      reward_fn_key,
      limit,
      num_rows,
      path,
    )
  return num_rows


def first_rows(files, limit: int) -> list[tuple[str, dict]]:
  """(where, row) of the first `limit` rows of `files` ('train.parquet row 3'), read without the rest of the files;
  the files were checked (`check_data_file`) before."""
  rows: list[tuple[str, dict]] = []
  for path in _files(files):
    if len(rows) >= limit:
      break
    if path.startswith("builtin:"):
      file_rows = builtin_rows(path)[: limit - len(rows)]
    elif path.endswith(".parquet"):
      import pyarrow.parquet as pq

      batch = next(pq.ParquetFile(path).iter_batches(batch_size=limit - len(rows)), None)
      file_rows = batch.to_pylist() if batch is not None else []
    else:
      file_rows = []
      for _, line in read_lines(path):
        if line.strip():
          file_rows.append(json.loads(line))
        if len(rows) + len(file_rows) >= limit:
          break
    rows += [(f"{path} row {i}", row) for i, row in enumerate(file_rows)]
  return rows


def check_data_sources_known(data_sources: Iterable, where: str) -> None:
  """Every distinct data_source has a registered reward function; the error names the first one that has none."""
  for data_source in dict.fromkeys(data_sources):  # distinct, in order of first appearance
    try:
      rewards.get_reward_fn(data_source)
    except rewards.UnknownDataSourceError as e:
      raise rewards.UnknownDataSourceError(f"{where}: {e}") from None


# ----- reward function and resume path -------------------------------------------------------------


def load_reward_function(config) -> Callable | None:
  custom = config.custom_reward_function
  if not custom.path:
    return None
  try:
    return rewards.load_custom_reward_function(custom.path, custom.name)
  except (OSError, ImportError, AttributeError, TypeError, ValueError) as e:
    raise ConfigError(str(e)) from e


def check_resume(config) -> None:
  trainer = config.trainer
  if trainer.resume_mode != "resume_path":
    return
  if not trainer.resume_from_path:
    raise ConfigError(
      "trainer.resume_mode='resume_path' needs trainer.resume_from_path (a "
      f"<run dir>/{STEP_PREFIX}_<N> checkpoint directory)"
    )
  step_dir = os.path.abspath(trainer.resume_from_path)
  split_step_dir(step_dir)
  for item in ("state", "meta"):
    if not os.path.isdir(os.path.join(step_dir, item)):
      raise CheckpointError(
        f"trainer.resume_from_path={trainer.resume_from_path!r} is not a finished jaxrlhf "
        f"checkpoint (it has no {item}/ folder)"
      )


# ----- output paths --------------------------------------------------------------------------------


def check_writable(what: str, path: str, *, is_file: bool = False) -> None:
  """`path`, a directory (or with `is_file` a file) to create or write into, can be written: no part of it is a
  file, and the nearest part that exists takes new entries. Tried by making (and removing) an empty folder
  there, which also catches what a permission check misses (a read-only mount, /proc or /sys, where even root
  cannot write). `what` names the path in the message (`trainer.default_local_dir='runs'`, `--out 'x'`)."""
  path = os.path.abspath(path)
  if is_file and os.path.isdir(path):
    raise UserError(f"{what}: {path} is a directory, not a file")
  if is_file and os.path.isfile(path):
    try:
      open(path, "ab").close()  # opened as a write would open it, and left as it was
    except OSError as e:
      raise UserError(f"{what}: {path} is not writable ({e.strerror})") from None
    return
  existing = path
  while not os.path.lexists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise UserError(f"{what}: {existing} is a file, not a directory")
  try:
    os.rmdir(tempfile.mkdtemp(prefix=".jaxrlhf-write-check-", dir=existing))
  except OSError as e:
    raise UserError(f"{what}: {existing} is not writable ({e.strerror})") from None


# ----- lengths and memory --------------------------------------------------------------------------

_BYTES = {"float32": 4, "bfloat16": 2}


def _bytes_text(num_bytes: float) -> str:
  for unit, size in (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
    if num_bytes >= size:
      return f"{num_bytes / size:,.1f} {unit}"
  return f"{num_bytes / 2**20:.2f} MiB"


def host_memory_bytes() -> int | None:
  """This machine's physical memory (None where the OS does not say)."""
  try:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError, AttributeError):
    return None


def device_memory_bytes() -> int | None:
  """The accelerators' memory, all devices together (None on CPU, whose devices are the host's memory)."""
  import jax

  stats = jax.local_devices()[0].memory_stats() or {}
  if "bytes_limit" not in stats:
    return None
  return int(stats["bytes_limit"]) * jax.device_count()


def check_lengths(config, num_rows: int) -> None:
  """Prompt + response against the models' positions, and a first estimate of memory against the machine's,
  before the prompts are padded (on the host) or anything is compiled.

  The estimate is a lower bound: the prompts padded to `data.max_prompt_length` (input ids and mask, int32, every
  row of the train and val files) and the rollout's KV cache for one generation batch. Weights, optimizer state
  and activations come on top."""
  data = config.data
  length = data.max_prompt_length + data.max_response_length
  try:
    actor = model_config_from(config.actor_rollout_ref.model)
    models = [("actor_rollout_ref.model", actor)]
    if config.critic.enable:
      models.append(("critic.model", critic_config_from(config, actor)))
  except UserError:
    raise
  except ValueError as e:  # DecoderConfig's own checks: a from-scratch model without its sizes, heads, ...
    raise ConfigError(f"actor_rollout_ref.model: {e}") from None
  for key, model in models:
    if model.rope_type == "default" and length > model.max_position_embeddings:
      raise ConfigError(
        f"data.max_prompt_length + data.max_response_length = {data.max_prompt_length} + "
        f"{data.max_response_length} = {length} tokens is more than {key}'s max_position_embeddings="
        f"{model.max_position_embeddings}",
        hint="shorten them, or use a model whose config.json sets rope_scaling",
      )

  rollout = config.actor_rollout_ref.rollout
  sequences = (data.gen_batch_size or data.train_batch_size) * rollout.n
  kv_cache = (
    2
    * actor.num_hidden_layers
    * sequences
    * actor.num_key_value_heads
    * length
    * actor.resolved_head_dim
    * _BYTES[rollout.dtype or actor.dtype]
  )
  prompts = num_rows * data.max_prompt_length * 2 * 4
  padded = (
    f"the prompts padded to data.max_prompt_length={data.max_prompt_length} ({num_rows:,} rows): {_bytes_text(prompts)}"
  )
  cache = f"the rollout's KV cache ({sequences:,} sequences of {length:,} tokens): {_bytes_text(kv_cache)}"
  device_memory, host_memory = device_memory_bytes(), host_memory_bytes()
  on_host = [(prompts, padded)] + ([(kv_cache, cache)] if device_memory is None else [])
  host_needs = sum(size for size, _ in on_host)
  if host_memory is not None and host_needs > host_memory:
    raise ConfigError(
      f"the run needs at least {_bytes_text(host_needs)} of host memory, more than this machine's "
      f"{_bytes_text(host_memory)}: {'; '.join(text for _, text in on_host)}",
      hint="lower data.max_prompt_length / data.max_response_length",
    )
  if device_memory is not None and kv_cache > device_memory:
    raise ConfigError(
      f"the run needs at least {_bytes_text(kv_cache)} of device memory, more than the devices' "
      f"{_bytes_text(device_memory)}: {cache}",
      hint="lower data.max_response_length / data.max_prompt_length or the batch size",
    )
