"""Orbax checkpoints of the train state under `<default_local_dir>/<project>/<experiment>/global_step_N`.

What a checkpoint holds: the TrainState (actor and critic params and optimizer states, KL-controller
coefficient, lr scale, step) and a JSON record (step, data-iterator position, seed, the config).
With LoRA the actor's trained part is its adapters (a LoRA critic's: its adapters and value head): they and
their optimizer state are saved, the base is not. The frozen models (reference policy, reward model, a LoRA
actor's base, a LoRA critic's backbone) are not saved: they are rebuilt from their source (the seed or the
model path), as verl does. Batches and per-step RNG are pure functions of (seed, step), so the step is the
whole iterator state.

Layer layouts: `Checkpointer.restore` resumes a checkpoint of either layer layout (scanned `layers/...` or a
loop's `layers_<i>/...`) into either model, converting with `models.stacking`.

Saves are asynchronous and atomic: Orbax writes into a temporary directory and renames it when the
write has finished, so an interrupted save is never picked up by `latest_step()`. Restoring takes
the target shardings, so a checkpoint saved on one mesh restores onto another. A finished checkpoint
that cannot be read (a file truncated or damaged afterwards) raises CheckpointError naming its step
folder; `set_aside` moves it out of the run's steps without deleting anything. Orbax's own reports of a failed
save are dropped (`orbax_reports`, installed by `Checkpointer`): the CheckpointError says it once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import shutil

import jax
import ml_collections
import orbax.checkpoint as ocp
from etils import epath

from jaxrlhf import orbax_reports
from jaxrlhf.errors import CheckpointError
from jaxrlhf.models.stacking import abstract_layer, abstract_stack, layer_layout, stack_layers, unstack_layers

STEP_PREFIX = "global_step"


def _without_reference(state):
  """Frozen models (reference policy, reward model, distillation teacher, the actor's base and the critic's
  backbone under LoRA) are rebuilt from their source, not saved (`RoleState.saved`)."""
  critic = state.critic.saved() if state.critic is not None else None
  return state.replace(
    ref_params=None, reward_params=None, teacher_params=None, actor=state.actor.saved(), critic=critic
  )


# Checkpoints written before the trained roles had one state type (`RoleState`) hold each role's parts at the
# top level: `actor_params`, `actor_opt_state`, `actor_adapters`, and the same for the critic.
_ROLE_PARTS = ("params", "opt_state", "adapters")


def _is_flat_roles(tree) -> bool:
  return isinstance(tree, dict) and "actor_params" in tree


def _flat_roles(state) -> dict:
  """A TrainState (of arrays or abstract arrays) as the earlier flat layout's tree."""
  flat = {field.name: getattr(state, field.name) for field in dataclasses.fields(state)}
  for role in ("actor", "critic"):
    role_state = flat.pop(role)
    flat.update({f"{role}_{part}": getattr(role_state, part) if role_state else None for part in _ROLE_PARTS})
  return flat


def _from_flat_roles(flat: dict, like):
  """The TrainState (`like`'s types: TrainState, RoleState) of a tree in the earlier flat layout."""
  roles = {}
  for role in ("actor", "critic"):
    parts = {part: flat[f"{role}_{part}"] for part in _ROLE_PARTS}
    roles[role] = type(like.actor)(**parts) if parts["opt_state"] is not None else None
  rest = {key: value for key, value in flat.items() if not key.startswith(("actor_", "critic_"))}
  return type(like)(**rest, **roles)


# TrainState fields newer than some checkpoints, None in most runs: a carried rollout (trainer.v1's colocate_async)
# and a distillation teacher (frozen: never saved). A checkpoint written before them, or whose None left no entry,
# is read without them.
_OPTIONAL_FIELDS = ("carried", "teacher_params")


def _without(tree, names) -> dict:
  """A TrainState (or its flat layout's dict) as a dict of its fields less `names`."""
  fields = tree if isinstance(tree, dict) else {f.name: getattr(tree, f.name) for f in dataclasses.fields(tree)}
  return {key: value for key, value in fields.items() if key not in names}


def nested_roles(tree: dict) -> dict:
  """A saved state tree in today's layout (`{"actor": {"params", "opt_state", "adapters"}, "critic": ...}`),
  from either layout; a run without a critic has `critic` None."""
  if not _is_flat_roles(tree):
    return tree
  nested = {key: value for key, value in tree.items() if not key.startswith(("actor_", "critic_"))}
  for role in ("actor", "critic"):
    parts = {part: tree.get(f"{role}_{part}") for part in _ROLE_PARTS}
    nested[role] = parts if parts["opt_state"] is not None else None
  return nested


def _failure_text(error: BaseException) -> str:
  """The operating system's words for a failed write ("No space left on device"), else the error's first line."""
  for cause in _chain(error):
    if isinstance(cause, OSError) and cause.strerror:
      return cause.strerror
    code = re.search(r"os_error_code='(\d+)'", str(cause))  # TensorStore's wording of an OSError
    if code:
      return os.strerror(int(code.group(1)))
  return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:200]}"


def _chain(error: BaseException):
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    yield error
    error = error.__cause__ or error.__context__


class Checkpointer:
  """Saves are asynchronous: `check()` after each step raises a failed one's CheckpointError without
  waiting for one in progress; `wait()` and `close()` wait and raise it too."""

  def __init__(self, directory: str, *, max_to_keep: int | None = None, async_save: bool = True):
    self.directory = os.path.abspath(directory)
    self._pending: int | None = None  # the step of a save that has not been seen through yet
    self._failed = False
    orbax_reports.install()  # a failed save is reported once, as the CheckpointError raised here
    self._manager = ocp.CheckpointManager(
      self.directory,
      options=ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, step_prefix=STEP_PREFIX, enable_async_checkpointing=async_save, create=True
      ),
      item_handlers={"state": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()},
    )

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, step: int, state, meta: dict) -> None:
    self.wait()  # the previous save's failure is named as that save's, not this one's
    with self._save_failure(step):
      self._manager.save(
        step,
        args=ocp.args.Composite(state=ocp.args.StandardSave(_without_reference(state)), meta=ocp.args.JsonSave(meta)),
      )
    self._pending = step

  @contextlib.contextmanager
  def _save_failure(self, step: int):
    """A failed save (disk full, read-only, quota) as one CheckpointError naming it and the last good one.

    Orbax writes into a temporary folder and renames it only once the write has finished, so the failed
    step is never among `all_steps()` (nor picked by a resume)."""
    try:
      yield
    except Exception as error:  # noqa: BLE001  (any failure to write means the same to the user)
      self._failed = True
      good = [s for s in self._manager.all_steps() if s != step]
      last = (
        f"the last good checkpoint is {self.step_dir(max(good))}"
        if good
        else "no checkpoint of this run was saved before it"
      )
      hint = "free space (or fix the path) and start again with trainer.resume_mode=auto"
      left = self._remove_unfinished(step)
      if left:
        hint = f"remove the half-written {', '.join(left)}, " + hint
      raise CheckpointError(
        f"saving checkpoint {self.step_dir(step)} failed: {_failure_text(error)}; {last}", hint=hint
      ) from error

  def _remove_unfinished(self, step: int) -> list[str]:
    """Removes the half-written folders of a failed save of `step` (Orbax's `global_step_N.orbax-checkpoint-tmp*`:
    on a full disk they hold the space a retry needs); returns those that could not be removed."""
    prefix = os.path.basename(self.step_dir(step)) + ".orbax-checkpoint-tmp"
    left = []
    if jax.process_index() != 0 or not os.path.isdir(self.directory):
      return left
    for name in os.listdir(self.directory):
      if name.startswith(prefix):
        path = os.path.join(self.directory, name)
        shutil.rmtree(path, ignore_errors=True)
        if os.path.exists(path):
          left.append(path)
    return left

  def step_dir(self, step: int) -> str:
    return os.path.join(self.directory, f"{STEP_PREFIX}_{step}")

  def restore(self, step: int, target_state, config: ml_collections.ConfigDict | None = None):
    """Restores onto the shardings of `target_state` (arrays or ShapeDtypeStructs); keeps its ref params.

    A checkpoint in the other layer layout (one written before the layer scan, `layers_<i>`, restored
    into scanned layers, or the reverse) is read in its own layout and converted to the target's.
    One whose arrays do not fit `target_state` raises a CheckpointError listing the settings of `config` (the
    run's) that decide the state's arrays (the models, LoRA, the critic) and differ from the checkpoint's.
    """
    abstract = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), _without_reference(target_state)
    )
    with _unreadable_as_checkpoint_error(self.step_dir(step)):
      # The saved tree's structure, from its metadata (the manager knows item types only after a save).
      saved_tree = ocp.StandardCheckpointHandler().metadata(epath.Path(self.step_dir(step)) / "state").tree
      saved, wanted = layer_layout(saved_tree), layer_layout(abstract)
      convert = saved is not None and wanted is not None and saved != wanted
      if convert:
        abstract = (
          unstack_layers(abstract, abstract_layer) if saved == "unstacked" else stack_layers(abstract, abstract_stack)
        )
      # A checkpoint of the earlier flat layout is read in it, then nested (`nested_roles`).
      abstract_state, flat = abstract, _is_flat_roles(saved_tree)
      if flat:
        abstract = _flat_roles(abstract)
      absent = [
        name
        for name in _OPTIONAL_FIELDS
        if isinstance(saved_tree, dict) and name not in saved_tree and getattr(abstract_state, name) is None
      ]
      if absent:
        abstract = _without(abstract, absent)
      try:
        restored = self._manager.restore(
          step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore())
        )
      except Exception as e:  # noqa: BLE001  (a state that does not fit is told apart from a damaged file)
        mismatch = self._mismatch(step, saved_tree, abstract, config)
        if mismatch is not None:
          raise mismatch from e
        raise
    state = restored.state
    if absent:
      state = {**state, **dict.fromkeys(absent)}
    if flat:
      state = _from_flat_roles(state, abstract_state)
    elif absent:
      state = type(abstract_state)(**state)
    if convert:
      logging.info("checkpoint step %d has %s layers: converting to %s", step, saved, wanted)
      state = stack_layers(state) if wanted == "stacked" else unstack_layers(state)
      target = _without_reference(target_state)
      state = jax.device_put(state, jax.tree.map(lambda x: x.sharding, target))
    critic = state.critic.with_frozen(lambda: target_state.critic.params) if state.critic is not None else None
    state = state.replace(
      ref_params=target_state.ref_params,
      reward_params=target_state.reward_params,
      teacher_params=target_state.teacher_params,
      actor=state.actor.with_frozen(lambda: target_state.actor.params),
      critic=critic,
    )
    return state, restored.meta

  def _mismatch(self, step: int, saved_tree, abstract, config) -> CheckpointError | None:
    """Why checkpoint `step`'s arrays do not fit `abstract`: the settings that differ, else the arrays (None:
    they fit, so the checkpoint itself is damaged)."""
    shapes = lambda tree: {
      jax.tree_util.keystr(path, simple=True, separator="/"): tuple(leaf.shape)
      for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    }
    saved, wanted = shapes(saved_tree), shapes(abstract)
    arrays = sorted(path for path in saved.keys() | wanted.keys() if saved.get(path) != wanted.get(path))
    if not arrays:
      return None
    settings = []
    if config is not None:
      try:
        meta = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
        settings = config_differences(json.loads(meta["config"]), json.loads(config.to_json()), state_only=True)
      except Exception:  # noqa: BLE001  (no readable config: the arrays say it)
        settings = []
    where = f"checkpoint {self.step_dir(step)} does not fit this run's state"
    hint = "resume with the checkpoint's settings, or start a new trainer.experiment_name"
    if settings:
      return CheckpointError(
        f"{where}: {len(settings)} setting(s) differ from the checkpoint's: " + "; ".join(settings), hint=hint
      )
    shown = [f"{path} {saved.get(path, 'absent')} saved, {wanted.get(path, 'absent')} now" for path in arrays[:5]]
    return CheckpointError(
      f"{where}: {len(arrays)} array(s) differ: " + "; ".join(shown) + ("; ..." if len(arrays) > 5 else ""), hint=hint
    )

  def set_aside(self, step: int) -> str:
    """Renames an unreadable step folder to `unreadable_global_step_N[.K]` (kept, no longer a step); returns it."""
    source = self.step_dir(step)
    target = os.path.join(self.directory, "unreadable_" + os.path.basename(source))
    suffix = 0
    while os.path.exists(target + (f".{suffix}" if suffix else "")):
      suffix += 1
    target += f".{suffix}" if suffix else ""
    if jax.process_index() == 0:  # one process renames; every process has stopped counting it as a step
      os.rename(source, target)
    self._manager.reload()
    return target

  def check(self) -> None:
    """Raises the CheckpointError of a background save that has failed; never waits for one still writing."""
    if self._pending is not None and not self._manager.is_saving_in_progress():
      self.wait()

  def wait(self) -> None:
    step, self._pending = self._pending, None
    if step is None or self._failed:
      return
    with self._save_failure(step):
      self._manager.wait_until_finished()

  def close(self) -> None:
    """Waits for the last save (raising its failure) and closes; after a failure has been raised, just closes."""
    try:
      self.wait()
    finally:
      try:
        self._manager.close()
      except Exception:  # noqa: BLE001  (Orbax raises the failed save again; it has been reported)
        if not self._failed:
          raise


@contextlib.contextmanager
def _unreadable_as_checkpoint_error(step_dir: str):
  """Orbax and TensorStore errors from a damaged checkpoint (JSONDecodeError naming no file, DATA_LOSS, ...)."""
  try:
    yield
  except CheckpointError:
    raise
  except Exception as e:  # noqa: BLE001  (any failure to read it means the same thing to the user)
    raise CheckpointError(
      f"checkpoint {step_dir} cannot be read (a truncated or damaged file?): {_read_failure(e)}"
    ) from e


def _read_failure(error: BaseException) -> str:
  """The innermost error's first line ('ValueError: OUT_OF_RANGE: Error reading "actor.params.w/0" in OCDBT database
  ...'): TensorStore's own words, not Orbax's wrapping, which ends in the repr of a pybind11 method."""
  described = [cause for cause in _chain(error) if str(cause).strip()] or [error]
  innermost = described[-1]
  line = (str(innermost).strip().splitlines() or [""])[0].split(" See full TensorStore details")[0]
  return f"{type(innermost).__name__}: {line[:300] + ' ...' if len(line) > 300 else line}"


_ABSENT = object()

# The settings that decide which arrays a saved state holds, and their shapes: the models (checkpoint, architecture,
# LoRA) and whether there is a critic. The rest (lr, batch sizes, paths, step counts) change how training goes on,
# not what a checkpoint holds: a resume takes them (`resume_changes` says which changed).
_STATE_SETTINGS = tuple(
  f"{role}.model.{key}"
  for role in ("actor_rollout_ref", "critic")
  for key in ("path", "override_config.", "lora_rank", "target_modules")
) + ("critic.enable", "algorithm.adv_estimator")
# How the run is kept and logged, not what it trains (the step counts aside: the lr schedule spans them).
_RUN_SETTINGS = ("trainer.",)
_TRAINING_TRAINER_SETTINGS = ("trainer.total_training_steps", "trainer.total_epochs")


def _differing(saved: dict, current: dict) -> list[tuple[str, object, object]]:
  """(key, saved value, current value) for every setting of two config dicts (as the checkpoint's JSON holds them)
  that differs, sorted by key; the resume keys aside, which say how to resume rather than what was trained."""

  def flat(tree, prefix=""):
    if not isinstance(tree, dict):
      return {prefix[:-1]: tree}
    return {k: v for key, value in tree.items() for k, v in flat(value, f"{prefix}{key}.").items()}

  old, new = flat(saved), flat(current)
  keys = sorted(
    key
    for key in old.keys() | new.keys()
    if old.get(key, _ABSENT) != new.get(key, _ABSENT) and not key.startswith("trainer.resume_")
  )
  return [(key, old.get(key, _ABSENT), new.get(key, _ABSENT)) for key in keys]


def _show(value) -> str:
  return "absent" if value is _ABSENT else repr(value)


def config_differences(saved: dict, current: dict, *, state_only: bool = False) -> list[str]:
  """'key: <saved> in the checkpoint, <current> now' for every setting that differs (`_differing`); with
  `state_only`, only those that decide what the state holds (`_STATE_SETTINGS`)."""
  return [
    f"{key}: {_show(old)} in the checkpoint, {_show(new)} now"
    for key, old, new in _differing(saved, current)
    if not state_only or key.startswith(_STATE_SETTINGS)
  ]


def resume_changes(saved: dict, current: dict) -> list[str]:
  """'key <saved> -> <current>' for the hyper-parameters a resumed run changed: every differing setting but how the
  run is kept and logged (trainer.*, its step counts aside)."""
  return [
    f"{key} {_show(old)} -> {_show(new)}"
    for key, old, new in _differing(saved, current)
    if not key.startswith(_RUN_SETTINGS) or key in _TRAINING_TRAINER_SETTINGS
  ]


def _named(key: str, path: str) -> str:
  """How a message names where a path came from: `--flag '/p'` or `config.key='/p'`."""
  return f"{key} {path!r}" if key.startswith("--") else f"{key}={path!r}"


def split_step_dir(path: str, key: str = "trainer.resume_from_path") -> tuple[str, int]:
  """'/runs/p/e/global_step_40' -> ('/runs/p/e', 40); errors name the path and the `key` (flag) it came from."""
  path = os.path.abspath(path.rstrip("/"))
  name = os.path.basename(path)
  if not name.startswith(STEP_PREFIX + "_") or not name[len(STEP_PREFIX) + 1 :].isdigit():
    raise CheckpointError(f"{_named(key, path)} must be a '{STEP_PREFIX}_<N>' checkpoint directory")
  if not os.path.isdir(path):
    raise CheckpointError(f"{_named(key, path)} does not exist")
  return os.path.dirname(path), int(name[len(STEP_PREFIX) + 1 :])


def read_checkpoint(step_dir: str, key: str = "trainer.resume_from_path"):
  """(raw state dict of numpy/jax arrays in today's layout (`nested_roles`), meta dict, config) of a
  `global_step_N` directory."""
  run_dir, step = split_step_dir(step_dir, key)
  with ocp.CheckpointManager(
    run_dir, options=ocp.CheckpointManagerOptions(step_prefix=STEP_PREFIX), item_names=("state", "meta")
  ) as manager:
    if step not in manager.all_steps():
      raise CheckpointError(f"{_named(key, step_dir)} is not a finished jaxrlhf checkpoint")
    with _unreadable_as_checkpoint_error(os.path.abspath(step_dir)):
      restored = manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore())
      )
  config = ml_collections.ConfigDict(json.loads(restored.meta["config"]))
  return nested_roles(restored.state), restored.meta, config
